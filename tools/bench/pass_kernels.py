"""Operators per drafting pass, by part of the pass: what a captured GPU pass replays, counted on the CPU.

    python -m tools.bench pass-kernels --model base --audio tests/data/real/jfk.flac

On the H100 a captured pass costs about 4 us per kernel whatever the kernel does (docs/gpu.md:
226 kernels and 0.95 ms for a plain pass, 493 and 1.87 ms for the CTC head's), so the kernels a
proposer adds to the pass are what it must pay for with its accepted tokens. This tool decodes one
window with each in-pass proposer on the CPU (``MEDUSA_WHISPER_STEP=fixed``: the same program a CUDA
graph captures, run uncaptured) under the profiler, and counts the ATen operators that would launch
a kernel (leaves of the call tree that are not views or allocations), per pass, split by part:

- ``step``: the decoder and the vocabulary projection (``FixedStep``); on the CPU the step's products
  differ from CUDA's (the CPU multiplies some rows one at a time), so compare this column across
  proposers on one machine, not with a GPU's count;
- ``rules``: whisper's logit filters on the device (``DeviceRules``);
- ``draft``: the proposer's part (its candidates or tree, and its ``advance`` after the acceptance);
- ``window``: once per window (the proposer's ``begin``, e.g. the CTC head's pass), per pass;
- ``loop``: the rest: the acceptance, the history, the output copy, and the uncaptured prompt pass.

The CTC head chooses its chunk per pass from what passes over more rows cost; here it is given the
H100's captured costs (``H100_PASS_MS``), not this CPU's timings, so that it chooses what it chose
there and the count is the same from run to run.
"""

from __future__ import annotations

import argparse
import contextlib
import functools
import json
from pathlib import Path
from typing import Dict, Iterator, List, Optional

import torch
import whisper

import medusa_whisper
from medusa_whisper.decoding import loop
from medusa_whisper.decoding.rules import DeviceRules
from medusa_whisper.drafting.device.ctc import DeviceCtc
from medusa_whisper.drafting.device.eagle import DeviceEagle
from medusa_whisper.drafting.device.medusa import DeviceMedusa
from medusa_whisper.drafting.device.union import DeviceUnion
from medusa_whisper.step.fixed import FixedStep
from tools import ROOT
from tools.bench.gpu import step

# (label, model suffix, decoding options): the rows of tools/bench/gpu.py's PROFILED
PROPOSERS = (("--mode off", "", dict(mode="off")),
             ("medusa", "-medusa", {}),
             ("ctc", "-ctc", {}),
             ("eagle chain of 2", "-eagle", dict(draft_tokens=2)),
             ("eagle tree 3 x 8", "-eagle", dict(tree_width=3, tree_nodes=8)),
             ("ctc+eagle", "-ctc+eagle", dict(draft_tokens=2)))

# operators that launch no kernel: views, allocations, metadata
NO_KERNEL = {
    "aten::view", "aten::_unsafe_view", "aten::reshape", "aten::_reshape_alias", "aten::slice", "aten::select",
    "aten::expand", "aten::expand_as", "aten::as_strided", "aten::unsqueeze", "aten::squeeze", "aten::t",
    "aten::transpose", "aten::permute", "aten::detach", "aten::alias", "aten::lift_fresh", "aten::empty",
    "aten::empty_strided", "aten::empty_like", "aten::resize_", "aten::result_type", "aten::split",
    "aten::unbind", "aten::chunk", "aten::narrow", "aten::view_as", "aten::diagonal", "aten::unfold",
    "aten::set_", "aten::contiguous", "aten::numpy_T", "aten::_local_scalar_dense", "aten::item",
    "aten::is_nonzero", "aten::split_with_sizes", "aten::flatten", "aten::to", "aten::resolve_conj",
    "aten::resolve_neg", "aten::real",
}
# operators whose work is on the host whatever the device (a Python number made a tensor)
HOST_ONLY = {"aten::scalar_tensor"}
PARTS = ("step", "rules", "draft", "window", "loop")
# ms of one captured pass over n rows on the H100 (docs/gpu.md, 2026-11-27)
H100_PASS_MS = {1: 0.546, 2: 0.613, 4: 0.621, 8: 0.629, 16: 0.630, 32: 0.650}


def h100_row_costs(self, rows) -> tuple:
    """``WindowDecoder.row_costs`` as the H100 measured them (relative to rows[0])."""
    return tuple(round(H100_PASS_MS[n] / H100_PASS_MS[rows[0]], 3) for n in rows)


@contextlib.contextmanager
def _replaced(owner: type, name: str, value) -> Iterator[None]:
    """``owner.name`` is ``value`` while the block runs."""
    original = owner.__dict__[name]
    setattr(owner, name, value)
    try:
        yield
    finally:
        setattr(owner, name, original)


def scoped(owner: type, method: str, label: str):
    """``owner.method`` runs inside ``record_function(label)`` while the block runs."""
    original = owner.__dict__[method]

    @functools.wraps(original)
    def wrapper(*args, **kwargs):
        with torch.profiler.record_function(label):
            return original(*args, **kwargs)
    return _replaced(owner, method, wrapper)


@contextlib.contextmanager
def labelled() -> Iterator[None]:
    with contextlib.ExitStack() as stack:
        stack.enter_context(scoped(FixedStep, "__call__", "part:step"))
        stack.enter_context(scoped(FixedStep, "logits", "part:step"))
        stack.enter_context(scoped(DeviceRules, "apply", "part:rules"))
        stack.enter_context(_replaced(loop.WindowDecoder, "row_costs", h100_row_costs))
        for proposer in (DeviceMedusa, DeviceEagle, DeviceCtc, DeviceUnion):
            for method in ("candidates", "layout", "advance"):
                if method in proposer.__dict__:
                    stack.enter_context(scoped(proposer, method, "part:draft"))
            if "begin" in proposer.__dict__:
                stack.enter_context(scoped(proposer, "begin", "part:window"))
        yield


def _is_work(name: str) -> bool:
    """An ATen operator that may do work on the device (not a view, allocation or host scalar)."""
    return name.startswith("aten::") and name not in NO_KERNEL and name not in HOST_ONLY


def launches(event) -> bool:
    """Whether ``event`` stands for one kernel: an operator that does work and calls no operator that
    does (its own allocations and views aside). ``kernels_by_part`` leaves out those under a
    host-only operator."""
    return _is_work(event.name) and not any(_does_work(child) for child in event.cpu_children)


def _does_work(event) -> bool:
    return _is_work(event.name) or any(_does_work(child) for child in event.cpu_children)


def kernels_by_part(events) -> Dict[str, int]:
    """Operators that launch a kernel, by the outermost ``part:`` scope above them."""
    counts = dict.fromkeys(PARTS, 0)
    for event in events:
        if not launches(event):
            continue
        part, parent, on_host = "loop", event.cpu_parent, False
        while parent is not None:
            if parent.name.startswith("part:"):
                part = parent.name[len("part:"):]  # keep walking: the outermost scope wins
            on_host |= parent.name in HOST_ONLY
            parent = parent.cpu_parent
        if not on_host:
            counts[part] += 1
    return counts


def count(model_name: str, audio: Path, labels: Optional[List[str]] = None) -> Dict[str, dict]:
    audio_array = whisper.load_audio(str(audio))
    out = {}
    for label, suffix, options in PROPOSERS:
        if labels and label not in labels:
            continue
        model = medusa_whisper.load_model(model_name + suffix, device="cpu", compute_type="float32")
        mel = whisper.log_mel_spectrogram(whisper.pad_or_trim(torch.from_numpy(audio_array)), model.dims.n_mels)
        with torch.no_grad():
            features = model.embed_audio(mel[None])[0]
        with step("fixed"), labelled():
            medusa_whisper.decode(model, features, language="en", **options)  # every program built once
            with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]) as prof:
                result = medusa_whisper.decode(model, features, language="en", **options)
        passes = max(result.decoder_steps, 1)
        counts = kernels_by_part(prof.events())
        out[label] = dict(passes=passes, tokens_per_pass=round(result.tokens_produced / passes, 3),
                          total=round(sum(counts.values()) / passes, 1),
                          **{part: round(n / passes, 1) for part, n in counts.items()})
        print(label, out[label], flush=True)
    return out


def markdown(report: Dict[str, dict]) -> str:
    lines = ["| proposer | passes | tokens per pass | kernels per pass | " + " | ".join(PARTS) + " |",
             "|---|---|---|---|" + "---|" * len(PARTS)]
    for label, r in report.items():
        lines.append(f"| {label} | {r['passes']} | {r['tokens_per_pass']:.2f} | {r['total']:.0f} | "
                     + " | ".join(f"{r[p]:.0f}" for p in PARTS) + " |")
    return "\n".join(lines) + "\n"


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="base")
    parser.add_argument("--audio", type=Path, default=ROOT / "tests" / "data" / "real" / "jfk.flac")
    parser.add_argument("--only", default="", help="comma-separated labels of PROPOSERS")
    parser.add_argument("--json", type=Path, default=None)
    args = parser.parse_args(argv)
    report = count(args.model, args.audio, [s for s in args.only.split(",") if s])
    print(markdown(report))
    if args.json is not None:
        args.json.write_text(json.dumps(report, indent=2) + "\n", encoding="utf-8")
    return 0
