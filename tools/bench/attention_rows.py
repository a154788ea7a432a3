"""The decoder's row-invariant attention over k query rows, by implementation, for one layer.

    python -m tools.bench attention-rows --threads 2

Cross-attention of one base layer (8 heads of 64, 1,500 audio positions) and self-attention over
a 448-slot cache with 64 slots seen, keys and values in bfloat16 as the int8 decoder keeps them:
microseconds at 1, 2, 4, 6, 9 and 16 rows (median, ``routes.median_micros``), for

- ``native``: the package's own kernel (``step.native.attend``, where ``make setup`` built it);
- ``batched products``: the batched bfloat16 products ``attention.invariant_attention`` runs where
  it is not built, in products of at most ``product_rows`` rows.
"""

from __future__ import annotations

import argparse

import torch

from medusa_whisper.step import attention, native
from medusa_whisper.step.routes import median_micros

ROWS = (1, 2, 4, 6, 9, 16)
N_HEAD, D_HEAD = 8, 64


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--threads", type=int, default=2)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    generator = torch.Generator().manual_seed(0)
    cases = {"cross 1500": (1500, None), "self 448 (64 seen)": (448, 64)}
    print(f"{args.threads} threads, {N_HEAD} heads of {D_HEAD}, bfloat16 keys and values; us at {ROWS} rows")
    for case, (n_key, seen) in cases.items():
        k = torch.randn(1, N_HEAD, n_key, D_HEAD, generator=generator).bfloat16()
        v = torch.randn(1, N_HEAD, n_key, D_HEAD, generator=generator).bfloat16()
        line = {}
        for rows in ROWS:
            q = torch.randn(1, rows, N_HEAD * D_HEAD, generator=generator)
            allowed = None
            if seen is not None:
                allowed = torch.zeros(rows, n_key, dtype=torch.bool)
                for row in range(rows):
                    allowed[row, :seen + row + 1] = True
            found = {}
            if native.available():
                found["native"] = median_micros(lambda: native.attend(q, k, v, N_HEAD, allowed))
            built = native.kernels
            native.kernels = lambda: None  # the path taken where the package's kernels are not built
            try:
                found["batched products"] = median_micros(
                    lambda: attention.invariant_attention(q, k, v, N_HEAD, allowed, slots=n_key))
            finally:
                native.kernels = built
            line[rows] = found
        for name in line[ROWS[0]]:
            print(f"{case}, {name}: " + " / ".join(f"{line[r][name]:.0f}" for r in ROWS), flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
