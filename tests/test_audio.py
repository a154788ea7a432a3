"""load_audio: real clips decode to mono 16 kHz float32; every kind of bad input is one AudioError line
that names the file."""

import os
import shutil
import subprocess
from pathlib import Path

import numpy as np
import pytest
import soundfile
import torch
import whisper

from medusa_whisper.audio.files import audio_duration, load_audio, open_audio
from medusa_whisper.errors import AudioError

DATA = Path(__file__).parent / "data"
HAS_FFMPEG = shutil.which("ffmpeg") is not None


def tone(seconds: float = 1.0, rate: int = 16000, amplitude: float = 0.3) -> np.ndarray:
    t = np.arange(int(seconds * rate)) / rate
    return (amplitude * np.sin(2 * np.pi * 440 * t)).astype(np.float32)


def assert_audio_error(path, *words):
    with pytest.raises(AudioError) as info:
        load_audio(path)
    message = str(info.value)
    assert path.name in message
    assert "\n" not in message
    for word in words:
        assert word in message
    return message


# ---------------------------------------------------------------- good inputs


@pytest.mark.parametrize("clip", sorted(DATA.glob("*.flac")), ids=lambda p: p.name)
def test_flac_clips_are_mono_float32_at_16k(clip):
    audio = load_audio(clip)
    assert audio.dtype == np.float32 and audio.ndim == 1
    assert len(audio) == soundfile.info(clip).frames
    assert audio_duration(audio) == pytest.approx(soundfile.info(clip).duration)


@pytest.mark.skipif(not HAS_FFMPEG, reason="whisper.load_audio needs ffmpeg")
def test_flac_matches_whisper_load_audio_exactly():
    clip = DATA / "espeak_weather.flac"
    np.testing.assert_array_equal(load_audio(clip), whisper.load_audio(str(clip)))


def test_stereo_44k_comes_back_mono_16k():
    info = soundfile.info(DATA / "stereo_44k.wav")
    assert (info.channels, info.samplerate) == (2, 44100)
    audio = load_audio(DATA / "stereo_44k.wav")
    assert audio.dtype == np.float32 and audio.ndim == 1
    assert audio_duration(audio) == pytest.approx(info.duration, abs=1 / 16000)
    # the file is flite_train.flac upsampled into two equal channels: resampling back must find it again
    reference = load_audio(DATA / "flite_train.flac")
    assert len(audio) == len(reference)
    assert np.corrcoef(audio, reference)[0, 1] > 0.999


def test_arrays_and_tensors_pass_through_as_float32():
    samples = tone()
    np.testing.assert_array_equal(load_audio(samples.astype(np.float64)), samples)
    from_tensor = load_audio(torch.from_numpy(samples))
    assert isinstance(from_tensor, np.ndarray) and from_tensor.dtype == np.float32
    np.testing.assert_array_equal(from_tensor, samples)
    assert audio_duration(torch.from_numpy(samples)) == pytest.approx(1.0)


def test_array_with_nan_is_rejected():
    samples = tone()
    samples[5] = np.nan
    with pytest.raises(AudioError, match="NaN"):
        load_audio(samples)


def test_other_rate_is_resampled(tmp_path):
    path = tmp_path / "tone_8k.wav"
    soundfile.write(path, tone(2.0, rate=8000), 8000)
    audio = load_audio(path)
    assert len(audio) == 32000
    assert audio_duration(audio) == pytest.approx(2.0)


@pytest.mark.parametrize("fmt,subtype,suffix", [("OGG", "VORBIS", ".ogg"), ("MP3", "MPEG_LAYER_III", ".mp3")])
def test_lossy_round_trip(tmp_path, fmt, subtype, suffix):
    if subtype not in soundfile.available_subtypes(fmt):
        pytest.skip(f"this libsndfile cannot write {fmt}/{subtype}")
    path = tmp_path / f"tone{suffix}"
    samples = tone(2.0)
    try:
        soundfile.write(path, samples, 16000, format=fmt, subtype=subtype)
    except soundfile.LibsndfileError as e:
        pytest.skip(f"this libsndfile cannot write {fmt}: {e}")
    audio = load_audio(path)
    assert audio.dtype == np.float32 and audio.ndim == 1
    assert audio_duration(audio) == pytest.approx(2.0, abs=0.1)  # encoders pad a little
    peak = np.abs(audio).max()
    assert 0.2 < peak < 0.4


@pytest.mark.skipif(not HAS_FFMPEG, reason="ffmpeg not installed")
def test_m4a_through_ffmpeg(tmp_path):
    clip = DATA / "flite_train.flac"
    path = tmp_path / "clip.m4a"
    subprocess.run(["ffmpeg", "-nostdin", "-loglevel", "error", "-i", str(clip), "-c:a", "aac", str(path)],
                   check=True)
    with pytest.raises(soundfile.LibsndfileError):
        soundfile.info(path)  # so it really is ffmpeg that decodes it
    audio = load_audio(path)
    reference = load_audio(clip)
    assert audio.dtype == np.float32 and audio.ndim == 1
    assert audio_duration(audio) == pytest.approx(audio_duration(reference), abs=0.1)


# ---------------------------------------------------------------- bad inputs


def test_missing_file(tmp_path):
    assert_audio_error(tmp_path / "missing.wav", "no such file")


def test_directory(tmp_path):
    folder = tmp_path / "folder.wav"
    folder.mkdir()
    assert_audio_error(folder, "directory")


def test_empty_file(tmp_path):
    path = tmp_path / "empty.wav"
    path.write_bytes(b"")
    assert_audio_error(path, "empty")


def test_random_bytes(tmp_path):
    path = tmp_path / "noise_bytes.wav"
    path.write_bytes(np.random.default_rng(0).integers(0, 256, 4000, dtype=np.uint8).tobytes())
    assert_audio_error(path, "not a readable audio file")


def test_random_bytes_without_ffmpeg(tmp_path, monkeypatch):
    monkeypatch.setattr(shutil, "which", lambda name: None)
    path = tmp_path / "noise_bytes.wav"
    path.write_bytes(np.random.default_rng(0).integers(0, 256, 4000, dtype=np.uint8).tobytes())
    assert_audio_error(path, "not a readable audio file", "ffmpeg")


def test_zero_frames(tmp_path):
    path = tmp_path / "zero_frames.wav"
    soundfile.write(path, np.zeros((0, 1), dtype=np.float32), 16000, subtype="PCM_16")
    assert path.stat().st_size > 0  # a header, no samples
    assert_audio_error(path, "zero length")


@pytest.mark.parametrize("bad", [np.nan, np.inf])
def test_non_finite_samples(tmp_path, bad):
    samples = tone()
    samples[100:110] = bad
    path = tmp_path / "not_finite.wav"
    soundfile.write(path, samples, 16000, subtype="FLOAT")
    assert_audio_error(path, "NaN or infinite")


def test_silence(tmp_path):
    path = tmp_path / "silence.wav"
    soundfile.write(path, np.zeros(16000, dtype=np.float32), 16000, subtype="PCM_16")
    assert_audio_error(path, "only silence")


def test_quiet_speech_is_not_silence(tmp_path):
    path = tmp_path / "quiet.wav"
    soundfile.write(path, tone(amplitude=0.003), 16000, subtype="PCM_16")  # -50 dBFS
    assert len(load_audio(path)) == 16000


# ---------------------------------------------------------------- leading silence, odd files


def test_leading_digital_silence_is_counted_not_stored(tmp_path):
    path = tmp_path / "late_start.flac"
    speech = tone(0.5)
    soundfile.write(path, np.concatenate([np.zeros(16000 * 700, np.float32), speech]), 16000)  # past the spill point
    samples, _ = soundfile.read(path, dtype="float32")
    with open_audio(path) as audio:
        assert len(audio) == len(samples)
        assert audio._zeros >= 16000 * 700 and audio._file is None  # nothing written to disk
        for start, stop in ((0, 10), (16000 * 700 - 5, 16000 * 700 + 5), (len(samples) - 7, len(samples) + 3)):
            np.testing.assert_array_equal(audio.read(start, stop), samples[start:stop])


@pytest.mark.parametrize("content, words", [
    (b"Meeting notes: bring the slides\n" * 30, "it holds text"),
    (b"<!DOCTYPE html><html>404</html>\n" * 5, "web page"),
    (b"\x89PNG\r\n\x1a\n" + bytes(range(256)) * 4, "PNG image"),
    (bytes(4096), "only zero bytes"),
    (b"RIF", "too short"),
])
def test_a_file_that_is_not_audio_says_what_it_is(tmp_path, content, words):
    path = tmp_path / "notes.mp3"
    path.write_bytes(content)
    message = assert_audio_error(path, words)
    assert "does not exist" not in message  # libsndfile's wrong words for a file it cannot place


def test_not_a_regular_file(tmp_path):
    fifo = tmp_path / "pipe.wav"
    os.mkfifo(fifo)
    assert_audio_error(fifo, "FIFO")
    link = tmp_path / "link.wav"
    link.symlink_to(tmp_path / "gone.wav")
    assert_audio_error(link, "broken symbolic link")


def test_gsm_in_wav_is_read_although_it_cannot_seek(tmp_path):
    path = tmp_path / "gsm.wav"
    soundfile.write(path, tone(1.0, rate=8000), 8000, subtype="GSM610")
    assert abs(len(load_audio(path)) - 16000) < 1000  # GSM frames of 160 samples, resampled


def test_absurd_sample_values_are_damaged_data(tmp_path):
    path = tmp_path / "huge.wav"
    soundfile.write(path, tone() * 1e30, 16000, subtype="FLOAT")
    assert_audio_error(path, "outside the range")
