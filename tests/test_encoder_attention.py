"""The encoder's attention in bfloat16 (step/encoder_attention.py): whisper's attention within bfloat16's
rounding, whisper's own where it must be, chosen once per machine, set on a converted encoder only."""

import json

import pytest
import torch
from whisper.model import MultiHeadAttention

from medusa_whisper import MedusaConfig
from medusa_whisper.step import compute, encoder_attention
from medusa_whisper.step.compute import apply_compute_type
from medusa_whisper.step.encoder_attention import attend_in, bfloat16_attention

from helpers import random_model


def bfloat16_inputs(n_head=4, n_ctx=96, d_head=16):
    """Queries, keys and values as a bfloat16 encoder linear gives them: bfloat16 values in float32."""
    torch.manual_seed(0)
    return [torch.randn(2, n_ctx, n_head * d_head).to(torch.bfloat16).float() for _ in range(3)]


def test_it_is_whispers_attention_within_bfloat16s_rounding():
    attn = MultiHeadAttention(64, 4)
    q, k, v = bfloat16_inputs()
    ours, weights = bfloat16_attention(attn, q, k, v)
    whispers, _ = MultiHeadAttention.qkv_attention(attn, q, k, v)
    assert weights is None and ours.dtype == torch.float32 and ours.shape == whispers.shape
    assert not torch.equal(ours, whispers)  # it did run in bfloat16
    assert (ours - whispers).norm() / whispers.norm() < 0.01


def test_whispers_own_where_it_wants_the_weights_or_gives_a_mask():
    attn = MultiHeadAttention(64, 4)
    q, k, v = bfloat16_inputs()
    mask = torch.full((96, 96), float("-inf")).triu_(1)
    assert torch.equal(bfloat16_attention(attn, q, k, v, mask)[0], MultiHeadAttention.qkv_attention(attn, q, k, v, mask)[0])
    with torch.no_grad(), pytest.MonkeyPatch.context() as patch:
        patch.setattr(MultiHeadAttention, "use_sdpa", False)
        ours, weights = bfloat16_attention(attn, q, k, v)
        whispers, whisper_weights = MultiHeadAttention.qkv_attention(attn, q, k, v)
    assert torch.equal(ours, whispers) and torch.equal(weights, whisper_weights)


@pytest.mark.parametrize("chosen", [torch.bfloat16, torch.float32])
def test_a_converted_encoder_attends_as_chosen_and_nothing_else_changes(monkeypatch, chosen):
    monkeypatch.setattr(compute, "int8_encoder_form", lambda dims: "bfloat16")
    monkeypatch.setattr(compute, "attention_dtype", lambda *shape: chosen)
    model = apply_compute_type(random_model(MedusaConfig(num_heads=1)), "int8")
    encoder_modules = [m for m in model.encoder.modules() if isinstance(m, MultiHeadAttention)]
    assert encoder_modules and all(("qkv_attention" in m.__dict__) == (chosen == torch.bfloat16)
                                   for m in encoder_modules)
    assert not any("qkv_attention" in m.__dict__ for m in model.decoder.modules() if isinstance(m, MultiHeadAttention))
    assert MultiHeadAttention.qkv_attention.__qualname__ == "MultiHeadAttention.qkv_attention"  # whisper's class as it was
    mel = torch.randn(1, model.dims.n_mels, 2 * model.dims.n_audio_ctx)
    with torch.inference_mode():
        set_as_chosen = model.encoder(mel)
        attend_in(model.encoder, torch.float32)
        assert not any("qkv_attention" in m.__dict__ for m in encoder_modules)
        whispers = model.encoder(mel)
    assert torch.equal(set_as_chosen, whispers) == (chosen == torch.float32)
    assert (set_as_chosen - whispers).norm() / whispers.norm() < 0.02


@pytest.mark.parametrize("form", ["int8 rows", "float32"])
def test_a_float32_model_and_an_encoder_not_in_bfloat16_keep_whispers_attention(monkeypatch, form):
    monkeypatch.setattr(compute, "attention_dtype", lambda *shape: pytest.fail("no choice to make"))
    monkeypatch.setattr(compute, "int8_encoder_form", lambda dims: form)
    model = apply_compute_type(random_model(MedusaConfig(num_heads=1)), "int8")
    assert model.encoder_form == form
    assert not any("qkv_attention" in m.__dict__ for m in model.modules())
    model = apply_compute_type(random_model(MedusaConfig(num_heads=1)), "float32")
    assert not any("qkv_attention" in m.__dict__ for m in model.modules())


def test_the_choice_is_timed_once_per_machine(monkeypatch, unpinned):
    tmp_path = unpinned
    encoder_attention._attention_dtype.cache_clear()
    chosen = encoder_attention.attention_dtype(2, 64, 16)
    assert chosen in (torch.bfloat16, torch.float32)
    saved = json.loads(next((tmp_path / "routes").glob("*.json")).read_text())["choices"]
    assert saved["encoder attention 2x64x16"]["route"] == str(chosen).split(".")[-1]
    encoder_attention._attention_dtype.cache_clear()
    monkeypatch.setattr(encoder_attention, "median_micros", lambda fn: pytest.fail("timed again"))
    assert encoder_attention.attention_dtype(2, 64, 16) == chosen
    encoder_attention._attention_dtype.cache_clear()


def test_a_model_attending_in_bfloat16_copies_and_pickles(monkeypatch):
    import copy
    import pickle

    monkeypatch.setattr(compute, "int8_encoder_form", lambda dims: "bfloat16")
    monkeypatch.setattr(compute, "attention_dtype", lambda *shape: torch.bfloat16)
    model = apply_compute_type(random_model(MedusaConfig(num_heads=1)), "int8")
    mel = torch.randn(1, model.dims.n_mels, 2 * model.dims.n_audio_ctx)
    with torch.inference_mode():
        expected = model.encoder(mel)
        for other in (copy.deepcopy(model.encoder), pickle.loads(pickle.dumps(model.encoder))):
            attn = other.blocks[0].attn
            assert attn.qkv_attention.args[0] is attn  # its own module, not the original's
            assert torch.equal(other(mel), expected)
