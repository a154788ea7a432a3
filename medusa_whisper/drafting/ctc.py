"""The CTC draft head: one pass over the encoder output spells the whole window's text.

Speech is not open-ended text: after the encoder, the window's words are already in its output.
A small head on the frozen encoder output (frames pooled by ``stride``, a few residual layers,
then a projection onto ``n_units`` pieces of the main model's own BPE plus a CTC blank) is trained
with CTC against the main model's greedy transcripts. Its greedy path is a draft of the whole
window, with the frame where each piece was heard. The decoder then verifies the draft a chunk
per pass (``ctc_proposer.CtcProposer``): the output is still the main model's greedy output.

Shapes: the encoder gives (batch, n_audio_ctx, n_audio_state), 20 ms per frame; the head works at
``stride`` x 20 ms per frame.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field

import torch
import torch.nn.functional as F
from torch import Tensor, nn
from whisper.model import ModelDimensions

from .ctc_draft import CtcDraft, greedy_draft
from .ctc_proposer import DraftSettings
from .ctc_units import Units
from .draft_head import DraftHead

ENCODER_FRAME_SECONDS = 0.02  # whisper: 1500 encoder frames per 30-s window


@dataclass
class CtcConfig:
    encoding: str = "gpt2"  # the main model's BPE: "gpt2" (.en models) or "multilingual"
    n_units: int = 256  # symbols: the encoding's first n_units tokens (256: bytes, i.e. characters)
    width: int = 384  # the head's channels
    stride: int = 2  # encoder frames pooled per head frame
    layers: int = 2  # residual blocks
    block: str = "conv"  # "conv" (depthwise convolution + feed-forward) or "attn" (self-attention + feed-forward)
    kernel: int = 5  # the conv block's kernel, in head frames
    heads: int = 4  # the attention block's heads
    dropout: float = 0.1  # training only
    # how the proposer drafts (see ctc_proposer.DraftSettings); kept with the weights because they
    # are measured for this head and this base model
    decoding: dict = field(default_factory=dict)


class ConvBlock(nn.Module):
    """x + FFN(GELU(depthwise conv(LN(x)))): local context at the head's frame rate."""

    def __init__(self, width: int, kernel: int, dropout: float):
        super().__init__()
        self.ln = nn.LayerNorm(width)
        self.conv = nn.Conv1d(width, width, kernel, padding=kernel // 2, groups=width)
        self.up = nn.Linear(width, 2 * width)
        self.down = nn.Linear(2 * width, width)
        self.dropout = nn.Dropout(dropout)

    def forward(self, x: Tensor) -> Tensor:
        """x : shape = (batch, frames, width)"""
        h = self.conv(self.ln(x).transpose(1, 2)).transpose(1, 2)  # (B, T, W)
        h = self.down(self.dropout(F.gelu(self.up(F.gelu(h)))))
        return x + self.dropout(h)


class AttentionBlock(nn.Module):
    """A pre-LN transformer layer over the whole window: context beyond a few frames."""

    def __init__(self, width: int, heads: int, dropout: float):
        super().__init__()
        self.layer = nn.TransformerEncoderLayer(width, heads, 2 * width, dropout, activation="gelu",
                                                batch_first=True, norm_first=True)

    def forward(self, x: Tensor) -> Tensor:
        return self.layer(x)


class CtcHead(DraftHead):
    kind = "ctc"

    def __init__(self, dims: ModelDimensions, config: CtcConfig):
        super().__init__()
        self.dims, self.config = dims, config
        self.units = Units(config.encoding, config.n_units)
        d_in, width = dims.n_audio_state, config.width
        self.ln_in = nn.LayerNorm(d_in)
        # frame pooling: each head frame sees ``stride`` encoder frames (a strided linear)
        self.pool = nn.Conv1d(d_in, width, config.stride, stride=config.stride)
        if config.block == "conv":
            blocks = [ConvBlock(width, config.kernel, config.dropout) for _ in range(config.layers)]
        elif config.block == "attn":
            blocks = [AttentionBlock(width, config.heads, config.dropout) for _ in range(config.layers)]
        else:
            raise ValueError(f"unknown CTC block {config.block!r} (conv or attn)")
        self.blocks = nn.ModuleList(blocks)
        self.ln_out = nn.LayerNorm(width)
        self.out = nn.Linear(width, config.n_units + 1)  # the last column is the CTC blank

    @property
    def blank(self) -> int:
        return self.config.n_units

    @property
    def frame_seconds(self) -> float:
        return self.config.stride * ENCODER_FRAME_SECONDS

    def config_dict(self) -> dict:
        return asdict(self.config)

    def forward(self, audio_features: Tensor) -> Tensor:
        """Log-probabilities of the units and the blank per head frame.

        audio_features : shape = (batch, n_audio_ctx, n_audio_state), any float dtype
        returns        : shape = (batch, n_audio_ctx // stride, n_units + 1), float32
        """
        x = self.ln_in(audio_features.to(self.ln_in.weight.dtype))  # LayerNorms keep float32 at every compute type
        x = self.pool(x.transpose(1, 2)).transpose(1, 2)  # (B, T / stride, W)
        x = F.gelu(x)
        for block in self.blocks:
            x = block(x)
        return F.log_softmax(self.out(self.ln_out(x)).float(), dim=-1)

    @torch.no_grad()
    def draft(self, audio_features: Tensor) -> CtcDraft:
        """The greedy CTC draft of one window.

        audio_features : shape = (1, n_audio_ctx, n_audio_state) or (n_audio_ctx, n_audio_state)
        """
        if audio_features.ndim == 2:
            audio_features = audio_features[None]
        logprobs = self(audio_features)[0]  # (T, n_units + 1)
        return greedy_draft(logprobs, self.units, self.blank, self.frame_seconds)

    def draft_settings(self) -> DraftSettings:
        """How its proposer drafts: the ``decoding`` settings over the defaults."""
        return DraftSettings.from_dict(self.config.decoding)


# pass-cost tables a head file may hold: measured on the machine that trained the head, so dropped at
# load; DraftSettings.for_model measures them again where the head runs (pass_costs.py)
MACHINE_SETTINGS = ("row_costs", "int8_row_costs")


def build(dims: ModelDimensions, config: dict) -> CtcHead:
    """The head a file describes (``draft_head.build_draft_head``), without its machine's pass costs."""
    known = {f for f in CtcConfig.__dataclass_fields__}
    unknown = sorted(set(config) - known)
    if unknown:
        raise ValueError(f"unknown CTC head settings {unknown}")
    decoding = {k: v for k, v in config.get("decoding", {}).items() if k not in MACHINE_SETTINGS}
    return CtcHead(dims, CtcConfig(**{**config, "decoding": decoding}))


def head_macs(dims: ModelDimensions, config: CtcConfig) -> int:
    """Multiply-accumulates of one window through the head (a guide; the head's cost is measured)."""
    frames = dims.n_audio_ctx // config.stride
    w = config.width
    per_block = w * config.kernel + 4 * w * w if config.block == "conv" else 4 * w * w + 4 * w * w + 2 * frames * w
    return frames * (dims.n_audio_state * config.stride * w + config.layers * per_block + w * (config.n_units + 1))

