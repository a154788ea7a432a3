"""tools/data/speech.py: exclusion of the evaluation texts, augmentation that changes the audio,
neural voices that say the text, and a small corpus's layout, disjoint splits and resume."""

import csv
import random
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import soundfile as sf

from medusa_whisper.training import blocks, windows
from tools.data import corpus as make_corpus
from tools.data import speech as make_speech
from tools.data import speech_text

ROOT = Path(__file__).resolve().parent.parent

JFK = ("And so my fellow Americans, ask not what your country can do for you, "
       "ask what you can do for your country.")
SONNET = "From fairest creatures we desire increase, That thereby beauty's rose might never die,"

_NEURAL_MISSING = make_speech.missing_requirements(["piper", "kokoro"])
_NEURAL_MISSING = [m for m in _NEURAL_MISSING if "python module" in m]
needs_neural = pytest.mark.skipif(bool(_NEURAL_MISSING), reason="; ".join(_NEURAL_MISSING))
needs_sox = pytest.mark.skipif(shutil.which("sox") is None or shutil.which("ffmpeg") is None,
                               reason="sox and ffmpeg are needed for augmentation")
_CORPUS_MISSING = make_speech.missing_requirements(list(make_speech.ENGINE_WEIGHTS))
needs_everything = pytest.mark.skipif(bool(_CORPUS_MISSING), reason="; ".join(_CORPUS_MISSING))


# -- the evaluation texts never enter training --------------------------------------------------

def test_exclusion_catches_equal_contained_and_overlapping_texts(tmp_path):
    (tmp_path / "real.csv").write_text(
        "audio,sentence,language\njfk.flac,\"" + JFK + "\",en\nalsa.flac,Front Left,en\n"
        "son.flac,\"" + SONNET + "\",en\n", encoding="utf-8")
    (tmp_path / "untranscribed.csv").write_text("audio,language\nx.flac,en\n", encoding="utf-8")
    exclusion = speech_text.Exclusion.from_dir(tmp_path)
    assert len(exclusion) == 3
    assert exclusion.hits(JFK.upper())  # case and punctuation do not matter
    assert exclusion.hits("He said: " + JFK + " Then he sat down.")  # contained
    assert exclusion.hits("Ask not what your country can do, my friends.")  # a 5-word run
    assert exclusion.hits("From fairest creatures we desire a great deal.")
    assert exclusion.hits("front left")  # a short transcript, when it is the whole utterance
    assert not exclusion.hits("The front left tyre was flat again this morning.")
    assert not exclusion.hits("Ask what the weather will do tomorrow.")


def test_exclusion_refuses_to_run_without_transcripts(tmp_path):
    with pytest.raises(ValueError, match="no transcripts"):
        speech_text.Exclusion.from_dir(tmp_path)


def test_the_pool_drops_evaluation_texts_and_held_out_texts():
    exclusion = speech_text.Exclusion([JFK, SONNET])
    docs = {("fortunes", "a"): ["A perfectly ordinary sentence about lunch.", JFK,
                                "Another sentence, quite unrelated to anything."],
            ("fortunes", "b"): [SONNET + " and so on.", "The last one of the lot is here."]}
    pool, dropped = speech_text.speech_pool("train", docs, exclusion, random.Random(0),
                                            banned=["The last one of the lot is here."])
    texts = [u.text for u in pool]
    assert dropped >= 2 and texts
    assert not any(exclusion.hits(t) for t in texts)
    assert not any("last one of the lot" in t for t in texts)
    assert any(u.source == "everyday" for u in pool)  # the everyday sentences join the pool


def test_everyday_sentences_have_numbers_and_questions_and_split_by_template():
    rng = random.Random(1)
    train = speech_text.template_utterances("train", 300, rng)
    held = speech_text.template_utterances("heldout", 100, rng)
    assert sum(any(c.isdigit() for c in u.text) for u in train) > 100
    assert sum("?" in u.text for u in train) > 30
    assert all(len(u.text.split()) <= 45 for u in train + held)
    # the splits have templates of their own, so no held-out sentence is a train template filled in anew
    assert not set(speech_text.TRAIN_TEMPLATES) & set(speech_text.HELDOUT_TEMPLATES)
    assert not {u.text for u in train} & {u.text for u in held}


def test_voices_of_the_splits_are_disjoint_and_blends_count_as_their_styles():
    train, held = make_speech.split_voices("train"), make_speech.split_voices("heldout")
    for engine in make_speech.ENGINE_WEIGHTS:
        assert not set(train[engine]) & set(held[engine]), engine
    assert train["piper"] and train["kokoro"] and held["kokoro"]
    assert make_speech.voice_speakers("kokoro", "0.70*jf_alpha+0.30*jm_kumo") == ["jf_alpha", "jm_kumo"]
    assert make_speech.voice_speakers("espeak-ng", "en-gb+f5") == ["en-gb+f5"]
    rng = random.Random(0)
    for _ in range(200):  # a training blend is made of training styles only
        voice, *_ = make_speech.draw_voice("kokoro", train["kokoro"], rng)
        assert set(make_speech.voice_speakers("kokoro", voice)) <= set(train["kokoro"])


# -- augmentation -----------------------------------------------------------------------------------

def _speechlike(seconds=2.0, seed=0):
    """A harmonic tone with a syllable-rate envelope and pauses, at 16 kHz."""
    t = np.arange(int(seconds * 16000)) / 16000
    f0 = 140 + 30 * np.sin(2 * np.pi * 0.7 * t)
    phase = 2 * np.pi * np.cumsum(f0) / 16000
    tone = sum(np.sin(k * phase) / k for k in range(1, 30))
    envelope = np.clip(np.sin(2 * np.pi * 3 * t), 0, None) * (t % 1.0 < 0.8)
    return 0.3 * tone * envelope / np.abs(tone).max()


def _band_energy(x, lo, hi):
    spectrum = np.abs(np.fft.rfft(x)) ** 2
    freqs = np.fft.rfftfreq(len(x), 1 / 16000)
    return spectrum[(freqs >= lo) & (freqs < hi)].sum() / spectrum.sum()


@needs_sox
@pytest.mark.parametrize("aug", [
    make_speech.Augment(speed=0.9), make_speech.Augment(reverb="60/80/10"),
    make_speech.Augment(noise="pink", snr_db=10.0), make_speech.Augment(telephone=True),
    make_speech.Augment(codec="mp3-24k"), make_speech.Augment(codec="ogg-q0"), make_speech.Augment(codec="opus-12k"),
], ids=lambda a: a.label() + (f"-{a.codec}" if a.codec else ""))
def test_each_augmentation_changes_the_audio(aug, tmp_path):
    clean = _speechlike()
    out = make_speech.apply_augment(clean, aug, seed=3, tmp=tmp_path)
    assert out.ndim == 1 and np.abs(out).max() <= 0.97 + 1e-6
    if aug.speed != 1.0:
        assert len(out) == pytest.approx(len(clean) / aug.speed, rel=0.01)
        return
    assert abs(len(out) - len(clean)) < 0.25 * 16000 or aug.reverb  # codecs pad a little; reverb adds a tail
    n = min(len(out), len(clean))
    residual = out[:n] / np.abs(out[:n]).max() - clean[:n] / np.abs(clean).max()
    assert np.sqrt((residual ** 2).mean()) > 0.01, "the augmentation left the audio as it was"
    if aug.telephone:
        assert _band_energy(out, 3600, 8000) < 0.01 * _band_energy(clean, 3600, 8000)
        assert _band_energy(out, 0, 250) < 0.2 * _band_energy(clean, 0, 250)
    if aug.noise:  # the noise fills the pauses
        assert np.abs(out[int(0.85 * 16000):int(0.95 * 16000)]).mean() > 1e-3


def test_augmentation_draws_are_seeded_and_keep_a_clean_share():
    a = [make_speech.draw_augment(random.Random(f"x{i}")) for i in range(2000)]
    b = [make_speech.draw_augment(random.Random(f"x{i}")) for i in range(2000)]
    assert a == b
    labels = [x.label() for x in a]
    assert 0.2 < labels.count("clean") / len(labels) < 0.3
    for part in ("speed", "reverb", "noise", "telephone", "codec"):
        assert any(part in lab.split("+") for lab in labels), part
    assert all(0.9 <= x.speed <= 1.1 for x in a)
    assert {x.snr_db for x in a if x.noise} == set(make_speech.SNRS_DB)


# -- neural voices ----------------------------------------------------------------------------------

NEURAL_TEXT = "The train to Boston leaves at half past seven, so please don't be late."


@pytest.fixture(scope="module")
def neural_clips(tmp_path_factory):
    out = tmp_path_factory.mktemp("neural")
    clips = {}
    for engine, voice, variant in (("piper", "en_US-joe-medium", "0.67/0.80"), ("kokoro", "jm_kumo", "en-us"),
                                   ("kokoro", "0.50*jf_alpha+0.50*jf_nezumi", "en-gb")):
        job = make_speech.Job(str(out / f"{engine}_{len(clips)}.flac"), NEURAL_TEXT, "everyday", engine, voice,
                              1.0, variant, 0.0, make_speech.Augment())
        job_, seconds, error = make_speech.synthesise(job)
        assert error == "", f"{engine}/{voice}: {error}"
        clips[f"{engine}/{voice}"] = (Path(job.path), seconds)
    return clips


@needs_neural
@pytest.mark.slow  # the neural voices, synthesised
def test_neural_voices_write_16k_mono_speech_of_plausible_length(neural_clips):
    for name, (path, seconds) in neural_clips.items():
        info = sf.info(str(path))
        assert (info.samplerate, info.channels) == (16000, 1), name
        assert 2.5 < seconds < 8.0, f"{name}: {seconds:.1f} s for 14 words"
        audio, _ = sf.read(str(path))
        assert np.abs(audio).max() > 0.3, f"{name}: near silence"


@needs_neural
@pytest.mark.slow
def test_neural_voices_say_the_text(neural_clips):
    """tiny.en (real weights) hears the sentence in each voice's audio."""
    import jiwer
    import medusa_whisper
    from whisper.normalizers import EnglishTextNormalizer

    model = medusa_whisper.load_model("tiny.en", device="cpu")
    normalise = EnglishTextNormalizer()
    for name, (path, _) in neural_clips.items():
        text = model.transcribe(str(path), language="en", fp16=False)["text"]
        wer = jiwer.wer(normalise(NEURAL_TEXT), normalise(text))
        assert wer <= 0.2, f"{name}: heard {text!r} (WER {wer:.2f})"


# -- a small corpus ---------------------------------------------------------------------------------

def _read(path):
    with path.open(newline="", encoding="utf-8") as f:
        reader = csv.DictReader(f)
        return reader.fieldnames, list(reader)


@pytest.mark.slow
@needs_everything
def test_a_small_corpus_layout_splits_resume_and_exclusion(tmp_path):
    out, real = tmp_path / "speech", tmp_path / "real"
    real.mkdir()
    # an "evaluation" transcript that is also one of the fortunes' utterances must be dropped
    pool, _ = speech_text.speech_pool("train", make_corpus.split_documents()["train"], speech_text.Exclusion([JFK]),
                                      random.Random("0-text-train"))
    victim = pool[0].text
    with (real / "real.csv").open("w", newline="", encoding="utf-8") as f:
        csv.writer(f).writerows([["audio", "sentence", "language"], ["a.flac", JFK, "en"], ["b.flac", victim, "en"]])
    argv = [sys.executable, "-m", "tools.data", "speech", "--out", str(out), "--real", str(real),
            "--train-minutes", "1.2", "--heldout-minutes", "0.4", "--ready-minutes", "0.5"]
    run = subprocess.run(argv, capture_output=True, text=True, cwd=ROOT)
    assert run.returncode == 0, run.stderr[-2000:]
    assert (out / "READY").exists() and (out / "DONE").exists() and (out / "SUMMARY.md").exists()
    splits = {}
    for split, minutes in (("train", 1.2), ("heldout", 0.4)):
        columns, rows = _read(out / f"{split}.csv")
        assert columns[:6] == make_corpus.COLUMNS and "augment" in columns and "codec" in columns
        assert sum(float(r["seconds"]) for r in rows) >= minutes * 60
        for row in rows:
            assert row["audio"].startswith(f"{split}/") and row["language"] == "en" and row["sentence"]
            info = sf.info(str(out / row["audio"]))
            assert (info.samplerate, info.channels) == (16000, 1)
            assert abs(info.duration - float(row["seconds"])) < 0.01
        splits[split] = rows
    make_speech.check_disjoint(splits)
    exclusion = speech_text.Exclusion([JFK, victim])
    assert not any(exclusion.hits(r["sentence"]) for rows in splits.values() for r in rows)
    assert {r["engine"] for r in splits["train"]} & set(make_speech.NEURAL_ENGINES)

    # a second run is a resume: the same CSVs, nothing re-synthesised
    before = {s: (out / f"{s}.csv").read_text() for s in make_speech.SPLITS}
    stamps = {p: p.stat().st_mtime_ns for p in out.rglob("*.flac")}
    assert subprocess.run(argv, capture_output=True, cwd=ROOT).returncode == 0
    assert {s: (out / f"{s}.csv").read_text() for s in make_speech.SPLITS} == before
    assert {p: p.stat().st_mtime_ns for p in out.rglob("*.flac")} == stamps


def test_a_build_in_hours_goes_on_until_train_hours_finds_its_whole_blocks(tmp_path, monkeypatch):
    """A block ends on the utterance that completes its hour, so 2 h of rows hold one whole block and
    most of another: `make speech HOURS=2` then `train --hours 2` (make drafts) failed. The build goes
    on until the rows make the blocks the same number of hours asks for, counted as training cuts them."""
    jobs = [make_speech.Job(str(tmp_path / f"{i}.flac"), "three words here", "fortunes", "espeak-ng", "en", 1.0, "",
                            0, make_speech.draw_augment(random.Random(i))) for i in range(20)]
    monkeypatch.setattr(make_speech, "synthesise", lambda job, threads=1: (job, 2500.0, ""))
    monkeypatch.setattr(make_speech, "write_csv", lambda *args: None)
    by_minutes, finished = make_speech.build("train", 120, tmp_path, iter(jobs), 1, 1)
    assert finished and len(by_minutes) == 3  # 7,500 s: the minutes, but one whole block
    by_blocks, finished = make_speech.build("train", 120, tmp_path, iter(jobs), 1, 1, whole_blocks=2)
    assert finished and len(by_blocks) == 4
    for rows, whole in ((by_minutes, 1), (by_blocks, 2)):
        cut, _ = blocks.cut([windows.Utterance(path=job.path, seconds=s) for job, s in rows])
        assert len(cut) == whole
        blocks.select(cut, whole)
    with pytest.raises(windows.DataError):
        blocks.select(blocks.cut([windows.Utterance(path=j.path, seconds=s) for j, s in by_minutes])[0], 2)


def test_missing_transcripts_is_one_line_and_exit_1(tmp_path):
    run = subprocess.run([sys.executable, "-m", "tools.data", "speech", "--out", str(tmp_path / "o"),
                          "--real", str(tmp_path), "--engines", "espeak-ng"], capture_output=True, text=True, cwd=ROOT)
    assert run.returncode == 1
    assert run.stderr.count("\n") == 1 and "make_speech: error:" in run.stderr and "Traceback" not in run.stderr
    if not make_speech.missing_requirements(["espeak-ng"]):
        assert "no transcripts" in run.stderr


@needs_everything
def test_a_build_stopped_by_max_hours_is_not_done(tmp_path):
    """--max-hours ends a build short of its minutes without DONE, so `make drafts` (which skips
    `make speech` once DONE is there) does not take the set as finished; the same command resumes."""
    out, real = tmp_path / "speech", tmp_path / "real"
    real.mkdir()
    with (real / "real.csv").open("w", newline="", encoding="utf-8") as f:
        csv.writer(f).writerows([["audio", "sentence", "language"], ["a.flac", JFK, "en"]])
    out.mkdir()
    (out / "DONE").write_text("from an earlier, smaller build\n")
    argv = [sys.executable, "-m", "tools.data", "speech", "--out", str(out), "--real", str(real),
            "--train-minutes", "1.2", "--heldout-minutes", "0.4", "--max-hours", "1e-9"]
    run = subprocess.run(argv, capture_output=True, text=True, cwd=ROOT)
    assert run.returncode == 0, run.stderr[-2000:]
    assert "no DONE" in run.stdout
    assert not (out / "DONE").exists() and not (out / "READY").exists()
    assert not list(out.rglob("*.flac"))
