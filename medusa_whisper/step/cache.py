"""Cross-attention keys and values, computed once per window from its encoder output.

The self-attention's keys and values live in the decoder step's own buffers (``fixed.FixedStep``:
written at explicit slots, so rejecting speculated tokens needs no rollback: the next pass writes
over them, and no row reads a slot after its own); these are the audio's, which every pass reads.
"""

from __future__ import annotations

from typing import List, Optional

import torch
from torch import Tensor


class CrossKV:
    """Cross-attention keys and values, computed once per audio from the encoder output.

    keys[i], values[i] : shape = (batch, n_head, n_audio_ctx, d_head), contiguous

    Stored head-major: attention reads them that way in every decoder pass, and a contiguous copy
    made once per audio is read faster than a strided view of (batch, n_audio_ctx, n_state) (one
    base pass: 7 % less time in float32, 25 % with int8 linears, measured with the CPU clock).
    """

    def __init__(self, blocks, audio_features: Tensor, dtype: Optional[torch.dtype] = None):
        """dtype : to store them in (None: the features' own). Keys stored in a narrower dtype than the
        features' are computed from centred features (see _centred)."""
        dtype = dtype or audio_features.dtype
        narrower = torch.finfo(dtype).bits < torch.finfo(audio_features.dtype).bits
        key_input = _centred(audio_features) if narrower else audio_features
        self.keys: List[Tensor] = [_head_major(_product_in(b.cross_attn.key, key_input, dtype), b.cross_attn.n_head, dtype)
                                   for b in blocks]
        self.values: List[Tensor] = [_head_major(_product_in(b.cross_attn.value, audio_features, dtype),
                                                 b.cross_attn.n_head, dtype) for b in blocks]


def _centred(features: Tensor) -> Tensor:
    """Features minus their mean over the audio positions (per batch item and channel).

    The keys made from them are whisper's keys minus their mean (exactly, in exact arithmetic: the
    key projection is linear and has no bias), and attention is unchanged by that: a query's scores
    all shift by q . mean, and softmax ignores a shift. But the scores get smaller, and bfloat16
    rounds a key and a score relative to its size: with whisper's raw keys, bfloat16 cross-attention
    took tiny.en int8's WER on the bench clips from 15.0 % to 27.4 % (hallucinated repeats); with
    centred keys it is 14.6 %. Centring the features rather than the keys lets the key product round
    to bfloat16 once, after the common part is gone."""
    return features - features.mean(dim=1, keepdim=True)


def _product_in(linear, x: Tensor, dtype: torch.dtype) -> Tensor:
    """``linear(x)`` in ``dtype``: straight from the product where the layer offers it
    (``Int8Linear.many_rows_in``: 1,500 rows a layer, no float32 copy of them to make and cast)."""
    direct = getattr(linear, "many_rows_in", None)
    out = direct(x, dtype) if direct is not None else None
    return out if out is not None else linear(x)


def _head_major(x: Tensor, n_head: int, dtype: torch.dtype) -> Tensor:
    batch, n, n_state = x.shape
    return x.view(batch, n, n_head, n_state // n_head).transpose(1, 2).to(dtype).contiguous()  # (B, H, n, d_head)
