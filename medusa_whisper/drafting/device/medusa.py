"""Medusa heads drafting inside the pass: a chain of each head's best token, or a tree.

The heads read the main decoder's state at the last committed token; Medusa-Block heads read their
block's output there, the block having run over every committed row with a cache of its own, and
a ``base_head`` model's heads are its stacks after the next-token one. With ``width`` 1 head k
proposes its argmax at depth k + 1. With a larger width every head offers its ``width`` best
tokens, and the tree is the ``max_nodes`` most probable paths through them, a path scoring the sum
of its tokens' log-probabilities: what the Medusa paper builds best-first with a heap
(tests/reference_drafts.py). Here every path of the full tree (at most
``width ** depth`` per depth, a few hundred at the shipped sizes) is scored in one product with a
fixed path matrix and the best ``max_nodes`` are taken by a stable sort, which keeps a parent
before its child (its score is never lower) as the heap's order does.
"""

from __future__ import annotations

from typing import List, Optional, Tuple

import torch
import torch.nn.functional as F
from torch import Tensor

from ...step.fixed import DraftBlock, FixedStep, Linear, linear
from ..tree_layout import pack_on_device
from .base import DeviceProposer


class DeviceMedusa(DeviceProposer):
    """Medusa heads (``model.medusa``, any of the three kinds) as a device proposer.

    num_heads : heads used (depth of a chain, and of the deepest tree path)
    width     : each head's best tokens offered (1: a chain)
    max_nodes : a tree's candidates per pass
    """

    def __init__(self, heads, step: FixedStep, num_heads: int, width: int = 1, max_nodes: int = 0):
        device, products = step.device, step.products
        self.step = step
        offset = 1 if heads.has_base_head else 0  # a base_head model's stack 0 is its next-token head
        # the heads' layers by the step's products (dense for a captured pass, the compute type's
        # kernels on the CPU)
        self.stacks: List[List[Linear]] = [[products.head(rb.linear) for rb in heads.stacks[offset + k]]
                                           for k in range(num_heads)]
        self.ids = heads.proposal_token_ids().to(device)
        self.projection = products.projection(self.ids)
        # Medusa-Block: the extra decoder block runs over every committed row first
        self.slots = torch.arange(step.n_ctx, device=device)
        self.block = (None if heads.block is None else
                      DraftBlock(heads.block, products, step.n_ctx, step.n_audio_ctx, device))
        self.num_heads, self.width = num_heads, width
        self.tree = width > 1
        if self.tree:
            self.depth_ = min(num_heads, max_nodes or num_heads * width)  # a deeper path never ranks in
            self.path_matrix, self.last_choice, self.parents = _full_tree(self.depth_, width, device)
            self.tree_nodes = min(max_nodes or num_heads * width, self.parents.shape[0])
            self.packed = torch.zeros(4 + 2 * self.tree_nodes, self.tree_nodes, dtype=torch.long, device=device)
        else:
            self.tokens = torch.zeros(1, num_heads, dtype=torch.long, device=device)

    def begin(self, audio_features: Tensor, tokenizer) -> None:
        if self.block is not None:  # else the heads keep nothing between windows
            self.block.set_audio(audio_features.to(self.step.residual))

    def next_shape(self, room: int) -> Optional[int]:
        """A chain of every head's token, or the tree: one shape each."""
        depth = self.depth_ if self.tree else self.num_heads
        if room < depth:
            return None
        return self.tree_nodes if self.tree else self.num_heads

    def is_tree(self, shape: int) -> bool:
        return self.tree

    def nodes(self, shape: int) -> int:
        return shape

    def depth(self, shape: int) -> int:
        return self.depth_ if self.tree else shape

    def state(self) -> List[Tensor]:
        return [self.packed if self.tree else self.tokens]

    def candidates(self, shape: int) -> Tensor:
        return self.tokens[:, :shape]

    def layout(self, shape: int) -> Tensor:
        return self.packed

    def logits(self, state: Tensor) -> Tensor:
        """(1, n_state) state at the last committed token (a Medusa-Block's block output) ->
        (num_heads, proposal vocabulary), float32."""
        states = []
        for stack in self.stacks:
            x = state
            for product in stack:
                x = x + F.silu(linear(x, product))
            states.append(x)
        return self.projection(torch.cat(states))

    def advance(self, states: Tensor, history: Tensor, start: Tensor, count: Tensor, greedy: Tensor,
                shape: Optional[int]) -> None:
        if self.block is not None:  # the block sees every row, so that its cache stays complete
            slots = start[:, None] + self.slots[:states.shape[1]]  # (1, rows): row i at position start + i
            states = self.block(states, slots, self.slots <= slots[..., None])
        last = states.gather(1, (count - 1)[:, None, None].expand(-1, 1, states.shape[-1]))[:, 0]
        logits = self.logits(last)
        if not self.tree:
            self.tokens.copy_(self.ids[logits.argmax(dim=-1)][None])
            return
        logprobs, columns = F.log_softmax(logits[:self.depth_], dim=-1).topk(self.width, dim=-1)  # (depth, width)
        scores = self.path_matrix @ logprobs.double().flatten()  # every path's sum, as the heap sums them
        order = torch.sort(-scores, stable=True).indices[:self.tree_nodes]  # best first; ties: breadth first
        tokens = self.ids[columns.flatten()][self.last_choice[order]]
        new_index = torch.full_like(self.parents, -1)
        new_index[order] = torch.arange(self.tree_nodes, device=order.device)
        parent = self.parents[order]
        parents = torch.where(parent >= 0, new_index[parent.clamp(min=0)], parent)
        self.packed.copy_(pack_on_device(tokens, parents, torch.ones_like(tokens, dtype=torch.bool)))


def _full_tree(depth: int, width: int, device) -> Tuple[Tensor, Tensor, Tensor]:
    """Every path of ``width`` choices per depth, breadth first: which choices each path takes
    (a (paths, depth * width) 0/1 matrix, float64), the index of its last choice in the flattened
    (depth, width) choices, and its parent path (-1 at depth 1)."""
    paths: List[Tuple[int, ...]] = []
    parents: List[int] = []
    index_of = {(): -1}
    level: List[Tuple[int, ...]] = [()]
    for _ in range(depth):
        level = [prefix + (c,) for prefix in level for c in range(width)]
        for path in level:
            index_of[path] = len(paths)
            paths.append(path)
            parents.append(index_of[path[:-1]])
    matrix = torch.zeros(len(paths), depth * width, dtype=torch.float64)
    for i, path in enumerate(paths):
        for d, c in enumerate(path):
            matrix[i, d * width + c] = 1
    last = torch.tensor([(len(p) - 1) * width + p[-1] for p in paths])
    return matrix.to(device), last.to(device), torch.tensor(parents).to(device)
