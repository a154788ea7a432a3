"""The int8 model's encoder: float32, bfloat16 or int8 rows, whichever encodes a real window fastest here.

The encoder multiplies 1,500 rows by every weight, so its products are bound by arithmetic, and which
arithmetic is fastest is a fact of the CPU, not of its flags. Measured, base, one window, 2 threads:

| CPU | float32 | bfloat16 products | int8 rows |
|---|---|---|---|
| Intel Xeon with AMX | 381 ms | 157-246 ms | - |
| Intel Xeon, AVX-512 BF16, no AMX | 389-404 ms | 567-601 ms | - |
| AMD EPYC, AVX2 only (family 23) | 1,297-1,326 ms | 5,683-5,760 ms (emulated) | 1,339-1,402 ms |

So an int8 model's encoder takes the form that encodes the timing clip's window fastest on the
running machine (``chosen``), timed once per machine and encoder shape and kept with the kernel
routes. The forms are ``FORMS``, the most exact first (int8 rows cost the encoder's output 10 %
mean relative error on the AVX2 EPYC; bfloat16 about 1 %), and within ``TIE`` of the fastest the
more exact one is kept. One product of the encoder's widest shape shortlists them first: a form
that takes more than ``SHORTLIST`` times the fastest form's time for it is not timed whole
(emulated bfloat16 would cost the timing 20 s on that EPYC). The decoder is int8 whatever the
encoder's form, so the decoder's passes are not part of this choice.

How a form is made (the linears swapped, the attention's dtype) is the caller's: ``compute.py``
hands its conversion in, so this module depends on nothing that converts.
"""

from __future__ import annotations

import copy
import time
from typing import Callable, Dict, Iterable, List

import torch
from torch import nn
from whisper.model import AudioEncoder, ModelDimensions

from .routes import announce, fastest_of, median_micros, table as routes_table

FORMS = ("float32", "bfloat16", "int8 rows")  # the most exact first
TIE = 1.05  # within this much of the fastest, the more exact form is kept
SHORTLIST = 1.5  # a form this much slower than the fastest on one wide product is not timed whole

Convert = Callable[[nn.Module, str], nn.Module]  # (module, form) -> the module with its linears in that form
PREFIX = "int8 encoder form "  # how the choice's name begins in the routes table


def choose(costs: Dict[str, float]) -> str:
    """The form from measured costs ("encoder <form>" -> microseconds a window): the most exact of
    those within TIE of the fastest."""
    timed = {form: costs[f"encoder {form}"] for form in FORMS if f"encoder {form}" in costs}
    best = min(timed.values())
    return next(form for form in FORMS if form in timed and timed[form] <= TIE * best)


def name(dims: ModelDimensions) -> str:
    return f"{PREFIX}{dims.n_audio_layer}x{dims.n_audio_state} heads {dims.n_audio_head} mels {dims.n_mels}"


def costs(dims: ModelDimensions, convert: Convert) -> Dict[str, float]:
    """What ``measure`` timed for an int8 encoder of these dimensions on this machine; until timed here
    (``medusa-whisper tune``), a recorded kind's, else float32's (the most exact form)."""
    return routes_table().costs(name(dims), lambda: measure(dims, convert), job=True,
                                default=lambda: {"product float32": 1.0, "encoder float32": 1.0})


def chosen(dims: ModelDimensions, convert: Convert) -> str:
    """The form of an int8 model's encoder of these dimensions on this machine."""
    return choose(costs(dims, convert))


def shortlisted(costs: Dict[str, float]) -> List[str]:
    """The forms whose one wide product ("product <form>") took at most SHORTLIST times the fastest's."""
    products = {form: costs[f"product {form}"] for form in FORMS if f"product {form}" in costs}
    fastest = min(products.values())
    return [form for form, us in products.items() if us <= SHORTLIST * fastest]


def measure(dims: ModelDimensions, convert: Convert, forms: Iterable[str] = FORMS) -> Dict[str, float]:
    """Microseconds of each form: "product <form>" for one (1,500 x n) by (4n x n) product, and
    "encoder <form>" for a whole encoder pass over the timing clip's window (forms shortlisted by
    their product), alternating after a warm-up (``routes.fastest_of``). The encoder's weights are drawn
    at random: its arithmetic does not depend on their values, and the model's own need not be
    loaded to choose before its converted copy is read."""
    from ..audio.timing_clip import window_mel

    forms = tuple(forms)
    began = time.perf_counter()
    announce(f"timing the int8 encoder's forms ({', '.join(forms)}) on one window, once for this machine")
    costs: Dict[str, float] = {}
    with torch.inference_mode():
        rows = torch.randn(dims.n_audio_ctx, dims.n_audio_state)
        wide = nn.Linear(dims.n_audio_state, 4 * dims.n_audio_state)
        for form in forms:
            product = convert(nn.Sequential(copy.deepcopy(wide)), form)
            costs[f"product {form}"] = median_micros(lambda: product(rows))
        encoder = AudioEncoder(dims.n_mels, dims.n_audio_ctx, dims.n_audio_state, dims.n_audio_head,
                               dims.n_audio_layer).eval()
        encoders = {form: convert(copy.deepcopy(encoder), form) for form in shortlisted(costs)}
        del encoder
        mel = window_mel(dims.n_mels)[None]

        def timer(form: str) -> Callable[[], float]:
            def run() -> float:
                start = time.perf_counter()
                encoders[form](mel)
                return (time.perf_counter() - start) * 1e6
            return run
        best = fastest_of({form: timer(form) for form in encoders})
    costs.update({f"encoder {form}": t for form, t in best.items()})
    window = ", ".join(f"{form} {t / 1e6:.2f} s" for form, t in best.items())
    announce(f"int8 encoder timed in {time.perf_counter() - began:.1f} s: {window} a window -> {choose(costs)}")
    return costs


