"""The CTC draft head: its units, the proposer's re-synchronisation, lossless decoding with whole-window
drafts (right, corrupted, empty) on a real recording, the replay that scores drafts without a decoder,
training (the loss falls, a resume continues at the same step), loading by name, and the lossy option
that must never be reached without its flag."""

from dataclasses import asdict, replace

import pytest
import torch
import whisper
from whisper.tokenizer import get_encoding, get_tokenizer

import medusa_whisper
from medusa_whisper import MedusaDecodingOptions
from medusa_whisper.decoding import acceptance
from medusa_whisper.audio.files import load_audio
from medusa_whisper.drafting.ctc import CtcDraft, CtcHead, CtcConfig, greedy_draft
from medusa_whisper.drafting.ctc_proposer import DraftSettings, align_end, choose_chunk
from medusa_whisper.drafting.ctc_units import Units
from medusa_whisper.drafting import factory, pass_costs
from medusa_whisper.drafting.draft_head import DraftHead, draft_head_file
from medusa_whisper.drafting.replay import replay
from medusa_whisper.drafting.tree import CandidateTree
from medusa_whisper.training import ctc as ctc_training
from medusa_whisper.training import features, windows

from conftest import DATA

JFK = DATA / "real" / "jfk.flac"
# base's transcript of jfk.flac; tiny.en's differs (no comma after "Americans"), which the
# proposer must absorb like any other draft error
JFK_TEXT = " And so my fellow Americans, ask not what your country can do for you, ask what you can do for your country."
CORRUPTED = " And so my felow Americans ask not wat you country can do for yu, ask what we can do fr your county"


class FixedDraft(DraftHead):
    """A stand-in CTC head whose draft is a given text (characters 40 ms apart), for any window; the
    proposers the factory makes for it are kept in ``proposers`` when a test asks for ``recorded``."""

    kind = "ctc"

    def __init__(self, text: str, entropy: float = 0.5, settings: DraftSettings = DraftSettings()):
        super().__init__()
        self.text, self.entropy, self.settings = text, entropy, settings
        self.proposers = []

    def draft(self, audio_features):
        n = len(self.text)
        return CtcDraft(self.text, [0.04 * i for i in range(n)], [0.04 * (i + 1) for i in range(n)],
                        [self.entropy] * n)

    def draft_settings(self) -> DraftSettings:
        return self.settings


@pytest.fixture
def recorded(monkeypatch):
    """Keeps each proposer the factory makes for a head in that head's ``proposers`` list, if it has one."""
    original = factory.head_proposer

    def recording(head, *args, **kwargs):
        proposer = original(head, *args, **kwargs)
        getattr(head, "proposers", []).append(proposer)
        return proposer

    monkeypatch.setattr(factory, "head_proposer", recording)


# pass costs given, not measured, so that what a test asserts of the chunk lengths holds on any machine:
# rows cheap (as at int8 on one EPYC), where long chunks of a right draft pay, and dear (float32 there)
CHEAP_ROWS = DraftSettings(row_costs=(1.0, 1.03, 1.13, 1.49, 1.91, 2.78))
DEAR_ROWS = DraftSettings(row_costs=(1.0, 1.1, 1.39, 2.43, 3.7, 5.36))


@pytest.fixture(scope="module")
def tiny():
    return medusa_whisper.load_model("tiny.en", device="cpu")


@pytest.fixture(scope="module")
def jfk_mel():
    return whisper.log_mel_spectrogram(whisper.pad_or_trim(load_audio(JFK)))


def _vanilla(model, mel, without_timestamps: bool):
    return whisper.decode(model, mel, whisper.DecodingOptions(language="en", fp16=False,
                                                              without_timestamps=without_timestamps))


# -- units ------------------------------------------------------------------------------------------

@pytest.mark.parametrize("encoding", ["gpt2", "multilingual"])
def test_units_are_an_earlier_state_of_the_main_models_own_bpe(encoding):
    text = " And Mr. John Dashwood had then leisure to consider it; naïve café, 42 times!"
    full = get_encoding(encoding)
    for n_units in (256, 1024):
        units = Units(encoding, n_units)
        ids = units.encode(text)
        assert all(0 <= i < n_units for i in ids)
        assert units.decode(ids) == text
        assert full.encode(units.decode(ids)) == full.encode(text)
    assert len(Units(encoding, 256).encode("abc")) == 3  # bytes: one unit per ASCII character
    assert Units(encoding, len(full._mergeable_ranks)).encode(text) == full.encode(text)


def test_greedy_draft_collapses_repeats_and_blanks_and_keeps_the_frames():
    units = Units("gpt2", 256)
    blank = 256
    frames = [blank, ord("h"), ord("h"), blank, ord("i"), blank, blank, ord("i")]
    # bytes are units in gpt2's rank order, not by value: look the unit of each character up
    ids = [blank if f == blank else units.encode(chr(f))[0] for f in frames]
    logprobs = torch.full((len(ids), 257), -20.0)
    for t, i in enumerate(ids):
        logprobs[t, i] = 0.0
    draft = greedy_draft(logprobs, units, blank, frame_seconds=0.04)
    assert draft.text == "hii"
    assert draft.char_start == pytest.approx([0.04, 0.16, 0.28])
    assert draft.char_end == pytest.approx([0.12, 0.20, 0.32])


# -- the proposer's pieces -------------------------------------------------------------------------------

def test_align_end_finds_where_the_committed_text_ends_in_the_draft():
    assert align_end(" leisure", " lesur to consider") == (6, 2)  # the misspelt word, not beyond it
    assert align_end(" consid", " consiter how") == (7, 1)  # inside a word: the draft's rest is "er"
    assert align_end(" your", " you country")[0] == 4  # ends before the draft's next word
    assert align_end(" man walked", " the man walked down")[0] == len(" the man walked")
    end, cost = align_end("tail of it", "xx the tail of it yy", free_start=True)
    assert (end, cost) == (len("xx the tail of it"), 0)


def test_chunks_grow_with_acceptance_and_stop_when_drafts_fail():
    base_costs = DEAR_ROWS
    assert choose_chunk(0.95, base_costs) >= 8
    assert 1 <= choose_chunk(0.5, base_costs) < choose_chunk(0.95, base_costs)
    tiny_costs = DraftSettings(cost_rows=(1, 2, 4, 8, 16), row_costs=(1.0, 1.21, 1.90, 2.27, 2.28))  # dear rows
    assert choose_chunk(0.1, tiny_costs) == 0
    assert choose_chunk(0.9, replace(tiny_costs, fixed_chunk=3)) == 3


# -- lossless decoding with whole-window drafts -------------------------------------------------------------

@pytest.mark.parametrize("without_timestamps", [True, False], ids=["no-timestamps", "timestamps"])
def test_ctc_drafts_are_lossless_and_re_synchronise_after_errors(tiny, jfk_mel, without_timestamps, recorded):
    expected = _vanilla(tiny, jfk_mel, without_timestamps)
    per_step = {}
    try:
        for name, text in (("right", JFK_TEXT), ("corrupted", CORRUPTED), ("empty", ""),
                           ("unrelated", " Completely different words that are nothing like it.")):
            tiny.draft_head = FixedDraft(text, settings=CHEAP_ROWS)
            result = medusa_whisper.decode(tiny, jfk_mel, language="en", without_timestamps=without_timestamps)
            assert result.tokens == expected.tokens, name
            assert result.avg_logprob == pytest.approx(expected.avg_logprob, abs=1e-3)  # other row counts, other rounding
            per_step[name] = result.tokens_per_step
            counts = tiny.draft_head.proposers[-1].counts
            if name == "corrupted":
                assert counts["realignments"] >= 5
    finally:
        tiny.draft_head = None
    assert per_step["right"] >= 3.0, per_step
    # re-synchronisation keeps a corrupted draft useful: without it, the first error would end it
    assert per_step["corrupted"] >= 2.0, per_step
    assert per_step["empty"] == pytest.approx(1.0)


def test_replay_counts_the_passes_the_decoding_loop_takes(tiny, jfk_mel):
    """Scoring a draft without a decoder: the replayed passes equal the real loop's, draft for draft."""
    tokenizer = get_tokenizer(False, language="en", task="transcribe")
    try:
        for without_timestamps in (True, False):
            expected = _vanilla(tiny, jfk_mel, without_timestamps)
            initial = list(tokenizer.sot_sequence_including_notimestamps if without_timestamps
                           else tokenizer.sot_sequence)
            for text in (JFK_TEXT, CORRUPTED):
                # the verifier's guesses at rejected rows (jacobi) need a decoder: not replayed
                settings = DraftSettings(jacobi=False)
                tiny.draft_head = FixedDraft(text, settings=settings)
                result = medusa_whisper.decode(tiny, jfk_mel, language="en", without_timestamps=without_timestamps)
                proposer = factory.head_proposer(FixedDraft(text, settings=settings), tiny, None, tokenizer, replace(
                    MedusaDecodingOptions(), without_timestamps=without_timestamps))
                replayed = replay(proposer, initial, expected.tokens + [tokenizer.eot], tokenizer.eot,
                                  proposer.settings)
                assert replayed.tokens == result.tokens_produced
                assert replayed.passes == result.decoder_steps, (text, without_timestamps)
    finally:
        tiny.draft_head = None


# -- the lossy option ------------------------------------------------------------------------------------------

def test_the_lossy_option_is_never_reached_without_its_flag(tiny, jfk_mel, monkeypatch):
    calls = []
    real = acceptance._accept_unverified

    def spy(*args):
        calls.append(args)
        return real(*args)

    monkeypatch.setattr(acceptance, "_accept_unverified", spy)
    expected = _vanilla(tiny, jfk_mel, True)
    try:
        # a confident (entropy 0.01) and wrong draft: exactly what the lossy option would accept
        tiny.draft_head = FixedDraft(CORRUPTED, entropy=0.01)
        lossless = medusa_whisper.decode(tiny, jfk_mel, language="en", without_timestamps=True)
        assert calls == [] and lossless.tokens == expected.tokens
        lossy = medusa_whisper.decode(tiny, jfk_mel, language="en", without_timestamps=True, lossy_ctc_entropy=0.1)
    finally:
        tiny.draft_head = None
    assert calls, "with the flag, confident spans are taken unverified"
    assert lossy.tokens != expected.tokens  # the corrupted words went through: lossy indeed
    with pytest.raises(RuntimeError, match="lossy_ctc_entropy"):
        real(CandidateTree.chain([1, 2], unverified=1), -1, MedusaDecodingOptions())


# -- a real head: loads by name and decodes losslessly -----------------------------------------------------------

def test_a_ctc_heads_file_loads_by_name_and_decodes_losslessly(tiny, jfk_mel, tmp_path, monkeypatch):
    head = CtcHead(tiny.dims, CtcConfig(encoding="gpt2", n_units=256, width=64, layers=1))
    torch.save(draft_head_file(head, "tiny.en", {"note": "untrained"}), tmp_path / "tiny.en-ctc.pt")
    monkeypatch.setenv("MEDUSA_WHISPER_HEADS_DIR", str(tmp_path))
    model = medusa_whisper.load_model("tiny.en-ctc", device="cpu")
    assert isinstance(model.draft_head, CtcHead)
    for (name, a), (_, b) in zip(head.state_dict().items(), model.draft_head.state_dict().items()):
        assert torch.equal(a, b), name
    for without_timestamps in (True, False):
        result = medusa_whisper.decode(model, jfk_mel, language="en", without_timestamps=without_timestamps)
        assert result.tokens == _vanilla(tiny, jfk_mel, without_timestamps).tokens
        assert result.draft_seconds > 0  # the head's pass is part of the draft's time


def test_ctc_drafts_at_int8_equal_int8_greedy(jfk_mel, tmp_path, monkeypatch):
    """The head runs at the model's compute type (its linears int8 too), and long right drafts verified
    many rows per pass give int8 greedy's tokens."""
    int8 = medusa_whisper.load_model("tiny.en", device="cpu", compute_type="int8")
    head = CtcHead(int8.dims, CtcConfig(encoding="gpt2", n_units=256, width=64, layers=1))
    torch.save(draft_head_file(head, "tiny.en", {"note": "untrained"}), tmp_path / "tiny.en-ctc.pt")
    monkeypatch.setenv("MEDUSA_WHISPER_HEADS_DIR", str(tmp_path))
    model = medusa_whisper.load_model("tiny.en-ctc", device="cpu", compute_type="int8")
    for without_timestamps in (True, False):
        greedy = medusa_whisper.decode(int8, jfk_mel, language="en", without_timestamps=without_timestamps,
                                       mode="off")
        assert medusa_whisper.decode(model, jfk_mel, language="en",
                                     without_timestamps=without_timestamps).tokens == greedy.tokens
        try:
            int8.draft_head = FixedDraft(JFK_TEXT, settings=CHEAP_ROWS)
            right = medusa_whisper.decode(int8, jfk_mel, language="en", without_timestamps=without_timestamps)
        finally:
            int8.draft_head = None
        assert right.tokens == greedy.tokens and right.tokens_per_step >= 3.0


def test_pass_costs_are_measured_here_once_per_model_and_compute_type(tiny, jfk_mel, tmp_path, monkeypatch, unpinned):
    """The chunk length is chosen from what a pass costs on the running machine: the table is measured
    for each decoder shape at its compute type, once per machine; a head file's tables (measured where
    it was trained) are dropped at load, and a table given in the settings is used as given."""
    measured = []
    original = pass_costs._measure

    def counting(model, rows, audio_features):
        measured.append(model)
        return original(model, rows, audio_features)

    monkeypatch.setattr(pass_costs, "_measure", counting)
    head = CtcHead(tiny.dims, CtcConfig(encoding="gpt2", n_units=256, width=64, layers=1,
                                        decoding=dict(asdict(DEAR_ROWS), int8_row_costs=CHEAP_ROWS.row_costs)))
    torch.save(draft_head_file(head, "tiny.en", {"note": "untrained"}), tmp_path / "tiny.en-ctc.pt")
    monkeypatch.setenv("MEDUSA_WHISPER_HEADS_DIR", str(tmp_path))
    options = MedusaDecodingOptions(language="en", without_timestamps=True)
    models = [medusa_whisper.load_model("tiny.en-ctc", device="cpu", compute_type=t) for t in ("float32", "int8")]
    for model in models:
        assert model.draft_head.draft_settings().row_costs is None
        features = model.embed_audio(jfk_mel[None])
        tokenizer = get_tokenizer(model.is_multilingual, num_languages=model.num_languages, language="en")
        first = factory.head_proposer(model.draft_head, model, features, tokenizer, options).settings
        again = factory.head_proposer(model.draft_head, model, features, tokenizer, options).settings
        assert first.row_costs == again.row_costs
        assert len(first.row_costs) == len(first.cost_rows) and first.row_costs[0] == 1.0
        assert all(cost > 0 for cost in first.row_costs) and first.row_costs[-1] > 1.0
    assert measured == models  # once each
    assert DEAR_ROWS.for_model(models[1]) is DEAR_ROWS  # given costs are kept
    assert choose_chunk(0.6, CHEAP_ROWS) > choose_chunk(0.6, DEAR_ROWS)


# -- training ---------------------------------------------------------------------------------------------------------

@pytest.fixture(scope="module")
def cache(tiny, clips, tmp_path_factory):
    utterances = [windows.Utterance(path=str(c), group="all") for c in clips]
    packed = windows.pack(utterances, seed=0, min_seconds=8, max_seconds=12)
    out = tmp_path_factory.mktemp("ctc_cache")
    features.build_cache(tiny, packed, out, features.LabelOptions(timestamps_fraction=0.5))
    return features.load_cache(out)


SMALL = ctc_training.CtcTrainConfig(width=64, layers=1, batch_windows=2, lr=3e-3, warmup_steps=2, eval_every=1000,
                                    checkpoint_every=1000, dropout=0.0)


def test_a_short_ctc_training_run_lowers_the_loss(tiny, cache, tmp_path):
    cfg = replace(SMALL, epochs=12)
    head, state = ctc_training.train(tiny, cache, cache, cfg, tmp_path)
    tokenizer = ctc_training.tokenizer_of(tiny)
    fresh = CtcHead(tiny.dims, cfg.head_config("gpt2"))
    before = ctc_training.evaluate(fresh, cache, ctc_training.make_labels(cache, tokenizer, fresh), tokenizer,
                                   DraftSettings().for_model(tiny))
    after = state.history[-1]["heldout"]
    assert after["loss"] < before["loss"] - 1.0
    assert state.best["step"] == state.step  # evaluated once, at the end: the best is the last
    assert {"token_error_rate", "char_error_rate", "tokens_per_pass", "passes_per_window"} <= set(after)


def test_ctc_training_resumes_at_the_same_step(tiny, cache, tmp_path):
    cfg = replace(SMALL, epochs=3, checkpoint_every=2, dropout=0.1, time_masks=2)
    straight, _ = ctc_training.train(tiny, cache, None, cfg, tmp_path / "straight")
    ctc_training.train(tiny, cache, None, cfg, tmp_path / "split", max_steps=4)
    assert torch.load(tmp_path / "split" / "checkpoint.pt", weights_only=True)["state"]["step"] == 4
    logs = []
    resumed, state = ctc_training.train(tiny, cache, None, cfg, tmp_path / "split", log=logs.append)
    assert logs == [f"resuming at step 4 of {state.step}"]
    for (name, a), (_, b) in zip(straight.state_dict().items(), resumed.state_dict().items()):
        torch.testing.assert_close(a, b, msg=name, rtol=0, atol=1e-6)
    with pytest.raises(ValueError, match="other settings"):
        ctc_training.train(tiny, cache, None, replace(cfg, lr=0.5), tmp_path / "split")
