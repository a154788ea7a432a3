"""Passes whose rows are only ever computed together, and may take the kernels made for many rows.

Lossless decoding needs a verified row to get the bits it gets alone, so a converted model's
decoder multiplies and attends row-invariantly: the int8 weight-only kernel (``compute.Int8Linear``),
``invariant_attention``'s products of at most ``product_rows`` rows, ``rows_alone``. Those kernels
cost about as much per row as a pass over the row alone does: right for a step's few rows, dear for
a window's prompt pass (the previous text, up to 224 rows: 0.17 s of base int8 on one AVX-512 core,
0.34 s capped to AVX2) and its cross-attention keys and values (1,500 rows).

Those passes never need the invariance: whichever way a window is decoded (greedy, speculative, in
a batch or alone, its fallback candidates), its prompt runs as one pass over the same tokens, and
its cross-attention keys and values are computed once from its encoder output. So the code that
opens a window runs them inside ``rows_together()``, and there the products take the kernels
fastest for many rows (compute.Int8Linear.many_rows, one attention product for every row). Every
path that opens a window does so, so they still agree bit for bit.
"""

from __future__ import annotations

import contextlib
import contextvars
from typing import Iterator

_TOGETHER = contextvars.ContextVar("medusa_whisper_rows_together", default=False)


@contextlib.contextmanager
def rows_together() -> Iterator[None]:
    """Within: the passes run compute every row together, never in other company (see above)."""
    token = _TOGETHER.set(True)
    try:
        yield
    finally:
        _TOGETHER.reset(token)


def together() -> bool:
    """Whether the current pass's rows are computed only together (``rows_together``)."""
    return _TOGETHER.get()
