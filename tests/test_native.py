"""The package's own row-invariant products (step/native, built by `make setup`): on every
instruction set this CPU runs, an int8 row's result is the integer reference's to the bit and a
float32 row's is the same on every path, each row of a call equals that row alone at 1-9 rows and
1-2 threads, and the package never compiles them on a user's transcription."""

import shutil

import pytest
import torch
from torch import nn

from medusa_whisper.step import compute, native
from medusa_whisper.step.projection import Int8Projection

from test_row_kernels import rows_of_every_kind

built = pytest.mark.skipif(not native.available(), reason="no compiler when the package was set up")
SHAPES = [(200, 96), (64, 64), (130, 30), (7, 5)]  # channels past a group of 64, k not a multiple of 4


def test_setup_builds_the_kernels_where_a_compiler_exists():
    if shutil.which("c++") is None:
        pytest.skip("no C++ compiler here: the package runs on PyTorch's kernels")
    assert native.available(), "make setup (python -m medusa_whisper.step.native) did not build the row kernels"


@pytest.fixture(params=["scalar", "avx2", "avx512"])
def isa(request):
    module = native.kernels()
    if module is None or request.param not in module.isas():
        pytest.skip(f"{request.param} does not run here")
    before = module.isa()
    module.set_isa(request.param)
    yield request.param
    module.set_isa(before)


def integer_reference(x, qweight, scale, bias):
    """Each row quantised alone to 127 levels, the sums exact (float64 holds them), the same epilogue."""
    row_scale = x.abs().amax(1, keepdim=True).clamp_min(1e-30) / 127
    levels = torch.round(x / row_scale).clamp(-127, 127)
    sums = (levels.double() @ qweight.double().T).to(torch.int32)
    y = sums.float() * scale * row_scale
    return y if bias is None else y + bias


@built
@pytest.mark.parametrize("shape", SHAPES)
def test_int8_rows_are_the_integer_reference_to_the_bit(isa, shape):
    n, k = shape
    generator = torch.Generator().manual_seed(n)
    layer = compute.Int8Linear.from_linear(nn.Linear(k, n))
    layer.qweight[0] = -127  # the widest weights either side
    layer.qweight[-1] = 127
    packed = native.pack_int8(layer.qweight)
    for bias in (layer.bias, None):
        x = rows_of_every_kind(9, k, generator) * 3
        assert torch.equal(native.int8_rows(x, packed, layer.scale, bias),
                           integer_reference(x, layer.qweight, layer.scale, bias)), (isa, bias is None)


def each_row_alone(product, k):
    generator = torch.Generator().manual_seed(k)
    for threads in (1, 2):
        torch.set_num_threads(threads)
        try:
            for n in range(1, 10):
                x = rows_of_every_kind(n, k, generator)
                together = product(x)
                for i in range(n):
                    assert torch.equal(together[i:i + 1], product(x[i:i + 1])), (n, i, threads)
        finally:
            torch.set_num_threads(2)


@built
@pytest.mark.parametrize("shape", SHAPES[:2])
def test_each_row_of_a_call_is_that_row_alone(isa, shape):
    n, k = shape
    linear = nn.Linear(k, n)
    layer = compute.Int8Linear.from_linear(linear)
    packed = native.pack_int8(layer.qweight)
    each_row_alone(lambda x: native.int8_rows(x, packed, layer.scale, layer.bias), k)
    module = native.kernels()
    packed_float = module.pack_float(linear.weight.detach())
    each_row_alone(lambda x: module.float_rows(x, packed_float, linear.bias.detach(), n), k)


@built
@pytest.mark.parametrize("shape", SHAPES)
def test_float32_rows_take_the_same_bits_on_every_path(shape):
    n, k = shape
    module = native.kernels()
    linear = nn.Linear(k, n)
    weight, bias = linear.weight.detach(), linear.bias.detach()
    packed = module.pack_float(weight)
    x = torch.randn(9, k, generator=torch.Generator().manual_seed(2))
    before = module.isa()
    results = {}
    try:
        for name in module.isas():
            module.set_isa(name)
            results[name] = module.float_rows(x, packed, bias, n)
    finally:
        module.set_isa(before)
    for name, y in results.items():
        assert torch.equal(y, results["scalar"]), name
    torch.testing.assert_close(results["scalar"], nn.functional.linear(x, weight, bias), rtol=1e-5, atol=1e-5)


@built
def test_a_layer_and_the_vocabulary_give_the_kernels_result():
    layer = compute.Int8Linear.from_linear(nn.Linear(96, 200))
    x = torch.randn(5, 96)
    y, bias = layer._few_rows(x, "native", layer.bias)
    assert bias is None
    assert torch.equal(y, integer_reference(x, layer.qweight, layer.scale, layer.bias))
    projection = Int8Projection.from_weight(torch.randn(300, 96))
    projection.kernel = "native"
    assert torch.equal(projection(x[None])[0], integer_reference(x, projection.qweight, projection.scale, None))


def test_without_a_build_nothing_compiles_and_the_choices_leave_it_out(tmp_path, monkeypatch):
    from torch.utils import cpp_extension

    monkeypatch.setenv(native.KERNELS_ENV, str(tmp_path))
    monkeypatch.setattr(cpp_extension, "load", lambda *a, **k: pytest.fail("compiled on use"))
    native.kernels.cache_clear()
    try:
        assert not native.available()
        assert "native" not in Int8Projection.from_weight(torch.randn(30, 8)).kernels_here()
    finally:
        native.kernels.cache_clear()


def test_a_failed_build_says_so_in_one_line_and_setup_goes_on(tmp_path, monkeypatch, capsys):
    from torch.utils import cpp_extension

    def no_compiler(*args, **kwargs):
        raise RuntimeError("Error building extension: c++: not found\nmore lines")
    monkeypatch.setenv(native.KERNELS_ENV, str(tmp_path))
    monkeypatch.setattr(cpp_extension, "load", no_compiler)
    try:
        assert native.main() == 0
    finally:
        native.kernels.cache_clear()
    out = capsys.readouterr().out.strip().splitlines()
    assert len(out) == 1 and "not built" in out[0] and "c++: not found" in out[0]
