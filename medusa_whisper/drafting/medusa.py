"""Medusa heads as a proposer: head k guesses the token k+1 places after the next one.

Linear and base_head heads read the main decoder's state at the last committed token; the
Medusa-Block variant first runs its extra decoder block over every committed token (it has its own
self-attention cache, rolled back with the main one, and cross-attention to the audio). With
``width`` 1 the proposal is a chain of each head's best token; with a larger width, each head's
``width`` best tokens make a tree of the ``max_nodes`` most probable paths (``tree.best_first``),
scored by the heads' own log-probabilities.
"""

from __future__ import annotations

from typing import Optional

import torch.nn.functional as F
from torch import Tensor

from ..step.cpu import CpuBlock
from .heads import MedusaHeads
from ..step.attention import chain_mask
from ..step.projection import of as projection_of
from .base import Committed, Proposer
from .tree import CandidateTree, best_first


class MedusaProposer(Proposer):
    def __init__(self, heads: MedusaHeads, decoder, audio_features: Tensor, num_heads: int,
                 width: int = 1, max_nodes: Optional[int] = None):
        super().__init__()
        self.heads, self.decoder, self.num_heads = heads, decoder, num_heads
        self.width, self.max_nodes = width, max_nodes or num_heads * width
        self.head_input: Optional[Tensor] = None  # (1, n_state) at the last committed token
        self.block: Optional[CpuBlock] = None
        if heads.block is not None:
            self.block = CpuBlock(heads.block, decoder.positional_embedding.shape[0], audio_features)

    def _commit(self, committed: Committed) -> None:
        hidden = committed.hidden
        if self.block is not None:
            # the block must see every committed token, so that its cache stays complete
            start, n = committed.position, hidden.shape[1]
            hidden = self.block.pass_at(hidden, start, chain_mask(start, n, hidden.device))
        self.head_input = hidden[:, -1]

    def _propose(self) -> CandidateTree:
        if self.head_input is None or self.num_heads == 0:
            return CandidateTree()
        states = self.heads.head_states(self.head_input, self.num_heads)  # (1, K, n_state)
        # == heads.proposal_logits(states, embedding), by the decoder's projection (its compute type's kernel)
        logits = self.heads.proposal_projection(projection_of(self.decoder))(states)[0]  # (K, proposal_size)
        if self.width == 1:
            return CandidateTree.chain(self.heads.proposal_ids(logits.argmax(dim=-1)).tolist())
        logprobs, columns = F.log_softmax(logits.float(), dim=-1).topk(self.width, dim=-1)  # (K, width)
        choices = [(self.heads.proposal_ids(columns[k]).tolist(), logprobs[k].tolist())
                   for k in range(self.num_heads)]
        return best_first(choices, self.max_nodes)
