"""Decoder time of medusa_whisper against whisper.decode greedy, on the same weights, in one run.

Both decoders get the same encoder output (so only decoder time is measured), runs are
interleaved (A, B, A, B, ...) so that drift of the machine hits both alike, and a warm-up round is
not counted. Prints per-mode totals and the ratio ours / whisper's with its spread over rounds.

    python -m tools.bench speed --model tiny.en --mode off --rounds 5
"""

from __future__ import annotations

import argparse
import statistics
import time

import soundfile
import torch
import whisper
from whisper.decoding import DecodingOptions

import medusa_whisper
from medusa_whisper import MedusaConfig
from tools import ROOT

CLIPS = sorted((ROOT / "tests" / "data").glob("*.flac"))


def timed(fn):
    began = time.perf_counter()
    result = fn()
    return result, time.perf_counter() - began


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", default="tiny.en")
    parser.add_argument("--mode", default="off", choices=["off", "lossless", "typical"])
    parser.add_argument("--heads", type=int, default=4, help="fresh untrained heads if the model has none")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--threads", type=int, default=2)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)

    model = medusa_whisper.load_model(args.model, device="cpu")
    if model.num_heads == 0 and args.heads:
        model = medusa_whisper.load_model(args.model, device="cpu", medusa=MedusaConfig(num_heads=args.heads))
    options = DecodingOptions(language="en", without_timestamps=True, fp16=False)
    features = []
    for clip in CLIPS:
        audio, _ = soundfile.read(clip, dtype="float32")
        mel = whisper.log_mel_spectrogram(whisper.pad_or_trim(torch.from_numpy(audio)), model.dims.n_mels)
        with torch.no_grad():
            features.append(model.encoder(mel[None])[0])

    ours_total, theirs_total, ratios = 0.0, 0.0, []
    tokens = steps = 0
    for round_ in range(args.rounds + 1):  # round 0 is the warm-up
        ours_round = theirs_round = 0.0
        for f in features:
            expected, theirs = timed(lambda: whisper.decode(model, f, options))
            result, ours = timed(lambda: medusa_whisper.decode(model, f, options, mode=args.mode))
            if args.mode != "typical":
                assert result.tokens == expected.tokens, "lossless decoding differs from whisper's"
            ours_round += ours
            theirs_round += theirs
            if round_ == 1:
                tokens += result.tokens_produced
                steps += result.decoder_steps
        if round_ > 0:
            ours_total += ours_round
            theirs_total += theirs_round
            ratios.append(ours_round / theirs_round)

    print(f"model {args.model}, mode {args.mode}, heads {model.num_heads}, {len(CLIPS)} clips, "
          f"{args.rounds} rounds, {args.threads} threads, torch {torch.__version__}")
    print(f"whisper.decode greedy : {theirs_total / args.rounds:.3f} s per round")
    print(f"medusa_whisper {args.mode:8s}: {ours_total / args.rounds:.3f} s per round")
    print(f"decoder-time ratio ours/whisper: median {statistics.median(ratios):.3f} "
          f"(min {min(ratios):.3f}, max {max(ratios):.3f})")
    print(f"tokens {tokens}, decoder steps {steps}, tokens per step {tokens / steps:.3f}")


if __name__ == "__main__":
    main()
