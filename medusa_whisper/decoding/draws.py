"""whisper's sampled draw: the same tokens from the same generator state, in half the time or less.

A sampled fallback attempt draws every candidate's next token with
``Categorical(logits=logits / temperature).sample()``, which is ``torch.multinomial(probs, 1, True)``.
PyTorch computes one such sample as argmax(probs / q), q an Exp(1) draw for every vocabulary entry
made by ``exponential_``'s serial loop: 4.2-4.6 ms for 5 x 51,865 entries on the CPUs measured, a
seventh to a quarter of a best_of 5 pass of base int8.

The same q, bit for bit, comes from one 64-bit draw per entry in the same order (``random_`` on
int64), its low 53 bits as a uniform u in [0, 1), q = -log1p(-u) in float64 cast to float32; done
as whole-tensor operations it costs 1.6-2.3 ms there. That is how this PyTorch draws, not a promise of
its API, so ``exact()`` checks it once per process (tokens and the generator's state after, against
``torch.multinomial``), and ``multinomial_one`` calls ``torch.multinomial`` itself where the check
fails, and for anything it does not take (other dtypes or devices, probabilities it would reject).
"""

from __future__ import annotations

import functools
from typing import Optional

import torch
from torch import Tensor

_MANTISSA = (1 << 53) - 1  # a float64 uniform's bits


def multinomial_one(probs: Tensor, generator: Optional[torch.Generator] = None) -> Tensor:
    """``torch.multinomial(probs, 1, True, generator=generator)``: probs (rows, n) -> (rows, 1) long."""
    if probs.dim() != 2 or probs.dtype != torch.float32 or probs.device.type != "cpu" or not exact():
        return torch.multinomial(probs, 1, True, generator=generator)
    # torch.multinomial rejects negative, infinite or NaN entries and rows summing to 0: leave those to
    # it, and its error message with them (max() is NaN where an entry is, and NaN < inf is false)
    if not (float(probs.min()) >= 0 and float(probs.max()) < float("inf") and bool((probs.sum(-1) > 0).all())):
        return torch.multinomial(probs, 1, True, generator=generator)
    return _exponential_race(probs.contiguous(), generator)


def _exponential_race(probs: Tensor, generator: Optional[torch.Generator]) -> Tensor:
    """argmax(probs / q) for q ~ Exp(1) per entry, q drawn as ``exponential_`` draws it (see the module)."""
    bits = torch.empty(probs.shape, dtype=torch.int64).random_(generator=generator)
    uniform = bits.bitwise_and_(_MANTISSA).double().mul_(2.0 ** -53)
    q = uniform.neg_().log1p_().neg_().float()
    return torch.div(probs, q, out=q).argmax(dim=-1, keepdim=True)


@functools.lru_cache(maxsize=1)
def exact() -> bool:
    """Whether ``_exponential_race`` draws what ``torch.multinomial`` draws on this PyTorch: the same
    tokens and the same generator state after, on a generator of its own (the caller's untouched)."""
    checks = torch.Generator().manual_seed(46)
    probs = torch.rand(6, 4099, generator=checks)
    probs[:, ::7] = 0  # entries the rules forbid
    probs[1] = 0
    probs[1, 4098] = 1  # one certain token
    probs = probs / probs.sum(-1, keepdim=True)
    theirs, ours = torch.Generator().manual_seed(5), torch.Generator().manual_seed(5)
    for _ in range(3):
        if not torch.equal(torch.multinomial(probs, 1, True, generator=theirs), _exponential_race(probs, ours)):
            return False
    return torch.equal(theirs.get_state(), ours.get_state())
