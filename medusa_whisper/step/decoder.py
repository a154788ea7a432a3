"""The text decoder's forward pass with explicit positions, cache slots and attention mask.

Differs from whisper: ``whisper.model.TextDecoder.forward`` reads its position offset from a hook
cache and, with SDPA and more than one query token, uses ``is_causal=True``, which PyTorch aligns
to the upper-left corner: wrong when the queries come after cached keys. Verifying several
speculated tokens in one pass needs the lower-right (or, for a tree, an arbitrary) mask, so this
module re-implements the forward as plain functions over whisper's own modules and weights. The
whisper modules themselves are untouched, so ``whisper.decode`` on the same model stays vanilla.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import List, Optional, Tuple

import torch
import torch.nn.functional as F
from torch import Tensor, nn
import whisper.model
from whisper.model import MultiHeadAttention, ResidualAttentionBlock, TextDecoder

from .attention import attended_slots, every_slot_mask, invariant_attention, invariant_dtype, row_invariant
from .cache import CrossKV, StaticKVCache
from .attention import chain_mask  # noqa: F401 (re-exported: the decoder's callers build their masks with it)
from .projection import of as projection_of
from .routes import WEIGHT_FIRST, WHISPER_ROUTE, route_for, weight_times_rows  # noqa: F401 (re-exported)
from .together import rows_together, together


_PLAIN_LINEARS = (nn.Linear, whisper.model.Linear)


@dataclass
class DecoderCache:
    """Everything the decoder keeps between passes for one batch of audio."""

    self_attn: StaticKVCache
    cross_attn: CrossKV
    dtype: torch.dtype = torch.float32  # of the residual stream (the audio features')

    @property
    def length(self) -> int:
        return self.self_attn.length

    def rollback(self, length: int) -> None:
        self.self_attn.rollback(length)

    def compact(self, keep: List[int], start: int) -> None:
        self.self_attn.compact(keep, start)

    def batch_items(self, first: int, stop: int) -> "DecoderCache":
        """The cache of batch items [first, stop), sharing this one's storage."""
        return DecoderCache(self.self_attn.batch_items(first, stop), self.cross_attn.batch_items(first, stop), self.dtype)


def new_cache(decoder: TextDecoder, audio_features: Tensor, rows_per_audio: int = 1) -> DecoderCache:
    """Allocate the self-attention buffers and compute the cross-attention keys/values once.

    audio_features : shape = (batch, n_audio_ctx, n_audio_state)
    rows_per_audio : sequences decoded per audio (sampling's best_of, beam search's beams): the
                     self-attention cache gets batch * rows_per_audio items, rows r*k..r*k+k-1 of
                     audio r, and they all read that audio's one copy of the cross keys and values
    """
    n_ctx = decoder.positional_embedding.shape[0]
    self_attn, cross_attn = block_caches(decoder.blocks, n_ctx, audio_features, rows_per_audio)
    return DecoderCache(self_attn=self_attn, cross_attn=cross_attn, dtype=audio_features.dtype)


def block_caches(blocks, n_ctx: int, audio_features: Tensor, rows_per_audio: int = 1) -> Tuple[StaticKVCache, CrossKV]:
    """The self-attention cache and cross-attention keys/values for ``blocks`` (the decoder's, or a
    draft head's one block), in the layout their attention reads: head-major bfloat16 over every
    slot for ``invariant_attention``, else the features' dtype. ``rows_per_audio`` as for ``new_cache``."""
    batch, _, n_state = audio_features.shape
    dtype, device = audio_features.dtype, audio_features.device
    fixed = row_invariant(blocks[0].attn)
    # fixed-length attention reads every slot (with weight 0 beyond the written ones): no garbage
    self_attn = StaticKVCache(len(blocks), batch * rows_per_audio, n_ctx, n_state, invariant_dtype(blocks[0].attn) if fixed else dtype,
                              device, zeroed=fixed, n_head=blocks[0].attn.n_head if fixed else None)
    return self_attn, cross_cache(blocks, audio_features)


def cross_cache(blocks, audio_features: Tensor) -> CrossKV:
    """The cross-attention keys and values of ``audio_features`` for ``blocks``, in the dtype their
    attention reads, computed with the rows together: once per window, from its encoder output alone."""
    cross = blocks[0].cross_attn
    with rows_together():
        return CrossKV(blocks, audio_features, invariant_dtype(cross) if row_invariant(cross) else None)


def attend(attn: MultiHeadAttention, x: Tensor, k: Tensor, v: Tensor, mask: Optional[Tensor],
           q: Optional[Tensor] = None, slots: Optional[int] = None) -> Tensor:
    """Multi-head attention of queries from x over given keys and values.

    x    : shape = (batch, n_query, n_state), already layer-normed
    k, v : shape = (batch, n_key, n_state) or head-major (batch, n_head, n_key, d_head), already projected
    mask : shape = (n_query, n_key) bool, True where attention is allowed; or None
    q    : the queries, when already projected (``self_attention_qkv``)
    slots: for invariant attention over the first slots of a self-attention cache, its capacity

    Modules marked ``rows_alone`` (converted compute types, see compute.py) attend one query row at
    a time over exactly the keys it may see, as a pass over that row alone would: batched attention
    kernels round differently for different numbers of rows, and int8 or bfloat16 linears after
    them turn such last-bit differences into different logits, so verifying K rows at once would
    no longer equal greedy decoding. Not in a pass whose rows are only computed together (a
    prompt, ``together.rows_together``).
    """
    q = linear(attn.query, x) if q is None else q
    if row_invariant(attn):
        return linear(attn.out, invariant_attention(q, k, v, attn.n_head, mask, slots))
    if q.shape[1] > 1 and getattr(attn, "rows_alone", False) and not together():
        return attn.out(torch.cat([_attention(q[:, i:i + 1], *_visible(k, v, mask, i), attn.n_head, None)
                                   for i in range(q.shape[1])], dim=1))
    return linear(attn.out, _attention(q, k, v, attn.n_head, mask))


def linear(module: nn.Module, x: Tensor) -> Tensor:
    """``module(x)`` for a linear layer, by the route measured fastest on this CPU for its rows.

    Departs from whisper's ``F.linear(x, W, b)`` for float32 ``nn.Linear`` layers on a CPU when x
    holds a step's few rows and ``routes.route_for`` measured ``W @ x.T`` faster here. Other layers
    (compute types' converted linears) are called as they are.
    """
    if type(module) not in _PLAIN_LINEARS or x.device.type != "cpu" or x.dtype != module.weight.dtype:
        return module(x)
    flat = x.reshape(-1, x.shape[-1])
    if route_for("linear", module.weight, flat.shape[0]) != WEIGHT_FIRST:
        return module(x)
    out = weight_times_rows(module.weight, module.bias, flat)
    return out.reshape(*x.shape[:-1], out.shape[-1])


def _attention(q: Tensor, k: Tensor, v: Tensor, n_head: int, mask: Optional[Tensor]) -> Tensor:
    """(batch, n_query, n_state) queries over (batch, n_key, n_state) keys and values, heads merged;
    keys and values may also come head-major, (batch, n_head, n_key, d_head), as CrossKV keeps them."""
    batch, n_query, n_state = q.shape
    q = q.view(batch, n_query, n_head, -1).transpose(1, 2)  # (B, H, n_query, d_head)
    if k.dim() == 3:
        k = k.view(batch, k.shape[1], n_head, -1).transpose(1, 2)  # (B, H, n_key, d_head)
        v = v.view(batch, v.shape[1], n_head, -1).transpose(1, 2)
    out = F.scaled_dot_product_attention(q, k, v, attn_mask=mask)  # (B, H, n_query, d_head)
    return out.transpose(1, 2).reshape(batch, n_query, n_state)


def _visible(k: Tensor, v: Tensor, mask: Optional[Tensor], row: int) -> Tuple[Tensor, Tensor]:
    """The keys and values query ``row`` may see, in order: a prefix when the mask is causal."""
    if mask is None:
        return k, v
    allowed = mask[row]
    n = int(allowed.sum())
    if bool(allowed[:n].all()):
        return k[:, :n], v[:, :n]
    index = allowed.nonzero()[:, 0]  # a tree: the cached prefix and this row's ancestors
    return k.index_select(1, index), v.index_select(1, index)


def block_forward(
    block: ResidualAttentionBlock,
    x: Tensor,
    cache: StaticKVCache,
    layer: int,
    start: int,
    cross_k: Tensor,
    cross_v: Tensor,
    mask: Optional[Tensor],
) -> Tensor:
    """One residual attention block; writes this pass's keys/values at slots [start, start+n).

    mask : as ``self_attention_mask`` gives it for this block's self-attention
    """
    h = norm(block.attn_ln, x)
    q, k, v = self_attention_qkv(block.attn, h)
    k, v = cache.write(layer, start, k, v)
    slots = None
    if row_invariant(block.attn):  # the mask's slots (attended_slots), the unwritten ones masked
        slots = cache.capacity
        k, v = cache.keys[layer][..., :mask.shape[-1], :], cache.values[layer][..., :mask.shape[-1], :]
    x = x + attend(block.attn, h, k, v, mask, q=q, slots=slots)
    x = x + cross_attention(block, x, cross_k, cross_v)
    return x + _mlp(block.mlp, norm(block.mlp_ln, x))


def cross_attention(block: ResidualAttentionBlock, x: Tensor, cross_k: Tensor, cross_v: Tensor) -> Tensor:
    """The block's cross-attention of x (batch * k, n, n_state) over keys and values of ``batch``
    audios: when k > 1 (several sequences per audio, see ``new_cache``), the k rows of one audio are
    its queries side by side (cross-attention has no mask), so each audio's keys and values are
    stored and read once per pass, not once per sequence as whisper's repeated features are."""
    audios = cross_k.shape[0]
    c = norm(block.cross_attn_ln, x)
    if x.shape[0] == audios:
        return attend(block.cross_attn, c, cross_k, cross_v, None)
    rows, n, n_state = x.shape
    out = attend(block.cross_attn, c.reshape(audios, (rows // audios) * n, n_state), cross_k, cross_v, None)
    return out.reshape(rows, n, n_state)


def self_attention_mask(attn: MultiHeadAttention, mask: Optional[Tensor], start: int, n: int,
                        cache: StaticKVCache) -> Optional[Tensor]:
    """The mask a pass of n rows from slot ``start`` gives ``block_forward``: ``chain_mask``'s (or a
    tree's) as it is, widened for ``invariant_attention`` to the slots it attends over
    (``attended_slots``: the written ones rounded up, or every slot). Made once per pass."""
    if not row_invariant(attn):
        return mask
    return every_slot_mask(mask, start, n, _attended_slots(cache, start + n))


def _attended_slots(cache: StaticKVCache, end: int) -> int:
    """``attended_slots`` for a head-major cache (invariant attention's) whose passes end at slot ``end``."""
    return attended_slots(end, cache.capacity, cache.keys.dtype, cache.n_head, cache.keys.shape[-1])


def self_attention_qkv(attn: MultiHeadAttention, h: Tensor) -> Tuple[Tensor, Tensor, Tensor]:
    """Queries, keys and values of a self-attention; one product for the three where they are int8
    (``attn.qkv``, made at load by compute.fuse_qkv), whisper's three otherwise."""
    fused = attn.__dict__.get("qkv")
    if fused is not None:
        return fused(h).split(attn.query.out_features, dim=-1)
    return linear(attn.query, h), linear(attn.key, h), linear(attn.value, h)


def norm(ln: nn.Module, x: Tensor) -> Tensor:
    """``ln(x)`` for a LayerNorm: whisper's casts x to float32 and back, two calls that return their
    input when x and the norm are float32 already (every CPU compute type's residual stream), so
    there the norm runs alone, with the same arithmetic."""
    if type(ln) is whisper.model.LayerNorm and x.dtype == torch.float32 and ln.weight.dtype == torch.float32:
        return F.layer_norm(x, ln.normalized_shape, ln.weight, ln.bias, ln.eps)
    return ln(x)


def _mlp(mlp: nn.Module, x: Tensor) -> Tensor:
    """whisper's Sequential(Linear, GELU, Linear) through ``linear`` (which calls a converted layer as it
    is); any other module as it is."""
    if isinstance(mlp, nn.Sequential) and len(mlp) == 3:
        return linear(mlp[2], mlp[1](linear(mlp[0], x)))
    return mlp(x)


def decoder_hidden(
    decoder: TextDecoder,
    tokens: Tensor,
    positions: Tensor,
    cache: DecoderCache,
    start: int,
    mask: Optional[Tensor],
) -> Tensor:
    """Run the text decoder over new tokens and return its post-LayerNorm states.

    tokens    : shape = (batch, n), the tokens not yet in the cache
    positions : shape = (n,), their positions in the sequence (for the positional embedding)
    start     : the cache slot where the first of them is written (== positions[0] for a chain)
    mask      : shape = (n, start + n) bool, or None for a single token
    returns   : shape = (batch, n, n_state)
    """
    x = decoder.token_embedding(tokens) + decoder.positional_embedding[positions]
    x = x.to(cache.dtype)
    mask = self_attention_mask(decoder.blocks[0].attn, mask, start, tokens.shape[1], cache.self_attn)
    for i, block in enumerate(decoder.blocks):
        x = block_forward(
            block, x, cache.self_attn, i, start, cache.cross_attn.keys[i], cache.cross_attn.values[i], mask
        )
    return norm(decoder.ln, x)


def project(decoder: TextDecoder, states: Tensor) -> Tensor:
    """Vocabulary logits through the tied token embedding, by the decoder's projection module
    (projection.py: its compute type's kernel), in fp32 as whisper returns them.

    states : shape = (..., n_state) -> (..., n_vocab)
    """
    return projection_of(decoder)(states).float()


def next_token_logits(model: nn.Module, states: Tensor) -> Tensor:
    """The next-token logits greedy decoding reads from decoder states: through a Medusa model's
    base head first when it has one (``heads.base_state``), which whisper's own decoder would not apply.

    states : shape = (..., n_state) -> (..., n_vocab)
    """
    heads = getattr(model, "medusa", None)
    return project(model.decoder, heads.base_state(states) if heads is not None else states)
