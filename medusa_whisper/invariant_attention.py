"""Attention whose result for a query row does not depend on how many rows share the pass.

Why: lossless verification needs each verified row to get exactly the numbers a greedy step over
that row alone gets. With float32 caches and PyTorch's attention kernels it does not (the kernels
sum in another order for another number of rows, measured: every row of 2-16-row batches differed
in its last bits), and an int8 model's linears turn such bits into different logits. So converted
models used to attend one row at a time (``rows_alone``), which costs a pass over 8 rows 2.2 single
-row passes of int8 base, 5 ms of it attention.

This module's attention instead has one shape for every pass of a window, whatever its rows:
- keys and values are stored in bfloat16 (half the bytes to stream: cross-attention reads 1,500
  positions per layer in every pass), queries are cast to bfloat16, and the two products run as
  bfloat16 matrix products, softmax in float32;
- self-attention runs over every slot of the static cache (448), the unwritten ones masked, so a
  row's softmax and weighted sum have the same length whichever pass it is in;
- a single row is multiplied as two (one row goes to a matrix-vector kernel that sums in another
  order).
Whether a CPU's bfloat16 kernels then give every row the same bits in a batch of 2 to
``MAX_ROWS`` rows as alone is not a documented guarantee, so ``rows_are_invariant`` measures it
once per process for the model's shapes; converted models use this attention only where it holds
(compute.py), and a pass over more rows is split into groups of at most ``MAX_ROWS``.

Departs from whisper, whose attention runs in the model's dtype over exactly the visible keys.
"""

from __future__ import annotations

import functools
from typing import Optional

import torch
from torch import Tensor, nn

INVARIANT_DTYPE = torch.bfloat16
MAX_ROWS = 32  # rows per product; the probe checks every count from 2 to this


def row_invariant(attn: nn.Module) -> bool:
    """Whether this attention module is set to attend with ``invariant_attention`` (compute.py sets it)."""
    return getattr(attn, "row_invariant", False)


def invariant_attention(q: Tensor, k: Tensor, v: Tensor, n_head: int, allowed: Optional[Tensor]) -> Tensor:
    """Attention of (batch, n_query, n_state) queries over keys and values, heads merged, float32 out.

    k, v    : head-major (batch, n_head, n_key, d_head), in INVARIANT_DTYPE, as block_caches keeps them
    allowed : (n_query, n_key) bool, True where a query may attend; None: every key
    """
    batch, n_query, n_state = q.shape
    d_head = n_state // n_head
    # the scale 1/sqrt(d_head) (a power of two for whisper's 64) on the float32 query, as SDPA's default
    q = (q.view(batch, n_query, n_head, d_head).transpose(1, 2) * d_head ** -0.5).to(k.dtype)
    outs = []
    for first in range(0, n_query, MAX_ROWS):
        rows = q[:, :, first:first + MAX_ROWS]
        n = rows.shape[2]
        if n == 1:
            rows = rows.expand(batch, n_head, 2, d_head)
        scores = (rows @ k.transpose(-1, -2)).float()
        if allowed is not None:
            part = allowed[first:first + MAX_ROWS]
            scores.masked_fill_(~(part if n > 1 else part.expand(2, -1)), float("-inf"))
        weights = scores.softmax(-1).to(v.dtype)
        outs.append((weights @ v)[:, :, :n].float())
    out = outs[0] if len(outs) == 1 else torch.cat(outs, dim=2)
    return out.transpose(1, 2).reshape(batch, n_query, n_state)


def every_slot_mask(mask: Optional[Tensor], start: int, n: int, capacity: int) -> Tensor:
    """A (n, start+n) mask (None: one query seeing slots [0, start]) widened to all ``capacity`` slots."""
    allowed = torch.zeros(n, capacity, dtype=torch.bool)
    if mask is None:
        allowed[:, :start + n] = True
    else:
        allowed[:, :mask.shape[1]] = mask
    return allowed


@functools.lru_cache(maxsize=None)
def rows_are_invariant(n_head: int, d_head: int, n_self_keys: int, n_cross_keys: int, threads: int) -> bool:
    """Measure, on this CPU with these kernels, that ``invariant_attention`` gives every row of a batch
    of 2..MAX_ROWS rows the bits it gets alone: self-attention (causal masks over the cache's
    slots) and cross-attention, batch 1 and 2. About 0.3 s for base on 2 cores."""
    generator = torch.Generator().manual_seed(0)

    def randn(*shape):
        return torch.randn(*shape, generator=generator)

    for batch in (1, 2):
        q = randn(batch, MAX_ROWS, n_head * d_head)
        for n_key in (n_self_keys, n_cross_keys):  # head-major, as StaticKVCache and CrossKV keep them
            shape = (batch, n_head, n_key, d_head)
            k, v = randn(*shape).to(INVARIANT_DTYPE), randn(*shape).to(INVARIANT_DTYPE)
            allowed = None
            if n_key == n_self_keys:  # row i sees keys [0, n_key // 2 + i], as in a causal pass
                allowed = torch.zeros(MAX_ROWS, n_key, dtype=torch.bool)
                for row in range(MAX_ROWS):
                    allowed[row, :n_key // 2 + row + 1] = True

            def rows_of(first, n):
                return invariant_attention(q[:, first:first + n], k, v, n_head,
                                           None if allowed is None else allowed[first:first + n])
            alone = [rows_of(i, 1) for i in range(MAX_ROWS)]
            for n in range(2, MAX_ROWS + 1):
                first = (n * 7) % (MAX_ROWS - n + 1)  # rows from different places of the batch
                together = rows_of(first, n)
                if not all(torch.equal(together[:, i:i + 1], alone[first + i]) for i in range(n)):
                    return False
    return True
