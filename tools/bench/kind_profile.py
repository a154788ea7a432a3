"""A CPU kind's profile as data: what the package's choices need, measured on the running machine.

    python -m tools.bench kind-profile --kind epyc-avx2-family23 --jobs bench_out/kind_jobs.json

Writes ``medusa_whisper/kinds/<kind>.json`` (shipped with the package, see ``step/kinds.py``), keeping
what an earlier run wrote there beside what it measures afresh:

- ``cpu``: the identity (vendor, family, model, model name, the ISA features that decide kernels,
  cores, last-level cache); ``torch``, ``threads``, ``model``, ``commit``, ``measured``;
- ``calibration``: what the package's own job timings measured here, from a fresh cache (the
  timing clip's window at each compute type, the int8 encoder's forms, float32's routes, the batch
  width's job, the proposer ``<model>-auto`` takes), as ``tuning.tune`` times them, each with the
  choice it makes;
- ``jobs`` and ``fastest`` (from ``--jobs``, a JSON written from the benches run on the same machine):
  each candidate's time on the real jobs (seconds, or any unit shared within a decision) and which
  was fastest there; ``rows``: the issue's rows measured (free-form), ``ratios`` the numeric ones
  (target, before, after), which ``--plot`` draws.

``tests/test_kinds.py`` replays every file: the package's choice rules, given a kind's job times,
must choose what measured fastest there, and where the file holds the calibration's own timings,
those must choose it too.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import subprocess
import tempfile
from pathlib import Path
from typing import Dict, Tuple

import torch

from tools import ROOT

from medusa_whisper.step.kinds import KINDS_DIR as KINDS, PIN_ENV


def cpu_identity() -> Dict[str, object]:
    """What tells one CPU kind from another (``kinds.this_cpu``: vendor, family, model, name, the ISA
    features the kernels dispatch on), with the cores and the last-level cache."""
    from medusa_whisper.step.kinds import this_cpu

    try:
        l3 = Path("/sys/devices/system/cpu/cpu0/cache/index3/size").read_text().strip()
    except OSError:
        l3 = "unknown"
    return {**this_cpu(), "cores": os.cpu_count(), "l3": l3}


def calibration(model_name: str, also: Tuple[str, ...] = ()) -> Tuple[Dict[str, Dict[str, object]], Dict[str, dict]]:
    """The job choices timed afresh (a cache of this run's own, no kind pinned), by decision, and every
    choice the package timed meanwhile under its route-table name (the kind file's ``choices``)."""
    from medusa_whisper import load_model, tuning
    from medusa_whisper.decoding.batches import BATCH_JOB_PREFIX, choose_batch_size
    from medusa_whisper.step import encoder_form
    from medusa_whisper.step.compute import compute_type_of

    with tempfile.TemporaryDirectory() as cache:
        os.environ["MEDUSA_WHISPER_CACHE"] = cache
        os.environ.pop(PIN_ENV, None)
        device = torch.device("cpu")
        from medusa_whisper.step.routes import table
        # every choice timed here (kernels too), none replayed from another kind
        model, _ = tuning.tune(model_name, device, lambda t: load_model(model_name, device="cpu", compute_type=t),
                               kernels=True)
        table().timing = "all"
        if tuning.auto_base(model_name + tuning.AUTO_SUFFIX):  # the proposer -auto takes, at the type chosen
            load_model(model_name + tuning.AUTO_SUFFIX, device="cpu", compute_type=compute_type_of(model))
        for other in also:  # their float32 jobs (the routes, the proposer of -auto) for the kind's choices
            load_model(other + tuning.AUTO_SUFFIX if tuning.auto_base(other + tuning.AUTO_SUFFIX) else other,
                       device="cpu")
        choices = table().choices
        found = {}
        for name, entry in choices.items():
            costs = entry["us"]
            if name == encoder_form.name(model.dims):
                found["int8 encoder form"] = {"us": costs, "chosen": encoder_form.choose(costs)}
            elif name == tuning.job_name(model_name):
                found["compute type"] = {"us": costs, "chosen": tuning.choose(costs)}
            elif name == tuning.routes_job_name(model.dims):
                found["float32 routes"] = {"us": costs, "chosen": tuning.choose_routes(costs)}
            elif name.startswith(f"{tuning.PROPOSER_JOB_PREFIX}{model_name} "):
                found["proposer"] = {"us": costs, "chosen": tuning.choose_proposer(model_name, costs)}
            elif name.startswith(BATCH_JOB_PREFIX):
                found["batch width"] = {"us": costs, "chosen": choose_batch_size({int(k): v for k, v in costs.items()})}
    kept = {name: {key: value for key, value in entry.items() if key != "suspect"} for name, entry in choices.items()
            if not entry.get("predicted")}
    return found, dict(sorted(kept.items()))


def plot(profile: dict, out: Path) -> None:
    """The kind's ``ratios`` (row -> target, before, after) as bars beside their targets."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    rows = profile["ratios"]
    names = list(rows)
    fig, ax = plt.subplots(figsize=(9, 0.55 * len(names) + 1.2))
    y = range(len(names))
    ax.barh([i + 0.2 for i in y], [rows[n]["before"] for n in names], height=0.4, label="before", color="#bbbbbb")
    ax.barh([i - 0.2 for i in y], [rows[n]["after"] for n in names], height=0.4, label="after", color="#3b75af")
    ax.scatter([rows[n]["target"] for n in names], list(y), marker="|", s=400, color="#c0392b", label="target", zorder=3)
    ax.set_yticks(list(y), names)
    ax.invert_yaxis()
    ax.set_xlabel("ratio (higher is faster)")
    ax.set_title(f"{profile['kind']}: {profile['model']}, {profile['threads']} threads")
    ax.legend(loc="lower right")
    fig.tight_layout()
    fig.savefig(out, dpi=110)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--kind", required=True, help="the file's name, e.g. epyc-avx2-family23")
    parser.add_argument("--model", default="base")
    parser.add_argument("--also", nargs="*", default=["tiny.en"], metavar="MODEL",
                        help="models whose float32 jobs are timed too, for the kind's choices (the default "
                             "command's tiny.en-auto: its proposer and float32 routes)")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--jobs", type=Path, default=None,
                        help="JSON with 'jobs', 'fastest' and 'rows' from this machine's benches")
    parser.add_argument("--out", type=Path, default=None, help=f"default: {KINDS}/<kind>.json")
    parser.add_argument("--plot", type=Path, default=None, metavar="PNG",
                        help="only draw the kind's file's ratios (before, after, target) into PNG")
    args = parser.parse_args()
    if args.plot is not None:
        plot(json.loads((args.out or KINDS / f"{args.kind}.json").read_text(encoding="utf-8")), args.plot)
        print(f"wrote {args.plot}")
        return 0
    torch.set_num_threads(args.threads)
    commit = subprocess.run(["git", "-C", str(ROOT), "rev-parse", "--short", "HEAD"], capture_output=True,
                            text=True).stdout.strip()
    out = args.out or KINDS / f"{args.kind}.json"
    # a kind met before keeps what its benches recorded (jobs, parts, rows); the calibration is new
    profile = json.loads(out.read_text(encoding="utf-8")) if out.exists() else {}
    found, choices = calibration(args.model, tuple(args.also))
    profile.update({"kind": args.kind, "cpu": cpu_identity(), "torch": torch.__version__, "threads": args.threads,
                    "model": args.model, "commit": commit, "measured": datetime.date.today().isoformat(),
                    "calibration": found, "choices": choices,
                    "choices_what": f"the choices the package timed during the calibration (main {commit})"})
    if args.jobs is not None:
        profile.update(json.loads(args.jobs.read_text(encoding="utf-8")))
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(profile, indent=1) + "\n", encoding="utf-8")
    print(f"wrote {out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
