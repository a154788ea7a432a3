"""Issue 64's first route, measured: what an int8 product over k rows costs against one row, by kernel.

    python -m tools.bench row-products --threads 2 --out bench_out/row_products.json

For base's decoder shapes (and its vocabulary), microseconds of one product over 1, 2, 4, 6 and 9
rows, each kernel timed on weights streamed from memory (a pass's weights do not fit in a cache):

- ``weight_only``: the package's int8 linear today (``torch._weight_int8pack_mm``, bfloat16 rows);
- ``dynamic x rows``: fbgemm's ``quantized::linear_dynamic`` called once per row (its activation
  scale spans the whole input, so the package calls it a row at a time to keep a row's bits its own);
- ``onednn rows``: the package's "rowwise" product (oneDNN's ``qlinear_pointwise`` over rows each
  quantised with its own scale, ``int8_kernels.rowwise_int8_matmul``), what its prompts and the
  "int8 rows" encoder take;
- ``static``: fbgemm's ``quantized::linear_with_input_q_dq_qweight_dq_output_fp32``, each row
  quantised with its own scale in torch and passed as integer values with scale 1.0, the row
  scales and the bias applied after: one call for all rows, row-invariant by construction (integer
  sums are exact), 7-bit rows where the CPU has no VNNI (``vpmaddubsw`` saturates at 16 bits);
- ``native``: the package's own (``step/native/rows.cpp``, where ``make setup`` built it), rows
  quantised as for ``static`` with 8 bits everywhere, every row of a tile sharing one read of the
  weights.

Each kernel's result for every row is also checked against that row computed alone (bit for bit),
and against the int8 weights multiplied in float32 (relative error).
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path
from typing import Callable, Dict, List

import torch

from medusa_whisper.step import native

ROWS = (1, 2, 4, 6, 9)
SHAPES = {"qkv 1536x512": (1536, 512), "out 512x512": (512, 512), "fc1 2048x512": (2048, 512),
          "fc2 512x2048": (512, 2048), "vocabulary 51865x512": (51865, 512)}
STREAM_BYTES = 64 << 20  # weights cycled through per timing, so that they come from memory


def _vnni() -> bool:
    from medusa_whisper.step.kinds import flags

    have = flags().split()
    return "avx512_vnni" in have or "avx_vnni" in have


class Weight:
    """One weight of a shape in every kernel's form."""

    def __init__(self, n_out: int, n_in: int, generator: torch.Generator):
        w = torch.randn(n_out, n_in, generator=generator) / n_in ** 0.5
        self.bias = torch.randn(n_out, generator=generator) * 0.01
        scale = w.abs().amax(dim=1).clamp(min=1e-8) / 127
        self.scale = scale
        self.q = torch.round(w / scale[:, None]).clamp(-127, 127).to(torch.int8)
        qw = torch._make_per_channel_quantized_tensor(self.q, scale.double(), torch.zeros(n_out, dtype=torch.long), 0)
        self.packed = torch.ops.quantized.linear_prepack(qw, None)
        self.packed_bias = torch.ops.quantized.linear_prepack(qw, self.bias)
        self.unit = torch.ones(n_out, dtype=torch.bfloat16)
        self.onednn = torch.ops.onednn.qlinear_prepack(self.q, None)
        self.zero_points = torch.zeros(n_out, dtype=torch.long)
        if native.available():
            self.native = native.pack_int8(self.q)


def weight_only(w: Weight, x: torch.Tensor) -> torch.Tensor:
    return torch._weight_int8pack_mm(x.to(torch.bfloat16), w.q, w.unit).float() * w.scale + w.bias


def dynamic_rows(w: Weight, x: torch.Tensor) -> torch.Tensor:
    return torch.cat([torch.ops.quantized.linear_dynamic(row[None], w.packed_bias, True) for row in x])


def onednn_rows(w: Weight, x: torch.Tensor) -> torch.Tensor:
    from medusa_whisper.step.int8_kernels import rowwise_int8_matmul

    return rowwise_int8_matmul(x, w.onednn, w.scale, w.zero_points).add_(w.bias)


def static(w: Weight, x: torch.Tensor, levels: int) -> torch.Tensor:
    row_scale = x.abs().amax(dim=1, keepdim=True).clamp(min=1e-8) / levels
    integers = torch.round(x / row_scale)
    # the op takes unsigned 8-bit activations: the integers around a zero point of levels + 1
    y = torch.ops.quantized.linear_with_input_q_dq_qweight_dq_output_fp32(integers, 1.0, levels + 1, w.packed)
    return torch.addcmul(w.bias, y, row_scale)


def own_rows(w: Weight, x: torch.Tensor) -> torch.Tensor:
    return native.int8_rows(x, w.native, w.scale, w.bias)


def exact(w: Weight, x: torch.Tensor) -> torch.Tensor:
    return torch.addmm(w.bias, x, (w.q.float() * w.scale[:, None]).T)


def median_us(run: Callable[[torch.Tensor], torch.Tensor], weights: List[Weight], x: torch.Tensor, repeats: int = 5) -> float:
    times = []
    for _ in range(repeats + 1):
        began = time.perf_counter()
        for w in weights:
            run(w, x)
        times.append((time.perf_counter() - began) / len(weights))
    return sorted(times[1:])[repeats // 2] * 1e6


def row_invariant(run: Callable, w: Weight, x: torch.Tensor) -> bool:
    together = run(w, x)
    return all(torch.equal(together[i:i + 1], run(w, x[i:i + 1])) for i in range(x.shape[0]))


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--out", type=Path, default=Path("bench_out/row_products.json"))
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    levels = 127 if _vnni() else 63
    kernels: Dict[str, Callable] = {"weight_only": weight_only, "dynamic x rows": dynamic_rows,
                                    "static": lambda w, x: static(w, x, levels), "onednn rows": onednn_rows}
    if native.available():
        kernels["native"] = own_rows
    generator = torch.Generator().manual_seed(0)
    results: Dict[str, Dict[str, Dict[str, float]]] = {}
    invariant: Dict[str, bool] = {}
    error: Dict[str, float] = {}
    for name, (n_out, n_in) in SHAPES.items():
        copies = max(1, STREAM_BYTES // (n_out * n_in))
        weights = [Weight(n_out, n_in, generator) for _ in range(copies)]
        inputs = {k: torch.randn(k, n_in, generator=generator) for k in ROWS}
        results[name] = {kernel: {} for kernel in kernels}
        for kernel, run in kernels.items():
            invariant[kernel] = invariant.get(kernel, True) and row_invariant(run, weights[0], inputs[max(ROWS)])
            reference = exact(weights[0], inputs[max(ROWS)])
            relative = float((run(weights[0], inputs[max(ROWS)]) - reference).norm() / reference.norm())
            error[kernel] = max(error.get(kernel, 0.0), relative)
            for k, x in inputs.items():
                results[name][kernel][str(k)] = round(median_us(run, weights, x), 1)
        line = "  ".join(f"{kernel} " + "/".join(f"{results[name][kernel][str(k)]:.0f}" for k in ROWS)
                         for kernel in kernels)
        print(f"{name} ({len(weights)} copies), us at {'/'.join(map(str, ROWS))} rows: {line}", flush=True)
    summary = {kernel: {str(k): round(sum(results[s][kernel][str(k)] for s in SHAPES)
                                      / sum(results[s][kernel]["1"] for s in SHAPES), 3) for k in ROWS}
               for kernel in kernels}
    for kernel, ratios in summary.items():
        print(f"{kernel}: k rows / 1 row over base's shapes: {ratios}; each row its own bits: {invariant[kernel]}; "
              f"largest error against the int8 weights in float32: {error[kernel]:.4f}")
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps({"threads": args.threads, "levels": levels, "us": results, "ratio": summary,
                                    "row_invariant": invariant, "relative_error": error}, indent=1) + "\n",
                        encoding="utf-8")
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
