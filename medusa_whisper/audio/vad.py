"""Where a recording speaks: Silero VAD's speech spans, merged into chunks of at most 30 s.

The chunks of one long recording can be decoded side by side (chunked.py), as faster-whisper's
batched pipeline and WhisperX do. Silero VAD (MIT) comes from its PyPI package, ``silero-vad``,
which ships the model file inside (no model hub): ``pip install 'medusa-whisper[vad]'``.

Departs from faster-whisper's ``collect_chunks``, which joins the speech spans of a chunk end to end
and maps times back piece by piece: a chunk here is one stretch of the recording, from its first
span's start to its last span's end, pauses included, so a time in the chunk is the chunk's start
plus that time.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import List, Sequence, Tuple

import numpy as np
import torch

from ..errors import MedusaWhisperError

SAMPLE_RATE = 16000
CHUNK_SECONDS = 30.0  # whisper's window
FRAME = 512  # samples Silero VAD scores at a time at 16 kHz
MAX_STREAMS, MIN_STREAM_FRAMES = 32, 500  # see speech_probabilities


@dataclass(frozen=True)
class VadOptions:
    """Silero VAD's parameters, with faster-whisper's batched pipeline's values."""

    threshold: float = 0.5  # speech probability above which a 32-ms frame is speech
    min_speech_ms: int = 0  # shorter spans are dropped
    min_silence_ms: int = 160  # a span ends after this much silence
    speech_pad_ms: int = 400  # each span widened by this on both sides


class VadUnavailable(MedusaWhisperError):
    pass


def _silero():
    """Silero VAD's module and model. Its import sets torch to one thread (silero_vad/model.py):
    the caller's thread count is put back."""
    threads = torch.get_num_threads()
    try:
        import silero_vad
    except ImportError as error:
        raise VadUnavailable("Silero VAD (--vad-chunks, --vad-filter) needs the silero-vad package: pip install 'medusa-whisper[vad]' "
                             "(or pip install silero-vad)") from error
    finally:
        torch.set_num_threads(threads)
    return silero_vad, silero_vad.load_silero_vad()


def check_available() -> None:
    """Raise VadUnavailable now, before any file is read, when silero-vad is not installed."""
    _silero()


def speech_probabilities(model, samples: np.ndarray) -> List[float]:
    """Silero's speech probability for every 32-ms frame (512 samples) of the recording.

    Departs from ``silero_vad.get_speech_timestamps``, which calls the model once per frame, in
    order, carrying its state through the whole recording (4.6 s for 8 minutes on 2 cores): the
    recording is cut into up to 32 stretches of at least 16 s that run side by side as the model's
    batch (0.5 s). Each stretch starts from a fresh state, as a file's first frame does; on an
    8-minute real recording that gave 92 spans against 93 and 316.9 s of speech against 316.8 s."""
    n_frames = -(-len(samples) // FRAME)
    streams = max(1, min(MAX_STREAMS, n_frames // MIN_STREAM_FRAMES))
    per_stream = -(-n_frames // streams)
    padded = np.zeros(streams * per_stream * FRAME, dtype=np.float32)
    padded[:len(samples)] = samples
    frames = torch.from_numpy(padded).view(streams, per_stream, FRAME)
    model.reset_states()
    with torch.no_grad():
        probs = torch.stack([model(frames[:, i], SAMPLE_RATE)[:, 0] for i in range(per_stream)], dim=1)
    return probs.reshape(-1)[:n_frames].tolist()


def speech_spans(samples: np.ndarray, options: VadOptions = VadOptions(), *, within_chunks: bool = True
                 ) -> List[Tuple[int, int]]:
    """(start, end) sample indices of speech in 16-kHz mono samples, in order; with ``within_chunks``
    none longer than 30 s (Silero splits longer speech at its longest pause, else at 30 s)."""
    silero, model = _silero()
    samples = np.ascontiguousarray(samples, dtype=np.float32)
    pad = options.speech_pad_ms / 1000
    spans = silero.get_speech_timestamps_from_probs(
        speech_probabilities(model, samples), sampling_rate=SAMPLE_RATE, threshold=options.threshold,
        min_speech_duration_ms=options.min_speech_ms,
        max_speech_duration_s=CHUNK_SECONDS - 2 * pad - 0.1 if within_chunks else float("inf"),
        min_silence_duration_ms=options.min_silence_ms, speech_pad_ms=options.speech_pad_ms,
        audio_length_samples=len(samples))
    if not within_chunks:
        return [(span["start"], span["end"]) for span in spans]
    limit = int(CHUNK_SECONDS * SAMPLE_RATE)
    out = []
    for span in spans:  # padding may still reach past 30 s in rare cases: cut there
        for start in range(span["start"], span["end"], limit):
            out.append((start, min(start + limit, span["end"])))
    return out


def chunks(spans: Sequence[Tuple[int, int]], max_seconds: float = CHUNK_SECONDS) -> List[Tuple[int, int]]:
    """Consecutive spans merged into (start, end) stretches of at most ``max_seconds``, greedily in
    order (a chunk takes the next span while it still fits, pauses between included)."""
    limit = int(max_seconds * SAMPLE_RATE)
    out: List[Tuple[int, int]] = []
    for start, end in spans:
        if end - start > limit:
            raise ValueError(f"a speech span of {(end - start) / SAMPLE_RATE:.1f} s is longer than a chunk")
        if out and end - out[-1][0] <= limit:
            out[-1] = (out[-1][0], end)
        else:
            out.append((start, end))
    return out
