"""Attention whose result for a query row does not depend on how many rows share the pass.

Why: lossless verification needs each verified row to get exactly the numbers a greedy step over
that row alone gets. With float32 caches and PyTorch's attention kernels it does not (the kernels
sum in another order for another number of rows, measured: every row of 2-16-row batches differed
in its last bits), and an int8 model's linears turn such bits into different logits. So converted
models used to attend one row at a time (``rows_alone``), which costs a pass over 8 rows 2.2 single
-row passes of int8 base, 5 ms of it attention.

This module's attention instead has one shape for every pass of a window, whatever its rows:
- keys and values are stored in the model's invariant dtype: bfloat16 on CPUs with native
  bfloat16 products (half the bytes to stream: cross-attention reads 1,500 positions per layer in
  every pass), float32 elsewhere (emulated bfloat16 products made an AVX2 EPYC's int8 pass 2.7x
  slower); queries are cast to it, the two products run as matrix products in it, softmax in
  float32;
- self-attention runs over the cache's slots up to the pass's end rounded up to ``SLOT_STEP``, the
  unwritten ones masked (``attended_slots``): where this CPU gives a row the same bits over any such
  length as over every slot of the static cache (``slot_step`` measures it), else over all 448, so
  a row's softmax and weighted sum come out the same whichever pass it is in;
- where ``make setup`` built the package's kernels, the whole attention is theirs (``native.attend``):
  each row's sums in one fixed order, float32 throughout, invariant by construction and tested;
- elsewhere, a single row is multiplied as two (one row goes to a matrix-vector kernel that sums
  in another order), and a pass over more rows is split into products of at most ``product_rows``
  rows: the most rows for which this CPU's kernels give every row the bits it gets alone (bfloat16
  on an AVX-512 EPYC: all 32 tried; float32 on an AVX2 EPYC: 3, beyond which MKL changes kernels).
The products run per batch item (matrix products batch over the leading dimension), so a stream's
rows get the same bits beside other streams' as alone: what batched decoding of many windows needs
(PyTorch's fused attention kernel does not give that; measured on the AVX2 EPYC).
None of this is a documented guarantee, so ``product_rows`` measures it once per process for the
model's shapes; converted models use this attention only where it holds (compute.py).

Departs from whisper, whose attention runs in the model's dtype over exactly the visible keys.
"""

from __future__ import annotations

import functools
from typing import Optional

import torch
from torch import Tensor, nn

from . import native
from .together import together

INVARIANT_DTYPE = torch.bfloat16  # where the CPU multiplies it natively (compute.invariant_dtype)
MAX_ROWS = 32  # most rows per product; the probe checks every count from 2 to this
# self-attention reads the written slots rounded up to a multiple of this, where measured invariant:
# a step early in a window reads 16-64 slots, not all 448 (base int8, one core: about 0.6 ms of a
# 12 ms pass, the bytes and the kernels' fixed costs over 448 cold slots)
SLOT_STEP = 16


def row_invariant(attn: nn.Module) -> bool:
    """Whether this attention module attends with ``invariant_attention``: set by compute.py for a
    converted model, and always for a float32 one whose products are the package's kernels
    (``native.runs_float``), which attends over float32 keys and values by ``native.attend``."""
    return bool(getattr(attn, "row_invariant", False)) or _float32_native(attn)


def invariant_dtype(attn: nn.Module) -> torch.dtype:
    """The dtype this module's keys and values are kept in for ``invariant_attention``."""
    marked = getattr(attn, "invariant_dtype", None)
    if marked is not None:
        return marked
    return torch.float32 if _float32_native(attn) else INVARIANT_DTYPE


def _float32_native(attn: nn.Module) -> bool:
    query = getattr(attn, "query", None)
    return (query is not None and native.runs_float(query)
            and native.attends(torch.float32, query.out_features // attn.n_head))


def invariant_attention(q: Tensor, k: Tensor, v: Tensor, n_head: int, allowed: Optional[Tensor],
                        slots: Optional[int] = None) -> Tensor:
    """Attention of (batch, n_query, n_state) queries over keys and values, heads merged, float32 out.

    k, v    : head-major (batch, n_head, n_key, d_head), in the invariant dtype, as the step's caches keep them
    allowed : (n_query, n_key) bool, True where a query may attend, or (batch, n_query, n_key) for a
              mask per batch item (streams at different positions); None: every key
    slots   : the cache's capacity when k, v are its first ``attended_slots`` slots (the rows per
              product are the ones measured there); None: n_key
    """
    batch, n_query, n_state = q.shape
    d_head = n_state // n_head
    if q.device.type == "cpu" and native.attends(k.dtype, d_head):
        return native.attend(q, k, v, n_head, allowed)
    if n_query == 1:
        chunk = 2
    elif together():  # a prompt pass: its rows are never computed in other company (together.py)
        chunk = n_query
    else:
        chunk = product_rows(k.dtype, n_head, d_head, slots or k.shape[2])
    # the scale 1/sqrt(d_head) (a power of two for whisper's 64) on the float32 query, as SDPA's default
    q = (q.view(batch, n_query, n_head, d_head).transpose(1, 2) * d_head ** -0.5).to(k.dtype)
    if allowed is not None and allowed.dim() == 2:
        allowed = allowed.unsqueeze(0)  # (1 or batch, n_query, n_key)
    outs = [_product(q[:, :, first:first + chunk], k, v, None if allowed is None else allowed[:, first:first + chunk])
            for first in range(0, n_query, chunk)]
    out = outs[0] if len(outs) == 1 else torch.cat(outs, dim=2)
    return out.float().transpose(1, 2).reshape(batch, n_query, n_state)


def _product(rows: Tensor, k: Tensor, v: Tensor, allowed: Optional[Tensor]) -> Tensor:
    """Attention of (batch, n_head, n, d_head) query rows, scaled and in k's dtype, over all of k and v.

    allowed : (1 or batch, n, n_key) bool, or None
    """
    n = rows.shape[2]
    if n == 1:  # a matrix-vector product sums in another order: one row goes as two
        rows = rows.expand(-1, -1, 2, -1)
        allowed = None if allowed is None else allowed.expand(-1, 2, -1)
    # contiguous: float32 products of strided or stride-0 rows take a slow path (measured 50x on an AVX2 EPYC)
    scores = (rows.contiguous() @ k.transpose(-1, -2)).float()
    if allowed is not None:
        scores.masked_fill_(~allowed.unsqueeze(1), float("-inf"))
    return (scores.softmax(-1).to(v.dtype) @ v)[:, :, :n]


def attended_slots(end: int, capacity: int, dtype: torch.dtype, n_head: int, d_head: int) -> int:
    """How many of the cache's first slots a pass ending at slot ``end`` attends over: ``end``
    rounded up to ``slot_step`` (every slot where shorter lengths were not measured invariant)."""
    step = slot_step(dtype, n_head, d_head, capacity)
    return min(capacity, -(-end // step) * step)


def slot_step(dtype: torch.dtype, n_head: int, d_head: int, capacity: int) -> int:
    """SLOT_STEP where, on this CPU, a query row over the first S slots of a cache (S any multiple of
    SLOT_STEP that covers what it sees) gets the bits it gets over all ``capacity`` slots, alone and in
    products of up to ``product_rows`` rows; else ``capacity``. Measured once per process (about
    30 ms for base)."""
    return _slot_step(dtype, n_head, d_head, capacity, torch.get_num_threads())


@functools.lru_cache(maxsize=None)
def _slot_step(dtype: torch.dtype, n_head: int, d_head: int, capacity: int, threads: int) -> int:
    if native.attends(dtype, d_head):  # a masked slot adds an exact zero there (tests/test_native.py)
        return SLOT_STEP
    rows = product_rows(dtype, n_head, d_head, capacity)
    if rows < 2 or capacity <= SLOT_STEP:
        return capacity
    generator = torch.Generator().manual_seed(2)

    def randn(*shape):
        return torch.randn(*shape, generator=generator)

    q = (randn(1, rows, n_head, d_head).transpose(1, 2) * d_head ** -0.5).to(dtype)
    k, v = randn(1, n_head, capacity, d_head).to(dtype), randn(1, n_head, capacity, d_head).to(dtype)
    for seen in sorted({1, SLOT_STEP - 1, SLOT_STEP, SLOT_STEP + 1, capacity // 3, capacity - rows}):
        for n in sorted({1, 2, min(3, rows), rows}):  # q holds ``rows`` rows
            n = min(n, capacity - seen)
            allowed = torch.zeros(1, n, capacity, dtype=torch.bool)  # row i sees slots [0, seen + i]
            for row in range(n):
                allowed[0, row, :seen + row + 1] = True
            every = _product(q[:, :, :n], k, v, allowed)
            for length in range(-(-(seen + n) // SLOT_STEP) * SLOT_STEP, capacity, SLOT_STEP):
                if not torch.equal(_product(q[:, :, :n], k[:, :, :length], v[:, :, :length], allowed[..., :length]),
                                   every):
                    return capacity
    return SLOT_STEP


@functools.lru_cache(maxsize=None)
def product_rows(dtype: torch.dtype, n_head: int, d_head: int, n_key: int) -> int:
    """The most query rows (2..MAX_ROWS) one product of ``invariant_attention`` may take on this CPU:
    every count from 2 up to it gives each row the bits it gets alone (0: not even 2). Measured once
    per process for these shapes (``_invariant_up_to``); about 0.1-2 s for base on 2 cores."""
    return _invariant_up_to(dtype, n_head, d_head, n_key, torch.get_num_threads())


def _invariant_up_to(dtype: torch.dtype, n_head: int, d_head: int, n_key: int, threads: int) -> int:
    generator = torch.Generator().manual_seed(0)

    def randn(*shape):
        return torch.randn(*shape, generator=generator)

    q = (randn(2, MAX_ROWS, n_head, d_head).transpose(1, 2) * d_head ** -0.5).to(dtype)
    k, v = randn(2, n_head, n_key, d_head).to(dtype), randn(2, n_head, n_key, d_head).to(dtype)
    allowed = torch.zeros(MAX_ROWS, n_key, dtype=torch.bool)  # row i sees keys [0, n_key // 2 + i]
    for row in range(MAX_ROWS):
        allowed[row, :n_key // 2 + row + 1] = True

    def product(first: int, n: int) -> Tensor:  # invariant_attention's inner step, rows [first, first + n)
        return _product(q[:, :, first:first + n], k, v, allowed[None, first:first + n])

    alone = [product(i, 1) for i in range(MAX_ROWS)]
    best = 0
    for n in range(2, MAX_ROWS + 1):
        first = (n * 7) % (MAX_ROWS - n + 1)  # rows from different places of the batch
        together = product(first, n)
        if not all(torch.equal(together[:, :, i:i + 1], alone[first + i]) for i in range(n)):
            break
        best = n
    return best


@functools.lru_cache(maxsize=None)
def rows_are_invariant(dtype: torch.dtype, n_head: int, d_head: int, n_self_keys: int, n_cross_keys: int,
                       threads: int) -> bool:
    """Measure, on this CPU with these kernels, that ``invariant_attention`` in ``dtype`` gives every row
    the bits it gets alone: rows of one stream in passes of 2..MAX_ROWS rows (self-attention with causal
    masks over the cache's slots, and cross-attention), and a stream beside other streams (batch 3
    against batch 1, with a mask per stream). About 0.3-2 s for base on 2 cores."""
    generator = torch.Generator().manual_seed(1)

    def randn(*shape):
        return torch.randn(*shape, generator=generator)

    for n_key in (n_self_keys, n_cross_keys):
        if not native.attends(dtype, d_head) and product_rows(dtype, n_head, d_head, n_key) < 2:
            return False
    # streams side by side: batch 3 against each stream alone, one query row each at its own position
    n_state = n_head * d_head
    q = randn(3, 1, n_state)
    for n_key in (n_self_keys, n_cross_keys):
        shape = (3, n_head, n_key, d_head)
        k, v = randn(*shape).to(dtype), randn(*shape).to(dtype)
        allowed = None
        if n_key == n_self_keys:
            allowed = torch.zeros(3, 1, n_key, dtype=torch.bool)
            for b, seen in enumerate((5, n_key // 2, n_key - 1)):
                allowed[b, 0, :seen] = True
        together = invariant_attention(q, k, v, n_head, allowed)
        for b in range(3):
            alone = invariant_attention(q[b:b + 1], k[b:b + 1], v[b:b + 1], n_head,
                                        None if allowed is None else allowed[b:b + 1])
            if not torch.equal(together[b:b + 1], alone):
                return False
    return True


# Masks of a decoder pass as plain tensors; the candidate trees (drafting/tree.py) lay out theirs with it.
def chain_mask(start: int, n: int, device) -> Optional[Tensor]:
    """Boolean mask (n, start+n) letting query i see slots [0, start+i]; None when n == 1."""
    if n == 1:
        return None  # a single query sees every written slot
    return torch.ones(n, start + n, dtype=torch.bool, device=device).tril(diagonal=start)
