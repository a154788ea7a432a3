"""Lossless against typical acceptance for one model's proposer, on real recordings: tokens per pass,
decoder seconds, WER (jiwer over the set, whisper's English normaliser) and the texts that changed.

Typical acceptance (the paper's eq. 3) also keeps proposed tokens the verifier finds plausible, so
it can only buy speed by writing other text than greedy decoding; this measures both sides on the
recordings `make bench` uses (held out from training), each setting on the same encoder output.

    python -m tools.bench typical --model base-eagle --clips 30 --threads 1 --draft-tokens 3 5
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

import jiwer
import torch
import whisper
from whisper.normalizers import EnglishTextNormalizer

import medusa_whisper
from medusa_whisper.audio.files import load_audio
from tools import ROOT


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", default="base-eagle")
    parser.add_argument("--compute-type", default="float32")
    parser.add_argument("--real", type=Path, default=ROOT / "data" / "real" / "real.csv")
    parser.add_argument("--clips", type=int, default=30)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--draft-tokens", type=int, nargs="+", default=[3, 5],
                        help="chain lengths for a draft head (ignored by Medusa heads)")
    parser.add_argument("--out", type=Path, default=None, help="also write OUT.json and OUT.md")
    args = parser.parse_args()
    from tools.bench.run import _real_records

    torch.set_num_threads(args.threads)
    model = medusa_whisper.load_model(args.model, device="cpu", compute_type=args.compute_type)
    records = _real_records(args.real, args.clips)
    normalise = EnglishTextNormalizer()
    references = [normalise(r["sentence"]) for r in records]
    with torch.no_grad():
        features = [model.embed_audio(whisper.log_mel_spectrogram(
            whisper.pad_or_trim(torch.from_numpy(load_audio(r["audio"]))), model.dims.n_mels)[None])[0]
            for r in records]
    rows = []
    for draft_tokens in args.draft_tokens:
        lossless_texts = None
        for mode in ("lossless", "typical"):
            texts, steps, tokens, seconds = [], 0, 0, 0.0
            with torch.no_grad():
                for f in features:
                    began = time.perf_counter()
                    result = medusa_whisper.decode(model, f, language="en", fp16=False, without_timestamps=True,
                                                   mode=mode, draft_tokens=draft_tokens)
                    seconds += time.perf_counter() - began
                    texts.append(result.text)
                    steps += result.decoder_steps
                    tokens += result.tokens_produced
            lossless_texts = lossless_texts or texts
            rows.append(dict(mode=mode, draft_tokens=draft_tokens, tokens_per_pass=round(tokens / steps, 3),
                             decoder_seconds=round(seconds, 2),
                             wer=round(100 * jiwer.wer(references, [normalise(t) for t in texts]), 2),
                             same_text_as_lossless=sum(a == b for a, b in zip(texts, lossless_texts))))
    lines = [f"`{args.model}` at {args.compute_type}, {len(records)} real recordings, {args.threads} thread(s), "
             "decoder only, without timestamps", "",
             "| mode | draft tokens | tokens per pass | decoder s | WER | same text as lossless |", "|---|---|---|---|---|---|"]
    lines += [f"| {r['mode']} | {r['draft_tokens']} | {r['tokens_per_pass']:.3f} | {r['decoder_seconds']:.2f} | "
              f"{r['wer']:.2f} % | {r['same_text_as_lossless']}/{len(records)} |" for r in rows]
    text = "\n".join(lines)
    print(text)
    if args.out is not None:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        Path(f"{args.out}.json").write_text(json.dumps(dict(model=args.model, compute_type=args.compute_type,
                                                            clips=len(records), threads=args.threads, rows=rows),
                                                       indent=1) + "\n")
        Path(f"{args.out}.md").write_text(text + "\n")


if __name__ == "__main__":
    main()
