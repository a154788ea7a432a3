#!/usr/bin/env python
"""Ship a trained CTC draft head under weights/: the head (fp16), its record, its curve.

The record of the training run (command, data, time, held-out figures) is kept; the proposer's
settings measured for this head and base model (``--decoding``) are stored with it, and a report
of tools/ctc_report.py on real recordings can be added to the record (``--report``).

    python tools/ship_ctc.py data/train/base-ctc.pt --name base-ctc --plot data/train/base-ctc.work/training.png \\
        --decoding '{"row_costs": [1.0, 1.07, 1.39, 1.63, 2.22]}' --report bench_out/ctc_report_base.json
"""

from __future__ import annotations

import argparse
import json
import shutil
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from medusa_whisper.drafting.ctc_proposer import DraftSettings  # noqa: E402
from medusa_whisper.loading import load_heads  # noqa: E402

WEIGHTS = Path(__file__).resolve().parent.parent / "weights"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("heads", type=Path, help="the heads file medusa-whisper train --heads-type ctc wrote")
    parser.add_argument("--name", required=True, help="e.g. base-ctc: writes weights/NAME.pt, .json, .png")
    parser.add_argument("--plot", type=Path, default=None, help="the run's training.png")
    parser.add_argument("--decoding", type=json.loads, default=None, help="proposer settings (JSON) to store")
    parser.add_argument("--report", type=Path, action="append", default=[],
                        help="a tools/ctc_report.py JSON whose summary goes into the record (repeatable)")
    args = parser.parse_args()

    heads = load_heads(args.heads)
    if heads.get("draft_head", {}).get("kind") != "ctc":
        raise SystemExit(f"{args.heads}: not a CTC head file")
    config = dict(heads["draft_head"])
    if args.decoding is not None:
        DraftSettings.from_dict(args.decoding)  # refuse unknown settings before writing anything
        config["decoding"] = {**config.get("decoding", {}), **args.decoding}
    record = dict(heads.get("record") or {})
    record["shipped_decoding"] = config.get("decoding", {})
    record["real_recordings"] = [json.loads(Path(p).read_text())["summary"] for p in args.report]
    state = {k: v.half() if v.is_floating_point() else v for k, v in heads["state_dict"].items()}  # half the file
    WEIGHTS.mkdir(exist_ok=True)
    out = WEIGHTS / f"{args.name}.pt"
    torch.save(dict(heads, draft_head=config, state_dict=state, record=record), out)
    (WEIGHTS / f"{args.name}.json").write_text(json.dumps(record, indent=1))
    if args.plot is not None:
        shutil.copyfile(args.plot, WEIGHTS / f"{args.name}.png")
    print(f"wrote {out} ({out.stat().st_size / 1e6:.1f} MB) and its .json{' and .png' if args.plot else ''}")


if __name__ == "__main__":
    main()
