"""Decoder time per compute type on real recordings, and the exact mode (an int8 copy drafts, float32 verifies).

    python -m tools.bench compute-decode --model base --clips 10 --rounds 2 --threads 2

Systems (all given the float32 model's encoder output, so only decoding is timed):
- ``float32 off`` / ``int8 off`` / ``bfloat16 off``: greedy decoding with our decoder at that type;
- ``exact int8-draft``: lossless draft-model decoding where an int8 copy of the same model drafts
  (K tokens, sharing the float32 encoder output: no second encoder pass) and the float32 model
  verifies, so the output is float32 greedy's;
- ``int8 draft DRAFT``: lossless with ``--draft`` (int8) drafting for the int8 model.
Interleaved per clip, rotating order; a warm-up round is not counted. CPU seconds are given beside
wall seconds: on a shared machine the wall clock counts other people's work too.
"""

from __future__ import annotations

import argparse
import csv
import json
import os
import statistics
import time
from pathlib import Path

import torch
import whisper

import medusa_whisper
from tools import ROOT


def real_clips(csv_path: Path, n: int):
    """The n longest recordings of at most 30 s (one window each), plus jfk.flac."""
    rows = list(csv.DictReader(open(csv_path, encoding="utf-8")))
    rows = [r for r in rows if float(r.get("seconds") or 0) <= 30]
    rows.sort(key=lambda r: -float(r["seconds"]))
    return [csv_path.parent / r["audio"] for r in rows[:n]]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="base")
    parser.add_argument("--csv", type=Path, default=ROOT / "data" / "real" / "real.csv")
    parser.add_argument("--clips", type=int, default=10)
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--draft", default=None, help="also int8 lossless with this int8 draft")
    parser.add_argument("--draft-tokens", type=int, default=5)
    parser.add_argument("--out", type=Path, default=None)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)

    clips = [ROOT / "tests" / "data" / "real" / "jfk.flac"] + (real_clips(args.csv, args.clips) if args.csv.is_file() else [])
    models = {t: medusa_whisper.load_model(args.model, device="cpu", compute_type=t)
              for t in ("float32", "int8", "bfloat16")}
    fp32 = models["float32"]
    int8_draft = models["int8"]
    systems = {f"{t} off": (m, "off", None) for t, m in models.items()}
    systems["exact int8-draft"] = (fp32, "lossless", int8_draft)
    if args.draft:
        systems[f"int8 draft {args.draft}"] = (models["int8"], "lossless",
                                               medusa_whisper.load_model(args.draft, device="cpu", compute_type="int8"))

    with torch.no_grad():
        features = []
        mels = []
        for clip in clips:
            mel = whisper.log_mel_spectrogram(whisper.pad_or_trim(whisper.load_audio(str(clip))), fp32.dims.n_mels)
            mels.append(mel)
            features.append(fp32.embed_audio(mel[None])[0])

    names = list(systems)
    wall = {n: [] for n in names}
    cpu = {n: [] for n in names}
    texts, steps, tokens = {n: [] for n in names}, {n: 0 for n in names}, {n: 0 for n in names}
    for round_ in range(args.rounds + 1):
        w = {n: 0.0 for n in names}
        c = {n: 0.0 for n in names}
        for i, (f, mel) in enumerate(zip(features, mels)):
            order = names[i % len(names):] + names[:i % len(names)]
            for name in order:
                model, mode, draft = systems[name]
                extra = {}
                if draft is not None:
                    same_shape = draft.dims == model.dims
                    extra = dict(draft=draft, draft_mel=f if same_shape else mel,
                                 draft_tokens=args.draft_tokens)
                began, began_cpu = time.perf_counter(), time.process_time()
                r = medusa_whisper.decode(model, f, language="en", fp16=False, without_timestamps=True, mode=mode,
                                          **extra)
                w[name] += time.perf_counter() - began
                c[name] += time.process_time() - began_cpu
                if round_ == 1:
                    texts[name].append(r.text)
                    steps[name] += r.decoder_steps
                    tokens[name] += r.tokens_produced
        if round_ > 0:
            for n in names:
                wall[n].append(w[n])
                cpu[n].append(c[n])
    reference = texts["float32 off"]
    report = {"model": args.model, "clips": len(clips), "rounds": args.rounds, "threads": args.threads,
              "load_average": os.getloadavg()[0], "systems": {}}
    for n in names:
        report["systems"][n] = {
            "wall_s": round(statistics.median(wall[n]), 3), "cpu_s": round(statistics.median(cpu[n]), 3),
            "wall_vs_float32_off": round(statistics.median(wall["float32 off"]) / statistics.median(wall[n]), 3),
            "cpu_vs_float32_off": round(statistics.median(cpu["float32 off"]) / statistics.median(cpu[n]), 3),
            "tokens_per_step": round(tokens[n] / steps[n], 3),
            "same_text_as_float32": round(sum(a == b for a, b in zip(texts[n], reference)) / len(reference), 3)}
    print(json.dumps(report, indent=1))
    if args.out:
        args.out.write_text(json.dumps(report, indent=1) + "\n")


if __name__ == "__main__":
    main()
