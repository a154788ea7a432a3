"""Windows side by side on the fixed-shape step (decoding/batches.py) get what each gets decoded alone.

On the CPU the batch's pass runs uncaptured (on CUDA it is one CUDA graph); its tokens must be each
window's own greedy tokens, with items refilled as streams end at different steps, prompts of
different lengths side by side (each item's rules start sampling at its own place), and a window
whose rules differ from the batch's decoded alone.
"""

import pytest
import torch
import whisper

import medusa_whisper
from medusa_whisper.decoding import loop
from medusa_whisper.audio.files import load_audio
from medusa_whisper.decoding.window import decode
from medusa_whisper.decoding.batches import BatchDecoder, batch_decoder
from medusa_whisper.options import MedusaDecodingOptions
from medusa_whisper.step.fixed import FixedStep

CLIPS = ["tests/data/real/jfk.flac", "tests/data/espeak_weather.flac", "tests/data/flite_recipe.flac",
         "tests/data/espeak_meeting.flac", "tests/data/flite_train.flac"]


@pytest.fixture(scope="module")
def mels():
    # read by soundfile, not whisper's ffmpeg: the CUDA machine has no ffmpeg
    return [whisper.log_mel_spectrogram(whisper.pad_or_trim(torch.from_numpy(load_audio(f))), 80) for f in CLIPS]


@pytest.fixture(scope="module")
def tiny_en():
    return medusa_whisper.load_model("tiny.en", device="cpu")


def run(decoder, windows):
    pending = iter(windows)
    done = {}
    decoder.run(lambda: next(pending, None), lambda key, result: done.__setitem__(key, result))
    return done


def test_windows_side_by_side_equal_each_alone(tiny_en, mels, monkeypatch):
    plain = dict(mode="off", fp16=False, language="en")
    variants = [MedusaDecodingOptions(**plain),
                MedusaDecodingOptions(**plain, prompt=[440, 2068, 7586, 290, 11]),  # sampling begins later
                MedusaDecodingOptions(**plain, sample_len=3),  # ends after three tokens: its item is refilled
                MedusaDecodingOptions(**plain, without_timestamps=True)]  # other rules: decoded alone
    windows = [(i, mels[i % len(mels)], variants[i % len(variants)]) for i in range(9)]
    monkeypatch.setenv(loop.STEP_ENV, "eager")
    alone = {key: decode(tiny_en, mel, options) for key, mel, options in windows}
    decoder = BatchDecoder(tiny_en, batch_size=3, products="fixed")
    together = run(decoder, windows)
    assert sorted(together) == sorted(alone)
    for key, expected in alone.items():
        got = together[key]
        assert got.tokens == expected.tokens, key
        assert got.avg_logprob == pytest.approx(expected.avg_logprob, abs=1e-4), key
        assert got.no_speech_prob == pytest.approx(expected.no_speech_prob, abs=1e-5), key
        assert got.decoder_steps == expected.decoder_steps, key
    assert len(together[2].tokens) == 3
    # one read per batched pass, and one per window's prompt pass
    assert decoder.host_reads == decoder.passes + sum(1 for _, _, o in windows if not o.without_timestamps)
    longest = max(r.decoder_steps for k, r in together.items() if not windows[k][2].without_timestamps)
    assert decoder.passes < sum(r.decoder_steps for r in together.values()) and decoder.passes >= longest - 1


@torch.no_grad()
def test_a_prompt_at_a_device_item_is_the_windows_prompt_alone(tiny_en, mels):
    """``FixedStep.prompt_at`` (one program for every item) gives the states of the window's prompt
    decoded alone, and writes the same keys and values into that item and no other."""
    features = tiny_en.embed_audio(torch.stack(mels[:3]))
    tokens = torch.tensor([[50257, 50362, 440, 2068, 7586]])
    positions = torch.arange(5)[None]
    batch = FixedStep(tiny_en, 3)
    batch.set_audio(features)
    for item in range(3):
        alone = FixedStep(tiny_en, 1)
        alone.set_audio(features[item:item + 1])
        states = alone(tokens, positions)
        before_keys, before_values = batch.keys.clone(), batch.values.clone()
        torch.testing.assert_close(batch.prompt_at(tokens, positions, torch.tensor([item])), states,
                                   atol=1e-5, rtol=1e-5)
        others = torch.arange(3) != item
        assert torch.equal(batch.keys[:, others], before_keys[:, others])
        assert torch.equal(batch.values[:, others], before_values[:, others])
        torch.testing.assert_close(batch.keys[:, item], alone.keys[:, 0], atol=1e-5, rtol=1e-5)
        torch.testing.assert_close(batch.values[:, item], alone.values[:, 0], atol=1e-5, rtol=1e-5)


def test_a_window_prompt_is_one_program_per_size(tiny_en, mels):
    """The batch's prompt passes on the fixed step: one program per size of prompt, for every item."""
    plain = dict(mode="off", fp16=False, language="en")
    windows = [(i, mels[i % len(mels)], MedusaDecodingOptions(**plain, sample_len=2)) for i in range(5)]
    decoder = BatchDecoder(tiny_en, batch_size=3, products="fixed")
    done = run(decoder, windows)
    assert len(done) == 5  # five windows opened in three items
    n = len(whisper.decoding.DecodingTask(tiny_en, windows[0][2]).initial_tokens)
    assert [rows for rows, _ in decoder.prompt_programs] == [loop.prompt_rows(n, 448)]


def test_a_batch_pass_never_reads_the_device_on_the_host(tiny_en, mels):
    decoder = BatchDecoder(tiny_en, batch_size=2, products="fixed")
    windows = [(0, mels[0], MedusaDecodingOptions(mode="off", fp16=False, language="en"))]
    decoder._start(0, lambda key, result: None, *windows[0])  # the step and rules, made for this window
    torch._dynamo.reset()
    before = decoder.length.clone()
    torch.compile(decoder._pass, fullgraph=True, backend="eager")()
    assert decoder.length.tolist() == [before[0] + 1, before[1]]  # the item in use moved, the other did not


def test_transcribe_many_takes_the_fixed_step_where_it_is_wanted(tiny_en, monkeypatch):
    monkeypatch.setenv(loop.STEP_ENV, "fixed")
    assert batch_decoder(tiny_en, 4).products == "fixed"
    monkeypatch.setenv(loop.STEP_ENV, "auto")  # the CPU keeps its row-invariant batched step
    assert batch_decoder(tiny_en, 4).products == "cpu"
    results = {}
    for step in ("eager", "fixed"):
        monkeypatch.setenv(loop.STEP_ENV, step)
        out = medusa_whisper.transcribe(tiny_en, CLIPS[:3], language="en", batch_size=2, fp16=False)
        results[step] = [r["text"] for r in out]
    assert results["fixed"] == results["eager"]


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_the_captured_batch_equals_the_uncaptured_one(mels):
    import os
    model = medusa_whisper.load_model(os.environ.get("MEDUSA_WHISPER_CUDA_TEST_MODEL", "tiny.en"), device="cuda")
    plain = dict(mode="off", fp16=True, language="en")
    windows = [(i, mels[i % len(mels)].cuda(), MedusaDecodingOptions(**plain, sample_len=224 if i % 2 == 0 else 5))
               for i in range(7)]
    results = [run(BatchDecoder(model, batch_size=4, capture=capture), windows) for capture in (False, True)]
    for key in results[0]:
        assert results[1][key].tokens == results[0][key].tokens, key
