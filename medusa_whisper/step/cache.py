"""A static key/value cache for the text decoder, with rollback.

Differs from whisper: openai-whisper keeps its cache in forward hooks that grow by ``torch.cat`` and
infers the position from the cache length, so rejected tokens cannot be taken back. Here buffers
are allocated once for ``n_text_ctx`` slots and written at explicit slots; ``length`` counts the
slots. ``write`` advances it (a pass's new slots count at once); ``rollback`` and ``compact`` only
shrink it: rejecting speculated tokens is a length reset (chain) or a compaction of the kept slots
to the front (tree). Slots at or beyond ``length`` are stale: they are overwritten by the next
write and never attended to, because attention reads only ``[:end]`` of what was written.
"""

from __future__ import annotations

from typing import List, Optional, Tuple

import torch
from torch import Tensor


class StaticKVCache:
    """Self-attention keys and values of ``n_layer`` layers.

    keys, values : shape = (n_layer, batch, n_ctx, n_state), or head-major
                   (n_layer, batch, n_head, n_ctx, d_head) when ``n_head`` is given
    """

    def __init__(self, n_layer: int, batch: int, n_ctx: int, n_state: int, dtype: torch.dtype, device,
                 zeroed: bool = False, n_head: Optional[int] = None):
        # empty, not zeros: a slot is always written before it is read; zeroed for attention that reads
        # every slot (invariant_attention), where an unwritten slot gets weight 0 and must not be NaN.
        # Head-major for attention that multiplies each head's keys as one matrix (a strided view of
        # (n_ctx, n_state) is copied by every bfloat16 product: 0.11 ms per base layer and pass)
        shape = (n_layer, batch, n_ctx, n_state) if n_head is None else (
            n_layer, batch, n_head, n_ctx, n_state // n_head)
        make = torch.zeros if zeroed else torch.empty
        self.keys = make(*shape, dtype=dtype, device=device)
        self.values = make(*shape, dtype=dtype, device=device)
        self.n_head = n_head
        self.slot_dim = 2 if n_head is None else 3
        self.length = 0

    @property
    def capacity(self) -> int:
        return self.keys.shape[self.slot_dim]

    def write(self, layer: int, start: int, k: Tensor, v: Tensor) -> Tuple[Tensor, Tensor]:
        """Store k, v (batch, n, n_state) at slots [start, start+n); return all slots [0, start+n).

        The cache then holds slots [0, start+n): ``length`` becomes start+n (each layer of a pass
        writes the same slots, so the length is the pass's end). ``start`` may not be beyond
        ``length``: the slots between would count without having been written.
        """
        end = start + k.shape[1]
        if end > self.capacity:
            raise RuntimeError(f"KV cache overflow: {end} > {self.capacity} slots")
        if start > self.length:
            raise ValueError(f"cannot write at slot {start}: the cache holds {self.length} slots")
        self.length = end
        if self.n_head is None:
            self.keys[layer, :, start:end] = k
            self.values[layer, :, start:end] = v
            return self.keys[layer, :, :end], self.values[layer, :, :end]
        batch, n, n_state = k.shape
        self.keys[layer, :, :, start:end] = k.view(batch, n, self.n_head, -1).transpose(1, 2)
        self.values[layer, :, :, start:end] = v.view(batch, n, self.n_head, -1).transpose(1, 2)
        return self.keys[layer, :, :, :end], self.values[layer, :, :, :end]

    def rollback(self, length: int) -> None:
        """Keep slots [0, length): the chain case, where accepted tokens form a prefix. Only shrinks
        (or keeps) the length: slots are added by ``write``."""
        if not 0 <= length <= self.length:
            raise ValueError(f"cannot roll back to {length} slots: the cache holds {self.length}")
        self.length = length

    def compact(self, keep: List[int], start: int) -> None:
        """Move the slots in ``keep`` (ascending, all >= start) to [start, start+len(keep)).

        The tree case: accepted tokens are scattered among the speculated slots. Afterwards
        ``length == start + len(keep)``.
        """
        if keep:
            src = torch.tensor(keep, device=self.keys.device)
            dst = (slice(None),) * self.slot_dim + (slice(start, start + len(keep)),)
            # index_select copies first, so overlapping source and destination are safe
            self.keys[dst] = self.keys.index_select(self.slot_dim, src)
            self.values[dst] = self.values.index_select(self.slot_dim, src)
        self.length = start + len(keep)

    def batch_items(self, first: int, stop: int) -> "StaticKVCache":
        """A cache over batch items [first, stop) of this one, sharing its storage (a view: writes go
        here). Batched decoding gives each stream its item and runs a window's prompt on it alone."""
        view = object.__new__(StaticKVCache)
        view.keys, view.values = self.keys[:, first:stop], self.values[:, first:stop]
        view.n_head, view.slot_dim, view.length = self.n_head, self.slot_dim, 0
        return view

    def reorder(self, items: Tensor) -> None:
        """Batch item b becomes a copy of item ``items[b]`` (beam search keeps the best beams, some of
        them twice; whisper's ``rearrange_kv_cache``). Every slot is copied, written or not."""
        self.keys = self.keys.index_select(1, items)
        self.values = self.values.index_select(1, items)


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

    def batch_items(self, first: int, stop: int) -> "CrossKV":
        """The keys and values of batch items [first, stop), sharing this one's storage."""
        view = object.__new__(CrossKV)
        view.keys = [k[first:stop] for k in self.keys]
        view.values = [v[first:stop] for v in self.values]
        return view


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
