"""Ship a trained draft head (CTC or EAGLE) under weights/: the head (fp16), its record, its curve.

The record of the training run (command, data, time, held-out figures) is kept; for a CTC head the
proposer's settings chosen for this head and base model (``--decoding``; not the pass costs, which
are measured where it runs) are stored with it; a
report on real recordings (python -m tools.bench ctc or drafters JSON) can be added to the
record (``--report``). Half precision halves the file; a drafter's weights cannot change what
lossless decoding outputs, only how many of its proposals are accepted.

    python -m tools.ship_draft_head data/runs/base-eagle.pt --name base-eagle --plot data/runs/base-eagle.work/training.png
    python -m tools.ship_draft_head data/train/base-ctc.pt --name base-ctc --plot data/train/base-ctc.work/training.png \\
        --decoding '{"timestamps": "repeat"}' --report bench_out/ctc_report_base.json
"""

from __future__ import annotations

import argparse
import json
import shutil
from pathlib import Path

import torch

from medusa_whisper.drafting.ctc_proposer import DraftSettings
from medusa_whisper.loading import load_heads
from tools import ROOT

WEIGHTS = ROOT / "weights"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("heads", type=Path, help="the heads file medusa-whisper train --heads-type ctc|eagle wrote")
    parser.add_argument("--name", required=True, help="e.g. base-ctc, base-eagle: writes weights/NAME.pt, .json, .png")
    parser.add_argument("--plot", type=Path, default=None, help="the run's training.png")
    parser.add_argument("--decoding", type=json.loads, default=None, help="proposer settings (JSON) to store")
    parser.add_argument("--report", type=Path, action="append", default=[],
                        help="a python -m tools.bench ctc or drafters JSON whose summary goes into the record (repeatable)")
    args = parser.parse_args()

    heads = load_heads(args.heads)
    kind = heads.get("draft_head", {}).get("kind")
    if kind not in ("ctc", "eagle"):
        raise SystemExit(f"{args.heads}: not a draft head file (CTC or EAGLE)")
    if args.decoding is not None and kind != "ctc":
        raise SystemExit("--decoding: proposer settings are stored for CTC heads only")
    config = dict(heads["draft_head"])
    if args.decoding is not None:
        DraftSettings.from_dict(args.decoding)  # refuse unknown settings before writing anything
        config["decoding"] = {**config.get("decoding", {}), **args.decoding}
    record = dict(heads.get("record") or {})
    if kind == "ctc":
        record["shipped_decoding"] = config.get("decoding", {})
    record["real_recordings"] = [_summary(json.loads(Path(p).read_text())) for p in args.report]
    state = {k: v.half() if v.is_floating_point() else v for k, v in heads["state_dict"].items()}  # half the file
    WEIGHTS.mkdir(exist_ok=True)
    out = WEIGHTS / f"{args.name}.pt"
    torch.save(dict(heads, draft_head=config, state_dict=state, record=record), out)
    (WEIGHTS / f"{args.name}.json").write_text(json.dumps(record, indent=1))
    if args.plot is not None:
        shutil.copyfile(args.plot, WEIGHTS / f"{args.name}.png")
    print(f"wrote {out} ({out.stat().st_size / 1e6:.1f} MB) and its .json{' and .png' if args.plot else ''}")


def _summary(report: dict) -> dict:
    """The part of a report worth keeping: ctc_report's summary, or drafters_report's rows and setting."""
    if "summary" in report:
        return report["summary"]
    return {k: v for k, v in report.items() if k != "clips"}


if __name__ == "__main__":
    main()
