"""Reading audio files as whisper wants them: float32, mono, 16 kHz, checked for the usual mistakes.

soundfile (libsndfile) reads WAV, FLAC, OGG and MP3 without a subprocess; ffmpeg, when it is on
PATH, covers the other containers (m4a, mp4, webm, ...). Every problem with an input, from a typo
in its name to a file of digital silence, becomes one ``AudioError`` line that names the file.
"""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path
from typing import Tuple, Union

import numpy as np
import soundfile as sf
import soxr
import torch

from .errors import AudioError

SAMPLE_RATE = 16000
# Peak amplitude (full scale = 1.0) below which a file counts as digital silence; -80 dBFS, below
# the quietest 16-bit dither, so a quiet but real recording passes.
SILENCE_PEAK = 1e-4

AudioInput = Union[str, os.PathLike, np.ndarray, torch.Tensor]


def check_audio_path(path: Union[str, os.PathLike]) -> Path:
    """The checks that need no decoding: the file exists, is a file, and is not empty."""
    path = Path(path)
    if not path.exists():
        raise AudioError(f"{path}: no such file")
    if path.is_dir():
        raise AudioError(f"{path}: is a directory, not an audio file")
    if path.stat().st_size == 0:
        raise AudioError(f"{path}: file is empty (0 bytes)")
    return path


def load_audio(audio: AudioInput, sample_rate: int = SAMPLE_RATE) -> np.ndarray:
    """A file decoded to mono float32 at ``sample_rate``; arrays and tensors pass through as float32.

    returns : shape = (n_samples,)
    """
    if isinstance(audio, (np.ndarray, torch.Tensor)):
        samples = audio.detach().cpu().numpy() if isinstance(audio, torch.Tensor) else audio
        samples = np.asarray(samples, dtype=np.float32)
        if not np.isfinite(samples).all():
            raise AudioError("audio array: contains NaN or infinite samples")
        return samples

    path = check_audio_path(audio)
    samples, rate = _decode(path, sample_rate)
    if samples.size == 0:
        raise AudioError(f"{path}: contains no audio samples (zero length)")
    if not np.isfinite(samples).all():
        raise AudioError(f"{path}: contains NaN or infinite samples")
    mono = samples.mean(axis=1, dtype=np.float32)  # (frames, channels) -> (frames,)
    if float(np.abs(mono).max()) < SILENCE_PEAK:
        raise AudioError(f"{path}: contains only silence; nothing to transcribe")
    if rate != sample_rate:
        mono = soxr.resample(mono, rate, sample_rate, quality="HQ")
    return np.ascontiguousarray(mono, dtype=np.float32)


def audio_duration(audio: Union[np.ndarray, torch.Tensor], sample_rate: int = SAMPLE_RATE) -> float:
    """Seconds of audio in a 1-D array of samples at ``sample_rate``."""
    return audio.shape[-1] / sample_rate


def _decode(path: Path, sample_rate: int) -> Tuple[np.ndarray, int]:
    """Samples as (frames, channels) float32, and their rate: soundfile first, then ffmpeg."""
    try:
        return sf.read(path, dtype="float32", always_2d=True)
    except (sf.SoundFileError, OSError) as e:
        if shutil.which("ffmpeg") is None:
            raise AudioError(f"{path}: not a readable audio file ({_reason(e)}); "
                             f"installing ffmpeg would add more formats") from e
        soundfile_error = e
    return _decode_ffmpeg(path, sample_rate, soundfile_error), sample_rate


def _decode_ffmpeg(path: Path, sample_rate: int, soundfile_error: Exception) -> np.ndarray:
    """ffmpeg's decoding, already mono at ``sample_rate``; shape = (frames, 1)."""
    cmd = ["ffmpeg", "-nostdin", "-hide_banner", "-loglevel", "error", "-threads", "0", "-i", str(path),
           "-f", "s16le", "-ac", "1", "-ar", str(sample_rate), "-"]
    try:
        proc = subprocess.run(cmd, capture_output=True, check=False)
        failure = None if proc.returncode == 0 else _ffmpeg_reason(proc, path)
    except OSError as e:
        failure = f"cannot run ffmpeg: {e.strerror or e}"
    if failure is not None:
        raise AudioError(f"{path}: not a readable audio file ({_reason(soundfile_error)}; "
                         f"ffmpeg: {failure})") from soundfile_error
    pcm = np.frombuffer(proc.stdout, dtype=np.int16)
    return (pcm.astype(np.float32) / 32768.0)[:, None]


def _ffmpeg_reason(proc: subprocess.CompletedProcess, path: Path) -> str:
    # ffmpeg's last line is its verdict, e.g. "<path>: Invalid data found when processing input"
    lines = [line for line in proc.stderr.decode(errors="replace").splitlines() if line.strip()]
    if not lines:
        return f"exit status {proc.returncode}"
    return lines[-1].replace(str(path), "").strip(" :")[:200]


def _reason(e: Exception) -> str:
    """libsndfile's own words ("Format not recognised.") without the path that str(e) repeats."""
    text = (getattr(e, "error_string", None) or str(e)).strip().rstrip(".")
    return text.splitlines()[0][:200] if text else type(e).__name__
