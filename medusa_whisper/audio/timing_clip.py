"""The recording the package carries for timing its choices on the running machine.

Which encoder form, compute type and batch width are fastest depends on the CPU (``tuning.py``,
``step/encoder_form.py``), so they are timed on a real job: this clip's windows, decoded as a user's
would be. It is about 30 s of English read by the neural voice en_US-joe-medium (piper, CC0) from
``TEXT``, which was written for it. It is not one of the evaluation recordings (``data/real``):
nothing is chosen on those. ``tools/make_timing_clip.py`` made it.
"""

from __future__ import annotations

import functools
from pathlib import Path
from typing import List

import numpy as np
import torch
from whisper.audio import SAMPLE_RATE, log_mel_spectrogram, pad_or_trim

CLIP = Path(__file__).with_name("timing_clip.flac")

TEXT = ("The river was high that spring, and the ferry ran only in the mornings. Anna kept a notebook of "
        "the boats that passed: their names, their colours and the hour they came. By June she had counted "
        "more than two hundred. Her brother thought it was a waste of time, but the harbour master asked to "
        "see the notebook, and he copied three pages of it into his own records. Nobody had written down "
        "the river like that before.")


@functools.lru_cache(maxsize=1)
def samples() -> np.ndarray:
    """The clip as mono float32 at 16 kHz (read-only)."""
    from .files import load_audio

    audio = load_audio(CLIP)
    audio.setflags(write=False)
    return audio


def seconds() -> float:
    return len(samples()) / SAMPLE_RATE


def window_mel(n_mels: int, length: float = 30.0) -> torch.Tensor:
    """The log-Mel spectrogram of the clip's first ``length`` seconds as one 30-s window, as
    ``whisper.decode`` takes it: shape (n_mels, 3000)."""
    audio = torch.from_numpy(samples()[: int(length * SAMPLE_RATE)].copy())
    return log_mel_spectrogram(pad_or_trim(audio), n_mels)


def cut_lengths(count: int) -> List[float]:
    """``count`` window lengths in seconds, spread over the clip, so that the windows decoded from
    them end after different numbers of tokens (a batch's streams do)."""
    total = seconds()
    return [round(total * (i % 5 + 1) / 5, 2) for i in range(count)]
