"""A candidate tree as the device's verification pass reads it (``loop``'s tree pass).

The pass needs tensors of one shape per graph. A tree reaches it in one of two ways, and both
give the same packed int64 tensor (``TreeLayout``):

- a host proposer's ``CandidateTree`` (tuples of tokens and parents) is packed on the host by
  ``TreeLayout.pack``, padded to a power-of-two number of nodes, and copied to the device once;
- a proposer that drafts on the device (``drafting.device``) has its tokens and parents as device
  tensors already; ``pack_on_device`` derives the rest (depths, ancestors, paths, which nodes can
  be kept) with tensor operations only, so that the pass that drafts and the pass that verifies
  stay one captured program with nothing read by the host.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import List

import torch
from torch import Tensor

from .tree import CandidateTree


@dataclass
class TreeLayout:
    """A candidate tree as the tree pass reads it, ``nodes`` slots long (a power of two: one graph
    per size), packed into one int64 tensor so that it reaches the device in one copy.

    tokens, depth, parent_rows (the pass's row of each node's parent: 0 for the pending token),
    valid (0 for padding): (nodes,); ancestors (nodes, nodes): node j's ancestors and itself;
    paths (nodes, nodes): node j's ancestors root side first, then j, then j repeated (unused)
    """

    tokens: Tensor
    depth: Tensor
    parent_rows: Tensor
    valid: Tensor
    ancestors: Tensor
    paths: Tensor

    @staticmethod
    def pack(tree: CandidateTree, nodes: int) -> Tensor:
        n = len(tree)
        packed = torch.zeros(4 + 2 * nodes, nodes, dtype=torch.long)
        packed[0, :n] = torch.tensor(tree.tokens)
        packed[1, :n] = torch.tensor(tree.depths)
        packed[2, :n] = torch.tensor(tree.parents) + 1
        packed[3, :n] = torch.tensor(reachable(tree), dtype=torch.long)
        paths = torch.arange(nodes)[:, None].repeat(1, nodes)
        for j in range(n):
            chain = []
            node = j
            while node >= 0:
                chain.append(node)
                node = tree.parents[node]
            chain.reverse()
            paths[j, :len(chain)] = torch.tensor(chain)
            packed[4 + j, chain] = 1
        packed[4 + nodes:] = paths
        return packed

    @classmethod
    def unpack(cls, packed: Tensor, nodes: int) -> "TreeLayout":
        return cls(packed[0], packed[1], packed[2], packed[3].bool(), packed[4:4 + nodes].bool(),
                   packed[4 + nodes:])


def reachable(tree: CandidateTree) -> List[bool]:
    """Per node, whether the verifier could keep it: not where an earlier sibling has the same token,
    nor below such a node (``acceptance.verify`` takes the first acceptable child). The tree pass
    marks the others invalid, keeping the proposer's numbering of the nodes."""
    reachable: List[bool] = []
    seen = set()
    for token, parent in zip(tree.tokens, tree.parents):
        ok = (parent < 0 or reachable[parent]) and (parent, token) not in seen
        seen.add((parent, token))
        reachable.append(ok)
    return reachable


def pack_on_device(tokens: Tensor, parents: Tensor, valid: Tensor) -> Tensor:
    """``TreeLayout.pack`` of a tree given as device tensors, by tensor operations only: equal to it
    for every valid node (an invalid node's rows hold its place in the tree; the pass never keeps it).

    tokens  : shape = (nodes,) long
    parents : shape = (nodes,) long, each node's parent (-1: the root), always an earlier node
    valid   : shape = (nodes,) bool, False for padding and for nodes a proposer drops (a union's
              duplicates); a node below an invalid one, or after an earlier sibling with its
              token, is marked invalid too, as ``reachable`` does
    returns : shape = (4 + 2 * nodes, nodes) long, what ``TreeLayout.unpack`` reads
    """
    nodes = tokens.shape[0]
    index = torch.arange(nodes, device=tokens.device)
    # reach[j, i]: i is j or one of its ancestors; doubling the steps covers any depth in log2 rounds
    # as 0.0 / 1.0 (path counts clamped to 1, exact in float32): one product and one clamp a round,
    # where a bool matrix would be cast twice a round (every operation is a kernel of a GPU pass)
    reach_01 = ((parents[:, None] == index) | (index[:, None] == index)).float()
    for _ in range(max(nodes - 1, 1).bit_length()):
        reach_01 = (reach_01 @ reach_01).clamp_(max=1.0)
    reach = reach_01 > 0
    depth = reach.sum(dim=-1)  # the node itself counts: 1 for a child of the root
    earlier_twin = ((parents[:, None] == parents) & (tokens[:, None] == tokens) & (index[None, :] < index[:, None]))
    ok = valid & ~earlier_twin.any(dim=-1)
    kept = ~(reach & ~ok).any(dim=-1)
    # paths[j, e]: j's ancestor at depth e + 1 (each depth has one), then j
    at_depth = (depth[:, None] - 1 == index).float()  # (node, depth index)
    on_path = (reach_01 @ at_depth) > 0
    ancestor = (reach_01 @ (at_depth * index[:, None].float())).long()
    paths = torch.where(on_path, ancestor, index[:, None])
    rows = torch.stack([tokens, depth, parents + 1, kept.long()])
    return torch.cat([rows, reach.long(), paths])
