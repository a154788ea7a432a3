"""The window's encoder pass (decoding/encoder_graph.py): whisper's own call off CUDA, and on CUDA
a captured graph that gives the eager encoder's features bit for bit."""

import pytest
import torch
from whisper.decoding import DecodingOptions, DecodingTask

from medusa_whisper import MedusaConfig
from medusa_whisper.decoding import encoder_graph, loop

from helpers import random_model


def features_of(model, mel, fp16):
    return encoder_graph.audio_features(DecodingTask(model, DecodingOptions(language="en", fp16=fp16)), mel)


@pytest.mark.parametrize("step", ["auto", "fixed"])
def test_off_cuda_the_features_are_whispers_own(monkeypatch, step):
    monkeypatch.setenv(loop.STEP_ENV, step)
    model = random_model(MedusaConfig())
    torch.manual_seed(0)
    mel = torch.randn(1, model.dims.n_mels, 2 * model.dims.n_audio_ctx)
    with torch.no_grad():
        assert torch.equal(features_of(model, mel, False), model.encoder(mel))
        features = model.encoder(mel)
        assert features_of(model, features, False) is features  # already features: passed through, as whisper does
    assert "encoder_graphs" not in model.__dict__  # nothing captured


@pytest.mark.skipif(not torch.cuda.is_available(), reason="CUDA graphs need a CUDA device")
@pytest.mark.parametrize("fp16", [True, False])
def test_the_captured_encoder_equals_the_eager_encoder_on_cuda(monkeypatch, fp16):
    """float32 weights, the input float16 or not, as whisper runs them (its layers cast)."""
    monkeypatch.setenv(loop.STEP_ENV, "auto")
    model = random_model(MedusaConfig()).to("cuda")
    dtype = torch.float16 if fp16 else torch.float32
    torch.manual_seed(0)
    mels = [torch.randn(1, model.dims.n_mels, 2 * model.dims.n_audio_ctx, device="cuda") for _ in range(3)]
    with torch.no_grad():
        eager = [model.encoder(m.to(dtype)) for m in mels]
        captured = [features_of(model, m, fp16) for m in mels]  # one graph, replayed for each window
    assert len(model.encoder_graphs) == 1
    for got, want in zip(captured, eager):
        assert got.dtype == dtype and torch.equal(got, want)
    assert captured[0].data_ptr() != captured[1].data_ptr()  # each window's features are its own
    monkeypatch.setenv(loop.STEP_ENV, "eager")  # the eager step: whisper's own call, nothing captured
    with torch.no_grad():
        assert torch.equal(features_of(model, mels[0], fp16), eager[0])
