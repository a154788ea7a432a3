"""Sequential decoding without the long silences: ``transcribe(..., vad_filter=True)``, ``--vad-filter``.

As faster-whisper's ``vad_filter``: Silero VAD finds the speech (vad.py) with that option's
parameters (a span ends after 2 s below the threshold, each span widened by 0.4 s on both sides),
the spans are joined end to end, and that audio is transcribed as ``whisper.transcribe`` does,
window after window with the previous text. Every time in the result (segments, words, seek) is
then moved back to the recording's clock. Unlike ``--vad-chunks`` this keeps whisper's sequential
rule; it saves the windows the silences would have taken, and whisper's hallucinations in them.

The whole recording is decoded into memory for the VAD (16 kHz float32: 230 MB an hour).
"""

from __future__ import annotations

import bisect
import functools
from dataclasses import dataclass
from typing import List, Sequence, Tuple

import numpy as np
from whisper.audio import FRAMES_PER_SECOND  # whisper's seek counts mel frames of 10 ms

from ..audio.vad import SAMPLE_RATE, VadOptions, speech_spans

# faster-whisper's VadOptions defaults, which its vad_filter uses
FILTER_OPTIONS = VadOptions(threshold=0.5, min_speech_ms=0, min_silence_ms=2000, speech_pad_ms=400)


@dataclass(frozen=True)
class KeptSpeech:
    """Which stretches of a recording are kept, and how times in the joined audio map back."""

    spans: Tuple[Tuple[int, int], ...]  # (start, end) samples in the recording: disjoint, in order, not touching

    @classmethod
    def of(cls, spans: Sequence[Tuple[int, int]]) -> "KeptSpeech":
        """From VAD spans in order; spans that touch or overlap become one."""
        merged: List[Tuple[int, int]] = []
        for start, end in spans:
            if end <= start:
                continue
            if merged and start <= merged[-1][1]:
                merged[-1] = (merged[-1][0], max(merged[-1][1], end))
            else:
                merged.append((start, end))
        return cls(tuple(merged))

    @classmethod
    def find(cls, samples: np.ndarray, options: VadOptions = FILTER_OPTIONS) -> "KeptSpeech":
        return cls.of(speech_spans(samples, options, within_chunks=False))

    def joined(self, samples: np.ndarray) -> np.ndarray:
        """The kept stretches end to end (empty when there is no speech)."""
        if not self.spans:
            return np.zeros(0, dtype=np.float32)
        return np.concatenate([samples[start:end] for start, end in self.spans]).astype(np.float32, copy=False)

    @functools.cached_property
    def _starts(self) -> Tuple[int, ...]:
        """Where each span starts in the joined audio (computed once; the spans never change)."""
        starts, at = [], 0
        for start, end in self.spans:
            starts.append(at)
            at += end - start
        return tuple(starts)

    def _span_at(self, at: float, is_end: bool = False) -> int:
        """The span holding joined sample ``at``; on a seam, the earlier one when ``is_end``."""
        find = bisect.bisect_left if is_end else bisect.bisect_right
        return min(max(find(self._starts, at) - 1, 0), len(self.spans) - 1)

    def _recording_sample(self, index: int, at: float) -> float:
        return self.spans[index][0] + at - self._starts[index]

    def original_seconds(self, seconds: float, is_end: bool = False) -> float:
        """A time in the joined audio on the recording's clock. A time on the seam between two spans is
        the end of the first (``is_end``: a segment or word that ends there) or the start of the second."""
        if not self.spans:
            return seconds
        at = seconds * SAMPLE_RATE
        return self._recording_sample(self._span_at(at, is_end), at) / SAMPLE_RATE

    def word_seconds(self, start: float, end: float) -> Tuple[float, float]:
        """A word's times on the recording's clock, both in the span that holds its middle (clamped to
        it): a word is never stretched across a removed silence. (whisper's alignment can start a word
        in the padding before a seam and end it after; mapped apart, it would span the silence.)"""
        if not self.spans:
            return start, end
        index = self._span_at((start + end) / 2 * SAMPLE_RATE)
        first, last = self.spans[index]

        def mapped(seconds: float) -> float:
            return min(max(self._recording_sample(index, seconds * SAMPLE_RATE), first), last) / SAMPLE_RATE

        return mapped(start), mapped(end)

    def restore(self, result: dict, recording_seconds: float) -> dict:
        """A result transcribed from the joined audio, its times moved to the recording's clock (in place)."""
        for segment in result["segments"]:
            segment["seek"] = round(self.original_seconds(segment["seek"] / FRAMES_PER_SECOND) * FRAMES_PER_SECOND)
            segment["start"] = round(self.original_seconds(segment["start"]), 3)
            segment["end"] = round(self.original_seconds(segment["end"], is_end=True), 3)
            for word in segment.get("words", []):
                start, end = self.word_seconds(word["start"], word["end"])
                word["start"], word["end"] = round(start, 3), round(end, 3)
        medusa = result.setdefault("medusa", {})
        medusa["speech_seconds"] = medusa.get("audio_seconds", 0.0)
        medusa["audio_seconds"] = round(recording_seconds, 3)
        return result
