"""The text decoder as one fixed-shape step over buffers it owns: the form a CUDA graph can replay.

``decoder.decoder_hidden`` runs whisper's modules with Python-side positions, a cache sliced to
its current length and a mask made per pass, so the shapes, and the host's work, change every pass.
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
graph and replayed (``decoding/loop.py`` does). On the CPU the eager decoder stays the product's
path (its products are chosen per row count and kept row-invariant where lossless needs it); this
step runs there in tests, as the reference its CUDA graphs are compared with, and where
``MEDUSA_WHISPER_STEP=fixed`` asks for it.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import List, Optional, Tuple

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from .compute import HalfLinear, Int8Linear

Product = Tuple[Tensor, Optional[Tensor]]  # a linear layer's weight (out, in) and bias


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


def linear(x: Tensor, product: Product) -> Tensor:
    weight, bias = product
    return F.linear(x.to(weight.dtype), weight, bias).to(x.dtype)


def layer_norm(x: Tensor, norm: Product) -> Tensor:
    return F.layer_norm(x, (x.shape[-1],), norm[0], norm[1])


@dataclass
class Layer:
    attn_ln: Product
    qkv: Product  # query, key, value in one product (whisper's key has no bias: zeros)
    out: Product
    cross_ln: Product
    cross_query: Product
    cross_out: Product
    cross_key: Product  # for set_audio
    cross_value: Product
    mlp_ln: Product
    fc1: Product
    fc2: Product


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
                  cross_values: Tensor, allowed: Tensor, index: Tensor, n_head: int) -> Tensor:
    """One residual block over new rows at fixed shapes: their keys and values are written into
    ``keys``/``values`` at ``index`` (slots), then every slot is attended where ``allowed``.

    x                       : shape = (batch, rows, n_state), the residual stream
    keys, values            : shape = (batch, n_head, slots, d_head), this block's cache, written in place
    cross_keys, cross_values: shape = (batch, n_head, n_audio_ctx, d_head)
    allowed                 : shape = (batch, 1, rows, slots) bool
    index                   : shape = (batch, n_head, rows, d_head), the rows' slots
    """
    batch, rows, n_state = x.shape
    h = layer_norm(x, layer.attn_ln)
    q, k, v = (t.view(batch, rows, n_head, -1).transpose(1, 2)
               for t in linear(h, layer.qkv).split(n_state, dim=-1))
    keys.scatter_(2, index, k)
    values.scatter_(2, index, v)
    o = F.scaled_dot_product_attention(q, keys, values, attn_mask=allowed)
    x = x + linear(o.transpose(1, 2).reshape(batch, rows, n_state), layer.out)
    h = layer_norm(x, layer.cross_ln)
    q = linear(h, layer.cross_query).view(batch, rows, n_head, -1).transpose(1, 2)
    o = F.scaled_dot_product_attention(q, cross_keys, cross_values)
    x = x + linear(o.transpose(1, 2).reshape(batch, rows, n_state), layer.cross_out)
    h = layer_norm(x, layer.mlp_ln)
    return x + linear(F.gelu(linear(h, layer.fc1)), layer.fc2)


def cross_keys_values(layer: Layer, features: Tensor, n_head: int) -> Tuple[Tensor, Tensor]:
    """The cross-attention keys and values of ``layer`` for encoder output ``features``,
    shape = (batch, n_audio_ctx, n_state) -> two of (batch, n_head, n_audio_ctx, d_head)."""
    rows, n, _ = features.shape
    k = linear(features, layer.cross_key).view(rows, n, n_head, -1).transpose(1, 2)
    v = linear(features, layer.cross_value).view(rows, n, n_head, -1).transpose(1, 2)
    return k, v


class FixedStep:
    """The decoder of ``model`` for ``batch`` sequences of one window each, at fixed shapes.

    residual : the dtype of the residual stream (the audio features'); products run in the compute
               type's dtype (``product_dtype``)
    """

    def __init__(self, model: nn.Module, batch: int = 1, residual: torch.dtype = torch.float32,
                 device: Optional[torch.device] = None):
        decoder = model.decoder
        device = torch.device(device) if device is not None else decoder.token_embedding.weight.device
        dtype = product_dtype(decoder, residual)
        self.batch, self.residual, self.dtype, self.device = batch, residual, dtype, device
        self.n_head = decoder.blocks[0].attn.n_head
        self.n_state = decoder.token_embedding.weight.shape[1]
        self.n_ctx = decoder.positional_embedding.shape[0]
        self.n_audio_ctx = model.dims.n_audio_ctx
        self.layers: List[Layer] = [layer_products(block, residual, dtype) for block in decoder.blocks]
        self.embedding = decoder.token_embedding.weight.detach().to(residual).contiguous()
        self.positional = decoder.positional_embedding.detach().to(residual).contiguous()
        self.final_ln = norm_product(decoder.ln, residual)
        # the vocabulary: the tied embedding, in the products' dtype
        self.vocabulary = decoder.token_embedding.weight.detach().to(dtype).contiguous()
        d_head = self.n_state // self.n_head
        n_layer = len(self.layers)
        # zeros, not empty: every slot is read (masked ones with weight 0), and 0 * NaN would be NaN
        self.keys = torch.zeros(n_layer, batch, self.n_head, self.n_ctx, d_head, dtype=residual, device=device)
        self.values = torch.zeros_like(self.keys)
        self.cross_keys = torch.zeros(n_layer, batch, self.n_head, self.n_audio_ctx, d_head, dtype=residual,
                                      device=device)
        self.cross_values = torch.zeros_like(self.cross_keys)
        self.slots = torch.arange(self.n_ctx, device=device)

    @torch.no_grad()
    def set_audio(self, features: Tensor, item: Optional[int] = None, repeat: int = 1) -> None:
        """Fill the cross-attention buffers from windows' encoder output, shape = (batch / repeat,
        n_audio_ctx, n_audio_state), or (1, ...) for batch item ``item`` alone. ``repeat``
        consecutive items share each window (best_of candidates, beams): its keys and values are
        computed once and copied to them. In place: a captured graph keeps reading the same buffers."""
        features = features.to(self.residual)
        at = slice(None) if item is None else slice(item, item + 1)
        for i, layer in enumerate(self.layers):
            k, v = cross_keys_values(layer, features, self.n_head)
            if repeat > 1:
                k, v = k.repeat_interleave(repeat, dim=0), v.repeat_interleave(repeat, dim=0)
            self.cross_keys[i, at].copy_(k)
            self.cross_values[i, at].copy_(v)

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
                keys: Tensor, values: Tensor, cross_keys: Tensor, cross_values: Tensor) -> Tensor:
        """``forward`` over caches of shape (n_layer, batch, ...), written in place."""
        batch, rows = tokens.shape
        n_state, n_head = self.n_state, self.n_head
        x = self.embedding[tokens] + self.positional[positions]
        allowed = (self.chain_mask(positions) if mask is None else mask)[:, None]  # (batch, 1, rows, n_ctx)
        slots = positions if slots is None else slots
        index = slots[:, None, :, None].expand(batch, n_head, rows, n_state // n_head)
        for i, layer in enumerate(self.layers):
            x = layer_forward(layer, x, keys[i], values[i], cross_keys[i], cross_values[i], allowed, index, n_head)
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

    def rows(self, tokens: Tensor, positions: Tensor, first: int, stop: int) -> Tensor:
        """One token for every batch item at its own position (the fixed shape: items [first, stop)
        must be all of them); tokens, positions : shape = (batch,) -> states, shape = (batch, n_state)."""
        return self.forward(tokens[:, None], positions[:, None])[:, 0]

    def logits(self, states: Tensor) -> Tensor:
        """Vocabulary logits of states through the tied embedding, float32 as whisper returns them."""
        return (states.to(self.dtype) @ self.vocabulary.T).float()

    def move_slots(self, dest: Tensor, src: Tensor) -> None:
        """Slots ``src`` copied to slots ``dest`` (a tree's accepted nodes follow the pending token)."""
        for cache in (self.keys, self.values):
            cache.index_copy_(3, dest, cache.index_select(3, src))
