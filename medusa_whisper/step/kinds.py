"""The CPU kinds this package has been measured on, shipped with it, and the one nearest the running CPU.

Each kind is one file under ``medusa_whisper/kinds/`` (``python -m tools.bench kind-profile`` writes
it on a machine of that kind): its CPU (vendor, family, model, the ISA features kernels dispatch on),
the choices the package timed there, under the names the route table gives them (``choices``), and
the real jobs' times that the tests replay (``jobs``, ``fastest``, ``calibration``).

A choice that costs a job's timing (seconds to minutes: the compute type, the proposer, the int8
encoder's form, the batch width, the float32 routes) is not timed on a user's first run: it is
predicted from the recorded kinds, the nearest holding that choice first (``recorded``), and
``medusa-whisper tune`` times it on the running machine. ``MEDUSA_WHISPER_KIND=<kind>`` pins the
whole table to one kind's choices (``step/routes.py``): nothing is timed, as the test suite runs.
This module reads ``/proc/cpuinfo`` and the kind files and nothing of the package.
"""

from __future__ import annotations

import functools
import json
import platform
from pathlib import Path
from typing import Callable, Dict, List, Optional, Tuple

KINDS_DIR = Path(__file__).resolve().parent.parent / "kinds"
PIN_ENV = "MEDUSA_WHISPER_KIND"

# instruction sets that decide which kernels are fast (or exact: see int8_kernels.activation_range)
ISA = ("avx2", "avx512f", "avx512_vnni", "avx_vnni", "avx512_bf16", "amx_bf16", "amx_int8")


@functools.lru_cache(maxsize=1)
def cpuinfo() -> Dict[str, str]:
    """The first processor's fields of /proc/cpuinfo ({} where there is none)."""
    fields: Dict[str, str] = {}
    try:
        for line in Path("/proc/cpuinfo").read_text(errors="replace").splitlines():
            if not line.strip():
                if fields:
                    break
                continue
            name, _, value = line.partition(":")
            fields.setdefault(name.strip(), value.strip())
    except OSError:
        pass
    return fields


def flags() -> str:
    return cpuinfo().get("flags", "")


def isa_features() -> str:
    """The ISA features of ``ISA`` this CPU has, e.g. "avx2 avx512f avx512_vnni"."""
    have = flags().split()
    return " ".join(f for f in ISA if f in have) or "none of " + ", ".join(ISA)


def this_cpu() -> Dict[str, object]:
    """The running CPU as a kind file describes one."""
    info = cpuinfo()

    def number(field: str) -> Optional[int]:
        return int(info[field]) if info.get(field, "").isdigit() else None
    return {"vendor": info.get("vendor_id", platform.machine()), "family": number("cpu family"),
            "model": number("model"), "model_name": info.get("model name", platform.processor()),
            "isa": isa_features()}


@functools.lru_cache(maxsize=None)
def _profiles(folder: str) -> Dict[str, dict]:
    found = {}
    for path in sorted(Path(folder).glob("*.json")):
        try:
            profile = json.loads(path.read_text(encoding="utf-8"))
            found[profile["kind"]] = profile
        except (OSError, ValueError, KeyError, TypeError):
            continue  # a damaged kind file only loses its predictions
    return found


def profiles() -> Dict[str, dict]:
    """Every recorded kind's file by its name."""
    return _profiles(str(KINDS_DIR))


def profile(kind: str) -> dict:
    """One kind's file; ValueError naming the known kinds where there is no such kind."""
    found = profiles().get(kind)
    if found is None:
        raise ValueError(f"{PIN_ENV}={kind}: no such recorded CPU kind (known: {', '.join(sorted(profiles()))})")
    return found


def nearness(cpu: Dict[str, object], other: Dict[str, object]) -> Tuple:
    """How alike two CPUs are for the kernels that run on them, larger is nearer: the same ISA
    features first (they decide which kernels exist), then the vendor, family and model, then the
    features they share."""
    mine, theirs = set(str(cpu.get("isa", "")).split()), set(str(other.get("isa", "")).split())
    shared = len(mine & theirs) / max(1, len(mine | theirs))
    same = [cpu.get(key) is not None and cpu.get(key) == other.get(key) for key in ("vendor", "family", "model")]
    return (mine == theirs, *same, shared)


def ranked(cpu: Optional[Dict[str, object]] = None) -> List[str]:
    """The recorded kinds, nearest ``cpu`` (the running one) first; ties by name."""
    cpu = this_cpu() if cpu is None else cpu
    named = profiles()
    return sorted(named, key=lambda kind: (tuple(-float(x) for x in nearness(cpu, named[kind]["cpu"])), kind))


def recorded(name: str, first: Optional[str] = None,
             fits: Callable[[dict], bool] = lambda entry: True) -> Optional[Tuple[str, dict]]:
    """(kind, entry) of the choice ``name`` from the kind ``first`` where it holds one that ``fits``,
    else from the recorded kinds nearest ``first`` (or the running CPU) that do; None where none does."""
    named = profiles()
    order = ranked(named[first]["cpu"] if first in named else None)
    if first in named:
        order = [first] + [kind for kind in order if kind != first]
    for kind in order:
        entry = named[kind].get("choices", {}).get(name)
        if entry is not None and fits(entry):
            return kind, entry
    return None
