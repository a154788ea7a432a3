"""The CTC draft verified a chunk per pass, with the draft's pointer kept on the device.

``drafting.ctc_proposer.CtcProposer`` keeps in step with the verifier on the host: it decodes the
committed text, aligns it with the draft's characters by edit distance and re-encodes the draft
from the current word. Each of those reads the pass's tokens. Here the window's draft is spelled
once, when the window starts (the head's pass, one read of its greedy path, one BPE encoding of the
whole text), into a buffer of the main model's tokens with each token's byte offset in the text,
and a pointer into that buffer moves inside each pass:

- in step: the verifier took every drafted token it was offered and its own next token is the
  draft's next one: the pointer moves past them;
- a timestamp or another special token: the draft has none, the pointer moves past the accepted
  draft tokens only; a timestamp that closes a segment is offered again first in the next chunk
  (whisper opens the next segment with it, as ``CtcProposer``'s "repeat" does);
- the committed tokens' last ``MATCH`` found in the draft close to where the pointer should be
  (two tokens or more anywhere from ``BEHIND`` before to ``AHEAD`` after it, one token within
  ``NEAR``): the pointer moves after them; this finds a word the verifier skipped or said twice;
- otherwise the verifier spelt the text its own way (" return" where the draft has " re" " turn",
  " fellow" for " fel" "o", " consid" for " consider"): the pointer moves to the draft token
  boundary nearest to as many bytes past the pointer as the verifier's tokens since it hold; at
  the same distance, staying put or a word boundary before the inside of a word.

With ``DraftSettings.branch_in_pass`` (off by default), after a pass that refused a drafted token,
the verifier's own tokens at the rows after it (what it would say next, the draft's spelling
corrected) are offered beside the next chunk as a second branch, as ``CtcProposer``'s "jacobi"
setting does; the two are one tree, verified by the tree pass. On the H100 the tree pass's extra
kernels cost more than the branch's tokens saved (docs/gpu.md), so every pass is a chain by default.

The host picks each pass's chunk length from the acceptance so far and what passes over more rows
cost (measured on the passes that run), among ``SIZES``, and whether the second branch goes with
it from the last pass's verdict (a ``Chunk``): one program per shape.
"""

from __future__ import annotations

from dataclasses import replace
from typing import List, NamedTuple, Optional, Tuple

import torch
from torch import Tensor

from ...step.fixed import FixedStep
from ..ctc_proposer import DraftSettings, pass_cost
from ..tree_layout import pack_on_device
from .base import DeviceProposer

SIZES = (0, 1, 2, 4, 8, 16)  # chunk lengths a pass may verify: each is a captured program
MATCH = 3  # committed tokens compared with the draft when realigning
BEHIND, AHEAD = 2, 8  # draft positions searched around the pointer
NEAR = 2  # a match of one token counts this close to the pointer only
BRANCH = 4  # most nodes of the second branch (the verifier's own tokens after a refusal)
PAD = MATCH + BEHIND + 1  # never-matching tokens before the draft, so that every search reads inside the buffer
FAR = 1 << 20  # a byte offset past any draft's end


class Chunk(NamedTuple):
    """The shape of a CTC proposal: ``length`` draft tokens, and with ``branch`` the verifier's own
    tokens from the last pass as a second branch (``branch_nodes``)."""

    length: int
    branch: bool = False

    @property
    def branch_nodes(self) -> int:
        return min(self.length, BRANCH) if self.branch else 0


class DeviceCtc(DeviceProposer):
    """A ``CtcHead`` (``model.draft_head``, or a union's part) as a device proposer.

    settings    : the head's ``DraftSettings`` (max_chunk, the acceptance estimate, timestamps, end of
                  text); its ``row_costs`` are measured where it runs (``set_row_costs``)
    token_bytes : shape = (n_vocab,) long, each text token's length in bytes (0 for special tokens)
    word_starts : shape = (n_vocab,) bool, whether the token's text begins with a space
    """

    def __init__(self, head, step: FixedStep, settings: DraftSettings, eot: int, timestamp_begin: int,
                 token_bytes: Tensor, word_starts: Tensor):
        device = step.device
        self.head, self.settings = head, settings
        self.eot, self.timestamp_begin = eot, timestamp_begin
        self.max_chunk = max(settings.max_chunk, settings.fixed_chunk, 1)
        self.sizes = (settings.fixed_chunk,) if settings.fixed_chunk else tuple(
            s for s in SIZES if s <= settings.max_chunk)
        self.max_draft = step.n_ctx  # a window's text never has more tokens than its context
        size = PAD + self.max_draft + AHEAD + self.max_chunk + 2
        self.draft = torch.full((size,), eot, dtype=torch.long, device=device)
        self.offset = torch.zeros(size, dtype=torch.long, device=device)  # draft index -> its byte offset
        self.boundary = torch.zeros(size, dtype=torch.bool, device=device)  # a word begins at the draft index
        self.end = torch.zeros(1, dtype=torch.long, device=device)  # draft tokens this window
        self.token_bytes, self.word_starts = token_bytes.cpu(), word_starts.cpu()
        self.token_bytes_device = token_bytes.to(device)
        self.pointer = torch.zeros(1, dtype=torch.long, device=device)
        self.chunk = torch.zeros(1, self.max_chunk, dtype=torch.long, device=device)
        self.prefixed = torch.zeros(1, dtype=torch.bool, device=device)  # chunk[0] repeats a timestamp
        # the second branch: the verifier's tokens after the last refusal, and which of them there are
        self.guesses = torch.zeros(1, self.max_chunk, dtype=torch.long, device=device)
        self.guessed = torch.zeros(1, self.max_chunk, dtype=torch.bool, device=device)
        self.index = torch.arange(self.max_chunk, device=device)
        self.refused = False  # host: the last pass refused a drafted token
        self.near = torch.arange(-BEHIND, AHEAD + 1, device=device)
        self.ahead = torch.arange(AHEAD + 1, device=device)
        self.back = torch.arange(MATCH, device=device)
        # constants of the pass, made once: every operation in it is a kernel a GPU pass replays.
        # A pass's rows, its first the pending token's (a union's pass may hold more than a chunk's):
        self.rows = torch.arange(step.n_ctx + 2, device=device)
        self.last_two = torch.tensor([0, 1], device=device)  # the next token's position, and the one before
        self.near_back = PAD - 1 + self.near[:, None] - self.back  # draft index before each near position
        self.distance = (self.near - 1).abs()  # from the pointer's next token
        self.close = self.distance <= NEAR
        self.reach = PAD + self.ahead  # the draft indices ahead, less the pointer
        self.inside_ahead = self.ahead > 0  # staying put is as good as a boundary
        self.chunk_index = PAD + self.index  # the chunk's draft indices, less the pointer
        self.acceptance = settings.prior_acceptance

    # ------------------------------------------------------------------ host

    @property
    def cost_rows(self):
        return self.settings.cost_rows

    @property
    def branches(self) -> bool:
        """Whether a refusal is followed by the verifier's own second branch (``branch_in_pass``)."""
        return self.settings.jacobi and self.settings.branch_in_pass

    def set_row_costs(self, costs) -> None:
        self.settings = replace(self.settings, row_costs=tuple(costs))

    def state(self) -> List[Tensor]:
        return [self.pointer, self.chunk, self.prefixed, self.guesses, self.guessed]

    def begin(self, audio_features: Tensor, tokenizer) -> None:
        draft = self.head.draft(audio_features)  # the head's pass and one read of its greedy path
        tokens = tokenizer.encoding.encode(draft.text.rstrip())[: self.max_draft - 1]
        if self.settings.draft_end_of_text:
            tokens.append(self.eot)
        ids = torch.tensor(tokens, dtype=torch.long)
        n = len(tokens)
        draft_tokens = torch.full(self.draft.shape, self.eot, dtype=torch.long)
        draft_tokens[:PAD] = -1
        draft_tokens[PAD:PAD + n] = ids
        offset = torch.full(self.offset.shape, FAR, dtype=torch.long)
        offset[:PAD] = -FAR
        offset[PAD:PAD + n + 1] = torch.cat([torch.zeros(1, dtype=torch.long), self.token_bytes[ids].cumsum(0)])
        boundary = torch.ones(self.boundary.shape, dtype=torch.bool)  # past the draft's text: its end
        boundary[PAD:PAD + n] = self.word_starts[ids] | (ids >= self.eot)
        self.draft.copy_(draft_tokens)
        self.offset.copy_(offset)
        self.boundary.copy_(boundary)
        self.end.fill_(n)
        self.pointer.zero_()
        self.prefixed.zero_()
        self.guessed.zero_()
        self.acceptance = self.settings.prior_acceptance
        self.refused = False

    def next_shape(self, room: int) -> Chunk:
        """The chunk length of ``sizes`` (at most ``room``) that maximises the expected tokens per
        unit of pass cost, as ``ctc_proposer.choose_chunk`` does (0: a plain pass); with the
        verifier's own branch after a refusal."""
        if self.settings.row_costs is None:
            raise ValueError("the pass costs are not measured yet (set_row_costs)")
        best, best_value = 0, 1.0 / pass_cost(1, self.settings)
        for k in self.sizes:
            if 0 < k <= room:
                expected = sum(self.acceptance ** i for i in range(k + 1))  # 1 + accepted, on average
                value = expected / pass_cost(1 + k, self.settings)
                if value > best_value or self.settings.fixed_chunk:
                    best, best_value = k, value
        return Chunk(best, bool(best and self.refused and self.branches))

    def is_tree(self, shape: Chunk) -> bool:
        return shape.branch

    def nodes(self, shape: Chunk) -> int:
        return shape.length + shape.branch_nodes

    def depth(self, shape: Chunk) -> int:
        return shape.length

    def observe(self, shape: Chunk, accepted: int) -> None:
        memory = self.settings.acceptance_memory
        self.refused = accepted < shape.length
        if not shape.length:  # drift back, so that drafting is tried again later
            self.acceptance += memory * (self.settings.prior_acceptance - self.acceptance)
            return
        for outcome in [1.0] * accepted + ([0.0] if accepted < shape.length else []):
            self.acceptance += memory * (outcome - self.acceptance)

    def candidates(self, shape: Chunk) -> Tensor:
        return self.chunk[:, :shape.length]

    def layout(self, shape: Chunk) -> Tensor:
        return pack_on_device(*self.tree(shape))

    def tree(self, shape: Chunk) -> Tuple[Tensor, Tensor, Tensor]:
        """The proposal as tokens, parents and validity of ``nodes(shape)`` nodes: the chunk's chain,
        then the branch's nodes (its first nodes are the chunk's own where they agree: invalid, the
        rest hang from the last of those)."""
        k = shape.length
        chunk, index = self.chunk[0, :k], self.index[:k]
        chain = index - 1
        if not shape.branch:
            return chunk, chain, torch.ones_like(index, dtype=torch.bool)
        b = shape.branch_nodes
        guesses, guessed, ahead = self.guesses[0, :b], self.guessed[0, :b], index[:b]
        shared = ((guesses == chunk[:b]) & guessed).long().cumprod(dim=0).sum()
        parents = torch.where(ahead <= shared, ahead - 1, k + ahead - 1)
        return (torch.cat([chunk, guesses]), torch.cat([chain, parents]),
                torch.cat([torch.ones_like(index, dtype=torch.bool), guessed & (ahead >= shared)]))

    # ------------------------------------------------------------------ the pass

    def advance(self, states: Tensor, history: Tensor, start: Tensor, count: Tensor, greedy: Tensor,
                shape: Optional[Chunk]) -> None:
        size = shape.length if shape is not None else 0
        n = states.shape[1]
        rows = self.rows[:n]
        new = history.gather(1, start[:, None] + self.rows[1:1 + n])  # (1, rows): accepted candidates, next token
        last = start + count  # the next token's position
        pair = history.gather(1, last[:, None] - self.last_two)
        token, before = pair[:, 0], pair[:, 1]  # (1,) each
        # how far the committed tokens follow the chunk this pass verified, and its second branch
        offered = rows[:size]
        accepted = offered < count[:, None] - 1
        matched = ((new[:, :size] == self.chunk[:, :size]) & accepted).long().cumprod(dim=-1).sum(dim=-1)
        self._guess(shape, new[:, :size], accepted, matched, greedy)
        middle = self.pointer + matched - (self.prefixed & (matched > 0)).long()  # the draft taken so far
        in_step = (matched == count - 1) & (token == self.draft[PAD + middle])

        # the committed tokens' tail against the draft before each position near the pointer
        tail = history.gather(1, (last[:, None] - self.back).clamp(min=0))  # (1, MATCH): newest first
        near = middle[:, None] + self.near  # (1, positions)
        drafted = self.draft[middle[:, None, None] + self.near_back]  # (1, positions, MATCH)
        same = (drafted == tail[:, None, :]) & (tail[:, None, :] < self.eot)
        matches = same.long().cumprod(dim=-1).sum(dim=-1)  # (1, positions)
        counts = (matches >= 2) | ((matches == 1) & self.close)
        best = torch.where(counts, matches * 1024 - self.distance, -FAR).argmax(dim=-1, keepdim=True)
        found = counts.gather(1, best)[:, 0]

        # else the boundary nearest to as many bytes past the draft taken as the verifier's own tokens hold
        first = matched if size else count - 1  # the window's prompt is not the draft's text
        own = (rows >= first[:, None]) & (rows < count[:, None])
        spelt = (self.token_bytes_device[new] * own).sum(dim=-1)  # (1,)
        reach = middle[:, None] + self.reach  # (1, AHEAD + 1): the pointer's draft index first
        offsets = self.offset[reach]
        gap = (offsets - offsets[:, :1] - spelt[:, None]).abs()
        mid_word = ~self.boundary[reach] & self.inside_ahead
        nearest = middle + (gap * 2 + mid_word.long()).argmin(dim=-1)

        moved = torch.where(in_step, middle + 1, torch.where(
            token >= self.eot, middle, torch.where(found, near.gather(1, best)[:, 0], nearest)))
        self.pointer.copy_(torch.minimum(moved.clamp(min=0), self.end))
        ahead = self.draft[self.pointer[:, None] + self.chunk_index]  # the draft's next max_chunk tokens
        closing = (token >= self.timestamp_begin) & (before < self.eot)
        if self.settings.timestamps == "none":  # leave every timestamp to the verifier
            closing = torch.zeros_like(closing)
        repeated = torch.cat([token[:, None], ahead[:, :-1]], dim=1)
        self.chunk.copy_(torch.where(closing[:, None], repeated, ahead))
        self.prefixed.copy_(closing)

    def _guess(self, shape: Optional[Chunk], new: Tensor, accepted: Tensor, matched: Tensor, greedy: Tensor) -> None:
        """The next second branch: the verifier's tokens at the nodes after the last accepted one, on
        the branch the accepted path followed further (the chunk's, or the last second branch's)."""
        if shape is None or not shape.length or not self.branches:
            self.guessed.zero_()
            return
        k, b = shape.length, shape.branch_nodes
        index = self.index[:k]
        rows = self.rows[1:1 + k]  # the chunk's nodes' rows
        limit = torch.full_like(matched, k)  # nodes on the branch followed
        if b:
            guesses, guessed = self.guesses[:, :b], self.guessed[:, :b]
            shared = ((guesses == self.chunk[:, :b]) & guessed).long().cumprod(dim=-1).sum(dim=-1)
            along = ((new[:, :b] == guesses) & guessed & accepted[:, :b]).long().cumprod(dim=-1).sum(dim=-1)
            # the branch's nodes' rows: the chunk's own where they share it, then their own
            branch_rows = torch.where(index < shared[:, None], 1 + index, 1 + k + index).clamp(max=k + b)
            further = along > matched
            rows = torch.where(further[:, None], branch_rows, rows)
            matched = torch.where(further, along, matched)
            limit = torch.where(further, b, limit)
        after = (matched[:, None] + index).clamp(max=k - 1)  # the nodes from the first refused one on
        self.guesses[:, :k].copy_(greedy.gather(1, rows.expand(1, -1).gather(1, after)))
        self.guessed[:, :k].copy_(matched[:, None] + index < limit[:, None])
        self.guessed[:, k:].zero_()


def vocabulary_bytes(tokenizer, n_vocab: int):
    """Each token's length in bytes (0 for special tokens) and whether its text begins with a space,
    two tensors of shape (n_vocab,)."""
    encoding = tokenizer.encoding
    lengths = torch.zeros(n_vocab, dtype=torch.long)
    starts = torch.zeros(n_vocab, dtype=torch.bool)
    for t in range(min(tokenizer.eot, n_vocab)):
        text = encoding.decode_single_token_bytes(t)
        lengths[t] = len(text)
        starts[t] = text[:1] == b" "
    return lengths, starts
