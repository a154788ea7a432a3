"""``model.transcribe``: openai-whisper's long-form algorithm with Medusa decoding in each window.

whisper.transcribe calls ``model.decode(mel_segment, options)`` once per 30-s window (and again on
temperature fallback). It is handed a thin proxy of the model whose ``decode`` is Medusa's, so the
windowing, prompts, fallback and timestamp logic are whisper's own, and the model itself is never
mutated (two threads may transcribe with one model).
"""

from __future__ import annotations

from dataclasses import dataclass, fields
from pathlib import Path
from typing import Union

import numpy as np
import torch
import whisper
from whisper.decoding import DecodingOptions

from .decoding import MedusaDecodingOptions, as_medusa_options, decode

# options that exist in MedusaDecodingOptions but not in whisper's DecodingOptions
MEDUSA_ONLY_OPTIONS = {f.name for f in fields(MedusaDecodingOptions)} - {f.name for f in fields(DecodingOptions)}


@dataclass
class TranscriptionStats:
    windows: int = 0
    tokens: int = 0
    decoder_steps: int = 0
    encode_seconds: float = 0.0
    decode_seconds: float = 0.0

    def add(self, result) -> None:
        self.windows += 1
        self.tokens += result.tokens_produced
        self.decoder_steps += result.decoder_steps
        self.encode_seconds += result.encode_seconds
        self.decode_seconds += result.decode_seconds

    def as_dict(self) -> dict:
        steps = self.decoder_steps
        return dict(windows=self.windows, tokens=self.tokens, decoder_steps=steps,
                    tokens_per_step=self.tokens / steps if steps else 0.0,
                    encode_seconds=self.encode_seconds, decode_seconds=self.decode_seconds)


class _MedusaDecodingProxy:
    """Looks like the model to whisper.transcribe, but decodes with Medusa."""

    def __init__(self, model, medusa_options: dict, stats: TranscriptionStats):
        self._model, self._medusa_options, self._stats = model, medusa_options, stats

    def __getattr__(self, name):
        return getattr(self._model, name)

    def __call__(self, *args, **kwargs):
        return self._model(*args, **kwargs)

    def decode(self, mel, options: DecodingOptions = DecodingOptions(), **kwargs):
        result = decode(self._model, mel, as_medusa_options(options, **kwargs, **self._medusa_options))
        for r in result if isinstance(result, list) else [result]:
            self._stats.add(r)
        return result


def transcribe(model, audio: Union[str, Path, np.ndarray, torch.Tensor], **options) -> dict:
    """Transcribe audio of any length; returns whisper's dict plus a ``medusa`` entry of statistics.

    options : whisper.transcribe's keyword arguments, plus MedusaDecodingOptions' own fields
              (``mode``, ``num_heads``, ``typical_epsilon``, ``typical_alpha``, ``regulation_start``,
              ``regulation_factor``)
    """
    medusa_options = {k: options.pop(k) for k in list(options) if k in MEDUSA_ONLY_OPTIONS}
    as_medusa_options(MedusaDecodingOptions(), **medusa_options)  # reject bad values before any work
    if isinstance(audio, (str, Path)):
        from .audio import load_audio

        audio = load_audio(audio)
    if model.device.type == "cpu":
        options.setdefault("fp16", False)  # whisper would warn and fall back to fp32 anyway
    stats = TranscriptionStats()
    result = whisper.transcribe(_MedusaDecodingProxy(model, medusa_options, stats), audio, **options)
    result["medusa"] = stats.as_dict()
    return result
