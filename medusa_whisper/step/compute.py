"""Compute types: float32, int8 and bfloat16 models, applied once at load (faster-whisper's names).

``apply_compute_type(model, name)`` converts a loaded model in place:

- ``float32``: nothing changes (openai-whisper's numbers).
- ``bfloat16``: every linear layer's weights, and the vocabulary projection's copy of the token
  embedding, in bfloat16; their matrix products run in bfloat16 (``HalfLinear``), while the residual
  stream, LayerNorms, the decoder's attention and the encoder's convolutions stay float32 (the
  encoder's attention runs in bfloat16 where that measures faster: encoder_attention.py).
- ``int8``: every linear outside the encoder (decoder, Medusa heads and block, any drafter module
  attached to the model) becomes an ``Int8Linear``: int8 weights with one scale per output
  channel. The vocabulary projection is int8 too (``projection.Int8Projection``, the decoder's
  ``token_projection``), by whichever of its row-independent kernels measures fastest on the
  running CPU. The encoder's linears, whose products have 1,500
  rows, take the form that encodes a real window fastest on the running machine: float32,
  bfloat16 (its attention too where that measures faster: encoder_attention.py) or row-wise
  ``Int8Linear`` (encoder_form.py).
- ``float16``, ``int8_float16``: CUDA only, as in faster-whisper.

Why these kernels (measured on this project's 2-core AVX-512 CPU, see README "Compute types"):
``torch.ao.quantization.quantize_dynamic`` is deprecated (torch warns it will be removed) and
quantises the activations with one scale for the whole input, so a verification pass over eight
rows gives other numbers for a row than a pass over that row alone: speculative decoding could no
longer equal greedy decoding. torchao's ``Int8DynamicActivationInt8WeightConfig`` quantises per
row, but its eager CPU path recomputes the weight's column sums in int32 on every call (48 ms for
the 51,865-row projection against 2 ms in float32); it is built to be fused by torch.compile.
What both end up calling are PyTorch's own int8 kernels, which we call directly:
``torch._weight_int8pack_mm`` (int8 weights, bfloat16 activations, the kernel behind torchao's
int8 weight-only path on CPUs) for the decoder's linears, and for the projection either that or
oneDNN's prepacked ``onednn::qlinear_pointwise`` (the kernel Inductor lowers torchao's int8
linears to on x86) or fbgemm's ``quantized::linear_dynamic`` given one row at a time, each with
activations quantised per row, whichever the running CPU times faster
(``Int8Projection.choose_kernel``). All are exact integer (or row-independent)
arithmetic: a row's result does not depend on the other rows, so ``lossless`` stays lossless.

Quantised models are cached beside the weights cache (``cache_dir()/compute``) as safetensors,
keyed by the source files' SHA-256 or stamp, the compute type and the torch version; a second load
reads that file instead of the checkpoint and rebuilds the prepacked forms (which cannot be saved).
"""

from __future__ import annotations

import functools
import hashlib
import json
import logging
import os
from pathlib import Path
from typing import Callable, Dict, Optional, Tuple, Union

import torch
import torch.nn.functional as F
from torch import Tensor, nn
from whisper.model import MultiHeadAttention, ResidualAttentionBlock

from ..errors import MedusaWhisperError
from ..paths import atomic_path, cache_dir
from . import encoder_form, native
from .encoder_attention import attend_in, attention_dtype
from .int8_kernels import (Prepared, dynamic_prepack, has_static_product, prepack, quantize_rows,
                           rowwise_int8_matmul, static_int8_matmul)
from .routes import ROUNDS, median_micros, table as routes_table
from .together import together
from .projection import HalfProjection, Int8Projection

log = logging.getLogger(__name__)

COMPUTE_TYPES = ("float32", "int8", "bfloat16", "float16", "int8_float16")
CPU_COMPUTE_TYPES = ("float32", "int8", "bfloat16")
# bump when the cached layout, the quantisation or what rebuilds the skeleton changes: old cache
# files are then ignored (4: an int8 encoder's form is the one timed fastest, and the file says which)
CACHE_FORMAT = 4


class ComputeTypeError(MedusaWhisperError, ValueError):
    """A compute type that is unknown or that the device cannot run."""


def check_compute_type(compute_type: str, device: Union[str, torch.device]) -> str:
    """The compute type if ``device`` can run it ("auto": the fastest measured, tuning.py); else one
    clear ComputeTypeError."""
    device_type = torch.device(device).type
    if compute_type == "auto":
        return compute_type
    if compute_type not in COMPUTE_TYPES:
        raise ComputeTypeError(f"unknown compute type {compute_type!r}; choose one of {', '.join(COMPUTE_TYPES)}")
    if device_type == "cpu" and compute_type not in CPU_COMPUTE_TYPES:
        raise ComputeTypeError(f"compute type {compute_type} needs a CUDA device; on the CPU use "
                               f"{', '.join(CPU_COMPUTE_TYPES)}")
    if device_type == "cuda" and compute_type == "int8":
        raise ComputeTypeError("compute type int8 runs on the CPU; on CUDA use int8_float16, float16 or float32")
    return compute_type


@functools.lru_cache(maxsize=1)
def cpu_has_bfloat16() -> bool:
    """Whether the CPU has native bfloat16 dot products (AVX-512 BF16 or AMX); elsewhere they are emulated."""
    try:
        flags = Path("/proc/cpuinfo").read_text(errors="replace")
    except OSError:
        return False
    return ("avx512_bf16" in flags or "amx_bf16" in flags) and not _dispatch_capped_below_bfloat16()


def _dispatch_capped_below_bfloat16() -> bool:
    """Whether the kernels were told to use less than the CPU has, below its bfloat16 instructions
    (routes.DISPATCH_ENV: e.g. ``ATEN_CPU_CAPABILITY=avx2 ONEDNN_MAX_CPU_ISA=AVX2`` to time on an
    AVX-512 machine what an AVX2-only one runs): then they emulate bfloat16, as there."""
    aten = os.environ.get("ATEN_CPU_CAPABILITY", "").lower()
    onednn = (os.environ.get("ONEDNN_MAX_CPU_ISA") or os.environ.get("DNNL_MAX_CPU_ISA") or "").upper()
    return aten in ("default", "avx2") or bool(onednn and onednn != "ALL" and "BF16" not in onednn
                                                    and "AMX" not in onednn)


def compute_type_of(model: nn.Module) -> str:
    return getattr(model, "compute_type", "float32")


# ---------------------------------------------------------------- int8 weights


class Int8Linear(nn.Module):
    """A linear layer with int8 weights (one scale per output channel), a drop-in for whisper's Linear.

    ``kernel``: "weight_only" multiplies bfloat16 activations by the int8 weights
    (``torch._weight_int8pack_mm``; fastest for the few rows of a decoder step), "rowwise" quantises
    the activations per row too (oneDNN, prepacked; an encoder in the "int8 rows" form, encoder_form.py),
    "dequantize" is the portable fallback (CUDA). Output dtype = input dtype.
    """

    KERNELS = ("weight_only", "rowwise", "dequantize")

    def __init__(self, in_features: int, out_features: int, bias: bool, kernel: str = "weight_only"):
        super().__init__()
        assert kernel in self.KERNELS, kernel
        self.in_features, self.out_features, self.kernel = in_features, out_features, kernel
        self.register_buffer("qweight", torch.zeros(out_features, in_features, dtype=torch.int8))
        self.register_buffer("scale", torch.ones(out_features))
        self.register_buffer("bias", torch.zeros(out_features) if bias else None)
        self.prepared = Prepared()

    def _load_from_state_dict(self, *args, **kwargs):
        self.prepared.clear()  # the weights are being replaced: forms made from them are stale
        super()._load_from_state_dict(*args, **kwargs)

    @classmethod
    def from_linear(cls, linear: nn.Linear, kernel: str = "weight_only") -> "Int8Linear":
        module = cls(linear.in_features, linear.out_features, linear.bias is not None, kernel)
        module.qweight, module.scale = quantize_rows(linear.weight)
        if linear.bias is not None:
            module.bias = linear.bias.detach().float().clone()
        return module.to(linear.weight.device)

    def forward(self, x: Tensor) -> Tensor:
        # a decoder step's rows cost a few dozen microseconds of products, so each call made here counts:
        # no reshape or cast that would return its input (issue 46 item 4), and the buffers read from
        # their dict, not through Module.__getattr__ (a one-row base pass calls this 36 times: 0.3-0.7 ms
        # of a 9-12 ms pass on an AVX2 EPYC)
        rows = x if x.dim() == 2 else x.reshape(-1, x.shape[-1])
        buffers = self._buffers
        bias = buffers["bias"]  # None once applied
        if self.kernel == "weight_only" and rows.is_cpu and (
                rows.shape[0] >= MANY_ROWS
                or (together() and rows.shape[0] >= many_rows_from(self.out_features, self.in_features))):
            y = self._many_rows(rows)
        elif self.kernel == "weight_only":
            kernel = few_rows_kernel(self.out_features, self.in_features) if rows.is_cpu else "weight_only"
            y, bias = self._few_rows(rows, kernel, bias)
        elif self.kernel == "rowwise":
            y = self._int8_rows_product(rows)
        else:
            y = F.linear(rows.float(), self.qweight.float() * self.scale[:, None])
        if bias is not None:
            y = y.add_(bias)
        if rows is not x:
            y = y.reshape(*x.shape[:-1], self.out_features)
        return y if y.dtype == x.dtype else y.to(x.dtype)

    def _many_rows(self, rows: Tensor) -> Tensor:
        """x @ W.T for rows that are only ever multiplied together (a prompt, the cross-attention
        keys and values: together.py), where the weight-only kernel, which costs about as much per
        row as for one row, is the slowest choice: ``many_rows_kernel``'s product, a bfloat16 copy
        of the weight or oneDNN's int8 product with the rows quantised one by one (what the encoder
        takes in its "int8 rows" form). Measured, base, one core, 150 rows of 1536 x 512:
        weight-only 3.5 ms, int8 rows 0.9, bfloat16 1.4 ms on an AVX-512 EPYC; capped to AVX2,
        weight-only 4.8 ms, int8 rows 1.4 ms, float32 3.1 ms, emulated bfloat16 12.7 ms."""
        if many_rows_kernel(self.out_features, self.in_features) == "bfloat16":
            return self._bfloat16_product(rows).float()
        return self._int8_rows_product(rows)

    def _few_rows(self, rows: Tensor, kernel: str, bias: Optional[Tensor]) -> Tuple[Tensor, Optional[Tensor]]:
        """x @ W.T for a pass's few rows by ``kernel`` (of FEW_ROWS_KERNELS), and the bias left to add
        (None where the product added it). Each is row-invariant: "weight_only" multiplies bfloat16
        rows, "static" (fbgemm), "rowwise" (oneDNN) and "native" (the package's own, native/rows.cpp)
        quantise each row to int8 with its own scale."""
        if kernel == "native":
            return native.int8_rows(rows, self.native_form(), self._buffers["scale"], bias), None
        if kernel == "static":
            packed = self.prepared.get("fbgemm", lambda: dynamic_prepack(self.qweight, self.scale), self.qweight,
                                       self.scale)
            return static_int8_matmul(rows.float(), packed), bias
        if kernel == "rowwise":
            return self._int8_rows_product(rows), bias
        # the kernel wants rows with unit stride (a transposed input, as in a convolution block, has not)
        y = torch._weight_int8pack_mm(rows.to(torch.bfloat16, memory_format=torch.contiguous_format),
                                      self._buffers["qweight"], self._unit_scale())
        # the scale (and the bias) in float32, in one elementwise pass that reads the bfloat16 product:
        # widening bfloat16 is exact, so this is float(y) * scale + bias without the float32 copy
        scale = self._buffers["scale"]
        return (torch.mul(y, scale) if bias is None else torch.addcmul(bias, y, scale)), None

    def native_form(self):
        """``native.pack_int8``'s form of the weights (the package's kernels), made on first use."""
        return self.prepared.get("native", lambda: native.pack_int8(self.qweight), self.qweight)

    def _int8_rows_product(self, rows: Tensor) -> Tensor:
        """rows @ W.T through oneDNN's u8s8 product, each row quantised alone; float32 out, no bias."""
        return rowwise_int8_matmul(rows.float(), self._packed(), self.scale, self._zero_points())

    def many_rows_in(self, x: Tensor, dtype: torch.dtype) -> Optional[Tensor]:
        """x @ W.T + b in ``dtype`` for rows computed together (``_many_rows``'s product), where that is
        a bfloat16 product and ``dtype`` bfloat16: its result as the product rounds it, with no float32
        copy made and cast back (the cross-attention keys and values of 1,500 positions, 12 of them a
        window for base). None where it is not: the caller calls the layer."""
        if not (dtype == torch.bfloat16 and x.device.type == "cpu" and self.kernel == "weight_only"
                and together() and many_rows_kernel(self.out_features, self.in_features) == "bfloat16"):
            return None
        bias = None if self.bias is None else self.bias.to(torch.bfloat16)
        return self._bfloat16_product(x.reshape(-1, x.shape[-1]), bias).reshape(*x.shape[:-1], self.out_features)

    def _bfloat16_product(self, rows: Tensor, bias: Optional[Tensor] = None) -> Tensor:
        """rows @ W.T (+ bias) through the bfloat16 copy of the weight, bfloat16 out."""
        return F.linear(rows.to(torch.bfloat16), self._bfloat16_weight(), bias)

    def _bfloat16_weight(self) -> Tensor:
        """The dequantised weight in bfloat16 (kept while the module lives, not saved): for products of
        many rows, such as the cross-attention keys and values of 1,500 audio positions, where the
        int8 kernel scales with the rows (base, 1,500 x 512 -> 512, 2 threads: 2.8 ms against 0.9 ms)."""
        return self.prepared.get("bfloat16", lambda: (self.qweight.float() * self.scale[:, None]).to(torch.bfloat16),
                                 self.qweight, self.scale)

    def _unit_scale(self) -> Tensor:
        # the per-channel scale is applied in float32 afterwards: as a bfloat16 factor inside the
        # kernel it would itself be rounded to 8 bits
        return self.prepared.get("unit", lambda: torch.ones(self.out_features, dtype=torch.bfloat16,
                                                            device=self.qweight.device), self._buffers["qweight"])

    def _packed(self) -> Tensor:
        return self.prepared.get("packed", lambda: prepack(self.qweight), self.qweight)

    def _zero_points(self) -> Tensor:
        return self.prepared.get("zero points", lambda: torch.zeros(self.out_features, dtype=torch.long), self.qweight)

    def extra_repr(self) -> str:
        return f"in_features={self.in_features}, out_features={self.out_features}, kernel={self.kernel}"


# The kernels a decoder pass's few rows may take (Int8Linear._few_rows), each row-invariant: today's weight-only
# product first (a table pinned to a kind that holds no choice takes it), then the three that quantise each
# row to int8, whose extra rows cost little (docs/compute/row_products.md); "native" where make setup built it
FEW_ROWS_KERNELS = ("weight_only", "static", "rowwise", "native")
FEW_ROWS_TIMED = (1, 8)  # a plain pass's row and a verifying pass's rows, weighed alike
FEW_ROWS_STREAMED = 32 << 20  # bytes of weights cycled through per timing: a pass reads them from memory


def few_rows_kernel(n_out: int, n_in: int) -> str:
    """The kernel of FEW_ROWS_KERNELS that multiplies a pass's few rows by an int8 weight of this shape
    here: the one whose products over FEW_ROWS_TIMED rows, weights read from memory, take least time
    in all, timed once per machine and kept with the routes. It decides a row's bits, so it is one
    per machine and shape, whatever the number of rows."""
    return _few_rows_kernel(n_out, n_in, torch.get_num_threads())


@functools.lru_cache(maxsize=None)
def _few_rows_kernel(n_out: int, n_in: int, threads: int) -> str:
    kernels = [k for k in FEW_ROWS_KERNELS if (k != "static" or has_static_product())
               and (k != "native" or native.available())]

    def timer(kernel: str) -> Callable[[], float]:
        def run() -> float:  # its random weights and rows drawn when timed: see RouteTable.choose_kernel
            copies = max(1, min(32, FEW_ROWS_STREAMED // (n_out * n_in)))
            layers = [Int8Linear.from_linear(nn.Linear(n_in, n_out)) for _ in range(copies)]
            inputs = [torch.randn(n, n_in) for n in FEW_ROWS_TIMED]
            return sum(median_micros(lambda: [layer._few_rows(x, kernel, layer.bias) for layer in layers])
                       for x in inputs) / copies
        return run
    return routes_table().choose_kernel(f"int8 few rows {n_out}x{n_in}", {k: timer(k) for k in kernels})


# rows from which an int8 weight-only linear takes its many-rows kernel (Int8Linear._many_rows) even outside
# rows_together (a draft head over the 1,500 audio positions); a decoding pass never has this many
MANY_ROWS = 256


# row counts at which the two kernels of rows computed together are compared (many_rows_from)
TOGETHER_ROWS = (2, 4, 8, 16, 32, 64)
# row counts at which the many-rows kernels are compared (many_rows_kernel): a prompt, an audio's positions
MANY_ROWS_TIMED = (64, 1500)


def many_rows_kernel(n_out: int, n_in: int) -> str:
    """The product ``Int8Linear._many_rows`` runs for a weight of this shape on this CPU: "int8 rows"
    (oneDNN's u8s8 product, each row quantised alone) or, where bfloat16 products are native,
    "bfloat16" (a dequantised copy) if that is the faster over 64 and 1,500 rows, timed once per
    machine with the routes. The two round differently, so the choice is one per machine and shape,
    never one per call. Measured on an AVX-512 EPYC, one core, base's cross-attention keys and
    values (twelve 1,500 x 512 -> 512 products a window): 54 ms a window in bfloat16, 42 with int8
    rows."""
    return _many_rows_kernel(n_out, n_in, torch.get_num_threads(), cpu_has_bfloat16())


@functools.lru_cache(maxsize=None)
def _many_rows_kernel(n_out: int, n_in: int, threads: int, bfloat16: bool) -> str:
    if not bfloat16:  # emulated bfloat16 is the slowest of all (12.7 ms above); float32 copies lose to int8 rows
        return "int8 rows"

    def timer(kernel: str) -> Callable[[], float]:
        def run() -> float:  # its random weight and rows drawn when timed: see RouteTable.choose_kernel
            layer = Int8Linear.from_linear(nn.Linear(n_in, n_out))
            product = {"bfloat16": layer._bfloat16_product, "int8 rows": layer._int8_rows_product}[kernel]
            inputs = [torch.randn(n, n_in) for n in MANY_ROWS_TIMED]
            return sum(median_micros(lambda: product(x)) for x in inputs)
        return run
    return routes_table().choose_kernel(f"int8 many rows {n_out}x{n_in}", {k: timer(k) for k in ("bfloat16", "int8 rows")})


def many_rows_from(n_out: int, n_in: int) -> int:
    """The fewest rows (of TOGETHER_ROWS) from which ``Int8Linear._many_rows`` multiplies a weight of
    this shape faster than the weight-only kernel on this CPU, for rows computed together (a
    prompt); MANY_ROWS where it never is. Timed once per machine and kept with the routes (about
    0.1 s a shape): the crossing lies between 8 and 16 rows on an AVX-512 EPYC and, capped to AVX2,
    near 8, but nothing here assumes it."""
    return _many_rows_from(n_out, n_in, torch.get_num_threads(), cpu_has_bfloat16())


@functools.lru_cache(maxsize=None)
def _many_rows_from(n_out: int, n_in: int, threads: int, bfloat16: bool) -> int:
    name = f"int8 rows together {n_out}x{n_in} {many_rows_kernel(n_out, n_in)}"  # chosen first: not inside costs()

    def measure() -> Dict[str, float]:
        layer = Int8Linear.from_linear(nn.Linear(n_in, n_out))
        inputs = {n: torch.randn(n, n_in) for n in TOGETHER_ROWS}
        kernels = {"weight_only": lambda x: torch._weight_int8pack_mm(x.to(torch.bfloat16), layer.qweight,
                                                                      layer._unit_scale()),
                   "many_rows": layer._many_rows}
        best = {f"{kernel}@{n}": float("inf") for kernel in kernels for n in TOGETHER_ROWS}
        for _ in range(ROUNDS):  # alternating, the fastest round counts (as the routes are timed)
            for n, x in inputs.items():
                for kernel, run in kernels.items():
                    best[f"{kernel}@{n}"] = min(best[f"{kernel}@{n}"], median_micros(lambda: run(x)))
        return best
    return first_faster(routes_table().costs(name, measure))


def first_faster(costs: Dict[str, float]) -> int:
    """From measured costs ("kernel@rows" -> microseconds): the fewest rows from which the many-rows
    kernel is faster at every count measured, or MANY_ROWS."""
    start = MANY_ROWS
    for n in reversed(TOGETHER_ROWS):
        if costs[f"many_rows@{n}"] >= costs[f"weight_only@{n}"]:
            break
        start = n
    return start


def fuse_qkv(attn: nn.Module) -> None:
    """Give a self-attention whose query, key and value are int8 weight-only linears one int8 linear
    for the three (``attn.qkv``, a plain attribute: the state dict stays whisper's), which
    ``decoder.self_attention_qkv`` then uses: one product instead of three costs base, one row,
    179 against 336 us per pass. Made once at load (``_finish``)."""
    parts = (attn.query, attn.key, attn.value)
    if not all(type(p) is Int8Linear and p.kernel == "weight_only" for p in parts):
        return
    fused = Int8Linear(parts[0].in_features, sum(p.out_features for p in parts), bias=True)
    fused.qweight = torch.cat([p.qweight for p in parts])
    fused.scale = torch.cat([p.scale for p in parts])
    # whisper's key has no bias: zeros, and adding 0.0 leaves its values as they were
    fused.bias = torch.cat([p.bias if p.bias is not None else torch.zeros_like(p.scale) for p in parts])
    object.__setattr__(attn, "qkv", fused.to(parts[0].qweight.device))


class HalfLinear(nn.Module):
    """A linear layer whose matrix product runs in bfloat16 (or float16): input cast down, output
    cast back, so the residual stream around it keeps the input's dtype (float32)."""

    def __init__(self, in_features: int, out_features: int, bias: bool, dtype: torch.dtype = torch.bfloat16):
        super().__init__()
        self.in_features, self.out_features = in_features, out_features
        self.register_buffer("weight", torch.zeros(out_features, in_features, dtype=dtype))
        self.register_buffer("bias", torch.zeros(out_features, dtype=dtype) if bias else None)

    @classmethod
    def from_linear(cls, linear: nn.Linear, dtype: torch.dtype) -> "HalfLinear":
        module = cls(linear.in_features, linear.out_features, linear.bias is not None, dtype)
        module.weight = linear.weight.detach().to(dtype).clone()
        if linear.bias is not None:
            module.bias = linear.bias.detach().to(dtype).clone()
        return module.to(linear.weight.device)

    # set on the decoder's side (see _convert_structure): rows are multiplied one at a time there,
    # because oneDNN's bfloat16 kernels round a row differently for some numbers of rows (e.g. 5 rows
    # of 1536 -> 384), and a verified row must get exactly the numbers it gets alone
    rows_alone = False

    def forward(self, x: Tensor) -> Tensor:
        if self.rows_alone and x.shape[:-1].numel() > 1 and not together():
            rows = x.reshape(-1, x.shape[-1])
            out = torch.cat([self._product(rows[i:i + 1]) for i in range(rows.shape[0])])
            return out.reshape(*x.shape[:-1], self.out_features)
        return self._product(x)

    def _product(self, x: Tensor) -> Tensor:
        return F.linear(x.to(self.weight.dtype), self.weight, self.bias).to(x.dtype)

    def extra_repr(self) -> str:
        return f"in_features={self.in_features}, out_features={self.out_features}, dtype={self.weight.dtype}"


# ---------------------------------------------------------------- applying a compute type


def _swap_linears(module: nn.Module, make: Callable[[nn.Linear], nn.Module], skip: Tuple[nn.Module, ...] = ()) -> None:
    for name, child in list(module.named_children()):
        if any(child is s for s in skip):
            continue
        if isinstance(child, nn.Linear):
            setattr(module, name, make(child))
        else:
            _swap_linears(child, make, skip)


HALF_DTYPES = {"bfloat16": torch.bfloat16, "float16": torch.float16, "int8_float16": torch.float16}


def apply_compute_type(model: nn.Module, compute_type: str, device=None) -> nn.Module:
    """Convert ``model`` (a loaded float32 MedusaWhisper) to ``compute_type`` in place, once; returns it.

    Whisper's own linear modules are replaced, so ``whisper.decode`` on the returned model runs the
    same converted linears; its vocabulary projection stays its own (float32).
    """
    device = device if device is not None else next(model.parameters()).device
    check_compute_type(compute_type, device)
    current = compute_type_of(model)
    if current == compute_type:
        return model
    if current != "float32":
        raise ValueError(f"the model is already {current}; load it again for {compute_type}")
    if compute_type == "bfloat16" and torch.device(device).type == "cpu" and not cpu_has_bfloat16():
        log.warning("this CPU has no native bfloat16 products (AVX-512 BF16 or AMX): bfloat16 is emulated "
                    "and several times slower than float32 here; int8 or float32 will be faster")
    if compute_type != "float32":
        _convert_structure(model, compute_type, torch.device(device).type)
        _finish(model, compute_type)
    return model


def _swapper(kind: str, quantize: bool, half: torch.dtype = torch.bfloat16) -> Callable[[nn.Linear], nn.Module]:
    """What replaces a linear: "half" (``HalfLinear`` in ``half``) or an ``Int8Linear`` kernel; quantize False
    makes empty modules of the right shapes, which a cached state dict then fills."""
    def swap(lin: nn.Linear) -> nn.Module:
        args = (lin.in_features, lin.out_features, lin.bias is not None)
        if kind == "half":
            return HalfLinear.from_linear(lin, half) if quantize else HalfLinear(*args, dtype=half)
        return Int8Linear.from_linear(lin, kind) if quantize else Int8Linear(*args, kernel=kind)
    return swap


def in_form(module: nn.Module, form: str, quantize: bool = True) -> nn.Module:
    """``module`` with its linears in an encoder form (encoder_form.FORMS, or "float16" on CUDA): float32
    leaves them as they are, "bfloat16"/"float16" makes them ``HalfLinear``, "int8 rows" row-wise
    ``Int8Linear``. The residual stream, convolutions and norms stay float32: measured on base (one
    window of jfk.flac), that costs 5 % more time than an all-bfloat16 encoder and cuts its mean
    output error from 1.8 % to 1.1 % of float32's."""
    if form in HALF_DTYPES:
        _swap_linears(module, _swapper("half", quantize, HALF_DTYPES[form]))
    elif form == "int8 rows":
        _swap_linears(module, _swapper("rowwise", quantize))
    elif form != "float32":
        raise ValueError(f"unknown encoder form {form!r}")
    return module


def _timed_form(module: nn.Module, form: str) -> nn.Module:
    """A module in ``form`` as a converted encoder runs it (its attention as _finish sets it), for
    encoder_form to time."""
    in_form(module, form)
    _encoder_attention(module)
    return module


def int8_encoder_form(dims) -> str:
    """The form of an int8 model's encoder on this machine: timed once (encoder_form.chosen)."""
    return encoder_form.chosen(dims, _timed_form)


def int8_encoder_costs(dims) -> Dict[str, float]:
    """What the int8 encoder's forms cost on this machine (encoder_form.costs), timed once."""
    return encoder_form.costs(dims, _timed_form)


def _convert_structure(model: nn.Module, compute_type: str, device_type: str, quantize: bool = True,
                       form: Optional[str] = None) -> None:
    """Swap the linear modules and add the projection's copy of the embedding.

    quantize : False to build empty modules of the right shapes, which a cached state dict then fills
    form     : the int8 encoder's form (a cached model's); default: the one chosen on this machine
    """
    encoder = model.encoder
    half = HALF_DTYPES.get(compute_type, torch.bfloat16)
    # the decoder, Medusa heads and block, and any drafter attached as a submodule
    if compute_type in ("bfloat16", "float16"):
        _swap_linears(model, _swapper("half", quantize, half), skip=(encoder,))
    else:
        _swap_linears(model, _swapper("weight_only" if device_type == "cpu" else "dequantize", quantize),
                      skip=(encoder,))
    # the encoder: 1,500-row products. An int8 model's takes the form timed fastest here (its attention
    # is set in _finish, in bfloat16 where that measures faster: encoder_attention.py); the half types
    # keep theirs, as asked
    if compute_type == "int8" and device_type == "cpu":
        form = form or int8_encoder_form(model.dims)
    else:
        form = {"int8": "int8 rows", "int8_float16": "float16"}.get(compute_type, compute_type)
    in_form(encoder, form, quantize)
    model.encoder_form = form
    in_encoder = {id(m) for m in encoder.modules()}
    # see cpu.CpuAttention: on the CPU, every verified row as if it were alone, which is what makes
    # lossless exact there. Not on CUDA: there a row's last bits can depend on its company whatever
    # is done (GEMM kernels are chosen by shape), and one product per row made every verification
    # row cost a pass (a CUDA run of base-ctc chose never to draft: 1.00 tokens per pass)
    if device_type == "cpu":
        for module in model.modules():
            if isinstance(module, (MultiHeadAttention, HalfLinear)) and id(module) not in in_encoder:
                module.rows_alone = True
    dtype = invariant_dtype()
    if compute_type == "int8" and device_type == "cpu" and dtype is not None and _invariant_attention_holds(model, dtype):
        # the decoder's and draft heads' blocks: batched products whose rows do not depend on their
        # company, in this stream or beside other streams (step/attention.py), instead of one
        # product per row. A head's block needs no invariance, but takes the same layout
        # (fixed.DraftBlock gives each its own cache)
        for block in model.modules():
            if isinstance(block, ResidualAttentionBlock) and id(block) not in in_encoder and block.cross_attn is not None:
                block.attn.row_invariant = block.cross_attn.row_invariant = True
                block.attn.invariant_dtype = block.cross_attn.invariant_dtype = dtype
    embedding = model.decoder.token_embedding.weight
    if compute_type in ("int8", "int8_float16"):
        model.decoder.token_projection = Int8Projection.from_weight(embedding) if quantize else Int8Projection(
            *embedding.shape)
    else:
        model.decoder.token_projection = HalfProjection.from_weight(embedding, half) if quantize else HalfProjection(
            *embedding.shape, dtype=half)


def invariant_dtype() -> Optional[torch.dtype]:
    """The dtype of the int8 decoder's invariant attention on this CPU: bfloat16 where its products
    are native (half the bytes of keys and values to stream). None elsewhere: there the decoder
    attends with PyTorch's fused kernel, one row at a time in a multi-row pass (``rows_alone``),
    because the invariant products cost more than they save. Measured on an AVX2 EPYC, int8 base:
    one row 22.5 ms a pass with emulated bfloat16 attention, 13.6 ms with float32 invariant
    attention (every one of the 448 cache slots, one row as two), 9.75 ms with the fused kernel;
    eight rows 30.5 against 27.7 ms."""
    return torch.bfloat16 if cpu_has_bfloat16() else None


def _invariant_attention_holds(model: nn.Module, dtype: torch.dtype) -> bool:
    """Whether this CPU's products in ``dtype`` give a row the same bits in any company (measured)."""
    from .attention import rows_are_invariant

    dims = model.dims
    return rows_are_invariant(dtype, dims.n_text_head, dims.n_text_state // dims.n_text_head, dims.n_text_ctx,
                              dims.n_audio_ctx, torch.get_num_threads())


def _finish(model: nn.Module, compute_type: str) -> None:
    """Hooks, markers and prepacking shared by a fresh conversion and a cached load."""
    model.decoder.token_projection.prepare()  # choose its kernel and prepack now, not in the first step
    for module in model.modules():
        if isinstance(module, Int8Linear) and module.kernel == "rowwise":
            module._packed()
        elif isinstance(module, ResidualAttentionBlock):
            fuse_qkv(module.attn)
    _encoder_attention(model.encoder)
    model.compute_type = compute_type


def _encoder_attention(encoder: nn.Module) -> None:
    """The encoder's attention in the dtype measured faster (encoder_attention.py), where its queries,
    keys and values come out of bfloat16 products on the CPU."""
    blocks = getattr(encoder, "blocks", None)
    if not blocks:
        return
    attn = blocks[0].attn
    query = attn.query
    if isinstance(query, HalfLinear) and query.weight.dtype == torch.bfloat16 and query.weight.device.type == "cpu":
        n_ctx = encoder.positional_embedding.shape[0]
        attend_in(encoder, attention_dtype(attn.n_head, n_ctx, query.out_features // attn.n_head))


# ---------------------------------------------------------------- the cache of converted models


def cache_key(sources: Dict[str, object], compute_type: str) -> str:
    """What identifies a converted model: its sources' hashes or stamps, the type, torch and the format."""
    record = dict(sources=sources, compute_type=compute_type, torch=torch.__version__, format=CACHE_FORMAT)
    return hashlib.sha256(json.dumps(record, sort_keys=True, default=str).encode()).hexdigest()[:24]


def cache_path(key: str, compute_type: str) -> Path:
    return cache_dir() / "compute" / f"{compute_type}-{key}.safetensors"


def save_converted(model: nn.Module, path: Path, build_info: dict) -> None:
    """Write a converted model's tensors (safetensors, no pickle) and what rebuilds its skeleton."""
    from safetensors.torch import save_file

    state = {k: v.contiguous() for k, v in model.state_dict().items()}
    # tied or shared tensors would be refused by safetensors: store each storage once
    seen: Dict[Tuple[int, int], str] = {}
    aliases = {}
    for name in list(state):
        t = state[name]
        ident = (t.untyped_storage().data_ptr(), t.storage_offset())
        if ident in seen and state[seen[ident]].shape == t.shape:
            aliases[name] = seen[ident]
            del state[name]
        else:
            seen[ident] = name
    alignment = getattr(model, "alignment_heads", None)
    if alignment is not None:
        state["__alignment_heads__"] = alignment.to_dense().contiguous()
    metadata = {"build": json.dumps(build_info), "aliases": json.dumps(aliases),
                "compute_type": model.compute_type, "torch": torch.__version__,
                "encoder_form": getattr(model, "encoder_form", "float32")}
    with atomic_path(path) as tmp:
        save_file(state, str(tmp), metadata=metadata)


def load_converted(path: Path, build: Callable[[dict], nn.Module], compute_type: str, device) -> Optional[nn.Module]:
    """A converted model from the cache, or None when the file is missing or does not fit.

    build : makes the float32 skeleton from the stored build information (on the meta device,
            so nothing is initialised only to be overwritten)
    """
    if not path.is_file():
        return None
    from safetensors import safe_open

    try:
        with safe_open(str(path), framework="pt") as f:
            metadata = f.metadata() or {}
            # cloned: tensors read from the file may sit at any byte offset, and the int8 kernels
            # crash (segmentation fault) on weights that are not 64-byte aligned
            state = {k: f.get_tensor(k).clone() for k in f.keys()}
        build_info, aliases = json.loads(metadata["build"]), json.loads(metadata["aliases"])
    except Exception as e:  # a truncated or foreign file: convert again
        log.warning("%s: unreadable converted model (%s); converting again", path, e)
        return None
    alignment = state.pop("__alignment_heads__", None)
    for name, target in aliases.items():
        state[name] = state[target]
    with torch.device("meta"), _DenseOnMeta():
        model = build(build_info)
    form = metadata.get("encoder_form")
    if compute_type == "int8" and torch.device(device).type == "cpu" and form != int8_encoder_form(model.dims):
        log.info("%s: its encoder is %s, this machine's fastest int8 encoder is not: converting again", path, form)
        return None
    _convert_structure(model, compute_type, torch.device(device).type, quantize=False, form=form)
    try:
        model.load_state_dict(state, strict=True, assign=True)
    except RuntimeError as e:
        log.warning("%s: does not fit the model (%s); converting again", path, str(e).splitlines()[0])
        return None
    _rebuild_unsaved_buffers(model, alignment)
    if any(t.is_meta for t in list(model.parameters()) + list(model.buffers())):
        log.warning("%s: the model has tensors the cache does not hold; converting again", path)
        return None
    model = model.to(device).eval()
    _finish(model, compute_type)
    return model


class _DenseOnMeta(torch.overrides.TorchFunctionMode):
    """Lets a skeleton be built on the meta device: whisper makes its alignment-heads buffer sparse
    in its constructor, which meta tensors cannot be; that buffer is rebuilt afterwards anyway."""

    def __torch_function__(self, func, types, args=(), kwargs=None):
        if func is Tensor.to_sparse:
            return args[0]
        return func(*args, **(kwargs or {}))


def _rebuild_unsaved_buffers(model: nn.Module, alignment: Optional[Tensor]) -> None:
    """Non-persistent buffers, which a state dict does not carry: whisper's causal mask and alignment heads."""
    import numpy as np

    decoder = model.decoder
    n_ctx = decoder.positional_embedding.shape[0]
    decoder.register_buffer("mask", torch.empty(n_ctx, n_ctx).fill_(-np.inf).triu_(1), persistent=False)
    dims = model.dims
    if alignment is None:
        alignment = torch.zeros(dims.n_text_layer, dims.n_text_head, dtype=torch.bool)
        alignment[dims.n_text_layer // 2:] = True  # whisper's default: the last half of the layers
    model.register_buffer("alignment_heads", alignment.to_sparse(), persistent=False)
