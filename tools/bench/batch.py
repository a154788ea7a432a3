"""Throughput of an archive of real recordings against batch size, beside faster-whisper one by one.

    python -m tools.bench batch --model base --compute-type int8 --threads 2 --files 64 --batch-sizes 1,4,8,16
    python -m tools.bench batch --long data/long/real_8min.flac --batch-sizes 4,8,16

Each system transcribes the same files (the longest ``--files`` of data/real, whole files, whisper's
transcribe defaults with greedy decoding: temperature fallback on, beam search off) in a fresh
process, so that its peak RSS is its own; times exclude loading the model. Columns: wall seconds,
audio seconds per wall second, speed against faster-whisper int8, WER against the references,
how many files have the same text as our ``--batch-size 1``, and peak RSS. Writes JSON and Markdown
(``--out``) and a plot of throughput against batch size.

``--long FILE``: one long recording (its transcript beside it, FILE.txt, as python -m tools.data long
writes it) instead: faster-whisper window after window and its ``BatchedInferencePipeline`` (VAD
chunks side by side) at each batch size, both with the long silences left out first (its
``vad_filter``, our ``--vad-filter``), our sequential ``transcribe`` and our ``--vad-chunks`` at
each batch size; greedy everywhere (faster-whisper's own default is beam 5), fallback on.
"""

from __future__ import annotations

import argparse
import csv
import json
import re
import resource
import subprocess
import time
from pathlib import Path
from typing import Dict, List

from tools import ROOT, module_command, module_env

REAL = ROOT / "data" / "real" / "real.csv"


def archive(csv_path: Path, n_files: int) -> List[dict]:
    """The ``n_files`` longest recordings (ties by name): the ones where decoding, not loading, costs."""
    rows = list(csv.DictReader(open(csv_path, newline="", encoding="utf-8")))
    rows.sort(key=lambda r: (-float(r["seconds"]), r["audio"]))
    return [dict(r, path=str(csv_path.parent / r["audio"])) for r in rows[:n_files]]


def worker(args) -> None:
    """One system in this process: print {"seconds", "load_seconds", "texts", "peak_rss_mb"} as JSON."""
    import torch

    torch.set_num_threads(args.threads)
    paths = json.loads(Path(args.files_json).read_text())
    began = time.perf_counter()
    if args.worker.startswith("faster-whisper"):
        from faster_whisper import WhisperModel

        from medusa_whisper.checkpoints import weights

        model = WhisperModel(str(weights.ctranslate2_dir(args.model)), device="cpu", compute_type=args.compute_type,
                             cpu_threads=args.threads)
        loaded = time.perf_counter()
        texts = []
        if args.batch_size > 1:  # its batched pipeline: VAD chunks side by side
            from faster_whisper import BatchedInferencePipeline

            model = BatchedInferencePipeline(model)
        for path in paths:  # faster-whisper's own defaults but greedy, as ours (its default is beam 5)
            if args.batch_size > 1:
                segments, _ = model.transcribe(path, language="en", beam_size=1, best_of=5, batch_size=args.batch_size)
            else:
                segments, _ = model.transcribe(path, language="en", beam_size=1, best_of=5,
                                               vad_filter=args.worker == "faster-whisper-vad-filter")
            texts.append("".join(s.text for s in segments))
    else:
        import medusa_whisper

        model = medusa_whisper.load_model(args.model, device="cpu", compute_type=args.compute_type)
        if args.batch_size == 0:  # the command line's default for several files, measured here once per machine
            from medusa_whisper.decoding.batches import default_batch_size
            args.batch_size = default_batch_size(model) if args.compute_type == "int8" else 1
        loaded = time.perf_counter()
        if args.worker == "ours-vad":
            results = [medusa_whisper.transcribe(model, path, vad_chunks=True, batch_size=args.batch_size, language="en",
                                                 fp16=False, mode="off") for path in paths]
        elif args.worker == "ours-vad-filter":
            results = [medusa_whisper.transcribe(model, path, vad_filter=True, language="en", fp16=False, mode="off")
                       for path in paths]
        else:
            results = medusa_whisper.transcribe(model, paths, batch_size=args.batch_size, language="en", fp16=False,
                                                mode="off")
        texts = [r["text"] if r is not None else "" for r in results]
    done = time.perf_counter()
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    print(json.dumps(dict(seconds=done - loaded, load_seconds=loaded - began, texts=texts, peak_rss_mb=peak,
                          batch_size=args.batch_size)))


def run_system(args, worker_name: str, batch_size: int, files_json: Path) -> dict:
    command = module_command("tools.bench.batch", "--worker", worker_name, "--files-json", files_json, "--model",
                             args.model, "--compute-type", args.compute_type, "--threads", args.threads,
                             "--batch-size", batch_size)
    out = subprocess.run(command, check=True, capture_output=True, text=True, env=module_env()).stdout
    return json.loads(out.strip().splitlines()[-1])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="base")
    parser.add_argument("--compute-type", default="int8")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--files", type=int, default=64)
    parser.add_argument("--batch-sizes", default="default,1,4,8,16",
                        help="comma-separated; 'default': the size the command line picks on this machine")
    parser.add_argument("--csv", type=Path, default=REAL)
    parser.add_argument("--long", type=Path, default=None, metavar="FILE",
                        help="one long recording (with FILE.txt) instead of the archive")
    parser.add_argument("--out", type=Path, default=None, help="write <out>.json, <out>.md and <out>.png")
    # faster-whisper, faster-whisper-vad-filter, ours, ours-vad, ours-vad-filter
    parser.add_argument("--worker", default=None, help=argparse.SUPPRESS)
    parser.add_argument("--files-json", default=None, help=argparse.SUPPRESS)
    parser.add_argument("--batch-size", type=int, default=1, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.worker:
        worker(args)
        return

    from medusa_whisper.evaluation import corpus_scores, normalizer
    from medusa_whisper.step.routes import isa_features, machine_id

    if args.long is not None:
        import soundfile

        rows = [dict(path=str(args.long), seconds=soundfile.info(str(args.long)).duration,
                     sentence=args.long.with_suffix(".txt").read_text(encoding="utf-8"))]
        args.files = 1
    else:
        rows = archive(args.csv, args.files)
    audio_seconds = sum(float(r["seconds"]) for r in rows)
    files_json = Path("/tmp") / f"bench_batch_{args.files}.json"
    files_json.write_text(json.dumps([r["path"] for r in rows]))
    normal = normalizer("en")
    references = [normal(r["sentence"]) for r in rows]
    machine = {**machine_id(), "isa": isa_features()}
    print(f"{machine['cpu']} ({machine['isa']}), {args.threads} threads, {args.model} {args.compute_type}, "
          f"{len(rows)} real recordings, {audio_seconds / 60:.1f} min", flush=True)

    systems: Dict[str, dict] = {}
    sizes = [0 if b == "default" else int(b) for b in args.batch_sizes.split(",")]

    def run(name: str, worker_name: str, batch: int) -> None:
        systems[name] = run_system(args, worker_name, batch, files_json)
        print(f"{name}: {systems[name]['seconds']:.1f} s", flush=True)

    if args.long is None:
        run(f"faster-whisper {args.compute_type}, one by one", "faster-whisper", 1)
        for batch in sizes:
            if batch == 0:
                name = f"medusa-whisper {args.compute_type}, default batch"
                run(name, "ours", 0)
                chosen = systems.pop(name)  # named with the size the worker measured and chose
                systems[f"{name} ({chosen['batch_size']})"] = chosen
            else:
                run(f"medusa-whisper {args.compute_type}, --batch-size {batch}", "ours", batch)
    else:
        run(f"faster-whisper {args.compute_type}, window after window", "faster-whisper", 1)
        for batch in [b for b in sizes if b > 1]:  # ('default' is the command line's for several files)
            run(f"faster-whisper {args.compute_type} BatchedInferencePipeline, batch_size {batch}", "faster-whisper",
                batch)
        run(f"faster-whisper {args.compute_type}, window after window, vad_filter", "faster-whisper-vad-filter", 1)
        run(f"medusa-whisper {args.compute_type}, --batch-size 1", "ours", 1)
        run(f"medusa-whisper {args.compute_type}, --vad-filter", "ours-vad-filter", 1)
        for batch in [b for b in sizes if b > 0]:
            run(f"medusa-whisper {args.compute_type}, --vad-chunks --batch-size {batch}", "ours-vad", batch)
    ours_one = next((s for name, s in systems.items() if name.endswith("--batch-size 1")), None)
    fw = next(iter(systems.values()))
    table = []
    for name, s in systems.items():
        scores = corpus_scores(references, [normal(t) for t in s["texts"]])
        same = sum(a == b for a, b in zip(s["texts"], ours_one["texts"])) if ours_one else None
        table.append(dict(system=name, seconds=round(s["seconds"], 2), load_seconds=round(s["load_seconds"], 2),
                          audio_per_second=round(audio_seconds / s["seconds"], 2),
                          vs_faster_whisper=round(fw["seconds"] / s["seconds"], 2), wer=round(100 * scores["wer"], 2),
                          same_text_as_batch_1=same, peak_rss_mb=round(s["peak_rss_mb"])))
    what = (f"`{args.long.name}` ({audio_seconds / 60:.1f} min)" if args.long else
            f"{len(rows)} real recordings ({audio_seconds / 60:.1f} min)")
    lines = [f"{machine['cpu']} ({machine['isa']}), {args.threads} threads, {args.model} {args.compute_type}, "
             f"{what}; model load excluded", "",
             "| system | seconds | audio s per s | vs faster-whisper | WER % | same text as batch 1 | peak RSS MB |",
             "|---|---|---|---|---|---|---|"]
    for t in table:
        same = "-" if t["same_text_as_batch_1"] is None else f"{t['same_text_as_batch_1']}/{len(rows)}"
        lines.append(f"| {t['system']} | {t['seconds']} | {t['audio_per_second']} | {t['vs_faster_whisper']}x | "
                     f"{t['wer']} | {same} | {t['peak_rss_mb']} |")
    # what the workers measured and chose on this machine (kernel routes, batch sizes), read back from
    # the cache they share: the thread count is part of the key
    import torch

    from medusa_whisper.decoding.batches import measured_choices
    torch.set_num_threads(args.threads)
    choices = measured_choices()
    lines += [""] + choices
    print("\n".join(lines))
    if args.out:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.with_suffix(".json").write_text(json.dumps(dict(machine=machine, rows=table, choices=choices),
                                                            indent=1) + "\n")
        args.out.with_suffix(".md").write_text("\n".join(lines) + "\n")
        try:
            import matplotlib

            matplotlib.use("Agg")
            import matplotlib.pyplot as plt
        except ImportError:
            return
        fig, ax = plt.subplots(figsize=(6, 4))
        for label, kind in (("medusa-whisper --vad-chunks" if args.long else "medusa-whisper", "medusa-whisper"),
                            ("faster-whisper BatchedInferencePipeline", "BatchedInferencePipeline")):
            points = [t for t in table if kind in t["system"] and (not args.long or "batch_size" in t["system"]
                                                                    or "--vad-chunks" in t["system"])]
            # the batch size is the name's last number ("--batch-size 8", "default batch (16)")
            points = sorted(points, key=lambda t: int(re.findall(r"\d+", t["system"])[-1]))
            if points:
                ax.plot([int(re.findall(r"\d+", t["system"])[-1]) for t in points],
                        [t["audio_per_second"] for t in points], marker="o", label=label)
        ax.axhline(table[0]["audio_per_second"], color="gray", linestyle="--", label=table[0]["system"])
        if args.long:
            sequential = next(t for t in table if t["system"].endswith("--batch-size 1"))
            ax.axhline(sequential["audio_per_second"], color="tab:blue", linestyle=":",
                       label=f"medusa-whisper {args.compute_type}, sequential")
        ax.set_xscale("log", base=2)
        ax.set_xlabel("batch size (chunks side by side)" if args.long else "batch size (files side by side)")
        ax.set_ylabel("audio seconds per wall second")
        ax.set_title(f"{args.model} {args.compute_type}, {args.threads} threads, "
                     + (args.long.name if args.long else f"{len(rows)} real recordings"))
        ax.legend()
        fig.tight_layout()
        fig.savefig(args.out.with_suffix(".png"), dpi=120)


if __name__ == "__main__":
    main()
