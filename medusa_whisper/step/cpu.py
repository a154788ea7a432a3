"""The CPU's products for the one decoder step (``step.fixed.FixedStep``): one step on every device.

``FixedStep`` owns the buffers, the calls and the order of the arithmetic; a products object says
how it multiplies and attends. CUDA's (``fixed.DenseProducts``) keep every shape fixed for its
graphs. On the CPU that arithmetic is neither the fastest nor the exact one, so ``CpuProducts``
gives the step the CPU's instead:

- the compute type's own modules, called as they are (int8's weight-only kernel, one product for
  q, k and v; float32 linears by the route ``routes`` measured fastest for the rows);
- where the int8 decoder attends row-invariantly (``attention.invariant_attention``, bfloat16 keys
  and values on CPUs with native bfloat16 products), that attention over the written slots rounded
  up (``attended_slots``), so a row gets the same bits in a verification pass, in a batch or alone:
  what makes lossless decoding bit-exact here;
- elsewhere PyTorch's fused kernel over exactly the slots a row sees, one row at a time in a pass of
  several where the model is converted (``rows_alone``), one batch item at a time beside others
  (that kernel is not batch-invariant);
- the cross-attention's keys and values computed with their rows together (``cross_cache``),
  the vocabulary by the compute type's projection (and a ``base_head`` model's head first);
- where all of a pass's layers run on the package's kernels, the layers in one native call
  (``native_decoder.NativeDecoder``, ``native``), for every pass but a prompt's.

So a pass reads on the host where its slots end (nothing is captured on the CPU), and a batch pass
runs over the items in use only.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass
from typing import Callable, List, Optional, Sequence, Tuple

import torch
import torch.nn.functional as F
import whisper.model
from torch import Tensor, nn
from whisper.model import MultiHeadAttention

from . import native
from .attention import attended_slots, invariant_attention, invariant_dtype, row_invariant
from .cache import CrossKV
from .fixed import FixedStep, Layer, UnsupportedStep, heads, product_dtype
from .native_decoder import NativeDecoder
from .projection import next_token_logits, of as projection_of
from .routes import WEIGHT_FIRST, route_for, weight_times_rows
from .together import rows_together, together

_PLAIN_LINEARS = (nn.Linear, whisper.model.Linear)


# ---------------------------------------------------------------- whisper's modules, called the CPU's way


def linear(module: nn.Module, x: Tensor) -> Tensor:
    """``module(x)`` for a linear layer: a pass's float32 rows by the package's row-invariant kernel.

    Departs from whisper's ``F.linear(x, W, b)`` for float32 ``nn.Linear`` layers on a CPU: where
    ``make setup`` built the kernels, the rows of a pass that are not only computed together (a
    prompt's are, ``together.py``) go through ``native.float_rows``, so a verified row, or a stream's
    row in a batch, gets the bits it gets alone (PyTorch's products sum in another order for another
    number of rows). Without them, the route ``routes.route_for`` measured fastest here for the rows.
    Other layers (compute types' converted linears) are called as they are.
    """
    if type(module) not in _PLAIN_LINEARS or x.device.type != "cpu" or x.dtype != module.weight.dtype:
        return module(x)
    flat = x.reshape(-1, x.shape[-1])
    if not together() and native.runs_float(module):
        out = native.float_rows(flat, native.float_form(module), module.bias, module.out_features)
        return out.reshape(*x.shape[:-1], out.shape[-1])
    if route_for("linear", module.weight, flat.shape[0]) != WEIGHT_FIRST:
        return module(x)
    out = weight_times_rows(module.weight, module.bias, flat)
    return out.reshape(*x.shape[:-1], out.shape[-1])


def fused_attention(q: Tensor, k: Tensor, v: Tensor, n_head: int, mask: Optional[Tensor]) -> Tensor:
    """(batch, n_query, n_state) queries over (batch, n_key, n_state) keys and values, heads merged;
    keys and values may also come head-major, (batch, n_head, n_key, d_head), as CrossKV keeps them."""
    batch, n_query, n_state = q.shape
    q = q.view(batch, n_query, n_head, -1).transpose(1, 2)  # (B, H, n_query, d_head)
    if k.dim() == 3:
        k = k.view(batch, k.shape[1], n_head, -1).transpose(1, 2)  # (B, H, n_key, d_head)
        v = v.view(batch, v.shape[1], n_head, -1).transpose(1, 2)
    out = F.scaled_dot_product_attention(q, k, v, attn_mask=mask)  # (B, H, n_query, d_head)
    return out.transpose(1, 2).reshape(batch, n_query, n_state)


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


def cross_cache(blocks, audio_features: Tensor) -> CrossKV:
    """The cross-attention keys and values of ``audio_features`` for ``blocks``, in the dtype their
    attention reads, computed with the rows together: once per window, from its encoder output alone."""
    cross = blocks[0].cross_attn
    with rows_together():
        return CrossKV(blocks, audio_features, invariant_dtype(cross) if row_invariant(cross) else None)


# ---------------------------------------------------------------- the products


@dataclass
class Visible:
    """A pass's mask, (batch, rows, slots), with what the fused kernel needs of it read once on the
    host: how many slots each row sees, whether they are the first ones (a chain's prefix), and
    whether every batch item has the same mask (a window's candidates)."""

    mask: Tensor
    counts: List[List[int]]
    prefix: List[List[bool]]
    shared: bool

    @classmethod
    def of(cls, mask: Tensor) -> "Visible":
        counts = mask.sum(-1)
        prefix = (mask == (torch.arange(mask.shape[-1], device=mask.device) < counts[..., None])).all(-1)
        return cls(mask, counts.tolist(), prefix.tolist(), bool((mask == mask[:1]).all()))

    def seen(self, keys: Tensor, values: Tensor, item: int, row: int) -> Tuple[Tensor, Tensor]:
        """The keys and values row ``row`` of batch item ``item`` sees, in order; keys, values :
        (items, n_head, slots, d_head), of ``item`` or of items with its mask."""
        if self.prefix[item][row]:
            n = self.counts[item][row]
            return keys[:, :, :n], values[:, :, :n]
        index = self.mask[item, row].nonzero()[:, 0]  # a tree: the cached prefix and this row's ancestors
        return keys.index_select(2, index), values.index_select(2, index)


def _groups(batch: int, shared: bool) -> List[slice]:
    """The batch items the fused kernel takes in one call: all of them where their rows are only
    computed together (a window's candidates, ``together.rows_together``) and see the same slots;
    else one at a time, since that kernel gives a row other bits beside other items (streams of a
    batch must get their bits alone)."""
    if batch == 1 or (shared and together()):
        return [slice(0, batch)]
    return [slice(b, b + 1) for b in range(batch)]


class CpuAttention:
    """How the CPU's products attend (see the module's docstring); ``fixed.Attention``'s calls."""

    def __init__(self, block: nn.Module, n_ctx: int):
        self.invariant = row_invariant(block.attn)
        self.rows_alone = bool(getattr(block.attn, "rows_alone", False))
        self.cross_rows_alone = bool(getattr(block.cross_attn, "rows_alone", False))
        self.n_ctx = n_ctx

    def prepare(self, allowed: Tensor):
        """What ``self_attention`` takes for a pass's mask: as it is for the invariant products,
        with its rows' visible slots read once otherwise."""
        return allowed if self.invariant else Visible.of(allowed)

    def where(self, slots: Tensor, start: Optional[int], n_head: int, d_head: int) -> Tuple[Tensor, Optional[int]]:
        return slots, start

    def write(self, keys: Tensor, values: Tensor, k: Tensor, v: Tensor, where: Tuple[Tensor, Optional[int]],
              n_head: int) -> None:
        """New rows' keys and values, (batch, rows, n_state), into the cache: a slot range where the
        rows are consecutive from ``start``, else by index (``scatter_`` into a bfloat16 cache
        costs about 400 us here, an indexed write 12, a range 3.5)."""
        slots, start = where
        batch, rows, _ = k.shape
        if start is not None:
            keys[:, :, start:start + rows] = heads(k, n_head)
            values[:, :, start:start + rows] = heads(v, n_head)
            return
        items = torch.arange(batch, device=slots.device)[:, None]
        keys[items, :, slots] = k.view(batch, rows, n_head, -1).to(keys.dtype)  # index_put does not cast
        values[items, :, slots] = v.view(batch, rows, n_head, -1).to(values.dtype)

    def self_attention(self, q: Tensor, keys: Tensor, values: Tensor, allowed, n_head: int) -> Tensor:
        if self.invariant:
            return invariant_attention(q, keys, values, n_head, allowed, slots=self.n_ctx)
        alone = q.shape[1] == 1 or (self.rows_alone and not together())
        outs = []
        for at in _groups(q.shape[0], allowed.shared):
            first, k, v = at.start, keys[at], values[at]
            if alone:
                rows = [fused_attention(q[at, i:i + 1], *allowed.seen(k, v, first, i), n_head, None)
                        for i in range(q.shape[1])]
                outs.append(rows[0] if len(rows) == 1 else torch.cat(rows, dim=1))
            else:
                outs.append(fused_attention(q[at], k, v, n_head, allowed.mask[first]))
        return outs[0] if len(outs) == 1 else torch.cat(outs)

    def cross_attention(self, q: Tensor, keys: Tensor, values: Tensor, n_head: int) -> Tensor:
        """Queries of (batch, rows, n_state) over the keys and values of ``keys.shape[0]`` audios:
        where there are fewer audios than items (a window's candidates), each audio's items are
        its queries side by side (cross-attention has no mask), so its keys are stored and read
        once a pass, not once per candidate."""
        audios = keys.shape[0]
        if q.shape[0] != audios:
            items, n, n_state = q.shape
            out = self.cross_attention(q.reshape(audios, (items // audios) * n, n_state), keys, values, n_head)
            return out.reshape(items, n, n_state)
        if self.invariant:
            return invariant_attention(q, keys, values, n_head, None)
        alone = q.shape[1] > 1 and self.cross_rows_alone and not together()
        outs = []
        for at in _groups(q.shape[0], True):
            k, v = keys[at], values[at]
            if alone:
                outs.append(torch.cat([fused_attention(q[at, i:i + 1], k, v, n_head, None) for i in range(q.shape[1])],
                                      dim=1))
            else:
                outs.append(fused_attention(q[at], k, v, n_head, None))
        return outs[0] if len(outs) == 1 else torch.cat(outs)


def cpu_layer(block: nn.Module) -> Layer:
    """A whisper ``ResidualAttentionBlock`` with its own (converted) modules as the products."""
    attn, cross, mlp = block.attn, block.cross_attn, block.mlp
    if not (isinstance(mlp, nn.Sequential) and len(mlp) == 3 and isinstance(mlp[1], nn.GELU)):
        raise UnsupportedStep("the decoder's MLP is not whisper's Linear, GELU, Linear")

    def routed(module: nn.Module):
        return functools.partial(linear, module)

    def normed(ln: nn.Module):  # whisper's LayerNorm: in float32 for another residual dtype
        return functools.partial(norm, ln)

    return Layer(attn_ln=normed(block.attn_ln), qkv=functools.partial(self_attention_qkv, attn),
                 out=routed(attn.out), cross_ln=normed(block.cross_attn_ln), cross_query=routed(cross.query),
                 cross_out=routed(cross.out), cross_key=routed(cross.key), cross_value=routed(cross.value),
                 mlp_ln=normed(block.mlp_ln), fc1=routed(mlp[0]), fc2=routed(mlp[2]))


class CpuProducts:
    """The CPU's products for ``FixedStep`` (the module's docstring says which)."""

    fixed_shapes = False

    def __init__(self, model: nn.Module, residual: torch.dtype):
        decoder = model.decoder
        first = decoder.blocks[0]
        self.model, self.blocks = model, decoder.blocks
        self.dtype = product_dtype(decoder, residual)  # the decoder's products' dtype (FixedStep.dtype)
        self.layers: List[Layer] = [cpu_layer(block) for block in decoder.blocks]
        # the tied embedding as it is (read for its rows, the vocabulary's size; the proposers
        # multiply by ``projection``), and in the residual dtype for the EAGLE head's input
        self.vocabulary = decoder.token_embedding.weight.detach()
        self.embedding = decoder.token_embedding.weight.detach().to(residual)
        self.positional = decoder.positional_embedding.detach().to(residual)
        self.decoder, self.residual = decoder, residual
        self.final_ln = functools.partial(norm, decoder.ln)
        self.attention = CpuAttention(first, decoder.positional_embedding.shape[0])
        self.cache_dtype = invariant_dtype(first.attn) if row_invariant(first.attn) else residual
        self.cross_dtype = invariant_dtype(first.cross_attn) if row_invariant(first.cross_attn) else residual
        self.n_head = first.attn.n_head
        # a pass's layers in one call of the package's kernels, where every part of them runs on those
        self.native = NativeDecoder.of(model, residual)

    def embed(self, tokens: Tensor, positions: Tensor) -> Tensor:
        """Token and position embeddings summed in the model's dtype, then in the residual's."""
        return (self.decoder.token_embedding(tokens) + self.decoder.positional_embedding[positions]).to(self.residual)

    def slots_read(self, end: int, n_ctx: int) -> int:
        return slots_read(self.attention, end, n_ctx, self.cache_dtype, self.n_head,
                          self.blocks[0].attn.query.out_features // self.n_head)

    def cross(self, features: Tensor, n_head: int) -> Tuple[Sequence[Tensor], Sequence[Tensor]]:
        """Every layer's cross-attention keys and values of ``features``, rows together."""
        kv = cross_cache(self.blocks, features)
        return kv.keys, kv.values

    def logits(self, states: Tensor) -> Tensor:
        """The next-token logits greedy decoding reads from states, float32: by the compute type's
        projection, through a ``base_head`` model's head 0 first (``projection.next_token_logits``)."""
        return next_token_logits(self.model, states)

    # what the proposers that draft in the pass multiply (drafting/device), by the compute type's
    # kernels as the decoder's own layers are

    def head(self, module: nn.Module):
        return _in_own_dtype(functools.partial(linear, module), module)

    def norm(self, module: nn.Module):
        return _in_own_dtype(functools.partial(norm, module), module)

    def projection(self, ids: Tensor) -> Callable[[Tensor], Tensor]:
        """Float32 logits over the vocabulary rows ``ids`` by the compute type's projection, selected
        once (``Projection.select``: a selected row's logits are the whole vocabulary's column)."""
        selected = projection_of(self.decoder).select(ids)
        return lambda states: selected(states).float()

    def block(self, block: nn.Module, n_slots: int) -> CpuBlock:
        return CpuBlock(block, n_slots, self.residual)


def slots_read(attention: CpuAttention, end: int, n_ctx: int, dtype: torch.dtype, n_head: int, d_head: int) -> int:
    """The slots a pass ending at slot ``end`` attends: exactly those for the fused kernel, rounded
    up where the invariant attention was measured to give the same bits (``attended_slots``)."""
    return attended_slots(end, n_ctx, dtype, n_head, d_head) if attention.invariant else end


def _in_own_dtype(layer: Callable[[Tensor], Tensor], module: nn.Module) -> Callable[[Tensor], Tensor]:
    """A draft head's plain torch layer (``nn.Linear``, ``nn.LayerNorm``) takes rows in its own
    dtype and gives them back in theirs, as the dense products cast: whisper's ``fp16`` option makes
    a CPU's residual stream half, which such a layer does not take (whisper's own layers cast)."""
    weight = getattr(module, "weight", None)
    if type(module) not in (nn.Linear, nn.LayerNorm) or weight is None:
        return layer
    return lambda x: layer(x) if x.dtype == weight.dtype else layer(x.to(weight.dtype)).to(x.dtype)


class CpuBlock:
    """A draft head's decoder block (Medusa-Block's, EAGLE's) as the CPU's products, for
    ``fixed.DraftBlock``: the block's own (converted) modules, attending as the decoder does."""

    fixed_shapes = False

    def __init__(self, block: nn.Module, n_slots: int, residual: torch.dtype):
        self.block = block
        self.layer = cpu_layer(block)
        self.attention = CpuAttention(block, n_slots)
        self.n_head = block.attn.n_head
        self.cache_dtype = invariant_dtype(block.attn) if self.attention.invariant else residual

    def slots_read(self, end: int, n_slots: int) -> int:
        return slots_read(self.attention, end, n_slots, self.cache_dtype, self.n_head,
                          self.block.attn.query.out_features // self.n_head)

    def cross(self, features: Tensor, n_head: int) -> Tuple[Tensor, Tensor]:
        kv = cross_cache([self.block], features)
        return kv.keys[0], kv.values[0]


def cpu_step(model: nn.Module, batch: int = 1, residual: torch.dtype = torch.float32,
             device: Optional[torch.device] = None) -> FixedStep:
    """The one decoder step over the CPU's products, for ``batch`` windows side by side."""
    return FixedStep(model, batch, residual, device, products=CpuProducts(model, residual))


def step_on(products: str, model: nn.Module, batch: int = 1, residual: torch.dtype = torch.float32,
            device: Optional[torch.device] = None) -> FixedStep:
    """The one decoder step over the products a decoder chose: "fixed" (``fixed.DenseProducts``) or
    "cpu" (``CpuProducts``)."""
    if products == "fixed":
        return FixedStep(model, batch, residual, device)
    return cpu_step(model, batch, residual, device)
