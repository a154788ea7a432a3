"""Candidate trees: what a proposer hands the verifier, as plain data.

A tree holds candidate tokens for the positions after the last accepted token (the root). Node i
has a token and a parent (-1 for the root); parents come before their children, so a chain of K
tokens is the tree with ``parents == [-1, 0, 1, ..., K-2]``. The verifier feeds all nodes in one
decoder pass, each node attending to the committed context and to its own ancestors only
(``layout``), at the position of its depth; then it walks from the root to the deepest node whose
every token equals the verifier's greedy token (``acceptance.verify``).

Proposers build their trees best-first from log-probabilities (``drafting.device``): a node's
score is the sum of its path's log-probabilities, so a child never scores above its parent and the
N best nodes are always a tree (prefix-closed). With per-depth choices that do not depend on the
path (Medusa heads) this is the Medusa paper's sparse tree chosen by the heads' own confidences; a
proposer that conditions on the path (the EAGLE head) grows its tree level by level and keeps the
best nodes, as EAGLE-2 does.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import List, Optional, Sequence, Tuple

import torch
from torch import Tensor

from ..step.attention import chain_mask


@dataclass(frozen=True)
class CandidateTree:
    tokens: Tuple[int, ...] = ()
    parents: Tuple[int, ...] = ()  # index of each node's parent, -1 for the root
    scores: Tuple[float, ...] = ()  # the proposer's cumulative log-probability per node (may be empty)
    # LOSSY, honoured only with the lossy_ctc_entropy option: this many leading chain nodes are
    # accepted without comparing them with the verifier (decoding._accept_unverified)
    unverified: int = 0
    depths: Tuple[int, ...] = field(init=False, default=())  # 1 for children of the root

    def __post_init__(self):
        if len(self.tokens) != len(self.parents):
            raise ValueError("a tree needs one parent per token")
        depths: List[int] = []
        for i, parent in enumerate(self.parents):
            if not -1 <= parent < i:
                raise ValueError(f"node {i}: parent {parent} must come before it")
            depths.append(1 if parent < 0 else depths[parent] + 1)
        object.__setattr__(self, "depths", tuple(depths))
        if self.unverified and not (self.unverified <= len(self.tokens) and self.is_chain):
            raise ValueError("only a chain's leading nodes can be unverified")

    @classmethod
    def chain(cls, tokens: Sequence[int], scores: Sequence[float] = (), unverified: int = 0) -> "CandidateTree":
        return cls(tuple(tokens), tuple(range(-1, len(tokens) - 1)), tuple(scores), unverified)

    def __len__(self) -> int:
        return len(self.tokens)

    @property
    def is_chain(self) -> bool:
        return all(parent == i - 1 for i, parent in enumerate(self.parents))

    @property
    def depth(self) -> int:
        return max(self.depths, default=0)

    def children(self, node: int) -> List[int]:
        """Children of ``node`` (-1: the root), in the order the proposer ranked them."""
        return [i for i, parent in enumerate(self.parents) if parent == node]

    def truncated(self, max_depth: int) -> "CandidateTree":
        """The nodes at depth <= max_depth (the cache or the sample length has no room for more)."""
        if self.depth <= max_depth:
            return self
        keep = [i for i, d in enumerate(self.depths) if d <= max(max_depth, 0)]
        new_index = {old: new for new, old in enumerate(keep)}
        return CandidateTree(tuple(self.tokens[i] for i in keep),
                             tuple(new_index.get(self.parents[i], -1) for i in keep),
                             tuple(self.scores[i] for i in keep) if self.scores else (),
                             min(self.unverified, len(keep)))

    def ancestors_mask(self, device=None) -> Tensor:
        """(n, n) bool: row i is True at i and at every ancestor of i."""
        n = len(self)
        mask = torch.eye(n, dtype=torch.bool, device=device)
        for i, parent in enumerate(self.parents):
            if parent >= 0:
                mask[i] |= mask[parent]
        return mask

    def layout(self, start: int, n_pending: int, device=None) -> Tuple[Tensor, Optional[Tensor]]:
        """Positions and attention mask of one verification pass: the pending tokens, then the nodes.

        start     : committed cache slots (the pending tokens are written from here)
        returns   : positions, shape = (n_pending + n,); mask, shape = (n_pending + n, start + n_pending + n)
                    bool, True where attention is allowed, or None for a single row
        """
        n = n_pending + len(self)
        pending_positions = torch.arange(start, start + n_pending, device=device)
        if not len(self):
            return pending_positions, chain_mask(start, n, device)
        node_positions = torch.tensor(self.depths, device=device) + (start + n_pending - 1)
        positions = torch.cat([pending_positions, node_positions])
        if self.is_chain:
            return positions, chain_mask(start, n, device)
        mask = torch.zeros(n, start + n, dtype=torch.bool, device=device)
        mask[:, : start + n_pending] = True  # everything committed, and every pending token ...
        mask[:n_pending, start : start + n_pending] = torch.ones(n_pending, n_pending, dtype=torch.bool,
                                                                  device=device).tril()  # ... causally
        mask[n_pending:, start + n_pending :] = self.ancestors_mask(device)
        return positions, mask
