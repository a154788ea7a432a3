"""Reference drafts: the proposers' trees built the plain way, node by node on the host, to check
the tensor programs of ``drafting.device`` against (they build the same trees at fixed shapes).

``best_first`` is the Medusa paper's sparse tree from per-depth choices, with a heap; ``top_nodes``
EAGLE-2's re-ranking of a grown tree; ``eagle_tree`` and ``eagle_chain`` grow the EAGLE head's
drafts level by level with Python lists, calling only the proposer's block, fusion and shortlist.
"""

from __future__ import annotations

import heapq
from dataclasses import dataclass, field
from typing import Dict, List, Sequence, Tuple

import torch
from torch import Tensor

from medusa_whisper.drafting.tree import CandidateTree


def best_first(choices: Sequence[Tuple[Sequence[int], Sequence[float]]], max_nodes: int) -> CandidateTree:
    """The ``max_nodes`` most probable paths through independent per-depth choices.

    choices : per depth d (1..D), the candidate tokens and their log-probabilities, best first;
              a node at depth d may have any of depth d+1's candidates as a child
    The score of a node is the sum of its path's log-probabilities (the heads' joint estimate).
    """
    if not choices or max_nodes <= 0:
        return CandidateTree()
    tokens: List[int] = []
    parents: List[int] = []
    scores: List[float] = []
    # heap of (-score, tie-breaker, depth index, choice index, parent node)
    first_tokens, first_logprobs = choices[0]
    heap = [(-float(lp), j, 0, j, -1) for j, lp in enumerate(first_logprobs)]
    heapq.heapify(heap)
    counter = len(heap)
    while heap and len(tokens) < max_nodes:
        neg, _, depth, j, parent = heapq.heappop(heap)
        node = len(tokens)
        tokens.append(int(choices[depth][0][j]))
        parents.append(parent)
        scores.append(-neg)
        if depth + 1 < len(choices):
            for k, lp in enumerate(choices[depth + 1][1]):
                heapq.heappush(heap, (neg - float(lp), counter, depth + 1, k, node))
                counter += 1
    return CandidateTree(tuple(tokens), tuple(parents), tuple(scores))


def top_nodes(tokens: Sequence[int], parents: Sequence[int], scores: Sequence[float], max_nodes: int) -> CandidateTree:
    """The ``max_nodes`` best-scoring nodes of a grown tree (EAGLE-2's re-ranking), re-indexed.

    Scores must be cumulative log-probabilities (a child never above its parent), so the chosen set
    contains every chosen node's ancestors. Ties keep the earlier node.
    """
    order = sorted(range(len(tokens)), key=lambda i: (-scores[i], i))[:max_nodes]
    chosen = sorted(order)  # parents before children, as grown
    new_index: Dict[int, int] = {old: new for new, old in enumerate(chosen)}
    for i in chosen:
        if parents[i] >= 0 and parents[i] not in new_index:
            raise ValueError("scores are not cumulative: a node outranks its parent")
    return CandidateTree(tuple(tokens[i] for i in chosen), tuple(new_index.get(parents[i], -1) for i in chosen),
                         tuple(scores[i] for i in chosen))


@dataclass
class _Node:
    token: int
    parent: int  # index in the node list, -1 for the root
    score: float  # cumulative log-probability under the head, a Python float
    feature_from: Tensor  # (n_state,) the drafted feature that predicted this token
    slot: int = -1  # the draft cache slot of the row that fed this token (-1: not expanded)
    ancestors: List[int] = field(default_factory=list)  # slots of the expanded ancestors' rows


def _children(eagle, features: Tensor, width: int):
    best, columns = eagle._logprobs(features).topk(width, dim=-1)
    return eagle.ids[columns].tolist(), best.tolist()


def eagle_chain(eagle, feature: Tensor, committed: int, depth: int) -> List[int]:
    """The EAGLE head's chain from the feature after ``committed`` slots: each drafted token fed
    back with the feature that predicted it, one block row per token."""
    tokens: List[int] = []
    for d in range(depth):
        token = int(eagle.ids[eagle._logprobs(feature[None]).argmax()])
        tokens.append(token)
        if d + 1 == depth:
            break
        slot = torch.tensor([[committed + d]])
        x = eagle._fused(feature[None, None], torch.tensor([[token]]), slot + 1)
        feature = eagle._block(x, slot, eagle.slots <= slot[..., None])[0, 0]
    return tokens


def eagle_tree(eagle, feature: Tensor, committed: int, depth: int, width: int, max_nodes: int) -> CandidateTree:
    """EAGLE-2's tree from the feature after ``committed`` slots: each level expands the ``width``
    best nodes of the one before (by cumulative log-probability) into their ``width`` best tokens,
    in one block pass whose rows see the committed slots, their ancestors' rows and their own; the
    ``max_nodes`` best nodes of all levels are kept."""
    nodes: List[_Node] = []
    tokens, logprobs = _children(eagle, feature[None], width)
    for token, lp in zip(tokens[0], logprobs[0]):
        nodes.append(_Node(token, -1, lp, feature))
    frontier = list(range(len(nodes)))
    slot = committed
    for d in range(1, depth):
        frontier = sorted(frontier, key=lambda i: -nodes[i].score)[:width]
        m = len(frontier)
        features = torch.stack([nodes[i].feature_from for i in frontier])[None]
        next_tokens = torch.tensor([[nodes[i].token for i in frontier]])
        allowed = torch.zeros(1, m, len(eagle.slots), dtype=torch.bool)
        allowed[0, :, :committed] = True
        for row, i in enumerate(frontier):
            node = nodes[i]
            node.slot = slot + row
            node.ancestors = (nodes[node.parent].ancestors + [nodes[node.parent].slot]) if node.parent >= 0 else []
            allowed[0, row, node.ancestors + [node.slot]] = True
        x = eagle._fused(features, next_tokens, torch.full((1, m), committed + d))
        out = eagle._block(x, torch.arange(slot, slot + m)[None], allowed)[0]
        slot += m
        tokens, logprobs = _children(eagle, out, width)
        new_frontier = []
        for row, i in enumerate(frontier):
            for token, lp in zip(tokens[row], logprobs[row]):
                new_frontier.append(len(nodes))
                nodes.append(_Node(token, i, nodes[i].score + lp, out[row]))
        frontier = new_frontier
    return top_nodes([n.token for n in nodes], [n.parent for n in nodes], [n.score for n in nodes], max_nodes)
