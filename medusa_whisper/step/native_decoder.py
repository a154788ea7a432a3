"""A CPU pass's decoder layers in one call of the package's kernels (native/decoder.cpp).

A one-row int8 pass of base made about 300 calls through PyTorch (six layers of norms, products,
cache writes, attention, GELU and sums), and their dispatch cost several times the 68 MB the pass
reads. Where every product of the decoder's layers is the package's own (``int8`` linears whose few
rows take the "native" kernel, float32 linears where ``native.runs_float``) and its attention is the
kernels' (row-invariant, ``native.attends`` its caches' dtype), ``NativeDecoder`` runs the layers and
the final norm in one call instead. The products and the attention are the very kernels the
per-call path runs, so a row still gets the bits it gets alone; the norms, GELU and sums are
decoder.cpp's, one row at a time with sums in a fixed order (they round differently from PyTorch's
in the last bits, which the step's comparison with the dense products allows).

Used for every pass whose rows are not only computed together: a prompt's rows keep the per-call
path, whose products for many rows are other kernels (``together.py``).
"""

from __future__ import annotations

import weakref
from typing import List, Optional, Sequence

import torch
from torch import Tensor, nn

from . import native
from .attention import invariant_dtype, row_invariant
from .compute import Int8Linear, few_rows_kernel

_NO_BIAS = torch.empty(0)


def native_linear(module: nn.Module) -> Optional[List[Tensor]]:
    """A linear layer in the form decoder.cpp multiplies by, or None where a pass's rows through it
    do not run on the package's kernels."""
    if type(module) is Int8Linear:
        if module.kernel != "weight_only" or few_rows_kernel(module.out_features, module.in_features) != "native":
            return None
        packed, colsum = module.native_form()
        bias = module.bias
        return [packed, colsum, module.scale.contiguous(), _NO_BIAS if bias is None else bias.float().contiguous()]
    if native.runs_float(module):
        bias = module.bias
        return [native.float_form(module), _NO_BIAS if bias is None else bias.detach().float().contiguous()]
    return None


def _norm(ln: nn.Module) -> Optional[List[Tensor]]:
    if not (isinstance(ln, nn.LayerNorm) and ln.elementwise_affine and ln.weight.dtype == torch.float32
            and ln.weight.device.type == "cpu"):
        return None
    return [ln.weight.detach(), ln.bias.detach()]


class _MarkStale:
    """A load_state_dict hook that marks a ``NativeDecoder`` stale, holding it weakly; a model that
    carries it still pickles and copies (as a hook that does nothing: the copy has no such call)."""

    def __init__(self, target: "NativeDecoder"):
        self._target = weakref.ref(target)

    def __call__(self, module: nn.Module, incompatible_keys) -> None:
        target = self._target() if self._target is not None else None
        if target is not None:
            target._stale = True

    def __reduce__(self):
        return _inert_hook, ()


def _inert_hook() -> "_MarkStale":
    hook = _MarkStale.__new__(_MarkStale)
    hook._target = None
    return hook


class NativeDecoder:
    """The decoder's blocks and final norm of ``model`` as one native call (the module's docstring)."""

    def __init__(self, kernel, model: nn.Module, residual: torch.dtype):
        self._kernel = kernel
        self._model, self._residual = model, residual  # its packed forms live on its layers
        # weights loaded into the model after this was made are packed again before the next pass,
        # not multiplied in their old form (checking every form a pass would cost 0.2-0.3 ms)
        self._stale = False
        # on the decoder: its own load_state_dict and the whole model's run it
        self._hook = model.decoder.register_load_state_dict_post_hook(_MarkStale(self))

    def __del__(self):
        self._hook.remove()

    @classmethod
    def of(cls, model: nn.Module, residual: torch.dtype) -> Optional["NativeDecoder"]:
        """The call for ``model``'s decoder, or None where some part of a pass does not run on the
        package's kernels (then the step calls the layers one by one)."""
        decoder = model.decoder
        blocks = list(decoder.blocks)
        if residual != torch.float32 or not native.available() or not blocks:
            return None
        first = blocks[0]
        n_head, n_state = first.attn.n_head, decoder.token_embedding.weight.shape[1]
        d_head = n_state // n_head
        for attn in (first.attn, first.cross_attn):
            if not (row_invariant(attn) and native.attends(invariant_dtype(attn), d_head)):
                return None
        norms, linears, eps = [], [], []
        for block in blocks:
            mlp = block.mlp
            if not (isinstance(mlp, nn.Sequential) and len(mlp) == 3 and type(mlp[1]) is nn.GELU
                    and mlp[1].approximate == "none"):
                return None
            attn, cross = block.attn, block.cross_attn
            fused = attn.__dict__.get("qkv")
            qkv = [fused] if fused is not None else [attn.query, attn.key, attn.value]
            forms = [native_linear(m) for m in (*qkv, attn.out, cross.query, cross.out, mlp[0], mlp[2])]
            block_norms = [_norm(ln) for ln in (block.attn_ln, block.cross_attn_ln, block.mlp_ln)]
            if any(f is None for f in forms) or any(n is None for n in block_norms):
                return None
            linears.append(forms)
            norms.append([t for n in block_norms for t in n])
            eps.extend(ln.eps for ln in (block.attn_ln, block.cross_attn_ln, block.mlp_ln))
        final = _norm(decoder.ln)
        if final is None:
            return None
        eps.append(decoder.ln.eps)
        return cls(native.kernels().Decoder(n_head, n_state, norms, linears, final, eps), model, residual)

    def __call__(self, x: Tensor, keys: Tensor, values: Tensor, cross_keys: Sequence[Tensor],
                 cross_values: Sequence[Tensor], allowed: Optional[Tensor], slots: Tensor, read: int) -> Tensor:
        """Post-norm states of a pass's rows, its keys and values written into ``keys``/``values``.

        x                        : (batch, rows, n_state) float32, the rows' embeddings
        keys, values             : (n_layer, batch, n_head, slots, d_head), written at ``slots`` (batch, rows)
        cross_keys, cross_values : per layer, (audios, n_head, n_audio_ctx, d_head)
        allowed                  : (1 or batch, rows, read) bool, where each row attends among the
                                   first ``read`` slots
        returns                  : (batch, rows, n_state), or None where the model's layers no
                                   longer run on the package's kernels (the step calls them then)
        """
        if self._stale:  # new weights: packed again, or the layers one by one where they no longer run here
            made = NativeDecoder.of(self._model, self._residual)
            if made is None:
                return None
            self._kernel, self._stale = made._kernel, False
        return self._kernel.forward(x.float().contiguous(), keys, values, list(cross_keys), list(cross_values),
                                    allowed, slots, read)
