"""best_of candidates and beams on the fixed-shape step (candidates._FixedRows) against the CPU's products.

On the CPU (``MEDUSA_WHISPER_STEP=fixed``) the fixed-shape candidates' passes are what CUDA graphs
capture, run eagerly: their logits must be the eager step's row for row, through beam search's
reordering, and whisper's DecodingTask on them must choose what it chooses on the eager step. The
pass must not read a tensor on the host (torch.compile's full-graph tracing checks). The CUDA test
compares the captured passes with the uncaptured ones; it skips where there is no GPU.
"""

import pytest
import torch
import whisper

import medusa_whisper
from medusa_whisper.decoding import loop
from medusa_whisper.audio.files import load_audio
from medusa_whisper.decoding.candidates import CandidatesInference
from medusa_whisper.decoding.window import decode

from conftest import DATA

JFK = DATA / "real" / "jfk.flac"


@pytest.fixture(scope="module")
def model():
    return medusa_whisper.load_model("tiny.en", device="cpu")


@pytest.fixture(scope="module")
def mel(model):
    audio = whisper.pad_or_trim(whisper.load_audio(str(JFK)))
    return whisper.log_mel_spectrogram(audio, model.dims.n_mels)


def decode_on(step: str, monkeypatch, model, mel, **options):
    monkeypatch.setenv(loop.STEP_ENV, step)
    torch.manual_seed(0)
    return decode(model, mel, fp16=False, language="en", **options)


def test_rows_get_the_eager_steps_logits_through_a_reordering(model, mel):
    """Five different sequences of one audio fed token by token, reordered half way as beam search
    does (one row dropped, one kept twice): each pass's logits, and the prompt pass's no-speech
    row, are those of the eager step."""
    generator = torch.Generator().manual_seed(0)
    initial = [50257, 50362]  # tiny.en's start of transcript, no timestamps
    tokens = torch.cat([torch.tensor([initial] * 5), torch.randint(0, 50256, (5, 12), generator=generator)], dim=1)
    features = model.embed_audio(mel[None]).repeat_interleave(5, dim=0)
    order = [1, 1, 0, 4, 3]

    def fed(inference):
        rows, outputs = tokens, []
        try:
            for end in range(len(initial), rows.shape[1] + 1):
                if end == 8:
                    rows = rows[order]
                    inference.rearrange_kv_cache(order)
                last, sot = inference.next_logits(rows[:, :end], features, 0 if end == len(initial) else None)
                outputs.append((last.clone(), sot))
        finally:
            inference.cleanup_caching()
        return outputs

    expected = fed(CandidatesInference(model, rows_per_audio=5, products="cpu"))
    fixed = CandidatesInference(model, rows_per_audio=5, products="fixed")
    got = fed(fixed)
    assert fixed.passes == len(expected)
    for (theirs, their_sot), (ours, our_sot) in zip(expected, got):
        torch.testing.assert_close(ours, theirs, rtol=1e-4, atol=2e-3)
        assert (our_sot is None) == (their_sot is None)
        if our_sot is not None:
            torch.testing.assert_close(our_sot, their_sot, rtol=1e-4, atol=2e-3)
    # without the reordering the rows' logits would differ from 8 on: the test can tell
    assert not torch.allclose(got[-1][0][0], got[-1][0][2], atol=1e-2)


@pytest.mark.parametrize("options", [dict(temperature=0.0, beam_size=5), dict(temperature=0.0, beam_size=4, patience=2.0),
                                     dict(temperature=1.0, best_of=3)],
                         ids=["beam5", "beam4-patience2", "sample-1.0-best3"])
def test_same_choice_as_on_the_eager_step(model, mel, options, monkeypatch):
    """whisper's DecodingTask on the fixed-shape step chooses what it chooses on the eager step: the
    same tokens, log-probability and no-speech probability (float32; sampling draws the same random
    numbers from the same seed, and a case seen to agree is kept, as in test_candidates)."""
    model.__dict__.pop("fixed_candidate_steps", None)
    eager = decode_on("eager", monkeypatch, model, mel, **options)
    assert "fixed_candidate_steps" not in model.__dict__  # the eager step decoded it
    fixed = decode_on("fixed", monkeypatch, model, mel, **options)
    assert len(model.__dict__["fixed_candidate_steps"]) == 1
    assert fixed.tokens == eager.tokens and len(fixed.tokens) > 10
    assert fixed.text == eager.text
    assert fixed.avg_logprob == pytest.approx(eager.avg_logprob, abs=1e-4)
    assert fixed.no_speech_prob == pytest.approx(eager.no_speech_prob, abs=1e-4)
    assert fixed.decoder_steps == eager.decoder_steps


def test_one_step_per_rows_count_kept_between_windows(model, mel, monkeypatch):
    model.__dict__.pop("fixed_candidate_steps", None)
    first = decode_on("fixed", monkeypatch, model, mel, temperature=0.0, beam_size=3)
    steps = model.__dict__["fixed_candidate_steps"]
    (key, rows), = steps.items()
    assert rows.step.batch == 3
    again = decode_on("fixed", monkeypatch, model, mel, temperature=0.0, beam_size=3)
    assert again.tokens == first.tokens and steps[key] is rows  # reused, not rebuilt
    # best_of 2: a step of two rows beside the beam's three
    pair = decode_on("fixed", monkeypatch, model, mel, temperature=0.5, best_of=2)
    assert sorted(r.step.batch for r in steps.values()) == [2, 3]
    assert len(pair.tokens) > 10


def test_the_fallback_of_transcribe_on_the_fixed_step(model, monkeypatch):
    """Every window falls back (a log-probability threshold nothing passes): transcribe's segments
    on the fixed step are those of the eager step, and its candidates ran there."""
    results = {}
    for step in ("eager", "fixed"):
        monkeypatch.setenv(loop.STEP_ENV, step)
        model.__dict__.pop("fixed_candidate_steps", None)
        torch.manual_seed(0)
        results[step] = medusa_whisper.transcribe(model, str(JFK), temperature=(0.0, 0.5, 1.0), logprob_threshold=0.0,
                                                  fp16=False, verbose=None, best_of=3)
    assert "fixed_candidate_steps" in model.__dict__
    segments = {step: [(s["text"], s["tokens"], s["temperature"]) for s in r["segments"]]
                for step, r in results.items()}
    assert segments["fixed"] == segments["eager"]
    assert all(t == 1.0 for _, _, t in segments["fixed"])


def test_an_int8_beam_of_one_is_int8_greedy_on_the_fixed_step(mel, monkeypatch):
    """A beam of one keeps the most likely token each step: on the fixed step, with the int8 model's
    weights as the step reads them, its tokens are the fixed step's greedy tokens."""
    int8 = medusa_whisper.load_model("tiny.en", device="cpu", compute_type="int8")
    greedy = decode_on("fixed", monkeypatch, int8, mel, mode="off")
    beam = decode_on("fixed", monkeypatch, int8, mel, beam_size=1)
    assert len(int8.__dict__["fixed_candidate_steps"]) == 1
    assert beam.tokens == greedy.tokens and len(beam.tokens) > 10
    assert beam.avg_logprob == pytest.approx(greedy.avg_logprob, abs=1e-4)


def test_a_pass_never_reads_the_device_on_the_host(model, mel):
    """torch.compile's full-graph tracing fails on .item(), .tolist(), a tensor's truth value or a
    shape that depends on data: what a CUDA graph cannot capture either."""
    inference = CandidatesInference(model, rows_per_audio=2, products="fixed")
    features = model.embed_audio(mel[None]).repeat_interleave(2, dim=0)
    tokens = torch.tensor([[50257, 50362]] * 2)
    inference.next_logits(tokens, features, 0)  # the prompt pass, uncaptured
    rows = inference.rows
    rows.tokens.fill_(440)
    rows.positions.fill_(2)
    torch._dynamo.reset()
    torch.compile(rows._pass, fullgraph=True, backend="eager")()
    assert rows.out.abs().sum() > 0

    def reads_the_host():
        rows._pass()
        if float(rows.out[0, 0]) > -1e9:
            rows.out.add_(1)
    torch._dynamo.reset()
    with pytest.raises(Exception):
        torch.compile(reads_the_host, fullgraph=True, backend="eager")()


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_captured_candidates_equal_the_uncaptured_ones(monkeypatch):
    """On CUDA each rows count's pass is a CUDA graph: a beam and sampled candidates give what the
    same passes give uncaptured (the fixed step compiled away: plain ``_pass`` calls)."""
    import os

    from medusa_whisper.decoding import candidates

    name = os.environ.get("MEDUSA_WHISPER_CUDA_TEST_MODEL", "tiny.en")
    cuda = medusa_whisper.load_model(name, device="cuda")
    audio = whisper.pad_or_trim(torch.from_numpy(load_audio(str(JFK))))  # soundfile: no ffmpeg there
    mel = whisper.log_mel_spectrogram(audio, cuda.dims.n_mels).cuda()
    results = {}
    for capture in (True, False):
        cuda.__dict__.pop("fixed_candidate_steps", None)
        if not capture:
            monkeypatch.setattr(candidates._FixedRows, "program", lambda self: self._pass)
        for options in (dict(temperature=0.0, beam_size=5), dict(temperature=0.8, best_of=5)):
            torch.manual_seed(0)
            results[capture, str(options)] = decode(cuda, mel, fp16=True, language="en", **options)
        if capture:
            assert all(r.graphs for r in cuda.__dict__["fixed_candidate_steps"].values())
    for key, captured in results.items():
        if key[0]:
            assert captured.tokens == results[False, key[1]].tokens
