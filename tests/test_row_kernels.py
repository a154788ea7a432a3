"""The int8 kernels a decoder pass's few rows may take (compute.FEW_ROWS_KERNELS, the vocabulary's
Int8Projection.KERNELS): each row of a call gets the bits it gets alone, at any number of rows and
threads, on random and extreme rows; the per-row int8 ones are fbgemm's and oneDNN's forms of one
product; the choice is timed once per machine and decides the bits of every pass."""

import pytest
import torch
from torch import nn

from medusa_whisper import MedusaConfig, decode
from medusa_whisper.step import compute, int8_kernels
from medusa_whisper.step.projection import Int8Projection

from helpers import random_model, randomize_heads

ROWS = range(1, 10)


def rows_of_every_kind(n: int, n_in: int, generator: torch.Generator) -> torch.Tensor:
    """n rows, random and extreme: a zero row, a huge one, a tiny one, one with a single spike."""
    x = torch.randn(n, n_in, generator=generator)
    extremes = [torch.zeros(n_in), torch.full((n_in,), 3e4), torch.full((n_in,), -1e-6),
                torch.nn.functional.one_hot(torch.tensor(3), n_in).float() * 50]
    for i, row in enumerate(extremes[:n]):
        x[(i * 3) % n] = row
    return x


def each_row_is_its_own(product, n_in: int) -> None:
    generator = torch.Generator().manual_seed(0)
    for threads in (1, 2):
        torch.set_num_threads(threads)
        try:
            for n in ROWS:
                x = rows_of_every_kind(n, n_in, generator)
                together = product(x)
                for i in range(n):
                    assert torch.equal(together[i:i + 1], product(x[i:i + 1])), (n, i, threads)
        finally:
            torch.set_num_threads(2)


@pytest.mark.parametrize("kernel", compute.FEW_ROWS_KERNELS)
def test_each_few_rows_kernel_gives_a_row_the_bits_it_gets_alone(kernel):
    if kernel == "static" and not int8_kernels.has_static_product():
        pytest.skip("this PyTorch has no fbgemm")
    layer = compute.Int8Linear.from_linear(nn.Linear(96, 200))

    def product(x):
        y, bias = layer._few_rows(x, kernel, layer.bias)
        return y if bias is None else y + bias
    each_row_is_its_own(product, 96)
    x = torch.randn(4, 96)
    exact = nn.functional.linear(x, layer.qweight.float() * layer.scale[:, None], layer.bias)
    assert float((product(x) - exact).norm() / exact.norm()) < 0.03  # 8-bit rows: about 1 %


@pytest.mark.skipif(not int8_kernels.has_static_product(), reason="this PyTorch has no fbgemm")
def test_fbgemms_and_onednns_per_row_products_are_one_product_where_their_rows_take_the_same_levels():
    if int8_kernels.static_levels() != int8_kernels.activation_range()[0]:
        pytest.skip("here one of the two saturates at 8 bits and the other does not")
    layer = compute.Int8Linear.from_linear(nn.Linear(64, 150))
    x = rows_of_every_kind(7, 64, torch.Generator().manual_seed(1))
    assert torch.equal(layer._few_rows(x, "static", None)[0], layer._few_rows(x, "rowwise", None)[0])


@pytest.mark.skipif(not int8_kernels.has_static_product(), reason="this PyTorch has no fbgemm")
def test_the_static_levels_are_exact_on_the_worst_case():
    """A row of the largest integers against weights of 127 sums exactly at the levels chosen here."""
    levels = int8_kernels.static_levels()
    packed = int8_kernels.dynamic_prepack(torch.full((4, 64), 127, dtype=torch.int8), torch.ones(4))
    y = int8_kernels.static_int8_matmul(torch.full((1, 64), float(levels)), packed)
    assert torch.equal(y, torch.full((1, 4), 127.0 * levels * 64))


@pytest.mark.parametrize("kernel", Int8Projection.KERNELS)
def test_each_vocabulary_kernel_gives_a_row_the_bits_it_gets_alone(kernel):
    projection = Int8Projection.from_weight(torch.randn(700, 64))
    if kernel not in projection.kernels_here():
        pytest.skip(f"{kernel} does not run here")
    projection.kernel = kernel
    each_row_is_its_own(projection, 64)


def test_the_few_rows_kernel_is_timed_once_per_machine_and_kept(unpinned, monkeypatch):
    from medusa_whisper.step import routes

    chosen = compute.few_rows_kernel(48, 32)
    assert chosen in compute.FEW_ROWS_KERNELS
    saved = routes.table().choices["int8 few rows 48x32"]
    assert saved["route"] == chosen and set(saved["us"]) <= set(compute.FEW_ROWS_KERNELS)
    compute._few_rows_kernel.cache_clear()
    monkeypatch.setattr(compute, "median_micros", lambda fn: pytest.fail("timed again"))
    assert compute.few_rows_kernel(48, 32) == chosen


@pytest.mark.parametrize("kernel", compute.FEW_ROWS_KERNELS)
def test_speculation_at_int8_equals_int8_greedy_whichever_kernel_the_rows_take(kernel, monkeypatch):
    """Verified rows are multiplied with the rows of plain decoding's passes by the same kernel, so
    lossless decoding gives plain decoding's tokens with any of them."""
    if kernel == "static" and not int8_kernels.has_static_product():
        pytest.skip("this PyTorch has no fbgemm")
    monkeypatch.setattr(compute, "few_rows_kernel", lambda n_out, n_in: kernel)
    model = compute.apply_compute_type(randomize_heads(random_model(MedusaConfig(num_heads=3)), std=0.065), "int8")
    mel = torch.randn(80, 3000, generator=torch.Generator().manual_seed(5))
    plain = decode(model, mel, language="en", without_timestamps=True, mode="off", sample_len=60)
    speculative = decode(model, mel, language="en", without_timestamps=True, sample_len=60)
    assert speculative.tokens == plain.tokens
    assert speculative.decoder_steps < speculative.tokens_produced  # rows were verified together
