"""Medusa heads: extra predictors of the tokens after the next one.

Three layouts (paper Fig. 1 and the reference implementation):

- ``linear`` (Medusa-Linear on a frozen base): head k in 1..K predicts token t+k+1 as
  ``E · RB_k(h_t)``, where ``h_t`` is the decoder's post-LayerNorm state and ``E`` the token
  embedding (the shared, tied vocabulary projection). The next-token logits stay vanilla ``E · h_t``.
- ``base_head`` (the reference's Medusa-Linear): like ``linear``, but there are K+1 residual
  stacks and the next-token logits come from stack 0, ``E · RB_0(h_t)``. Checkpoints of this kind
  come with a fine-tuned last decoder layer, so their greedy output is not vanilla Whisper's.
- ``block`` (Medusa-Block): one extra decoder block (self- and cross-attention, its own KV cache)
  runs on ``h`` first; head k predicts ``E · RB_k(block(h)_t)``. No LayerNorm after the block.

``RB(x) = x + SiLU(W x + b)`` with W and b zero-initialised, so an untrained head is the identity.
"""

from __future__ import annotations

import copy
from dataclasses import asdict, dataclass
from typing import Optional

import torch
import torch.nn.functional as F
from torch import Tensor, nn
from whisper.model import Linear, ModelDimensions, ResidualAttentionBlock


HEAD_TYPES = ("linear", "base_head", "block")


@dataclass(frozen=True)
class MedusaConfig:
    # number of heads that predict tokens beyond the next one (head k predicts t+k+1)
    num_heads: int = 0
    # "linear", "base_head" or "block" (see the module docstring)
    heads_type: str = "linear"
    # residual blocks stacked in each head (the reference's `medusa_num_layers`)
    num_layers: int = 1
    # Heads propose only among the first `proposal_vocab` token ids plus every special token
    # (0: the whole vocabulary). Whisper's BPE ids follow merge order, roughly most frequent first,
    # so a prefix is a frequency shortlist that needs no data. Differs from the reference (always
    # the whole vocabulary): on a CPU the vocabulary projection dominates a head's cost. Verification
    # always uses the whole vocabulary, so this never changes the output, only what is proposed.
    proposal_vocab: int = 0

    def __post_init__(self):
        if self.heads_type not in HEAD_TYPES:
            raise ValueError(f"heads_type must be one of {HEAD_TYPES}, got {self.heads_type!r}")
        if self.num_heads < 0 or self.num_layers < 1:
            raise ValueError(f"bad head counts: num_heads={self.num_heads}, num_layers={self.num_layers}")
        if self.proposal_vocab < 0:
            raise ValueError(f"proposal_vocab must be >= 0, got {self.proposal_vocab}")
        if self.heads_type == "block" and self.num_heads == 0:
            raise ValueError("a Medusa-Block model needs at least one head")

    def to_dict(self) -> dict:
        return asdict(self)


class ResBlock(nn.Module):
    """x + SiLU(W x + b), zero-initialised so that it starts as the identity."""

    def __init__(self, n_state: int):
        super().__init__()
        # whisper's Linear casts its weight to the input's dtype; a compute type may swap it for an int8 one
        self.linear = Linear(n_state, n_state)
        nn.init.zeros_(self.linear.weight)
        nn.init.zeros_(self.linear.bias)

    def forward(self, x: Tensor) -> Tensor:
        return x + F.silu(self.linear(x))


class MedusaHeads(nn.Module):
    """The residual stacks of all heads, and for ``block`` the shared extra decoder block.

    ``stacks[i]`` is head i's residual stack. For ``base_head`` stack 0 is the next-token head and
    stacks 1..K the Medusa heads; otherwise stacks 0..K-1 are heads 1..K.
    """

    def __init__(self, dims: ModelDimensions, config: MedusaConfig):
        super().__init__()
        self.config = config
        n_stacks = config.num_heads + (1 if config.heads_type == "base_head" else 0)
        self.stacks = nn.ModuleList(
            nn.Sequential(*[ResBlock(dims.n_text_state) for _ in range(config.num_layers)])
            for _ in range(n_stacks)
        )
        # whisper's special tokens (end-of-text, languages, timestamps...) are the ids from here on;
        # whisper.tokenizer: multilingual vocabularies have 51865+ tokens and one more text token
        self.first_special = 50257 if dims.n_vocab >= 51865 else 50256
        self.n_vocab = dims.n_vocab
        self.block: Optional[ResidualAttentionBlock] = None
        if config.heads_type == "block":
            self.block = ResidualAttentionBlock(dims.n_text_state, dims.n_text_head, cross_attention=True)

    def init_block_from(self, layer: ResidualAttentionBlock) -> None:
        """Start the Medusa block as a copy of the last decoder layer, as the reference does."""
        assert self.block is not None
        self.block.load_state_dict(copy.deepcopy(layer.state_dict()))

    @property
    def num_heads(self) -> int:
        return self.config.num_heads

    @property
    def has_base_head(self) -> bool:
        return self.config.heads_type == "base_head"

    def base_state(self, hidden: Tensor) -> Tensor:
        """The state whose projection gives the next-token logits (RB_0(h) for base_head, else h)."""
        return self.stacks[0](hidden) if self.has_base_head else hidden

    def head_states(self, head_input: Tensor, num_heads: Optional[int] = None) -> Tensor:
        """States of heads 1..num_heads for one position.

        head_input : shape = (batch, n_state), the decoder state h (or block(h) for ``block``)
        returns    : shape = (batch, num_heads, n_state)
        """
        k = self.num_heads if num_heads is None else num_heads
        offset = 1 if self.has_base_head else 0
        return torch.stack([self.stacks[offset + i](head_input) for i in range(k)], dim=1)

    # -- the proposal vocabulary ------------------------------------------------------------------

    @property
    def shortlist(self) -> Optional[int]:
        """Number of leading text tokens heads may propose, or None for the whole vocabulary."""
        n = self.config.proposal_vocab
        return n if 0 < n < self.first_special else None

    @property
    def proposal_size(self) -> int:
        n = self.shortlist
        return self.n_vocab if n is None else n + self.n_vocab - self.first_special

    def proposal_logits(self, states: Tensor, embedding: Tensor) -> Tensor:
        """Logits of head states over the proposal vocabulary (two slices of the tied embedding).

        states    : shape = (..., n_state)
        embedding : shape = (n_vocab, n_state), the decoder's token embedding
        returns   : shape = (..., proposal_size); column j is token ``proposal_ids(j)``
        """
        weight = embedding.to(states.dtype)
        n = self.shortlist
        if n is None:
            return states @ weight.T
        # slices are views: no copy of the embedding per call
        return torch.cat([states @ weight[:n].T, states @ weight[self.first_special:].T], dim=-1)

    def proposal_ids(self, columns: Tensor) -> Tensor:
        """Token ids of proposal-vocabulary columns."""
        n = self.shortlist
        return columns if n is None else torch.where(columns < n, columns, columns - n + self.first_special)

    def proposal_token_ids(self, device=None) -> Tensor:
        """Token ids of every proposal-vocabulary column, in column order."""
        return self.proposal_ids(torch.arange(self.proposal_size, device=device))

    def proposal_columns(self, token_ids: Tensor, ignore_index: int = -100) -> Tensor:
        """Columns of token ids in the proposal vocabulary; ``ignore_index`` where a token is outside it."""
        n = self.shortlist
        if n is None:
            return token_ids
        columns = torch.where(token_ids >= self.first_special, token_ids - self.first_special + n, token_ids)
        outside = (token_ids >= n) & (token_ids < self.first_special)
        return columns.masked_fill(outside | (token_ids < 0), ignore_index)
