"""An in-pass proposer run between passes, where the host accepts: one proposer on every device.

On CUDA a ``DeviceProposer`` drafts inside the captured pass. On the CPU the window loop walks each
pass's tree on the host (``loop.WindowDecoder``'s host acceptance: it filters only the rows it
reaches, and applies typical acceptance and any filter as they are), and asks a host ``Proposer``
for the next tree. ``Hosted`` is that proposer for an in-pass one: after each pass it hands the
proposer what was committed as the pass would (``advance``), and reads the proposal it wrote (one
read a pass). The proposer multiplies by the step's products, so on the CPU its heads run by the
compute type's kernels, as the decoder's layers do.
"""

from __future__ import annotations

from typing import Optional

import torch
from torch import Tensor

from ..base import Committed, Proposer
from ..tree import CandidateTree
from .base import DeviceProposer, Shape


class Hosted(Proposer):
    """``proposer`` (drafting on a step of ``n_ctx`` positions) as a host proposer for one window.

    audio_features : shape = (1, n_audio_ctx, n_audio_state), the window's encoder output
    """

    def __init__(self, proposer: DeviceProposer, audio_features: Tensor, tokenizer, n_ctx: int):
        super().__init__()
        self.proposer, self.n_ctx = proposer, n_ctx
        device = audio_features.device
        # position p's token at index p, as the pass's history (the verifier's next token included)
        self.history = torch.zeros(1, n_ctx + 1, dtype=torch.long, device=device)
        self.shape: Optional[Shape] = None  # of the proposal in the proposer's buffers
        with self._timed():
            proposer.renew()  # nothing captured replays its buffers here
            proposer.begin(audio_features, tokenizer)

    def _commit(self, committed: Committed) -> None:
        start, n = committed.position, len(committed.tokens)
        device = self.history.device
        self.history[0, start:start + n + 1] = torch.tensor(committed.tokens + [committed.next_token], device=device)
        # what the pass would tell it: the verifier's tokens before the rules (the host's walk has
        # them; only a CTC pointer reads them, and the CPU drafts CTC on the host)
        greedy = torch.tensor([committed.predictions or [committed.next_token]], device=device)
        self.proposer.advance(committed.hidden, self.history, torch.tensor([start], device=device),
                              torch.tensor([n], device=device), greedy, self.shape)
        # room after the next token's position; the loop truncates a proposal to what the window allows
        self.shape = self.proposer.next_shape(self.n_ctx - (start + n) - 1)

    def _propose(self) -> CandidateTree:
        shape = self.shape
        if shape is None or self.proposer.nodes(shape) == 0:
            return CandidateTree()
        if not self.proposer.is_tree(shape):
            return CandidateTree.chain(self.proposer.candidates(shape)[0].tolist())
        nodes = self.proposer.nodes(shape)
        tokens, parent_rows = self.proposer.layout(shape)[[0, 2], :nodes].tolist()  # tree_layout's rows
        return CandidateTree(tuple(tokens), tuple(row - 1 for row in parent_rows))
