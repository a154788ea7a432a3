"""medusa_whisper: Whisper with Medusa heads, decoding several tokens per decoder step.

A drop-in for openai-whisper: ``load_model``, ``decode`` and ``model.transcribe`` mirror
``whisper.load_model``, ``whisper.decode`` and ``whisper.transcribe``.
"""

from .decoding import MedusaDecodingOptions, MedusaDecodingResult, decode
from .heads import MedusaConfig
from .loading import DEFAULT_MODEL, available_models, load_model
from .model import MedusaWhisper

__version__ = "0.1.0"

__all__ = [
    "DEFAULT_MODEL",
    "MedusaConfig",
    "MedusaDecodingOptions",
    "MedusaDecodingResult",
    "MedusaWhisper",
    "available_models",
    "decode",
    "load_model",
]
