"""Verifying a whole-window CTC draft a chunk per decoder pass, and staying in step with it.

The CTC head drafts the window's text once (``ctc.CtcDraft``). Each pass this proposer offers the
next chunk of it as a chain of the main model's own tokens; the loop keeps the longest prefix that
equals the greedy tokens, plus the verifier's own next token. Where the verifier said something
else, the rest of the draft is put back in step with what was committed by aligning texts: the
committed text since the last accepted draft token against the draft from there (an edit-distance
alignment with a free end), so a misspelt word, a missing or an extra word costs a pass or two,
not the rest of the window.

- Tokens: the drafted text is re-encoded with the main model's BPE from the current word on
  (so a word the verifier began, e.g. " consid", is finished by the draft's rest, "er").
- Chunk length: per pass, the one that maximises the expected tokens per unit of pass cost, from
  the measured cost of a pass over n rows and a running estimate of the per-token acceptance. When
  the draft keeps failing, the estimate falls and the chunks shrink, down to plain steps.
- Timestamps (when the decoding has them): a chunk stops at a sentence end of the draft, where the
  verifier's own token says whether and when the segment ends; a new segment's start is drafted as
  a repeat of the previous end (93 % of whisper's pairs are equal in the training labels). Segment
  ends timed by the CTC frame alignment (``timestamps="aligned"``) were measured: 0 of 18 accepted
  on held-out windows (whisper favours whole seconds), so they are not drafted by default.
- End of text is drafted after the draft's last word.
- LOSSY, only with ``lossy_ctc_entropy``: leading tokens whose CTC frames all have entropy below
  that are marked unverified, and the loop accepts them without comparing them with the verifier.
"""

from __future__ import annotations

from dataclasses import dataclass, fields, replace
from typing import Dict, List, Optional, Sequence, Tuple

from torch import Tensor
from whisper.tokenizer import Tokenizer

from .base import Committed, Proposer
from .ctc_draft import CtcDraft
from .tree import CandidateTree
from .pass_costs import measured_pass_costs

TIMESTAMP_SECONDS = 0.02  # whisper's timestamp tokens are 20 ms apart
SENTENCE_ENDS = ".?!"
MAX_ALIGN_CHARS = 64  # past this much committed text since the last sync, align its tail only


@dataclass(frozen=True)
class DraftSettings:
    """How the proposer drafts; the head file's ``decoding`` settings override these defaults."""

    max_chunk: int = 16  # most draft tokens per pass
    fixed_chunk: int = 0  # > 0: always this many tokens per pass (else chosen per pass)
    # the relative cost of a decoder pass over each of cost_rows rows (a pass over one = 1.0); None:
    # measured on the running machine for the model's compute type (pass_costs.py) by for_model
    cost_rows: Tuple[int, ...] = (1, 2, 4, 8, 16, 32)
    row_costs: Optional[Tuple[float, ...]] = None
    prior_acceptance: float = 0.8  # per-token acceptance at a window's start
    acceptance_memory: float = 0.1  # weight of each new verdict in the running estimate
    # "aligned": draft segment-end timestamps from the CTC frames; "repeat": only the start of the
    # next segment (a copy of the end); "none": leave every timestamp to the verifier
    timestamps: str = "repeat"
    timestamp_offset: float = 0.0  # seconds added to a segment's CTC end time
    draft_end_of_text: bool = True
    # replace drafted words that are not a word of the main model's vocabulary by the nearest one
    # (drafting.ctc_lexicon)
    snap_words: bool = False
    # after a rejection, also propose what the verifier itself predicted after the rejected tokens
    # (its own spelling, from the last pass's rows), as a second branch beside the draft
    jacobi: bool = True
    # the same second branch when the head drafts inside the captured pass (drafting/device/ctc.py):
    # there it turns a chain pass into a tree pass of about twice the kernels, which cost more than
    # the branch's tokens saved (H100, base-ctc on 35 recordings: 2.23 s with it, 1.80 s without)
    branch_in_pass: bool = False

    def for_model(self, model, audio_features: Optional[Tensor] = None) -> "DraftSettings":
        """These settings with the pass costs of ``model`` at its compute type on this machine, unless
        they were given: the chunk length is chosen from what a pass costs here."""
        if self.row_costs is not None:
            return self
        return replace(self, row_costs=measured_pass_costs(model, self.cost_rows, audio_features))

    @classmethod
    def from_dict(cls, values: Optional[dict]) -> "DraftSettings":
        values = dict(values or {})
        known = {f.name for f in fields(cls)}
        unknown = sorted(set(values) - known)
        if unknown:
            raise ValueError(f"unknown CTC decoding settings {unknown}")
        for key in ("cost_rows", "row_costs"):
            if values.get(key) is not None:
                values[key] = tuple(values[key])
        return cls(**values)


def pass_cost(rows: int, settings: DraftSettings) -> float:
    """Relative cost of a pass over ``rows`` rows: the measured table, linear in between and beyond."""
    xs, ys = settings.cost_rows, settings.row_costs
    if ys is None:
        raise ValueError("pass costs not known yet: take the settings of DraftSettings.for_model(model)")
    if rows <= xs[0]:
        return ys[0]
    for (x0, y0), (x1, y1) in zip(zip(xs, ys), zip(xs[1:], ys[1:])):
        if rows <= x1:
            return y0 + (y1 - y0) * (rows - x0) / (x1 - x0)
    slope = (ys[-1] - ys[-2]) / (xs[-1] - xs[-2])
    return ys[-1] + slope * (rows - xs[-1])


def choose_chunk(acceptance: float, settings: DraftSettings) -> int:
    """Draft tokens per pass that maximise (1 + expected accepted) / pass cost; 0 means a plain step."""
    if settings.fixed_chunk:
        return settings.fixed_chunk
    best_k, best = 0, 1.0 / pass_cost(1, settings)
    expected = run = 1.0
    for k in range(1, settings.max_chunk + 1):
        run *= acceptance
        expected += run
        value = expected / pass_cost(1 + k, settings)
        if value > best:
            best_k, best = k, value
    return best_k


def align_end(committed: str, draft: str, free_start: bool = False) -> Tuple[int, int]:
    """Where ``committed`` ends in ``draft``: (end index in draft, edit distance).

    The whole of ``committed`` is aligned against a prefix of ``draft`` (or, with ``free_start``,
    any substring), unit costs. Of equally good ends, one before a word boundary of the draft wins
    when the committed text ends a word, then the one nearest ``len(committed)`` (with a free
    start: the earliest).
    """
    n = len(draft)
    previous = [0] * (n + 1) if free_start else list(range(n + 1))
    for i, a in enumerate(committed, start=1):
        current = [i] + [0] * n
        for j in range(1, n + 1):
            current[j] = min(previous[j] + 1, current[j - 1] + 1, previous[j - 1] + (a != draft[j - 1]))
        previous = current
    best = min(previous)
    ends = [j for j, c in enumerate(previous) if c == best]
    if free_start:
        return ends[0], best
    target = len(committed)
    ends_word = committed[-1:].isalnum()

    def boundary_mismatch(j: int) -> bool:
        return ends_word and j < n and draft[j].isalnum()

    return min(ends, key=lambda j: (boundary_mismatch(j), abs(j - target), -j)), best


def segment_ends(text: str) -> List[int]:
    """Indices just after each sentence end of the draft (where a segment may close), and its end."""
    ends = [i + 1 for i, c in enumerate(text) if c in SENTENCE_ENDS and (i + 1 == len(text) or text[i + 1] == " ")]
    if text.strip() and (not ends or ends[-1] != len(text)):
        ends.append(len(text))
    return ends


class CtcProposer(Proposer):
    def __init__(self, draft: CtcDraft, tokenizer: Tokenizer, settings: DraftSettings = DraftSettings(),
                 timestamps: bool = False, lossy_entropy: Optional[float] = None, setup_seconds: float = 0.0):
        super().__init__()
        self.stats.seconds += setup_seconds
        self.setup_seconds = setup_seconds
        if settings.snap_words:
            from .ctc_lexicon import lexicon, snap_draft

            draft = snap_draft(draft, lexicon(tokenizer.encoding.name.split(".")[0]))
        self.draft, self.tokenizer, self.settings = draft, tokenizer, settings
        self.timestamps = timestamps
        self.lossy_entropy = lossy_entropy
        self.text = draft.text.rstrip()
        self.boundaries = segment_ends(self.text)
        self.stream: List[int] = []  # this window's tokens so far (after the start-of-transcript sequence)
        self.started = False
        self.anchor_c = self.anchor_d = 0  # committed text length and draft position known to be in step
        self.d_pos = 0  # the draft position aligned with the end of the committed text
        self.plan: List[int] = []  # the continuation computed at the last proposal (one past the chunk)
        self.plan_d: List[int] = []  # draft position after each planned token
        self.proposed = 0  # how many of ``plan`` were proposed
        self.draft_nodes: List[int] = []  # the tree nodes of the proposed draft tokens
        self.jacobi: List[int] = []  # the verifier's guesses after the last rejection
        self.jacobi_branch: Tuple[List[int], List[int]] = ([], [])  # proposed guesses and their nodes
        self.acceptance = settings.prior_acceptance
        self.end_refused_at: Optional[int] = None  # anchor at which the draft's end (timestamp, end of text) was refused
        self.counts: Dict[str, int] = dict(passes=0, realignments=0, lost=0, timestamps_proposed=0,
                                           timestamps_accepted=0, eot_proposed=0, unverified=0,
                                           jacobi_proposed=0)
        # (an accepted end of text ends the decoding: no commit follows, so it is not counted here)

    # -- what was committed --------------------------------------------------------------------

    def _commit(self, committed: Committed) -> None:
        self.counts["passes"] += 1
        if not self.started:
            self.started = True
            self.stream = self._after_start_sequence(committed.tokens) + [committed.next_token]
            self._realign()
            return
        k, accepted = committed.n_accepted, committed.accepted
        draft = self.plan[: self.proposed]
        on_draft = accepted == draft[:k]  # (where the branches share a prefix, the draft's is taken)
        branch_tokens, branch_nodes = (draft, self.draft_nodes) if on_draft else self.jacobi_branch
        # how far the accepted path follows this proposer's branch: all of it when this proposer
        # drafted alone; less when another proposer's candidates (drafting.union) were accepted
        matched = 0
        while matched < min(k, len(branch_tokens)) and accepted[matched] == branch_tokens[matched]:
            matched += 1
        self._count_accepted(matched, matched < len(branch_tokens))
        self.counts["timestamps_accepted"] += sum(t >= self.tokenizer.timestamp_begin for t in accepted)
        # what the verifier said after each rejected node: a guess of what follows its own token
        self.jacobi = ([committed.predictions[1 + node] for node in branch_nodes[matched:]]
                       if self.settings.jacobi and committed.predictions and matched < len(branch_tokens) else [])
        self.stream += accepted
        if k and on_draft:
            self.anchor_d, self.anchor_c = self.plan_d[k - 1], len(self._committed_text())
        if on_draft and k < len(draft) and self.plan[k] >= self.tokenizer.eot \
                and committed.next_token < self.tokenizer.eot:
            self.end_refused_at = self.anchor_d  # the verifier goes on with text: no more ends until in step
        self.stream.append(committed.next_token)
        if on_draft and k == len(draft) and k < len(self.plan) and self.plan[k] == committed.next_token:
            # the verifier's own token is the draft's next one: still in step
            self.anchor_d, self.anchor_c = self.plan_d[k], len(self._committed_text())
            self.d_pos = self.anchor_d
        else:
            self._realign()

    def _after_start_sequence(self, initial: Sequence[int]) -> List[int]:
        """The prefix tokens of this window (after start-of-transcript, language, task, no-timestamps)."""
        tokens = list(initial)
        if self.tokenizer.sot not in tokens:
            return []
        i = len(tokens) - 1 - tokens[::-1].index(self.tokenizer.sot) + 1
        while i < len(tokens) and tokens[i] >= self.tokenizer.eot:
            i += 1
        return tokens[i:]

    def _count_accepted(self, accepted: int, refused: bool) -> None:
        """Update the running acceptance estimate: ``accepted`` drafted tokens kept, then one refused."""
        outcomes = [1.0] * accepted + ([0.0] if refused else [])
        for outcome in outcomes:
            self.acceptance += self.settings.acceptance_memory * (outcome - self.acceptance)

    def _committed_text(self) -> str:
        return self.tokenizer.decode([t for t in self.stream if t < self.tokenizer.eot])

    def _realign(self) -> None:
        """Find where the committed text ends in the draft, from the last point known in step."""
        committed = self._committed_text()
        new = committed[self.anchor_c:]
        if not new:
            self.d_pos = self.anchor_d
            return
        self.counts["realignments"] += 1
        if len(new) <= MAX_ALIGN_CHARS:
            window = self.text[self.anchor_d : self.anchor_d + 2 * len(new) + 16]
            end, _ = align_end(new, window)
            self.d_pos = self.anchor_d + end
            return
        # far from the last sync (the verifier went its own way for a while): look for the
        # committed text's tail ahead in the draft, and take it as the new sync point if it fits
        tail = new[-MAX_ALIGN_CHARS // 2 :]
        start = self.anchor_d
        window = self.text[start : start + len(new) + 2 * MAX_ALIGN_CHARS]
        end, cost = align_end(tail, window, free_start=True)
        if cost <= len(tail) // 4:
            self.anchor_d, self.anchor_c = start + end, len(committed)
            self.d_pos = self.anchor_d
        else:
            self.counts["lost"] += 1
            self.d_pos = min(len(self.text), self.anchor_d + len(new))

    # -- what to propose --------------------------------------------------------------------------

    def _propose(self) -> CandidateTree:
        k = choose_chunk(self.acceptance, self.settings)
        jacobi, self.jacobi = self.jacobi, []
        self.draft_nodes, self.jacobi_branch = [], ([], [])
        if self.lossy_entropy is None and k == 0:
            # a plain step; the estimate drifts back, so that drafting is tried again later
            self.acceptance += self.settings.acceptance_memory * (self.settings.prior_acceptance - self.acceptance)
            self.plan, self.plan_d, self.proposed = [], [], 0
            return CandidateTree()
        limit = k + 1
        unverified = 0
        if self.lossy_entropy is not None:
            limit = 64 + k + 1
        self.plan, self.plan_d = self.continuation(limit)
        if self.lossy_entropy is not None:
            unverified = self._confident_prefix()
            self.counts["unverified"] += unverified
        self.proposed = min(len(self.plan), unverified + k)
        draft = self.plan[: self.proposed]
        for token in draft:
            if token >= self.tokenizer.timestamp_begin:
                self.counts["timestamps_proposed"] += 1
            elif token == self.tokenizer.eot:
                self.counts["eot_proposed"] += 1
        self.draft_nodes = list(range(len(draft)))
        jacobi = jacobi[: max(k, 1)]
        shared = 0
        while shared < min(len(jacobi), len(draft)) and jacobi[shared] == draft[shared]:
            shared += 1
        if unverified or shared == len(jacobi):
            return CandidateTree.chain(draft, unverified=unverified)
        # a second branch: the verifier's own guesses from the last pass, where they leave the draft
        self.counts["jacobi_proposed"] += len(jacobi) - shared
        parents = list(range(-1, len(draft) - 1))
        nodes = self.draft_nodes[:shared]
        for i in range(shared, len(jacobi)):
            parents.append(nodes[-1] if nodes else -1)
            nodes.append(len(parents) - 1)
        self.jacobi_branch = (jacobi, nodes)
        return CandidateTree(tuple(draft) + tuple(jacobi[shared:]), tuple(parents))

    def continuation(self, max_tokens: int) -> Tuple[List[int], List[int]]:
        """The draft's next tokens after everything committed (the verifier's next token included),
        and the draft position after each; at most ``max_tokens``. A branch for any candidate tree."""
        tokens: List[int] = []
        positions: List[int] = []
        d = self.d_pos
        at_end_ok = self.end_refused_at != self.anchor_d
        draft_eot = self.settings.draft_end_of_text and at_end_ok
        last = self.stream[-1] if self.stream else None
        tok = self.tokenizer
        if last is None or last == tok.eot:
            return tokens, positions
        if self.timestamps and last >= tok.timestamp_begin and self._closes_segment():
            if self._draft_done(d):
                return ([tok.eot], [d]) if draft_eot else ([], [])
            if self.settings.timestamps == "none":
                return tokens, positions
            tokens.append(last)  # the next segment starts where the last one ended
            positions.append(d)
        while len(tokens) < max_tokens:
            if self._draft_done(d):
                if self.timestamps and self.settings.timestamps == "aligned" and at_end_ok and self._in_segment(tokens):
                    tokens.append(self._timestamp_at(len(self.text)))
                    positions.append(d)
                ends_segment = (tokens or self.stream)[-1] >= tok.timestamp_begin
                if draft_eot and (not self.timestamps or ends_segment):
                    tokens.append(tok.eot)
                    positions.append(d)
                break
            stop = next((b for b in self.boundaries if b > d), len(self.text)) if self.timestamps else len(self.text)
            words, ends = self._encode_from(d, stop, max_tokens - len(tokens), tokens)
            tokens += words
            positions += ends
            if not words:
                break
            d = ends[-1]
            if len(tokens) >= max_tokens or not self.timestamps or d < stop:
                continue
            # a sentence ends here: the segment closes with a timestamp, then the next one opens
            if self.settings.timestamps != "aligned":
                break
            stamp = self._timestamp_at(d)
            tokens.append(stamp)
            positions.append(d)
            if self._draft_done(d):
                continue  # end of text follows
            tokens.append(stamp)
            positions.append(d)
        return tokens[:max_tokens], positions[:max_tokens]

    def _draft_done(self, d: int) -> bool:
        return not self.text[d:].strip()

    def _closes_segment(self) -> bool:
        """Whether the stream's last token (a timestamp) ends a segment: text came before it."""
        return len(self.stream) >= 2 and self.stream[-2] < self.tokenizer.eot

    def _in_segment(self, planned: List[int]) -> bool:
        tokens = self.stream + planned
        return bool(tokens) and tokens[-1] < self.tokenizer.eot

    def _timestamp_at(self, d: int) -> int:
        """The timestamp token of the end of the draft's character before position d."""
        index = min(max(d - 1, 0), len(self.draft.char_end) - 1)
        seconds = (self.draft.char_end[index] if self.draft.char_end else 0.0) + self.settings.timestamp_offset
        earlier = [t for t in self.stream if t >= self.tokenizer.timestamp_begin]
        step = round(max(0.0, min(seconds, 30.0)) / TIMESTAMP_SECONDS)
        if earlier:
            step = max(step, earlier[-1] - self.tokenizer.timestamp_begin)
        return self.tokenizer.timestamp_begin + step

    def _encode_from(self, d: int, stop: int, max_tokens: int, planned: List[int]) -> Tuple[List[int], List[int]]:
        """Main-model tokens of draft[d:stop] in the context of the current word, and their end positions.

        The committed stream may end inside a word (" consid"): the word is re-encoded whole with
        the draft's rest of it, and the tokens after the committed ones are taken when they line
        up; else the draft's rest is encoded on its own.
        """
        rest = self.text[d:stop]
        budget = (max_tokens + 2) * 12
        if len(rest) > budget:  # cut at a space, so that the last word is encoded whole
            cut = rest.find(" ", budget)
            rest = rest if cut < 0 else rest[:cut]
        encoding = self.tokenizer.encoding
        context = [] if planned else self._word_so_far()
        tokens = None
        if context:
            joined = encoding.encode(self.tokenizer.decode(context) + rest)
            if joined[: len(context)] == context:
                tokens = joined[len(context):]
        if tokens is None:
            tokens = encoding.encode(rest)
        tokens = tokens[:max_tokens]
        ends, byte_end = [], 0
        char_of_byte = _char_index_of_bytes(rest)
        for t in tokens:
            byte_end += len(encoding.decode_single_token_bytes(t))
            ends.append(d + char_of_byte[min(byte_end, len(char_of_byte) - 1)])
        return tokens, ends

    def _word_so_far(self) -> List[int]:
        """The stream's trailing text tokens back to (and including) the last one that starts a word."""
        out: List[int] = []
        for t in reversed(self.stream[-4:]):
            if t >= self.tokenizer.eot:
                break
            out.insert(0, t)
            if self.tokenizer.encoding.decode_single_token_bytes(t)[:1] in (b" ", b""):
                return out
        return out if len(out) < 4 else []

    def _confident_prefix(self) -> int:
        """LOSSY option only: how many leading planned tokens have CTC frames of low entropy."""
        n, start = 0, self.d_pos
        for token, end in zip(self.plan, self.plan_d):
            if token >= self.tokenizer.eot:
                break
            span = self.draft.char_entropy[start:end]
            if not span or max(span) >= self.lossy_entropy:
                break
            n, start = n + 1, end
        return n


def _char_index_of_bytes(text: str) -> List[int]:
    """For each UTF-8 byte offset of ``text`` (0..len), how many whole characters precede it."""
    out = [0]
    for i, ch in enumerate(text):
        width = len(ch.encode("utf-8"))
        out += [i] * (width - 1) + [i + 1]
    return out
