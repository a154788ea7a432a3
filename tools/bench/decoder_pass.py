"""What one decoder pass costs, beside what its bytes ask of this machine's memory.

    python -m tools.bench pass --model base --compute-types float32,int8,bfloat16 --threads 2

For each compute type and 1, 2, 4, 8 and 16 new rows after a cache of 60 tokens, on the encoder
output of a real recording: milliseconds per pass (the decoder step on the CPU's products + the vocabulary projection,
median of repetitions, compute types interleaved), the ATen operators one pass calls (torch
profiler), the bytes one pass must read (the decoder weights it multiplies, the projection, the
cross-attention keys and values of 1,500 audio positions, the self-attention cache), and the floor:
those bytes over the read bandwidth measured here on a working set of the same size. Prints the CPU
and its ISA features, a Markdown table, and writes JSON (``--out``).

    python -m tools.bench pass --model base --compute-types int8 --rows 1 --threads 1 --parts

``--int8-kernel native`` (or weight_only, static, rowwise) makes every int8 decoder linear's few rows,
and the vocabulary where it runs that kernel, take that kernel instead of the one chosen here.
``--layers one-call,one-by-one`` times the decoder's layers both ways where the package's kernels
run them as one call (``step/native_decoder.py``), interleaved with the rest; the profiler's split
into products, attention and other is given for the layers called one by one only (the one call is
not an ATen operator).

``--parts`` instead times where one pass goes, with the layers called one by one, by taking each part out in turn (it returns zeros of
its shape; the passes alternate, medians): cross-attention, self-attention, the linears, the
vocabulary product; and the cost per operator that no byte explains: the same decoder structure
(layers, heads, modules, compute type) 64 wide instead of the model's width.
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from pathlib import Path
from typing import Dict, Iterable

import torch
import whisper
from torch import Tensor, nn

import medusa_whisper
from medusa_whisper.step import compute
from medusa_whisper.step.attention import chain_mask
from medusa_whisper.step.cpu import cpu_step
from medusa_whisper.step.projection import Int8Projection
from medusa_whisper.step.routes import isa_features, machine_id
from tools import ROOT

AUDIO = ROOT / "tests" / "data" / "real" / "jfk.flac"
CONTEXT = 60


def read_bandwidth(n_bytes: int, reps: int = 9) -> float:
    """Bytes per second that summing a float32 buffer of ``n_bytes`` reads (median), which stands for
    how fast a pass can stream a working set of that size."""
    buffer = torch.rand(max(n_bytes // 4, 1 << 16))
    buffer.sum()
    times = []
    for _ in range(reps):
        began = time.perf_counter()
        buffer.sum()
        times.append(time.perf_counter() - began)
    return buffer.numel() * 4 / statistics.median(times)


def _tensor_bytes(tensors: Iterable[Tensor]) -> int:
    seen, total = set(), 0
    for t in tensors:
        if t is None or t.data_ptr() in seen:
            continue
        seen.add(t.data_ptr())
        total += t.numel() * t.element_size()
    return total


def _own(module: nn.Module):
    yield from module.parameters(recurse=True)
    yield from module.buffers(recurse=True)


def pass_bytes(model: nn.Module, step, rows: int) -> Dict[str, int]:
    """Bytes one pass reads: weights it multiplies, the projection, cross K/V, the self-attention cache."""
    decoder = model.decoder
    weights = []
    for block in decoder.blocks:
        fused = block.attn.__dict__.get("qkv")
        parts = [fused] if fused is not None else [block.attn.query, block.attn.key, block.attn.value]
        # the cross-attention's key and value layers run once per window, not per pass
        parts += [block.attn.out, block.cross_attn.query, block.cross_attn.out, block.mlp, block.attn_ln,
                  block.cross_attn_ln, block.mlp_ln]
        for part in parts:
            weights += list(_own(part))
    weights += list(_own(decoder.ln))
    embedding = decoder.token_embedding.weight
    own = list(_own(decoder.token_projection)) if hasattr(decoder, "token_projection") else []
    projection = _tensor_bytes(own) if own else _tensor_bytes([embedding])  # a float projection reads the embedding
    cross = _tensor_bytes(list(step.cross_keys) + list(step.cross_values))
    slots = step.products.slots_read(CONTEXT + rows, step.n_ctx)  # the slots a pass attends
    per_slot = (step.keys.numel() // step.n_ctx) * step.keys.element_size() * 2
    return {"weights": _tensor_bytes(weights), "projection": projection, "cross_kv": cross,
            "self_kv": per_slot * slots}


def pass_runner(model, features: Tensor, rows: int, one_call: bool = True):
    """One pass of ``rows`` new rows after CONTEXT cached tokens, as a callable, and its step; its
    layers called one by one where ``one_call`` is False or the package's kernels do not run them."""
    step = cpu_step(model, 1, features.dtype, features.device)
    if not one_call:
        step.products.native = None
    step.set_audio(features)
    tokens = torch.randint(0, 50000, (1, CONTEXT))
    step.pass_at(tokens, torch.arange(CONTEXT), 0, chain_mask(0, CONTEXT, "cpu"))
    new = torch.randint(0, 50000, (1, rows))
    positions = torch.arange(CONTEXT, CONTEXT + rows)
    mask = chain_mask(CONTEXT, rows, "cpu")

    def run():  # its rows' slots are written again by the next
        return step.logits(step.pass_at(new, positions, CONTEXT, mask))
    return run, step


# the kernels that multiply (weights or attention), by ATen name; everything else is "other"
PRODUCTS = ("aten::_weight_int8pack_mm", "aten::mm", "aten::addmm", "aten::linear", "onednn::qlinear",
            "aten::_mkldnn", "mkldnn")
# fused attention, or invariant_attention's batched products (the only 3-D products of a pass)
ATTENTION = ("aten::_scaled_dot_product", "aten::bmm", "aten::_softmax")


def profile_pass(fn, ms_per_pass: float, passes: int = 5) -> Dict[str, float]:
    """The ATen operators one pass calls from Python, and where its time goes: each category's share of
    the profiler's self time (products with weights; attention kernels, fused or as batched matrix
    products; every other operator) applied to ``ms_per_pass``, the pass measured without the
    profiler, whose own overhead would otherwise count."""
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]) as prof:
        fn()
    # operators called from Python, not those an operator calls inside itself
    ops = sum(1 for e in prof.events() if e.name.startswith("aten::")
              and (e.cpu_parent is None or not e.cpu_parent.name.startswith("aten::")))
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]) as prof:
        for _ in range(passes):
            fn()
    split = {"products_ms": 0.0, "attention_ms": 0.0, "other_ms": 0.0}
    for event in prof.key_averages():
        if event.key.startswith(ATTENTION):
            split["attention_ms"] += event.self_cpu_time_total
        elif event.key.startswith(PRODUCTS):
            split["products_ms"] += event.self_cpu_time_total
        elif event.key.startswith(("aten::", "onednn::", "quantized::")):
            split["other_ms"] += event.self_cpu_time_total
    total = max(sum(split.values()), 1e-9)
    return {"aten_ops": ops, **{k: round(v / total * ms_per_pass, 2) for k, v in split.items()}}


PARTS = ("cross-attention", "self-attention", "linears", "vocabulary")


def time_parts(model, features: Tensor, rows: int, reps: int) -> Dict[str, float]:
    """Milliseconds of one pass (median of ``reps``), whole and with each of PARTS returning zeros;
    the runs alternate so that the machine's drift hits all alike."""
    from unittest import mock

    import medusa_whisper.step.cpu as cpu_module

    run, step = pass_runner(model, features, rows, one_call=False)
    attention, fused = cpu_module.invariant_attention, cpu_module.fused_attention
    n_audio = features.shape[1]

    def zeros_for(cross: bool):
        def attend(q, k, v, n_head, allowed, slots=None):
            return torch.zeros_like(q) if (k.shape[2] == n_audio) == cross else attention(q, k, v, n_head, allowed, slots)
        return attend

    projection = getattr(model.decoder, "token_projection", None)
    linears = {type(m): m for m in model.decoder.modules() if hasattr(m, "out_features") and m is not projection}
    patches = {
        "whole": [],
        "cross-attention": [mock.patch.object(cpu_module, "invariant_attention", zeros_for(True)),
                            mock.patch.object(cpu_module, "fused_attention", lambda q, k, v, h, m: torch.zeros_like(q)
                                              if k.shape[-2] == n_audio else fused(q, k, v, h, m))],
        "self-attention": [mock.patch.object(cpu_module, "invariant_attention", zeros_for(False)),
                           mock.patch.object(cpu_module, "fused_attention", lambda q, k, v, h, m: torch.zeros_like(q)
                                             if k.shape[-2] != n_audio else fused(q, k, v, h, m))],
        "linears": [mock.patch.object(type(m), "forward", lambda self, x: x.new_zeros(*x.shape[:-1], self.out_features))
                    for m in linears.values()],
        "vocabulary": [mock.patch.object(step, "logits", lambda states: states)],
    }

    def timed(name: str) -> float:
        for patch in patches[name]:
            patch.start()
        try:
            began = time.perf_counter()
            run()
            return (time.perf_counter() - began) * 1e3
        finally:
            for patch in patches[name]:
                patch.stop()

    times = {name: [] for name in patches}
    for name in patches:
        timed(name)
    for _ in range(reps):
        for name in patches:
            times[name].append(timed(name))
    return {name: statistics.median(t) for name, t in times.items()}


def operator_floor(model_name: str, compute_type: str, reps: int) -> float:
    """Milliseconds of a one-row pass of ``model_name``'s decoder structure made 64 wide (heads of 8),
    random weights in the same compute type: what the pass costs per operator, with next to no
    arithmetic."""
    from whisper.model import ModelDimensions, Whisper

    from medusa_whisper.step.compute import apply_compute_type

    dims = medusa_whisper.load_model(model_name, device="cpu").dims
    narrow = ModelDimensions(**{**vars(dims), "n_audio_state": 64, "n_audio_layer": 1, "n_text_state": 64})
    model = apply_compute_type(Whisper(narrow).eval(), compute_type)
    run, _ = pass_runner(model, torch.randn(1, narrow.n_audio_ctx, 64), 1)
    times = []
    for _ in range(reps + 1):
        began = time.perf_counter()
        run()
        times.append((time.perf_counter() - began) * 1e3)
    return statistics.median(times[1:])


def print_parts(args, models, features) -> None:
    print("| compute type | rows | whole pass ms | " + " | ".join(f"without {p}" for p in PARTS)
          + " | per-operator floor ms (64 wide) |")
    print("|---|---|---|" + "---|" * len(PARTS) + "---|")
    for t, model in models.items():
        floor = operator_floor(args.model, t, args.reps)
        for rows in (int(r) for r in args.rows.split(",")):
            ms = time_parts(model, features[t], rows, args.reps)
            cells = " | ".join(f"{ms[p]:.2f} ({ms['whole'] - ms[p]:+.2f})" for p in PARTS)
            print(f"| {t} | {rows} | {ms['whole']:.2f} | {cells} | {floor:.2f} |", flush=True)


def force_int8_kernel(kernel: str) -> None:
    """Every int8 linear's few rows by ``kernel``, and the vocabulary's where that is one of its kernels."""
    compute.few_rows_kernel = lambda n_out, n_in: kernel
    choose = Int8Projection.choose_kernel

    def chosen(projection: Int8Projection) -> str:
        if projection.kernel is None and kernel in projection.kernels_here():
            projection.kernel = kernel
        return choose(projection)
    Int8Projection.choose_kernel = chosen


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="base")
    parser.add_argument("--compute-types", default="float32,int8,bfloat16")
    parser.add_argument("--rows", default="1,2,4,8,16")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--reps", type=int, default=30)
    parser.add_argument("--out", type=Path, default=None, help="write the results as JSON here")
    parser.add_argument("--parts", action="store_true",
                        help="where a pass goes: each part taken out in turn, and the per-operator floor")
    parser.add_argument("--layers", default="one-call",
                        help="one-call, one-by-one, or both (comma-separated): how the decoder's layers run")
    parser.add_argument("--int8-kernel", choices=compute.FEW_ROWS_KERNELS, default=None,
                        help="every int8 decoder linear's few rows, and the vocabulary where it runs it, by this "
                             "kernel (default: the one chosen here)")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    if args.int8_kernel:
        force_int8_kernel(args.int8_kernel)
    types, row_counts = args.compute_types.split(","), [int(r) for r in args.rows.split(",")]
    ways = args.layers.split(",")
    if not set(ways) <= {"one-call", "one-by-one"}:
        parser.error(f"--layers {args.layers}: one-call, one-by-one or both")
    machine = {**machine_id(), "isa": isa_features()}
    print(f"{machine['cpu']} ({machine['isa']}), torch {machine['torch']}, {args.threads} threads, "
          f"{args.model}, {CONTEXT} cached tokens", flush=True)

    models = {t: medusa_whisper.load_model(args.model, device="cpu", compute_type=t) for t in types}
    audio = whisper.pad_or_trim(whisper.load_audio(str(AUDIO)))
    mel = whisper.log_mel_spectrogram(audio, models[types[0]].dims.n_mels)[None]
    results = []
    with torch.inference_mode():
        features = {t: m.embed_audio(mel) for t, m in models.items()}
        if args.parts:
            print_parts(args, models, features)
            return
        # every row count and compute type timed in turn, round after round: this VM's bandwidth drifts
        # by 2x over minutes, and a ratio of passes timed minutes apart measured the drift
        runners = {(t, rows, way): pass_runner(m, features[t], rows, way == "one-call")
                   for rows in row_counts for t, m in models.items() for way in ways}
        times = {key: [] for key in runners}
        for fn, _ in runners.values():
            fn(), fn()  # warm-up: first-use route measurements and prepacking happen here
        for _ in range(args.reps):
            for key, (fn, _) in runners.items():
                began = time.perf_counter()
                fn()
                times[key].append((time.perf_counter() - began) * 1e3)
        for (t, rows, asked), (fn, step) in runners.items():
            parts = pass_bytes(models[t], step, rows)
            total = sum(parts.values())
            bandwidth = read_bandwidth(total)
            floor_ms = total / bandwidth * 1e3
            ms = statistics.median(times[t, rows, asked])
            way = asked if step.products.native is not None else "one-by-one"  # where the kernels do not run them
            split = profile_pass(fn, ms)
            if way == "one-call":  # the profiler sees the ATen operators around the one call only
                split.update(products_ms=None, attention_ms=None, other_ms=None)
            results.append({"compute_type": t, "rows": rows, "layers": way, "ms": round(ms, 2),
                            "min_ms": round(min(times[t, rows, asked]), 2),
                            "of_one_row": round(ms / statistics.median(times[t, row_counts[0], asked]), 2),
                            **split, "bytes": parts, "mb": round(total / 1e6, 1),
                            "gb_per_s": round(bandwidth / 1e9, 1), "floor_ms": round(floor_ms, 2),
                            "x_floor": round(ms / floor_ms, 2)})
            # how fast the kernels read what they multiply, against the bandwidth the floor assumes
            r = results[-1]
            if r["products_ms"] is not None:
                r["products_gb_per_s"] = round((parts["weights"] + parts["projection"]) / max(r["products_ms"], 1e-3) / 1e6, 1)
                r["attention_gb_per_s"] = round((parts["cross_kv"] + parts["self_kv"]) / max(r["attention_ms"], 1e-3) / 1e6, 1)
            print(json.dumps(r), flush=True)
    print()
    print("| compute type | layers | rows | ms per pass | of the first row count's | ATen ops "
          "| products / attention / other ms (profiler's shares) | MB read | GB/s here | products, attention GB/s "
          "| floor ms | x floor |")
    print("|---|---|---|---|---|---|---|---|---|---|---|---|")
    for r in sorted(results, key=lambda r: (types.index(r["compute_type"]), r["layers"], r["rows"])):
        one_call = r["products_ms"] is None
        split = "(one call)" if one_call else f"{r['products_ms']} / {r['attention_ms']} / {r['other_ms']}"
        rates = "" if one_call else f"{r['products_gb_per_s']}, {r['attention_gb_per_s']}"
        print(f"| {r['compute_type']} | {r['layers']} | {r['rows']} | {r['ms']} | {r['of_one_row']} | {r['aten_ops']} "
              f"| {split} | {r['mb']} | {r['gb_per_s']} | {rates} | {r['floor_ms']} | {r['x_floor']} |")
    if args.out:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(json.dumps({"machine": machine, "model": args.model, "threads": args.threads,
                                        "results": results}, indent=1) + "\n")


if __name__ == "__main__":
    main()
