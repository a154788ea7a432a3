"""Long audio: the spectrogram a window at a time, audio read by range, and long-form output equal
to whisper.transcribe's, through the real CLI with every output format.

The long recording is built by tools/data/long_audio.py from the bundled clips: five minutes of
speech with pauses of 0.2-3 s and a 40-s silence every 12 clips (whole windows without speech).
"""

import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import soundfile
import torch
import whisper
from whisper.audio import N_SAMPLES

import medusa_whisper
from medusa_whisper.audio import files as audio_module
from medusa_whisper.audio.files import AudioSamples, load_audio, open_audio
from medusa_whisper.cli import main
from medusa_whisper.audio.mel import SCAN_FRAMES, LogMelFrames

from tools.data import long_audio as make_long_audio

DATA = Path(__file__).parent / "data"

SEGMENT_KEYS = ("seek", "start", "end", "text", "tokens", "temperature")


class CountingSamples(AudioSamples):
    """Remembers the longest range ever read: the memory a window costs, not the file."""

    def __init__(self, array):
        super().__init__("counting", array)
        self.longest_read = 0

    def read(self, start, stop):
        self.longest_read = max(self.longest_read, stop - start)
        return super().read(start, stop)


@pytest.mark.parametrize("n_samples", [150, 16000 * 7, 16000 * 200 + 123, 16000 * 290 + 5])
def test_mel_frames_are_bitwise_whispers(n_samples):
    """The scan's first SCAN_FRAMES frames are kept and served; past them each window computes its own."""
    rng = np.random.default_rng(n_samples)
    audio = (rng.standard_normal(n_samples) * 0.1).astype(np.float32)
    audio[: n_samples // 3] *= 0.01  # a quiet stretch, so the global clamp matters
    full = whisper.log_mel_spectrogram(audio, 80, padding=N_SAMPLES)
    frames = LogMelFrames(CountingSamples(audio), 80)
    assert frames.n_frames == full.shape[-1]
    assert frames._first.shape[1] == min(frames.n_frames, SCAN_FRAMES)
    ranges = [(0, 3000), (0, frames.n_frames), (frames.n_frames - 3000, frames.n_frames), (1, 2), (5, 9), (100, 131),
              (777, 3777), (SCAN_FRAMES - 3000, SCAN_FRAMES), (SCAN_FRAMES - 1500, SCAN_FRAMES + 1500)]
    for start, stop in ranges:
        got = frames.frames(start, stop)
        assert torch.equal(got, full[:, max(start, 0) : stop]), (start, stop)


def test_memory_per_window_does_not_grow_with_length():
    audio = (np.random.default_rng(0).standard_normal(16000 * 600) * 0.1).astype(np.float32)  # 10 min
    samples = CountingSamples(audio)
    frames = LogMelFrames(samples, 80)
    frames.frames(20000, 23000)
    assert samples.longest_read <= SCAN_FRAMES * 160 + 400  # the scan's chunk, not the 10 minutes


def test_long_file_is_spilled_to_disk_and_read_back_exactly(tmp_path):
    path = tmp_path / "two_minutes.flac"
    audio = (np.random.default_rng(1).standard_normal(16000 * 120) * 0.1).astype(np.float32)
    soundfile.write(path, audio, 16000, subtype="PCM_24")
    in_memory = load_audio(path)
    with open_audio(path, spill_seconds=10) as samples:
        assert samples._array is None, "a file past spill_seconds must not stay in memory"
        assert len(samples) == len(in_memory)
        np.testing.assert_array_equal(samples.read(0, len(samples)), in_memory)
        np.testing.assert_array_equal(samples.read(-5, 100), in_memory[:100])
        np.testing.assert_array_equal(samples.read(len(samples) - 10, len(samples) + 10), in_memory[-10:])


def test_resampling_block_by_block_equals_resampling_at_once(tmp_path, monkeypatch):
    import soxr

    path = tmp_path / "tone_22k.wav"
    t = np.arange(22050 * 5) / 22050
    soundfile.write(path, (0.3 * np.sin(2 * np.pi * 440 * t)).astype(np.float32), 22050)
    at_once = soxr.resample(soundfile.read(path, dtype="float32")[0], 22050, 16000, quality="HQ")
    monkeypatch.setattr(audio_module, "BLOCK_SECONDS", 0.5)  # ten blocks
    blocked = load_audio(path)
    assert len(blocked) == len(at_once)
    np.testing.assert_allclose(blocked, at_once, atol=1e-4)


@pytest.fixture(scope="module")
def long_recording(tmp_path_factory):
    clips = make_long_audio.read_clips(sorted(DATA.glob("*.flac")), None)
    samples, _ = make_long_audio.build(clips, minutes=5, seed=0, long_pause_every=12)
    path = tmp_path_factory.mktemp("long") / "long_5min.flac"
    soundfile.write(path, samples, 16000, subtype="PCM_16")
    return path


def test_repeated_recording_says_every_clip_several_times_in_a_row():
    clips = [(path, path.stem) for path in sorted(DATA.glob("*.flac"))[:3]]
    samples, sentences = make_long_audio.build(clips, minutes=0.5, seed=0, long_pause_every=0, repeat=3)
    assert len(samples) >= 30 * 16000
    assert len(sentences) % 3 == 0 and len(sentences) >= 6
    for first in range(0, len(sentences), 3):
        assert len(set(sentences[first:first + 3])) == 1
    assert len(set(sentences[::3])) > 1


@pytest.fixture(scope="module")
def block_model():
    return medusa_whisper.load_model("tiny.en-medusa-block", device="cpu")


def _segments(result):
    return [{k: s[k] for k in SEGMENT_KEYS} for s in result["segments"]]


@pytest.mark.slow
def test_cli_long_file_equals_whisper_transcribe_and_writes_every_format(long_recording, block_model, tmp_path,
                                                                         monkeypatch):
    audio = load_audio(long_recording)
    assert len(audio) >= 5 * 60 * 16000
    torch.manual_seed(0)  # fallback windows sample; both runs draw the same numbers
    expected = whisper.transcribe(block_model, audio, fp16=False)

    monkeypatch.setattr(medusa_whisper, "load_model", lambda name, device=None, draft=None, **options: block_model)
    out = tmp_path / "out"
    torch.manual_seed(0)
    assert main(["transcribe", str(long_recording), "--output-format", "all", "--output-dir", str(out)]) == 0

    record = json.loads((out / "long_5min.json").read_text())
    assert _segments(record) == _segments(expected)
    assert record["text"] == expected["text"]  # whisper's json keeps its leading space
    assert len(expected["segments"]) >= 20
    assert record["windows"] >= 10 and record["tokens_per_step"] > 1.0
    # the long silences are skipped as whisper skips them: no segment starts inside one
    assert sorted(p.name for p in out.iterdir()) == [f"long_5min.{f}" for f in ("json", "srt", "tsv", "txt", "vtt")]
    srt = (out / "long_5min.srt").read_text()
    assert srt.count(" --> ") == len([s for s in expected["segments"] if s["text"].strip()])
    assert (out / "long_5min.vtt").read_text().startswith("WEBVTT")
    assert (out / "long_5min.tsv").read_text().splitlines()[0] == "start\tend\ttext"
    assert (out / "long_5min.txt").read_text().split() == " ".join(
        s["text"].strip() for s in expected["segments"]).split()


@pytest.mark.slow
def test_word_timestamps_and_forced_fallback_equal_whispers(long_recording, block_model, monkeypatch):
    # whisper's own product route: a sampled retry and a strict log-probability threshold turn the
    # last bits of a logit into different text, and the route measured fastest on a CPU (routes.py)
    # sums in another order than whisper's F.linear (this failed on an AVX-512 EPYC whose cache chose
    # W @ x.T); greedy equality with whisper does not need this, and is tested without it
    monkeypatch.setenv("MEDUSA_WHISPER_ROUTES", "whisper")
    audio = load_audio(long_recording)[: 16000 * 75]
    # a strict threshold forces fallbacks; two temperatures keep the sampled retries few
    options = dict(word_timestamps=True, logprob_threshold=-0.35, temperature=(0.0, 0.2), language="en")
    torch.manual_seed(0)
    expected = whisper.transcribe(block_model, audio, fp16=False, **options)
    torch.manual_seed(0)
    result = block_model.transcribe(audio, **options)
    assert _segments(result) == _segments(expected)
    fallen_back = [s["seek"] for s in expected["segments"] if s["temperature"] > 0]
    assert fallen_back, "the threshold was meant to force at least one fallback"
    assert result["medusa"]["fallback_windows"] >= 1
    words = [(w["word"], w["start"], w["end"]) for s in result["segments"] for w in s["words"]]
    assert words == [(w["word"], w["start"], w["end"]) for s in expected["segments"] for w in s["words"]]


@pytest.mark.slow
def test_an_int8_tree_with_forced_fallback_equals_int8_plain_decoding_from_the_same_seed(long_recording,
                                                                                      measure_afresh, monkeypatch):
    """Lossless at int8 over a whole long-form run, the sampled fallback windows included: a branching
    EAGLE tree, in a process that measures its kernel choices on first use (mid-run, as a fresh
    install does), writes the segments int8 plain decoding writes from the same seed. This once
    failed on an 8-minute recording (23 of 93 segments differed from the first sampled window on):
    the int8 kernel choices drew their random timing inputs from the global generator that the
    fallback samples from.
    The plain run's choices are measured before it (so that it draws nothing mid-run); the tree's
    run measures them afresh, mid-run, but keeps those the plain run used: timed twice, a choice
    between kernels within a few percent of each other may differ, and each decides a row's bits
    (a prompt rounded by another kernel may part the runs' tokens in any mode)."""
    from medusa_whisper.step import routes as routes_module

    audio = load_audio(long_recording)[: 16000 * 75]
    # a strict threshold forces fallbacks; two temperatures keep the sampled retries few
    options = dict(logprob_threshold=-0.35, temperature=(0.0, 0.2), language="en")
    routes = measure_afresh()
    table = routes.table()
    plain = medusa_whisper.load_model("tiny.en", device="cpu", compute_type="int8")
    plain.transcribe(audio[: 16000 * 40], mode="off", language="en", temperature=0.0)  # two windows: a prompt
    measured = table.measured
    torch.manual_seed(0)
    expected = plain.transcribe(audio, mode="off", **options)
    assert any(s["temperature"] > 0 for s in expected["segments"]), "the threshold was meant to force a fallback"
    assert table.measured == measured, "the plain run used choices measured before it"

    kept = dict(table.choices)
    table.choices.clear()
    table._known.clear()
    routes = measure_afresh()
    timed = routes_module.RouteTable._timed

    def timed_keeping_the_plain_choice(self, name, measure):
        entry = timed(self, name, measure)  # measured here, mid-run: its random inputs drawn, its kernels run
        self.choices[name] = kept.get(name, entry)
        return self.choices[name]

    monkeypatch.setattr(routes_module.RouteTable, "_timed", timed_keeping_the_plain_choice)
    measured = table.measured
    tree = medusa_whisper.load_model("tiny.en-eagle", device="cpu", compute_type="int8")
    torch.manual_seed(0)
    result = tree.transcribe(audio, mode="lossless", tree_width=2, tree_nodes=4, **options)
    assert routes.table() is table and table.measured > measured, "choices were measured during the run"
    assert _segments(result) == _segments(expected)
    assert result["medusa"]["fallback_windows"] >= 1 and result["medusa"]["tokens_per_step"] > 1.0


@pytest.mark.slow  # long form, the CLI in its own process
def test_initial_prompt_is_carried_into_every_window(block_model, monkeypatch):
    import importlib

    transcribe_module = importlib.import_module("medusa_whisper.transcription.longform")  # the module, not the function

    prompts = []
    original = transcribe_module.decode

    def recording_decode(model, mel, options, **kwargs):
        prompts.append(list(options.prompt or []))
        return original(model, mel, options, **kwargs)

    monkeypatch.setattr(transcribe_module, "decode", recording_decode)
    audio = load_audio(DATA / "espeak_weather.flac")
    two_windows = np.concatenate([audio, np.zeros(16000 * 25, np.float32), audio])
    block_model.transcribe(two_windows, initial_prompt="Weather report.", carry_initial_prompt=True, temperature=0.0)
    tokenizer = whisper.tokenizer.get_tokenizer(False)
    prompt_tokens = tokenizer.encode(" Weather report.")
    assert len(prompts) >= 2
    assert all(p[: len(prompt_tokens)] == prompt_tokens for p in prompts)
    assert len(prompts[1]) > len(prompt_tokens), "the second window also sees the first window's text"


@pytest.mark.slow  # long form, the CLI in its own process
def test_module_entry_point_transcribes_with_word_timestamps_to_srt(tmp_path):
    out = tmp_path / "out"
    proc = subprocess.run([sys.executable, "-m", "medusa_whisper.cli", "transcribe", str(DATA / "flite_train.flac"),
                           "--model", "tiny.en", "--word-timestamps", "--output-format", "srt",
                           "--output-dir", str(out), "--threads", "2"],
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr
    srt = (out / "flite_train.srt").read_text()
    assert "00:00:0" in srt and " --> " in srt
