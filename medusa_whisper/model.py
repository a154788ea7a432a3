"""MedusaWhisper: openai-whisper's model with Medusa heads attached.

It subclasses ``whisper.model.Whisper`` and leaves every whisper module as it is, so
``whisper.decode(model, ...)`` and ``whisper.transcribe(model, ...)`` still give vanilla results;
Medusa decoding goes through ``medusa_whisper.decode`` and ``model.transcribe``.
"""

from __future__ import annotations

from typing import Optional

from whisper.model import ModelDimensions, Whisper

from .drafting.draft_head import DraftHead

from .heads import MedusaConfig, MedusaHeads

MEDUSA_PREFIX = "medusa."


class MedusaWhisper(Whisper):
    def __init__(self, dims: ModelDimensions, medusa: MedusaConfig = MedusaConfig()):
        super().__init__(dims)
        self.medusa = MedusaHeads(dims, medusa)
        if self.medusa.block is not None:
            self.medusa.init_block_from(self.decoder.blocks[-1])
        # a trained draft head (EAGLE, CTC; see drafting/draft_head.py), set by the loader: when
        # there is one it proposes the candidates instead of the Medusa heads
        self.draft_head: Optional[DraftHead] = None

    @property
    def medusa_config(self) -> MedusaConfig:
        return self.medusa.config

    @property
    def num_heads(self) -> int:
        return self.medusa.num_heads

    def load_whisper_state_dict(self, state_dict: dict) -> None:
        """Load openai-whisper weights; only the Medusa parameters may be absent."""
        result = self.load_state_dict(state_dict, strict=False)
        missing = [k for k in result.missing_keys if not k.startswith(MEDUSA_PREFIX)]
        if missing or result.unexpected_keys:
            raise RuntimeError(f"checkpoint does not fit the model: missing {missing}, unexpected {result.unexpected_keys}")
        if self.medusa.block is not None and not any(k.startswith(MEDUSA_PREFIX + "block.") for k in state_dict):
            self.medusa.init_block_from(self.decoder.blocks[-1])

    def heads_state_dict(self) -> dict:
        """The Medusa parameters alone, as stored in a heads file under weights/."""
        return {k[len(MEDUSA_PREFIX):]: v for k, v in self.state_dict().items() if k.startswith(MEDUSA_PREFIX)}

    def load_heads_state_dict(self, state_dict: dict) -> None:
        self.medusa.load_state_dict(state_dict, strict=True)

    def transcribe(self, audio, **options) -> dict:  # differs from whisper: Medusa decoding inside
        from .transcribe import transcribe

        return transcribe(self, audio, **options)
