"""What one pass costs at each compute type: decoder passes of 1 and 8 rows, the encoder, load time.

    python -m tools.bench compute-speed --model base --compute-types float32,int8,bfloat16 --threads 2

- decoder: one pass of our decoder step (on the CPU's products) + vocabulary projection over M new rows
  after a cache of 60 tokens, on the encoder output of a real recording; M = 1 and 8.
- encoder: one 30-s window (log-Mel in, audio features out), and the relative error of its output
  against float32's (max |a - b| / max |a|, and the mean of |a - b| / mean |a|).
- Every measurement is interleaved across compute types (A, B, C, A, B, C ...) so that a busy
  stretch of a shared machine hits each alike (``--consecutive``: A, A, ..., B, B, ..., as a decoding
  loop runs one model's passes back to back, its weights warm in the CPU's caches); the minimum and median over repetitions are given,
  with the load average, because on a shared machine the median moves with everyone else's work.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import time
from pathlib import Path

import torch
import whisper

import medusa_whisper
from medusa_whisper.step.attention import chain_mask
from medusa_whisper.step.cpu import cpu_step
from tools import ROOT

AUDIO = ROOT / "tests" / "data" / "real" / "jfk.flac"


CLOCK = time.perf_counter


CONSECUTIVE = False  # --consecutive: each function's repetitions in a row, as a decoding loop runs them


def interleaved(fns: dict, reps: int) -> dict:
    """{name: (min ms, median ms)} with every function run once per repetition, in turn (or, with
    CONSECUTIVE, all of one function's repetitions before the next function's)."""
    for fn in fns.values():
        fn()
    times = {name: [] for name in fns}
    order = ([(name, fn) for name, fn in fns.items() for _ in range(reps)] if CONSECUTIVE
             else [(name, fn) for _ in range(reps) for name, fn in fns.items()])
    for name, fn in order:
        began = CLOCK()
        fn()
        times[name].append((CLOCK() - began) * 1e3)
    return {name: (round(min(t), 2), round(statistics.median(t), 2)) for name, t in times.items()}


def pass_runner(model, features, rows: int, context: int = 60):
    step = cpu_step(model, 1, features.dtype)
    step.set_audio(features)
    tokens = torch.randint(0, 50000, (1, context))
    step.pass_at(tokens, torch.arange(context), 0, chain_mask(0, context, "cpu"))
    new = torch.randint(0, 50000, (1, rows))
    positions = torch.arange(context, context + rows)
    mask = chain_mask(context, rows, "cpu")

    def run():
        return step.logits(step.pass_at(new, positions, context, mask))
    return run


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="base")
    parser.add_argument("--compute-types", default="float32,int8,bfloat16")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--reps", type=int, default=30, help="repetitions of each decoder pass")
    parser.add_argument("--encoder-reps", type=int, default=5)
    parser.add_argument("--out", type=Path, default=None, help="also write the results as JSON here")
    parser.add_argument("--consecutive", action="store_true",
                        help="time each type's repetitions in a row (its weights stay in the CPU's caches, as "
                             "in a decoding loop) instead of interleaving the types (each pass starts cold)")
    parser.add_argument("--cpu-clock", action="store_true",
                        help="time with the process's CPU clock instead of the wall clock (a busy shared machine)")
    args = parser.parse_args()
    global CLOCK, CONSECUTIVE
    CONSECUTIVE = args.consecutive
    if args.cpu_clock:
        CLOCK = time.process_time
    torch.set_num_threads(args.threads)
    types = args.compute_types.split(",")

    report = {"model": args.model, "threads": args.threads, "torch": torch.__version__,
              "clock": "cpu" if args.cpu_clock else "wall",
              "load_average_start": os.getloadavg()[0]}
    models, load_seconds = {}, {}
    for compute_type in types:
        began = time.perf_counter()
        models[compute_type] = medusa_whisper.load_model(args.model, device="cpu", compute_type=compute_type)
        load_seconds[compute_type] = round(time.perf_counter() - began, 2)
    report["load_seconds"] = load_seconds

    audio = whisper.pad_or_trim(whisper.load_audio(str(AUDIO)))
    mel = whisper.log_mel_spectrogram(audio, models[types[0]].dims.n_mels)[None]
    with torch.no_grad():
        features = {t: m.embed_audio(mel) for t, m in models.items()}
        reference = features.get("float32")
        if reference is not None:
            report["encoder_error"] = {
                t: {"max_rel": round(float((f.float() - reference).abs().max() / reference.abs().max()), 5),
                    "mean_rel": round(float((f.float() - reference).abs().mean() / reference.abs().mean()), 5)}
                for t, f in features.items()}
        report["encoder_ms"] = interleaved({t: (lambda m=m: m.embed_audio(mel)) for t, m in models.items()},
                                           args.encoder_reps)
        report["pass_ms"] = {}
        for rows in (1, 8):
            runners = {t: pass_runner(m, features["float32"] if "float32" in features else features[t], rows)
                       for t, m in models.items()}
            report["pass_ms"][rows] = interleaved(runners, args.reps)
    report["load_average_end"] = os.getloadavg()[0]
    print(json.dumps(report, indent=1))
    if args.out:
        args.out.write_text(json.dumps(report, indent=1) + "\n")


if __name__ == "__main__":
    main()
