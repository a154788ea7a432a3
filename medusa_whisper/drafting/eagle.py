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
``max_nodes`` best nodes of all levels are verified. ``width`` 1 is a chain.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import List, Optional

import torch
import torch.nn.functional as F
from torch import Tensor, nn
from whisper.model import ModelDimensions, ResidualAttentionBlock

from ..step.cpu import CpuBlock
from ..step.int8_kernels import Prepared
from ..step.attention import chain_mask
from ..step.projection import of as projection_of
from .base import Committed, Proposer
from .draft_head import DraftHead
from .tree import CandidateTree, top_nodes

# candidates verified per pass in a tree, unless the options say otherwise
DEFAULT_TREE_NODES = 10


@dataclass(frozen=True)
class EagleConfig:
    n_state: int
    n_head: int
    n_ctx: int
    # how many shortlist tokens the head proposes among (the most frequent in its training labels)
    shortlist: int = 8192


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
                    shortlist=self.config.shortlist)

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
    return EagleHead(EagleConfig(**{"n_state": dims.n_text_state, "n_head": dims.n_text_head,
                                    "n_ctx": dims.n_text_ctx, **config}))


@dataclass
class _Node:
    token: int
    parent: int  # index in the proposer's node list, -1 for the root
    score: float  # cumulative log-probability under the head
    feature_from: Optional[Tensor]  # (n_state,) the drafted feature that predicted this token
    slot: int = -1  # the draft cache slot of the row that fed this token (-1: not expanded)
    ancestors: List[int] = field(default_factory=list)  # slots of the expanded ancestors' rows


class EagleProposer(Proposer):
    """The head's side of one decoding: its cache over the committed tokens, and the drafted tree."""

    def __init__(self, head: EagleHead, decoder, audio_features: Tensor, depth: int, width: int, max_nodes: int):
        super().__init__()
        self.head, self.decoder = head, decoder
        self.depth, self.width, self.max_nodes = depth, width, max_nodes
        n_ctx = self.n_ctx = decoder.positional_embedding.shape[0]
        # the head runs in float32 even when whisper's fp16 option put the main model in half
        # precision on a CPU (whisper.decode's default): its plain nn.Linear does not cast as whisper's does
        audio_features = audio_features.float()
        self.block = CpuBlock(head.block, n_ctx, audio_features)
        self.device = audio_features.device
        self.committed = 0  # draft cache slots that hold committed tokens
        self.next_feature: Optional[Tensor] = None  # (n_state,) drafted feature after the committed tokens

    def _block(self, x: Tensor, start: int, mask: Optional[Tensor]) -> Tensor:
        return self.head.ln(self.block.pass_at(x, start, mask))

    def _commit(self, committed: Committed) -> None:
        # rows for every committed token: [f_i ; token i+1], the last one with the main's next token
        hidden = committed.hidden.float()
        n = hidden.shape[1]
        start = committed.position
        # what was drafted after the previous commit is written over from ``start``
        next_tokens = torch.tensor([committed.tokens[1:] + [committed.next_token]], device=self.device)
        positions = torch.arange(start + 1, start + n + 1, device=self.device)
        x = self.head.fused(hidden, next_tokens, positions, self.decoder)
        out = self._block(x, start, chain_mask(start, n, self.device))
        self.committed = start + n
        self.next_feature = out[0, -1]

    def _propose(self) -> CandidateTree:
        room = self.n_ctx - self.committed - 1
        depth = min(self.depth, room)
        if self.next_feature is None or depth <= 0:
            return CandidateTree()
        if self.width == 1:
            return self._chain(depth)
        return self._tree(depth)

    def _chain(self, depth: int) -> CandidateTree:
        tokens: List[int] = []
        feature = self.next_feature
        slot = self.committed
        for d in range(depth):
            token = int(self.head.token_ids[self.head.shortlist_logits(feature, self.decoder).argmax()])
            tokens.append(token)
            if d + 1 == depth:
                break
            x = self.head.fused(feature[None, None], torch.tensor([[token]], device=self.device),
                                torch.tensor([slot + 1], device=self.device), self.decoder)
            feature = self._block(x, slot, None)[0, 0]
            slot += 1
        return CandidateTree.chain(tokens)

    def _children(self, features: Tensor) -> tuple:
        """The ``width`` best shortlist tokens and their log-probabilities for each feature row."""
        logprobs = F.log_softmax(self.head.shortlist_logits(features, self.decoder).float(), dim=-1)
        best, columns = logprobs.topk(self.width, dim=-1)
        return self.head.token_ids[columns].tolist(), best.tolist()

    def _tree(self, depth: int) -> CandidateTree:
        nodes: List[_Node] = []
        tokens, logprobs = self._children(self.next_feature[None])
        for token, lp in zip(tokens[0], logprobs[0]):
            nodes.append(_Node(token, -1, lp, self.next_feature))
        frontier = list(range(len(nodes)))
        slot = self.committed
        for d in range(1, depth):
            # expand the `width` best nodes of the last level, all in one block pass
            frontier = sorted(frontier, key=lambda i: -nodes[i].score)[: self.width]
            m = len(frontier)
            features = torch.stack([nodes[i].feature_from for i in frontier])[None]  # (1, m, n_state)
            next_tokens = torch.tensor([[nodes[i].token for i in frontier]], device=self.device)
            positions = torch.full((m,), self.committed + d, device=self.device)
            mask = torch.zeros(m, slot + m, dtype=torch.bool, device=self.device)
            mask[:, : self.committed] = True
            for row, i in enumerate(frontier):
                node = nodes[i]
                node.slot = slot + row
                node.ancestors = (nodes[node.parent].ancestors + [nodes[node.parent].slot]) if node.parent >= 0 else []
                mask[row, node.ancestors + [node.slot]] = True
            out = self._block(self.head.fused(features, next_tokens, positions, self.decoder), slot, mask)
            slot += m
            tokens, logprobs = self._children(out[0])
            new_frontier = []
            for row, i in enumerate(frontier):
                for token, lp in zip(tokens[row], logprobs[row]):
                    new_frontier.append(len(nodes))
                    nodes.append(_Node(token, i, nodes[i].score + lp, out[0, row]))
            frontier = new_frontier
        return top_nodes([n.token for n in nodes], [n.parent for n in nodes], [n.score for n in nodes], self.max_nodes)
