"""What a decoder pass over n new rows costs on the running machine, relative to a pass over one,
and what the EAGLE head's drafting of a chain costs beside it.

The CTC proposer chooses how many draft tokens to verify per pass from this table
(``ctc_proposer.choose_chunk``): a long chunk pays only where extra rows cost little. The EAGLE
head's chain, where the host accepts, is as long as makes a token cheapest given what its rows and
its drafting cost here (``chosen_chain_depth``): each drafted token is a pass of the head's block,
which on a CPU costs about a sixth of the decoder's pass, so a long chain that pays where drafting
is part of a captured pass does not on a CPU. How little
depends on the CPU, its memory, the compute type and the model: on one 2-core EPYC, 32 rows of base
cost 5.4 single-row passes at float32 and 2.8 at int8; on a CPU with AMX the int8 curve is flatter
still. So the table is not written in the code or in a head's file: it is measured here, the first
time a model drafts at its compute type, and kept on the model's decoder for the rest of the process.
"""

from __future__ import annotations

import time
from typing import Callable, Dict, Hashable, Optional, Sequence, Tuple

import torch
from torch import Tensor

from ..options import DRAFT_TOKENS
from ..step.compute import compute_type_of
from ..step.cpu import cpu_step
from ..step.attention import chain_mask
from .device.eagle import DeviceEagle, chain_depth

CONTEXT = 60  # cached tokens before the timed rows: about the middle of a window's text
ROUNDS = 3  # each row count is timed this often, interleaved with the others; its fastest round counts
_MEMO = "_measured_pass_costs"  # attribute of the decoder: {(compute type, row counts): costs}
CHAIN_DEPTHS = (1, 2, 3, 4, 5, 6, 7, 8)  # the EAGLE chains weighed, at most as many as the head's record measured


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
    step, _ = _context_step(model, audio_features)
    best = _fastest({n: _pass(step, n) for n in rows}, audio_features.device)
    return tuple(round(best[n] / best[rows[0]], 3) for n in rows)


def _context_step(model, audio_features: Tensor):
    """The CPU's step over one window with CONTEXT tokens cached (any tokens: the time does not
    depend on them), and their states."""
    device = audio_features.device
    step = cpu_step(model, 1, audio_features.dtype, device)
    step.set_audio(audio_features)
    context = torch.arange(CONTEXT, device=device)[None]
    return step, step.pass_at(context, context[0], 0, chain_mask(0, CONTEXT, device))


def _pass(step, n: int) -> Callable[[], object]:
    """A pass over n new rows after the context, and the vocabulary (the next writes its rows' slots again)."""
    device = step.device
    new = torch.zeros(1, n, dtype=torch.long, device=device)
    positions = torch.arange(CONTEXT, CONTEXT + n, device=device)
    return lambda: step.logits(step.pass_at(new, positions, CONTEXT, chain_mask(CONTEXT, n, device)))


def _fastest(runs: Dict[Hashable, Callable[[], object]], device: torch.device) -> Dict[Hashable, float]:
    """Each run's fastest of ROUNDS rounds, in seconds. Each runs once untimed first (the first run of
    a shape may choose its kernels, routes.py, or allocate); rounds interleave the runs, so that a
    burst of load elsewhere slows one round of every run, not every round of one."""

    def timed(run) -> float:
        began = time.perf_counter()
        run()
        if device.type == "cuda":
            torch.cuda.synchronize(device)
        return time.perf_counter() - began

    for run in runs.values():
        run()
    best = {key: float("inf") for key in runs}
    for _ in range(ROUNDS):
        for key, run in runs.items():
            best[key] = min(best[key], timed(run))
    return best


def chosen_chain_depth(model, head) -> int:
    """The EAGLE chain length that makes a token cheapest on the running machine, where the host
    accepts (``chain_depth``): the head's held-out acceptance at each depth (its record), the
    decoder's pass over each number of rows and the head's drafting of each chain, measured once
    per model and compute type. The default length where the record has no acceptance."""
    accepted = tuple(head.config.accepted_at_depth)
    if not accepted:
        return DRAFT_TOKENS
    depths = CHAIN_DEPTHS[:len(accepted)]
    memo = model.decoder.__dict__.setdefault(_MEMO, {})
    key = (compute_type_of(model), "eagle chain", depths)
    if key not in memo:
        memo[key] = measure_chains(model, head, depths)
    pass_costs, draft_costs = memo[key]
    return chain_depth(accepted, pass_costs, draft_costs)


@torch.no_grad()
def measure_chains(model, head, depths: Tuple[int, ...]) -> Tuple[Tuple[float, ...], Tuple[float, ...]]:
    """Over a one-row pass after CONTEXT tokens: the pass over 1 + d rows and the head's advance
    that drafts a chain of d (its commit of two rows, the pending token and one accepted, then the
    chain), for each d of ``depths``; the fastest of interleaved rounds."""
    dims, device = model.dims, model.decoder.positional_embedding.device
    features = torch.zeros(1, dims.n_audio_ctx, dims.n_audio_state, device=device)
    step, hidden = _context_step(model, features)
    history = torch.zeros(1, dims.n_text_ctx + 1, dtype=torch.long, device=device)
    greedy = torch.zeros(1, 1, dtype=torch.long, device=device)
    start, two = torch.tensor([CONTEXT - 2], device=device), torch.tensor([2], device=device)
    chains = {d: DeviceEagle(head, step, d) for d in depths}
    for chain in chains.values():  # its cache holds the context
        chain.begin(features, None)
        chain.advance(hidden, history, torch.zeros_like(start), torch.tensor([CONTEXT], device=device), greedy, None)
    runs = {("pass", n): _pass(step, n) for n in [1] + [1 + d for d in depths]}
    runs.update({("chain", d): (lambda c=chain: c.advance(hidden[:, CONTEXT - 2:], history, start, two, greedy, None))
                 for d, chain in chains.items()})
    best = _fastest(runs, device)
    one = best[("pass", 1)]
    return (tuple(round(best[("pass", 1 + d)] / one, 3) for d in depths),
            tuple(round(best[("chain", d)] / one, 3) for d in depths))


def draft_model_costs(model, draft, depths: int) -> Tuple[Tuple[float, ...], float]:
    """The main model's pass over 1 + d rows for d = 1 .. ``depths`` and one step of the draft model
    (attending over half a window's positions: the draft encodes the audio only, draft_audio.py), in
    the main model's one-row passes; measured once per pair of models and compute types."""
    memo = model.decoder.__dict__.setdefault(_MEMO, {})
    key = (compute_type_of(model), "draft model", compute_type_of(draft), tuple(vars(draft.dims).values()), depths)
    if key not in memo:
        memo[key] = _measure_draft_model(model, draft, depths)
    return memo[key]


@torch.no_grad()
def _measure_draft_model(model, draft, depths: int) -> Tuple[Tuple[float, ...], float]:
    def zeros(m, positions: int) -> Tensor:
        return torch.zeros(1, positions, m.dims.n_audio_state, device=m.decoder.positional_embedding.device)

    step, _ = _context_step(model, zeros(model, model.dims.n_audio_ctx))
    draft_step, _ = _context_step(draft, zeros(draft, draft.dims.n_audio_ctx // 2))
    runs = {n: _pass(step, n) for n in range(1, depths + 2)}
    runs["draft"] = _pass(draft_step, 1)
    best = _fastest(runs, step.device)
    one = best[1]
    return tuple(round(best[1 + d] / one, 3) for d in range(1, depths + 1)), round(best["draft"] / one, 3)
