"""Choices timed on a real job on the running machine: the compute type (``auto``) and the others.

Which compute type transcribes fastest is not written on the CPU: on an Intel Xeon with AVX-512 BF16
and no AMX, float32 transcribed 31 short clips in 21.6 s where int8 took 24.1 s (its encoder ran in
bfloat16 because the CPU has the instructions, 1.5x slower than float32 there), while on an AVX2-only
EPYC int8 decodes 2x faster than float32 (docs/cpu_kinds.md). So ``compute_type="auto"``
(``--compute-type auto``, faster-whisper's and CTranslate2's name) loads the model at each of the
device's compute types, decodes the timing clip's window (``audio/timing_clip.py``, a real 30-s window)
with each, as the user's windows will be decoded (encoder, prompt, the decoding loop with the model's
proposer), alternating, and keeps the one that took least time. Within ``TIE`` of it the more exact
type is kept (float32 is openai-whisper's own output). bfloat16 is timed only where its products are
not far slower than float32's (the int8 encoder's timing shortlists it, ``step/encoder_form.py``).

Timed once per machine (CPU, flags, torch, threads) and model name by ``medusa-whisper tune``
(``tune``), which prints what it times and chose, and kept with the kernel routes
(``step/routes.py``). Until then a job is not timed: its choice is the recorded CPU kind nearest this
one's (``step/kinds.py``), or its safe default (float32, plain decoding, whisper's products), so that
a first run waits for nothing. The other choices timed on a job: the int8 encoder's form
(``step/encoder_form.py``), the batch width for several files (``decoding/batches.py``), and the
proposer of a name that asks for the fastest one (``tiny.en-auto``, the default model:
``fastest_proposer``).
"""

from __future__ import annotations

import functools
import os
import time
from typing import Callable, Dict, List, Optional, Tuple

import torch

from .audio import timing_clip
from .checkpoints import weights
from .step import encoder_form
from .step.compute import compute_type_of
from .step.routes import ROUTES_ENV, announce, fastest_of, table as routes_table, whispers_route_for

AUTO = "auto"
EXACT_FIRST = ("float32", "bfloat16", "float16", "int8", "int8_float16")  # the most exact first
CANDIDATES = {"cpu": ("float32", "int8", "bfloat16"), "cuda": ("float32", "float16", "int8_float16")}
TIE = 1.05  # within this much of the fastest, the more exact type is kept

Loader = Callable[[str], torch.nn.Module]  # compute type -> the model loaded at it


def job_name(model_name: str) -> str:
    return f"compute type job {model_name}"


def choose(costs: Dict[str, float]) -> str:
    """The compute type from measured job costs (type -> microseconds a window): the most exact
    within TIE of the fastest."""
    best = min(costs.values())
    return next(t for t in EXACT_FIRST if t in costs and costs[t] <= TIE * best)


def fastest(model_name: str, device: torch.device, load: Loader) -> torch.nn.Module:
    """The model loaded at the compute type that decodes the timing clip fastest here (timed once)."""
    loaded: Dict[str, torch.nn.Module] = {}
    # predicted until timed here (``tune``): a recorded kind's job for this model, else float32 (the exact type)
    costs = routes_table().costs(job_name(model_name), lambda: measure(model_name, device, load, loaded),
                                 job=True, default=lambda: {"float32": 1.0})
    chosen = choose(costs)
    model = loaded.get(chosen) or load(chosen)
    model.compute_type_costs = dict(costs)  # what auto chose from, for --verbose and the result's stats
    model.compute_type_predicted = routes_table().predicted_from(job_name(model_name))
    return model


def measure(model_name: str, device: torch.device, load: Loader,
            loaded: Optional[Dict[str, torch.nn.Module]] = None) -> Dict[str, float]:
    """Microseconds of the timing clip's window decoded at each shortlisted compute type (alternating
    after a warm-up: ``routes.fastest_of``); ``loaded`` receives the models."""
    loaded = {} if loaded is None else loaded
    began = time.perf_counter()
    candidates = CANDIDATES.get(torch.device(device).type, CANDIDATES["cpu"])
    announce(f"timing {model_name} at {', '.join(candidates)} on this machine, once: the timing clip's "
             f"{timing_clip.seconds():.0f}-s window decoded at each")
    for compute_type in candidates:
        if compute_type == "bfloat16" and not _bfloat16_shortlisted(loaded):
            continue
        loaded[compute_type] = load(compute_type)
    mel = timing_clip.window_mel(next(iter(loaded.values())).dims.n_mels)
    best = fastest_of({compute_type: functools.partial(window_seconds, model, mel)
                       for compute_type, model in loaded.items()})
    costs = {compute_type: seconds * 1e6 for compute_type, seconds in best.items()}
    timed = ", ".join(f"{t} {s:.2f} s" for t, s in best.items())
    announce(f"{model_name}: {timed} a window -> {choose(costs)} (timed in {time.perf_counter() - began:.0f} s; "
             f"`medusa-whisper tune` times it again)")
    return costs


def window_seconds(model: torch.nn.Module, mel: torch.Tensor) -> float:
    """Wall seconds of one window decoded as ``transcribe`` decodes it: encoder, prompt and the loop
    with the model's proposer, lossless, in English (the clip's language), no fallback."""
    from .decoding.window import decode
    from .options import MedusaDecodingOptions

    device = next(model.parameters()).device
    options = MedusaDecodingOptions(language="en", fp16=device.type == "cuda")
    began = time.perf_counter()
    decode(model, mel.to(device), options)
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    return time.perf_counter() - began


# "tiny.en-auto": tiny.en with whichever of its installed lossless proposers (or none) decodes the timing
# clip fastest on this machine. Whether heads pay depends on the machine and on how long the windows
# are: on the AVX2 EPYC of family 23, float32, 2 threads, tiny.en-ctc took 0.91x plain tiny.en's time
# for the clip's 23-s window and 1.045x for its first 4.6 s (its head reads every audio position of a
# window, whatever its length). So each is timed on a short window and a long one (fractions of the clip)
AUTO_SUFFIX = "-auto"
PROPOSER_JOB_PREFIX = "proposer job "
PROPOSER_JOB_LENGTHS = (0.2, 1.0)
# A proposer must beat plain decoding by this much on the clip's windows to be taken. A window's time is
# mostly the encoder's, the same for every proposer (base int8 on the Xeon with AMX, one-call passes:
# about 0.27 of plain's 0.36 s for the short window), and the same model's window timed again there
# varied by 10-20 % (0.36-0.44 s); within that, a proposer's gain is not one, and plain loads no heads.
PROPOSER_TIE = 1.10


def auto_base(name) -> Optional[str]:
    """The base model of a name that asks for the fastest proposer ("tiny.en-auto" -> "tiny.en"), else None."""
    if not isinstance(name, str) or not name.endswith(AUTO_SUFFIX):
        return None
    base = name[: -len(AUTO_SUFFIX)]
    return base if base in weights.base_models() else None


def proposer_names(base: str) -> List[str]:
    """What ``base`` can decode with here, losslessly: plain (``base``), each proposer whose heads are
    installed (``base-medusa``, ``base-eagle``, ...) and each smaller Whisper as its draft model
    whose weights are (``base+tiny.en``)."""
    heads = [base + suffix for suffix in weights.MEDUSA_SUFFIXES if not weights.missing_heads(base + suffix)]
    return [base] + heads + [f"{base}+{draft}" for draft in weights.smaller_present(base)]


def proposer_job_name(base: str, compute_type: str, device: torch.device) -> str:
    return f"{PROPOSER_JOB_PREFIX}{base} {compute_type} {torch.device(device).type}"


def costs_by_proposer(costs: Dict[str, float]) -> Dict[str, Dict[str, float]]:
    """The proposer job's costs ("name@seconds" -> microseconds) by name: {name: {seconds: us}}; a
    name without "@seconds" is one job's time (a kind's real recordings, medusa_whisper/kinds/)."""
    named: Dict[str, Dict[str, float]] = {}
    for key, us in costs.items():
        name, at, length = key.rpartition("@")
        named.setdefault(name if at else key, {})[length if at else ""] = us
    return named


def choose_proposer(base: str, costs: Dict[str, float]) -> str:
    """From measured costs ("name@seconds" -> microseconds a window of that length): the proposer
    whose windows take least time in all, where that is PROPOSER_TIE faster than plain decoding
    (``base``) and no window length is slower; else plain decoding."""
    named = costs_by_proposer(costs)
    plain = named[base]
    allowed = [name for name, times in named.items() if all(times[length] <= plain[length] for length in plain)]
    fastest_name = min(allowed, key=lambda name: sum(named[name].values()))
    return fastest_name if sum(named[fastest_name].values()) * PROPOSER_TIE < sum(plain.values()) else base


def fastest_proposer(base: str, device: torch.device, compute_type: str, load: Loader) -> torch.nn.Module:
    """``base`` loaded with the proposer that decodes the timing clip fastest here (timed once per
    machine, compute type and device, kept with the routes; again when the installed heads change).
    ``load`` loads a model name at ``compute_type``. The model says what was chosen and from what
    (``proposer_name``, ``proposer_costs``)."""
    names = proposer_names(base)
    loaded: Dict[str, torch.nn.Module] = {}
    chosen, costs, predicted = base, {}, None
    if len(names) > 1:
        # timed again where the installed heads differ from those timed
        keys = [f"{name}@{length}" for name in names for length in _job_lengths()]
        job = proposer_job_name(base, compute_type, device)
        # predicted until timed here (``tune``): a recorded kind's job with the same heads, else plain decoding
        costs = routes_table().costs(job, lambda: measure_proposers(names, load, loaded), keys, job=True,
                                     default=lambda: {f"{base}@{length}": 1.0 for length in _job_lengths()})
        chosen, predicted = choose_proposer(base, costs), routes_table().predicted_from(job)
    model = loaded.get(chosen) or load(chosen)
    model.proposer_name, model.proposer_costs, model.proposer_predicted = chosen, dict(costs), predicted
    return model


def measure_proposers(names: List[str], load: Loader, loaded: Optional[Dict[str, torch.nn.Module]] = None
                      ) -> Dict[str, float]:
    """Microseconds of a short and a long window of the timing clip (PROPOSER_JOB_LENGTHS) decoded,
    lossless, by each of ``names`` ("name@seconds" -> us; alternating after a warm-up:
    ``routes.fastest_of``); ``loaded`` receives the models."""
    loaded = {} if loaded is None else loaded
    began = time.perf_counter()
    lengths = _job_lengths()
    announce(f"timing {', '.join(names)} on this machine, once: the timing clip's first "
             f"{' and '.join(lengths)} s decoded by each")
    for name in names:
        loaded[name] = load(name)
    mels = {length: timing_clip.window_mel(loaded[names[0]].dims.n_mels, float(length)) for length in lengths}
    timed: Dict[str, Dict[str, float]] = {name: {} for name in names}

    def run(name: str) -> float:
        times = {length: window_seconds(loaded[name], mel) * 1e6 for length, mel in mels.items()}
        timed[name] = {length: min(us, timed[name].get(length, us)) for length, us in times.items()}
        return sum(times.values())
    fastest_of({name: functools.partial(run, name) for name in names})
    costs = {f"{name}@{length}": us for name, times in timed.items() for length, us in times.items()}
    announce(f"{describe_proposers(costs)} -> {choose_proposer(names[0], costs)} (timed in "
             f"{time.perf_counter() - began:.0f} s; `medusa-whisper tune` times it again)")
    return costs


def _job_lengths() -> List[str]:
    """The proposer job's window lengths, in seconds as its costs name them ("4.6", "23.1")."""
    return [f"{round(timing_clip.seconds() * fraction, 1):g}" for fraction in PROPOSER_JOB_LENGTHS]


def describe_proposers(costs: Dict[str, float]) -> str:
    """The proposer job's costs in a line: "tiny.en 1.18 + 2.87 s, tiny.en-ctc 1.23 + 2.61 s"."""
    def shortest_first(times: Dict[str, float]) -> List[float]:  # the routes file keeps its keys sorted as text
        return [us for _, us in sorted(times.items(), key=lambda item: float(item[0] or 0))]
    return ", ".join(f"{name} {' + '.join(f'{us / 1e6:.2f}' for us in shortest_first(times))} s"
                     for name, times in costs_by_proposer(costs).items())


ROUTES_JOB_TOKENS = 48  # a token's cost is what the routes change: half the window's text tells it
ROUTES_JOB_PREFIX = "float32 routes job "  # how the choice's name begins in the routes table


def routes_job_name(dims) -> str:
    return f"{ROUTES_JOB_PREFIX}{dims.n_text_layer}x{dims.n_text_state} vocab {dims.n_vocab}"


def float32_routes(model: torch.nn.Module) -> bool:
    """Whether a float32 model's one-row passes (plain decoding) keep the routes measured per product
    (``step/routes.py``) or take whisper's own ``x @ W.T`` for every product: the timing clip's
    window decoded both ways (its encoder output computed once, ROUTES_JOB_TOKENS tokens), timed
    once per machine and decoder shape; the measured routes are kept only where they are TIE
    faster. On the AVX2 EPYC of family 23 the routes timed product by product made the decoder
    1.00x ``whisper.decode``'s, whisper's own 1.12x: a product timed alone is not the product in a
    pass. Sets the choice for this process."""
    if (next(model.parameters()).device.type != "cpu" or compute_type_of(model) != "float32"
            or os.environ.get(ROUTES_ENV, "measure") == "whisper"):
        return False
    shapes = {tuple(m.weight.shape) for m in model.modules() if isinstance(m, torch.nn.Linear)}
    shapes.add(tuple(model.decoder.token_embedding.weight.shape))
    # predicted until timed here (``tune``): a recorded kind's job, else whisper's own products
    costs = routes_table().costs(routes_job_name(model.dims), lambda: _time_routes(model, shapes), job=True,
                                 default=lambda: {"measured": 1.0, "whisper": 1.0})
    measured = choose_routes(costs) == "measured"
    whispers_route_for(shapes, not measured)
    return measured


def choose_routes(costs: Dict[str, float]) -> str:
    """From the float32 routes job's costs ("measured", "whisper" -> time): "measured" only where it is
    TIE faster, else whisper's own product."""
    return "measured" if costs["measured"] * TIE < costs["whisper"] else "whisper"


def _time_routes(model: torch.nn.Module, shapes) -> Dict[str, float]:
    from .decoding.window import decode
    from .options import MedusaDecodingOptions

    began = time.perf_counter()
    announce("timing the float32 decoder's products, as measured one by one and as whisper's, on the "
             "timing clip's window, once for this machine")
    with torch.inference_mode():
        features = model.encoder(timing_clip.window_mel(model.dims.n_mels)[None])[0]
    options = MedusaDecodingOptions(language="en", fp16=False, mode="off", sample_len=ROUTES_JOB_TOKENS)

    def timer(whispers: bool):
        def run() -> float:
            whispers_route_for(shapes, whispers)
            start = time.perf_counter()
            decode(model, features, options)
            return (time.perf_counter() - start) * 1e6
        return run
    costs = fastest_of({"measured": timer(False), "whisper": timer(True)})
    verdict = choose_routes(costs)
    announce(f"float32 decoder timed in {time.perf_counter() - began:.0f} s: measured routes "
             f"{costs['measured'] / 1e6:.2f} s, whisper's {costs['whisper'] / 1e6:.2f} s a window -> {verdict}")
    return costs


def _bfloat16_shortlisted(loaded: Dict[str, torch.nn.Module]) -> bool:
    """Whether bfloat16's products are near enough float32's here to time it (the int8 encoder's
    product timings, made when the int8 model was loaded; timed now if it was not)."""
    model = loaded.get("int8") or loaded.get("float32")
    if model is None:
        return True
    from .step.compute import int8_encoder_costs

    return "bfloat16" in encoder_form.shortlisted(int8_encoder_costs(model.dims))


def tune(model_name: str, device: torch.device, load: Loader, kernels: bool = False) -> Tuple[torch.nn.Module, List[str]]:
    """Time this machine's job choices for ``model_name`` again (all kernel choices too with
    ``kernels``); the fastest model and the lines that say what was measured and chosen."""
    from .decoding.batches import BATCH_JOB_PREFIX, default_batch_size, measured_batch_sizes

    table = routes_table()
    if kernels:
        table.forget("")
    for prefix in (encoder_form.PREFIX, job_name(model_name), BATCH_JOB_PREFIX, ROUTES_JOB_PREFIX,
                   PROPOSER_JOB_PREFIX):
        table.forget(prefix)
    table.timing = "all" if kernels else "jobs"  # timed here, not replayed from a recorded kind
    try:
        model = fastest(model_name, device, load)
        if compute_type_of(model) == "int8":
            default_batch_size(model)
    finally:
        table.timing = ""
    lines = [table.describe()[0]]
    lines += describe(model_name, table.choices)
    lines += measured_batch_sizes()
    lines.append(f"kept in {table.path}")
    return model, lines


def describe(model_name: str, choices: Dict[str, dict]) -> List[str]:
    """What the job timings chose for ``model_name``, one line each."""
    lines = []
    base = auto_base(model_name)
    for name, entry in sorted(choices.items()):
        costs = entry.get("us", {})
        if name.startswith(encoder_form.PREFIX):
            whole = {k[len("encoder "):]: v for k, v in costs.items() if k.startswith("encoder ")}
            left = [form for form in encoder_form.FORMS if f"product {form}" in costs and form not in whole]
            timed = ", ".join(f"{form} {us / 1e6:.2f} s" for form, us in whole.items())
            skipped = f" ({', '.join(left)} not timed whole: its product was over {encoder_form.SHORTLIST}x the fastest)" \
                if left else ""
            lines.append(f"  {name}: {timed} a window{skipped} -> {encoder_form.choose(costs)}")
        elif name.startswith(ROUTES_JOB_PREFIX):
            lines.append(f"  {name}: measured routes {costs['measured'] / 1e6:.2f} s, whisper's "
                         f"{costs['whisper'] / 1e6:.2f} s ({ROUTES_JOB_TOKENS} tokens) -> {choose_routes(costs)}")
        elif base is not None and name.startswith(f"{PROPOSER_JOB_PREFIX}{base} "):
            lines.append(f"  {name}: {describe_proposers(costs)} (windows of the timing clip) -> "
                         f"{choose_proposer(base, costs)}")
        elif name == job_name(model_name):
            timed = ", ".join(f"{t} {us / 1e6:.2f} s" for t, us in costs.items())
            lines.append(f"  compute type for {model_name} (auto): {timed} a {timing_clip.seconds():.0f}-s window "
                         f"-> {choose(costs)}")
    return lines
