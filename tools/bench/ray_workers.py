"""Files per minute and real-time factor of `transcribe --ray` against one process, on the same files.

Runs the real command line, one configuration after the other, on the N longest real recordings
(python -m tools.data real), each into a fresh output folder:
- one process, --threads 2 (what a single machine does without Ray);
- --ray with 1 worker of 1 thread, and with 2 workers of 1 thread (a local Ray on this machine).
Wall time is the whole command (Ray start and model loading included), as a user waits for it.
The outputs of every configuration are compared with the one-process run's, byte for byte.

    python -m tools.bench ray --model base --files 20 --out docs/ray
"""

from __future__ import annotations

import argparse
import csv
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from tools import ROOT

CONFIGS = [
    ("one process, 2 threads", ["--threads", "2"]),
    ("Ray, 1 worker x 1 thread", ["--ray", "--workers", "1", "--threads-per-worker", "1"]),
    ("Ray, 2 workers x 1 thread", ["--ray", "--workers", "2", "--threads-per-worker", "1"]),
]


def longest_files(real_dir: Path, n: int) -> list:
    with open(real_dir / "real.csv", newline="", encoding="utf-8") as f:
        rows = sorted(csv.DictReader(f), key=lambda r: -float(r["seconds"]))[:n]
    return [(str(real_dir / r["audio"]), float(r["seconds"])) for r in rows]


def run(files: list, model: str, extra: list, out: Path) -> float:
    command = [sys.executable, "-m", "medusa_whisper.cli", "transcribe", *files, "--model", model,
               "--output-dir", str(out), "--output-format", "all", "--verbose", "None", *extra]
    began = time.perf_counter()
    done = subprocess.run(command, capture_output=True, text=True, env=dict(os.environ, PYTHONPATH=str(ROOT)))
    seconds = time.perf_counter() - began
    if done.returncode != 0:
        raise SystemExit(f"ray_bench: {' '.join(extra)} failed:\n{done.stderr}")
    return seconds


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--model", default="base")
    p.add_argument("--files", type=int, default=20)
    p.add_argument("--real", type=Path, default=ROOT / "data" / "real")
    p.add_argument("--out", type=Path, default=ROOT / "docs" / "ray")
    args = p.parse_args()

    files = longest_files(args.real, args.files)
    audio_seconds = sum(s for _, s in files)
    paths = [f for f, _ in files]
    work = Path(tempfile.mkdtemp(prefix="ray_bench_"))
    rows, reference = [], None
    try:
        for name, extra in CONFIGS:
            out = work / str(len(rows))
            seconds = run(paths, args.model, extra, out)
            # transcripts and subtitles; the json's log-probabilities depend on the thread count
            written = {q.name: q.read_bytes() for q in out.iterdir() if q.suffix != ".json"}
            if reference is None:
                reference = written
            rows.append(dict(config=name, wall_seconds=round(seconds, 1),
                             files_per_minute=round(60 * len(files) / seconds, 1),
                             real_time_factor=round(seconds / audio_seconds, 3),
                             identical_to_one_process=written == reference))
            print(json.dumps(rows[-1]), flush=True)
    finally:
        shutil.rmtree(work, ignore_errors=True)

    load = os.getloadavg()[0]
    lines = [f"{len(files)} real recordings ({audio_seconds:.0f} s of audio, the longest of data/real), model "
             f"{args.model}, all output formats; wall time of the whole command (start-up and model loading "
             f"included); this 2-core machine, load average {load:.1f} at the end.", "",
             "| configuration | wall s | files per minute | real-time factor | txt/srt/vtt/tsv equal one process's |",
             "|---|---|---|---|---|"]
    lines += [f"| {r['config']} | {r['wall_seconds']} | {r['files_per_minute']} | {r['real_time_factor']} | "
              f"{'yes' if r['identical_to_one_process'] else 'NO'} |" for r in rows]
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / f"ray_{args.model}.md").write_text("\n".join(lines) + "\n")
    (args.out / f"ray_{args.model}.json").write_text(json.dumps(dict(files=len(files), audio_seconds=audio_seconds,
                                                                     load=load, rows=rows), indent=1) + "\n")
    print("\n".join(lines))


if __name__ == "__main__":
    main()
