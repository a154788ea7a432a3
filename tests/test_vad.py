"""--vad-chunks: Silero VAD's spans, chunks of at most 30 s decoded side by side, times put back.
--vad-filter: the long silences left out of sequential decoding, times put back."""

import sys
from pathlib import Path

import numpy as np
import pytest
import soundfile
import torch

import medusa_whisper
from medusa_whisper.transcription import chunked
from medusa_whisper.audio import vad
from medusa_whisper.transcription.vad_filter import KeptSpeech
from medusa_whisper.audio.files import load_audio
from medusa_whisper.cli import main

from tools.data import long_audio as make_long_audio

DATA = Path(__file__).parent / "data"

SECOND = vad.SAMPLE_RATE


def test_chunks_merge_spans_in_order_up_to_thirty_seconds():
    spans = [(0, 5 * SECOND), (6 * SECOND, 20 * SECOND), (21 * SECOND, 31 * SECOND), (40 * SECOND, 41 * SECOND)]
    assert vad.chunks(spans) == [(0, 20 * SECOND), (21 * SECOND, 41 * SECOND)]
    assert vad.chunks([]) == []
    with pytest.raises(ValueError, match="longer than a chunk"):
        vad.chunks([(0, 31 * SECOND)])


def test_speech_spans_find_the_speech_and_keep_the_thread_count():
    speech = load_audio(DATA / "real" / "jfk.flac")
    quiet = (np.random.default_rng(0).standard_normal(8 * SECOND) * 1e-3).astype(np.float32)
    samples = np.concatenate([quiet, speech, quiet])
    threads = torch.get_num_threads()
    spans = vad.speech_spans(samples)
    assert torch.get_num_threads() == threads  # silero_vad's import sets one thread; put back
    assert spans and all(0 <= s < e <= len(samples) and e - s <= 30 * SECOND for s, e in spans)
    assert [s for s, _ in spans] == sorted(s for s, _ in spans)
    pad = int(0.4 * SECOND) + SECOND // 10
    assert spans[0][0] >= len(quiet) - pad and spans[-1][1] <= len(quiet) + len(speech) + pad
    assert sum(e - s for s, e in spans) >= 0.7 * len(speech)


@pytest.fixture(scope="module")
def recording(tmp_path_factory):
    clips = make_long_audio.read_clips(sorted(DATA.glob("*.flac")) + [DATA / "real" / "jfk.flac"], None)
    samples, _ = make_long_audio.build(clips, minutes=1.5, seed=0, long_pause=12.0, long_pause_every=4)
    path = tmp_path_factory.mktemp("vad") / "talk.flac"
    soundfile.write(path, samples, SECOND, subtype="PCM_16")
    return path


@pytest.fixture(scope="module")
def int8_model():
    return medusa_whisper.load_model("tiny.en", device="cpu", compute_type="int8")


@pytest.mark.slow  # long form over a real recording
def test_chunks_decoded_side_by_side_give_each_chunk_its_own_result_on_the_recordings_clock(recording, int8_model):
    duration = len(load_audio(recording)) / SECOND
    result = medusa_whisper.transcribe(int8_model, str(recording), vad_chunks=True, batch_size=3,
                                       word_timestamps=True, verbose=None)
    pieces, offsets = chunked.cut(str(recording))
    assert result["medusa"]["chunks"] == len(pieces) >= 3
    segments = result["segments"]
    assert [s["id"] for s in segments] == list(range(len(segments)))
    assert all(0 <= s["start"] <= s["end"] <= duration + 0.5 for s in segments)
    assert [s["start"] for s in segments] == sorted(s["start"] for s in segments)
    words = [w for s in segments for w in s["words"]]
    assert words and all(0 <= w["start"] <= w["end"] <= duration + 0.5 for w in words)
    # each chunk alone, on its own clock: the same tokens, shifted by the chunk's start
    expected = []
    for piece, offset in zip(pieces, offsets):
        alone = medusa_whisper.transcribe(int8_model, piece, condition_on_previous_text=False, language="en",
                                          word_timestamps=True, verbose=None)
        expected += [(s["tokens"], round(s["start"] + offset, 3)) for s in alone["segments"]]
    assert [(s["tokens"], s["start"]) for s in segments] == expected
    assert "fellow Americans" in result["text"]


@pytest.mark.slow  # long form over a real recording
def test_cli_vad_chunks_writes_subtitles_in_order(recording, int8_model, tmp_path, monkeypatch, capsys):
    monkeypatch.setattr(medusa_whisper, "load_model", lambda *args, **kwargs: int8_model)
    out = tmp_path / "out"
    assert main(["transcribe", str(recording), "--vad-chunks", "--batch-size", "2", "-f", "srt", "-o", str(out),
                 "--verbose", "None"]) == 0
    srt = (out / "talk.srt").read_text()
    starts = [line.split(" --> ")[0] for line in srt.splitlines() if " --> " in line]
    assert len(starts) >= 5 and starts == sorted(starts)


def test_without_silero_vad_one_clear_line(recording, int8_model, tmp_path, monkeypatch, capsys):
    monkeypatch.setattr(medusa_whisper, "load_model", lambda *args, **kwargs: int8_model)
    monkeypatch.setitem(sys.modules, "silero_vad", None)  # as if not installed: import raises ImportError
    assert main(["transcribe", str(recording), "--vad-chunks", "-o", str(tmp_path / "out")]) != 0
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "silero-vad" in err[0], err  # said once, before any file is read
    assert not (tmp_path / "out").exists() or not list((tmp_path / "out").iterdir())


def test_kept_speech_maps_joined_times_back_to_the_recording():
    kept = KeptSpeech.of([(1 * SECOND, 3 * SECOND), (3 * SECOND, 4 * SECOND), (10 * SECOND, 12 * SECOND), (5, 5)])
    assert kept.spans == ((1 * SECOND, 4 * SECOND), (10 * SECOND, 12 * SECOND))  # touching spans joined, empty gone
    samples = np.arange(13 * SECOND, dtype=np.float32)
    joined = kept.joined(samples)
    assert len(joined) == 5 * SECOND and joined[3 * SECOND] == 10 * SECOND
    # joined 0-3 s is the recording's 1-4 s, joined 3-5 s its 10-12 s
    assert kept.original_seconds(0.5) == 1.5 and kept.original_seconds(3.5) == 10.5
    assert kept.original_seconds(3.0) == 10.0  # a start on the seam: the second span's start
    assert kept.original_seconds(3.0, is_end=True) == 4.0  # an end on the seam: the first span's end
    assert kept.original_seconds(0.0, is_end=True) == 1.0 and kept.original_seconds(5.0, is_end=True) == 12.0
    assert KeptSpeech.of([]).joined(samples).size == 0
    # a word across the seam stays in the span of its middle: joined 2.8-3.4 s is 10.0-10.4 s, not 3.8-10.4
    assert kept.word_seconds(2.8, 3.4) == pytest.approx((10.0, 10.4))
    assert kept.word_seconds(2.5, 3.2) == pytest.approx((3.5, 4.0))
    assert kept.word_seconds(0.5, 1.0) == pytest.approx((1.5, 2.0))


@pytest.fixture(scope="module")
def gap_recording(tmp_path_factory):
    """JFK (11 s), 40 s of near-silence, then JFK's first 6 s again."""
    speech = load_audio(DATA / "real" / "jfk.flac")
    quiet = (np.random.default_rng(1).standard_normal(40 * SECOND) * 1e-4).astype(np.float32)
    path = tmp_path_factory.mktemp("gap") / "gap.flac"
    soundfile.write(path, np.concatenate([speech, quiet, speech[: 6 * SECOND]]), SECOND, subtype="PCM_16")
    return path, len(speech) / SECOND


@pytest.mark.slow  # long form over a real recording
def test_vad_filter_skips_the_silence_and_keeps_the_recordings_clock(gap_recording, int8_model):
    path, speech_seconds = gap_recording
    gap_end = speech_seconds + 40
    plain = medusa_whisper.transcribe(int8_model, str(path), word_timestamps=True, verbose=None)
    result = medusa_whisper.transcribe(int8_model, str(path), vad_filter=True, word_timestamps=True, verbose=None)
    assert result["medusa"]["windows"] < plain["medusa"]["windows"]  # the silence cost no window
    assert result["medusa"]["audio_seconds"] == round(gap_end + 6, 3)
    assert result["text"].count("fellow Americans") == 2
    words = [w for s in result["segments"] for w in s["words"]]
    pad = 0.4 + 0.1
    # no word inside the silence; the second JFK's words where it is in the recording, not where it
    # is in the joined audio (about 40 s earlier)
    assert not [w for w in words if speech_seconds + pad < w["end"] and w["start"] < gap_end - pad]
    second = [w for w in words if w["start"] >= gap_end - pad]
    assert second and "And" in second[0]["word"] and second[0]["start"] < gap_end + 1.0
    assert all(w["end"] <= gap_end + 6 + 0.01 for w in words)
    assert [s["start"] for s in result["segments"]] == sorted(s["start"] for s in result["segments"])


@pytest.mark.slow  # long form over a real recording
def test_cli_vad_filter_writes_the_recordings_times_and_refuses_vad_chunks_with_it(gap_recording, int8_model,
                                                                                  tmp_path, monkeypatch, capsys):
    path, speech_seconds = gap_recording
    monkeypatch.setattr(medusa_whisper, "load_model", lambda *args, **kwargs: int8_model)
    out = tmp_path / "out"
    assert main(["transcribe", str(path), "--vad_filter", "-f", "srt", "-o", str(out), "--verbose", "None"]) == 0
    srt = (out / "gap.srt").read_text()
    assert "00:00:5" in srt  # the second JFK, near 51 s
    capsys.readouterr()
    assert main(["transcribe", str(path), "--vad-filter", "--vad-chunks", "-o", str(tmp_path / "other")]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "--vad-filter" in err[0], err
