"""Attention masks of a decoder pass, as plain tensors (no model, no cache).

Lives below both the decoder and the candidate trees (``drafting/tree.py``), which lay out the
masks the decoder reads.
"""

from __future__ import annotations

from typing import Optional

import torch
from torch import Tensor


def chain_mask(start: int, n: int, device) -> Optional[Tensor]:
    """Boolean mask (n, start+n) letting query i see slots [0, start+i]; None when n == 1."""
    if n == 1:
        return None  # a single query sees every written slot
    return torch.ones(n, start + n, dtype=torch.bool, device=device).tril(diagonal=start)
