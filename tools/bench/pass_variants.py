"""The int8 decoder pass four ways on this CPU: what its attention and its step's shape cost (issue 46, item 4).

    python -m tools.bench pass-variants --model base --rows 1,4,8 --threads 2

Each variant runs the same pass as ``python -m tools.bench pass`` (a cache of 60 tokens, then
``rows`` new rows, the int8 vocabulary projection), the variants interleaved, medians of ``--reps``:

- the CPU's pass as loaded here (``step.cpu.cpu_step``; on CPUs with native bfloat16, row-
  invariant attention over bfloat16 keys and values);
- the same with that invariant attention in float32;
- the same with PyTorch's fused attention kernel, one row at a time in a pass of several (what an
  AVX2-only CPU runs);
- ``step.fixed.FixedStep`` with the model's int8 layers as its products (not the float32 copies it
  makes today) and the fused kernel over every one of the 448 slots: fewer, fixed-shape calls.

Beside each: the ATen operators one pass calls, and whether the pass's last row gets the bits it
gets in a pass alone (what lossless decoding needs of the verification pass; "-" for one row).
An experiment: nothing in the package runs the float32 or fixed variants on the CPU.
"""

from __future__ import annotations

import argparse
import collections
import contextlib
import statistics
import time
from typing import Callable, Dict, Iterator, Tuple

import torch
import whisper
from torch import Tensor, nn

import medusa_whisper
from medusa_whisper.step import fixed
from medusa_whisper.step.attention import chain_mask
from medusa_whisper.step.cpu import cpu_step
from medusa_whisper.step.projection import project
from medusa_whisper.step.routes import isa_features, machine_id
from tools.bench.decoder_pass import AUDIO, CONTEXT, profile_pass

Pass = Callable[[int, int], Tensor]  # (first new position, rows) -> logits of those rows


def cpu_pass(model: nn.Module, features: Tensor, tokens: Tensor) -> Pass:
    """The CPU's pass: rows [first, first + n) of ``tokens`` after the cache's first ``first`` slots
    (written by the prompt or an earlier call). Made inside ``attention_as``: the step takes the
    attention set there."""
    step = cpu_step(model, 1, features.dtype)
    step.set_audio(features)
    step.pass_at(tokens[:, :CONTEXT], torch.arange(CONTEXT), 0, chain_mask(0, CONTEXT, "cpu"))

    def run(first: int, n: int) -> Tensor:
        return step.logits(step.pass_at(tokens[:, first:first + n], torch.arange(first, first + n), first,
                                        chain_mask(first, n, "cpu")))
    return run


@contextlib.contextmanager
def attention_as(model: nn.Module, variant: str) -> Iterator[None]:
    """The decoder's blocks set to attend as ``variant`` while inside (their attributes restored after)."""
    blocks = list(model.decoder.blocks)
    saved = [(b.attn.__dict__.get("row_invariant"), b.attn.__dict__.get("invariant_dtype")) for b in blocks]
    for block in blocks:
        for attn in (block.attn, block.cross_attn):
            if variant == "float32 invariant":  # also where the model loaded without invariant attention
                attn.row_invariant, attn.invariant_dtype = True, torch.float32
            elif variant == "fused, rows alone":
                attn.row_invariant = False
    try:
        yield
    finally:
        for block, (invariant, dtype) in zip(blocks, saved):
            for attn in (block.attn, block.cross_attn):
                attn.row_invariant, attn.invariant_dtype = invariant, dtype


def int8_layer(block: nn.Module, residual: torch.dtype, dtype: torch.dtype) -> fixed.Layer:
    """``fixed.layer_products`` with the block's int8 layers themselves as the products."""
    dense = fixed.layer_products(block, residual, dtype)
    attn, cross, mlp = block.attn, block.cross_attn, block.mlp
    return fixed.Layer(attn_ln=dense.attn_ln, qkv=attn.__dict__["qkv"], out=attn.out, cross_ln=dense.cross_ln,
                       cross_query=cross.query, cross_out=cross.out, cross_key=cross.key, cross_value=cross.value,
                       mlp_ln=dense.mlp_ln, fc1=mlp[0], fc2=mlp[2])


@contextlib.contextmanager
def modules_as_products() -> Iterator[None]:
    """``fixed.linear`` calling a product that is a module (an Int8Linear) as the module."""
    plain = fixed.linear
    fixed.linear = lambda x, product: product(x) if isinstance(product, nn.Module) else plain(x, product)
    try:
        yield
    finally:
        fixed.linear = plain


def fixed_pass(model: nn.Module, features: Tensor, tokens: Tensor) -> Pass:
    step = fixed.FixedStep(model)
    step.layers = [int8_layer(block, step.residual, step.dtype) for block in model.decoder.blocks]
    with modules_as_products():
        step.set_audio(features)
        step(tokens[:, :CONTEXT], torch.arange(CONTEXT)[None])

    def run(first: int, n: int) -> Tensor:  # positions are written where they are: no rollback needed
        with modules_as_products():
            return project(model.decoder, step(tokens[:, first:first + n], torch.arange(first, first + n)[None]))
    return run


def invariant(run: Pass, rows: int) -> str:
    """Whether the last of ``rows`` rows gets, in one pass of them all, the bits it gets in a pass alone."""
    if rows == 1:
        return "-"
    together = run(CONTEXT, rows)[:, -1]
    run(CONTEXT, rows - 1)
    alone = run(CONTEXT + rows - 1, 1)[:, -1]
    return "yes" if torch.equal(together, alone) else "no"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="base")
    parser.add_argument("--rows", default="1,4,8")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--reps", type=int, default=40)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    machine = machine_id()
    print(f"{machine['cpu']} ({isa_features()}), torch {machine['torch']}, {args.threads} threads, {args.model} int8, "
          f"{CONTEXT} cached tokens", flush=True)
    model = medusa_whisper.load_model(args.model, device="cpu", compute_type="int8")
    default = model.decoder.blocks[0].attn.__dict__.get("invariant_dtype")
    audio = whisper.pad_or_trim(whisper.load_audio(str(AUDIO)))
    mel = whisper.log_mel_spectrogram(audio, model.dims.n_mels)[None]
    rows_list = [int(r) for r in args.rows.split(",")]
    tokens = torch.randint(0, 50000, (1, CONTEXT + max(rows_list)), generator=torch.Generator().manual_seed(0))
    names = [f"as loaded ({'invariant, ' + str(default).split('.')[-1] if default else 'fused, rows alone'})"]
    names += [v for v in ("float32 invariant", "fused, rows alone") if default is not None or v != "fused, rows alone"]
    names += ["fixed step, int8 products, fused over every slot"]
    print("\n| variant | rows | ms per pass | min ms | ATen ops | last row's bits as alone |\n|---|---|---|---|---|---|")
    with torch.inference_mode():
        features = model.embed_audio(mel)
        passes: Dict[str, Tuple[Pass, str]] = {}
        for name in names:
            if name.startswith("fixed"):
                passes[name] = (fixed_pass(model, features, tokens), "")
            else:
                variant = name if not name.startswith("as loaded") else ""
                with attention_as(model, variant):
                    passes[name] = (cpu_pass(model, features, tokens), variant)
        for rows in rows_list:
            times = collections.defaultdict(list)
            for rep in range(args.reps + 2):  # the first two rounds warm up
                for name, (run, variant) in passes.items():
                    with attention_as(model, variant):
                        began = time.perf_counter()
                        run(CONTEXT, rows)
                        if rep >= 2:
                            times[name].append((time.perf_counter() - began) * 1e3)
            for name, (run, variant) in passes.items():
                with attention_as(model, variant):
                    ops = profile_pass(lambda: run(CONTEXT, rows), 1.0)["aten_ops"]
                    bits = invariant(run, rows)
                print(f"| {name} | {rows} | {statistics.median(times[name]):.2f} | {min(times[name]):.2f} | {ops} | "
                      f"{bits} |", flush=True)


if __name__ == "__main__":
    main()
