"""Candidate trees: the data, the one-pass layout, and the cache after a tree's path is kept."""

import pytest
import torch

from medusa_whisper import MedusaConfig
from medusa_whisper.drafting.tree import CandidateTree

from helpers import feed, random_model, window_step
from reference_drafts import best_first, top_nodes

CONTEXT = [50257, 50362, 440, 1500, 286]
# root -> 262 -> 3329 -> 318
#      -> 262 -> 777
#      -> 1016 -> 13
TREE = CandidateTree(tokens=(262, 1016, 3329, 777, 13, 318), parents=(-1, -1, 0, 0, 1, 2))


def test_tree_data():
    assert TREE.depths == (1, 1, 2, 2, 2, 3)
    assert TREE.children(-1) == [0, 1] and TREE.children(0) == [2, 3] and TREE.children(5) == []
    assert not TREE.is_chain and CandidateTree.chain([5, 6, 7]).is_chain
    assert TREE.truncated(2).tokens == (262, 1016, 3329, 777, 13)
    assert TREE.truncated(0).tokens == ()
    mask = TREE.ancestors_mask()
    assert mask[5].nonzero().flatten().tolist() == [0, 2, 5]
    assert mask[4].nonzero().flatten().tolist() == [1, 4]
    with pytest.raises(ValueError):
        CandidateTree(tokens=(1, 2), parents=(-1, 1))  # a node cannot be its own parent


def test_best_first_keeps_the_most_probable_paths_prefix_closed():
    # head 1 is sure of 10, head 2 hesitates between 20 and 21, head 3 is sure of 30
    choices = [([10, 11], [-0.01, -5.0]), ([20, 21], [-0.7, -0.8]), ([30, 31], [-0.05, -4.0])]
    tree = best_first(choices, max_nodes=5)
    paths = {tuple(tree.tokens[a] for a in _path(tree, i)) for i in range(len(tree))}
    assert paths == {(10,), (10, 20), (10, 21), (10, 20, 30), (10, 21, 30)}
    assert best_first(choices, max_nodes=3).tokens == (10, 20, 30)  # -0.76 beats (10, 21) at -0.81
    # a chain is the one-node-per-depth case
    assert best_first([([1], [0.0]), ([2], [0.0])], max_nodes=8) == CandidateTree.chain([1, 2], [0.0, 0.0])


def test_top_nodes_rejects_scores_that_are_not_cumulative():
    tree = top_nodes([1, 2, 3], [-1, 0, 0], [-1.0, -1.5, -3.0], max_nodes=2)
    assert tree.tokens == (1, 2) and tree.parents == (-1, 0)
    with pytest.raises(ValueError):
        top_nodes([1, 2], [-1, 0], [-2.0, -1.0], max_nodes=1)


def _path(tree, node):
    path = []
    while node >= 0:
        path.append(node)
        node = tree.parents[node]
    return path[::-1]


@pytest.fixture(scope="module")
def model_and_audio():
    model = random_model(MedusaConfig())
    torch.manual_seed(2)
    with torch.no_grad():
        audio = model.encoder(torch.randn(1, 80, 3000))
    return model, audio


@torch.no_grad()
def test_one_tree_pass_equals_each_path_fed_as_a_chain(model_and_audio):
    model, audio = model_and_audio
    pending = CONTEXT[-1:]
    step = window_step(model, audio)
    n = len(CONTEXT) - 1
    feed(step, CONTEXT[:-1], 0)
    positions, mask = TREE.layout(n, len(pending))
    assert positions.tolist() == [4, 5, 5, 6, 6, 6, 7]
    hidden = feed(step, pending + list(TREE.tokens), n, positions, mask)

    for node in range(len(TREE)):
        chain = CONTEXT + [TREE.tokens[i] for i in _path(TREE, node)]
        expected = feed(window_step(model, audio), chain, 0)
        torch.testing.assert_close(hidden[0, 1 + node], expected[0, -1], atol=1e-5, rtol=1e-5)


@torch.no_grad()
def test_compacted_tree_cache_equals_a_fresh_cache_of_the_kept_path(model_and_audio):
    model, audio = model_and_audio
    step = window_step(model, audio)
    start = len(CONTEXT) - 1
    feed(step, CONTEXT[:-1], 0)
    positions, mask = TREE.layout(start, 1)
    feed(step, CONTEXT[-1:] + list(TREE.tokens), start, positions, mask)
    path = [1, 4]  # 1016, 13: the second branch
    step.compact([start] + [start + 1 + node for node in path], start)

    kept = CONTEXT + [TREE.tokens[i] for i in path]
    fresh = window_step(model, audio)
    n = len(kept)
    feed(fresh, kept, 0)
    torch.testing.assert_close(step.keys[..., :n, :], fresh.keys[..., :n, :], atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(step.values[..., :n, :], fresh.values[..., :n, :], atol=1e-5, rtol=1e-5)
