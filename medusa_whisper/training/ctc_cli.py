"""``medusa-whisper train --heads-type ctc``: its options and its run (heavy imports only when it runs)."""

from __future__ import annotations

import argparse
import json
import sys
import time
from dataclasses import asdict
from pathlib import Path

from ..errors import MedusaWhisperError


def add_arguments(parser: argparse.ArgumentParser) -> None:
    group = parser.add_argument_group("CTC draft head (--heads-type ctc; defaults: training.ctc.CtcTrainConfig)")
    group.add_argument("--ctc-units", type=int, default=None, metavar="N",
                       help="symbols: the main model's first N BPE tokens (256: characters)")
    group.add_argument("--ctc-width", type=int, default=None, metavar="W", help="the head's channels")
    group.add_argument("--ctc-layers", type=int, default=None, metavar="L", help="residual blocks")
    group.add_argument("--ctc-block", choices=("conv", "attn"), default=None)
    group.add_argument("--ctc-stride", type=int, default=None, metavar="S", help="encoder frames per head frame")
    group.add_argument("--ctc-dropout", type=float, default=None)
    group.add_argument("--ctc-time-masks", type=int, default=None, metavar="N",
                       help="spans of the encoder output zeroed per training window (augmentation)")
    group.add_argument("--ctc-train-cache", type=Path, action="append", default=[], metavar="DIR",
                       help="a cache folder of shard_*.pt to train on, read as it is (repeatable; instead of "
                            "--data/--cache-dir)")
    group.add_argument("--ctc-heldout-cache", type=Path, default=None, metavar="DIR",
                       help="a cache folder of held-out shards, read as it is")
    group.add_argument("--ctc-decoding", type=json.loads, default=None, metavar="JSON",
                       help="proposer settings stored with the head (drafting.ctc_proposer.DraftSettings)")


def _config(args: argparse.Namespace):
    from .ctc import CtcTrainConfig

    given = dict(n_units=args.ctc_units, width=args.ctc_width, layers=args.ctc_layers, block=args.ctc_block,
                 stride=args.ctc_stride, dropout=args.ctc_dropout, time_masks=args.ctc_time_masks)
    return CtcTrainConfig(**{k: v for k, v in given.items() if v is not None}, epochs=args.epochs,
                          batch_windows=args.batch_windows, lr=args.lr, seed=args.seed, eval_every=args.eval_every,
                          checkpoint_every=args.checkpoint_every, keep_best=not args.keep_last)


def run_train(args: argparse.Namespace) -> int:
    """Caches from --data/--audio-dir (built under --cache-dir, as for Medusa heads), or an existing
    cache read as it is (--cache-dir holding train/ and heldout/, no --data): nothing is written there."""
    import torch

    from ..drafting.ctc_proposer import DraftSettings
    from ..drafting.draft_head import draft_head_file
    from ..loading import load_model
    from . import blocks, ctc, features, plots, windows

    if args.threads:
        torch.set_num_threads(args.threads)
    if args.device == "cuda":
        raise MedusaWhisperError("--heads-type ctc trains on the CPU (the head is small)")
    work = args.work_dir or args.out.with_suffix(".work")
    cache = args.cache_dir or work / "cache"
    began = time.perf_counter()
    base = load_model(args.base, device="cpu")
    if base.num_heads or getattr(base, "draft_head", None) is not None:
        raise MedusaWhisperError(f"--base {args.base}: already has heads; name the plain base model")
    summary = {}
    train_dirs = list(args.ctc_train_cache) or [cache / "train"]
    heldout_dir = args.ctc_heldout_cache or cache / "heldout"
    if args.ctc_train_cache and (args.data or args.audio_dir):
        raise MedusaWhisperError("train: --ctc-train-cache reads existing caches; do not also give --data/--audio-dir")
    label = features.LabelOptions(labels="self", timestamps_fraction=args.timestamps_fraction, seed=args.seed)
    seconds = chosen = None
    if args.hours:
        from .blocks import from_args as hour_blocks

        if args.ctc_train_cache:
            raise MedusaWhisperError("train: --hours chooses rows of --data; do not also give --ctc-train-cache")
        chosen, utterances, summary["train"] = hour_blocks(args, base, cache, label)
    elif args.data or args.audio_dir:
        utterances = windows.read_sources(args.data, args.audio_dir, args.language)
        train_windows = windows.pack(utterances, seed=args.seed, min_seconds=args.window_seconds[0],
                                     max_seconds=args.window_seconds[1])
        if args.max_windows:
            shard = features.SHARD_WINDOWS
            train_windows = train_windows[: -(-args.max_windows // shard) * shard]
        summary["train"] = features.build_cache(base, train_windows, cache / "train", label, "cache train")
    if args.data or args.audio_dir:
        if args.heldout:
            heldout_windows = windows.pack(windows.read_csv(args.heldout), seed=args.seed + 1,
                                           min_seconds=args.window_seconds[0], max_seconds=args.window_seconds[1])
            summary["heldout"] = features.build_cache(base, heldout_windows, cache / "heldout", label,
                                                      "cache heldout")
    for folder in ([] if chosen else train_dirs):
        if not features.shard_paths(folder):
            raise MedusaWhisperError(f"train: {folder}: no shard_*.pt (give --data CSV or --audio-dir DIR to build "
                                     f"a cache, or --ctc-train-cache DIR of an existing one)")
    # the shards present now, recorded so that a resumed run reads the same ones while a cache grows
    max_shards = -(-args.max_windows // features.SHARD_WINDOWS) if args.max_windows else None
    shards = {str(folder): len(features.shard_paths(folder)[:max_shards]) for folder in train_dirs}
    recorded = work / "shards.json"
    if recorded.is_file() and not args.no_resume and (work / "checkpoint.pt").is_file():
        shards = {**shards, **json.loads(recorded.read_text())}  # a resumed run reads what the first one read
    work.mkdir(parents=True, exist_ok=True)
    recorded.write_text(json.dumps(shards, indent=1))
    if chosen:
        train_shard = blocks.load(cache / "train", chosen)
        seconds = blocks.window_seconds(train_shard, utterances)
    else:
        train_shard = features.merge([features.load_cache(folder, max_shards=n) for folder, n in
                                       zip(train_dirs, shards.values())])
    heldout = features.load_cache(heldout_dir) if features.shard_paths(heldout_dir) else None
    summary.setdefault("train", dict(windows=len(train_shard.tokens), shards=shards))
    if heldout is not None:
        summary.setdefault("heldout", dict(windows=len(heldout.tokens), folder=str(heldout_dir)))
    cache_seconds = round(time.perf_counter() - began, 1)

    cfg = _config(args)
    settings = DraftSettings.from_dict(args.ctc_decoding)
    head, state = ctc.train(base, train_shard, heldout, cfg, work, settings, resume=not args.no_resume,
                            max_steps=args.max_steps, log=lambda m: print(m, file=sys.stderr),
                            minutes=args.minutes, example_seconds=seconds)
    title = f"{args.base} CTC head ({cfg.block} x{cfg.layers}, width {cfg.width}, {cfg.n_units} units)"
    plots.write_curve(state.history, work, plots.plot_ctc_history, title, state.best.get("step"))
    record = dict(base_model=args.base, train_config=asdict(cfg), labels="self", cache=summary,
                  steps=state.step, threads=torch.get_num_threads(), device="cpu",
                  budget=dict(hours=args.hours, minutes=args.minutes),
                  cache_seconds=cache_seconds, train_seconds=round(state.seconds, 1),
                  final=state.history[-1] if state.history else None, best=state.best or None,
                  command="medusa-whisper " + " ".join(sys.argv[1:]))
    (work / "record.json").write_text(json.dumps(record, indent=1))  # for tools/learning_curve.py
    args.out.parent.mkdir(parents=True, exist_ok=True)
    torch.save(draft_head_file(head, args.base, record), args.out)
    print(json.dumps(dict(out=str(args.out), steps=state.step, train_seconds=round(state.seconds, 1),
                          heldout=(state.history[-1].get("heldout") if state.history else None))))
    return 0
