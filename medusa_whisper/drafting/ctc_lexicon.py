"""Snapping drafted words onto words the main model spells: a lexicon from its own BPE vocabulary.

A CTC draft spells by ear ("moring", "coutry"). Every common English word is a single token of
whisper's BPE, with its leading space (" morning", " country"), and a token's id is its merge rank,
so a lower id means a more frequent piece. A drafted word that is not such a token is replaced by
the most frequent token word within a small edit distance (symmetric-delete lookup, then the true
distance); words the lexicon cannot place are left as they are. Casing follows the draft's first
letter.
"""

from __future__ import annotations

import re
from functools import lru_cache
from typing import Dict, List, Optional, Sequence, Tuple

from whisper.tokenizer import get_encoding

from .ctc_draft import CtcDraft

WORD = re.compile(r"[A-Za-z]+(?:'[A-Za-z]+)?")
MAX_RANK = 30_000  # token words beyond this rank are rare pieces, not words to snap onto


def _deletes(word: str, depth: int) -> List[str]:
    out, frontier = {word}, {word}
    for _ in range(depth):
        frontier = {w[:i] + w[i + 1 :] for w in frontier for i in range(len(w))}
        out |= frontier
    return list(out)


class Lexicon:
    """Lower-cased words of an encoding's single tokens (" word"), with their best rank."""

    def __init__(self, encoding: str, max_rank: int = MAX_RANK):
        enc = get_encoding(encoding)
        self.rank: Dict[str, int] = {}
        for piece, rank in enc._mergeable_ranks.items():
            if rank >= max_rank or not piece.startswith(b" "):
                continue
            try:
                word = piece[1:].decode("ascii")
            except UnicodeDecodeError:
                continue
            if len(word) >= 3 and word.isalpha():  # two-letter tokens are mostly pieces ("th", "fr")
                key = word.lower()
                self.rank[key] = min(rank, self.rank.get(key, rank))
        self.index: Dict[str, List[str]] = {}
        for word in self.rank:
            for d in _deletes(word, 1):
                self.index.setdefault(d, []).append(word)

    def snap(self, word: str) -> Optional[str]:
        """The lexicon word for ``word`` (lower case), or None when nothing is close enough."""
        key = word.lower()
        if key in self.rank or len(key) < 3:
            return None
        limit = 1 if len(key) <= 4 else 2
        candidates = {c for d in _deletes(key, 2 if limit > 1 else 1) for c in self.index.get(d, ())}
        best: Optional[Tuple[int, int, str]] = None
        for c in candidates:
            distance = edit_distance(key, c)
            if distance <= limit and (best is None or (distance, self.rank[c]) < best[:2]):
                best = (distance, self.rank[c], c)
        return None if best is None else best[2]


def edit_distance(a: Sequence, b: Sequence) -> int:
    """Levenshtein distance of two sequences (strings, token lists)."""
    previous = list(range(len(b) + 1))
    for i, x in enumerate(a, start=1):
        current = [i] + [0] * len(b)
        for j, y in enumerate(b, start=1):
            current[j] = min(previous[j] + 1, current[j - 1] + 1, previous[j - 1] + (x != y))
        previous = current
    return previous[-1]


@lru_cache(maxsize=2)
def lexicon(encoding: str) -> Lexicon:
    return Lexicon(encoding)


def snap_draft(draft: CtcDraft, lex: Lexicon) -> CtcDraft:
    """The draft with misspelt words replaced; characters keep the timings of the word they replace."""
    text, start, end, entropy = [], [], [], []
    position = 0
    for match in WORD.finditer(draft.text):
        a, b = match.span()
        text.append(draft.text[position:a])
        start += draft.char_start[position:a]
        end += draft.char_end[position:a]
        entropy += draft.char_entropy[position:a]
        word = match.group()
        snapped = lex.snap(word)
        if snapped is not None:
            snapped = snapped[0].upper() + snapped[1:] if word[0].isupper() else snapped
        new = snapped or word
        for i in range(len(new)):
            old = a + min(i * len(word) // len(new), len(word) - 1)  # proportional: the timings stretch
            start.append(draft.char_start[old])
            end.append(draft.char_end[old])
            entropy.append(draft.char_entropy[old])
        text.append(new)
        position = b
    text.append(draft.text[position:])
    start += draft.char_start[position:]
    end += draft.char_end[position:]
    entropy += draft.char_entropy[position:]
    return CtcDraft("".join(text), start, end, entropy, draft.units, draft.tail_entropy)
