"""Is one system's WER really lower than another's? Paired bootstrap over the same recordings.

A WER gap of a point on 20 or 40 clips is a handful of words; whether it says anything about the
systems depends on how it is spread over the clips. This tool scores every system on the same rows,
then resamples the rows (with replacement, 2,000 times by default) and reports, per system, the
corpus WER with its 95 % interval, and for each system against the first one, the WER difference
with its 95 % interval and the share of resamples in which the first system is no better.

Systems are eval outputs of this project (``medusa-whisper eval ... --out PREFIX`` writes
PREFIX.csv with the normalised reference and hypothesis of every row) and, optionally,
faster-whisper run here on the same CSV (greedy, temperature 0, no VAD, no timestamps, no
conditioning, and none of its fallback thresholds: what ``make bench`` runs), with whisper's
English text normaliser, as ``eval`` scores.

    python -m tools.bench wer --data data/real/real.csv --model base \\
        --ours "int8=/tmp/wer/ours_int8.csv" --ours "float32=/tmp/wer/ours_fp32.csv" \\
        --faster-whisper int8 --faster-whisper float32 --out docs/compute/wer_real_base
"""

from __future__ import annotations

import argparse
import csv
import json
import sys
from pathlib import Path
from typing import Dict, Tuple

import jiwer
import numpy as np
from tqdm import tqdm


def read_ours(path: Path) -> Dict[str, Tuple[str, str]]:
    """audio -> (normalised reference, normalised hypothesis) from an eval CSV."""
    try:
        with open(path, newline="", encoding="utf-8") as f:
            return {r["audio"]: (r["reference_normalized"], r["hypothesis_normalized"]) for r in csv.DictReader(f)}
    except OSError as e:
        raise SystemExit(f"wer_compare: {path}: {e.strerror}")
    except KeyError as e:
        raise SystemExit(f"wer_compare: {path}: no column {e} (want the CSV that medusa-whisper eval --out writes)")


def run_faster_whisper(data: Path, model: str, compute_type: str, threads: int) -> Dict[str, Tuple[str, str]]:
    """audio -> (normalised reference, normalised hypothesis) from make bench's faster-whisper system."""
    from whisper.normalizers import EnglishTextNormalizer

    from medusa_whisper.checkpoints import weights
    from medusa_whisper.audio.files import load_audio
    from medusa_whisper.evaluation import read_eval_csv
    from tools.bench.systems import faster_whisper_system

    normalise = EnglishTextNormalizer()
    rows, problems = read_eval_csv(data)
    for problem in problems:
        print(problem, file=sys.stderr)
    system = faster_whisper_system(f"faster-whisper {compute_type}", weights.ctranslate2_dir(model), compute_type,
                                   threads, "cpu")
    if system.run is None:
        raise SystemExit(f"wer_compare: faster-whisper {system.note}")
    return {str(row.audio): (normalise(row.sentence), normalise(system.run(load_audio(row.audio)).text))
            for row in tqdm(rows, desc=f"faster-whisper {compute_type}", unit="file")}


def errors(reference: str, hypothesis: str) -> Tuple[int, int]:
    """(word errors, reference words); a reference that normalises to nothing is not scored."""
    if not reference.strip():
        return 0, 0
    m = jiwer.process_words(reference, hypothesis)
    return m.substitutions + m.deletions + m.insertions, len(reference.split())


def compare(systems: Dict[str, Dict[str, Tuple[str, str]]], resamples: int, seed: int) -> Dict:
    names = list(systems)
    keys = sorted(set.intersection(*(set(s) for s in systems.values())))
    if not keys:
        raise SystemExit("the systems share no rows")
    refs = {k: systems[names[0]][k][0] for k in keys}
    for name in names[1:]:
        differing = [k for k in keys if systems[name][k][0] != refs[k]]
        if differing:
            raise SystemExit(f"{name}: other references than {names[0]} for {len(differing)} rows, e.g. {differing[0]}")
    e = np.array([[errors(refs[k], systems[n][k][1])[0] for k in keys] for n in names], dtype=float)
    w = np.array([errors(refs[k], "")[1] for k in keys], dtype=float)
    rng = np.random.default_rng(seed)
    picks = rng.integers(0, len(keys), size=(resamples, len(keys)))
    words = w[picks].sum(axis=1)
    wer = e[:, picks].sum(axis=2) / words  # (systems, resamples)
    result = dict(rows=len(keys), words=int(w.sum()), resamples=resamples, systems={})
    for i, name in enumerate(names):
        entry = dict(wer=float(e[i].sum() / w.sum()), ci95=[float(x) for x in np.percentile(wer[i], [2.5, 97.5])],
                     same_text_as_first=float(np.mean([systems[name][k][1] == systems[names[0]][k][1] for k in keys])))
        if i:
            diff = wer[i] - wer[0]
            entry["minus_first"] = float(e[i].sum() / w.sum() - e[0].sum() / w.sum())
            entry["minus_first_ci95"] = [float(x) for x in np.percentile(diff, [2.5, 97.5])]
            entry["share_first_no_better"] = float(np.mean(diff <= 0))  # first WER >= this one
            entry["rows_differing_from_first"] = int((e[i] != e[0]).sum())
        result["systems"][name] = entry
    return result


def markdown(result: Dict, title: str) -> str:
    names = list(result["systems"])
    lines = [title, "",
             f"{result['rows']} recordings, {result['words']} reference words; {result['resamples']} paired "
             "bootstrap resamples of the recordings.", "",
             f"| system | WER | 95 % interval | minus {names[0]} | 95 % interval of the difference | "
             f"resamples where {names[0]} is no better | rows scored differently | same text as {names[0]} |",
             "|---|---|---|---|---|---|---|---|"]
    for name in names:
        s = result["systems"][name]
        lo, hi = s["ci95"]
        if "minus_first" in s:
            dlo, dhi = s["minus_first_ci95"]
            rest = (f"{100 * s['minus_first']:+.2f} | {100 * dlo:+.2f} to {100 * dhi:+.2f} | "
                    f"{100 * s['share_first_no_better']:.1f} % | {s['rows_differing_from_first']} | "
                    f"{100 * s['same_text_as_first']:.0f} %")
        else:
            rest = "  |  |  |  | 100 %"
        lines.append(f"| {name} | {100 * s['wer']:.2f} % | {100 * lo:.2f}-{100 * hi:.2f} % | {rest} |")
    return "\n".join(lines) + "\n"


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--data", type=Path, required=True, help="the CSV every system was run on")
    p.add_argument("--model", default="base", help="faster-whisper's model (CTranslate2 files of this name)")
    p.add_argument("--ours", action="append", default=[], metavar="NAME=EVAL_CSV",
                   help="an eval output of this project; the first system given is the one compared against")
    p.add_argument("--faster-whisper", action="append", default=[], metavar="COMPUTE_TYPE")
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--resamples", type=int, default=2000)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--out", type=Path, required=True, help="writes OUT.md and OUT.json")
    args = p.parse_args()
    systems: Dict[str, Dict[str, Tuple[str, str]]] = {}
    for spec in args.ours:
        name, _, path = spec.partition("=")
        systems[f"medusa_whisper {name}"] = read_ours(Path(path))
    for compute_type in args.faster_whisper:
        systems[f"faster-whisper {compute_type}"] = run_faster_whisper(args.data, args.model, compute_type, args.threads)
    if len(systems) < 2:
        raise SystemExit("wer_compare: give at least two systems (--ours NAME=CSV, --faster-whisper TYPE)")
    result = compare(systems, args.resamples, args.seed)
    result.update(data=str(args.data), model=args.model)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    Path(f"{args.out}.json").write_text(json.dumps(result, indent=1) + "\n")
    text = markdown(result, f"# WER of `{args.model}` on `{args.data}`")
    Path(f"{args.out}.md").write_text(text)
    print(text)


if __name__ == "__main__":
    main()
