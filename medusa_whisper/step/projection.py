"""The vocabulary projection: logits of decoder states over the rows of the tied token embedding.

The decoder owns one (``decoder.token_projection``), built once for the model's compute type:
``FloatProjection`` for float models (it reads the embedding itself), ``Int8Projection`` and
``HalfProjection`` for converted ones (compute.py builds them at load, with their own copy of the
embedding in int8 or bfloat16). Every projection onto some of those rows (the Medusa heads'
proposal vocabulary, a draft head's shortlist) is ``projection.select(ids)``: the same kernel, so a
selected row's logits are the whole vocabulary's column for that token at int8 and bfloat16. Whoever
selects keeps the selection (the heads do, in their ``Prepared`` forms); nothing is kept in a
registry of the package.

Differs from whisper (``x @ token_embedding.weight.T``): see ``FloatProjection`` for the route.
"""

from __future__ import annotations

from typing import List, Optional

import torch
from torch import Tensor, nn

from . import native
from .int8_kernels import (Prepared, dynamic_int8_matmul, dynamic_prepack, has_static_product, prepack,
                           quantize_rows, rowwise_int8_matmul, static_int8_matmul)
from .routes import WEIGHT_FIRST, median_micros, route_for, table as routes_table, weight_times_rows
from .together import together


class Projection(nn.Module):
    """states (..., n_state) -> logits (..., n_rows) over rows of the token embedding."""

    def __init__(self):
        super().__init__()
        self.prepared = Prepared()

    def select(self, ids: Tensor) -> "Projection":
        """The projection onto rows ``ids`` (column j is row ``ids[j]``), by the same kernel."""
        raise NotImplementedError

    def prepare(self) -> None:
        """Make the kernel's forms now (prepacking), not in the first decoder step."""

    def _load_from_state_dict(self, *args, **kwargs):
        self.prepared.clear()  # the weights are being replaced: forms made from them are stale
        super()._load_from_state_dict(*args, **kwargs)


def of(decoder: nn.Module) -> Projection:
    """The decoder's projection; a float decoder that has none (whisper's own model) gets one now."""
    projection = getattr(decoder, "token_projection", None)
    if projection is None:
        projection = FloatProjection(decoder.token_embedding)
        decoder.add_module("token_projection", projection)
    return projection


class FloatProjection(Projection):
    """Float32 embedding rows, read from the decoder's embedding (no copy of the whole vocabulary).

    On a CPU, where ``make setup`` built the package's kernels, a pass's rows are multiplied by
    ``native.float_rows``: each logit one fused multiply-add chain in a fixed order, so a verified
    row gets the logits it gets alone and a selected row's logits are the whole vocabulary's
    column. Without them the product goes the route ``routes.route_for`` measured fastest here for
    this number of rows: ``weight_times_rows`` over the rows as stored, or ``x @ W.T`` against a
    contiguous transposed copy, made at first use: a few rows against the transposed view of the
    (n_vocab, n_state) embedding are about twice as slow as against such a copy, and the projection
    is most of a small model's decoder step. On CUDA the view is as fast: no copy.
    """

    def __init__(self, embedding: nn.Embedding, ids: Optional[Tensor] = None):
        super().__init__()
        # the decoder's embedding module, not a submodule: its weight stays the decoder's, once in the state dict
        object.__setattr__(self, "embedding", embedding)
        self.ids = ids

    def select(self, ids: Tensor) -> "FloatProjection":
        ids = ids.to(self.embedding.weight.device)
        return FloatProjection(self.embedding, ids if self.ids is None else self.ids[ids])

    def _rows(self, weight: Tensor) -> Tensor:
        if self.ids is None:
            return weight
        # the weight is the decoder's parameter: module.to() moves its data in place, hence data_ptr
        return self.prepared.get("rows", lambda: weight.detach()[self.ids].contiguous(), weight, weight.data_ptr())

    def forward(self, states: Tensor) -> Tensor:
        weight = self.embedding.weight
        if weight.device.type != "cpu" or states.dtype != weight.dtype:
            rows = weight if self.ids is None else weight[self.ids]
            return states @ rows.to(states.dtype).T
        rows = self._rows(weight)
        flat = states.reshape(-1, states.shape[-1])
        if states.dtype == torch.float32 and not together() and native.available():
            packed = self.prepared.get("native", lambda: native.pack_float(rows), rows, rows.data_ptr())
            return native.float_rows(flat, packed, None, rows.shape[0]).reshape(*states.shape[:-1], rows.shape[0])
        if route_for("projection", rows, flat.shape[0]) == WEIGHT_FIRST:
            return weight_times_rows(rows, None, flat).reshape(*states.shape[:-1], rows.shape[0])
        transposed = self.prepared.get("transposed", lambda: rows.detach().T.contiguous(), rows, rows.data_ptr())
        return states @ transposed


# copies of the vocabulary a kernel's timing multiplies in turn, so that each call reads its weights
# afresh (base's int8 vocabulary: 27 MB each)
STREAMED_COPIES = 2


class Int8Projection(Projection):
    """The embedding's rows in int8, one scale per row (int8 compute types); float32 logits.

    Every kernel computes each row on its own, so verifying several rows at once gives each the
    logits it gets alone:

    - "rowwise" quantises the activations per row (oneDNN's u8s8 product);
    - "dynamic" quantises them per row by fbgemm (``int8_kernels.dynamic_int8_matmul``);
    - "weight_only" multiplies bfloat16 activations by the int8 rows (``torch._weight_int8pack_mm``;
      its products are rounded to bfloat16);
    - "static" quantises them per row to int8 and multiplies every row in one fbgemm call
      (``int8_kernels.static_int8_matmul``): an extra row costs little;
    - "native" quantises them per row as "static" does, in the package's own product
      (native/rows.cpp, where ``make setup`` built it): one read of the weights for every row.

    Which is fastest differs by 2.5-4x between CPUs, so it is measured (``choose_kernel``): oneDNN's
    is the fastest with VNNI and 3-4x slower than ``_weight_int8pack_mm`` on an AVX2 EPYC, where
    fbgemm's is 1.6-2.9x faster than that at one row (base's 51,865 rows: 1.52 against 2.42 ms read
    from memory, 0.83 against 2.1-2.45 cached). They round differently, not better or worse: base int8 on
    the held-out corpus (120 utterances, greedy) scored 18.81 % WER with "dynamic" and 18.97 % with
    "weight_only" on the 119 where neither ran into a repetition loop (docs/cpu_kinds.md).
    """

    KERNELS = ("rowwise", "dynamic", "weight_only", "static", "native")

    def __init__(self, n_vocab: int, n_state: int, kernel: Optional[str] = None):
        super().__init__()
        self.register_buffer("qweight", torch.zeros(n_vocab, n_state, dtype=torch.int8))
        self.register_buffer("scale", torch.ones(n_vocab))
        # one kernel for the vocabulary and every selection of it, so that a shortlist's logits are the
        # full vocabulary's; None until measured
        self.kernel = kernel

    @classmethod
    def from_weight(cls, weight: Tensor) -> "Int8Projection":
        module = cls(*weight.shape)
        module.qweight, module.scale = quantize_rows(weight)
        return module

    def select(self, ids: Tensor) -> "Int8Projection":
        ids = ids.to(self.qweight.device)
        selected = Int8Projection(len(ids), self.qweight.shape[1], self.choose_kernel())
        selected.qweight, selected.scale = self.qweight[ids].contiguous(), self.scale[ids].contiguous()
        return selected

    def choose_kernel(self) -> str:
        """The fastest kernel on this CPU for this vocabulary ("dynamic" where fbgemm runs), timed at
        1 and 8 rows once per machine (routes.py); "weight_only" on other devices.

        Timed on copies of the weights taken in turn, at least two, as the decoder's linears are
        (``compute.FEW_ROWS_STREAMED``): in a pass the vocabulary comes from memory, after the
        blocks' weights. Timed on one copy called again and again, fbgemm's kernel looked faster
        than the package's on an AMX Xeon, and the pass it chose was 0.5 ms slower at one row and
        1 ms at six (base int8: 7.86 / 10.20 ms against 7.32 / 9.35)."""
        if self.kernel is None:
            if self.qweight.device.type != "cpu":
                self.kernel = "weight_only"
            else:
                n_vocab, n_state = self.qweight.shape

                def timer(kernel: str):
                    def run() -> float:  # its random rows drawn when timed: see RouteTable.choose_kernel
                        trials = [Int8Projection(n_vocab, n_state, kernel) for _ in range(STREAMED_COPIES)]
                        for copy, trial in enumerate(trials):
                            trial.qweight = self.qweight if copy == 0 else self.qweight.clone()
                            trial.scale = self.scale
                        one, eight = torch.randn(1, n_state), torch.randn(8, n_state)
                        return sum(median_micros(lambda: [trial(x) for trial in trials])
                                   for x in (one, eight)) / len(trials)
                    return run
                self.kernel = routes_table().choose_kernel(f"int8 projection {n_vocab}x{n_state}",
                                                           {k: timer(k) for k in self.kernels_here()})
        return self.kernel

    def kernels_here(self) -> List[str]:
        """The KERNELS this PyTorch runs ("dynamic" and "static" need fbgemm, "native" its build)."""
        return [k for k in self.KERNELS if (k != "dynamic" or self._dynamic() is not None)
                and (k != "static" or has_static_product()) and (k != "native" or native.available())]

    def prepare(self) -> None:
        kernel = self.choose_kernel()
        if kernel == "rowwise":
            self._packed()
        elif kernel in ("dynamic", "static"):
            self._dynamic()
        elif kernel == "native":
            self._native()

    def _packed(self) -> Tensor:
        return self.prepared.get("packed", lambda: prepack(self.qweight), self.qweight)

    def _dynamic(self):
        """fbgemm's packed weights, or None where this PyTorch has none."""
        return self.prepared.get("dynamic", lambda: dynamic_prepack(self.qweight, self.scale), self.qweight,
                                 self.scale)

    def _native(self):
        return self.prepared.get("native", lambda: native.pack_int8(self.qweight), self.qweight)

    def forward(self, states: Tensor) -> Tensor:
        shape = states.shape
        rows = states.reshape(-1, shape[-1])
        kernel = self.choose_kernel()
        if kernel == "native":
            y = native.int8_rows(rows, self._native(), self.scale, None)
        elif kernel == "dynamic":
            y = dynamic_int8_matmul(rows.float().contiguous(), self._dynamic())
        elif kernel == "static":
            y = static_int8_matmul(rows.float(), self._dynamic())
        elif kernel == "weight_only":
            # the scale is applied in float32 afterwards, as in Int8Linear
            unit = self.prepared.get("unit", lambda: torch.ones(self.qweight.shape[0], dtype=torch.bfloat16,
                                                                device=self.qweight.device), self.qweight)
            y = torch._weight_int8pack_mm(rows.to(torch.bfloat16).contiguous(), self.qweight, unit)
            y = y.float().mul_(self.scale)
        else:
            zeros = self.prepared.get("zero points", lambda: torch.zeros(self.qweight.shape[0], dtype=torch.long),
                                      self.qweight)
            y = rowwise_int8_matmul(rows.float(), self._packed(), self.scale, zeros)
        return y.reshape(*shape[:-1], self.qweight.shape[0])


class HalfProjection(Projection):
    """The embedding's rows in bfloat16 (or float16); float32 logits."""

    def __init__(self, n_vocab: int, n_state: int, dtype: torch.dtype = torch.bfloat16):
        super().__init__()
        self.register_buffer("weight", torch.zeros(n_vocab, n_state, dtype=dtype))

    @classmethod
    def from_weight(cls, weight: Tensor, dtype: torch.dtype) -> "HalfProjection":
        module = cls(*weight.shape, dtype=dtype)
        module.weight = weight.detach().to(dtype).clone()
        return module

    def select(self, ids: Tensor) -> "HalfProjection":
        ids = ids.to(self.weight.device)
        selected = HalfProjection(len(ids), self.weight.shape[1], self.weight.dtype)
        selected.weight = self.weight[ids].contiguous()
        return selected

    def forward(self, states: Tensor) -> Tensor:
        matrix = self.prepared.get("transposed", lambda: self.weight.T.contiguous(), self.weight)  # see FloatProjection
        rows = states.reshape(-1, states.shape[-1]).to(matrix.dtype)
        if rows.device.type == "cpu":  # one row at a time, for the reason given at compute.HalfLinear.rows_alone
            logits = torch.cat([rows[i:i + 1] @ matrix for i in range(rows.shape[0])]).float()
        else:
            logits = (rows @ matrix).float()
        return logits.reshape(*states.shape[:-1], matrix.shape[1])


def project(decoder: nn.Module, states: Tensor) -> Tensor:
    """Vocabulary logits through the tied token embedding, by the decoder's projection module
    (projection.py: its compute type's kernel), in fp32 as whisper returns them.

    states : shape = (..., n_state) -> (..., n_vocab)
    """
    return of(decoder)(states).float()


def next_token_logits(model: nn.Module, states: Tensor) -> Tensor:
    """The next-token logits greedy decoding reads from decoder states: through a Medusa model's
    base head first when it has one (``heads.base_state``), which whisper's own decoder would not apply.

    states : shape = (..., n_state) -> (..., n_vocab)
    """
    heads = getattr(model, "medusa", None)
    return project(model.decoder, heads.base_state(states) if heads is not None else states)
