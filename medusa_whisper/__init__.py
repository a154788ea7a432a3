"""medusa_whisper: Whisper with Medusa heads, decoding several tokens per decoder step.

A drop-in for openai-whisper: ``import medusa_whisper as whisper`` keeps a whisper script working.
``load_model``, ``transcribe`` and ``decode`` mirror ``whisper.load_model``, ``whisper.transcribe``
and ``whisper.decode`` (same arguments, same results in lossless mode), with Medusa decoding;
the audio helpers and option types are whisper's own.
"""

from whisper.audio import log_mel_spectrogram, pad_or_trim
from whisper.decoding import DecodingOptions, DecodingResult, detect_language

from .audio.files import load_audio
from .decoding.window import MedusaDecodingResult, decode
from .options import MedusaDecodingOptions
from .drafting.heads import MedusaConfig
from .loading import DEFAULT_MODEL, available_models, load_model
from .model import MedusaWhisper
from .transcription.longform import transcribe

__version__ = "0.1.0"

__all__ = [
    "DEFAULT_MODEL",
    "DecodingOptions",
    "DecodingResult",
    "MedusaConfig",
    "MedusaDecodingOptions",
    "MedusaDecodingResult",
    "MedusaWhisper",
    "available_models",
    "decode",
    "detect_language",
    "load_audio",
    "load_model",
    "log_mel_spectrogram",
    "pad_or_trim",
    "transcribe",
]
