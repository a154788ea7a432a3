"""Held-out figures of trained heads, measured through ``medusa_whisper.decode``.

For each held-out window (utterances of one held-out voice packed to 20-28 s, as in training,
but from the held-out split that training never sees) this decodes with whisper.decode greedy and
with Medusa decoding for each requested number of heads and mode, interleaved, and reports:
tokens per decoder step, per-head acceptance, identical-output share and the decoder-time ratio
against whisper.decode (median over windows of per-window ratios, with the 10-90 % spread).

    python -m tools.bench heads --model tiny.en-medusa --data data/corpus/heldout.csv \\
        --heads 1 2 3 4 5 10 --modes lossless typical --out bench_out/heads_tiny.en-medusa
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from dataclasses import replace
from pathlib import Path

import numpy as np
import torch
import whisper
from tqdm import tqdm

import medusa_whisper
from medusa_whisper.training import windows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", required=True)
    parser.add_argument("--data", type=Path, required=True, help="held-out CSV (audio, sentence, language, voice)")
    parser.add_argument("--heads", type=int, nargs="+", default=None, help="numbers of heads to try (default: all)")
    parser.add_argument("--modes", nargs="+", default=["lossless"], choices=["lossless", "typical", "off"],
                        help="off: our decoder without heads, to separate the implementation's gain from the heads'")
    parser.add_argument("--windows", type=int, default=40, help="held-out windows to decode (default 40)")
    parser.add_argument("--window-seconds", type=float, nargs=2, default=(20.0, 28.0))
    parser.add_argument("--timestamps", action="store_true", help="decode with timestamp tokens")
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--proposal-vocab", type=int, default=None,
                        help="override the heads' proposal vocabulary (first N token ids + specials; 0 = all)")
    parser.add_argument("--out", type=Path, required=True, help="writes OUT.json, OUT.md (OUT may contain dots: model names do)")
    args = parser.parse_args()

    torch.set_num_threads(args.threads)
    model = medusa_whisper.load_model(args.model, device="cpu")
    if args.proposal_vocab is not None:
        model.medusa.config = replace(model.medusa.config, proposal_vocab=args.proposal_vocab)
    heads = args.heads or [model.num_heads]
    packed = windows.pack(windows.read_csv(args.data), seed=args.seed, min_seconds=args.window_seconds[0],
                          max_seconds=args.window_seconds[1])[: args.windows]
    common = dict(language=packed[0].language, fp16=False, without_timestamps=not args.timestamps)
    systems = [(mode, k) for mode in args.modes for k in ([0] if mode == "off" else heads)]  # off: no heads

    rows = {s: dict(tokens=0, steps=0, accepted=np.zeros(max(heads)), same=0, ratios=[], seconds=0.0) for s in systems}
    vanilla_seconds = 0.0
    with torch.no_grad():  # warm-up, not counted: first calls pay for allocation and dispatch caches
        warm = model.embed_audio(torch.zeros(1, model.dims.n_mels, 3000))[0]
        whisper.decode(model, warm, whisper.DecodingOptions(**common))
        medusa_whisper.decode(model, warm, **common)
    for w in tqdm(packed, desc=args.model, unit="window"):
        mel = whisper.log_mel_spectrogram(whisper.pad_or_trim(torch.from_numpy(windows.render(w))), model.dims.n_mels)
        with torch.no_grad():
            features = model.embed_audio(mel[None])  # the encoder once: only decoding is compared
        began = time.perf_counter()
        vanilla = whisper.decode(model, features[0], whisper.DecodingOptions(**common))
        v_seconds = time.perf_counter() - began
        vanilla_seconds += v_seconds
        for mode, k in systems:
            began = time.perf_counter()
            r = medusa_whisper.decode(model, features[0], mode=mode, num_heads=k, **common)
            seconds = time.perf_counter() - began  # the whole call, timed as whisper.decode's is
            row = rows[(mode, k)]
            row["tokens"] += r.tokens_produced
            row["steps"] += r.decoder_steps
            row["accepted"][: len(r.accepted_per_head)] += r.accepted_per_head
            row["same"] += r.tokens == vanilla.tokens
            row["ratios"].append(seconds / v_seconds)
            row["seconds"] += seconds

    results = []
    for (mode, k), row in rows.items():
        ratios = sorted(row["ratios"])
        results.append(dict(
            mode=mode, heads=k, windows=len(packed), tokens=row["tokens"], steps=row["steps"],
            tokens_per_step=round(row["tokens"] / row["steps"], 3),
            acceptance_per_head=[round(a / row["steps"], 3) for a in row["accepted"][:k]],
            identical_to_vanilla=round(row["same"] / len(packed), 3),
            decoder_time_ratio=round(statistics.median(ratios), 3),
            ratio_spread=[round(ratios[len(ratios) // 10], 3), round(ratios[(len(ratios) * 9) // 10], 3)],
            total_ratio=round(row["seconds"] / vanilla_seconds, 3),
        ))
    info = dict(model=args.model, data=str(args.data), proposal_vocab=model.medusa.config.proposal_vocab, timestamps=args.timestamps, threads=args.threads,
                torch=torch.__version__, vanilla_decode_seconds=round(vanilla_seconds, 2))
    args.out.parent.mkdir(parents=True, exist_ok=True)
    Path(f"{args.out}.json").write_text(json.dumps(dict(info=info, results=results), indent=1))
    lines = [f"{args.model} on {len(packed)} windows of {args.data} ({'with' if args.timestamps else 'without'} "
             f"timestamps), {args.threads} threads; ratio = our decoder time / whisper.decode's (lower is faster)", "",
             "| mode | heads | tokens/step | identical | decoder-time ratio (median, p10-p90) | acceptance per head |",
             "|---|---|---|---|---|---|"]
    for r in results:
        lines.append(f"| {r['mode']} | {r['heads']} | {r['tokens_per_step']:.2f} | {r['identical_to_vanilla']:.0%} | "
                     f"{r['decoder_time_ratio']:.2f} ({r['ratio_spread'][0]:.2f}-{r['ratio_spread'][1]:.2f}) | "
                     f"{' '.join(f'{a:.2f}' for a in r['acceptance_per_head'])} |")
    text = "\n".join(lines)
    Path(f"{args.out}.md").write_text(text + "\n")
    print(text)


if __name__ == "__main__":
    main()
