"""The int8 vocabulary projection's kernels on this CPU: what each costs, and what each decodes.

    python -m tools.bench vocab-kernels --model base --threads 2 --utterances 120 --out docs/bench/cpu_kinds/vocab_kernels_avx2epyc

For each kernel of ``Int8Projection`` that runs here ("rowwise": oneDNN, "dynamic": fbgemm,
"weight_only": ``_weight_int8pack_mm``), the milliseconds of one projection of 1 and of 8 rows
(median, kernels interleaved), and base int8 ``--mode off`` greedy decoding of the first N
utterances of the held-out synthetic corpus (voices and texts training never saw; whisper's English
normaliser) with the projection set to that kernel: corpus WER, WER without the utterances where
some kernel ran into a repetition loop (more than twice the reference's words, which one flipped
token can start and which then outweighs every other utterance), and how many utterances decode
to the same text as the kernel the machine chose. Writes OUT.json and OUT.md.
"""

from __future__ import annotations

import argparse
import csv
import json
import statistics
import time
from pathlib import Path
from typing import Dict, List

import torch
import whisper
from tqdm import tqdm

import medusa_whisper
from medusa_whisper.audio.files import load_audio
from medusa_whisper.evaluation import corpus_scores, normalizer
from medusa_whisper.step.projection import Int8Projection
from medusa_whisper.step.routes import isa_features, machine_id
from tools import ROOT

HELDOUT = ROOT / "data" / "corpus" / "heldout.csv"


def looping(reference: str, hypothesis: str) -> bool:
    """A repetition loop: more than twice the reference's words."""
    return len(hypothesis.split()) > 2 * max(len(reference.split()), 1)


def time_kernels(projection: Int8Projection, kernels: List[str], reps: int) -> Dict[str, Dict[str, float]]:
    """ms of one projection of 1 and 8 rows per kernel, medians of interleaved repetitions."""
    n_state = projection.qweight.shape[1]
    inputs = {1: torch.randn(1, n_state), 8: torch.randn(8, n_state)}
    chosen = projection.kernel
    times = {k: {rows: [] for rows in inputs} for k in kernels}
    for rep in range(reps + 1):
        for kernel in kernels:
            projection.kernel = kernel
            for rows, x in inputs.items():
                began = time.perf_counter()
                projection(x)
                if rep:  # the first round makes each kernel's forms
                    times[kernel][rows].append((time.perf_counter() - began) * 1e3)
    projection.kernel = chosen
    return {k: {f"{rows} rows ms": round(statistics.median(t), 3) for rows, t in by_rows.items()}
            for k, by_rows in times.items()}


def decode_all(model, projection: Int8Projection, kernels: List[str], rows: List[dict]) -> Dict[str, List[str]]:
    """Normalised greedy texts of every utterance, per kernel (each utterance's encoder output once)."""
    norm = normalizer("en")
    chosen = projection.kernel
    texts = {k: [] for k in kernels}
    for row in tqdm(rows, desc="utterances", unit="utt"):
        mel = whisper.log_mel_spectrogram(whisper.pad_or_trim(torch.from_numpy(load_audio(HELDOUT.parent / row["audio"]))),
                                          model.dims.n_mels)[None]
        with torch.no_grad():
            features = model.embed_audio(mel)[0]
        for kernel in kernels:
            projection.kernel = kernel
            result = medusa_whisper.decode(model, features, language="en", fp16=False, without_timestamps=True,
                                           mode="off")
            texts[kernel].append(norm(result.text))
    projection.kernel = chosen
    return texts


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="base")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--utterances", type=int, default=120, help="the first N of the held-out corpus")
    parser.add_argument("--reps", type=int, default=30)
    parser.add_argument("--out", type=Path, required=True, help="writes OUT.json and OUT.md")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    if not HELDOUT.is_file():
        raise SystemExit(f"vocab-kernels: {HELDOUT}: no held-out corpus (make bench-setup makes it)")
    with open(HELDOUT, newline="", encoding="utf-8") as f:
        rows = [r for r in csv.DictReader(f) if r.get("language", "en") == "en"][:args.utterances]
    model = medusa_whisper.load_model(args.model, device="cpu", compute_type="int8")
    projection = model.decoder.token_projection
    chosen = projection.choose_kernel()
    kernels = projection.kernels_here()
    timing = time_kernels(projection, kernels, args.reps)
    texts = decode_all(model, projection, kernels, rows)
    norm = normalizer("en")
    references = [norm(r["sentence"]) for r in rows]
    loops = {i for k in kernels for i, (ref, hyp) in enumerate(zip(references, texts[k])) if looping(ref, hyp)}
    kept = [i for i in range(len(rows)) if i not in loops]
    results = {}
    for k in kernels:
        results[k] = dict(timing[k], wer=round(corpus_scores(references, texts[k])["wer"] * 100, 2),
                          wer_without_loops=round(corpus_scores([references[i] for i in kept],
                                                                [texts[k][i] for i in kept])["wer"] * 100, 2),
                          loops=sum(map(looping, references, texts[k])),
                          same_text_as_chosen=sum(a == b for a, b in zip(texts[k], texts[chosen])))
    info = dict(model=args.model, threads=args.threads, utterances=len(rows), chosen=chosen, machine=f"{machine_id()['cpu']} ({isa_features()})",
                torch=torch.__version__, looping_utterances=sorted(loops))
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.with_suffix(".json").write_text(json.dumps(dict(info=info, kernels=results), indent=1))
    lines = [f"{args.model} int8, {args.threads} threads, {info['machine']}, torch {torch.__version__}; "
             f"{len(rows)} held-out utterances, greedy `--mode off`; chosen here: {chosen}", "",
             "| kernel | 1 row ms | 8 rows ms | WER % | WER % without the loops | utterances looping | same text as chosen |",
             "|---|---|---|---|---|---|---|"]
    for k, r in results.items():
        lines.append(f"| {k} | {r['1 rows ms']} | {r['8 rows ms']} | {r['wer']} | {r['wer_without_loops']} "
                     f"| {r['loops']} | {r['same_text_as_chosen']}/{len(rows)} |")
    args.out.with_suffix(".md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))


if __name__ == "__main__":
    main()
