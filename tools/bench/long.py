"""Long-form speed: medusa_whisper's transcribe against whisper.transcribe on one long file, one run.

Every system transcribes the same file with the same weights and whisper's default options
(temperature fallback on, timestamps on, previous text as prompt), in turn, for --rounds rounds
after a short warm-up; the table gives the median wall time, the ratio to whisper.transcribe,
tokens per decoder step (timestamps included), and whether the segments equal whisper's.

    python -m tools.bench long --audio data/long/real_8min.flac --model tiny.en --out bench_out/long_tiny.en
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path
from typing import Dict, List, Optional, Sequence

import jiwer
import torch
import whisper
from whisper.normalizers import EnglishTextNormalizer

import medusa_whisper
from medusa_whisper.audio.files import load_audio
from medusa_whisper.checkpoints.weights import missing_heads
from tools.bench.run import machine

SEGMENT_KEYS = ("seek", "start", "end", "text", "tokens")
normalise = EnglishTextNormalizer()


# decoding options of the draft heads, as make bench runs them (tools/bench/run.py)
HEAD_OPTIONS = {"-medusa": {}, "-medusa-block": {}, "-eagle": dict(draft_tokens=2), "-ctc": {}}
INT8_OPTIONS = {"-medusa": dict(tree_width=3, tree_nodes=10), "-eagle": dict(draft_tokens=2), "-ctc": {},
                "-ctc+eagle": dict(draft_tokens=2)}


def systems(model_name: str, compute_types: Sequence[str] = ("float32", "int8"), heads: bool = True) -> List[Dict]:
    """whisper.transcribe, then per compute type our plain decoder and every shipped head.

    A row's ``reference`` is the row whose segments it must equal: whisper's for float32 (lossless
    is whisper's greedy output), our plain decoder at the same compute type otherwise.
    """
    rows = [dict(name="openai-whisper transcribe", model=model_name, vanilla=True, compute_type="float32")]
    for compute_type in compute_types:
        tag = "" if compute_type == "float32" else f" {compute_type}"
        off = dict(name=f"medusa_whisper off{tag}", model=model_name, mode="off", compute_type=compute_type)
        off["reference"] = rows[0]["name"] if compute_type == "float32" else off["name"]
        rows.append(off)
        for suffix, options in (HEAD_OPTIONS if compute_type == "float32" else INT8_OPTIONS).items():
            if heads and not missing_heads(model_name + suffix):
                described = ",".join(f"{k}={v}" for k, v in options.items())
                rows.append(dict(name=f"{model_name}{suffix} lossless{tag}" + (f" ({described})" if described else ""),
                                 model=model_name + suffix, mode="lossless", options=options,
                                 compute_type=compute_type, reference=off["reference"]))
    return rows


def sampled_attempts(segments: Sequence[tuple], step: float = 0.2) -> Dict[str, int]:
    """How many windows fell back, and how many sampled attempts they made, read from the segments'
    (seek, temperature): whisper's fallback tries 0.0, 0.2, ... 1.0 in turn and keeps the first
    attempt its rules accept (the last one where none is), so a window's final temperature t took
    t / 0.2 sampled attempts. Works for every system, faster-whisper's included, whose choice of
    which windows fall back differs from run to run and decides much of a fallback-heavy file's time."""
    final = dict(segments)  # seek -> temperature (every segment of a window has the window's)
    attempts = [round(t / step) for t in final.values()]
    return dict(fallback_windows=sum(a > 0 for a in attempts), sampled_attempts=sum(attempts))


# --force-fallback: no attempt's average log-probability reaches 0, so every window tries every
# temperature and every system does the same work (which windows fall back otherwise turns on the
# last bits of each engine's logits, and decides much of a fallback-heavy file's time)
FORCED_FALLBACK = dict(logprob_threshold=0.0)


def run_once(system: Dict, models: Dict, audio_path: Path, best_of: Optional[int] = None,
             force_fallback: bool = False) -> Dict:
    model = models[system["model"], system["compute_type"]]
    forced = FORCED_FALLBACK if force_fallback else {}
    torch.manual_seed(0)
    began = time.perf_counter()
    if system.get("vanilla"):
        result = whisper.transcribe(model, load_audio(audio_path), fp16=False, language="en", best_of=best_of,
                                    **forced)
    else:
        result = model.transcribe(audio_path, mode=system["mode"], language="en", best_of=best_of,
                                  **system.get("options", {}), **forced)
    return dict(seconds=time.perf_counter() - began, result=result)


def run_faster_whisper(model_name: str, compute_type: str, audio_path: Path, threads: int,
                       best_of: Optional[int] = None, force_fallback: bool = False) -> Dict:
    """faster-whisper's transcribe with whisper.transcribe's defaults as far as it has them: greedy
    with temperature fallback (``best_of`` candidates, one when None, as whisper.transcribe samples),
    the previous text as prompt, timestamps, no VAD."""
    from faster_whisper import WhisperModel

    from medusa_whisper.checkpoints import weights

    fw = WhisperModel(str(weights.ctranslate2_dir(model_name)), device="cpu", compute_type=compute_type,
                      cpu_threads=threads)
    audio = load_audio(audio_path)
    list(fw.transcribe(audio[: 16000 * 30], language="en", beam_size=1, best_of=1, vad_filter=False)[0])  # warm-up
    began = time.perf_counter()
    forced = dict(log_prob_threshold=FORCED_FALLBACK["logprob_threshold"]) if force_fallback else {}
    segments = list(fw.transcribe(audio, language="en", beam_size=1, best_of=best_of or 1, vad_filter=False,
                                  **forced)[0])
    return dict(seconds=time.perf_counter() - began, segments=segments, text="".join(s.text for s in segments))


def main(argv: Optional[Sequence[str]] = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--audio", type=Path, required=True)
    parser.add_argument("--model", default="tiny.en")
    parser.add_argument("--rounds", type=int, default=1)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--faster-whisper", default="int8,float32", metavar="TYPES",
                        help="faster-whisper compute types to run after every other row, once (empty: none)")
    parser.add_argument("--compute-types", default="float32,int8", help="comma-separated (default float32,int8)")
    parser.add_argument("--no-heads", action="store_true", help="plain decoding rows only (no shipped heads)")
    parser.add_argument("--best-of", type=int, default=None, metavar="N",
                        help="candidates sampled per fallback temperature, for every system (default: "
                             "whisper.transcribe's, one)")
    parser.add_argument("--seconds", type=float, default=None,
                        help="only the recording's first SECONDS (written beside --out; no WER then)")
    parser.add_argument("--force-fallback", action="store_true",
                        help="every window tries every temperature, in every system: the same work for each")
    parser.add_argument("--out", type=Path, required=True, help="writes OUT.json and OUT.md")
    args = parser.parse_args(argv)
    torch.set_num_threads(args.threads)

    rows = systems(args.model, args.compute_types.split(","), heads=not args.no_heads)
    models = {}
    for row in rows:
        key = row["model"], row["compute_type"]
        if key not in models:
            models[key] = medusa_whisper.load_model(row["model"], device="cpu", compute_type=row["compute_type"])
    if args.seconds is not None:  # a file of its own, so every system still reads and decodes a file
        import soundfile

        cut = args.out.with_name(f"{args.audio.stem}_first{args.seconds:g}s.flac")
        cut.parent.mkdir(parents=True, exist_ok=True)
        soundfile.write(str(cut), load_audio(args.audio)[: int(16000 * args.seconds)], 16000)
        args.audio = cut
    duration = len(load_audio(args.audio)) / 16000
    # warm-up: 30 s of the file through each system
    for row in rows:
        model = models[row["model"], row["compute_type"]]
        clip = load_audio(args.audio)[: 16000 * 30]
        if row.get("vanilla"):
            whisper.transcribe(model, clip, fp16=False, language="en")
        else:
            model.transcribe(clip, mode=row["mode"], language="en", **row.get("options", {}))

    began = time.time()
    times: Dict[str, List[float]] = {row["name"]: [] for row in rows}
    results: Dict[str, dict] = {}
    for round_index in range(args.rounds):
        for row in rows:
            run = run_once(row, models, args.audio, args.best_of, args.force_fallback)
            times[row["name"]].append(run["seconds"])
            results[row["name"]] = run["result"]
            print(f"round {round_index + 1}: {row['name']}: {run['seconds']:.1f} s", file=sys.stderr, flush=True)

    # the file's transcript, when python -m tools.data long wrote one beside it: WER per row
    transcript = args.audio.with_suffix(".txt")
    reference = normalise(transcript.read_text()) if transcript.is_file() else None

    def segments(name: str) -> List[Dict]:
        return [{k: s[k] for k in SEGMENT_KEYS} for s in results[name]["segments"]]

    # faster-whisper last: once CTranslate2 has run in a process, PyTorch in it is slower (see
    # tools.bench.systems.isolated_faster_whisper_system), so no PyTorch row may come after it
    fw_rows = []
    for compute_type in filter(None, args.faster_whisper.split(",")):
        try:
            run = run_faster_whisper(args.model, compute_type, args.audio, args.threads, args.best_of,
                                     args.force_fallback)
        except ImportError:
            print("faster-whisper is not installed (make bench-setup installs it): its rows are skipped",
                  file=sys.stderr)
            break
        fallback = sampled_attempts([(s.seek, s.temperature) for s in run["segments"]])
        fw_rows.append(dict(system=f"faster-whisper {compute_type}", seconds=run["seconds"],
                            speedup=statistics.median(times[rows[0]["name"]]) / run["seconds"], tokens_per_step=1.0,
                            windows=None, same_segments=None, segments=len(run["segments"]), **fallback,
                            reference=None, wer=None if reference is None else jiwer.wer(reference, normalise(run["text"])),
                            draft_seconds=None))
        print(f"faster-whisper {compute_type}: {run['seconds']:.1f} s", file=sys.stderr, flush=True)

    base_time = statistics.median(times[rows[0]["name"]])
    table = []
    for row in rows:
        result = results[row["name"]]
        stats = result.get("medusa", {})
        seconds = statistics.median(times[row["name"]])
        same_as = row.get("reference", rows[0]["name"])
        same = segments(row["name"]) == segments(same_as)
        fallback = sampled_attempts([(s["seek"], s["temperature"]) for s in result["segments"]])
        table.append(dict(system=row["name"], seconds=seconds, speedup=base_time / seconds,
                          tokens_per_step=stats.get("tokens_per_step", 1.0), windows=stats.get("windows"),
                          **fallback, same_segments=same,
                          segments=len(result["segments"]), reference=same_as,
                          wer=None if reference is None else jiwer.wer(reference, normalise(result["text"])),
                          draft_seconds=stats.get("draft_seconds")))

    table += fw_rows
    header = (f"`{args.audio.name}`, {duration / 60:.1f} min; model `{args.model}` on cpu, {args.threads} threads; "
              f"whisper.transcribe's default options (fallback on, timestamps on"
              f"{f', best_of {args.best_of}' if args.best_of else ''}"
              f"{', every window falling back (--force-fallback)' if args.force_fallback else ''}); "
              f"median of {args.rounds} "
              f"round(s); {machine()}; torch {torch.__version__}; "
              f"{time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime(began))}, {time.time() - began:.0f} s.")
    lines = [header, "", "| system | seconds | speedup vs whisper.transcribe | tokens/step | windows | fallback windows "
             "| sampled attempts | segments | WER | same segments as greedy at its compute type |",
             "|---|---|---|---|---|---|---|---|---|---|"]
    for r in table:
        wer = "-" if r["wer"] is None else f"{100 * r['wer']:.2f} %"
        same = "-" if r["same_segments"] is None else f"{'yes' if r['same_segments'] else 'no'} ({r['reference']})"
        lines.append(f"| {r['system']} | {r['seconds']:.1f} | {r['speedup']:.2f}x | {r['tokens_per_step']:.2f} | "
                     f"{r['windows'] or '-'} | {r['fallback_windows']} | {r['sampled_attempts']} | "
                     f"{r['segments']} | {wer} | "
                     f"{same} |")
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.with_name(args.out.name + ".md").write_text("\n".join(lines) + "\n")
    args.out.with_name(args.out.name + ".json").write_text(json.dumps(dict(header=header, rows=table), indent=2))
    print("\n".join(lines))
    return 0


if __name__ == "__main__":
    sys.exit(main())
