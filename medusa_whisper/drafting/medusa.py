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

from ..step.decoder import block_caches, block_forward, self_attention_mask
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
        self.block_cache = self.block_cross = None
        if heads.block is not None:
            n_ctx = decoder.positional_embedding.shape[0]
            self.block_cache, self.block_cross = block_caches([heads.block], n_ctx, audio_features)

    def _commit(self, committed: Committed) -> None:
        hidden = committed.hidden
        if self.block_cache is not None:
            # the block must see every committed token, so that its cache stays complete
            start, n = committed.position, hidden.shape[1]
            self.block_cache.rollback(start)
            mask = self_attention_mask(self.heads.block.attn, chain_mask(start, n, hidden.device), start, n,
                                       self.block_cache)
            hidden = block_forward(self.heads.block, hidden, self.block_cache, 0, start, self.block_cross.keys[0],
                                   self.block_cross.values[0], mask)
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
