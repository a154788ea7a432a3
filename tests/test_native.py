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

from test_row_kernels import each_row_is_its_own, rows_of_every_kind

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


@built
@pytest.mark.parametrize("shape", SHAPES[:2])
def test_each_row_of_a_call_is_that_row_alone(isa, shape):
    n, k = shape
    linear = nn.Linear(k, n)
    layer = compute.Int8Linear.from_linear(linear)
    packed = native.pack_int8(layer.qweight)
    each_row_is_its_own(lambda x: native.int8_rows(x, packed, layer.scale, layer.bias), k)
    module = native.kernels()
    packed_float = module.pack_float(linear.weight.detach())
    each_row_is_its_own(lambda x: module.float_rows(x, packed_float, linear.bias.detach(), n), k)


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


def test_a_build_this_user_may_not_read_is_no_build(tmp_path, monkeypatch):
    """Set up by root, run by a user who may not enter root's cache: PyTorch's kernels, no error."""
    from pathlib import Path

    def denied(self, *args, **kwargs):
        raise PermissionError(13, "Permission denied", str(self))
    monkeypatch.setenv(native.KERNELS_ENV, str(tmp_path))
    monkeypatch.setattr(Path, "is_dir", denied)
    native.kernels.cache_clear()
    try:
        assert not native.available()
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


def attention_inputs(dtype, batch=1, rows=9, n_key=200, n_head=4, d_head=64, seed=0):
    generator = torch.Generator().manual_seed(seed)
    q = torch.randn(batch, rows, n_head * d_head, generator=generator) * 2
    k = torch.randn(batch, n_head, n_key, d_head, generator=generator).to(dtype)
    v = torch.randn(batch, n_head, n_key, d_head, generator=generator).to(dtype)
    return q, k, v


def reference_attention(q, k, v, n_head, allowed):
    batch, rows, n_state = q.shape
    heads = q.view(batch, rows, n_head, -1).transpose(1, 2)
    mask = None if allowed is None else (allowed if allowed.dim() == 3 else allowed[None])[:, None]
    out = nn.functional.scaled_dot_product_attention(heads.double(), k.double(), v.double(), attn_mask=mask)
    return out.transpose(1, 2).reshape(batch, rows, n_state).float()


@built
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
def test_attention_gives_each_row_its_own_bits_over_any_slots_beside_any_rows(isa, dtype):
    q, k, v = attention_inputs(dtype)
    capacity, seen = k.shape[2], 60
    allowed = torch.zeros(9, capacity, dtype=torch.bool)  # a chain: row i sees slots [0, seen + i]
    for row in range(9):
        allowed[row, :seen + row + 1] = True
    full = native.attend(q, k, v, 4, allowed)
    torch.testing.assert_close(full, reference_attention(q, k, v, 4, allowed), rtol=1e-5, atol=1e-5)
    for threads in (1, 2):
        torch.set_num_threads(threads)
        try:
            for n in range(1, 10):
                first = (n * 7) % (10 - n)
                part = native.attend(q[:, first:first + n], k, v, 4, allowed[first:first + n])
                assert torch.equal(part, full[:, first:first + n]), (n, threads)
        finally:
            torch.set_num_threads(2)
    for length in (80, 96, 144):  # fewer slots, the unwritten ones still masked: the same bits
        assert torch.equal(native.attend(q, k[:, :, :length], v[:, :, :length], 4, allowed[:, :length]), full), length


@built
def test_attention_gives_a_stream_its_bits_beside_other_streams_and_on_every_path():
    module = native.kernels()
    q, k, v = attention_inputs(torch.bfloat16, batch=3, rows=2, n_key=1500)
    allowed = torch.zeros(3, 2, 1500, dtype=torch.bool)
    for b, seen in enumerate((5, 700, 1490)):
        allowed[b, :, :seen] = True
    together = native.attend(q, k, v, 4, allowed)
    for b in range(3):
        assert torch.equal(native.attend(q[b:b + 1], k[b:b + 1], v[b:b + 1], 4, allowed[b:b + 1]), together[b:b + 1])
    no_mask = native.attend(q, k, v, 4, None)
    torch.testing.assert_close(no_mask, reference_attention(q, k, v, 4, None), rtol=1e-5, atol=1e-5)
    before = module.isa()
    try:
        for name in module.isas():
            module.set_isa(name)
            assert torch.equal(native.attend(q, k, v, 4, allowed), together), name
    finally:
        module.set_isa(before)


@built
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
def test_attention_gives_a_tree_row_the_bits_of_its_path(isa, dtype):
    """A tree's branch sees its ancestors at other slots, masked slots between: the same keys in the
    same order, so the bits of that path decoded one row at a time."""
    q, k, v = attention_inputs(dtype, rows=1, n_key=48)
    seen = 30
    path = torch.zeros(1, 48, dtype=torch.bool)
    path[0, :seen + 1] = True  # slots 0..30, the last one its own
    moved_k, moved_v = k.clone(), v.clone()
    moved_k[:, :, seen + 7], moved_v[:, :, seen + 7] = k[:, :, seen], v[:, :, seen]  # its key at slot 37
    moved_k[:, :, seen], moved_v[:, :, seen] = torch.randn(4, 64).to(dtype), torch.randn(4, 64).to(dtype)
    branch = torch.zeros(1, 48, dtype=torch.bool)
    branch[0, :seen] = True
    branch[0, seen + 7] = True
    assert torch.equal(native.attend(q, moved_k, moved_v, 4, branch), native.attend(q, k, v, 4, path))
