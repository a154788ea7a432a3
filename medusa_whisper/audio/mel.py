"""The log-Mel spectrogram of long audio, computed a window at a time.

whisper.transcribe computes ``log_mel_spectrogram(audio, padding=N_SAMPLES)`` for the whole file
first. For two hours of audio that is a 1.2 GB complex STFT and a 230 MB spectrogram on top of the
samples. ``LogMelFrames`` gives the same frames, window by window, from ``AudioSamples`` read by
range, so memory does not grow with the length of the file.

Two facts make the frames equal to whisper's:
- frame j of whisper's centred STFT sees samples [160 j - 200, 160 j + 200) of the padded signal
  (audio, then N_SAMPLES zeros), reflected at its two ends; it depends on nothing else.
- whisper clamps every value to (global maximum - 8). The global maximum is found by one streaming
  pass over the file before the first window is decoded.
"""

from __future__ import annotations

from typing import Optional

import numpy as np
import torch
from whisper.audio import HOP_LENGTH, N_FFT, N_FRAMES, N_SAMPLES, mel_filters

from .files import AudioSamples

# frames per chunk of the pass that finds the global maximum (about 5 minutes of audio)
SCAN_FRAMES = 10 * N_FRAMES
HALF_WINDOW = N_FFT // 2
MIN_FRAMES = 64


class LogMelFrames:
    """Frames of ``whisper.log_mel_spectrogram(audio, n_mels, padding=N_SAMPLES)``, on request."""

    def __init__(self, samples: AudioSamples, n_mels: int):
        self.samples, self.n_mels = samples, n_mels
        self.n_samples = len(samples)
        self.padded_length = self.n_samples + N_SAMPLES
        # whisper's STFT has 1 + L // hop frames and drops the last one
        self.n_frames = self.padded_length // HOP_LENGTH
        self._window = torch.hann_window(N_FFT)
        self._filters = mel_filters("cpu", n_mels)
        # the scan's first chunk of frames is kept (all of them for a recording of one chunk), so
        # that the windows inside it are not computed twice; memory stays at most one chunk
        self._first: Optional[torch.Tensor] = None
        self._ceiling = self._global_max() - 8.0

    @property
    def content_frames(self) -> int:
        """Frames of the audio itself, without the 30 s of padding (whisper's ``content_frames``)."""
        return self.n_frames - N_FRAMES

    def frames(self, start: int, stop: int) -> torch.Tensor:
        """Frames [start, stop) as whisper's full spectrogram has them; shape = (n_mels, stop - start)."""
        start, stop = max(start, 0), min(stop, self.n_frames)
        if stop <= start:
            return torch.zeros(self.n_mels, 0)
        if stop <= self._first.shape[1]:  # computed with many columns at once, as whisper does
            log_spec = self._first[:, start:stop]
        else:
            # a product with only a few columns takes another BLAS path whose sums round differently;
            # computing at least MIN_FRAMES columns keeps every frame bitwise equal to whisper's
            log_spec = self._log10_mel(start, max(stop, start + MIN_FRAMES))[:, : stop - start]
        log_spec = torch.maximum(log_spec, torch.tensor(self._ceiling))
        return (log_spec + 4.0) / 4.0

    def _global_max(self) -> float:
        best = -float("inf")
        for start in range(0, self.n_frames, SCAN_FRAMES):
            chunk = self._log10_mel(start, min(start + SCAN_FRAMES, self.n_frames))
            if start == 0:
                self._first = chunk
            best = max(best, float(chunk.max()))
        return best

    def _log10_mel(self, start: int, stop: int) -> torch.Tensor:
        signal = torch.from_numpy(self._padded(start * HOP_LENGTH - HALF_WINDOW, (stop - 1) * HOP_LENGTH + HALF_WINDOW))
        stft = torch.stft(signal, N_FFT, HOP_LENGTH, window=self._window, center=False, return_complex=True)
        magnitudes = stft.abs() ** 2
        mel_spec = self._filters @ magnitudes
        return torch.clamp(mel_spec, min=1e-10).log10()

    def _padded(self, begin: int, end: int) -> np.ndarray:
        """Samples [begin, end) of the audio followed by N_SAMPLES zeros, reflected at both ends
        (torch.stft's ``center=True`` padding); indices may lie outside [0, padded_length)."""
        out = np.zeros(end - begin, np.float32)
        lo, hi = max(begin, 0), min(end, self.n_samples)
        if hi > lo:
            out[lo - begin : hi - begin] = self.samples.read(lo, hi)
        if begin < 0:
            # index -k is sample k; those past the audio are padding zeros, already in place
            mirrored = np.arange(-begin, 0, -1)
            real = mirrored < self.n_samples
            out[: -begin][real] = self.samples.read(0, int(mirrored.max()) + 1)[mirrored[real]]
        # past padded_length the reflection lands in the zero padding (N_SAMPLES >> HALF_WINDOW)
        return out
