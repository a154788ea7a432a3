"""Int8 arithmetic shared by the int8 linears (compute.py) and the int8 vocabulary projection
(projection.py), and ``Prepared``: the forms of a module's weights that a kernel wants, kept on the
module itself.

No model and no options here: tensors in, tensors out.
"""

from __future__ import annotations

import functools
import warnings
from typing import Callable, Dict, Hashable, Optional, Tuple

import torch
from torch import Tensor


class Prepared:
    """Forms of one module's weights made for a kernel (oneDNN's prepacked weights, a dequantised or
    transposed copy), made on first use and kept on the module, not in a registry of the package.

    Each form is remembered with what it was made from and made again when that changed: tensors and
    modules by identity (a state dict loaded with ``assign=True`` puts new tensors in), numbers and
    strings by value (a parameter's ``data_ptr()``, which ``module.to`` changes in place). A module
    that holds one clears it when a state dict is loaded into it in place (``_load_from_state_dict``).
    Never saved and never copied: a copied module makes its own forms (oneDNN's prepacked tensors
    cannot be deep-copied).
    """

    def __init__(self):
        self._forms: Dict[Hashable, Tuple[Tuple[object, ...], object]] = {}

    def get(self, key: Hashable, make: Callable[[], object], *sources: object):
        """The form ``key``, made by ``make()`` unless it was made from these very ``sources``."""
        held = self._forms.get(key)
        if held is not None and len(held[0]) == len(sources) and all(map(_same, held[0], sources)):
            return held[1]
        form = make()
        self._forms[key] = (sources, form)
        return form

    def clear(self) -> None:
        self._forms.clear()

    def __deepcopy__(self, memo) -> "Prepared":
        return Prepared()

    def __reduce__(self):
        return (Prepared, ())


def _same(a: object, b: object) -> bool:
    if isinstance(a, (int, float, str)) and type(a) is type(b):
        return a == b
    return a is b


def quantize_rows(weight: Tensor) -> Tuple[Tensor, Tensor]:
    """Symmetric int8 quantisation with one scale per row (per output channel).

    weight  : shape = (n_out, n_in), floating point
    returns : int8 of shape (n_out, n_in) and float32 scales of shape (n_out,), weight ~ q * scale[:, None]
    """
    w = weight.detach().float()
    scale = (w.abs().amax(dim=1) / 127.0).clamp(min=1e-12)
    q = torch.round(w / scale[:, None]).clamp_(-127, 127).to(torch.int8)
    return q, scale


def prepack(qweight: Tensor) -> Tensor:
    """oneDNN's prepacked form of int8 weights, for ``rowwise_int8_matmul``."""
    return torch.ops.onednn.qlinear_prepack(qweight, None)


def rowwise_int8_matmul(x: Tensor, packed: Tensor, scale: Tensor, zero_points: Tensor) -> Tensor:
    """x @ (qweight * scale[:, None]).T with x quantised to int8 row by row, in exact integer arithmetic.

    x           : shape = (M, n_in) float32 -> (M, n_out) float32
    packed      : ``prepack(qweight)``
    zero_points : zeros of shape (n_out,), long (the weights' zero points, made once by the caller)

    Each row is scaled to the kernel's exact range by its own maximum, so a row's result is the same
    whichever rows it is computed with.
    """
    levels, zero_point = activation_range()
    row_scale = x.abs().amax(dim=1, keepdim=True).clamp_(min=1e-30) / levels
    # oneDNN's u8s8 path: activations as uint8 around a zero point
    q = torch.round(x / row_scale).add_(zero_point).to(torch.uint8)
    y = torch.ops.onednn.qlinear_pointwise(q, 1.0, zero_point, packed, scale, zero_points, None,
                                           1.0, 0, torch.float32, "none", [], "")
    return y.mul_(row_scale)


@functools.lru_cache(maxsize=1)
def activation_range() -> Tuple[int, int]:
    """(levels, zero point) of the uint8 activations ``rowwise_int8_matmul`` gives oneDNN.

    With VNNI (or AMX) oneDNN's u8s8 products sum exactly, and activations use the full 8 bits
    (-127..127 around 128). Without it (AVX2 only), the kernel adds pairs of u8 x s8 products in
    saturating 16-bit arithmetic (vpmaddubsw), so 8-bit activations overflow (measured on an AVX2
    EPYC: 14 % relative error); 7 bits (-63..63 around 64) cannot (2 x 127 x 127 < 32,767), as in
    PyTorch's own ``reduce_range`` for x86. Which one holds is measured here, on a worst case."""
    n_in = 64
    weight = torch.full((8, n_in), 127, dtype=torch.int8)
    packed = torch.ops.onednn.qlinear_prepack(weight, None)
    q = torch.full((1, n_in), 255, dtype=torch.uint8)  # largest activation, all of one sign
    y = torch.ops.onednn.qlinear_pointwise(q, 1.0, 0, packed, torch.ones(8), torch.zeros(8, dtype=torch.long), None,
                                           1.0, 0, torch.float32, "none", [], "")
    exact = float(255 * 127 * n_in)
    return (127, 128) if bool((y == exact).all()) else (63, 64)


def dynamic_prepack(qweight: Tensor, scale: Tensor) -> Optional[object]:
    """fbgemm's packed form of int8 weights with one scale per row, for ``dynamic_int8_matmul``; None
    where this PyTorch has no such product (not x86, or built without fbgemm, or its quantized
    tensors, deprecated since 2.10, are gone)."""
    try:
        with warnings.catch_warnings():  # the deprecation of quantized tensors, which only carry the weights here
            warnings.simplefilter("ignore")
            weight = torch._make_per_channel_quantized_tensor(
                qweight, scale.double(), torch.zeros(len(scale), dtype=torch.long, device=qweight.device), 0)
            return torch.ops.quantized.linear_prepack(weight, None)
    except (AttributeError, RuntimeError, NotImplementedError):
        return None


def dynamic_int8_matmul(rows: Tensor, packed: object) -> Tensor:
    """rows @ (qweight * scale[:, None]).T for float32 rows (M, n_in) -> (M, n_out) float32, by fbgemm:
    a row is quantised to uint8 between its own minimum and maximum, multiplied in exact integer
    arithmetic and scaled back to float32.

    fbgemm takes one range for all the rows it is given, so each row is given alone: a row's result
    is the same whichever rows it is computed with. The range is 7 bits where the machine's product
    would saturate at 8 (``dynamic_reduce_range``)."""
    reduce = dynamic_reduce_range()
    if rows.shape[0] == 1:
        return torch.ops.quantized.linear_dynamic(rows, packed, reduce)
    return torch.cat([torch.ops.quantized.linear_dynamic(rows[i:i + 1], packed, reduce) for i in range(rows.shape[0])])


def static_int8_matmul(rows: Tensor, packed: object) -> Tensor:
    """rows @ (qweight * scale[:, None]).T for float32 rows (M, n_in) -> (M, n_out) float32, by fbgemm
    in one call for all rows (``dynamic_prepack``'s weights): each row quantised to int8 with its own
    scale (symmetric; 7 bits where the product would saturate at 8, ``static_levels``), given
    as integers around a zero point with scale 1 to fbgemm's static-scale product, its sums exact,
    and scaled back by the row's scale. A row's result is the same whichever rows it is computed
    with, and a row more costs little: the weights are read once for all of them."""
    levels = static_levels()
    row_scale = rows.abs().amax(dim=1, keepdim=True).clamp_(min=1e-30) / levels
    y = torch.ops.quantized.linear_with_input_q_dq_qweight_dq_output_fp32(torch.round(rows / row_scale), 1.0,
                                                                          levels + 1, packed)
    return y.mul_(row_scale)


@functools.lru_cache(maxsize=1)
def static_levels() -> int:
    """The levels either side of zero of ``static_int8_matmul``'s rows: 127 where fbgemm's u8 x s8
    sums are exact, 63 where they saturate at 16 bits (no VNNI: vpmaddubsw). Measured here on the
    worst case, as ``activation_range`` for oneDNN."""
    packed = dynamic_prepack(torch.full((8, 64), 127, dtype=torch.int8), torch.ones(8))
    y = torch.ops.quantized.linear_with_input_q_dq_qweight_dq_output_fp32(torch.full((1, 64), 127.0), 1.0, 128, packed)
    return 127 if bool((y == 127 * 127 * 64).all()) else 63


@functools.lru_cache(maxsize=1)
def has_static_product() -> bool:
    """Whether this PyTorch has fbgemm's static-scale product (``static_int8_matmul``)."""
    return hasattr(torch.ops.quantized, "linear_with_input_q_dq_qweight_dq_output_fp32") and \
        dynamic_prepack(torch.ones(1, 1, dtype=torch.int8), torch.ones(1)) is not None


@functools.lru_cache(maxsize=1)
def dynamic_reduce_range() -> bool:
    """Whether ``dynamic_int8_matmul`` must quantise rows to 7 bits, not 8: as ``activation_range``
    for oneDNN, fbgemm sums pairs of u8 x s8 products in saturating 16-bit arithmetic on CPUs without
    VNNI (an AVX2 EPYC: the worst case below gives 4,112 for 8,128). Measured here, on that case."""
    packed = dynamic_prepack(torch.full((8, 64), 127, dtype=torch.int8), torch.ones(8))
    if packed is None:
        return True
    y = torch.ops.quantized.linear_dynamic(torch.ones(1, 64), packed, False)
    return not bool((y == 127 * 64).all())
