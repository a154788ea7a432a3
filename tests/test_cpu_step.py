"""The fixed loop over the CPU's own products (the one step, FixedStep, over step.cpu.CpuProducts).

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
    assert not decoder.step.products.fixed_shapes and decoder.acceptance == "host"
    monkeypatch.setenv(loop.STEP_ENV, "fixed")
    decode(model, mel_of(REAL), language="en", fp16=False)
    assert sorted(d.step.products.fixed_shapes for d in model.fixed_decoders.values()) == [False, True]
    assert result.tokens == whisper.decode(model, mel_of(REAL), whisper.DecodingOptions(language="en", fp16=False)).tokens


@pytest.mark.parametrize("compute_type", ["int8", "float32", "bfloat16"])
def test_the_one_step_over_the_cpus_products_is_the_decoders_bit_for_bit(compute_type):
    """FixedStep over CpuProducts gives the states ``decoder_hidden`` gives (the CPU's decoder with
    its own cache), bit for bit: a prompt with its rows together, one row, a chain of five, a tree;
    and at int8 and bfloat16 a batch's rows equal each stream's pass alone."""
    from medusa_whisper.step.cpu import cpu_step
    from medusa_whisper.step.decoder import chain_mask, decoder_hidden, new_cache
    from medusa_whisper.step.together import rows_together

    model = medusa_whisper.load_model("tiny.en", device="cpu", compute_type=compute_type)
    tokens = torch.randint(0, 50000, (1, 40), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        features = model.embed_audio(mel_of(REAL)[None])
        step = cpu_step(model)
        step.set_audio(features)
        cache = new_cache(model.decoder, features)

        def both(start, n, positions, mask):
            new = tokens[:, start:start + n]
            cache.self_attn.length = start
            return (step.pass_at(new, positions, start, mask),
                    decoder_hidden(model.decoder, new, positions, cache, start, mask))

        with rows_together():
            mine, theirs = both(0, 20, torch.arange(20), chain_mask(0, 20, "cpu"))
        assert torch.equal(mine, theirs)
        mine, theirs = both(20, 1, torch.arange(20, 21), None)
        assert torch.equal(mine, theirs)
        mine, theirs = both(21, 5, torch.arange(21, 26), chain_mask(21, 5, "cpu"))
        assert torch.equal(mine, theirs)
        tree = torch.zeros(5, 31, dtype=torch.bool)  # the pending token, then two branches of two nodes
        tree[:, :27] = True
        for row, ancestors in ((1, [1]), (2, [1, 2]), (3, [3]), (4, [3, 4])):
            tree[row, [26 + a for a in ancestors]] = True
        mine, theirs = both(26, 5, torch.tensor([26, 27, 28, 27, 28]), tree)
        assert torch.equal(mine, theirs)

        if compute_type == "float32":  # float32's products are not row-invariant: nothing promised
            return
        batch, lengths = cpu_step(model, 3), [7, 12, 20]
        for item, n in enumerate(lengths):
            batch.set_audio(features, item)
            batch.prompt(tokens[:, :n], item)
        new = tokens[0, 30:33]
        rows = batch.rows(new, torch.tensor(lengths), 0, 3)
        for item, n in enumerate(lengths):
            alone = cpu_step(model)
            alone.set_audio(features)
            with rows_together():
                alone.pass_at(tokens[:, :n], torch.arange(n), 0, chain_mask(0, n, "cpu"))
            assert torch.equal(rows[item], alone.pass_at(new[item:item + 1][None], torch.tensor([n]), n, None)[0, 0])
