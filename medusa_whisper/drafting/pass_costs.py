"""What a decoder pass over n new rows costs on the running machine, relative to a pass over one.

The CTC proposer chooses how many draft tokens to verify per pass from this table
(``ctc_proposer.choose_chunk``): a long chunk pays only where extra rows cost little. How little
depends on the CPU, its memory, the compute type and the model: on one 2-core EPYC, 32 rows of base
cost 5.4 single-row passes at float32 and 2.8 at int8; on a CPU with AMX the int8 curve is flatter
still. So the table is not written in the code or in a head's file: it is measured here, the first
time a model drafts at its compute type, and kept on the model's decoder for the rest of the process.
"""

from __future__ import annotations

import time
from typing import Optional, Sequence, Tuple

import torch
from torch import Tensor

from ..step.compute import compute_type_of
from ..step.cpu import cpu_step
from ..step.attention import chain_mask

CONTEXT = 60  # cached tokens before the timed rows: about the middle of a window's text
ROUNDS = 3  # each row count is timed this often, interleaved with the others; its fastest round counts
_MEMO = "_measured_pass_costs"  # attribute of the decoder: {(compute type, row counts): costs}


def measured_pass_costs(model, rows: Sequence[int], audio_features: Optional[Tensor] = None) -> Tuple[float, ...]:
    """The cost of a pass over each of ``rows`` new rows after a cache of CONTEXT tokens, divided by
    the cost over ``rows[0]`` (1: plain decoding), measured once per model and compute type.

    audio_features : shape = (1, n_audio_ctx, n_audio_state), the window being decoded (its values do
                     not change the time; its dtype and device do), or None for zeros in float32
    """
    decoder = model.decoder
    memo = decoder.__dict__.setdefault(_MEMO, {})
    key = (compute_type_of(model), tuple(rows))
    if key not in memo:
        if audio_features is None:
            dims = model.dims
            audio_features = torch.zeros(1, dims.n_audio_ctx, dims.n_audio_state,
                                         device=decoder.positional_embedding.device)
        memo[key] = _measure(model, tuple(rows), audio_features[:1])
    return memo[key]


@torch.no_grad()
def _measure(model, rows: Tuple[int, ...], audio_features: Tensor) -> Tuple[float, ...]:
    """Each count's pass (the decoder step on the CPU's products and the vocabulary) after CONTEXT
    tokens, timed; its fastest round over the first count's."""
    device = audio_features.device
    step = cpu_step(model, 1, audio_features.dtype, device)
    step.set_audio(audio_features)
    context = torch.arange(CONTEXT, device=device)[None]  # any tokens: the time does not depend on them
    step.pass_at(context, context[0], 0, chain_mask(0, CONTEXT, device))

    def one_pass(n: int) -> float:
        new = torch.zeros(1, n, dtype=torch.long, device=device)
        positions = torch.arange(CONTEXT, CONTEXT + n, device=device)
        began = time.perf_counter()
        step.logits(step.pass_at(new, positions, CONTEXT, chain_mask(CONTEXT, n, device)))
        if device.type == "cuda":
            torch.cuda.synchronize(device)
        return time.perf_counter() - began  # the next pass writes its rows' slots again

    for n in rows:  # the first pass of a shape may choose its kernels (routes.py) or allocate: untimed
        one_pass(n)
    best = {n: float("inf") for n in rows}
    for _ in range(ROUNDS):  # rounds interleave the row counts, so that a burst of load elsewhere
        for n in rows:  # slows one round of every count, not every round of one
            best[n] = min(best[n], one_pass(n))
    return tuple(round(best[n] / best[rows[0]], 3) for n in rows)
