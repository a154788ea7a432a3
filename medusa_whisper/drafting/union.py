"""Several drafters at once: their candidate trees merged into one, verified in one pass.

Issue 18's combination: the CTC head's continuation of the window's draft is one branch, the EAGLE
head's chain another, and whichever the verifier agrees with is accepted. The two fail in different
places (the CTC draft loses step after a misheard word; the EAGLE head is right about the next word
when the audio says it clearly), so the union accepts more per pass than either. The price is the
extra rows of the one verification pass and each drafter's own work on every pass.

The trees are merged as a trie: a node of a later proposer whose path is already in the union is
shared, so no path is verified twice and the verifier's walk stays unambiguous. Each part is told
what was committed in terms of its own tree (its node numbers, the verifier's predictions at them),
and every part sees every committed token, whoever proposed it.
"""

from __future__ import annotations

from dataclasses import replace
from typing import Dict, List, Sequence, Tuple

from torch import nn

from .base import Committed, Proposer
from .draft_head import DraftHead, build_draft_head
from .tree import CandidateTree


def merge_trees(trees: Sequence[CandidateTree]) -> Tuple[CandidateTree, List[List[int]]]:
    """The union of ``trees`` as one tree, and for each input tree the union node of each of its nodes.

    Nodes with the same path (the same tokens from the root) become one node; the first tree's
    order is kept, then each later tree's new nodes in its own order (parents before children).
    Scores are dropped: they are not comparable across proposers.
    """
    tokens: List[int] = []
    parents: List[int] = []
    child_of: Dict[Tuple[int, int], int] = {}  # (union parent, token) -> union node
    maps: List[List[int]] = []
    for tree in trees:
        mapping: List[int] = []
        for token, parent in zip(tree.tokens, tree.parents):
            union_parent = mapping[parent] if parent >= 0 else -1
            key = (union_parent, token)
            node = child_of.get(key)
            if node is None:
                node = child_of[key] = len(tokens)
                tokens.append(token)
                parents.append(union_parent)
            mapping.append(node)
        maps.append(mapping)
    return CandidateTree(tuple(tokens), tuple(parents)), maps


class UnionProposer(Proposer):
    """Proposes the merged trees of its parts; each part commits as if it had proposed alone."""

    def __init__(self, parts: Sequence[Proposer]):
        super().__init__()
        if not parts:
            raise ValueError("a union needs at least one proposer")
        self.parts = list(parts)
        # what the parts spent before the first pass (the CTC head's pass over the window) counts too
        self.stats.seconds += sum(part.stats.seconds for part in self.parts)
        self.tree = CandidateTree()
        self.maps: List[List[int]] = [[] for _ in self.parts]
        # per part: in how many passes the accepted path began with one of its candidates
        self.led = [0] * len(self.parts)

    def _propose(self) -> CandidateTree:
        trees = [part.propose() for part in self.parts]
        if any(tree.unverified for tree in trees):
            raise ValueError("unverified (lossy) drafts cannot be merged with other proposers")
        self.tree, self.maps = merge_trees(trees)
        return self.tree

    def _commit(self, committed: Committed) -> None:
        first = self._first_accepted_node(committed)
        for i, (part, mapping) in enumerate(zip(self.parts, self.maps)):
            if first is not None and first in mapping:
                self.led[i] += 1
            predictions = committed.predictions
            if predictions:  # the verifier's argmax at the root, then at this part's nodes
                predictions = [predictions[0]] + [predictions[1 + node] for node in mapping]
            part.commit(replace(committed, n_proposed=len(mapping), predictions=predictions))

    def _first_accepted_node(self, committed: Committed):
        """The union node of the first accepted candidate (None when none was accepted)."""
        if not committed.n_accepted:
            return None
        token = committed.accepted[0]
        for node, (t, parent) in enumerate(zip(self.tree.tokens, self.tree.parents)):
            if parent == -1 and t == token:
                return node
        return None


class UnionHead(DraftHead):
    """Draft heads used together (the model name ``<base>-ctc+eagle``, which reads ``weights/<base>-ctc.pt``
    and ``weights/<base>-eagle.pt``): a union of their proposers."""

    kind = "union"

    def __init__(self, parts: Sequence[DraftHead]):
        super().__init__()
        self.parts = nn.ModuleList(parts)

    def config_dict(self) -> dict:
        return dict(parts=[dict(kind=part.kind, **part.config_dict()) for part in self.parts])


def build(dims, config: dict) -> UnionHead:
    return UnionHead([build_draft_head(dims, part) for part in config["parts"]])
