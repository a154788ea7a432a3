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
time a model of that shape drafts at its compute type (about a second), and kept with the kernel
routes (``step/routes.py``) for every later model and process on this machine. A table pinned to a
recorded kind replays that kind's costs, or ``DEFAULT_ROW_COST``'s where it holds none.
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
CHAIN_DEPTHS = (1, 2, 3, 4, 5, 6, 7, 8)  # the EAGLE chains weighed, at most as many as the head's record measured
# Where nothing is measured (a table pinned to a kind that holds no such costs): each extra row, and
# each drafted token, costs this much of a one-row pass, so that the proposers draft (tests exercise them)
DEFAULT_ROW_COST = 0.1


def _shape(model) -> str:
    """What a pass's cost depends on: the decoder's shape, its compute type and device."""
    dims = model.dims
    return (f"{dims.n_text_layer}x{dims.n_text_state} vocab {dims.n_vocab} audio {dims.n_audio_ctx} "
            f"{compute_type_of(model)} {model.decoder.positional_embedding.device.type}")


def _kept(name: str, measure: Callable[[], Dict[str, float]], default: Callable[[], Dict[str, float]]) -> Dict[str, float]:
    """Costs (alternative -> microseconds) measured once per machine and kept with the routes."""
    from ..step.routes import table as routes_table

    return routes_table().costs(name, measure, default=default)


def measured_pass_costs(model, rows: Sequence[int], audio_features: Optional[Tensor] = None) -> Tuple[float, ...]:
    """The cost of a pass over each of ``rows`` new rows after a cache of CONTEXT tokens, divided by
    the cost over ``rows[0]`` (1: plain decoding), measured once per machine, decoder shape and
    compute type.

    audio_features : shape = (1, n_audio_ctx, n_audio_state), the window being decoded (its values do
                     not change the time; its dtype and device do), or None for zeros in float32
    """
    rows = tuple(rows)

    def measure() -> Dict[str, float]:
        features = audio_features
        if features is None:
            dims = model.dims
            features = torch.zeros(1, dims.n_audio_ctx, dims.n_audio_state,
                                   device=model.decoder.positional_embedding.device)
        return _measure(model, rows, features[:1])

    def default() -> Dict[str, float]:
        return {str(n): 1 + DEFAULT_ROW_COST * (n - rows[0]) for n in rows}
    us = _kept(f"pass costs {_shape(model)} rows {','.join(map(str, rows))}", measure, default)
    return tuple(round(us[str(n)] / us[str(rows[0])], 3) for n in rows)


@torch.no_grad()
def _measure(model, rows: Tuple[int, ...], audio_features: Tensor) -> Dict[str, float]:
    """Each count's pass (the decoder step on the CPU's products and the vocabulary) after CONTEXT
    tokens, timed: its fastest round, in microseconds."""
    step, _ = _context_step(model, audio_features)
    best = _fastest({n: _pass(step, n) for n in rows}, audio_features.device)
    return {str(n): best[n] * 1e6 for n in rows}


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
    per machine, model shape and compute type. The default length where the record has no acceptance."""
    accepted = tuple(head.config.accepted_at_depth)
    if not accepted:
        return DRAFT_TOKENS
    depths = CHAIN_DEPTHS[:len(accepted)]

    def default() -> Dict[str, float]:
        return {"pass@1": 1.0, **{f"pass@{1 + d}": 1 + DEFAULT_ROW_COST * d for d in depths},
                **{f"chain@{d}": DEFAULT_ROW_COST * d for d in depths}}
    us = _kept(f"eagle chain costs {_shape(model)} depths {len(depths)}",
               lambda: _chain_micros(model, head, depths), default)
    one = us["pass@1"]
    return chain_depth(accepted, tuple(us[f"pass@{1 + d}"] / one for d in depths),
                       tuple(us[f"chain@{d}"] / one for d in depths))


def measure_chains(model, head, depths: Tuple[int, ...]) -> Tuple[Tuple[float, ...], Tuple[float, ...]]:
    """Over a one-row pass after CONTEXT tokens: the pass over 1 + d rows and the head's advance
    that drafts a chain of d (its commit of two rows, the pending token and one accepted, then the
    chain), for each d of ``depths``; the fastest of interleaved rounds."""
    us = _chain_micros(model, head, depths)
    one = us["pass@1"]
    return (tuple(round(us[f"pass@{1 + d}"] / one, 3) for d in depths),
            tuple(round(us[f"chain@{d}"] / one, 3) for d in depths))


@torch.no_grad()
def _chain_micros(model, head, depths: Tuple[int, ...]) -> Dict[str, float]:
    """Microseconds of the passes over 1 and 1 + d rows ("pass@n") and of the chains ("chain@d")."""
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
    return {f"{kind}@{n}": seconds * 1e6 for (kind, n), seconds in best.items()}


def draft_model_costs(model, draft, depths: int) -> Tuple[Tuple[float, ...], float]:
    """The main model's pass over 1 + d rows for d = 1 .. ``depths`` and one step of the draft model
    (attending over half a window's positions: the draft encodes the audio only, draft_audio.py), in
    the main model's one-row passes; measured once per machine and pair of model shapes and compute types."""
    def default() -> Dict[str, float]:
        return {"pass@1": 1.0, **{f"pass@{1 + d}": 1 + DEFAULT_ROW_COST * d for d in range(1, depths + 1)},
                "draft": DEFAULT_ROW_COST}
    us = _kept(f"draft model costs {_shape(model)} draft {_shape(draft)} depths {depths}",
               lambda: _draft_model_micros(model, draft, depths), default)
    one = us["pass@1"]
    return tuple(round(us[f"pass@{1 + d}"] / one, 3) for d in range(1, depths + 1)), round(us["draft"] / one, 3)


@torch.no_grad()
def _draft_model_micros(model, draft, depths: int) -> Dict[str, float]:
    """Microseconds of the main model's passes over 1 .. 1 + ``depths`` rows ("pass@n") and of a draft step."""
    def zeros(m, positions: int) -> Tensor:
        return torch.zeros(1, positions, m.dims.n_audio_state, device=m.decoder.positional_embedding.device)

    step, _ = _context_step(model, zeros(model, model.dims.n_audio_ctx))
    draft_step, _ = _context_step(draft, zeros(draft, draft.dims.n_audio_ctx // 2))
    runs = {f"pass@{n}": _pass(step, n) for n in range(1, depths + 2)}
    runs["draft"] = _pass(draft_step, 1)
    return {name: seconds * 1e6 for name, seconds in _fastest(runs, step.device).items()}
