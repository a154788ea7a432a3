"""Medusa-Linear heads drafting inside the pass: a chain of each head's best token, or a tree.

The heads read the main decoder's state at the last committed token (``drafting.medusa`` does the
same between passes on the host). With ``width`` 1 head k proposes its argmax at depth k + 1. With a
larger width every head offers its ``width`` best tokens, and the tree is the ``max_nodes`` most
probable paths through them, a path scoring the sum of its tokens' log-probabilities: what
``tree.best_first`` builds on the host with a heap. Here every path of the full tree (at most
``width ** depth`` per depth, a few hundred at the shipped sizes) is scored in one product with a
fixed path matrix and the best ``max_nodes`` are taken by a stable sort, which keeps a parent
before its child (its score is never lower) as the heap's order does.
"""

from __future__ import annotations

from typing import List, Optional, Tuple

import torch
import torch.nn.functional as F
from torch import Tensor

from ...step.fixed import FixedStep, Product, dense, linear
from ..tree_layout import pack_on_device
from .base import DeviceProposer


class DeviceMedusa(DeviceProposer):
    """Medusa-Linear heads (``model.medusa``) as a device proposer.

    num_heads : heads used (depth of a chain, and of the deepest tree path)
    width     : each head's best tokens offered (1: a chain)
    max_nodes : a tree's candidates per pass
    """

    def __init__(self, heads, step: FixedStep, num_heads: int, width: int = 1, max_nodes: int = 0):
        dtype, device = step.dtype, step.device
        self.blocks: List[List[Product]] = [[dense(block.linear, dtype) for block in heads.stacks[k]]
                                            for k in range(num_heads)]
        self.ids = heads.proposal_token_ids().to(device)
        self.vocabulary = step.vocabulary[self.ids].contiguous()
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
        pass  # the heads keep nothing between windows

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
        """(1, n_state) decoder state at the last committed token -> (num_heads, proposal vocabulary)."""
        states = []
        for blocks in self.blocks:
            x = state
            for product in blocks:
                x = x + F.silu(linear(x, product))
            states.append(x)
        return (torch.cat(states).to(self.vocabulary.dtype) @ self.vocabulary.T).float()

    def advance(self, states: Tensor, history: Tensor, start: Tensor, count: Tensor, greedy: Tensor,
                shape: Optional[int]) -> None:
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
