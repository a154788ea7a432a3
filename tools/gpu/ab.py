"""The same rows with two versions of the package, one process each, on one machine (a before and
after measured back to back).

    cd .before && PYTHONPATH=$OLDPWD python -m tools.gpu.ab --clips CLIPS.csv --label before --out OUT
    python -m tools.gpu.ab --clips CLIPS.csv --label after --out OUT

Each run times our fixed-step rows (``--mode off``, the proposers that drafted inside the pass in
every version, and ``--batch-size 32``) over the clips after a warm-up clip, as ``tools.bench gpu`` does, and then where
each clip's time goes (``gpu_parts``); it adds its label's seconds, passes, tokens and texts to
OUT/ab.json, so that the runs can be compared text for text. The package imported is whichever
comes first on ``sys.path``: run from a folder holding a copy of the earlier version's
``medusa_whisper`` (``python -m`` puts the current folder first), the tree's ``tools`` on ``PYTHONPATH``.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import List, Optional

import torch

import medusa_whisper
from tools.bench.gpu import ours_row, read_clips, window_parts

ROWS = (("--mode off", "", dict(mode="off")), ("medusa", "-medusa", {}), ("ctc", "-ctc", {}),
        ("eagle chain of 2", "-eagle", dict(draft_tokens=2)), ("--mode off, --batch-size 32", "", dict(mode="off")))
BATCH = {"--mode off, --batch-size 32": 32}  # rows decoded side by side (transcribe's list of recordings)


def main(argv: Optional[List[str]] = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--clips", type=Path, required=True)
    parser.add_argument("--model", default="base")
    parser.add_argument("--device", choices=("cuda", "cpu"), default="cuda")
    parser.add_argument("--limit", type=int, default=None, help="only the N shortest clips (a rehearsal)")
    parser.add_argument("--label", required=True)
    parser.add_argument("--out", type=Path, required=True)
    args = parser.parse_args(argv)
    clips = read_clips(args.clips, args.limit)
    fixed = "auto" if args.device == "cuda" else "fixed"
    report = dict(label=args.label, package=str(Path(medusa_whisper.__file__).parent), torch=torch.__version__,
                  rows={}, parts={})
    for label, suffix, options in ROWS:
        row = ours_row(label, args.model + suffix, args.device, clips, fixed, batch_size=BATCH.get(label, 0), **options)
        report["rows"][label] = dict(seconds=row.seconds, setup_seconds=row.setup_seconds, passes=row.passes,
                                     tokens=row.tokens, error=row.error, texts=row.texts)
    report["parts"] = window_parts(args.model, args.device, clips, fixed)
    args.out.mkdir(parents=True, exist_ok=True)
    path = args.out / "ab.json"
    runs = json.loads(path.read_text(encoding="utf-8")) if path.exists() else {}
    runs[args.label] = report
    path.write_text(json.dumps(runs, indent=1) + "\n", encoding="utf-8")
    print(args.label, {label: round(row["seconds"], 3) for label, row in report["rows"].items()}, flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
