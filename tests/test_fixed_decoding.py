"""The fixed-shape step and its decoding loop (step/fixed.py, decoding/loop.py) against the eager ones.

On the CPU the fixed-shape loop is what CUDA graphs capture, run eagerly: its tokens must be the
eager loop's (and so whisper's greedy tokens), with and without timestamps, with prompts that move
where sampling begins, and with Medusa heads whose candidates are often rejected. A pass must not
read a tensor on the host (a CUDA graph cannot), which torch.compile's full-graph tracing checks on
the CPU. The CUDA tests compare the captured graphs with the same loop uncaptured and count the
host's waits; they skip where there is no GPU.
"""

import os
import warnings

import pytest
import soundfile
import torch
import whisper
from whisper.decoding import DecodingOptions, DecodingTask

import medusa_whisper
from medusa_whisper import MedusaConfig, decode
from medusa_whisper.decoding import loop
from medusa_whisper.step.projection import project
from medusa_whisper.drafting.tree import CandidateTree
from medusa_whisper.drafting.base import Proposer, ProposerStats
from medusa_whisper.drafting.factory import DeviceSpec, make_proposer
from medusa_whisper.decoding.loop import WindowDecoder, decoder_for
from medusa_whisper.step.fixed import FixedStep
from medusa_whisper.drafting.tree_layout import TreeLayout

from conftest import CLIPS, DATA
from helpers import random_model, randomize_heads, tiered, window_step
from reference_drafts import best_first

REAL = DATA / "real" / "jfk.flac"


def mel_of(path, n_mels=80):
    audio, _ = soundfile.read(path, dtype="float32")
    return whisper.log_mel_spectrogram(whisper.pad_or_trim(torch.from_numpy(audio)), n_mels)


def options(**kw):
    return DecodingOptions(**{"language": "en", "fp16": False, **kw})


def decode_with(step: str, monkeypatch, *args, **kwargs):
    monkeypatch.setenv(loop.STEP_ENV, step)
    return decode(*args, **kwargs)


@pytest.fixture(scope="module")
def tiny_en():
    return medusa_whisper.load_model("tiny.en", device="cpu")


@pytest.fixture(scope="module")
def tiny_en_medusa():
    return medusa_whisper.load_model("tiny.en-medusa", device="cpu")


@pytest.fixture(scope="module")
def real_features(tiny_en):
    with torch.no_grad():
        return tiny_en.embed_audio(mel_of(REAL)[None])


def test_step_states_equal_the_eager_decoder_for_a_chain_and_a_tree(tiny_en, real_features):
    decoder = tiny_en.decoder
    step = FixedStep(tiny_en)
    step.set_audio(real_features)
    cpu = window_step(tiny_en, real_features)  # the same step on the CPU's products: whisper's modules
    prompt = torch.tensor([[50257, 50362, 843, 523, 616, 3399]])
    n = prompt.shape[1]
    with torch.no_grad():
        eager = cpu.pass_at(prompt, torch.arange(n), 0, torch.ones(n, n, dtype=torch.bool).tril())
        fixed = step(prompt, torch.arange(n)[None])
        # two kernels' rounding: states of up to about 100 agree to a few units in their 6th digit
        torch.testing.assert_close(fixed, eager, atol=2e-4, rtol=1e-5)
        assert torch.equal(step.logits(fixed).argmax(-1), project(decoder, eager).argmax(-1))
        # a tree after the prompt: the pending token, then two candidates at depth 1 and one under each
        tree = best_first([([11, 13], [-0.1, -0.2]), ([290, 318], [-0.3, -0.4])], max_nodes=4)
        pending = [1265]
        positions, mask = tree.layout(n, len(pending), "cpu")
        tokens = torch.tensor([pending + list(tree.tokens)])
        eager = cpu.pass_at(tokens, positions, n, mask)
        rows = tokens.shape[1]
        every_slot = torch.zeros(1, rows, step.n_ctx, dtype=torch.bool)
        every_slot[0, :, :n + rows] = mask
        fixed = step(tokens, positions[None], every_slot, slots=torch.arange(n, n + rows)[None])
        torch.testing.assert_close(fixed, eager, atol=2e-4, rtol=1e-5)
        assert not torch.allclose(fixed[0, 2], fixed[0, 4], atol=1e-2)  # siblings at one position differ


@pytest.mark.parametrize("speech", tiered([[REAL], CLIPS[:2]], ids=["real", "synthetic"]))
@pytest.mark.parametrize("timestamps", [False, True])
@pytest.mark.parametrize("name", ["tiny.en", "tiny.en-medusa"])
def test_fixed_loop_gives_the_eager_loops_tokens(name, timestamps, speech, tiny_en, tiny_en_medusa, monkeypatch):
    model = tiny_en if name == "tiny.en" else tiny_en_medusa
    for clip in speech:
        mel = mel_of(clip)
        opts = options(without_timestamps=not timestamps)
        eager = decode_with("eager", monkeypatch, model, mel, opts)
        fixed = decode_with("fixed", monkeypatch, model, mel, opts)
        assert fixed.tokens == eager.tokens, clip.name
        assert fixed.avg_logprob == pytest.approx(eager.avg_logprob, abs=1e-4)
        assert fixed.no_speech_prob == pytest.approx(eager.no_speech_prob, abs=1e-5)
        if name == "tiny.en":
            assert fixed.tokens == whisper.decode(model, mel, opts).tokens
            assert fixed.decoder_steps == fixed.tokens_produced
        else:  # the same candidates are proposed and kept as in the eager loop
            assert fixed.decoder_steps == eager.decoder_steps < fixed.tokens_produced
            # (the eager loop leaves the last pass's accepted candidates uncounted)
            assert fixed.draft_accepted >= eager.draft_accepted > 0


def test_rejected_candidates_and_the_sample_limit(monkeypatch):
    """Random heads are mostly wrong (rollback every pass), and a random model never ends: it stops
    at sample_len, where the last passes have no room for candidates."""
    model = randomize_heads(random_model(MedusaConfig(num_heads=4)), std=0.065)
    torch.manual_seed(3)
    mel = torch.randn(80, 3000)
    opts = options(without_timestamps=True)
    expected = whisper.decode(model, mel, opts)
    for sample_len in (None, 37):
        kw = {} if sample_len is None else {"sample_len": sample_len}
        fixed = decode_with("fixed", monkeypatch, model, mel, opts, **kw)
        assert fixed.tokens == whisper.decode(model, mel, opts, **kw).tokens
        assert len(fixed.tokens) == (sample_len or 224)
        assert fixed.decoder_steps < fixed.tokens_produced
        assert fixed.draft_proposed > 2 * fixed.draft_accepted  # most candidates were rejected
    assert decode_with("fixed", monkeypatch, model, mel, opts).tokens == expected.tokens


def test_prompts_of_different_lengths_reuse_the_decoder(tiny_en_medusa, monkeypatch):
    """A prompt moves where sampling begins; the rules' tensors are reloaded, not rebuilt, and the
    prompt's program is one per size (``loop.prompt_rows``)."""
    mel = mel_of(REAL)
    made, prompt_sizes, expected_sizes = [], set(), set()
    for prompt in ("Kennedy's inaugural address.", "A speech about the country and what its people can do " * 3,
                   None):
        opts = options(prompt=prompt)
        eager = decode_with("eager", monkeypatch, tiny_en_medusa, mel, opts)
        fixed = decode_with("fixed", monkeypatch, tiny_en_medusa, mel, opts)
        assert fixed.tokens == eager.tokens, prompt
        decoders = [d for d in tiny_en_medusa.fixed_decoders.values() if d is not None]
        made.append((len(decoders), sum(len(d.rules) for d in decoders), sum(len(d.passes) for d in decoders)))
        prompt_sizes |= {key[1] for d in decoders for key in d.prompt_programs}
        expected_sizes.add(loop.prompt_rows(len(DecodingTask(tiny_en_medusa, opts).initial_tokens), 448))
    assert made[0] == made[1] == made[2]  # the same decoder, rule tensors and passes for every prompt
    assert prompt_sizes == expected_sizes and len(expected_sizes) == 3


@torch.no_grad()
def test_a_padded_prompt_pass_is_the_prompt_pass(tiny_en_medusa, monkeypatch):
    """The fixed step runs a prompt of n tokens in ``prompt_rows(n)`` rows: the first token, its
    log-probability, the argmax before the rules, the no-speech probability, the prompt's states,
    the history, the length and the keys and values of the prompt's slots are those of a pass over
    its n rows alone."""
    model = tiny_en_medusa
    features = model.embed_audio(mel_of(REAL)[None])
    task = DecodingTask(model, options(prompt="Kennedy's inaugural address."))
    initial = list(task.initial_tokens)
    n = len(initial)
    assert loop.prompt_rows(n, 448) > n  # padded
    got = []
    for padded in (True, False):
        if not padded:
            monkeypatch.setattr(loop, "prompt_rows", lambda n, n_ctx: n)
        decoder = WindowDecoder(model, torch.float32, torch.device("cpu"))
        decoder.step.set_audio(features)
        rules = decoder._rules(task.logit_filters, decoder.step.vocabulary.shape[0])
        first, speech, states = decoder._prefill(initial, rules, task.sot_index, task.tokenizer.no_speech, False,
                                                 keep=True)
        assert {key[1] for key in decoder.prompt_programs} == {loop.prompt_rows(n, 448)}
        got.append((first, speech, states, decoder.history.clone(), int(decoder.length),
                    decoder.step.keys[:, :, :, :n].clone(), decoder.step.values[:, :, :, :n].clone()))
    (first, speech, states, history, length, keys, values), alone = got
    assert first[1] == alone[0][1] and first[3] == alone[0][3]  # the token, the argmax before the rules
    assert first[2] == pytest.approx(alone[0][2], abs=1e-5) and speech == pytest.approx(alone[1], abs=1e-6)
    torch.testing.assert_close(states, alone[2], atol=1e-5, rtol=1e-5)
    assert torch.equal(history, alone[3]) and length == alone[4] == n + 1
    torch.testing.assert_close(keys, alone[5], atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(values, alone[6], atol=1e-5, rtol=1e-5)


def test_one_host_read_per_pass(tiny_en_medusa, real_features):
    decoder = WindowDecoder(tiny_en_medusa, torch.float32, torch.device("cpu"), DeviceSpec("medusa", 1))
    task = DecodingTask(tiny_en_medusa, options())
    stats = ProposerStats()
    generation = decoder.generate(task, real_features, list(task.initial_tokens), task.logit_filters, stats)
    assert generation.decoder_steps == decoder.host_reads  # the prefill's read, then one per pass
    assert len(generation.tokens) - len(task.initial_tokens) > generation.decoder_steps


def test_a_pass_never_reads_the_device_on_the_host(tiny_en_medusa):
    """torch.compile's full-graph tracing fails on .item(), .tolist(), a tensor's truth value or a
    shape that depends on data: what a CUDA graph cannot capture either."""
    decoder = WindowDecoder(tiny_en_medusa, torch.float32, torch.device("cpu"), DeviceSpec("medusa", 1))
    task = DecodingTask(tiny_en_medusa, options())
    rules = decoder._rules(task.logit_filters, tiny_en_medusa.dims.n_vocab)
    decoder.length.fill_(5)
    out = torch.zeros(5, dtype=torch.float64)
    torch._dynamo.reset()
    torch.compile(lambda: decoder._pass(2, rules, out, True, 1), fullgraph=True, backend="eager")()
    assert int(decoder.length[0]) > 5  # it ran: the length moved past the pending token

    # the tree pass of host proposers: a tree of three nodes in the slots of four
    decoder.trees[4] = TreeLayout.pack(CandidateTree((11, 13, 290), (-1, -1, 0)), 4)
    decoder.kept[4] = torch.zeros(1, 5, decoder.step.n_state)
    tree_out = torch.zeros(3 + 3 * 5, dtype=torch.float64)
    torch._dynamo.reset()
    torch.compile(lambda: decoder._tree_pass(4, rules, tree_out), fullgraph=True, backend="eager")()

    def reads_the_host():
        decoder._pass(2, rules, out, True, 1)
        if int(decoder.length[0]) > 3:
            out.add_(1)
    torch._dynamo.reset()
    with pytest.raises(Exception):
        torch.compile(reads_the_host, fullgraph=True, backend="eager")()


HOST_PROPOSERS = [("tiny.en-medusa-block", {}), ("tiny.en-eagle", dict(draft_tokens=3)),
                  ("tiny.en-eagle", dict(tree_width=2, tree_nodes=6)), ("tiny.en-ctc", {}),
                  ("tiny.en-ctc+eagle", dict(draft_tokens=2))]


@pytest.mark.parametrize("name,extra", HOST_PROPOSERS, ids=[f"{n}{e}" for n, e in HOST_PROPOSERS])
def test_host_proposers_trees_verified_on_the_device_as_by_the_eager_loop(name, extra):
    """Proposers that draft on the host hand the pass a tree (a chain is one); the pass walks it on
    the device. Same tokens, and the same passes, proposals and acceptances as the eager loop. (The
    fixed loop's own choice for the draft heads is their in-pass proposer: test_device_proposers.)"""
    model = medusa_whisper.load_model(name, device="cpu")
    opts = medusa_whisper.MedusaDecodingOptions(language="en", fp16=False, **extra)
    for clip in (REAL, CLIPS[0]):
        mel = mel_of(clip)
        eager = decode(model, mel, opts)  # the CPU's default: the eager loop
        with torch.no_grad():
            features = model.embed_audio(mel[None])
        task = DecodingTask(model, opts)
        in_pass = decoder_for(model, features, opts).proposer  # the CPU's, driven between passes
        proposer = make_proposer(model, features, "en", opts, task, in_pass=in_pass)
        decoder = WindowDecoder(model, torch.float32, torch.device("cpu"))
        stats = ProposerStats()
        fixed = decoder.generate(task, features, list(task.initial_tokens), task.logit_filters, stats, proposer)
        assert fixed.tokens[task.sample_begin:] == [*eager.tokens, task.tokenizer.eot], clip.name
        assert fixed.decoder_steps == eager.decoder_steps, clip.name
        assert proposer.stats.proposed == eager.draft_proposed, clip.name
        assert fixed.decoder_steps < len(fixed.tokens) - task.sample_begin


class TwinProposer(Proposer):
    """Proposes, after each commit, the true next token twice as siblings: the first twin alone, the
    second with the true token after it as a child. The verifier takes the first acceptable child,
    so only one token is ever kept from the tree; the second twin's deeper path must not be."""

    def __init__(self, truth):
        super().__init__()
        self.truth, self.done = truth, 0

    def _commit(self, committed):
        self.done = committed.end + 1  # tokens known after this pass: the committed ones and the next

    def _propose(self):
        ahead = self.truth[self.done:self.done + 2]
        if len(ahead) < 2:
            return CandidateTree()
        return CandidateTree((ahead[0], ahead[0], ahead[1]), (-1, -1, 1))


def test_a_sibling_with_an_earlier_twin_is_never_kept(tiny_en, real_features):
    task = DecodingTask(tiny_en, options())
    initial = list(task.initial_tokens)
    reference = WindowDecoder(tiny_en, torch.float32, torch.device("cpu"))
    truth = reference.generate(task, real_features, initial, task.logit_filters, ProposerStats()).tokens
    decoder = WindowDecoder(tiny_en, torch.float32, torch.device("cpu"))
    proposer = TwinProposer(truth)
    generation = decoder.generate(task, real_features, initial, task.logit_filters, ProposerStats(), proposer)
    assert generation.tokens == truth
    assert proposer.stats.accepted_per_depth[:1] == [proposer.stats.accepted] and proposer.stats.accepted > 5
    assert len(proposer.stats.accepted_per_depth) == 1  # never two candidates in one pass


def test_what_the_fixed_step_leaves_to_the_host(monkeypatch):
    """What the device's acceptance cannot do (typical acceptance, the lossy CTC shortcut, a
    base_head model's logits) goes to the CPU's products and the host's acceptance, as does
    everything on the CPU unless MEDUSA_WHISPER_STEP asks for the fixed step."""
    features = torch.zeros(1, 1500, 384)
    monkeypatch.setenv(loop.STEP_ENV, "fixed")
    block = random_model(MedusaConfig(num_heads=2, heads_type="block"))
    linear = random_model(MedusaConfig(num_heads=2))
    base_head = random_model(MedusaConfig(num_heads=2, heads_type="base_head"))
    options = medusa_whisper.MedusaDecodingOptions

    def acceptance(model, **kw):
        return decoder_for(model, features, options(**kw)).acceptance

    assert decoder_for(linear, features, options()).spec == DeviceSpec("medusa", 2, 1, 2)  # drafts in the pass
    assert decoder_for(linear, features, options(tree_width=2)).spec == DeviceSpec("medusa", 2, 2, 4)
    assert decoder_for(block, features, options()).drafts_in_pass  # its block too
    assert decoder_for(linear, features, options(mode="off")).proposer is None
    # where the host accepts, the same proposer is driven between passes
    typical = decoder_for(block, features, options(mode="typical"))
    assert typical.acceptance == "host" and typical.spec == DeviceSpec("medusa", 2, 1, 2)
    assert not typical.drafts_in_pass
    assert acceptance(linear, mode="typical") == acceptance(linear, lossy_ctc_entropy=0.5) == "host"
    assert acceptance(base_head, mode="off") == "host"  # its logits go through head 0
    assert acceptance(linear) == "device"
    monkeypatch.setenv(loop.STEP_ENV, "auto")  # on the CPU, auto is the host's acceptance
    assert acceptance(linear) == "host"
    monkeypatch.setenv(loop.STEP_ENV, "graphs")
    with pytest.raises(ValueError, match=loop.STEP_ENV):
        decoder_for(linear, features, options())


cuda = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
# the base model of the CUDA tests (tools/gpu/run.sh takes the one whose weights it carried)
CUDA_MODEL = os.environ.get("MEDUSA_WHISPER_CUDA_TEST_MODEL", "tiny.en")


@cuda
@pytest.mark.parametrize("dtype", [torch.float16, torch.float32])
def test_captured_graphs_equal_the_uncaptured_loop(dtype):
    model = medusa_whisper.load_model(CUDA_MODEL + "-medusa", device="cuda")
    task = DecodingTask(model, options(fp16=dtype == torch.float16))
    with torch.no_grad():
        features = model.embed_audio(mel_of(REAL)[None].cuda().to(dtype))
    results = []
    for capture in (False, True):
        decoder = WindowDecoder(model, dtype, torch.device("cuda"), DeviceSpec("medusa", 1), capture=capture)
        for _ in range(2):  # the second window replays graphs captured in the first
            results.append(decoder.generate(task, features, list(task.initial_tokens), task.logit_filters,
                                            ProposerStats()))
    assert all(r.tokens == results[0].tokens for r in results)
    assert results[0].decoder_steps < len(results[0].tokens) - len(task.initial_tokens)


@cuda
def test_one_synchronisation_per_captured_pass():
    model = medusa_whisper.load_model(CUDA_MODEL + "-medusa", device="cuda")
    task = DecodingTask(model, options(fp16=True))
    with torch.no_grad():
        features = model.embed_audio(mel_of(REAL)[None].cuda().half())
    decoder = WindowDecoder(model, torch.float16, torch.device("cuda"), DeviceSpec("medusa", 1))
    initial = list(task.initial_tokens)
    decoder.generate(task, features, initial, task.logit_filters, ProposerStats())  # captures
    torch.cuda.synchronize()
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        torch.cuda.set_sync_debug_mode("warn")
        try:
            generation = decoder.generate(task, features, initial, task.logit_filters, ProposerStats())
        finally:
            torch.cuda.set_sync_debug_mode("default")
    syncs = [w for w in caught if "synchroniz" in str(w.message).lower()]
    # the passes' one read each, and the window's set-up (the prefill's read, the rules' tensors)
    assert len(syncs) <= generation.decoder_steps + 4, [str(w.message) for w in syncs[:5]]


@cuda
def test_ctc_drafts_are_accepted_on_cuda():
    """A CUDA run of base-ctc once chose never to draft (1.00 tokens per pass): verification rows
    were multiplied one at a time there, so the measured pass costs said extra rows never pay."""
    model = medusa_whisper.load_model(CUDA_MODEL + "-ctc", device="cuda", compute_type="float16")
    result = decode(model, mel_of(REAL).cuda(), options(fp16=True))
    assert result.tokens_per_step > 1.3
    assert result.draft_accepted > 0


def test_a_tree_packs_into_what_the_pass_reads():
    """Node 2 is a child of 0; node 3 repeats node 1's token under the root, after it: unreachable,
    and so is its child 4."""
    tree = CandidateTree((11, 13, 290, 13, 318), (-1, -1, 0, -1, 3))
    layout = TreeLayout.unpack(TreeLayout.pack(tree, 8), 8)
    assert layout.tokens.tolist()[:5] == [11, 13, 290, 13, 318] and layout.tokens.tolist()[5:] == [0, 0, 0]
    assert layout.depth.tolist()[:5] == [1, 1, 2, 1, 2]
    assert layout.parent_rows.tolist()[:5] == [0, 0, 1, 0, 4]  # the pending token's row is 0
    assert layout.valid.tolist() == [True, True, True, False, False, False, False, False]
    assert layout.ancestors[2].tolist()[:5] == [True, False, True, False, False]
    assert layout.paths[2].tolist()[:2] == [0, 2] and layout.paths[4].tolist()[:2] == [3, 4]
