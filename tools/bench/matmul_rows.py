"""How to multiply a decoder step's few rows by a weight matrix on this CPU: x @ W.T or W @ x.T?

A decoder pass multiplies 1 row (plain decoding) or a few (verification) by every weight of the
model, and the weights do not fit in the cache: the pass streams them from memory. This times,
per layer shape of the named model and for 1-16 rows, the median of:
- whisper's ``F.linear(x, W, b)`` (x @ W.T),
- ``b + W @ x.T`` (routes.weight_times_rows, one row multiplied as two),
with enough distinct copies of each weight (about 200 MB) that they come from memory, as in a pass.

    python -m tools.bench rows --model base --threads 2
"""

from __future__ import annotations

import argparse
import time

import torch
import torch.nn.functional as F

from medusa_whisper.step.routes import weight_times_rows

DIMS = {"tiny.en": (384, 51864), "base": (512, 51865), "small": (768, 51865)}


def median_us(fn, copies: int, reps: int = 7) -> float:
    fn()
    times = []
    for _ in range(reps):
        began = time.perf_counter()
        fn()
        times.append(time.perf_counter() - began)
    return sorted(times)[len(times) // 2] * 1e6 / copies


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--model", choices=sorted(DIMS), default="base")
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--rows", type=int, nargs="+", default=[1, 2, 3, 4, 6, 8, 16])
    args = p.parse_args()
    torch.set_num_threads(args.threads)
    d, vocab = DIMS[args.model]
    print(f"{args.model}, {args.threads} threads: microseconds per product (weights from memory)")
    print("| weight (out x in) | rows | x @ W.T (whisper) | W @ x.T (weight_times_rows) |")
    print("|---|---|---|---|")
    for out_features, in_features in ((d, d), (4 * d, d), (d, 4 * d), (vocab, d)):
        copies = max(2, int(200e6 // (out_features * in_features * 4)))
        weights = [torch.randn(out_features, in_features) for _ in range(copies)]
        biases = [torch.randn(out_features) for _ in range(copies)]
        for n in args.rows:
            x = torch.randn(n, in_features)
            ours = median_us(lambda: [weight_times_rows(w, b, x) for w, b in zip(weights, biases)], copies)
            theirs = median_us(lambda: [F.linear(x, w, b) for w, b in zip(weights, biases)], copies)
            print(f"| {out_features} x {in_features} | {n} | {theirs:.0f} | {ours:.0f} |", flush=True)
        del weights, biases


if __name__ == "__main__":
    main()
