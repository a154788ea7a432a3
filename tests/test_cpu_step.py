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
from helpers import feed, tiered, window_step

REAL = DATA / "real" / "jfk.flac"


def mel_of(path):
    audio, _ = soundfile.read(path, dtype="float32")
    return whisper.log_mel_spectrogram(whisper.pad_or_trim(torch.from_numpy(audio)))


def window(model, mel, **options):
    opts = MedusaDecodingOptions(language="en", fp16=False, **options)
    with torch.no_grad():
        features = model.embed_audio(mel[None])
    return opts, DecodingTask(model, opts), features


@pytest.mark.parametrize("windows", tiered([[(REAL, False), (CLIPS[0], True)],
                                            [(REAL, True), (CLIPS[0], False), (CLIPS[1], False), (CLIPS[1], True)]],
                                           ids=["two", "four-more"]))
@pytest.mark.parametrize("compute_type", ["float32", "int8"])
def test_plain_decoding_on_the_cpus_products_is_the_eager_loops(compute_type, windows, monkeypatch):
    model = medusa_whisper.load_model("tiny.en", device="cpu", compute_type=compute_type)
    decoder = WindowDecoder(model, torch.float32, torch.device("cpu"), products="cpu")
    monkeypatch.setenv(loop.STEP_ENV, "eager")
    for clip, timestamps in windows:
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
@pytest.mark.parametrize("clip", tiered([REAL, CLIPS[0]], ids=["real", "espeak"]))
def test_speculation_on_the_cpus_int8_products_is_plain_int8_greedy(name, extra, clip, monkeypatch):
    """Bit-exact lossless at int8: the proposers' tokens, verified in the pass by the device's
    acceptance and between passes by the host's (the CPU's default, same passes as ``decode``), are
    plain decoding's, every row multiplied and attended as alone."""
    model = medusa_whisper.load_model(name, device="cpu", compute_type="int8")
    monkeypatch.setenv(loop.STEP_ENV, "eager")
    mel = mel_of(clip)
    opts, task, features = window(model, mel, **extra)
    plain = decode(model, mel, opts, mode="off")
    host = decode(model, mel, opts)
    expected = [*plain.tokens, task.tokenizer.eot]
    in_pass = WindowDecoder(model, torch.float32, torch.device("cpu"), device_spec(model, opts), products="cpu")
    generation = in_pass.generate(task, features, list(task.initial_tokens), task.logit_filters, ProposerStats())
    assert generation.tokens[task.sample_begin:] == expected, clip.name
    assert generation.decoder_steps < len(expected)
    host_loop = loop.decoder_for(model, features, opts)  # the CPU's: the host's acceptance
    proposer = make_proposer(model, features, "en", opts, task, in_pass=host_loop.proposer)
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


@pytest.mark.parametrize("compute_type", ["int8", "bfloat16", "float32"])
def test_a_row_gets_its_bits_alone_in_a_chain_a_tree_and_a_batch(compute_type):
    """On the CPU's products of a converted model, and of a float32 one where the package's kernels
    are built, a row's states do not depend on its company: a chain of five, a tree's nodes and a
    batch's streams each equal the row fed in a pass alone, bit for bit (what makes speculation
    lossless, and a batched window its decoding alone)."""
    from medusa_whisper.step import native
    from medusa_whisper.step.cpu import cpu_step
    from medusa_whisper.step.together import rows_together

    if compute_type == "float32" and not native.available():
        pytest.skip("float32 rows are invariant on the package's kernels, not built here")
    model = medusa_whisper.load_model("tiny.en", device="cpu", compute_type=compute_type)
    tokens = torch.randint(0, 50000, (1, 40), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        features = model.embed_audio(mel_of(REAL)[None])

        def prompted(n):
            step = window_step(model, features)
            with rows_together():
                feed(step, tokens[0, :n].tolist(), 0)
            return step

        alone = prompted(20)
        one_by_one = torch.cat([feed(alone, [tokens[0, i]], i) for i in range(20, 26)], dim=1)
        chain = prompted(20)
        assert torch.equal(feed(chain, tokens[0, 20:25].tolist(), 20), one_by_one[:, :5])
        # a tree after 21 tokens: the pending token 21, then two branches of two nodes; the second
        # branch is the text (22, 23), so its rows are what one row at a time gives
        tree = prompted(20)
        feed(tree, [tokens[0, 20]], 20)  # as ``alone`` has it (a prompt's rows round by their company)
        mask = torch.zeros(5, 26, dtype=torch.bool)
        mask[:, :22] = True
        for row, ancestors in ((1, [1]), (2, [1, 2]), (3, [3]), (4, [3, 4])):
            mask[row, [21 + a for a in ancestors]] = True
        rows = [int(tokens[0, 21]), 7, 9, int(tokens[0, 22]), int(tokens[0, 23])]
        states = feed(tree, rows, 21, torch.tensor([21, 22, 23, 22, 23]), mask)
        assert torch.equal(states[:, [0, 3, 4]], one_by_one[:, 1:4])
        assert not torch.equal(states[:, 1], states[:, 3])  # the test can tell the branches apart

        batch, lengths = cpu_step(model, 3), [7, 12, 20]
        for item, n in enumerate(lengths):
            batch.set_audio(features, item)
            batch.prompt(tokens[:, :n], item)
        new = tokens[0, 30:33]
        rows = batch.rows(new, torch.tensor(lengths), 0, 3)
        for item, n in enumerate(lengths):
            assert torch.equal(rows[item], feed(prompted(n), [new[item]], n)[0, 0])


def test_the_step_over_the_cpus_float32_products_is_whispers_decoder():
    """At float32 the CPU's products compute whisper's own decoder (``TextDecoder.forward``), a
    prompt and then a chain after it, up to the rounding of other kernels."""
    model = medusa_whisper.load_model("tiny.en", device="cpu")
    tokens = torch.randint(0, 50000, (1, 30), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        features = model.embed_audio(mel_of(REAL)[None])
        step = window_step(model, features)
        ours = torch.cat([feed(step, tokens[0, :24].tolist(), 0), feed(step, tokens[0, 24:].tolist(), 24)], dim=1)
        theirs = model.decoder(tokens, features)  # whisper's logits at every position
    torch.testing.assert_close(step.logits(ours), theirs, rtol=1e-4, atol=2e-3)
