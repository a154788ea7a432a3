"""Learning curves of draft-head training runs: held-out tokens per pass against minutes trained,
hours of speech seen and hours of training speech (medusa_whisper.training.plots.plot_learning_curve).

Each run is a training work folder (``medusa-whisper train ... --work-dir DIR``) holding the
history.json and record.json the run wrote; a run's hours of training speech come from its record
(``--hours`` runs record the hours of their cached blocks). The combined histories are written
beside the plot as JSON, so the figure can be redrawn without the work folders.

    python -m tools.learning_curve data/runs/base-eagle-h1.work data/runs/base-eagle-h10.work \\
        --out docs/drafters/base-eagle-learning.png --title "base EAGLE head"
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Optional

from medusa_whisper.training.plots import Run, plot_learning_curve


def train_hours(record: dict) -> Optional[float]:
    """Hours of distinct training speech of a run, from its record (None when it does not say)."""
    train = (record.get("cache") or {}).get("train") or {}
    if "hours" in train:
        return float(train["hours"])
    hours = (record.get("budget") or {}).get("hours")
    return float(hours) if hours else None


def read_run(folder: Path, label: Optional[str] = None) -> Run:
    history_path, record_path = folder / "history.json", folder / "record.json"
    if not history_path.is_file():
        raise SystemExit(f"learning_curve: error: {folder}: no history.json (not a training work folder?)")
    record = json.loads(record_path.read_text()) if record_path.is_file() else {}
    hours = train_hours(record)
    name = label or (f"{hours:.1f} h of speech" if hours is not None else folder.name)
    return Run(name, json.loads(history_path.read_text()), hours)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("runs", nargs="+", type=Path, help="training work folders (LABEL=DIR to name a run)")
    parser.add_argument("--out", type=Path, required=True, help="the PNG; its .json holds the runs")
    parser.add_argument("--title", default="")
    args = parser.parse_args()
    runs = []
    for spec in args.runs:
        label, _, folder = str(spec).rpartition("=")
        runs.append(read_run(Path(folder), label or None))
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.with_suffix(".json").write_text(json.dumps(
        [dict(label=r.label, train_hours=r.train_hours, history=r.history) for r in runs], indent=1))
    if plot_learning_curve(runs, args.out, args.title) is None:
        sys.exit("learning_curve: error: nothing to plot (matplotlib missing, or no held-out scores in the runs)")
    print(f"wrote {args.out} and {args.out.with_suffix('.json')}")


if __name__ == "__main__":
    main()
