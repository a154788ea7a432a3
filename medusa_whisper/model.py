"""MedusaWhisper: openai-whisper's model with Medusa heads attached.

It subclasses ``whisper.model.Whisper`` and leaves every whisper module as it is, so
``whisper.decode(model, ...)`` and ``whisper.transcribe(model, ...)`` still give vanilla results;
Medusa decoding goes through ``medusa_whisper.decode`` and ``model.transcribe``.
"""

from __future__ import annotations

import re
from dataclasses import replace
from typing import Optional

from whisper.model import ModelDimensions, Whisper

from .drafting.draft_head import DraftHead
from .drafting.heads import MedusaConfig, MedusaHeads
# as whisper/model.py imports its transcribe: the model offers it as a method, while transcription/longform.py
# takes the model as an argument and never imports this module
from .transcription.longform import transcribe as transcribe_function

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
        return transcribe_function(self, audio, **options)


def model_shapes(dims: ModelDimensions, medusa: MedusaConfig) -> dict:
    """{name: shape} of every tensor of a MedusaWhisper of these dimensions and heads.

    Layers of one stack all have the same shapes, so a model with one layer per stack is built and
    its layer 0 repeated: a few MB instead of the full model (large-v3 would be 6 GB; the meta
    device cannot build whisper's sparse alignment-heads buffer).
    """
    model = MedusaWhisper(replace(dims, n_audio_layer=1, n_text_layer=1), medusa)
    shapes = {}
    for name, tensor in model.state_dict().items():
        match = re.match(r"^(encoder|decoder)\.blocks\.0\.(.+)$", name)
        if match is None:
            shapes[name] = tuple(tensor.shape)
            continue
        stack, rest = match.groups()
        for i in range(dims.n_audio_layer if stack == "encoder" else dims.n_text_layer):
            shapes[f"{stack}.blocks.{i}.{rest}"] = tuple(tensor.shape)
    return shapes
