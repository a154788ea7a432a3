"""Proposers that draft inside the fixed-shape pass (drafting/device/).

The Medusa heads' and the EAGLE head's trees are built at fixed shapes by tensor programs, so they
are checked against the same trees built node by node on the host (reference_drafts), on the
fixed-shape step's products and on the CPU's, where the same proposer is driven between passes; the CTC draft keeps its pointer by other rules than the host's edit-distance
alignment, so its moves are checked one by one. Whatever they propose, decoding must give plain
greedy decoding's tokens (lossless), and a pass with its proposer must trace with
``fullgraph=True`` (no read of a tensor by the host, which a CUDA graph could not replay).
"""

import os
import random
import warnings

import pytest
import soundfile
import torch
import torch.nn.functional as F
import whisper
from whisper.decoding import DecodingOptions, DecodingTask
from whisper.tokenizer import get_tokenizer

import medusa_whisper
from medusa_whisper import MedusaConfig, decode
from medusa_whisper.decoding import loop
from medusa_whisper.drafting.base import Committed, ProposerStats
from medusa_whisper.drafting.ctc_draft import CtcDraft
from medusa_whisper.drafting.ctc_proposer import DraftSettings
from medusa_whisper.drafting.device.ctc import Chunk, DeviceCtc, vocabulary_bytes
from medusa_whisper.drafting.device.eagle import DeviceEagle
from medusa_whisper.drafting.device.medusa import DeviceMedusa
from medusa_whisper.drafting.device.union import DeviceUnion
from medusa_whisper.drafting.device.hosted import Hosted
from medusa_whisper.drafting.tree import CandidateTree
from medusa_whisper.drafting.tree_layout import TreeLayout, pack_on_device
from medusa_whisper.decoding.loop import WindowDecoder
from medusa_whisper.step.cpu import step_on
from medusa_whisper.step.fixed import FixedStep

from conftest import CLIPS, DATA
from helpers import random_model, randomize_heads, tiered
from reference_drafts import best_first, eagle_chain, eagle_tree

REAL = DATA / "real" / "jfk.flac"


def mel_of(path):
    audio, _ = soundfile.read(path, dtype="float32")
    return whisper.log_mel_spectrogram(whisper.pad_or_trim(torch.from_numpy(audio)))


def options(**kw):
    return DecodingOptions(**{"language": "en", "fp16": False, **kw})


@pytest.fixture(scope="module")
def tiny_en():
    return medusa_whisper.load_model("tiny.en", device="cpu")


@pytest.fixture(scope="module")
def tiny_en_eagle():
    return medusa_whisper.load_model("tiny.en-eagle", device="cpu")


@pytest.fixture(scope="module")
def features(tiny_en):
    with torch.no_grad():
        return tiny_en.embed_audio(mel_of(REAL)[None])


def random_tree(rng: random.Random, n: int) -> CandidateTree:
    tokens, parents = [], []
    for i in range(n):
        parents.append(rng.randrange(-1, i))
        tokens.append(rng.randrange(5))  # few tokens: siblings with one token (twins) are common
    return CandidateTree(tuple(tokens), tuple(parents))


def test_a_tree_packed_on_the_device_is_the_hosts_packing():
    rng = random.Random(0)
    for n in (1, 2, 5, 8, 13):
        for _ in range(20):
            tree = random_tree(rng, n)
            host = TreeLayout.pack(tree, n)
            every = torch.ones(n, dtype=torch.bool)
            device = pack_on_device(torch.tensor(tree.tokens), torch.tensor(tree.parents), every)
            assert torch.equal(device, host), tree
    # a node the proposer marks invalid takes its subtree with it
    tree = CandidateTree((1, 2, 3, 4), (-1, 0, 1, -1))
    valid = torch.tensor([True, False, True, True])
    layout = TreeLayout.unpack(pack_on_device(torch.tensor(tree.tokens), torch.tensor(tree.parents), valid), 4)
    assert layout.valid.tolist() == [True, False, False, True]


def advance_prompt(proposer, step, model, features, prompt):
    """The prompt pass on ``step`` and the proposer's first advance; returns the history and states."""
    n = len(prompt)
    history = torch.zeros(1, step.n_ctx + 80, dtype=torch.long)
    history[0, :n] = torch.tensor(prompt)
    step.set_audio(features)
    with torch.no_grad():
        hidden = step(history[:, :n], torch.arange(n)[None])
        greedy = step.logits(hidden[:, -1:]).argmax(dim=-1)
        history[0, n] = greedy[0, 0]
        proposer.begin(features, get_tokenizer(model.is_multilingual))
        start = torch.zeros(1, dtype=torch.long)
        proposer.advance(hidden, history, start, start + n, greedy, None)
    return history, hidden


@pytest.mark.parametrize("products", ["fixed", "cpu"])
def test_device_medusa_trees_are_the_best_first_trees(products):
    """The Medusa heads' tree, scored by one path matrix and a stable sort, on either step's
    products, is the Medusa paper's best-first tree of the heads' own top tokens (built with a heap)."""
    model = randomize_heads(random_model(MedusaConfig(num_heads=3)), std=0.2)
    step = step_on(products, model)
    heads, embedding = model.medusa, model.decoder.token_embedding.weight
    for width, nodes in ((2, 5), (3, 10), (2, 14)):
        device = DeviceMedusa(heads, step, 3, width, nodes)
        for seed in range(3):
            torch.manual_seed(seed)
            state = torch.randn(1, 1, model.dims.n_text_state)
            with torch.no_grad():
                device.advance(state, torch.zeros(1, 8, dtype=torch.long), torch.zeros(1, dtype=torch.long),
                               torch.ones(1, dtype=torch.long), torch.zeros(1, 1, dtype=torch.long), nodes)
                logits = heads.proposal_logits(heads.head_states(state[:, 0], 3), embedding)[0]
            logprobs, columns = F.log_softmax(logits, dim=-1).topk(width, dim=-1)
            tree = best_first([(heads.proposal_ids(columns[k]).tolist(), logprobs[k].tolist()) for k in range(3)],
                              nodes)
            assert torch.equal(device.layout(nodes), TreeLayout.pack(tree, len(tree))), (width, nodes, seed)


def committed_feature(eagle, states, history, start, count):
    """The drafted feature after a commit that ``eagle`` took: its block's output at the last
    committed row, run again (it rewrites that row's slot as it was)."""
    last = start + count - 1
    x = eagle._fused(states[:, count - 1:count], history[:, last + 1:last + 2], torch.tensor([[last + 1]]))
    slot = torch.tensor([[last]])
    return eagle._block(x, slot, eagle.slots <= slot[..., None])[0, 0]


@pytest.mark.parametrize("products", ["fixed", "cpu"])
@pytest.mark.parametrize("width,nodes", [(1, 4), (3, 8)], ids=["chain", "tree"])
def test_device_eagle_drafts_are_eagles_chain_and_tree(width, nodes, products, tiny_en_eagle, features):
    """After the prompt, and after a pass that committed three more tokens, on either step's
    products: the chain of the head's own tokens, or EAGLE-2's tree grown node by node on the host
    (reference_drafts), from the same head."""
    model = tiny_en_eagle
    step = step_on(products, model)
    depth = 4
    device = DeviceEagle(model.draft_head, step, depth, width, nodes)
    reference = DeviceEagle(model.draft_head, step, depth, width, nodes)  # its block, fusion and shortlist
    prompt = [50257, 50362]
    history, hidden = advance_prompt(device, step, model, features, prompt)
    reference.begin(features, None)

    def check(states, start, count):
        with torch.no_grad():
            reference.advance(states, history, torch.tensor([start]), torch.tensor([count]),
                              torch.zeros(1, 1, dtype=torch.long), None)
            feature = committed_feature(reference, states, history, start, count)
            committed = start + count
            if width == 1:
                assert device.tokens[0].tolist() == eagle_chain(reference, feature, committed, depth)
            else:
                tree = eagle_tree(reference, feature, committed, depth, width, nodes)
                assert torch.equal(device.layout(nodes), TreeLayout.pack(tree, len(tree)))

    check(hidden, 0, len(prompt))
    with torch.no_grad():
        # a pass over the pending token and three candidates, of which two are accepted
        fed = torch.tensor([[int(history[0, 2]), 843, 523, 616]])
        history[0, 3:5] = fed[0, 1:3]
        history[0, 5] = 5891  # the verifier's own next token
        states = step(fed, torch.arange(2, 6)[None])
        device.advance(states, history, torch.tensor([2]), torch.tensor([3]), torch.zeros(1, 4, dtype=torch.long), nodes)
    check(states[:, :3], 2, 3)


@pytest.mark.parametrize("width,nodes", [(1, 4), (3, 8)], ids=["chain", "tree"])
def test_the_eagle_heads_one_proposer_drafts_alike_on_both_products(width, nodes, tiny_en_eagle, features):
    """One proposer on every device: on the CPU's products, driven between passes (``Hosted``), it
    drafts what it drafts in the fixed-shape pass."""
    model = tiny_en_eagle
    fixed, cpu = step_on("fixed", model), step_on("cpu", model)
    in_pass = DeviceEagle(model.draft_head, fixed, 4, width, nodes)
    hosted = Hosted(DeviceEagle(model.draft_head, cpu, 4, width, nodes), features, None, fixed.n_ctx)
    prompt = [50257, 50362]
    history, hidden = advance_prompt(in_pass, fixed, model, features, prompt)
    with torch.no_grad():
        hosted.commit(Committed(tokens=prompt, hidden=hidden, position=0, next_token=int(history[0, 2]),
                                n_accepted=0, n_proposed=0))
        tree = hosted.propose()
    expected = TreeLayout.unpack(in_pass.layout(nodes), nodes) if width > 1 else None
    if width == 1:
        assert tree == CandidateTree.chain(in_pass.tokens[0].tolist())
    else:
        assert list(tree.tokens) == expected.tokens.tolist()
        assert [p + 1 for p in tree.parents] == expected.parent_rows.tolist()


class SpelledHead:
    """A CTC head whose draft is a given text."""

    def __init__(self, text):
        self.text = text

    def draft(self, features):
        return CtcDraft(self.text, [0.0] * len(self.text), [0.0] * len(self.text), [0.0] * len(self.text))


class CtcWalk:
    """Drives a DeviceCtc's advance as passes would: what the verifier committed after each chunk."""

    def __init__(self, tiny_en, text, **settings):
        self.tokenizer = get_tokenizer(False)
        step = FixedStep(tiny_en)
        self.ctc = DeviceCtc(SpelledHead(text), step, DraftSettings(**settings), self.tokenizer.eot,
                             self.tokenizer.timestamp_begin, *vocabulary_bytes(self.tokenizer, tiny_en.dims.n_vocab))
        self.ctc.set_row_costs([1.0] * 6)
        self.history = torch.zeros(1, 500, dtype=torch.long)
        prompt = list(self.tokenizer.sot_sequence_including_notimestamps)
        self.history[0, :len(prompt)] = torch.tensor(prompt)
        self.length = len(prompt)
        self.ctc.begin(None, self.tokenizer)

    def encode(self, text):
        return self.tokenizer.encode(text)

    def words(self, tokens):
        return [self.tokenizer.decode([t]) if t < self.tokenizer.eot else t for t in tokens]

    def commit(self, tokens, shape=Chunk(0)):
        """The verifier committed ``tokens`` (accepted candidates, then its own) after a pass over ``shape``."""
        start = self.length - 1 if shape is not None else 0
        count = len(tokens) if shape is not None else self.length
        self.history[0, self.length:self.length + len(tokens)] = torch.tensor(tokens)
        if shape is None:  # the prompt: the first token comes after it
            count = self.length
        rows = max(count, self.ctc.depth(shape) + 1 if shape is not None else count)
        greedy = torch.zeros(1, 1 + (self.ctc.nodes(shape) if shape is not None else 0), dtype=torch.long)
        self.ctc.advance(torch.zeros(1, rows, 4), self.history, torch.tensor([start]), torch.tensor([count]), greedy,
                         shape)
        self.length += len(tokens)

    def chunk(self, n=4):
        return self.words(self.ctc.chunk[0, :n].tolist())


def test_the_ctc_pointer_follows_the_verifier(tiny_en):
    walk = CtcWalk(tiny_en, " Ask not what your kuntry can do for you, ask what you can do now.")
    walk.commit(walk.encode(" Ask"), None)  # the prompt pass said " Ask"
    assert walk.chunk() == [" not", " what", " your", " k"]
    walk.commit(walk.encode(" not what your country"), Chunk(4))  # three accepted, the verifier respells
    assert walk.chunk() == [" can", " do", " for", " you"]
    walk.commit(walk.encode(" can do for you."), Chunk(4))  # four accepted; "." where the draft has ","
    assert walk.chunk() == [" ask", " what", " you", " can"]
    walk.commit(walk.encode(" ask you"), Chunk(4))  # the verifier skips " what"
    assert walk.chunk() == [" can", " do", " now", "."]
    walk.commit(walk.encode(" can do so"), Chunk(4))  # an inserted word, taken for a respelt " now"
    walk.commit(walk.encode(" now"))  # a plain pass: the draft's " now" is found again behind
    assert walk.chunk(2) == [".", walk.tokenizer.eot]


def test_a_closing_timestamp_opens_the_next_chunk(tiny_en):
    walk = CtcWalk(tiny_en, " One sentence. Another one.")
    begin = walk.tokenizer.timestamp_begin
    walk.commit([begin], None)
    assert walk.chunk(3) == [" One", " sentence", "."]
    walk.commit(walk.encode(" One sentence.") + [begin + 50], Chunk(4))
    assert walk.chunk(3) == [begin + 50, " Another", " one"]  # the next segment starts where this one ended
    walk.commit([begin + 50] + walk.encode(" Another"), Chunk(4))
    assert walk.chunk(2) == [" one", "."]


@pytest.mark.parametrize("branch", [True, False], ids=["branch_in_pass", "default"])
def test_the_second_branch_is_what_the_verifier_said_after_the_refusal(tiny_en, branch):
    """With ``branch_in_pass`` a refusal is followed by the verifier's own branch; by default every
    pass stays a chain (on a GPU the tree pass costs more than the branch saves)."""
    walk = CtcWalk(tiny_en, " Ask not what your kuntry can do.", branch_in_pass=branch)
    walk.commit(walk.encode(" Ask"), None)
    # the verifier's token after each row: " not", " what", " your", " country", and after " k" " could"
    greedy = torch.tensor([walk.encode(" not what your country could")])
    walk.history[0, walk.length:walk.length + 4] = torch.tensor(walk.encode(" not what your country"))
    start = walk.length - 1
    walk.ctc.advance(torch.zeros(1, 5, 4), walk.history, torch.tensor([start]), torch.tensor([4]), greedy, Chunk(4))
    walk.ctc.observe(Chunk(4), 2)
    assert walk.ctc.next_shape(100).branch == branch
    if not branch:
        assert not walk.ctc.guessed.any()
        return
    # refused at node 3 (" k"): the verifier's tokens after it guess what follows its own " country"
    assert walk.ctc.guessed[0, :4].tolist() == [True, False, False, False]
    assert walk.words(walk.ctc.guesses[0, :1].tolist()) == [" could"]
    tokens, parents, valid = walk.ctc.tree(Chunk(2, True))
    assert walk.words(tokens.tolist()[:2]) == walk.chunk(2) and parents.tolist() == [-1, 0, -1, 2]
    assert valid.tolist() == [True, True, True, False]


def test_a_union_shares_the_nodes_both_parts_propose(tiny_en, tiny_en_eagle):
    step = FixedStep(tiny_en_eagle)
    tokenizer = get_tokenizer(False)
    ctc = DeviceCtc(SpelledHead(" a b c"), step, DraftSettings(), tokenizer.eot, tokenizer.timestamp_begin,
                    *vocabulary_bytes(tokenizer, tiny_en.dims.n_vocab))
    union = DeviceUnion(ctc, DeviceEagle(tiny_en_eagle.draft_head, step, 3))
    ctc.chunk[0, :3] = torch.tensor([11, 12, 13])
    union.eagle.tokens[0] = torch.tensor([11, 12, 99])  # the first two are the chunk's
    layout = TreeLayout.unpack(union.layout(Chunk(3)), 6)
    assert layout.valid.tolist() == [True, True, True, False, False, True]
    assert layout.parent_rows.tolist() == [0, 1, 2, 0, 1, 2]  # under shared nodes: the chunk's own
    union.eagle.tokens[0] = torch.tensor([21, 12, 13])  # its own branch from the root
    layout = TreeLayout.unpack(union.layout(Chunk(3)), 6)
    assert layout.valid.all() and layout.parent_rows.tolist() == [0, 1, 2, 0, 4, 5]


DEVICE_PROPOSERS = [("tiny.en-medusa", dict(tree_width=3, tree_nodes=6)), ("tiny.en-medusa-block", {}),
                    ("tiny.en-eagle", dict(draft_tokens=3)),
                    ("tiny.en-eagle", dict(tree_width=2, tree_nodes=6)), ("tiny.en-ctc", {}),
                    ("tiny.en-ctc", dict(ctc=dict(branch_in_pass=True))), ("tiny.en-ctc+eagle", dict(draft_tokens=2))]


def load_with(name, extra, device="cpu", **kwargs):
    """The model, and the decoding options of ``extra`` less its ``ctc``: settings over the CTC
    head's own (``DraftSettings``)."""
    model = medusa_whisper.load_model(name, device=device, **kwargs)
    extra = dict(extra)
    ctc = extra.pop("ctc", None)
    if ctc:
        head = model.draft_head
        for part in (head.parts if head.kind == "union" else [head]):
            if part.kind == "ctc":
                part.config.decoding = dict(part.config.decoding, **ctc)
    return model, extra


WINDOWS = [(REAL, True), (CLIPS[0], False), (REAL, False), (CLIPS[0], True)]


@pytest.mark.parametrize("clip,timestamps", tiered(WINDOWS, ids=["real-timestamps", "espeak", "real",
                                                                "espeak-timestamps"]))
@pytest.mark.parametrize("name,extra", DEVICE_PROPOSERS, ids=[f"{n}{e}" for n, e in DEVICE_PROPOSERS])
def test_device_proposers_give_greedy_tokens(name, extra, clip, timestamps, monkeypatch):
    """Lossless: the tokens of plain greedy decoding, with and without timestamps. The Medusa and
    EAGLE heads propose what they propose on the host, so their passes are the host loop's too."""
    model, extra = load_with(name, extra)
    mel = mel_of(clip)
    opts = options(without_timestamps=not timestamps)
    monkeypatch.setenv(loop.STEP_ENV, "eager")
    plain = decode(model, mel, opts, mode="off")
    host = decode(model, mel, opts, **extra)
    monkeypatch.setenv(loop.STEP_ENV, "fixed")
    fixed = decode(model, mel, opts, **extra)
    assert fixed.tokens == plain.tokens, (clip.name, timestamps)
    assert fixed.avg_logprob == pytest.approx(plain.avg_logprob, abs=1e-4)
    assert fixed.decoder_steps < fixed.tokens_produced  # candidates were accepted
    if "ctc" not in name:
        assert fixed.decoder_steps == host.decoder_steps, (clip.name, timestamps)
    decoder = next(d for d in model.fixed_decoders.values() if d.drafts_in_pass)
    assert decoder.proposer is not None and not decoder.trees  # no tree came from the host
    if "ctc" in extra or name.endswith("-ctc"):  # tree passes where, and only where, the second branch goes
        trees = [key for key in decoder.passes if key[1] == "tree"]
        assert bool(trees) == decoder.proposer.branches


def test_random_heads_in_a_tree_are_mostly_refused_and_lossless(monkeypatch):
    model = randomize_heads(random_model(MedusaConfig(num_heads=3)))
    torch.manual_seed(3)
    mel = torch.randn(80, 3000)
    opts = options(without_timestamps=True)
    monkeypatch.setenv(loop.STEP_ENV, "fixed")
    for sample_len in (None, 37):
        kw = {} if sample_len is None else {"sample_len": sample_len}
        fixed = decode(model, mel, opts, tree_width=2, tree_nodes=5, **kw)
        assert fixed.tokens == whisper.decode(model, mel, opts, **kw).tokens
        assert fixed.draft_proposed > 2 * fixed.draft_accepted


def test_one_host_read_per_pass_with_a_device_proposer(monkeypatch):
    model = medusa_whisper.load_model("tiny.en-ctc", device="cpu")
    monkeypatch.setenv(loop.STEP_ENV, "fixed")
    result = decode(model, mel_of(REAL), options())
    decoder = next(d for d in model.fixed_decoders.values() if d.drafts_in_pass)
    reads = decoder.host_reads
    result = decode(model, mel_of(REAL), options())
    assert decoder.host_reads - reads == result.decoder_steps  # the prefill's read, then one per pass
    assert result.decoder_steps < result.tokens_produced


GROUPED = [("tiny.en", dict(mode="off")), ("tiny.en-eagle", dict(draft_tokens=2)), ("tiny.en-ctc", {})]


@pytest.mark.parametrize("name,extra", GROUPED, ids=[n for n, _ in GROUPED])
def test_several_passes_per_read_give_the_same_tokens(name, extra, monkeypatch):
    """Passes replayed back to back before one read (CUDA's default): the window's end is found
    afterwards, and the passes after it change nothing."""
    model = medusa_whisper.load_model(name, device="cpu")
    monkeypatch.setenv(loop.STEP_ENV, "fixed")
    for clip in (REAL, CLIPS[1]):
        mel = mel_of(clip)
        one = decode(model, mel, options(), **extra)
        (decoder,) = model.fixed_decoders.values()
        decoder.passes_per_read = 3
        reads = decoder.host_reads
        grouped = decode(model, mel, options(), **extra)
        decoder.passes_per_read = 1
        assert grouped.tokens == one.tokens, clip.name
        assert grouped.avg_logprob == pytest.approx(one.avg_logprob, abs=1e-6)
        if "ctc" not in name:  # (the CTC chunk follows the acceptance, which a group learns later)
            assert grouped.decoder_steps == one.decoder_steps
        assert decoder.host_reads - reads <= 1 + (grouped.decoder_steps + 2) // 3 + 3, clip.name


PASSES_ON_CUDA = [("-medusa", dict(tree_width=3)), ("-medusa-block", {}), ("-eagle", dict(draft_tokens=2)),
                  ("-eagle", dict(tree_width=3, tree_nodes=8)), ("-ctc", {}),
                  ("-ctc", dict(ctc=dict(branch_in_pass=True))), ("-ctc+eagle", dict(draft_tokens=2))]
PASSES = [("tiny.en-medusa", dict(tree_width=3)), ("tiny.en-medusa-block", dict(tree_width=2)),
          ("tiny.en-eagle", dict(draft_tokens=2)),
          ("tiny.en-eagle", dict(tree_width=2, tree_nodes=5, draft_tokens=3)), ("tiny.en-ctc", {}),
          ("tiny.en-ctc+eagle", dict(draft_tokens=2))]


@pytest.mark.parametrize("name,extra", PASSES, ids=[f"{n}{e}" for n, e in PASSES])
def test_a_pass_that_drafts_never_reads_the_device_on_the_host(name, extra):
    """Verify, accept and draft the next proposal: one program, traced whole by torch.compile."""
    model = medusa_whisper.load_model(name, device="cpu")
    opts = medusa_whisper.MedusaDecodingOptions(language="en", fp16=False, **extra)
    from medusa_whisper.drafting.factory import device_spec

    decoder = WindowDecoder(model, torch.float32, torch.device("cpu"), device_spec(model, opts))
    task = DecodingTask(model, opts)
    rules = decoder._rules(task.logit_filters, model.dims.n_vocab)
    with torch.no_grad():
        features = model.embed_audio(mel_of(REAL)[None])
    decoder.proposer.begin(features, task.tokenizer)
    decoder.step.set_audio(features)
    decoder._prefill(list(task.initial_tokens), rules, task.sot_index, task.tokenizer.no_speech, True)
    shapes = {decoder.proposer.next_shape(100)}
    if "ctc" in name:
        shapes |= {Chunk(2, True), Chunk(0)}
    for shape in shapes:
        nodes = decoder.proposer.nodes(shape)
        before = int(decoder.length[0])
        out = torch.zeros(3 + 3 * (nodes + 1), dtype=torch.float64)
        if decoder.proposer.is_tree(shape):
            run = lambda: decoder._tree_pass(nodes, rules, out, True, shape)  # noqa: E731
        else:
            run = lambda: decoder._pass(nodes + 1, rules, out[:1 + 2 * (nodes + 1)], True, shape)  # noqa: E731
        torch._dynamo.reset()
        with torch.no_grad():
            torch.compile(run, fullgraph=True, backend="eager")()
        assert int(decoder.length[0]) > before  # it ran: the length moved past the pending token


cuda = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
# the base model of the CUDA tests (tools/gpu/run.sh takes the one whose weights it carried)
CUDA_MODEL = os.environ.get("MEDUSA_WHISPER_CUDA_TEST_MODEL", "tiny.en")


@cuda
@pytest.mark.parametrize("suffix,extra", PASSES_ON_CUDA, ids=[f"{s}{e}" for s, e in PASSES_ON_CUDA])
def test_captured_device_proposers_equal_the_uncaptured_loop(suffix, extra):
    """The same tokens captured and uncaptured, window after window (the second replays the first's
    graphs), as plain decoding on the same step; and one wait for the device per pass, plus the
    window's set-up (the prefill's read, a CTC draft's read)."""
    from medusa_whisper.drafting.factory import device_spec

    model, extra = load_with(CUDA_MODEL + suffix, extra, device="cuda", compute_type="float16")
    opts = medusa_whisper.MedusaDecodingOptions(language="en", fp16=True, **extra)
    task = DecodingTask(model, opts)
    with torch.no_grad():
        features = model.embed_audio(mel_of(REAL)[None].cuda().half())
    initial = list(task.initial_tokens)
    plain = WindowDecoder(model, torch.float16, torch.device("cuda"))
    expected = plain.generate(task, features, initial, task.logit_filters, ProposerStats()).tokens
    for capture in (False, True):
        decoder = WindowDecoder(model, torch.float16, torch.device("cuda"), device_spec(model, opts), capture=capture)
        for _ in range(2):
            generation = decoder.generate(task, features, initial, task.logit_filters, ProposerStats())
            assert generation.tokens == expected, capture
            assert generation.decoder_steps < len(expected) - len(initial)
    torch.cuda.synchronize()
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        torch.cuda.set_sync_debug_mode("warn")
        try:
            generation = decoder.generate(task, features, initial, task.logit_filters, ProposerStats())
        finally:
            torch.cuda.set_sync_debug_mode("default")
    syncs = [w for w in caught if "synchroniz" in str(w.message).lower()]
    assert len(syncs) <= generation.decoder_steps + 6, [str(w.message) for w in syncs[:5]]
