"""A candidate tree as the device's verification pass reads it (``fixed_decoding``'s tree pass).

The proposer's ``CandidateTree`` is host data (tuples of tokens and parents); the pass needs
tensors of one shape per graph. ``TreeLayout.pack`` pads a tree to a power-of-two number of nodes
and packs everything the pass reads (tokens, depths, parents' rows, which nodes can be kept, each
node's ancestors and its path from the root) into one int64 tensor, so that it reaches the device
in one copy; ``unpack`` gives the pass its views.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import List

import torch
from torch import Tensor

from .drafting.tree import CandidateTree


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
    nor below such a node (``decoding.verify`` takes the first acceptable child). The tree pass
    marks the others invalid, keeping the proposer's numbering of the nodes."""
    reachable: List[bool] = []
    seen = set()
    for token, parent in zip(tree.tokens, tree.parents):
        ok = (parent < 0 or reachable[parent]) and (parent, token) not in seen
        seen.add((parent, token))
        reachable.append(ok)
    return reachable
