"""The fixed loop over the CPU's own products (step.cpu.CpuStep, ``MEDUSA_WHISPER_STEP=cpu``).

The loop CUDA captures, run with the eager step's arithmetic: it must give the eager loop's
tokens bit for bit at every compute type (float32 and int8 here), plain and with every proposer,
so that one loop can serve both devices; and speculative decoding on it must give plain greedy
decoding's tokens at int8, where a row's bits would show any company it kept.
"""

import pytest
import soundfile
import torch
import whisper
from whisper.decoding import DecodingTask

import medusa_whisper
from medusa_whisper import MedusaDecodingOptions, decode
from medusa_whisper.decoding import loop
from medusa_whisper.drafting.base import ProposerStats
from medusa_whisper.drafting.factory import device_spec, make_proposer
from medusa_whisper.decoding.loop import WindowDecoder

from conftest import CLIPS, DATA

REAL = DATA / "real" / "jfk.flac"


def mel_of(path):
    audio, _ = soundfile.read(path, dtype="float32")
    return whisper.log_mel_spectrogram(whisper.pad_or_trim(torch.from_numpy(audio)))


def window(model, mel, **options):
    opts = MedusaDecodingOptions(language="en", fp16=False, **options)
    with torch.no_grad():
        features = model.embed_audio(mel[None])
    return opts, DecodingTask(model, opts), features


@pytest.mark.parametrize("compute_type", ["float32", "int8"])
def test_plain_decoding_on_the_cpus_products_is_the_eager_loops(compute_type, monkeypatch):
    model = medusa_whisper.load_model("tiny.en", device="cpu", compute_type=compute_type)
    decoder = WindowDecoder(model, torch.float32, torch.device("cpu"), products="cpu")
    monkeypatch.setenv(loop.STEP_ENV, "eager")
    for clip in (REAL, *CLIPS[:2]):
        for timestamps in (False, True):
            mel = mel_of(clip)
            opts, task, features = window(model, mel, without_timestamps=not timestamps)
            eager = decode(model, mel, opts, mode="off")
            generation = decoder.generate(task, features, list(task.initial_tokens), task.logit_filters,
                                          ProposerStats())
            assert generation.tokens[task.sample_begin:] == [*eager.tokens, task.tokenizer.eot], (clip.name, timestamps)
            assert generation.sum_logprob / (len(eager.tokens) + 1) == pytest.approx(eager.avg_logprob, abs=1e-5)


@pytest.mark.parametrize("name,extra", [("tiny.en-eagle", dict(draft_tokens=3)),
                                        ("tiny.en-eagle", dict(tree_width=2, tree_nodes=6)),
                                        ("tiny.en-ctc", {}), ("tiny.en-medusa", {})])
def test_speculation_on_the_cpus_int8_products_is_plain_int8_greedy(name, extra, monkeypatch):
    """Bit-exact lossless at int8: the in-pass proposers' tokens and a host proposer's (same passes
    as the eager loop) are plain decoding's, every row multiplied and attended as alone."""
    model = medusa_whisper.load_model(name, device="cpu", compute_type="int8")
    monkeypatch.setenv(loop.STEP_ENV, "eager")
    for clip in (REAL, CLIPS[0]):
        mel = mel_of(clip)
        opts, task, features = window(model, mel, **extra)
        plain = decode(model, mel, opts, mode="off")
        host = decode(model, mel, opts)
        expected = [*plain.tokens, task.tokenizer.eot]
        in_pass = WindowDecoder(model, torch.float32, torch.device("cpu"), device_spec(model, opts), products="cpu")
        generation = in_pass.generate(task, features, list(task.initial_tokens), task.logit_filters, ProposerStats())
        assert generation.tokens[task.sample_begin:] == expected, clip.name
        assert generation.decoder_steps < len(expected)
        proposer = make_proposer(model, features, "en", opts, task)
        host_loop = WindowDecoder(model, torch.float32, torch.device("cpu"), products="cpu")
        generation = host_loop.generate(task, features, list(task.initial_tokens), task.logit_filters,
                                        ProposerStats(), proposer)
        assert generation.tokens[task.sample_begin:] == expected, clip.name
        assert generation.decoder_steps == host.decoder_steps, clip.name


def test_the_cpus_default_is_the_one_loop_on_its_own_products(monkeypatch):
    """On the CPU a window is decoded by the fixed loop over the CPU's products with the host's
    acceptance; MEDUSA_WHISPER_STEP=fixed takes the fixed-shape step and the device's instead."""
    model = medusa_whisper.load_model("tiny.en", device="cpu", compute_type="int8")
    monkeypatch.setenv(loop.STEP_ENV, "auto")
    result = decode(model, mel_of(REAL), language="en", fp16=False)
    (decoder,) = model.fixed_decoders.values()
    assert type(decoder.step).__name__ == "CpuStep" and decoder.acceptance == "host"
    monkeypatch.setenv(loop.STEP_ENV, "fixed")
    decode(model, mel_of(REAL), language="en", fp16=False)
    assert {type(d.step).__name__ for d in model.fixed_decoders.values()} == {"CpuStep", "FixedStep"}
    assert result.tokens == whisper.decode(model, mel_of(REAL), whisper.DecodingOptions(language="en", fp16=False)).tokens
