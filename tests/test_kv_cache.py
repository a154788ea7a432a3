"""The cache invariants: one verification pass equals token-by-token decoding, and a cache rolled
back (or compacted) after rejections equals a fresh cache fed only the accepted tokens."""

import pytest
import torch

from medusa_whisper import MedusaConfig
from medusa_whisper.step.decoder import chain_mask, decoder_hidden, new_cache, project
from medusa_whisper.drafting.base import Committed
from medusa_whisper.drafting.medusa import MedusaProposer
from medusa_whisper.step.cache import StaticKVCache

from helpers import random_model

TOKENS = [50257, 50362, 440, 1500, 286, 262, 3329, 318, 1016, 13, 383, 2068]


@pytest.fixture(scope="module")
def setup():
    model = random_model(MedusaConfig(num_heads=3, heads_type="block"))
    torch.manual_seed(1)
    audio = model.encoder(torch.randn(1, 80, 3000))
    return model, audio


def feed(model, cache, tokens, start=None):
    """Feed tokens as one chain at the cache's current length; returns post-LN states (1, n, d)."""
    start = cache.length if start is None else start
    n = len(tokens)
    positions = torch.arange(start, start + n)
    return decoder_hidden(model.decoder, torch.tensor([tokens]), positions, cache, start, chain_mask(start, n, "cpu"))


def commit_to_block(proposer, hidden, start):
    """Tell a Medusa-Block proposer that the tokens behind ``hidden`` were committed at ``start``."""
    proposer.commit(Committed(tokens=[0] * hidden.shape[1], hidden=hidden, position=start, next_token=0,
                              n_accepted=0, n_proposed=0))
    return proposer.head_input


@torch.no_grad()
def test_one_pass_over_a_chain_equals_one_token_at_a_time(setup):
    model, audio = setup
    batched = new_cache(model.decoder, audio)
    h_all = feed(model, batched, TOKENS[:4])
    batched.rollback(4)
    h_chain = feed(model, batched, TOKENS[4:])

    single = new_cache(model.decoder, audio)
    rows = []
    for i, token in enumerate(TOKENS):
        rows.append(feed(model, single, [token]))
        single.rollback(i + 1)
    h_single = torch.cat(rows, dim=1)

    torch.testing.assert_close(torch.cat([h_all, h_chain], 1), h_single, atol=1e-5, rtol=1e-5)
    logits_chain = project(model.decoder, h_chain)
    logits_single = project(model.decoder, h_single[:, 4:])
    torch.testing.assert_close(logits_chain, logits_single, atol=1e-4, rtol=1e-5)
    assert torch.equal(logits_chain.argmax(-1), logits_single.argmax(-1))


@torch.no_grad()
def test_medusa_block_sees_commits_in_pieces_as_one_token_at_a_time(setup):
    """The block proposer runs its block over what each pass committed: in chunks or one token at a
    time, its cache and its output at the last token are the same."""
    model, audio = setup
    cache = new_cache(model.decoder, audio)
    hidden = feed(model, cache, TOKENS)
    chunked = MedusaProposer(model.medusa, model.decoder, audio, num_heads=3)
    for lo, hi in [(0, 4), (4, 5), (5, len(TOKENS))]:
        out_chunked = commit_to_block(chunked, hidden[:, lo:hi], lo)
    single = MedusaProposer(model.medusa, model.decoder, audio, num_heads=3)
    for i in range(len(TOKENS)):
        out_single = commit_to_block(single, hidden[:, i : i + 1], i)
    n = len(TOKENS)
    assert chunked.block_cache.length == single.block_cache.length == n
    torch.testing.assert_close(chunked.block_cache.keys[:, :, :n], single.block_cache.keys[:, :, :n], atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(out_chunked, out_single, atol=1e-5, rtol=1e-5)
    assert len(chunked.propose()) == 3


@torch.no_grad()
def test_rolled_back_cache_equals_fresh_cache_of_accepted_tokens(setup):
    model, audio = setup
    accepted, rejected = TOKENS[:7], [9999, 8888, 7777]
    rolled = new_cache(model.decoder, audio)
    feed(model, rolled, accepted[:4])
    rolled.rollback(4)
    feed(model, rolled, accepted[4:] + rejected)  # speculated 3 tokens too many
    rolled.rollback(len(accepted))

    fresh = new_cache(model.decoder, audio)
    feed(model, fresh, accepted)
    fresh.rollback(len(accepted))

    n = len(accepted)
    a, b = rolled.self_attn, fresh.self_attn
    assert a.length == b.length == n
    torch.testing.assert_close(a.keys[:, :, :n], b.keys[:, :, :n], atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(a.values[:, :, :n], b.values[:, :, :n], atol=1e-5, rtol=1e-5)
    # and what follows is the same as well: stale slots beyond the length are never read
    torch.testing.assert_close(feed(model, rolled, [TOKENS[7]]), feed(model, fresh, [TOKENS[7]]), atol=1e-5, rtol=1e-5)


@torch.no_grad()
def test_compaction_keeps_scattered_accepted_slots():
    cache = StaticKVCache(n_layer=2, batch=1, n_ctx=16, n_state=4, dtype=torch.float32, device="cpu")
    cache.keys[:, :, :10] = torch.arange(10.0)[None, None, :, None]
    cache.values[:, :, :10] = -torch.arange(10.0)[None, None, :, None]
    cache.compact(keep=[5, 7, 9], start=5)  # a tree branch: slots 5, 7, 9 were accepted
    assert cache.length == 8
    assert cache.keys[0, 0, :8, 0].tolist() == [0, 1, 2, 3, 4, 5, 7, 9]
    assert cache.values[1, 0, :8, 0].tolist() == [0, -1, -2, -3, -4, -5, -7, -9]


def test_cache_refuses_to_overflow_or_roll_forward():
    cache = StaticKVCache(n_layer=1, batch=1, n_ctx=4, n_state=2, dtype=torch.float32, device="cpu")
    with pytest.raises(RuntimeError, match="overflow"):
        cache.write(0, 3, torch.zeros(1, 2, 2), torch.zeros(1, 2, 2))
    with pytest.raises(ValueError):
        cache.rollback(5)


def test_write_advances_the_length_and_rollback_only_shrinks_it():
    """The cache's one contract: a write's slots count at once (nobody sets the length after it),
    and rollback takes slots back but never adds unwritten ones."""
    cache = StaticKVCache(n_layer=2, batch=1, n_ctx=8, n_state=2, dtype=torch.float32, device="cpu")
    for layer in range(2):  # every layer of a pass writes the same slots
        cache.write(layer, 0, torch.ones(1, 3, 2), torch.ones(1, 3, 2))
    assert cache.length == 3
    cache.write(0, 3, torch.ones(1, 2, 2), torch.ones(1, 2, 2))
    assert cache.length == 5
    cache.rollback(4)
    assert cache.length == 4
    with pytest.raises(ValueError):
        cache.rollback(5)  # slot 4 was rejected: it may not count again
    with pytest.raises(ValueError):
        cache.write(0, 5, torch.ones(1, 1, 2), torch.ones(1, 1, 2))  # slot 4 would count unwritten
    cache.write(0, 2, torch.ones(1, 1, 2), torch.ones(1, 1, 2))  # rewriting a slot keeps what is before it
    assert cache.length == 3


def test_chain_mask_is_lower_right_causal():
    mask = chain_mask(start=3, n=3, device="cpu")
    assert mask.tolist() == [
        [True, True, True, True, False, False],
        [True, True, True, True, True, False],
        [True, True, True, True, True, True],
    ]
    assert chain_mask(start=5, n=1, device="cpu") is None
