"""A CPU pass's layers in one native call (step/native_decoder.py, native/decoder.cpp).

It must compute what the layers called one by one compute (up to its own norms' and GELU's
rounding), give a row the same bits on every instruction set, keep a row's bits its own beside
other batch items (streams at their own positions, and candidates sharing one audio), and never
run where a pass's rows are computed together or where some product is not the package's.
(A chain's and a tree's rows against one row at a time: test_cpu_step.py, which runs this path.)
"""

import pytest
import torch

import medusa_whisper
from medusa_whisper.step import compute, native
from medusa_whisper.step.cpu import cpu_step
from medusa_whisper.step.native_decoder import NativeDecoder
from medusa_whisper.step.together import rows_together

from helpers import feed

pytestmark = pytest.mark.skipif(not native.available(), reason="the package's kernels are not built here")

PROMPT = [50257, 50362, 440, 2068, 7586, 21831]  # tiny.en's start of transcript, then text


@pytest.fixture
def native_int8_rows(monkeypatch):
    """Every int8 linear's few rows on the package's kernel, whatever the replayed kind chose."""
    monkeypatch.setattr(compute, "_few_rows_kernel", lambda n_out, n_in, threads: "native")


def model_of(compute_type):
    return medusa_whisper.load_model("tiny.en", device="cpu", compute_type=compute_type)


def one_call_here(compute_type):
    """Skip where this CPU runs the compute type's layers one by one: int8 without native bfloat16
    products attends by PyTorch's kernel (``compute.invariant_dtype``), which the one call does not."""
    if compute_type == "int8" and compute.invariant_dtype() is None:
        pytest.skip("int8 attends by PyTorch's kernel on this CPU: its layers are called one by one")


def audio(model, seed=0):
    generator = torch.Generator().manual_seed(seed)
    return torch.randn(1, model.dims.n_audio_ctx, model.dims.n_audio_state, generator=generator)


def prompted(model, features, n=len(PROMPT), step=None):
    """A step (``model``'s new one, or ``step``) over the window ``features`` after n tokens of PROMPT."""
    step = step or cpu_step(model)
    step.set_audio(features)
    with rows_together():
        feed(step, PROMPT[:n], 0)
    return step


@pytest.mark.parametrize("compute_type", ["int8", "float32"])
def test_one_call_computes_the_layers_called_one_by_one(compute_type, native_int8_rows):
    one_call_here(compute_type)
    model = model_of(compute_type)
    features = audio(model)
    with torch.no_grad():
        ours, theirs = prompted(model, features), prompted(model, features)
        assert ours.products.native is not None
        theirs.products.native = None
        rows = [262, 1110, 286]
        a, b = feed(ours, rows, len(PROMPT)), feed(theirs, rows, len(PROMPT))
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-4)
        assert not torch.equal(a, b)  # the two paths are not one
        assert torch.equal(ours.logits(a).argmax(-1), theirs.logits(b).argmax(-1))
        # the caches hold the same keys and values (the rows' own; bfloat16's rounding apart)
        end = len(PROMPT) + len(rows)
        tolerance = dict(rtol=1e-2, atol=1e-2) if ours.keys.dtype == torch.bfloat16 else dict(rtol=1e-5, atol=1e-4)
        torch.testing.assert_close(ours.keys[..., :end, :].float(), theirs.keys[..., :end, :].float(), **tolerance)
        torch.testing.assert_close(ours.values[..., :end, :].float(), theirs.values[..., :end, :].float(), **tolerance)


@pytest.mark.parametrize("compute_type", ["int8", "float32"])
def test_one_call_gives_the_same_bits_on_every_instruction_set(compute_type, native_int8_rows):
    one_call_here(compute_type)
    kernels = native.kernels()
    model = model_of(compute_type)
    features = audio(model)
    best = kernels.isa()
    results = {}
    try:
        for isa in kernels.isas():
            kernels.set_isa(isa)
            with torch.no_grad():
                results[isa] = feed(prompted(model, features), [262, 1110, 286], len(PROMPT))
    finally:
        kernels.set_isa(best)
    assert len(results) >= 2
    for isa, states in results.items():
        assert torch.equal(states, results[best]), isa


@pytest.mark.parametrize("compute_type", ["int8", "float32"])
def test_a_stream_gets_its_bits_alone_beside_others_and_candidates_share_their_audio(compute_type, native_int8_rows):
    one_call_here(compute_type)
    model = model_of(compute_type)
    with torch.no_grad():
        windows = [audio(model, seed) for seed in (1, 2)]
        batch = cpu_step(model, 3)
        lengths = [3, 6, 4]
        for item, (n, features) in enumerate(zip(lengths, [windows[0], windows[1], windows[0]])):
            batch.set_audio(features, item)
            with rows_together():
                batch.prompt(torch.tensor([PROMPT[:n]]), item)
        new = torch.tensor([262, 1110, 286])
        rows = batch.rows(new, torch.tensor(lengths), 0, 3)
        for item, (n, features) in enumerate(zip(lengths, [windows[0], windows[1], windows[0]])):
            assert torch.equal(rows[item], feed(prompted(model, features, n), [new[item]], n)[0, 0]), item
        # two candidates of one window: one audio's keys and values, read for both; their prompts
        # too are rows of the one call here (computed together, a prompt's rows round by their company)
        pair = cpu_step(model, 2)
        pair.set_audio(windows[1], repeat=2)
        assert pair.cross_keys[0].shape[0] == 1
        pair.forward(torch.tensor([PROMPT, PROMPT]), torch.arange(len(PROMPT)).repeat(2, 1))
        at = len(PROMPT)
        states = pair.forward(torch.tensor([[262], [1110]]), torch.tensor([[at], [at]]))
        for item, token in enumerate((262, 1110)):
            alone = cpu_step(model)
            alone.set_audio(windows[1])
            feed(alone, PROMPT, 0)
            assert torch.equal(states[item, 0], feed(alone, [token], at)[0, 0]), item
        assert not torch.equal(states[0], states[1])


def test_a_prompt_and_a_model_off_the_kernels_take_the_layers_one_by_one(native_int8_rows, monkeypatch):
    model = model_of("float32")
    step = cpu_step(model)
    step.set_audio(audio(model))

    def refused(*args, **kwargs):
        raise AssertionError("a prompt's rows went through the one call")
    monkeypatch.setattr(step.products.native, "_kernel", type("Refuse", (), {"forward": staticmethod(refused)}))
    with torch.no_grad(), rows_together():
        feed(step, PROMPT, 0)
    # no build, or an int8 linear whose few rows take another kernel: no one call
    monkeypatch.setattr(native, "available", lambda: False)
    assert NativeDecoder.of(model, torch.float32) is None
    monkeypatch.undo()
    int8 = model_of("int8")
    monkeypatch.setattr(compute, "_few_rows_kernel", lambda n_out, n_in, threads: "weight_only")
    assert NativeDecoder.of(int8, torch.float32) is None
    if compute.invariant_dtype() is not None:
        monkeypatch.setattr(compute, "_few_rows_kernel", lambda n_out, n_in, threads: "native")
        assert NativeDecoder.of(int8, torch.float32) is not None


@pytest.mark.parametrize("compute_type", ["int8", "float32"])
def test_weights_loaded_after_the_call_was_made_are_the_ones_multiplied(compute_type, native_int8_rows):
    one_call_here(compute_type)
    model = model_of(compute_type)
    features = audio(model)
    with torch.no_grad():
        step = prompted(model, features)
        before = feed(step, [262], len(PROMPT))
        state = model.state_dict()
        generator = torch.Generator().manual_seed(3)
        for name, tensor in state.items():  # every decoder weight changed, in place, as a checkpoint loads
            if name.startswith("decoder.blocks.") and tensor.dtype in (torch.int8, torch.float32):
                noise = torch.randint(-3, 4, tensor.shape, generator=generator)
                state[name] = (tensor + noise).clamp(-127, 127) if tensor.dtype == torch.int8 else tensor * 1.1
        model.load_state_dict(state)
        prompted(model, features, step=step)  # the window again: cross-attention and prompt by the new weights
        after = feed(step, [262], len(PROMPT))
        fresh = feed(prompted(model, features), [262], len(PROMPT))
    assert not torch.equal(before, after)
    assert torch.equal(after, fresh)


def test_a_model_that_decoded_on_the_one_call_still_pickles_and_copies(native_int8_rows):
    import copy
    import pickle

    model = model_of("float32")
    step = prompted(model, audio(model))
    assert step.products.native is not None
    copied = copy.deepcopy(model)
    again = pickle.loads(pickle.dumps(model))
    for other in (copied, again):  # their hooks do nothing; a load into them leaves this call as it was
        other.load_state_dict(model.state_dict())
    assert not step.products.native._stale
    model.load_state_dict(model.state_dict())
    assert step.products.native._stale
