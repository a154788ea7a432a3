"""Loading and transcribing inside ``torch.inference_mode()`` and ``torch.no_grad()``, as users wrap it.

Inference tensors keep no version counter, so anything that reads one (the cached transposed
embedding did) fails there; whisper's own load_model and transcribe work, and so must ours.
"""

import contextlib
from pathlib import Path

import pytest
import torch
import whisper

import medusa_whisper
from medusa_whisper.step.projection import project

JFK = Path(__file__).parent / "data" / "real" / "jfk.flac"
CONTEXTS = {"inference_mode": torch.inference_mode, "no_grad": torch.no_grad, "none": contextlib.nullcontext}


@pytest.fixture(scope="module")
def reference():
    """whisper.transcribe's text on the same weights, outside any context."""
    model = medusa_whisper.load_model("tiny.en", device="cpu")
    return whisper.transcribe(model, str(JFK), fp16=False, verbose=None)["text"]


@pytest.mark.parametrize("context, name", [("inference_mode", "tiny.en-medusa-block"), ("no_grad", "tiny.en")])
def test_load_and_transcribe_inside_the_context(context, name, reference):
    with CONTEXTS[context]():
        model = medusa_whisper.load_model(name, device="cpu")
        result = model.transcribe(str(JFK), fp16=False)
    assert result["text"] == reference
    assert result["medusa"]["decoder_steps"] > 0
    if context == "inference_mode":  # a model loaded inside it still works after it, as whisper's does
        assert model.transcribe(str(JFK), fp16=False, word_timestamps=True)["text"] == reference


@pytest.mark.parametrize("route", ["x@W.T", "W@x.T"])
def test_weights_loaded_in_inference_mode_are_not_served_stale(monkeypatch, route):
    """Inference tensors have no version counter: a state dict loaded into the model (copy_, in place,
    same storage) must still renew the projection's prepared copies, on either route."""
    from medusa_whisper.step import projection

    monkeypatch.setattr(projection, "route_for", lambda kind, weight, n: route)
    with torch.inference_mode():
        model = medusa_whisper.load_model("tiny.en", device="cpu")
        states = torch.randn(1, 3, model.dims.n_text_state)
        before = project(model.decoder, states)
        doubled = {k: 2.0 * v if k == "decoder.token_embedding.weight" else v for k, v in model.state_dict().items()}
        model.load_state_dict(doubled)
        after = project(model.decoder, states)
    torch.testing.assert_close(after, 2.0 * before)
