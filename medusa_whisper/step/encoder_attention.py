"""The encoder's self-attention in bfloat16, on CPUs that multiply bfloat16 natively and where it measures faster.

A converted model's encoder (int8 and bfloat16 compute types on such CPUs: compute.py) multiplies its
linears in bfloat16, but whisper's attention over its 1,500 positions runs in float32: per head and
layer two 1,500 x 1,500 products, much of an encoder pass. Its queries, keys and values come out of
those bfloat16 products (``HalfLinear`` rounds them to bfloat16 before widening them), so casting
them back to bfloat16 loses nothing; only the attention's own products and its softmax weights are
rounded more. Measured on the Intel Xeon with AMX (base int8, 2 threads, one window of jfk.flac): the
encoder 157 ms against 222 ms, its output 1.46 % (relative norm) from the float32 model's against
1.43 % with float32 attention.

The choice is timed once per machine and kept with the routes (``attention_dtype``). whisper's
modules stay whisper's: the attention is set on the encoder's module instances (``attend_in``), and
where whisper asks for the attention weights (its SDPA switched off, as for word timestamps'
alignment heads) or gives a mask, they attend as whisper does.
"""

from __future__ import annotations

import functools
from typing import Optional, Tuple

import torch
import torch.nn.functional as F
from torch import Tensor, nn
from whisper.model import MultiHeadAttention

from .routes import median_micros, table as routes_table


def bfloat16_attention(attn: MultiHeadAttention, q: Tensor, k: Tensor, v: Tensor, mask: Optional[Tensor] = None
                       ) -> Tuple[Tensor, Optional[Tensor]]:
    """whisper's ``qkv_attention`` (fused kernel, no mask) with the products in bfloat16, float32 out."""
    if mask is not None or not getattr(MultiHeadAttention, "use_sdpa", True):
        return MultiHeadAttention.qkv_attention(attn, q, k, v, mask)

    def heads(t: Tensor) -> Tensor:
        return t.view(*t.shape[:2], attn.n_head, -1).permute(0, 2, 1, 3).to(torch.bfloat16)
    out = F.scaled_dot_product_attention(heads(q), heads(k), heads(v))
    return out.permute(0, 2, 1, 3).flatten(start_dim=2).to(q.dtype), None


def attention_dtype(n_head: int, n_ctx: int, d_head: int) -> torch.dtype:
    """bfloat16 where this machine runs the encoder's attention (one layer of this shape) faster in
    bfloat16 than in float32, else float32; timed once per machine with the routes (about 0.3 s for base)."""
    return _attention_dtype(n_head, n_ctx, d_head, torch.get_num_threads())


@functools.lru_cache(maxsize=None)
def _attention_dtype(n_head: int, n_ctx: int, d_head: int, threads: int) -> torch.dtype:
    attn = MultiHeadAttention(n_head * d_head, n_head)

    def timer(attend):
        def run() -> float:  # its random inputs drawn when timed: see RouteTable.choose_kernel
            q, k, v = (torch.randn(1, n_ctx, n_head * d_head) for _ in range(3))
            with torch.inference_mode():
                return median_micros(lambda: attend(attn, q, k, v))
        return run
    timers = {"float32": timer(MultiHeadAttention.qkv_attention), "bfloat16": timer(bfloat16_attention)}
    chosen = routes_table().choose_kernel(f"encoder attention {n_head}x{n_ctx}x{d_head}", timers)
    return torch.bfloat16 if chosen == "bfloat16" else torch.float32


def attend_in(encoder: nn.Module, dtype: torch.dtype) -> None:
    """Set the encoder's attention modules to attend in ``dtype`` (bfloat16: ``bfloat16_attention``;
    float32: whisper's own), on these instances only."""
    for module in encoder.modules():
        if isinstance(module, MultiHeadAttention):
            module.__dict__.pop("qkv_attention", None)
            if dtype == torch.bfloat16:  # a partial, not a bound method: a model with it still pickles
                module.qkv_attention = functools.partial(bfloat16_attention, module)
