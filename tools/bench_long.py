#!/usr/bin/env python3
"""Long-form speed: medusa_whisper's transcribe against whisper.transcribe on one long file, one run.

Every system transcribes the same file with the same weights and whisper's default options
(temperature fallback on, timestamps on, previous text as prompt), in turn, for --rounds rounds
after a short warm-up; the table gives the median wall time, the ratio to whisper.transcribe,
tokens per decoder step (timestamps included), and whether the segments equal whisper's.

    python tools/bench_long.py --audio data/long/real_8min.flac --model tiny.en --out bench_out/long_tiny.en
"""

from __future__ import annotations

import argparse
import json
import platform
import statistics
import sys
import time
from pathlib import Path
from typing import Dict, List, Optional, Sequence

import torch
import whisper

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
import medusa_whisper  # noqa: E402
from medusa_whisper.audio import load_audio  # noqa: E402
from medusa_whisper.weights import heads_file  # noqa: E402

SEGMENT_KEYS = ("seek", "start", "end", "text", "tokens")


def systems(model_name: str) -> List[Dict]:
    rows = [dict(name="openai-whisper transcribe", model=model_name, vanilla=True),
            dict(name="medusa_whisper off", model=model_name, mode="off")]
    for suffix in ("-medusa", "-medusa-block"):
        if heads_file(model_name + suffix).is_file():
            rows.append(dict(name=f"{model_name}{suffix} lossless", model=model_name + suffix, mode="lossless"))
    return rows


def run_once(system: Dict, models: Dict, audio_path: Path) -> Dict:
    model = models[system["model"]]
    torch.manual_seed(0)
    began = time.perf_counter()
    if system.get("vanilla"):
        result = whisper.transcribe(model, load_audio(audio_path), fp16=False, language="en")
    else:
        result = model.transcribe(audio_path, mode=system["mode"], language="en")
    return dict(seconds=time.perf_counter() - began, result=result)


def main(argv: Optional[Sequence[str]] = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--audio", type=Path, required=True)
    parser.add_argument("--model", default="tiny.en")
    parser.add_argument("--rounds", type=int, default=1)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--out", type=Path, required=True, help="writes OUT.json and OUT.md")
    args = parser.parse_args(argv)
    torch.set_num_threads(args.threads)

    rows = systems(args.model)
    models = {}
    for row in rows:
        if row["model"] not in models:
            models[row["model"]] = medusa_whisper.load_model(row["model"], device="cpu")
    duration = len(load_audio(args.audio)) / 16000
    # warm-up: 30 s of the file through each system
    for row in rows:
        model = models[row["model"]]
        clip = load_audio(args.audio)[: 16000 * 30]
        if row.get("vanilla"):
            whisper.transcribe(model, clip, fp16=False, language="en")
        else:
            model.transcribe(clip, mode=row["mode"], language="en")

    began = time.time()
    times: Dict[str, List[float]] = {row["name"]: [] for row in rows}
    results: Dict[str, dict] = {}
    for round_index in range(args.rounds):
        for row in rows:
            run = run_once(row, models, args.audio)
            times[row["name"]].append(run["seconds"])
            results[row["name"]] = run["result"]
            print(f"round {round_index + 1}: {row['name']}: {run['seconds']:.1f} s", file=sys.stderr, flush=True)

    reference = results[rows[0]["name"]]
    reference_segments = [{k: s[k] for k in SEGMENT_KEYS} for s in reference["segments"]]
    base_time = statistics.median(times[rows[0]["name"]])
    table = []
    for row in rows:
        result = results[row["name"]]
        stats = result.get("medusa", {})
        seconds = statistics.median(times[row["name"]])
        same = [{k: s[k] for k in SEGMENT_KEYS} for s in result["segments"]] == reference_segments
        table.append(dict(system=row["name"], seconds=seconds, speedup=base_time / seconds,
                          tokens_per_step=stats.get("tokens_per_step", 1.0), windows=stats.get("windows"),
                          fallback_windows=stats.get("fallback_windows"), same_segments=same,
                          segments=len(result["segments"])))

    header = (f"`{args.audio.name}`, {duration / 60:.1f} min; model `{args.model}` on cpu, {args.threads} threads; "
              f"whisper.transcribe's default options (fallback on, timestamps on); median of {args.rounds} "
              f"round(s); {platform.processor() or platform.machine()}; torch {torch.__version__}; "
              f"{time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime(began))}, {time.time() - began:.0f} s.")
    lines = [header, "", "| system | seconds | speedup vs whisper.transcribe | tokens/step | windows | fallback windows "
             "| segments | same segments as whisper |", "|---|---|---|---|---|---|---|---|"]
    for r in table:
        lines.append(f"| {r['system']} | {r['seconds']:.1f} | {r['speedup']:.2f}x | {r['tokens_per_step']:.2f} | "
                     f"{r['windows'] or '-'} | {r['fallback_windows'] if r['fallback_windows'] is not None else '-'} | "
                     f"{r['segments']} | {'yes' if r['same_segments'] else 'no'} |")
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.with_name(args.out.name + ".md").write_text("\n".join(lines) + "\n")
    args.out.with_name(args.out.name + ".json").write_text(json.dumps(dict(header=header, rows=table), indent=2))
    print("\n".join(lines))
    return 0


if __name__ == "__main__":
    sys.exit(main())
