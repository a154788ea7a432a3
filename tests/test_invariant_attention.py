"""The int8 decoder's attention: a row's numbers do not depend on its company, and they are attention's."""

import pytest
import torch
import torch.nn.functional as F

import medusa_whisper
from medusa_whisper.step.compute import apply_compute_type, invariant_dtype
from medusa_whisper.step.attention import (INVARIANT_DTYPE, MAX_ROWS, SLOT_STEP, attended_slots, chain_mask,
                                           invariant_attention, product_rows, rows_are_invariant, slot_step)
from medusa_whisper.step.fixed import every_slot
from medusa_whisper.step.projection import project

from helpers import feed, window_step


def every_slot_mask(mask, start, n, n_key):
    """A pass's (n, start + n) mask widened to n_key slots, (n, n_key), as the step widens it."""
    return every_slot(mask, start, n, n_key, "cpu")[0]

# the int8 decoder's dtype for it on this CPU (bfloat16 where native); float32 for the function alone
HERE = invariant_dtype() or torch.float32
holds_here = pytest.mark.skipif(
    invariant_dtype() is None or not rows_are_invariant(HERE, 8, 64, 448, 1500, torch.get_num_threads()),
    reason="the int8 decoder does not use invariant attention on this CPU (no native bfloat16, or not invariant)")


def test_it_is_attention():
    """Against float32 SDPA over exactly the visible keys, to bfloat16's precision, masks and all."""
    torch.manual_seed(0)
    n_head, d_head, n_key, n = 8, 64, 448, 5
    q = torch.randn(1, n, n_head * d_head)
    k, v = torch.randn(1, n_head, n_key, d_head), torch.randn(1, n_head, n_key, d_head)
    start = 40
    allowed = every_slot_mask(chain_mask(start, n, "cpu"), start, n, n_key)
    assert allowed.shape == (n, n_key) and allowed.sum(1).tolist() == [41, 42, 43, 44, 45]
    ours = invariant_attention(q, k.to(INVARIANT_DTYPE), v.to(INVARIANT_DTYPE), n_head, allowed)
    qh = q.view(1, n, n_head, d_head).transpose(1, 2)
    reference = F.scaled_dot_product_attention(qh, k, v, attn_mask=allowed).transpose(1, 2).reshape(1, n, -1)
    assert (ours - reference).abs().max() < 0.05 * reference.abs().max()
    # a single query over the cross-attention keys (no mask), and one row given as a 1-row mask
    one = invariant_attention(q[:, :1], k.to(INVARIANT_DTYPE), v.to(INVARIANT_DTYPE), n_head, None)
    ref_one = F.scaled_dot_product_attention(qh[:, :, :1], k, v).transpose(1, 2).reshape(1, 1, -1)
    assert (one - ref_one).abs().max() < 0.05 * ref_one.abs().max()
    single = every_slot_mask(None, 9, 1, n_key)
    assert single.sum().item() == 10 and bool(single[0, :10].all())


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
def test_more_rows_than_one_product_are_split(dtype):
    torch.manual_seed(1)
    k = torch.randn(1, 2, 300, 64).to(dtype)
    v = torch.randn(1, 2, 300, 64).to(dtype)
    chunk = product_rows(dtype, 2, 64, 300)
    assert 0 <= chunk <= MAX_ROWS
    n = max(chunk, 2) + 3
    q = torch.randn(1, n, 128)
    whole = invariant_attention(q, k, v, 2, None)
    assert whole.shape == (1, n, 128)
    if chunk >= 2:  # the rows after the first product are the same product on their own
        assert torch.equal(whole[:, chunk:], invariant_attention(q[:, chunk:], k, v, 2, None))


def test_streams_side_by_side_get_what_they_get_alone():
    """Batch items (different audio, different positions) through one call, against each alone."""
    torch.manual_seed(4)
    n_head, d_head, n_key = 8, 64, 448
    q = torch.randn(3, 1, n_head * d_head)
    k, v = torch.randn(3, n_head, n_key, d_head).to(HERE), torch.randn(3, n_head, n_key, d_head).to(HERE)
    allowed = torch.zeros(3, 1, n_key, dtype=torch.bool)
    for b, seen in enumerate((1, 70, 300)):
        allowed[b, 0, :seen] = True
    together = invariant_attention(q, k, v, n_head, allowed)
    for b in range(3):
        alone = invariant_attention(q[b:b + 1], k[b:b + 1], v[b:b + 1], n_head, allowed[b])
        assert torch.allclose(together[b:b + 1], alone, atol=1e-2)  # the same attention
    if rows_are_invariant(HERE, n_head, d_head, n_key, 1500, torch.get_num_threads()):
        for b in range(3):
            alone = invariant_attention(q[b:b + 1], k[b:b + 1], v[b:b + 1], n_head, allowed[b])
            assert torch.equal(together[b:b + 1], alone), f"stream {b}"


@holds_here
def test_the_probe_holds_on_this_cpu_and_the_int8_decoder_uses_it():
    model = apply_compute_type(medusa_whisper.load_model("tiny.en", device="cpu"), "int8")
    assert all(b.attn.row_invariant and b.cross_attn.row_invariant for b in model.decoder.blocks)
    step = window_step(model, torch.zeros(1, 1500, model.dims.n_audio_state))
    assert step.keys.dtype == HERE and step.cross_keys[0].dtype == HERE


@holds_here
def test_a_verified_row_gets_the_logits_it_gets_alone():
    """The whole int8 decoder pass, bit for bit: rows verified together (a chain of 7, then a tree
    whose rows see only their ancestors) against the same tokens fed one pass each."""
    model = apply_compute_type(medusa_whisper.load_model("tiny.en", device="cpu"), "int8")
    decoder = model.decoder
    torch.manual_seed(2)
    features = model.encoder(torch.randn(1, 80, 3000))
    # a prompt of 12, then 7 rows: alone, the rows attend over 16 slots, then 32 (attended_slots)
    prompt = torch.tensor([[50257, 50362, 440, 2068, 7586, 13, 383, 1110, 318, 257, 1332, 13]])
    new = torch.tensor([[21831, 18045, 625, 262, 16931, 3290, 13]])
    tokens = torch.cat([prompt, new], dim=1)[0].tolist()
    alone_step = window_step(model, features)
    alone = [project(decoder, feed(alone_step, [token], i)) for i, token in enumerate(tokens)]
    together_step = window_step(model, features)
    n0, n = prompt.shape[1], new.shape[1]
    feed(together_step, tokens[:n0], 0)
    together = project(decoder, feed(together_step, tokens[n0:], n0))
    for i in range(n):
        assert torch.equal(together[:, i], alone[n0 + i][:, 0]), f"row {i}"
    # a tree: rows 0 and 1 are two alternatives for position n0, row 2 follows row 1
    tree_step = window_step(model, features)
    feed(tree_step, tokens[:n0], 0)
    rows = [999, tokens[n0], tokens[n0 + 1]]
    mask = torch.zeros(3, n0 + 3, dtype=torch.bool)
    mask[:, :n0] = True
    mask[0, n0] = mask[1, n0 + 1] = mask[2, n0 + 1] = mask[2, n0 + 2] = True
    tree = project(decoder, feed(tree_step, rows, n0, torch.tensor([n0, n0, n0 + 1]), mask))
    assert torch.equal(tree[:, 1], alone[n0][:, 0]) and torch.equal(tree[:, 2], alone[n0 + 1][:, 0])


def test_bfloat16_cross_keys_are_centred_so_scores_keep_their_precision():
    """Keys with a large common part (as whisper's have, from a common part of the audio features)
    give large scores, which bfloat16 rounds relative to their size; CrossKV makes keys it stores in
    bfloat16 from centred features, which softmax does not see."""
    from types import SimpleNamespace

    from medusa_whisper.step.cache import CrossKV

    torch.manual_seed(3)
    n_head, d_head, n_audio = 8, 64, 1500
    n_state = n_head * d_head
    features = torch.randn(1, n_audio, n_state) + 20 * torch.randn(n_state)  # a common part of every position
    key = torch.nn.Linear(n_state, n_state, bias=False)
    value = torch.nn.Linear(n_state, n_state)
    attn = SimpleNamespace(key=key, value=value, n_head=n_head)
    blocks = [SimpleNamespace(cross_attn=attn)]
    with torch.no_grad():
        exact = CrossKV(blocks, features)  # float32
        stored = CrossKV(blocks, features, INVARIANT_DTYPE)
        q = torch.randn(1, n_head, 2, d_head) * d_head ** -0.5

        def weights(keys):  # each query's attention weights over the positions, in float32
            return (q @ keys.float().transpose(-1, -2)).softmax(-1)
        reference = weights(exact.keys[0])
        ours, raw = weights(stored.keys[0]), weights(exact.keys[0].to(INVARIANT_DTYPE))
    assert torch.allclose(stored.keys[0].float().mean(dim=2), torch.zeros(1, n_head, d_head), atol=0.05)
    error, raw_error = (ours - reference).abs().sum(-1).mean(), (raw - reference).abs().sum(-1).mean()
    assert error < raw_error / 2, (error, raw_error)


@holds_here
def test_self_attention_over_the_written_slots_rounded_up_gets_the_bits_of_every_slot(monkeypatch):
    """The int8 decoder's steps attend over the cache's first ``attended_slots`` slots, not all 448:
    a pass gives the same logits as one over every slot, and the slots follow the pass's end."""
    import medusa_whisper.step.cpu as cpu_module

    capacity = 448
    step = slot_step(HERE, 6, 64, capacity)
    assert step in (SLOT_STEP, capacity)
    if step == SLOT_STEP:
        assert [attended_slots(end, capacity, HERE, 6, 64) for end in (1, 16, 17, 440, 448)] == [16, 16, 32, 448, 448]
    model = apply_compute_type(medusa_whisper.load_model("tiny.en", device="cpu"), "int8")
    decoder = model.decoder
    torch.manual_seed(5)
    features = model.encoder(torch.randn(1, 80, 3000))
    tokens = torch.randint(0, 50000, (1, 40))

    def logits():  # a prompt of 30, then one row at a time to 40
        step = window_step(model, features)
        feed(step, tokens[0, :30].tolist(), 0)
        return torch.cat([project(decoder, feed(step, [tokens[0, i]], i))
                          for i in range(30, 40)], dim=1)
    rounded = logits()
    monkeypatch.setattr(cpu_module, "attended_slots", lambda end, capacity, *shape: capacity)
    assert torch.equal(rounded, logits())


@pytest.mark.parametrize("rows", [2, 3])
def test_the_slot_probe_runs_where_a_product_takes_only_two_rows(monkeypatch, rows):
    """slot_step's probe multiplies at most ``product_rows`` rows: where this CPU allows only two per
    product (float32 on some CPUs), it measures with two, and its answer is one of its two."""
    import medusa_whisper.step.attention as attention

    monkeypatch.setattr(attention, "product_rows", lambda *shape: rows)
    step = attention._slot_step.__wrapped__(torch.float32, 4, 16, 64, 1)
    assert step in (SLOT_STEP, 64)
