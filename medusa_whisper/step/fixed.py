"""The text decoder as one step over buffers it owns, at fixed shapes: the form a CUDA graph can replay.

whisper's ``TextDecoder.forward`` reads its position offset from a hook cache that grows by
concatenation and makes its mask per pass, so the shapes, and the host's work, change every pass.
On a GPU that is most of a pass's time: a few hundred small kernels launched one by one, and the
host waiting between them. ``FixedStep`` is the same arithmetic with every shape fixed:

- keys and values are written at positions held in a device tensor (``scatter_``), into a cache of
  all ``n_text_ctx`` slots, head-major;
- self-attention reads every slot, with a mask made on the device from the rows' positions (a
  chain) or given by the caller (a tree); unwritten slots are zeros and masked;
- the cross-attention keys and values live in buffers filled once per window (``set_audio``);
- q, k and v are one product; the weights are read once, at construction, in the dtype the
  products run in.

Nothing in ``forward`` reads a tensor's value on the host, so a call can be captured as a CUDA
graph and replayed (``decoding/loop.py`` does).

The same step is the CPU's, over other products (``step/cpu.py``, ``CpuProducts``): its compute
type's kernels as ``routes`` chose them, the row-invariant attention over the written slots that
lossless decoding needs there, which reads the pass's last slot on the host. What differs between
the devices is the products object (``DenseProducts`` here); the buffers, the calls and the order
of the arithmetic are this module's on both.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, List, Optional, Sequence, Tuple, Union

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from .compute import HalfLinear, Int8Linear
from .together import rows_together, together

Product = Tuple[Tensor, Optional[Tensor]]  # a linear layer's weight (out, in) and bias
# a layer's product: dense weights (what CUDA replays), or a function of the rows (the CPU's
# compute-type modules, called as they are); a self-attention's may return q, k and v apart
Linear = Union[Product, Callable[[Tensor], Union[Tensor, Tuple[Tensor, Tensor, Tensor]]]]


class UnsupportedStep(ValueError):
    """The model has a part the fixed-shape step does not implement (the caller uses the eager decoder)."""


def dense(module: nn.Module, dtype: torch.dtype) -> Product:
    """A linear layer's weight and bias as dense tensors of ``dtype`` (int8 weights dequantised)."""
    if isinstance(module, Int8Linear):
        weight = module.qweight.float() * module.scale[:, None]
    elif isinstance(module, (nn.Linear, HalfLinear)):
        weight = module.weight
    else:
        raise UnsupportedStep(f"no fixed-shape product for {type(module).__name__}")
    bias = getattr(module, "bias", None)
    return weight.detach().to(dtype).contiguous(), None if bias is None else bias.detach().to(dtype).contiguous()


def supports(model: nn.Module) -> bool:
    """Whether ``FixedStep`` can run this model's decoder (else ``UnsupportedStep`` at construction)."""
    for block in model.decoder.blocks:
        mlp = block.mlp
        if not (isinstance(mlp, nn.Sequential) and len(mlp) == 3 and isinstance(mlp[1], nn.GELU)):
            return False
        linears = [block.attn.query, block.attn.key, block.attn.value, block.attn.out, block.cross_attn.query,
                   block.cross_attn.key, block.cross_attn.value, block.cross_attn.out, mlp[0], mlp[2]]
        if not all(isinstance(m, (nn.Linear, HalfLinear, Int8Linear)) for m in linears):
            return False
    return True


def product_dtype(decoder: nn.Module, residual: torch.dtype) -> torch.dtype:
    """The dtype the decoder's products run in: a half compute type's, else the residual stream's
    (whisper's ``Linear`` casts its weight to its input's dtype)."""
    first = decoder.blocks[0].mlp[0]
    return first.weight.dtype if isinstance(first, HalfLinear) else residual


def linear(x: Tensor, product: Linear):
    if not isinstance(product, tuple):
        return product(x)
    weight, bias = product
    return F.linear(x.to(weight.dtype), weight, bias).to(x.dtype)


def layer_norm(x: Tensor, norm: Linear) -> Tensor:
    """A LayerNorm given as its weight and bias, or as a function of x (the CPU's: whisper's own)."""
    if not isinstance(norm, tuple):
        return norm(x)
    return F.layer_norm(x, (x.shape[-1],), norm[0], norm[1])


@dataclass
class Layer:
    attn_ln: Linear
    qkv: Linear  # query, key, value in one product (whisper's key has no bias: zeros)
    out: Linear
    cross_ln: Linear
    cross_query: Linear
    cross_out: Linear
    cross_key: Linear  # for set_audio
    cross_value: Linear
    mlp_ln: Linear
    fc1: Linear
    fc2: Linear


def norm_product(module: nn.LayerNorm, dtype: torch.dtype) -> Product:
    """A LayerNorm's weight and bias as dense tensors of ``dtype``."""
    return module.weight.detach().to(dtype).contiguous(), module.bias.detach().to(dtype).contiguous()


def layer_products(block: nn.Module, residual: torch.dtype, dtype: torch.dtype) -> Layer:
    """A whisper ``ResidualAttentionBlock`` (the decoder's, or a draft head's) as fixed tensors:
    norms in the residual dtype, products in ``dtype``."""
    attn, cross = block.attn, block.cross_attn
    q, k, v = (dense(m, dtype) for m in (attn.query, attn.key, attn.value))
    zeros = torch.zeros(k[0].shape[0], dtype=dtype, device=k[0].device)
    qkv = (torch.cat([q[0], k[0], v[0]]), torch.cat([q[1], zeros if k[1] is None else k[1], v[1]]))
    mlp = block.mlp
    if not (isinstance(mlp, nn.Sequential) and len(mlp) == 3 and isinstance(mlp[1], nn.GELU)):
        raise UnsupportedStep("the decoder's MLP is not whisper's Linear, GELU, Linear")
    return Layer(attn_ln=norm_product(block.attn_ln, residual), qkv=qkv, out=dense(attn.out, dtype),
                 cross_ln=norm_product(block.cross_attn_ln, residual), cross_query=dense(cross.query, dtype),
                 cross_out=dense(cross.out, dtype), cross_key=dense(cross.key, dtype),
                 cross_value=dense(cross.value, dtype), mlp_ln=norm_product(block.mlp_ln, residual),
                 fc1=dense(mlp[0], dtype), fc2=dense(mlp[2], dtype))


def layer_forward(layer: Layer, x: Tensor, keys: Tensor, values: Tensor, cross_keys: Tensor,
                  cross_values: Tensor, allowed: Tensor, index, n_head: int,
                  attention: "Attention" = None, read: Optional[int] = None) -> Tensor:
    """One residual block over new rows at fixed shapes: their keys and values are written into
    ``keys``/``values`` at their slots (``index``), then the slots are attended where ``allowed``.

    x                       : shape = (batch, rows, n_state), the residual stream
    keys, values            : shape = (batch, n_head, slots, d_head), this block's cache, written in place
    cross_keys, cross_values: shape = (batch, n_head, n_audio_ctx, d_head)
    allowed                 : shape = (batch, rows, slots) bool
    index                   : the rows' slots as ``attention.where`` gives them (the fused kernel's:
                              shape = (batch, n_head, rows, d_head), for ``scatter_``)
    attention               : how the products attend (default: PyTorch's fused kernel, ``Attention``)
    read                    : the first slots attended (``allowed`` covers them); None: every slot
    """
    attention = attention or FUSED
    batch, rows, n_state = x.shape
    h = layer_norm(x, layer.attn_ln)
    qkv = linear(h, layer.qkv)
    q, k, v = qkv if isinstance(qkv, tuple) else qkv.split(n_state, dim=-1)
    attention.write(keys, values, k, v, index, n_head)
    if read is not None:  # after the writes: a slot range is a strided view, which scatter_ would copy whole
        keys, values = keys[..., :read, :], values[..., :read, :]
    x = x + linear(attention.self_attention(q, keys, values, allowed, n_head), layer.out)
    h = layer_norm(x, layer.cross_ln)
    x = x + linear(attention.cross_attention(linear(h, layer.cross_query), cross_keys, cross_values, n_head),
                   layer.cross_out)
    h = layer_norm(x, layer.mlp_ln)
    return x + linear(F.gelu(linear(h, layer.fc1)), layer.fc2)


def heads(x: Tensor, n_head: int) -> Tensor:
    """(batch, rows, n_state) -> (batch, n_head, rows, d_head), a view."""
    batch, rows, _ = x.shape
    return x.view(batch, rows, n_head, -1).transpose(1, 2)


def merged(x: Tensor) -> Tensor:
    """(batch, n_head, rows, d_head) -> (batch, rows, n_state)."""
    batch, _, rows, _ = x.shape
    return x.transpose(1, 2).reshape(batch, rows, -1)


class Attention:
    """How the step's products attend: PyTorch's fused kernel over every given slot, the mask a
    tensor (what a CUDA graph replays). Queries come with their heads merged, (batch, rows,
    n_state), and so does the result. ``step/cpu.py`` has the CPU's."""

    def prepare(self, allowed: Tensor) -> Tensor:
        """What the self-attention takes for a pass's mask, made once per pass: the mask itself."""
        return allowed

    def where(self, slots: Tensor, start: Optional[int], n_head: int, d_head: int) -> Tensor:
        """What ``write`` takes for the rows' slots (batch, rows), made once per pass: a ``scatter_``
        index (``start``, the first slot where the rows' are consecutive from it, is the CPU's)."""
        batch, rows = slots.shape
        return slots[:, None, :, None].expand(batch, n_head, rows, d_head)

    def write(self, keys: Tensor, values: Tensor, k: Tensor, v: Tensor, index: Tensor, n_head: int) -> None:
        """New rows' keys and values, (batch, rows, n_state), into the cache at their slots."""
        keys.scatter_(2, index, heads(k, n_head).to(keys.dtype))
        values.scatter_(2, index, heads(v, n_head).to(values.dtype))

    def self_attention(self, q: Tensor, keys: Tensor, values: Tensor, allowed: Tensor, n_head: int) -> Tensor:
        return merged(F.scaled_dot_product_attention(heads(q, n_head), keys, values, attn_mask=allowed[:, None]))

    def cross_attention(self, q: Tensor, keys: Tensor, values: Tensor, n_head: int) -> Tensor:
        return merged(F.scaled_dot_product_attention(heads(q, n_head), keys, values))


FUSED = Attention()


def cross_keys_values(layer: Layer, features: Tensor, n_head: int) -> Tuple[Tensor, Tensor]:
    """The cross-attention keys and values of ``layer`` for encoder output ``features``,
    shape = (batch, n_audio_ctx, n_state) -> two of (batch, n_head, n_audio_ctx, d_head)."""
    rows, n, _ = features.shape
    k = linear(features, layer.cross_key).view(rows, n, n_head, -1).transpose(1, 2)
    v = linear(features, layer.cross_value).view(rows, n, n_head, -1).transpose(1, 2)
    return k, v


def every_slot(mask: Optional[Tensor], start: int, n: int, n_ctx: int, device) -> Tensor:
    """A pass's (n, start + n) mask (None: one row seeing slots [0, start]) as the step takes it:
    (1, n, n_ctx), False beyond."""
    allowed = torch.zeros(1, n, n_ctx, dtype=torch.bool, device=device)
    if mask is None:
        allowed[:, :, :start + n] = True
    else:
        allowed[0, :, :mask.shape[1]] = mask
    return allowed


def pass_plan(products, allowed: Tensor, slots: Tensor, end: Optional[int], n_head: int, d_head: int,
              n_ctx: int):
    """What every layer of one pass shares, made once: the mask as the products' attention takes it,
    where the rows' keys and values go, and the slots attended (None: every one).

    allowed : (batch, rows, n_ctx) bool; slots : (batch, rows), where the rows are written
    end     : where the rows' slots are consecutive up to it, the slot after the last (None: read
              from ``slots`` on the host, where the products attend only the written slots)
    """
    attention = products.attention
    start = None if end is None else end - slots.shape[1]
    if products.fixed_shapes:
        return attention.prepare(allowed), attention.where(slots, start, n_head, d_head), None
    read = products.slots_read(int(slots.max()) + 1 if end is None else end, n_ctx)
    return (attention.prepare(allowed[..., :read]), attention.where(slots, start, n_head, d_head),
            read if read < n_ctx else None)


class DenseProducts:
    """The fixed-shape step's own products: every linear layer dense in the products' dtype (int8
    weights dequantised once), the vocabulary the tied embedding in it, PyTorch's fused attention
    over every slot. ``fixed_shapes``: a pass reads every slot and every batch item, and the
    buffers are written in place, so that a CUDA graph can replay it."""

    fixed_shapes = True
    attention = FUSED
    native = None  # the layers in one native call (the CPU's, ``native_decoder``): never for these

    def __init__(self, model: nn.Module, residual: torch.dtype):
        decoder = model.decoder
        self.dtype = product_dtype(decoder, residual)
        self.layers: List[Layer] = [layer_products(block, residual, self.dtype) for block in decoder.blocks]
        self.vocabulary = decoder.token_embedding.weight.detach().to(self.dtype).contiguous()
        self.embedding = decoder.token_embedding.weight.detach().to(residual).contiguous()
        self.positional = decoder.positional_embedding.detach().to(residual).contiguous()
        self.final_ln = norm_product(decoder.ln, residual)
        self.residual = residual
        self.cache_dtype = self.cross_dtype = residual

    def embed(self, tokens: Tensor, positions: Tensor) -> Tensor:
        """The residual stream's first value: token and position embeddings, in its dtype."""
        return self.embedding[tokens] + self.positional[positions]

    def slots_read(self, end: int, n_ctx: int) -> int:
        return n_ctx

    def cross(self, features: Tensor, n_head: int) -> Tuple[Sequence[Tensor], Sequence[Tensor]]:
        """Every layer's cross-attention keys and values of encoder output ``features``."""
        pairs = [cross_keys_values(layer, features, n_head) for layer in self.layers]
        return [k for k, _ in pairs], [v for _, v in pairs]

    def logits(self, states: Tensor) -> Tensor:
        """Vocabulary logits through the tied embedding, float32 as whisper returns them."""
        return (states.to(self.dtype) @ self.vocabulary.T).float()

    # what the proposers that draft in the pass multiply (drafting/device): their heads' layers,
    # norms and blocks, and the vocabulary's rows they propose among, as this step's products

    def head(self, module: nn.Module) -> Product:
        return dense(module, self.dtype)

    def norm(self, module: nn.LayerNorm) -> Product:
        return norm_product(module, self.residual)

    def projection(self, ids: Tensor) -> Callable[[Tensor], Tensor]:
        """Float32 logits over the vocabulary rows ``ids`` (column j is token ``ids[j]``)."""
        rows = self.vocabulary[ids.to(self.vocabulary.device)].contiguous()
        return lambda states: (states.to(rows.dtype) @ rows.T).float()

    def block(self, block: nn.Module, n_slots: int) -> "DenseBlock":
        return DenseBlock(block, self.residual, self.dtype)


class DenseBlock:
    """A draft head's decoder block as dense products, for ``DraftBlock``: fixed shapes as the step's."""

    fixed_shapes = True
    attention = FUSED

    def __init__(self, block: nn.Module, residual: torch.dtype, dtype: torch.dtype):
        self.layer = layer_products(block, residual, dtype)
        self.cache_dtype = residual

    def slots_read(self, end: int, n_slots: int) -> int:
        return n_slots

    def cross(self, features: Tensor, n_head: int) -> Tuple[Tensor, Tensor]:
        return cross_keys_values(self.layer, features, n_head)


class DraftBlock:
    """A draft head's decoder block (EAGLE's, Medusa-Block's) over one window, with a cache of its
    own: the step's ``layer_forward`` on the step's kind of products (``products.block``), so that
    it runs in a captured pass on CUDA and by the CPU's kernels there.

    n_slots : the cache's slots (a slot per position, and any a proposer drafts into after them)
    """

    def __init__(self, block: nn.Module, products, n_slots: int, n_audio_ctx: int, device: torch.device):
        self.products = products.block(block, n_slots)
        self.n_head, self.n_slots = block.attn.n_head, n_slots
        self.d_head = block.attn.query.out_features // self.n_head
        cache = self.products.cache_dtype
        self.keys = torch.zeros(1, self.n_head, n_slots, self.d_head, dtype=cache, device=device)
        self.values = torch.zeros_like(self.keys)
        self.cross_keys = torch.zeros(1, self.n_head, n_audio_ctx, self.d_head, dtype=products.residual, device=device)
        self.cross_values = torch.zeros_like(self.cross_keys)

    def set_audio(self, features: Tensor) -> None:
        """The window's cross-attention keys and values, from its encoder output (1, n_audio_ctx,
        n_state) in the residual dtype: in place with fixed shapes; else new buffers, and the
        cache's slots zeroed as a fresh cache has them (new tensors, as ``FixedStep.set_audio``)."""
        keys, values = self.products.cross(features, self.n_head)
        if self.products.fixed_shapes:
            self.cross_keys.copy_(keys)
            self.cross_values.copy_(values)
        else:
            self.cross_keys, self.cross_values = keys, values
            self.keys, self.values = torch.zeros_like(self.keys), torch.zeros_like(self.values)

    def __call__(self, x: Tensor, slots: Tensor, allowed: Tensor) -> Tensor:
        """The block over rows x (1, rows, n_state) written at consecutive ``slots`` (1, rows),
        each attending where ``allowed`` (1, rows, n_slots); the block's output, (1, rows, n_state)."""
        end = None if self.products.fixed_shapes else int(slots[0, -1]) + 1
        allowed, where, read = pass_plan(self.products, allowed, slots, end, self.n_head, self.d_head, self.n_slots)
        return layer_forward(self.products.layer, x, self.keys, self.values, self.cross_keys, self.cross_values,
                             allowed, where, self.n_head, self.products.attention, read)


class FixedStep:
    """The decoder of ``model`` for ``batch`` sequences of one window each, over buffers it owns.

    residual : the dtype of the residual stream (the audio features'); products run in the compute
               type's dtype (``product_dtype``)
    products : what multiplies and attends: ``DenseProducts`` (default; fixed shapes, for CUDA
               graphs) or the CPU's (``step.cpu.cpu_products``: the compute type's kernels,
               row-invariant attention over the written slots, the items in use)
    """

    def __init__(self, model: nn.Module, batch: int = 1, residual: torch.dtype = torch.float32,
                 device: Optional[torch.device] = None, products=None):
        decoder = model.decoder
        device = torch.device(device) if device is not None else decoder.token_embedding.weight.device
        self.products = products if products is not None else DenseProducts(model, residual)
        self.batch, self.residual, self.dtype, self.device = batch, residual, self.products.dtype, device
        self.n_head = decoder.blocks[0].attn.n_head
        self.n_state = decoder.token_embedding.weight.shape[1]
        self.n_ctx = decoder.positional_embedding.shape[0]
        self.n_audio_ctx = model.dims.n_audio_ctx
        self.layers: List[Layer] = self.products.layers
        # the tied embedding and the positions' in the residual dtype (in-pass proposers read them)
        self.embedding = self.products.embedding
        self.positional = self.products.positional
        self.final_ln = self.products.final_ln
        self.vocabulary = self.products.vocabulary  # (its rows: the vocabulary's size)
        d_head = self.n_state // self.n_head
        n_layer = len(self.layers)
        # zeros, not empty: every slot read is multiplied (masked ones with weight 0), and 0 * NaN is NaN
        self.keys = torch.zeros(n_layer, batch, self.n_head, self.n_ctx, d_head, dtype=self.products.cache_dtype,
                                device=device)
        self.values = torch.zeros_like(self.keys)
        # the cross-attention's, per layer (batch, n_head, n_audio_ctx, d_head): zeros before any
        # window's, so that a pass can be timed (loop.pass_seconds). On the CPU a window's (or a
        # window's candidates') are the tensors set_audio computes, and a batch's are made on its
        # first item's
        self.cross_keys: Optional[Sequence[Tensor]] = None
        self.cross_values: Optional[Sequence[Tensor]] = None
        if self.products.fixed_shapes or batch == 1:
            self._new_cross()
        self.slots = torch.arange(self.n_ctx, device=device)

    def _new_cross(self) -> None:
        d_head = self.n_state // self.n_head
        self.cross_keys = torch.zeros(len(self.layers), self.batch, self.n_head, self.n_audio_ctx, d_head,
                                      dtype=self.products.cross_dtype, device=self.device)
        self.cross_values = torch.zeros_like(self.cross_keys)

    @torch.no_grad()
    def set_audio(self, features: Tensor, item: Optional[int] = None, repeat: int = 1) -> None:
        """Fill the cross-attention buffers from windows' encoder output, shape = (batch / repeat,
        n_audio_ctx, n_audio_state), or (1, ...) for batch item ``item`` alone. ``repeat``
        consecutive items share each window (best_of candidates, beams): its keys and values are
        computed once, and copied to them with fixed shapes (in place: a captured graph keeps
        reading the same buffers); the CPU's products keep one copy, which the window's items read
        together (``CpuAttention.cross_attention``), and start the items' self-attention slots at
        zero, as a fresh cache has them."""
        features = features.to(self.residual)
        at = slice(None) if item is None else slice(item, item + 1)
        keys, values = self.products.cross(features, self.n_head)
        if not self.products.fixed_shapes:
            if item is None:  # new buffers (not zeroed in place: a step made under inference_mode is
                # kept on the model and used outside it, where its tensors may not change in place)
                self.keys, self.values = torch.zeros_like(self.keys), torch.zeros_like(self.values)
                self.cross_keys, self.cross_values = keys, values
                return
            self.keys[:, at].zero_()
            self.values[:, at].zero_()
            if self.cross_keys is None or self.cross_keys[0].shape[0] != self.batch:
                self._new_cross()
        elif repeat > 1:
            keys = [k.repeat_interleave(repeat, dim=0) for k in keys]
            values = [v.repeat_interleave(repeat, dim=0) for v in values]
        for i in range(len(self.layers)):
            self.cross_keys[i][at].copy_(keys[i])
            self.cross_values[i][at].copy_(values[i])

    def chain_mask(self, positions: Tensor) -> Tensor:
        """(batch, rows, n_ctx) bool: row at position p sees slots [0, p]."""
        return self.slots <= positions[..., None]

    def forward(self, tokens: Tensor, positions: Tensor, mask: Optional[Tensor] = None,
                slots: Optional[Tensor] = None) -> Tensor:
        """Post-LayerNorm decoder states of new rows; writes their keys and values at their slots.

        tokens, positions : shape = (batch, rows), long; positions below n_ctx
        mask              : shape = (batch, rows, n_ctx) bool, True where a row may attend (default:
                            ``chain_mask(positions)``); a tree gives each node its ancestors
        slots             : shape = (batch, rows), the cache slots the rows' keys and values go to,
                            distinct per item (default: their positions, as in a chain; a tree's
                            nodes share positions and take consecutive slots)
        returns           : shape = (batch, rows, n_state), in the residual dtype
        """
        return self._blocks(tokens, positions, mask, slots, self.keys, self.values, self.cross_keys,
                            self.cross_values)

    __call__ = forward

    def _blocks(self, tokens: Tensor, positions: Tensor, mask: Optional[Tensor], slots: Optional[Tensor],
                keys: Tensor, values: Tensor, cross_keys: Sequence[Tensor], cross_values: Sequence[Tensor],
                end: Optional[int] = None) -> Tensor:
        """``forward`` over caches of shape (n_layer, batch, ...), written in place. ``end``: where
        the rows' slots are consecutive up to it, the slot after the last (the CPU's products attend
        up to it; read from ``slots`` when not given)."""
        x = self.products.embed(tokens, positions)
        allowed = self.chain_mask(positions) if mask is None else mask  # (batch, rows, n_ctx)
        slots = positions if slots is None else slots
        allowed, index, read = pass_plan(self.products, allowed, slots, end, self.n_head,
                                         self.n_state // self.n_head, self.n_ctx)
        if self.products.native is not None and not together():
            states = self.products.native(x, keys, values, cross_keys, cross_values, allowed, slots, allowed.shape[-1])
            if states is not None:
                return states
        for i, layer in enumerate(self.layers):
            x = layer_forward(layer, x, keys[i], values[i], cross_keys[i], cross_values[i], allowed, index,
                              self.n_head, self.products.attention, read)
        return layer_norm(x, self.final_ln)

    def prompt_at(self, tokens: Tensor, positions: Tensor, item: Tensor) -> Tensor:
        """A window's prompt pass in the batch item a (1,) device tensor names, alone, as one program
        for every item (what a captured graph needs): the item's caches are gathered, run as a batch
        of one, and written back whole. tokens, positions : shape = (1, rows) -> states, shape =
        (1, rows, n_state)."""
        keys, values = self.keys.index_select(1, item), self.values.index_select(1, item)
        hidden = self._blocks(tokens, positions, None, None, keys, values, self.cross_keys.index_select(1, item),
                              self.cross_values.index_select(1, item))
        self.keys.index_copy_(1, item, keys)
        self.values.index_copy_(1, item, values)
        return hidden

    def prompt(self, tokens: Tensor, item: int) -> Tensor:
        """A window's prompt pass in batch item ``item`` alone, its rows together as every way of
        opening a window has them (the CPU's batches); tokens, shape = (1, n) -> states, shape =
        (1, n, n_state)."""
        n, at = tokens.shape[1], slice(item, item + 1)
        with rows_together():
            return self._blocks(tokens, self.slots[:n][None], None, None, self.keys[:, at], self.values[:, at],
                                [k[at] for k in self.cross_keys], [v[at] for v in self.cross_values], end=n)

    def rows(self, tokens: Tensor, positions: Tensor, first: int, stop: int) -> Tensor:
        """One token for each of batch items [first, stop), item b's at its own position (with fixed
        shapes [first, stop) must be every item); tokens, positions : shape = (stop - first,) ->
        states, shape = (stop - first, n_state)."""
        if self.products.fixed_shapes:
            return self.forward(tokens[:, None], positions[:, None])[:, 0]
        at = slice(first, stop)
        return self._blocks(tokens[:, None], positions[:, None], None, None, self.keys[:, at], self.values[:, at],
                            [k[at] for k in self.cross_keys], [v[at] for v in self.cross_values])[:, 0]

    def pass_at(self, tokens: Tensor, positions: Tensor, start: int, mask: Optional[Tensor]) -> Tensor:
        """Rows written at slots [start, start + rows) of the one window, as the host's acceptance
        feeds them (``loop.WindowDecoder``'s walk).

        tokens    : shape = (1, rows); positions : shape = (rows,)
        mask      : shape = (rows, start + rows) bool, where each row may attend; None for one row
        returns   : shape = (1, rows, n_state), post-LayerNorm states
        """
        n = tokens.shape[1]
        if start + n > self.n_ctx:
            raise RuntimeError(f"KV cache overflow: {start + n} > {self.n_ctx} slots")
        slots = torch.arange(start, start + n, device=self.device)[None]
        return self._blocks(tokens, positions[None], every_slot(mask, start, n, self.n_ctx, self.device), slots,
                            self.keys, self.values, self.cross_keys, self.cross_values, end=start + n)

    def logits(self, states: Tensor) -> Tensor:
        """The next-token logits of states, float32 as whisper returns them, by the products' vocabulary."""
        return self.products.logits(states)

    def move_slots(self, dest: Tensor, src: Tensor) -> None:
        """Slots ``src`` copied to slots ``dest`` (a tree's accepted nodes follow the pending token)."""
        for cache in (self.keys, self.values):
            cache.index_copy_(3, dest, cache.index_select(3, src))

    def compact(self, keep: List[int], start: int) -> None:
        """Slots ``keep`` (ascending, from ``start``) moved to [start, start + len(keep))."""
        if keep:
            self.move_slots(torch.arange(start, start + len(keep), device=self.device),
                            torch.tensor(keep, device=self.device))
