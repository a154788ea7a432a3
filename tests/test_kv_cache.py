"""The cache invariants: one verification pass equals token-by-token decoding, and a cache rolled
back (or compacted) after rejections equals a fresh cache fed only the accepted tokens."""

import pytest
import torch

from medusa_whisper import MedusaConfig
from medusa_whisper.decoder import chain_mask, decoder_hidden, medusa_block_hidden, new_cache, project
from medusa_whisper.kv_cache import StaticKVCache

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
    mask = chain_mask(start, n, "cpu")
    hidden = decoder_hidden(model.decoder, torch.tensor([tokens]), positions, cache, start, mask)
    block = medusa_block_hidden(model.medusa, hidden, cache, start, mask) if cache.block_self_attn else None
    return hidden, block


@torch.no_grad()
def test_one_pass_over_a_chain_equals_one_token_at_a_time(setup):
    model, audio = setup
    batched = new_cache(model.decoder, model.medusa, audio)
    h_all, b_all = feed(model, batched, TOKENS[:4])
    batched.rollback(4)
    h_chain, b_chain = feed(model, batched, TOKENS[4:])

    single = new_cache(model.decoder, model.medusa, audio)
    rows, block_rows = [], []
    for i, token in enumerate(TOKENS):
        h, b = feed(model, single, [token])
        single.rollback(i + 1)
        rows.append(h)
        block_rows.append(b)
    h_single = torch.cat(rows, dim=1)
    b_single = torch.cat(block_rows, dim=1)

    torch.testing.assert_close(torch.cat([h_all, h_chain], 1), h_single, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(torch.cat([b_all, b_chain], 1), b_single, atol=1e-5, rtol=1e-5)
    logits_chain = project(model.decoder, h_chain)
    logits_single = project(model.decoder, h_single[:, 4:])
    torch.testing.assert_close(logits_chain, logits_single, atol=1e-4, rtol=1e-5)
    assert torch.equal(logits_chain.argmax(-1), logits_single.argmax(-1))


@torch.no_grad()
def test_rolled_back_cache_equals_fresh_cache_of_accepted_tokens(setup):
    model, audio = setup
    accepted, rejected = TOKENS[:7], [9999, 8888, 7777]
    rolled = new_cache(model.decoder, model.medusa, audio)
    feed(model, rolled, accepted[:4])
    rolled.rollback(4)
    feed(model, rolled, accepted[4:] + rejected)  # speculated 3 tokens too many
    rolled.rollback(len(accepted))

    fresh = new_cache(model.decoder, model.medusa, audio)
    feed(model, fresh, accepted)
    fresh.rollback(len(accepted))

    n = len(accepted)
    for a, b in [(rolled.self_attn, fresh.self_attn), (rolled.block_self_attn, fresh.block_self_attn)]:
        assert a.length == b.length == n
        torch.testing.assert_close(a.keys[:, :, :n], b.keys[:, :, :n], atol=1e-5, rtol=1e-5)
        torch.testing.assert_close(a.values[:, :, :n], b.values[:, :, :n], atol=1e-5, rtol=1e-5)
    # and what follows is the same as well: stale slots beyond the length are never read
    h_rolled, _ = feed(model, rolled, [TOKENS[7]])
    h_fresh, _ = feed(model, fresh, [TOKENS[7]])
    torch.testing.assert_close(h_rolled, h_fresh, atol=1e-5, rtol=1e-5)


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


def test_chain_mask_is_lower_right_causal():
    mask = chain_mask(start=3, n=3, device="cpu")
    assert mask.tolist() == [
        [True, True, True, True, False, False],
        [True, True, True, True, True, False],
        [True, True, True, True, True, True],
    ]
    assert chain_mask(start=5, n=1, device="cpu") is None
