"""``medusa-whisper train``: cache the frozen base model's states, train heads, write a heads file."""

from __future__ import annotations

import argparse
import json
import sys
import time
from dataclasses import asdict
from pathlib import Path

from ..errors import MedusaWhisperError
from . import ctc_cli


def add_parser(commands, positive_int, language) -> None:
    p = commands.add_parser(
        "train", help="train Medusa heads on a frozen base model",
        description="Train Medusa heads. Labels are the base model's own greedy transcripts by default "
                    "(self-supervised), so lossless decoding with the heads stays exactly vanilla.")
    data = p.add_argument_group("data")
    data.add_argument("--data", type=Path, action="append", default=[], metavar="CSV",
                      help="training CSV (columns audio, sentence, language; optional voice, seconds); repeatable")
    data.add_argument("--audio-dir", type=Path, action="append", default=[], metavar="DIR",
                      help="a folder of unlabelled audio (one sub-folder per speaker); repeatable")
    data.add_argument("--heldout", type=Path, default=None, metavar="CSV",
                      help="held-out CSV: per-head accuracy is reported on it during training")
    data.add_argument("--language", type=language, default="en", help="language of --audio-dir audio")
    data.add_argument("--labels", choices=("self", "transcript"), default="self",
                      help="self: the base model's greedy transcripts (default); transcript: the CSV's sentences")
    data.add_argument("--timestamps-fraction", type=float, default=0.3, metavar="P",
                      help="share of windows labelled with timestamp tokens (default 0.3)")
    data.add_argument("--max-windows", type=positive_int, default=None, metavar="N",
                      help="use only the first N packed training windows (the cache is built in this order, "
                           "so a later run with a larger N extends it)")
    data.add_argument("--window-seconds", type=float, nargs=2, default=(20.0, 28.0), metavar=("MIN", "MAX"),
                      help="utterances are packed into windows of this much audio (default 20 28)")
    data.add_argument("--hours", type=positive_float, default=None, metavar="H",
                      help="train on the first H hours of the training rows, cut in their order into blocks of "
                           "--block-hours that are packed and cached one by one (CACHE_DIR/train/block_NNN): a "
                           "later run with more hours, or another head type, reuses the blocks cached")
    data.add_argument("--block-hours", type=positive_float, default=None, metavar="H",
                      help="with --hours: hours of audio per cached block (default 1)")

    model = p.add_argument_group("model")
    model.add_argument("--base", default="tiny.en", metavar="NAME|PATH", help="frozen base model (default tiny.en)")
    model.add_argument("--heads-type", choices=("linear", "block", "base_head", "eagle", "ctc"), default="linear",
                       help="linear: Medusa-Linear; block: Medusa-Block; base_head: with --fine-tune-last-layer; "
                            "eagle: the EAGLE-style draft head (drafts features; <base>-eagle); "
                            "ctc: a CTC draft head on the encoder output (options below)")
    model.add_argument("--num-heads", type=positive_int, default=10, metavar="K")
    model.add_argument("--num-layers", type=positive_int, default=1, help="residual blocks per head")
    model.add_argument("--proposal-vocab", type=int, default=None, metavar="N",
                       help="Medusa heads propose among the first N token ids and the special tokens (default 0: "
                            "all); the eagle head among the N most frequent tokens of its labels (default 8192)")
    model.add_argument("--rollout-prob", type=float, default=0.5, metavar="P",
                       help="eagle: share of steps that also train on the head's own drafted features (default 0.5)")
    model.add_argument("--feature-weight", type=float, default=1.0,
                       help="eagle: weight of the feature regression beside the token cross-entropy (default 1)")
    model.add_argument("--fine-tune-last-layer", action="store_true",
                       help="the paper's fine-tuned variant: also retrain the last decoder layer with a KL term "
                            "(NOT lossless with respect to the original model)")
    model.add_argument("--kl-weight", type=float, default=0.01)
    model.add_argument("--last-layer-lr", type=float, default=1e-5, help="learning rate of the fine-tuned layer")

    run = p.add_argument_group("run")
    run.add_argument("--out", type=Path, required=True, metavar="FILE", help="heads file to write (.pt)")
    run.add_argument("--work-dir", type=Path, default=None, metavar="DIR",
                     help="checkpoints, history and plot (default: OUT without .pt, plus .work)")
    run.add_argument("--cache-dir", type=Path, default=None, metavar="DIR",
                     help="cached base-model states, shareable between head types (default: WORK_DIR/cache)")
    run.add_argument("--epochs", type=float, default=3.0)
    run.add_argument("--lr", type=float, default=1e-3)
    run.add_argument("--batch-positions", type=positive_int, default=512)
    run.add_argument("--batch-windows", type=positive_int, default=4)
    run.add_argument("--eval-every", type=positive_int, default=200, metavar="STEPS")
    run.add_argument("--checkpoint-every", type=positive_int, default=200, metavar="STEPS")
    run.add_argument("--max-steps", type=positive_int, default=None, help="stop early (resume later)")
    run.add_argument("--minutes", type=positive_float, default=None, metavar="M",
                     help="a training budget (resumed parts included, evaluations counted): the learning rate "
                          "decays over the minutes when they end before the epochs do, and the run stops, "
                          "evaluated and checkpointed, once they are spent")
    run.add_argument("--also-cache", type=Path, action="append", default=[], metavar="DIR",
                     help="eagle: train on this existing cache too (its train/ shards, built earlier with "
                          "--cache-only from other data); repeatable")
    run.add_argument("--cache-only", action="store_true",
                     help="build (or extend) the cache of the base model's states and stop: another run, or "
                          "another head type, trains on it later with the same --cache-dir")
    run.add_argument("--no-resume", action="store_true", help="start over even if a checkpoint exists")
    run.add_argument("--keep-last", action="store_true",
                     help="eagle, ctc: end with the last step's weights (default: the best held-out score's)")
    run.add_argument("--seed", type=int, default=0)
    run.add_argument("--device", choices=("cpu", "cuda"), default=None)
    run.add_argument("--threads", type=positive_int, default=None)
    ctc_cli.add_arguments(p)
    p.set_defaults(run=run_train)


def positive_float(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a number: {text!r}") from None
    if not value > 0:
        raise argparse.ArgumentTypeError(f"must be above 0: {text!r}")
    return value


def run_train(args: argparse.Namespace) -> int:
    import torch

    from ..loading import load_model
    from . import blocks, features, plots, trainer, windows

    if args.block_hours and not args.hours:
        raise MedusaWhisperError("train: --block-hours goes with --hours")
    if args.heads_type == "ctc":
        return ctc_cli.run_train(args)
    if args.threads:
        torch.set_num_threads(args.threads)
    if not args.data and not args.audio_dir:
        raise MedusaWhisperError("train: give --data CSV or --audio-dir DIR")
    if args.device == "cuda" and not torch.cuda.is_available():
        raise MedusaWhisperError("--device cuda: CUDA is not available on this machine")
    work = args.work_dir or args.out.with_suffix(".work")
    cache = args.cache_dir or work / "cache"
    times = {}

    began = time.perf_counter()
    base = load_model(args.base, device=args.device)
    if base.num_heads:
        raise MedusaWhisperError(f"--base {args.base}: already has heads; name the plain base model")
    label = features.LabelOptions(labels=args.labels, timestamps_fraction=args.timestamps_fraction, seed=args.seed)
    if args.hours:
        chosen, utterances, train_summary = blocks.from_args(args, base, cache, label)
        summary = {"train": train_summary}
        load_train = lambda audio=True: blocks.load(cache / "train", chosen, audio_features=audio)  # noqa: E731
    else:
        utterances = windows.read_sources(args.data, args.audio_dir, args.language)
        train_windows = windows.pack(utterances, seed=args.seed, min_seconds=args.window_seconds[0],
                                     max_seconds=args.window_seconds[1])
        if args.max_windows:  # whole shards, so that a later, larger --max-windows extends the same cache
            shard = features.SHARD_WINDOWS
            train_windows = train_windows[: -(-args.max_windows // shard) * shard]
        summary = {"train": features.build_cache(base, train_windows, cache / "train", label, "cache train")}
        n_shards = -(-len(train_windows) // features.SHARD_WINDOWS)
        load_train = lambda audio=True: features.load_cache(cache / "train", audio_features=audio,  # noqa: E731
                                                            max_shards=n_shards)
    heldout = None
    if args.heldout:
        heldout_windows = windows.pack(windows.read_csv(args.heldout), seed=args.seed + 1,
                                       min_seconds=args.window_seconds[0], max_seconds=args.window_seconds[1])
        summary["heldout"] = features.build_cache(base, heldout_windows, cache / "heldout", label, "cache heldout")
    times["cache_seconds"] = round(time.perf_counter() - began, 1)
    if args.cache_only:
        print(json.dumps(dict(cache=str(cache), **summary, **times)))
        return 0

    if args.heads_type == "eagle":
        return _train_eagle(args, base, cache, load_train, utterances, summary, times)
    cfg = trainer.TrainConfig(
        heads_type=args.heads_type, num_heads=args.num_heads, num_layers=args.num_layers,
        proposal_vocab=args.proposal_vocab or 0, fine_tune_last_layer=args.fine_tune_last_layer,
        kl_weight=args.kl_weight, last_layer_lr=args.last_layer_lr, epochs=args.epochs, batch_positions=args.batch_positions,
        batch_windows=args.batch_windows, lr=args.lr, seed=args.seed, eval_every=args.eval_every,
        checkpoint_every=args.checkpoint_every)
    need_audio = cfg.per_window
    train_shard = load_train(need_audio)
    heldout = features.load_cache(cache / "heldout", audio_features=need_audio) if args.heldout else None
    base = base.float().cpu() if args.device != "cuda" else base.float()
    trained, state = trainer.train(base, train_shard, heldout, cfg, work, resume=not args.no_resume,
                                   max_steps=args.max_steps, log=lambda m: print(m, file=sys.stderr),
                                   minutes=args.minutes)
    record = _record(args, cfg, state, work, summary, times, plots.plot_history,
                     f"{args.base} {args.heads_type} x{args.num_heads}")
    record["device"] = str(next(base.parameters()).device)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    torch.save(trainer.heads_file(trained, base, args.base, record), args.out)
    _report(args, state, times)
    return 0


def _record(args, cfg, state, work: Path, summary: dict, times: dict, plot, title: str) -> dict:
    """Write the curve (history.json and training.png) and return the training record of a heads file."""
    import torch

    from .plots import write_curve

    times["train_seconds"] = round(state.seconds, 1)
    write_curve(state.history, work, plot, title, state.best.get("step"))
    record = dict(
        base_model=args.base, train_config=asdict(cfg), labels=args.labels,
        data=[str(p) for p in args.data] + [str(p) for p in args.audio_dir],
        heldout=str(args.heldout) if args.heldout else None, cache=summary, steps=state.step,
        budget=dict(hours=args.hours, minutes=args.minutes),
        threads=torch.get_num_threads(), **times,
        final=state.history[-1] if state.history else None, best=state.best or None,
        command="medusa-whisper " + " ".join(sys.argv[1:]),
    )
    # beside history.json: what tools/learning_curve.py reads to place the run
    (Path(work) / "record.json").write_text(json.dumps(record, indent=1))
    return record


def _report(args, state, times) -> None:
    print(json.dumps(dict(out=str(args.out), steps=state.step, **times,
                          heldout=(state.history[-1].get("heldout") if state.history else None))))


def _train_eagle(args, base, cache: Path, load_train, utterances, summary: dict, times: dict) -> int:
    """The EAGLE draft head on the same cache: its own trainer, a draft-head file."""
    import torch

    from ..drafting.draft_head import draft_head_file
    from . import blocks, eagle, features, plots

    cfg = eagle.EagleTrainConfig(
        shortlist=args.proposal_vocab or 8192, epochs=args.epochs, batch_windows=args.batch_windows, lr=args.lr,
        feature_weight=args.feature_weight, rollout_prob=args.rollout_prob, seed=args.seed,
        eval_every=args.eval_every, checkpoint_every=args.checkpoint_every, keep_best=not args.keep_last)
    work = args.work_dir or args.out.with_suffix(".work")
    train_shard = load_train()
    # the speech-seen axis of the learning curve: known for the windows of --data's rows
    seconds = None if args.also_cache else blocks.window_seconds(train_shard, utterances)
    if args.also_cache:
        train_shard = features.merge([train_shard] + [features.load_cache(d / "train") for d in args.also_cache])
        summary["also"] = [features.summarize(d / "train") for d in args.also_cache]
    heldout = features.load_cache(cache / "heldout") if args.heldout else None
    base = base.float().cpu() if args.device != "cuda" else base.float()
    head, state = eagle.train(base, train_shard, heldout, cfg, work, resume=not args.no_resume,
                              max_steps=args.max_steps, log=lambda m: print(m, file=sys.stderr),
                              minutes=args.minutes, example_seconds=seconds)
    record = _record(args, cfg, state, work, summary, times, plots.plot_eagle_history, f"{args.base} eagle")
    args.out.parent.mkdir(parents=True, exist_ok=True)
    torch.save(draft_head_file(head, args.base, record), args.out)
    _report(args, state, times)
    return 0
