"""Keep the first K heads of a trained heads file and write it under weights/ with its record.

Heads are independent of each other (Medusa-Linear), or share only the block that every head reads
(Medusa-Block), so the first K heads of a model trained with more are a valid K-head model: the
head count can be chosen by measurement after one training run.

    python -m tools.ship_heads data/train/tiny.en-linear20.pt --heads 5 --name tiny.en-medusa \\
        --report bench_out/heads_tiny.en.json --plot data/train/tiny.en-linear20.work/training.png
"""

from __future__ import annotations

import argparse
import json
import re
import shutil
from pathlib import Path

import torch

from medusa_whisper.loading import load_heads
from tools import ROOT

WEIGHTS = ROOT / "weights"


def truncate(heads: dict, k: int) -> dict:
    config = dict(heads["medusa"])
    if not 1 <= k <= config["num_heads"]:
        raise SystemExit(f"--heads must be 1..{config['num_heads']}")
    offset = 1 if config["heads_type"] == "base_head" else 0
    kept = {}
    for name, tensor in heads["heads_state_dict"].items():
        match = re.match(r"stacks\.(\d+)\.", name)
        if match is None or int(match.group(1)) < k + offset:
            kept[name] = tensor.clone().half() if tensor.is_floating_point() else tensor  # fp16: half the file
    config["num_heads"] = k
    return dict(heads, medusa=config, heads_state_dict=kept)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("trained", type=Path)
    parser.add_argument("--heads", type=int, required=True)
    parser.add_argument("--name", required=True, help="model name, e.g. tiny.en-medusa")
    parser.add_argument("--report", type=Path, action="append", default=[], help="heads_report JSON to attach")
    parser.add_argument("--plot", type=Path, default=None, help="training curve PNG to copy beside it")
    args = parser.parse_args()

    heads = truncate(load_heads(args.trained), args.heads)
    record = dict(heads.get("record") or {})
    record["trained_heads"] = load_heads(args.trained)["medusa"]["num_heads"]
    record["shipped_heads"] = args.heads
    final = (record.get("final") or {}).get("heldout")
    if final:
        record["heldout_accuracy_per_head"] = final["accuracy_per_head"][: args.heads]
    record["measured"] = [json.loads(p.read_text()) for p in args.report]
    heads["record"] = record
    WEIGHTS.mkdir(exist_ok=True)
    out = WEIGHTS / f"{args.name}.pt"
    torch.save(heads, out)
    (WEIGHTS / f"{args.name}.json").write_text(json.dumps(record, indent=1, default=str))
    if args.plot:
        shutil.copy(args.plot, WEIGHTS / f"{args.name}.png")
    print(f"{out}: {args.heads} heads, {out.stat().st_size / 1e6:.1f} MB")


if __name__ == "__main__":
    main()
