"""The CTC chunk and the EAGLE head's proposal merged into one tree inside the pass.

``drafting.union.merge_trees`` merges the parts' trees as a trie on the host: a node whose path
is already in the union is shared. Here the CTC part offers a chain and the EAGLE part a chain or
a tree, so the merge has one form: the chain's nodes first, then every EAGLE node; an EAGLE node
whose whole path equals the chain's first tokens is the chain's node already, so it is marked
invalid (``tree_layout.pack_on_device`` never lets the pass keep it) and its children hang from
the chain's node instead. Both parts advance on whatever was committed, whoever proposed it.
"""

from __future__ import annotations

from typing import List, Optional

import torch
from torch import Tensor

from ..tree import CandidateTree
from ..tree_layout import TreeLayout, pack_on_device
from .base import DeviceProposer
from .ctc import Chunk, DeviceCtc
from .eagle import DeviceEagle


class DeviceUnion(DeviceProposer):
    """A CTC head's proposal (its chunk, and its second branch after a refusal) and an EAGLE head's
    chain or tree, verified as one tree per pass; the shape is the CTC part's."""

    def __init__(self, ctc: DeviceCtc, eagle: DeviceEagle):
        self.ctc, self.eagle = ctc, eagle
        device = ctc.chunk.device
        if eagle.tree:
            self.eagle_layout = lambda: TreeLayout.unpack(eagle.packed, eagle.tree_nodes)
            self.eagle_nodes = eagle.tree_nodes
        else:
            depth = eagle.depth_
            chain = TreeLayout.unpack(TreeLayout.pack(CandidateTree.chain(range(depth)), depth).to(device), depth)
            self.eagle_layout = lambda: TreeLayout(eagle.tokens[0], chain.depth, chain.parent_rows, chain.valid,
                                                   chain.ancestors, chain.paths)
            self.eagle_nodes = depth

    @property
    def cost_rows(self):
        return self.ctc.cost_rows

    def set_row_costs(self, costs) -> None:
        self.ctc.set_row_costs(costs)

    def begin(self, audio_features: Tensor, tokenizer) -> None:
        self.ctc.begin(audio_features, tokenizer)
        self.eagle.begin(audio_features, tokenizer)

    def next_shape(self, room: int) -> Optional[Chunk]:
        if self.eagle.next_shape(room) is None:
            return None
        return self.ctc.next_shape(room)

    def is_tree(self, shape: Chunk) -> bool:
        return True

    def nodes(self, shape: Chunk) -> int:
        return self.ctc.nodes(shape) + self.eagle_nodes

    def depth(self, shape: Chunk) -> int:
        return max(shape.length, self.eagle.depth_)

    def state(self) -> List[Tensor]:
        return self.ctc.state() + self.eagle.state()

    def observe(self, shape: Chunk, accepted: int) -> None:
        self.ctc.observe(shape, accepted)

    def layout(self, shape: Chunk) -> Tensor:
        size = shape.length
        tokens, parents, valid = self.ctc.tree(shape)
        first = tokens.shape[0]  # the EAGLE nodes come after the CTC part's
        eagle = self.eagle_layout()
        chunk = self.ctc.chunk[0, :size]
        # an EAGLE node is the chunk's own when every node on its path has the chunk's token at its depth
        chunk_at = torch.cat([chunk, chunk.new_full((1,), -1)])[(eagle.depth - 1).clamp(max=size)]
        on_chunk = (eagle.depth <= size) & (eagle.tokens == chunk_at)
        shared = ~(eagle.ancestors & ~on_chunk).any(dim=-1)  # (eagle nodes,)
        eagle_parents = eagle.parent_rows - 1  # -1: the root
        parent_shared = torch.where(eagle_parents >= 0, shared[eagle_parents.clamp(min=0)], torch.zeros_like(shared))
        # the chunk's node at the parent's depth stands for a shared parent
        eagle_parents = torch.where(parent_shared, eagle.depth - 2,
                                    torch.where(eagle_parents >= 0, first + eagle_parents, eagle_parents))
        return pack_on_device(torch.cat([tokens, eagle.tokens]), torch.cat([parents, eagle_parents]),
                              torch.cat([valid, eagle.valid & ~shared]))

    def advance(self, states: Tensor, history: Tensor, start: Tensor, count: Tensor, greedy: Tensor,
                shape: Optional[Chunk]) -> None:
        self.ctc.advance(states, history, start, count, greedy, shape)
        self.eagle.advance(states, history, start, count, greedy, shape)
