"""Held-out score of EAGLE heads files on a training cache, by the trainer's own evaluation.

The trainer scores its head on the held-out windows of its cache (``training.eagle.evaluate``:
teacher-forced first-drafted-token accuracy and the replay of lossless chain decoding, tokens per
pass). A shipped head was scored on the held-out split of the speech it was trained with; to compare
heads like with like, this scores any number of heads files on one cache's held-out windows with the
same settings (``--depth`` drafted positions, the first ``--windows`` windows, as the trainer does).

    python -m tools.score_eagle weights/base-eagle.pt data/runs/base-eagle-h4.pt \\
        --cache data/cache/base-speech/heldout --out docs/drafters/base-eagle-heldout.json
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Dict, Optional

import torch

from medusa_whisper.drafting.draft_head import build_draft_head
from medusa_whisper.loading import load_heads
from medusa_whisper.training import eagle, features


def score(heads: dict, model, shard: features.Shard, depth: int = 5, windows: Optional[int] = 48,
          batch_windows: int = 4) -> Dict:
    """The trainer's held-out figures for one EAGLE heads file (as load_heads returns it) on ``shard``.

    batch_windows : the losses are means over batches of this many windows (train_drafts.sh's 4)
    The regression loss is measured in units of the held-out states' spread (the trainer uses its
    training data's), so compare tokens per step and first-token accuracy across heads, not losses.
    """
    config = heads.get("draft_head") or {}
    if config.get("kind") != "eagle":
        raise ValueError(f"not an EAGLE heads file (kind {config.get('kind')!r})")
    head = build_draft_head(model.dims, config)
    head.load_state_dict({k: v.float() if v.is_floating_point() else v for k, v in heads["state_dict"].items()},
                         strict=True)
    head.float()
    columns = torch.full((model.dims.n_vocab,), eagle.IGNORE, dtype=torch.long)
    columns[head.token_ids] = torch.arange(len(head.token_ids))
    cfg = eagle.EagleTrainConfig(shortlist=head.config.shortlist, batch_windows=batch_windows, simulate_depth=depth,
                                 simulate_windows=windows if windows is not None else len(shard.tokens))
    return eagle.evaluate(head, model, shard, columns, cfg)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("heads", nargs="+", type=Path, help="EAGLE heads files (weights/NAME.pt, data/runs/RUN.pt)")
    parser.add_argument("--cache", type=Path, required=True, help="a cache folder of held-out windows")
    parser.add_argument("--depth", type=int, default=5, help="drafted positions per pass (the trainer's 5)")
    parser.add_argument("--windows", type=int, default=48, help="windows replayed (the trainer's 48; 0: all)")
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--out", type=Path, default=None, help="write the scores here as JSON")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    import medusa_whisper

    files = {str(p): load_heads(p) for p in args.heads}
    bases = {h.get("base_model") for h in files.values()}
    if len(bases) != 1 or None in bases:
        sys.exit(f"score_eagle: error: the heads must name one base model, not {sorted(map(str, bases))}")
    model = medusa_whisper.load_model(bases.pop(), device="cpu").float()
    shard = features.load_cache(args.cache)
    results = {}
    for name, heads in files.items():
        results[name] = score(heads, model, shard, args.depth, args.windows or None)
        print(name, json.dumps(results[name]), flush=True)
    if args.out is not None:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(json.dumps(dict(cache=str(args.cache), depth=args.depth, windows=args.windows,
                                            scores=results), indent=1))


if __name__ == "__main__":
    main()
