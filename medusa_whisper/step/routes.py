"""Which way to multiply a decoder step's few rows by a float weight, chosen by timing both here.

A decoder pass multiplies 1 row (plain decoding) or a few (verification) by every weight of the
model, and those weights come from memory, not from the cache. Two routes give the same products
in a different order of summation:

- ``"x@W.T"``: whisper's ``F.linear(x, W, b)``, or for a projection ``x @ W.T`` against a
  contiguous transposed copy (``projection.FloatProjection``);
- ``"W@x.T"``: ``(b + W @ x.T).T`` with one row duplicated into two (``weight_times_rows``).

Which one is faster depends on the CPU and on the BLAS build: on one 2-core AMD EPYC, ``W @ x.T``
made a base pass 1.6x faster; on a 2-core Intel Xeon with AMX the same route made the vocabulary
product 2.7x slower. So nothing here says which is faster: the first time a weight shape is
multiplied, both routes are timed for 1, 2, 4, 8 and 16 rows on weights of that shape streamed
from memory, as in a pass, and the faster for each row count is kept, in memory and on disk
(``cache_dir()/routes/<machine>.json``, a few kB), keyed by the CPU model and flags, the torch
version and the thread count. A second process on the same machine measures nothing.

``MEDUSA_WHISPER_ROUTES=whisper`` skips the measuring and always takes whisper's route (e.g. for
a reproducible comparison with ``whisper.decode``).

The same table keeps every other choice timed on this machine (kernels, costs, jobs: ``RouteTable``).
A job's choice is predicted from the recorded CPU kinds until ``medusa-whisper tune`` times it here,
and ``MEDUSA_WHISPER_KIND=<kind>`` replays one recorded kind's choices without timing anything
(``step/kinds.py``).
"""

from __future__ import annotations

import functools
import hashlib
import json
import logging
import os
import platform
import re
import sys
import threading
import time
from pathlib import Path
from typing import Callable, Dict, Iterable, List, Optional, Tuple

import torch
import torch.nn.functional as F
from torch import Tensor

from ..paths import atomic_path, cache_dir
from . import kinds
from .kinds import isa_features  # noqa: F401 (the benches name the CPU with it)

log = logging.getLogger(__name__)

ROUTES_ENV = "MEDUSA_WHISPER_ROUTES"
WHISPER_ROUTE, WEIGHT_FIRST = "x@W.T", "W@x.T"
ROUTES = (WHISPER_ROUTE, WEIGHT_FIRST)
# rows up to which a choice is measured; more rows are a prompt or a long tree: whisper's route
MAX_MEASURED_ROWS = 16  # == ROW_COUNTS[-1]
REPEATS = 3
# each route is timed ROUNDS times, alternating with the other, and its fastest round counts: a burst
# of load elsewhere then cannot make a route look slow for good. Timed one after the other, with the
# median, a pass through the tests on the other core made x @ W.T look faster for base's projection
# at 1 and 4 rows on an AVX-512 EPYC, where idle it is 1.3x and 3.1x slower, and the cache kept that
ROUNDS = 3
# A product over fewer rows cannot honestly take several times as long as one over more rows by the
# same route (at most about 2x: one row may run on one core where two rows run on both). When a
# measured shape shows more than this, the machine was busy during part of it: the shape is timed
# again at once, and if it still looks so, the choice is kept but marked, and the next process that
# needs it times it again, up to MAX_ATTEMPTS timings in all (a cache filled while CI ran on the
# other core once kept 8 ms for a 1536 x 384 product at 4 rows beside 0.6 ms at 8 rows).
IMPLAUSIBLE = 3.0
MAX_ATTEMPTS = 4
# Kernel choices and measured costs (choose_kernel, costs) have no such shape to check, so every
# timing also counts how often this process's threads were made to give up their CPU to another
# (involuntary context switches, ``Preemptions``). Measured on a 2-core AVX-512 EPYC over timings
# of 0.1-0.5 s: 0-5 times (0-41 a second) idle, 70-120 times (136-280 a second) with two other jobs
# running. At least this many, and this many a second, and the choice is kept but marked and timed
# again, as above.
BUSY_PREEMPTIONS = 20
BUSY_RATE = 50.0

Shape = Tuple[str, int, int, str]  # (kind, n_out, n_in, dtype)
# row counts whose routes are timed; a count between two takes the route of the lower one
ROW_COUNTS = (1, 2, 4, 8, 16)


def weight_times_rows(weight: Tensor, bias: Optional[Tensor], rows: Tensor) -> Tensor:
    """``rows @ weight.T + bias`` computed as ``(bias + weight @ rows.T).T``, one row as two.

    x @ W.T with one row is a matrix-vector product, which some BLAS builds run on one core; W @ x.T
    with two or more rows is a matrix product that they split over every core. Whether that pays is
    what ``choose`` measures.

    rows : shape = (n, n_in) -> (n, n_out)
    """
    n = rows.shape[0]
    if n == 1:
        rows = rows.expand(2, -1).contiguous()
    out = weight @ rows.T if bias is None else torch.addmm(bias[:, None], weight, rows.T)
    return out[:, :n].T.contiguous()


def machine_id() -> Dict[str, object]:
    """What a measured choice depends on: the CPU, the instructions its kernels may use, torch and
    the thread count."""
    model, flags = _cpu()
    ident = {"cpu": model, "flags": flags, "torch": torch.__version__, "threads": torch.get_num_threads()}
    capped = dispatch_caps()
    return {**ident, "dispatch": capped} if capped else ident


# environment variables that cap the instructions the kernels dispatch to below what the CPU has;
# with them set, one CPU times the kernels another would run (an AVX2-only EPYC's on an AVX-512 one)
DISPATCH_ENV = ("ATEN_CPU_CAPABILITY", "ONEDNN_MAX_CPU_ISA", "DNNL_MAX_CPU_ISA", "MKL_ENABLE_INSTRUCTIONS")


def dispatch_caps() -> str:
    """The caps set in this process ("" when none): choices timed under them are kept apart."""
    return " ".join(f"{name}={os.environ[name]}" for name in DISPATCH_ENV if os.environ.get(name))


def _cpu() -> Tuple[str, str]:
    """The CPU's model name and a digest of its feature flags."""
    model = kinds.cpuinfo().get("model name") or platform.processor() or platform.machine()
    return model, hashlib.sha256(kinds.flags().encode()).hexdigest()[:12]


class RouteTable:
    """The choices of one machine, torch and thread count; read from and written to ``path``.

    A choice not measured on this machine is replayed from the recorded CPU kinds (``_replayed``:
    the pinned kind, else the kind nearest this CPU that holds it), so that a first run waits for no
    timing. Only where no recorded kind holds it is it timed here, once, and kept: a route or a
    kernel (a fraction of a second), or costs (``costs``). A job's choice (seconds to minutes:
    ``costs(..., job=True)``) is then its caller's ``default`` instead. ``medusa-whisper tune`` sets
    ``timing``: "jobs" times the jobs not measured here, "all" every choice. A pinned table times
    nothing: the kind's choice, a nearer kind's, or the default.

    The first product of a weight shape times both routes for every row count in ``ROW_COUNTS``
    at once (a fraction of a second per shape), so the streamed weights are made once and freed.
    """

    def __init__(self, path: Optional[Path], timer: Optional[Callable[[Shape, int, str], float]] = None,
                 pinned: Optional[str] = None):
        self.path = None if pinned else path
        self.timer = timer or time_route
        # a recorded kind (step/kinds.py) whose choices this table replays: nothing is timed or written
        self.pinned = pinned
        if pinned:
            kinds.profile(pinned)  # an unknown kind is an error now, not a silent default later
        self.timing = ""  # tune: "jobs" or "all", what is timed where it is not measured here
        self.choices: Dict[str, dict] = {}
        self.measured = 0  # shapes this process timed (the rest came from the file)
        self._known: Dict[Tuple[Shape, int], str] = {}
        self._retried: set = set()
        # reentrant: a measurement may need another choice first (a pass timed for the batch size
        # meets the many-rows kernel of its prompt, measured on first use)
        self._lock = threading.RLock()
        if self.path is not None and self.path.exists():
            try:
                self.choices = dict(json.loads(self.path.read_text(encoding="utf-8"))["choices"])
            except (OSError, ValueError, KeyError, TypeError):
                log.warning("%s: unreadable kernel-route cache; measuring again", self.path)

    def choose(self, shape: Shape, rows: int) -> str:
        """The route for ``rows`` rows (1..MAX_MEASURED_ROWS): that of the largest measured count <= rows."""
        known = self._known.get((shape, rows))
        if known is not None:
            return known
        name = _name(shape, max(n for n in ROW_COUNTS if n <= rows))
        entry = self._kept(name, lambda found: found.get("route") in ROUTES)
        if entry is None and self.timing != "all" and not self._measured_here(name):
            entry = self._replayed(name, (lambda: {"route": WHISPER_ROUTE}) if self.pinned else None,
                                   lambda found: found.get("route") in ROUTES)
        if entry is None:
            with self._lock:
                self._retried.add(shape)  # a suspect choice is timed again once per process
                with _own_random_state():
                    self._measure(shape)
            entry = self.choices[name]
        self._known[(shape, rows)] = entry["route"]
        return entry["route"]

    def choose_kernel(self, name: str, candidates: Dict[str, Callable[[], float]]) -> str:
        """The fastest of ``candidates`` (name -> a function that times that kernel, in microseconds) for
        the operation called ``name``, timed once per machine like the routes. For choices that must
        hold for every row count (an int8 kernel decides a row's bits, and lossless decoding needs a
        row to get the same bits in any pass). Timed again by a later process when the machine
        looked busy (``Preemptions``), and when the candidates are not those timed (a kernel added
        to the choice, or one that does not run here). A recorded kind's choice is replayed where it
        is one of ``candidates`` and the kind timed every one of them (one recorded before a kernel
        was added says nothing of it); a pinned table with none takes the first. A timer makes its random
        inputs when it is called, not before: called here, it draws from the measurement's own
        random state (``_own_random_state``)."""
        entry = self._kept(name, lambda found: set(found.get("us", ())) == set(candidates))
        if entry is None and self.timing != "all" and not self._measured_here(name):
            entry = self._replayed(name, (lambda: {"route": next(iter(candidates))}) if self.pinned else None,
                                   lambda found: found.get("route") in candidates
                                   and set(candidates) <= set(found.get("us") or candidates))
        if entry is None:
            entry = self._timed(name, lambda: {kernel: timer() for kernel, timer in candidates.items()})
        return entry["route"]

    def costs(self, name: str, measure: Callable[[], Dict[str, float]],
              alternatives: Optional[Iterable[str]] = None, *, job: bool = False,
              default: Optional[Callable[[], Dict[str, float]]] = None) -> Dict[str, float]:
        """Costs of the alternatives called ``name`` (alternative -> microseconds), by ``measure()``
        once per machine and kept with the routes, for choices whose rule is the caller's (e.g. the
        batch size, ``batches.default_batch_size``). Timed again by a later process when the machine
        looked busy (``Preemptions``), and, where the caller says which ``alternatives`` it
        measures, when those kept are others (as ``choose_kernel``'s candidates). Until then a
        recorded kind's costs are replayed; where none holds them, a ``job`` (whose timing takes
        seconds) and a pinned table take ``default()``, the costs that make the caller's rule take
        its safe choice."""
        wanted = None if alternatives is None else set(alternatives)

        def fits(found: dict) -> bool:
            return bool(found.get("us")) and (wanted is None or set(found["us"]) == wanted)
        timed_here = self.timing == "all" or (job and self.timing == "jobs")
        entry = self._kept(name, fits, timed_here)
        if entry is None and not timed_here and not (self._measured_here(name) and fits(self.choices[name])):
            entry = self._replayed(name, (lambda: {"us": default()}) if default and (job or self.pinned) else None,
                                   fits)
        if entry is None:
            if self.pinned:
                log.warning("the pinned kind %s holds no %r and it has no default: timed", self.pinned, name)
            entry = self._timed(name, measure)
        return dict(entry["us"])

    def predicted_from(self, name: str) -> Optional[str]:
        """Where this process's choice ``name`` came from when it was not measured here: a recorded
        kind's name, or "default"; None where it was measured here (or is not held)."""
        return self.choices.get(name, {}).get("predicted")

    def _measured_here(self, name: str) -> bool:
        """Whether this machine holds a timing of ``name`` (then due again, it is timed, not replayed)."""
        entry = self.choices.get(name)
        return entry is not None and not entry.get("predicted") and not self.pinned

    def _kept(self, name: str, fits: Callable[[dict], bool], timed_here: Optional[bool] = None) -> Optional[dict]:
        """The choice ``name`` as this table holds it, where it ``fits`` the caller's alternatives and
        is not due another timing: measured here (and not while the machine looked busy, below), or
        predicted in this process unless it is to be ``timed_here`` (a route's or kernel's: with
        every choice)."""
        entry = self.choices.get(name)
        if entry is None or not fits(entry):
            return None
        if entry.get("predicted"):
            return None if (self.timing == "all" if timed_here is None else timed_here) else entry
        return None if self._timed_again(name, entry) else entry

    def _replayed(self, name: str, default: Optional[Callable[[], dict]] = None,
                  fits: Callable[[dict], bool] = lambda entry: True) -> Optional[dict]:
        """The choice ``name`` as the pinned kind, or the recorded kind nearest this CPU, holds it
        (where it ``fits`` the caller's alternatives), else ``default()``; kept in memory only,
        marked ``predicted`` with where it came from. None where neither has it."""
        found = kinds.recorded(name, first=self.pinned, fits=fits)
        if found is not None:
            entry = {**found[1], "predicted": found[0]}
        elif default is not None:
            entry = {**default(), "predicted": "default"}
            entry.setdefault("route", min(entry.get("us") or {"": 0}, key=(entry.get("us") or {"": 0}).get))
        else:
            return None
        entry.pop("suspect", None)
        with self._lock:
            self.choices[name] = entry
        log.info("%s predicted from %s: %s", name, entry["predicted"], entry.get("route", entry.get("us")))
        return entry

    def forget(self, prefix: str) -> List[str]:
        """Drop the kept choices whose names start with ``prefix``, so that their next use times them
        again (``medusa-whisper tune``); the names dropped."""
        with self._lock:
            names = [name for name in self.choices if name.startswith(prefix)]
            for name in names:
                del self.choices[name]
            self._known = {key: route for key, route in self._known.items() if not _name(key[0]).startswith(prefix)}
            if names and self.path is not None and self.path.exists():
                try:
                    on_disk = json.loads(self.path.read_text(encoding="utf-8"))
                    on_disk["choices"] = {k: v for k, v in on_disk.get("choices", {}).items() if k not in names}
                    with atomic_path(self.path) as tmp:
                        tmp.write_text(json.dumps(on_disk, indent=1, sort_keys=True), encoding="utf-8")
                except (OSError, ValueError, TypeError) as error:
                    log.warning("could not drop choices from %s: %s", self.path, error)
        return names

    def _timed_again(self, name: str, entry: dict) -> bool:
        """Whether a kept choice was timed while the machine looked busy and is due another timing:
        once per process (a route's shape or a choice's name), up to MAX_ATTEMPTS timings in all."""
        shape = _shape_of(name)
        return (bool(entry.get("suspect")) and entry.get("attempts", 1) < MAX_ATTEMPTS
                and name not in self._retried and shape not in self._retried)

    def _timed(self, name: str, measure: Callable[[], Dict[str, float]]) -> dict:
        """Run ``measure`` (alternative -> microseconds) and keep its result as the choice ``name``."""
        with self._lock:
            self._retried.add(name)
            before = self.choices.get(name, {}).get("attempts", 0)
            with _own_random_state(), Preemptions() as preempted:
                micros = measure()
            entry = {"route": min(micros, key=micros.get), "us": {k: round(t, 1) for k, t in micros.items()},
                     "attempts": before + 1}
            if preempted.busy:
                entry["suspect"] = True
            self.choices[name] = entry
            self.measured += 1
            log.info("%s measured in %.1f s (%s): %s", name, preempted.seconds, preempted, entry["us"])
            self._save()
        return entry

    def describe(self) -> List[str]:
        """What this table holds, one line per choice, for a bench to print beside its results."""
        capped = f", capped by {dispatch_caps()}" if dispatch_caps() else ""
        lines = [f"{machine_id()['cpu']} ({isa_features()}{capped}), torch {torch.__version__}, "
                 f"{torch.get_num_threads()} threads; choices measured here ({self.path}):"]
        for name, entry in sorted(self.choices.items(), key=lambda item: _natural(item[0])):
            times = ", ".join(f"{k} {v:g} us" for k, v in sorted(entry.get("us", {}).items(),
                                                                    key=lambda kv: _order(kv[0])))
            flag = " (timed while the machine looked busy)" if entry.get("suspect") else ""
            if entry.get("predicted"):
                flag = f" (predicted from {entry['predicted']}, not timed here)"
            lines.append(f"  {name}: {entry.get('route')} [{times}]{flag}")
        return lines

    def _measure(self, shape: Shape) -> None:
        began = time.perf_counter()
        before = self.choices.get(_name(shape, ROW_COUNTS[0]), {}).get("attempts", 0)
        try:
            for attempt in range(2):  # once more at once when the first timing looks disturbed
                with Preemptions() as preempted:
                    measured = {rows: self._time_rows(shape, rows) for rows in ROW_COUNTS}
                suspect = preempted.busy or not plausible(measured)
                if not suspect:
                    break
        finally:
            _streamed.cache_clear()
        for rows, micros in measured.items():
            entry = {"route": min(ROUTES, key=micros.get), "us": {r: round(t, 1) for r, t in micros.items()},
                     "attempts": before + attempt + 1}
            if suspect:
                entry["suspect"] = True
            self.choices[_name(shape, rows)] = entry
        self.measured += 1
        log.info("kernel routes for %s measured in %.1f s%s", _name(shape), time.perf_counter() - began,
                 " (looked disturbed: timed again by the next process)" if suspect else "")
        self._save()

    def _time_rows(self, shape: Shape, rows: int) -> Dict[str, float]:
        """Microseconds of each route for ``rows`` rows: the fastest of ROUNDS alternating rounds."""
        rounds: Dict[str, List[float]] = {route: [] for route in ROUTES}
        for _ in range(ROUNDS):
            for route in ROUTES:
                rounds[route].append(self.timer(shape, rows, route))
        return {route: min(times) for route, times in rounds.items()}

    def _save(self) -> None:
        if self.path is None:
            return
        try:
            on_disk = json.loads(self.path.read_text(encoding="utf-8"))["choices"] if self.path.exists() else {}
        except (OSError, ValueError, KeyError, TypeError):
            on_disk = {}
        measured = {name: entry for name, entry in self.choices.items() if not entry.get("predicted")}
        merged = {**on_disk, **measured}  # another process may have added its own choices
        try:
            with atomic_path(self.path) as tmp:
                tmp.write_text(json.dumps({"machine": machine_id(), "choices": merged}, indent=1, sort_keys=True),
                               encoding="utf-8")
        except OSError as error:  # a read-only cache only costs the next process a measurement
            log.warning("could not save kernel routes to %s: %s", self.path, error)


def announce(line: str) -> None:
    """A line on stderr while the package times a job on this machine (a user waits for it, once per
    machine): what is timed, then what it chose and how long it took."""
    print(f"medusa-whisper: note: {line}", file=sys.stderr, flush=True)


def _own_random_state():
    """A measurement's random inputs come from a fork of torch's CPU random state: timing a kernel
    must not change what a seeded caller samples next (whisper's temperature fallback draws from
    that state; a route measured on first use in the middle of a run shifted every later sample)."""
    return torch.random.fork_rng(devices=[])


def _natural(name: str) -> list:
    """``name`` with its numbers as numbers, so that "rows=16" sorts after "rows=2"."""
    return [int(part) if part.isdigit() else part for part in re.split(r"(\d+)", name)]


def _order(key: str):
    """Numeric keys (batch sizes) in numeric order, route names after them."""
    return (0, int(key), "") if key.isdigit() else (1, 0, key)


class Preemptions:
    """Over a ``with`` block: how many times this process's threads were made to give up a CPU to
    another runnable thread (involuntary context switches), and whether that says the machine was
    busy (BUSY_PREEMPTIONS). Unlike CPU time over wall time it does not depend on how many threads
    a kernel keeps busy; unlike the load average it covers just the timing."""

    def __enter__(self) -> "Preemptions":
        self.count, self.seconds = 0, 0.0
        self._began, self._start = time.perf_counter(), _preemptions()
        return self

    def __exit__(self, *exc) -> None:
        self.seconds = time.perf_counter() - self._began
        self.count = _preemptions() - self._start

    @property
    def busy(self) -> bool:
        return self.count >= BUSY_PREEMPTIONS and self.count >= BUSY_RATE * self.seconds

    def __str__(self) -> str:
        return f"{self.count} preemptions" + (", busy" if self.busy else "")


def _preemptions() -> int:
    """Involuntary context switches of this process so far (0 where the OS does not count them)."""
    try:
        import resource
    except ImportError:  # not on Windows
        return 0
    return resource.getrusage(resource.RUSAGE_SELF).ru_nivcsw


def plausible(measured: Dict[int, Dict[str, float]]) -> bool:
    """Whether times per row count (rows -> route -> microseconds) look undisturbed: no route takes
    more than IMPLAUSIBLE times as long for fewer rows as for more."""
    counts = sorted(measured)
    return all(measured[fewer][route] <= IMPLAUSIBLE * measured[more][route]
               for i, fewer in enumerate(counts) for more in counts[i + 1:] for route in measured[fewer])


def _shape_of(name: str) -> Optional[Shape]:
    """The shape a route's name ("linear 384x384 float32 rows=2") names; None for other choices."""
    match = re.fullmatch(r"(linear|projection) (\d+)x(\d+) (\w+) rows=\d+", name)
    return None if match is None else (match[1], int(match[2]), int(match[3]), match[4])


def _name(shape: Shape, rows: Optional[int] = None) -> str:
    kind, n_out, n_in, dtype = shape
    return f"{kind} {n_out}x{n_in} {dtype}" + ("" if rows is None else f" rows={rows}")


def time_route(shape: Shape, rows: int, route: str) -> float:
    """Median microseconds of one product by ``route``, with weights of ``shape`` read from memory."""
    kind, n_out, n_in, dtype = shape
    # a projection on whisper's route multiplies a transposed contiguous copy (projection.FloatProjection)
    transposed = kind == "projection" and route == WHISPER_ROUTE
    weights = _streamed(n_out, n_in, getattr(torch, dtype), transposed)
    copies = len(weights)
    bias = torch.rand(n_out, dtype=weights[0].dtype) if kind == "linear" else None
    x = torch.rand(rows, n_in, dtype=weights[0].dtype)
    if route == WEIGHT_FIRST:
        run: Callable[[Tensor], Tensor] = lambda w: weight_times_rows(w, bias, x)  # noqa: E731
    elif kind == "linear":
        run = lambda w: F.linear(x, w, bias)  # noqa: E731
    else:
        run = lambda w_t: x @ w_t  # noqa: E731
    times: List[float] = []
    for _ in range(REPEATS + 1):
        began = time.perf_counter()
        for w in weights:
            run(w)
        times.append((time.perf_counter() - began) / copies)
    return sorted(times[1:])[REPEATS // 2] * 1e6


@functools.lru_cache(maxsize=1)
def streamed_bytes() -> int:
    """Bytes of weights a timing cycles through so that they come from memory, as a pass's do (a
    decoder's weights are larger than any CPU cache): twice the last-level cache, 32-256 MB."""
    try:
        text = Path("/sys/devices/system/cpu/cpu0/cache/index3/size").read_text().strip()
        size = int(text.rstrip("KMG")) << {"K": 10, "M": 20, "G": 30}.get(text[-1:], 0)
    except (OSError, ValueError):
        size = 32 << 20
    return min(max(2 * size, 32 << 20), 256 << 20)


@functools.lru_cache(maxsize=2)  # the two layouts of one shape, while its row counts are timed
def _streamed(n_out: int, n_in: int, dtype: torch.dtype, transposed: bool) -> List[Tensor]:
    """Distinct weights of one shape, about ``streamed_bytes()`` in all (at least one)."""
    copies = max(1, streamed_bytes() // (n_out * n_in * torch.finfo(dtype).bits // 8))
    size = (n_in, n_out) if transposed else (n_out, n_in)
    return [torch.rand(size, dtype=dtype).sub_(0.5) for _ in range(copies)]


_TABLES: Dict[Tuple, RouteTable] = {}


def table() -> RouteTable:
    """This process's table for the current machine, torch, thread count and cache folder."""
    ident = machine_id()
    folder = cache_dir()
    pinned = os.environ.get(kinds.PIN_ENV) or None
    key = (tuple(sorted(ident.items())), str(folder), pinned)
    found = _TABLES.get(key)
    if found is None:
        digest = hashlib.sha256(json.dumps(ident, sort_keys=True).encode()).hexdigest()[:16]
        found = _TABLES[key] = RouteTable(folder / "routes" / f"{digest}.json", pinned=pinned)
    return found


def median_micros(fn: Callable[[], object], repeats: int = REPEATS) -> float:
    """Median microseconds of ``fn()`` over ``repeats`` calls after one warm-up call."""
    fn()
    times = []
    for _ in range(repeats):
        began = time.perf_counter()
        fn()
        times.append(time.perf_counter() - began)
    return sorted(times)[repeats // 2] * 1e6


# A job decides (below): the alternatives timed whole, alternating, each after a warm-up; a round
# ends the timing early where its fastest is this much faster than every other alternative
DECISIVE = 1.15
JOB_ROUNDS = 2  # a job's window costs seconds: at most this many rounds


def fastest_of(runs: Dict[str, Callable[[], float]], rounds: int = JOB_ROUNDS) -> Dict[str, float]:
    """Each alternative's time (``runs[name]()`` returns it): one warm-up call each (kernels chosen,
    buffers made), then up to ``rounds`` alternating rounds, the fastest round of each kept; fewer
    rounds where one alternative is DECISIVE-ly ahead of all the others after a round."""
    for run in runs.values():
        run()
    best = {name: float("inf") for name in runs}
    for _ in range(rounds):
        for name, run in runs.items():
            best[name] = min(best[name], run())
        ranked = sorted(best.values())
        if len(ranked) == 1 or ranked[1] > DECISIVE * ranked[0]:
            break
    return best


# float32 weight shapes (n_out, n_in) whose job found the measured routes slower than whisper's own
# product for one-row passes (tuning.float32_routes): route_for takes whisper's route for one row of
# them. Passes of more rows (verification, batches) keep the measured routes: the job did not time
# them, and one by one they differ by 2-3x (W @ x.T for 4 rows of 512 x 2048: 278 against 843 us on
# the AVX2 EPYC of family 23), where one row differed by 1.2-1.4x
_JOB_SAYS_WHISPER: set = set()


def whispers_route_for(shapes: Iterable[Tuple[int, int]], whispers: bool) -> None:
    """Take whisper's route for one row of these weight shapes (``whispers``), or the measured one, as a
    job decided."""
    for shape in shapes:
        (_JOB_SAYS_WHISPER.add if whispers else _JOB_SAYS_WHISPER.discard)(tuple(shape))


def route_for(kind: str, weight: Tensor, rows: int) -> str:
    """The route for multiplying ``rows`` rows by ``weight`` (kind "linear" or "projection")."""
    if (weight.device.type != "cpu" or not 1 <= rows <= MAX_MEASURED_ROWS or weight.dtype != torch.float32
            or os.environ.get(ROUTES_ENV, "measure") == "whisper"
            or (rows == 1 and weight.shape in _JOB_SAYS_WHISPER)):  # torch.Size hashes as its tuple
        return WHISPER_ROUTE
    return table().choose((kind, weight.shape[0], weight.shape[1], "float32"), rows)
