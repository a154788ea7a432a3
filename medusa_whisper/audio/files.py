"""Reading audio files as whisper wants them: float32, mono, 16 kHz, checked for the usual mistakes.

soundfile (libsndfile) reads WAV, FLAC, OGG and MP3 without a subprocess; ffmpeg, when it is on
PATH, covers the other containers (m4a, mp4, webm, ...). Files are decoded block by block (and
resampled with a streaming resampler), so hours of audio never sit in memory at once. Every problem with an input, from a typo
in its name to a file of digital silence, becomes one ``AudioError`` line that names the file.
"""

from __future__ import annotations

import contextlib
import errno
import os
import re
import shutil
import stat
import subprocess
import sys
import tempfile
import threading
from dataclasses import dataclass
from pathlib import Path
from typing import Iterator, List, Optional, Tuple, Union

import numpy as np
import soundfile as sf
import soxr
import torch

from ..errors import AudioError
from .sniff import describe_unreadable, sniff_file

SAMPLE_RATE = 16000
# Peak amplitude (full scale = 1.0) below which a file counts as digital silence; -80 dBFS, below
# the quietest 16-bit dither, so a quiet but real recording passes.
SILENCE_PEAK = 1e-4
# Peak amplitude above which samples cannot be audio (full scale is 1.0; int16 values written into a
# float file, up to 32768, still pass): such values overflow the spectrogram into NaN.
MAX_PEAK = 1e6
# Files are decoded in blocks of this many seconds; past SPILL_SECONDS the samples wait on disk.
BLOCK_SECONDS = 30.0
SPILL_SECONDS = 600.0
# A block holds at most this many samples over all channels (64 MB as float32), so a file whose
# header claims hundreds of channels cannot ask for gigabytes at once.
BLOCK_SAMPLES = 1 << 24
# Below this rate a file cannot hold intelligible speech: the header is damaged (telephone audio is 8 kHz).
MIN_SAMPLE_RATE = 2000
# Files shorter than this cannot hold any audio format's header.
MIN_FILE_BYTES = 12
# libsndfile's words when its last resort (the MP3 reader) gives up on a regular file it cannot
# place: they blame the path, which is wrong, so they are left out of the message.
_MISLEADING = ("File does not exist or is not a regular file", "Format not recognised", "Invalid argument",
               "End of file", "Error marking filters as finished", "Error configuring filter graph")
_NOT_REGULAR = ((stat.S_ISFIFO, "a FIFO (named pipe)"), (stat.S_ISCHR, "a character device"),
                (stat.S_ISBLK, "a block device"), (stat.S_ISSOCK, "a socket"))

AudioInput = Union[str, os.PathLike, np.ndarray, torch.Tensor]


def check_audio_path(path: Union[str, os.PathLike]) -> Path:
    """The checks that need no decoding: the file exists, is a regular file, is not empty, can be read."""
    path = Path(path)
    try:
        info = path.stat()
    except OSError as e:
        raise AudioError(f"{path}: {_stat_problem(path, e)}") from None
    if stat.S_ISDIR(info.st_mode):
        raise AudioError(f"{path}: is a directory, not an audio file")
    for is_kind, kind in _NOT_REGULAR:
        if is_kind(info.st_mode):
            # opening a FIFO would wait for a writer forever
            raise AudioError(f"{path}: is {kind}, not a regular file; save the audio to a file first")
    if info.st_size == 0:
        raise AudioError(f"{path}: file is empty (0 bytes)")
    try:
        with open(path, "rb"):
            pass
    except PermissionError:
        raise AudioError(f"{path}: permission denied (this user may not read the file)") from None
    except OSError as e:
        raise AudioError(f"{path}: cannot be opened ({e.strerror or e})") from None
    return path


def _stat_problem(path: Path, error: OSError) -> str:
    if error.errno == errno.ENOENT:
        if path.is_symlink():
            return f"broken symbolic link (its target {os.readlink(path)} does not exist)"
        return "no such file"
    if error.errno == errno.ELOOP:
        return "symbolic link loop (the link points back to itself)"
    if error.errno == errno.EACCES:
        return "permission denied (a folder on the path may not be entered by this user)"
    if error.errno == errno.ENOTDIR:
        return "no such file (a part of the path is a file, not a folder)"
    if error.errno == errno.ENAMETOOLONG:
        return "file name too long"
    return f"cannot be read ({error.strerror or error})"


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
    header = _Header()
    try:
        resampler, peak = None, 0.0
        with _quiet_c_stderr():
            for block, rate in _decode_blocks(path, sample_rate, header):
                if not np.isfinite(block).all():
                    at = (sink.length * rate / sample_rate + int(np.flatnonzero(~np.isfinite(block))[0])) / rate
                    raise AudioError(f"{path}: " + (
                        f"contains NaN or infinite samples (the first at {at:.2f} s)" if header.exact else
                        f"damaged audio data: decoding gave NaN or infinite values at {at:.2f} s"))
                peak = max(peak, float(np.abs(block).max(initial=0.0)))
                if peak > MAX_PEAK:
                    raise AudioError(f"{path}: sample values up to {peak:.3g}, far outside the range of audio "
                                     f"(full scale is 1): the data is damaged")
                if rate != sample_rate and resampler is None:
                    resampler = soxr.ResampleStream(rate, sample_rate, 1, dtype="float32", quality="HQ")
                sink.append(block if resampler is None else resampler.resample_chunk(block, last=False))
            if resampler is not None:
                sink.append(resampler.resample_chunk(np.zeros(0, np.float32), last=True))
        if sink.length == 0:
            if header.declared_seconds:  # the header promised audio that is not there
                raise AudioError(f"{path}: no audio samples could be decoded, though its header announces "
                                 f"{header.declared_seconds:.2f} s: the file is damaged or truncated")
            raise AudioError(f"{path}: contains no audio samples {header.truncation.strip() or '(zero length)'}")
        if peak < SILENCE_PEAK:
            raise AudioError(f"{path}: contains only silence{header.truncation}; nothing to transcribe")
        return sink.finish()
    except BaseException:
        sink.discard()
        raise


@dataclass
class _Header:
    """What the decoder learnt of a file besides its samples, for the error messages."""

    exact: bool = False  # float PCM: the decoded values are the file's own, so a NaN is in the file
    declared_seconds: float = 0.0  # the length its header announces (0 when it does not say)
    truncation: str = ""  # "(a truncated file: ...)" when the header announces more than is there


@contextlib.contextmanager
def _quiet_c_stderr():
    """Send what C libraries write to file descriptor 2 (libmpg123's "Note: Illegal Audio-MPEG-Header",
    "Trying to resync...") to a scratch file while they decode: our own one-line error says what is wrong.
    Python's sys.stderr is flushed first and untouched afterwards."""
    try:
        sys.stderr.flush()
        saved = os.dup(2)
    except (OSError, ValueError, AttributeError):  # no descriptor 2 (a daemon): nothing to silence
        yield
        return
    try:
        with tempfile.TemporaryFile() as scratch:
            os.dup2(scratch.fileno(), 2)
            yield
    finally:
        os.dup2(saved, 2)
        os.close(saved)


class AudioSamples:
    """The samples of one input, read by range: from memory, or from a temporary file for long ones.

    ``zeros`` leading samples of digital silence are not stored at all (hours of silence before a
    recording, or a file of nothing but silence, cost nothing); they read as zeros.
    """

    def __init__(self, name: str, array: Optional[np.ndarray] = None, file=None, length: int = 0, zeros: int = 0):
        self.name, self._array, self._file, self._zeros = name, array, file, zeros
        self._length = zeros + (len(array) if array is not None else length)

    def __len__(self) -> int:
        return self._length

    def read(self, start: int, stop: int) -> np.ndarray:
        """Samples [start, stop), clipped to the audio; a new float32 array."""
        start, stop = max(start, 0), min(stop, self._length)
        if stop <= start:
            return np.zeros(0, np.float32)
        if start < self._zeros:
            leading = np.zeros(min(stop, self._zeros) - start, np.float32)
            return np.concatenate([leading, self.read(self._zeros, stop)]) if stop > self._zeros else leading
        start, stop = start - self._zeros, stop - self._zeros
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
        self.length = 0  # samples appended, leading zeros included
        self.zeros = 0  # leading exact zeros, counted but not stored

    def append(self, block: np.ndarray) -> None:
        block = np.ascontiguousarray(block, dtype=np.float32)
        self.length += len(block)
        if self.zeros == self.length - len(block):  # nothing but zeros so far
            nonzero = np.flatnonzero(block)
            skip = len(block) if len(nonzero) == 0 else int(nonzero[0])
            self.zeros += skip
            block = block[skip:]
        stored = self.length - self.zeros
        if self.file is None and self.spill_after is not None and stored > self.spill_after:
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
            return AudioSamples(str(self.path), file=self.file, length=self.length - self.zeros, zeros=self.zeros)
        array = np.concatenate(self.blocks) if self.blocks else np.zeros(0, np.float32)
        return AudioSamples(str(self.path), array, zeros=self.zeros)

    def discard(self) -> None:
        if self.file is not None:
            self.file.close()
        self.blocks = []


def audio_duration(audio: Union[np.ndarray, torch.Tensor], sample_rate: int = SAMPLE_RATE) -> float:
    """Seconds of audio in a 1-D array of samples at ``sample_rate``."""
    return audio.shape[-1] / sample_rate


def _decode_blocks(path: Path, sample_rate: int, header: _Header) -> Iterator[Tuple[np.ndarray, int]]:
    """Mono float32 blocks of about BLOCK_SECONDS and their rate: soundfile first, then ffmpeg."""
    try:
        sound = sf.SoundFile(os.fsencode(path))  # bytes: a name that is not UTF-8 still opens
    except (sf.SoundFileError, OSError) as e:
        if shutil.which("ffmpeg") is None:
            raise AudioError(f"{path}: {_unreadable(path, _reason(e))}; installing ffmpeg would add more "
                             f"formats") from None
        yield from _decode_ffmpeg(path, sample_rate, e)
        return
    with sound:
        rate = sound.samplerate
        if rate < MIN_SAMPLE_RATE:
            raise AudioError(f"{path}: its header gives a sample rate of {rate} Hz, too low to hold speech "
                             f"(at least {MIN_SAMPLE_RATE} Hz); the header is damaged")
        header.exact = sound.subtype in ("FLOAT", "DOUBLE")
        header.declared_seconds = max(sound.frames, 0) / rate if sound.format != "MPEG" else 0.0
        header.truncation = _wav_truncation(sound)
        frames = max(1024, min(int(BLOCK_SECONDS * rate), BLOCK_SAMPLES // max(1, sound.channels)))
        decoded = 0
        try:
            while True:  # read(), not blocks(): some codecs (GSM 6.10 in WAV) are not seekable
                block = sound.read(frames, dtype="float32", always_2d=True)
                if len(block) == 0:
                    break
                decoded += len(block)
                yield block.mean(axis=1, dtype=np.float32), rate  # (frames, channels) -> (frames,)
            if decoded == 0 and shutil.which("ffmpeg") is not None:
                # libsndfile reads nothing from some damaged Ogg files where ffmpeg recovers the audio
                yield from _decode_ffmpeg(path, sample_rate, None)
        except (sf.SoundFileError, OSError, RuntimeError) as e:
            kind = sniff_file(path)
            what = f"damaged {kind.name} data" if kind is not None and kind.audio else "damaged audio data"
            of = f" of {header.declared_seconds:.1f} s" if header.declared_seconds else ""
            try:
                decoded = max(decoded, sound.tell())  # within the block that failed
            except (sf.SoundFileError, OSError, RuntimeError):
                pass
            raise AudioError(f"{path}: {what}: cannot be decoded past {decoded / rate:.1f} s{of} "
                             f"({_reason(e)})") from None


def _wav_truncation(sound: sf.SoundFile) -> str:
    """libsndfile logs "data : 80000 (should be 56)" for a WAV cut short: say so in the user's terms."""
    found = re.search(r"^data : (\d+) \(should be (\d+)\)", sound.extra_info, re.MULTILINE)
    if not found or sound.format not in ("WAV", "WAVEX", "RF64", "W64"):
        return ""
    announced, present = (int(n) for n in found.groups())
    bytes_per_second = sound.samplerate * sound.channels * max(1, _BYTES_PER_SAMPLE.get(sound.subtype, 2))
    return (f" (a truncated file: its header announces {announced / bytes_per_second:.2f} s, "
            f"{present / bytes_per_second:.2f} s are there)")


_BYTES_PER_SAMPLE = {"PCM_U8": 1, "PCM_S8": 1, "PCM_16": 2, "PCM_24": 3, "PCM_32": 4, "FLOAT": 4, "DOUBLE": 8,
                     "ULAW": 1, "ALAW": 1}


def _unreadable(path: Path, *reasons: str) -> str:
    """What is wrong with a file no decoder could open, in the words of its content, not the decoder's."""
    size = path.stat().st_size
    if size < MIN_FILE_BYTES:
        return f"too short to be an audio file ({size} byte{'s' if size != 1 else ''})"
    useful = [r for r in reasons if r and not r.startswith(_MISLEADING)]
    return describe_unreadable(sniff_file(path), useful[0] if useful else "")


def _decode_ffmpeg(path: Path, sample_rate: int, soundfile_error: Optional[Exception]) -> Iterator[Tuple[np.ndarray, int]]:
    """ffmpeg's decoding, already mono at ``sample_rate``, read from its pipe block by block."""
    cmd = ["ffmpeg", "-nostdin", "-hide_banner", "-loglevel", "error", "-threads", "0", "-i", str(path),
           "-f", "s16le", "-ac", "1", "-ar", str(sample_rate), "-"]
    try:
        proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    except OSError as e:
        first = _reason(soundfile_error) if soundfile_error is not None else ""
        raise AudioError(f"{path}: {_unreadable(path, first)} (ffmpeg could not be run: {e.strerror or e})") from None
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
        first = _reason(soundfile_error) if soundfile_error is not None else ""
        raise AudioError(f"{path}: {_unreadable(path, first, reason)}") from None


def _ffmpeg_reason(returncode: int, stderr: bytes, path: Path) -> str:
    # ffmpeg's last line is its verdict, e.g. "<path>: Invalid data found when processing input"
    lines = [line for line in stderr.decode(errors="replace").splitlines() if line.strip()]
    if not lines:
        return f"exit status {returncode}"
    return lines[-1].replace(str(path), "").strip(" :")[:200]


def _reason(e: Exception) -> str:
    """libsndfile's own words ("Malformed 'fmt ' chunk") without the path that str(e) repeats."""
    text = (getattr(e, "error_string", None) or str(e)).strip().rstrip(".")
    text = text.splitlines()[0][:200] if text else type(e).__name__
    return text[len("Error : "):] if text.startswith("Error : ") else text
