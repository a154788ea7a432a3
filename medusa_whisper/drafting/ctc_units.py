"""The symbols a CTC draft head spells with: the first N tokens of the main model's own BPE.

Whisper's tokenizers (tiktoken's ``gpt2`` for ``.en`` models, ``multilingual`` otherwise) number
their tokens by merge rank: ids 0-255 are the 256 single bytes and id r is made by the r-th merge.
Stopping byte-pair encoding before the N-th merge gives a smaller vocabulary of frequent pieces
that can still spell any text: N = 256 is plain bytes (characters, for English), N = 1024 adds the
commonest word pieces. Because these pieces are an earlier state of the same merging, the main
model's own tokens of a drafted text are just the rest of the merging: re-encoding the draft with
the full tokenizer puts it onto whisper's spelling, token for token.
"""

from __future__ import annotations

from typing import Dict, List, Sequence

import regex
import tiktoken
from whisper.tokenizer import get_encoding


class Units:
    """Truncated byte-pair encoding over one of whisper's encodings.

    encoding : "gpt2" (English-only models) or "multilingual"
    n_units  : how many of the encoding's first tokens are symbols (>= 256)
    """

    def __init__(self, encoding: str, n_units: int):
        if n_units < 256:
            raise ValueError("n_units must be at least 256 (every byte is a unit)")
        self.encoding_name, self.n_units = encoding, n_units
        self.encoding: tiktoken.Encoding = get_encoding(encoding)
        ranks = self.encoding._mergeable_ranks
        if n_units > len(ranks):
            raise ValueError(f"n_units {n_units} exceeds the {len(ranks)} mergeable tokens of {encoding}")
        self.ranks: Dict[bytes, int] = {piece: rank for piece, rank in ranks.items() if rank < n_units}
        self.pieces: List[bytes] = [b""] * n_units
        for piece, rank in self.ranks.items():
            self.pieces[rank] = piece
        self.pattern = regex.compile(self.encoding._pat_str)

    def encode(self, text: str) -> List[int]:
        """Unit ids of ``text``: whisper's pre-tokenisation, then merges of rank < n_units only."""
        out: List[int] = []
        for word in self.pattern.findall(text):
            out.extend(self._merge(word.encode("utf-8")))
        return out

    def _merge(self, word: bytes) -> List[int]:
        return list(_merged(word, self.encoding_name, self.n_units, self))

    def decode_bytes(self, ids: Sequence[int]) -> bytes:
        return b"".join(self.pieces[i] for i in ids)

    def decode(self, ids: Sequence[int]) -> str:
        return self.decode_bytes(ids).decode("utf-8", errors="replace")


def _merged(word: bytes, encoding: str, n_units: int, units: "Units") -> tuple:
    """Byte-pair merging of one pre-tokenised word, lowest rank first, ranks below n_units only.

    The same procedure as tiktoken's (a word is a list of parts; the adjacent pair whose join has
    the lowest rank is merged until no join is a token), cut off at n_units.
    """
    key = (word, encoding, n_units)
    cached = _CACHE.get(key)
    if cached is not None:
        return cached
    ranks = units.ranks
    parts = [word[i : i + 1] for i in range(len(word))]
    while len(parts) > 1:
        best, best_rank = -1, n_units
        for i in range(len(parts) - 1):
            rank = ranks.get(parts[i] + parts[i + 1])
            if rank is not None and rank < best_rank:
                best, best_rank = i, rank
        if best < 0:
            break
        parts[best : best + 2] = [parts[best] + parts[best + 1]]
    result = tuple(ranks[p] for p in parts)
    if len(_CACHE) < 200_000:
        _CACHE[key] = result
    return result


_CACHE: Dict[tuple, tuple] = {}
