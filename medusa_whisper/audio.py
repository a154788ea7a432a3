"""Reading audio files as whisper wants them: float32, mono, 16 kHz, checked for the usual mistakes.

soundfile (libsndfile) reads WAV, FLAC, OGG and MP3 without a subprocess; ffmpeg, when it is on
PATH, covers the other containers (m4a, mp4, webm, ...). Files are decoded block by block (and
resampled with a streaming resampler), so hours of audio never sit in memory at once. Every problem with an input, from a typo
in its name to a file of digital silence, becomes one ``AudioError`` line that names the file.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import tempfile
import threading
from pathlib import Path
from typing import Iterator, List, Optional, Tuple, Union

import numpy as np
import soundfile as sf
import soxr
import torch

from .errors import AudioError

SAMPLE_RATE = 16000
# Peak amplitude (full scale = 1.0) below which a file counts as digital silence; -80 dBFS, below
# the quietest 16-bit dither, so a quiet but real recording passes.
SILENCE_PEAK = 1e-4
# Files are decoded in blocks of this many seconds; past SPILL_SECONDS the samples wait on disk.
BLOCK_SECONDS = 30.0
SPILL_SECONDS = 600.0

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
    with open_audio(audio, sample_rate, spill_seconds=None) as samples:
        return samples.read(0, len(samples))


def open_audio(audio: AudioInput, sample_rate: int = SAMPLE_RATE,
               spill_seconds: Optional[float] = SPILL_SECONDS) -> "AudioSamples":
    """Decode a file block by block into ``AudioSamples`` (checked, mono, ``sample_rate``).

    Memory stays flat with length: past ``spill_seconds`` (None: never) the samples go to an
    unlinked temporary file and are read back by range, so a two-hour file costs a few MB of RAM.
    """
    if isinstance(audio, (np.ndarray, torch.Tensor)):
        samples = audio.detach().cpu().numpy() if isinstance(audio, torch.Tensor) else audio
        samples = np.asarray(samples, dtype=np.float32)
        if not np.isfinite(samples).all():
            raise AudioError("audio array: contains NaN or infinite samples")
        return AudioSamples("audio array", samples.reshape(-1))

    path = check_audio_path(audio)
    sink = _SampleSink(path, None if spill_seconds is None else int(spill_seconds * sample_rate))
    try:
        resampler, peak = None, 0.0
        for block, rate in _decode_blocks(path, sample_rate):
            if not np.isfinite(block).all():
                raise AudioError(f"{path}: contains NaN or infinite samples")
            peak = max(peak, float(np.abs(block).max(initial=0.0)))
            if rate != sample_rate and resampler is None:
                resampler = soxr.ResampleStream(rate, sample_rate, 1, dtype="float32", quality="HQ")
            sink.append(block if resampler is None else resampler.resample_chunk(block, last=False))
        if resampler is not None:
            sink.append(resampler.resample_chunk(np.zeros(0, np.float32), last=True))
        if sink.length == 0:
            raise AudioError(f"{path}: contains no audio samples (zero length)")
        if peak < SILENCE_PEAK:
            raise AudioError(f"{path}: contains only silence; nothing to transcribe")
        return sink.finish()
    except BaseException:
        sink.discard()
        raise


class AudioSamples:
    """The samples of one input, read by range: from memory, or from a temporary file for long ones."""

    def __init__(self, name: str, array: Optional[np.ndarray] = None, file=None, length: int = 0):
        self.name, self._array, self._file = name, array, file
        self._length = len(array) if array is not None else length

    def __len__(self) -> int:
        return self._length

    def read(self, start: int, stop: int) -> np.ndarray:
        """Samples [start, stop), clipped to the audio; a new float32 array."""
        start, stop = max(start, 0), min(stop, self._length)
        if stop <= start:
            return np.zeros(0, np.float32)
        if self._array is not None:
            return np.array(self._array[start:stop], dtype=np.float32)
        data = os.pread(self._file.fileno(), (stop - start) * 4, start * 4)
        return np.frombuffer(data, dtype=np.float32).copy()

    def close(self) -> None:
        if self._file is not None:
            self._file.close()
            self._file = None

    def __enter__(self) -> "AudioSamples":
        return self

    def __exit__(self, *exc) -> None:
        self.close()


class _SampleSink:
    """Collects decoded blocks in memory, moving them to a temporary file once there are many."""

    def __init__(self, path: Path, spill_after: Optional[int]):
        self.path, self.spill_after = path, spill_after
        self.blocks: List[np.ndarray] = []
        self.file = None
        self.length = 0

    def append(self, block: np.ndarray) -> None:
        block = np.ascontiguousarray(block, dtype=np.float32)
        self.length += len(block)
        if self.file is None and self.spill_after is not None and self.length > self.spill_after:
            self.file = tempfile.TemporaryFile(prefix="medusa_whisper_audio_")
            for kept in self.blocks:
                self.file.write(kept.tobytes())
            self.blocks = []
        if self.file is not None:
            self.file.write(block.tobytes())
        else:
            self.blocks.append(block)

    def finish(self) -> AudioSamples:
        if self.file is not None:
            self.file.flush()
            return AudioSamples(str(self.path), file=self.file, length=self.length)
        array = np.concatenate(self.blocks) if self.blocks else np.zeros(0, np.float32)
        return AudioSamples(str(self.path), array)

    def discard(self) -> None:
        if self.file is not None:
            self.file.close()
        self.blocks = []


def audio_duration(audio: Union[np.ndarray, torch.Tensor], sample_rate: int = SAMPLE_RATE) -> float:
    """Seconds of audio in a 1-D array of samples at ``sample_rate``."""
    return audio.shape[-1] / sample_rate


def _decode_blocks(path: Path, sample_rate: int) -> Iterator[Tuple[np.ndarray, int]]:
    """Mono float32 blocks of about BLOCK_SECONDS and their rate: soundfile first, then ffmpeg."""
    try:
        sound = sf.SoundFile(path)
    except (sf.SoundFileError, OSError) as e:
        if shutil.which("ffmpeg") is None:
            raise AudioError(f"{path}: not a readable audio file ({_reason(e)}); "
                             f"installing ffmpeg would add more formats") from e
        yield from _decode_ffmpeg(path, sample_rate, e)
        return
    with sound:
        rate = sound.samplerate
        try:
            for block in sound.blocks(blocksize=int(BLOCK_SECONDS * rate), dtype="float32", always_2d=True):
                yield block.mean(axis=1, dtype=np.float32), rate  # (frames, channels) -> (frames,)
        except (sf.SoundFileError, OSError, RuntimeError) as e:
            raise AudioError(f"{path}: cannot be decoded past {sound.tell() / rate:.1f} s ({_reason(e)})") from e


def _decode_ffmpeg(path: Path, sample_rate: int, soundfile_error: Exception) -> Iterator[Tuple[np.ndarray, int]]:
    """ffmpeg's decoding, already mono at ``sample_rate``, read from its pipe block by block."""
    cmd = ["ffmpeg", "-nostdin", "-hide_banner", "-loglevel", "error", "-threads", "0", "-i", str(path),
           "-f", "s16le", "-ac", "1", "-ar", str(sample_rate), "-"]
    try:
        proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    except OSError as e:
        raise AudioError(f"{path}: not a readable audio file ({_reason(soundfile_error)}; "
                         f"ffmpeg: cannot run ffmpeg: {e.strerror or e})") from soundfile_error
    # stderr is drained by a thread so that a chatty ffmpeg cannot block on a full pipe
    errors: List[bytes] = []
    drain = threading.Thread(target=lambda: errors.append(proc.stderr.read()), daemon=True)
    drain.start()
    try:
        block_bytes = int(BLOCK_SECONDS * sample_rate) * 2
        pending = b""
        while True:
            data = proc.stdout.read(block_bytes)
            if not data:
                break
            data = pending + data
            usable = len(data) - len(data) % 2
            pending = data[usable:]
            pcm = np.frombuffer(data[:usable], dtype=np.int16)
            yield pcm.astype(np.float32) / 32768.0, sample_rate
    finally:
        proc.stdout.close()
        returncode = proc.wait()
        drain.join()
    if returncode != 0:
        reason = _ffmpeg_reason(returncode, b"".join(errors), path)
        raise AudioError(f"{path}: not a readable audio file ({_reason(soundfile_error)}; "
                         f"ffmpeg: {reason})") from soundfile_error


def _ffmpeg_reason(returncode: int, stderr: bytes, path: Path) -> str:
    # ffmpeg's last line is its verdict, e.g. "<path>: Invalid data found when processing input"
    lines = [line for line in stderr.decode(errors="replace").splitlines() if line.strip()]
    if not lines:
        return f"exit status {returncode}"
    return lines[-1].replace(str(path), "").strip(" :")[:200]


def _reason(e: Exception) -> str:
    """libsndfile's own words ("Format not recognised.") without the path that str(e) repeats."""
    text = (getattr(e, "error_string", None) or str(e)).strip().rstrip(".")
    return text.splitlines()[0][:200] if text else type(e).__name__
