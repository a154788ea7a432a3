"""The EAGLE-style draft head: it drafts the main decoder's next features, not just its tokens.

The head is one decoder block of the main model's width (self-attention with its own rollback
cache, cross-attention to the main model's encoder output, so no second encoder), a fusion linear
in front of it and a LayerNorm after it. Its input at position t fuses the main decoder's
post-LayerNorm state f_t (the state whose projection gave token t+1) with the embedding of token
t+1; its output, through the LayerNorm, predicts f_{t+1}, whose projection through the tied token
embedding predicts token t+2. Drafting then goes on from its own predicted features: f^_{t+1} with
the drafted token t+2 gives f^_{t+2}, and so on (EAGLE, Li et al. 2024).

Proposals come from a shortlist of the tokens the main model says most often (measured on the
training labels), so a drafted row costs a small projection instead of the 51,864-way one.

Trees (EAGLE-2's dynamic tree): each level expands the ``width`` best nodes of the level before
(by cumulative log-probability) into their ``width`` best tokens, in one block pass per level; the
``max_nodes`` best nodes of all levels are verified. ``width`` 1 is a chain. The head drafts by one
proposer on every device, ``drafting.device.eagle.DeviceEagle``.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Optional, Tuple

import torch
from torch import Tensor, nn
from whisper.model import ModelDimensions, ResidualAttentionBlock

from ..step.int8_kernels import Prepared
from ..step.projection import of as projection_of
from .draft_head import DraftHead

# candidates verified per pass in a tree, unless the options say otherwise
DEFAULT_TREE_NODES = 10


@dataclass(frozen=True)
class EagleConfig:
    n_state: int
    n_head: int
    n_ctx: int
    # how many shortlist tokens the head proposes among (the most frequent in its training labels)
    shortlist: int = 8192
    # the share of held-out passes whose chain candidate at each depth was accepted (its training
    # record's replay, ``training.eagle.simulate``): what a chain's length is chosen from
    accepted_at_depth: Tuple[float, ...] = ()


class EagleHead(DraftHead):
    kind = "eagle"

    def __init__(self, config: EagleConfig):
        super().__init__()
        self.config = config
        d = config.n_state
        self.fuse = nn.Linear(2 * d, d)
        with torch.no_grad():  # starts as f_t + embedding(t+1): the decoder's own kind of input
            self.fuse.weight.copy_(torch.cat([torch.eye(d), torch.eye(d)], dim=1))
            self.fuse.bias.zero_()
        self.block = ResidualAttentionBlock(d, config.n_head, cross_attention=True)
        self.ln = nn.LayerNorm(d)
        # the proposal vocabulary: token ids, most frequent first (set by training: set_shortlist)
        self.register_buffer("token_ids", torch.arange(config.shortlist, dtype=torch.long))
        self.prepared = Prepared()  # the decoder's projection onto the shortlist (shortlist_logits)

    def set_shortlist(self, token_ids: Tensor) -> None:
        with torch.no_grad():
            self.token_ids.copy_(token_ids)
        self.prepared.clear()

    def _load_from_state_dict(self, *args, **kwargs):
        self.prepared.clear()  # a new shortlist may come with the state
        super()._load_from_state_dict(*args, **kwargs)

    def config_dict(self) -> dict:
        return dict(n_state=self.config.n_state, n_head=self.config.n_head, n_ctx=self.config.n_ctx,
                    shortlist=self.config.shortlist, accepted_at_depth=list(self.config.accepted_at_depth))

    def init_from(self, decoder) -> None:
        """Start the block and LayerNorm as copies of the main decoder's last block and final LayerNorm."""
        self.block.load_state_dict(decoder.blocks[-1].state_dict())
        self.ln.load_state_dict(decoder.ln.state_dict())

    def fused(self, features: Tensor, next_tokens: Tensor, next_positions: Tensor, decoder) -> Tensor:
        """The block's input: [f_t ; embedding of token t+1 at position t+1], fused.

        features       : shape = (batch, n, n_state), main (or drafted) post-LN states at positions t
        next_tokens    : shape = (batch, n), the tokens at t+1
        next_positions : shape = (n,), the positions t+1
        """
        embedded = decoder.token_embedding(next_tokens) + decoder.positional_embedding[next_positions]
        return self.fuse(torch.cat([features, embedded.to(features.dtype)], dim=-1))

    def shortlist_logits(self, states: Tensor, decoder) -> Tensor:
        """Logits over the shortlist (column j is token ``token_ids[j]``), by the decoder's projection
        (its compute type's kernel) selected once.

        states : shape = (..., n_state) -> (..., shortlist)
        """
        vocabulary = projection_of(decoder)
        shortlist = self.prepared.get("shortlist", lambda: vocabulary.select(self.token_ids), vocabulary,
                                      self.token_ids)
        return shortlist(states)


def build(dims: ModelDimensions, config: dict) -> EagleHead:
    config = {"n_state": dims.n_text_state, "n_head": dims.n_text_head, "n_ctx": dims.n_text_ctx, **config}
    config["accepted_at_depth"] = tuple(config.get("accepted_at_depth", ()))
    return EagleHead(EagleConfig(**config))


def with_record(config: dict, record: Optional[dict]) -> dict:
    """A heads file's EAGLE config with its record's held-out acceptance by depth, where the config
    has none (heads files written before the config carried it)."""
    if config.get("kind") != "eagle" or config.get("accepted_at_depth"):
        return config
    heldout = ((record or {}).get("final") or {}).get("heldout") or {}
    accepted = heldout.get("accepted_at_depth")
    return dict(config, accepted_at_depth=list(accepted)) if accepted else config
