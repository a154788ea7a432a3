"""A static-shape decoder step, eager and compiled, beside the package's pass (an experiment).

    python -m tools.bench static-step --model base --compute-type int8 --rows 1,8 --compile [--cpp-wrapper]

The package's pass on the CPU (``step.cpu.cpu_step``: whisper's modules called with explicit
positions and masks, over the written slots) has shapes and Python work that vary per pass. This file writes one decoder
step as a plain function over preallocated tensors (per-layer self-attention caches written in
place, the window's cross-attention keys and values, q/k/v fused, a mask computed from positions),
the form ``torch.compile`` (inductor, freezing) can turn into one graph per row count. It measures
the step eager and compiled against the package's pass on a real recording's encoder output, and
checks that both give the package's next token (the compiled step's kernels round differently, so
its logits agree within a tolerance, not bit for bit; see docs/pass.md for what that means for
lossless decoding). Nothing in the package calls it: it is the evidence for whether a compiled step
pays on the running CPU.
"""

from __future__ import annotations

import argparse
import statistics
import time
from typing import Callable, Dict, List

import torch
import torch.nn.functional as F
import whisper
from torch import Tensor

import medusa_whisper
from medusa_whisper.step.compute import Int8Linear
from medusa_whisper.step.attention import chain_mask
from medusa_whisper.step.cpu import cpu_step
from medusa_whisper.step.routes import isa_features, machine_id
from tools import ROOT

AUDIO = ROOT / "tests" / "data" / "real" / "jfk.flac"


def _product(layer) -> Callable[[Tensor], Tensor]:
    """x @ W.T + b for an int8 weight-only layer (as Int8Linear multiplies) or a float32 one."""
    if isinstance(layer, Int8Linear):
        qweight, scale = layer.qweight, layer.scale
        bias = layer.bias if layer.bias is not None else torch.zeros_like(scale)
        unit = torch.ones(qweight.shape[0], dtype=torch.bfloat16)
        return lambda x: torch._weight_int8pack_mm(x.to(torch.bfloat16), qweight, unit).float() * scale + bias
    weight, bias = layer.weight, layer.bias
    return lambda x: F.linear(x, weight, bias)


def _fused_qkv(attn) -> Callable[[Tensor], Tensor]:
    fused = attn.__dict__.get("qkv")  # the int8 model's fused product (compute.fuse_qkv)
    if fused is not None:
        return _product(fused)
    weight = torch.cat([attn.query.weight, attn.key.weight, attn.value.weight])
    bias = torch.cat([attn.query.bias, torch.zeros_like(attn.query.bias), attn.value.bias])
    return lambda x: F.linear(x, weight, bias)


class StaticStep:
    """One decoder step for ``rows`` new tokens of one window at consecutive positions."""

    def __init__(self, model, features: Tensor):
        decoder = model.decoder
        self.n_layer, self.n_state = len(decoder.blocks), decoder.ln.weight.shape[0]
        self.n_head = decoder.blocks[0].attn.n_head
        self.capacity = decoder.positional_embedding.shape[0]
        d_head = self.n_state // self.n_head
        self.embedding, self.positional = decoder.token_embedding.weight, decoder.positional_embedding
        self.final_ln = (decoder.ln.weight, decoder.ln.bias)
        projection = getattr(decoder, "token_projection", None)
        if projection is not None and hasattr(projection, "qweight"):  # the int8 vocabulary
            qweight, scale = projection.qweight, projection.scale
            unit = torch.ones(qweight.shape[0], dtype=torch.bfloat16)
            self.project = lambda x: torch._weight_int8pack_mm(x.to(torch.bfloat16), qweight, unit).float() * scale
        else:
            weight = decoder.token_embedding.weight
            self.project = lambda x: x @ weight.T
        self.layers = []
        for block in decoder.blocks:
            self.layers.append(dict(
                qkv=_fused_qkv(block.attn), out=_product(block.attn.out),
                cross_query=_product(block.cross_attn.query), cross_out=_product(block.cross_attn.out),
                fc1=_product(block.mlp[0]), fc2=_product(block.mlp[2]),
                ln1=(block.attn_ln.weight, block.attn_ln.bias), ln2=(block.cross_attn_ln.weight, block.cross_attn_ln.bias),
                ln3=(block.mlp_ln.weight, block.mlp_ln.bias)))
        window = cpu_step(model, 1, features.dtype)
        window.set_audio(features)
        # float32 head-major cross keys/values, one contiguous tensor per layer (a view of one stacked
        # tensor written inside a compiled graph copies the whole stack)
        self.cross_k = [k.float().contiguous() for k in window.cross_keys]
        self.cross_v = [v.float().contiguous() for v in window.cross_values]
        self.keys = [torch.zeros(1, self.n_head, self.capacity, d_head) for _ in range(self.n_layer)]
        self.values = [torch.zeros(1, self.n_head, self.capacity, d_head) for _ in range(self.n_layer)]
        self.slots = torch.arange(self.capacity)

    def __call__(self, tokens: Tensor, positions: Tensor) -> Tensor:
        """tokens, positions: (rows,) long -> logits (rows, n_vocab); writes the rows' cache slots."""
        rows, n_state, n_head = tokens.shape[0], self.n_state, self.n_head
        x = (self.embedding[tokens] + self.positional[positions])[None]  # (1, rows, n_state)
        allowed = self.slots[None, :] <= positions[:, None]  # causal over every slot of the cache
        mask = torch.zeros(rows, self.capacity).masked_fill(~allowed, float("-inf"))
        for i, p in enumerate(self.layers):
            h = F.layer_norm(x, (n_state,), *p["ln1"])
            q, k, v = p["qkv"](h[0]).split(n_state, dim=-1)
            self.keys[i].index_copy_(2, positions, k.view(rows, n_head, -1).transpose(0, 1)[None])
            self.values[i].index_copy_(2, positions, v.view(rows, n_head, -1).transpose(0, 1)[None])
            q = q.view(1, rows, n_head, -1).transpose(1, 2)
            o = F.scaled_dot_product_attention(q, self.keys[i], self.values[i], attn_mask=mask)
            x = x + p["out"](o.transpose(1, 2).reshape(rows, n_state))[None]
            h = F.layer_norm(x, (n_state,), *p["ln2"])
            q = p["cross_query"](h[0]).view(1, rows, n_head, -1).transpose(1, 2)
            o = F.scaled_dot_product_attention(q, self.cross_k[i], self.cross_v[i])
            x = x + p["cross_out"](o.transpose(1, 2).reshape(rows, n_state))[None]
            h = F.layer_norm(x, (n_state,), *p["ln3"])
            x = x + p["fc2"](F.gelu(p["fc1"](h[0])))[None]
        return self.project(F.layer_norm(x[0], (n_state,), *self.final_ln))


def _median_ms(fn, reps: int) -> float:
    times = []
    for _ in range(reps):
        began = time.perf_counter()
        fn()
        times.append((time.perf_counter() - began) * 1e3)
    return statistics.median(times)


def measure(model_name: str, compute_type: str, rows_list: List[int], compile_step: bool, reps: int,
            context: int = 60, cpp_wrapper: bool = False) -> List[Dict]:
    model = medusa_whisper.load_model(model_name, device="cpu", compute_type=compute_type)
    mel = whisper.log_mel_spectrogram(whisper.pad_or_trim(whisper.load_audio(str(AUDIO))), model.dims.n_mels)[None]
    results = []
    with torch.inference_mode():
        features = model.embed_audio(mel)
        # a cached context of ``context`` greedy tokens, in both the package's cache and the step's
        tokenizer = whisper.tokenizer.get_tokenizer(model.is_multilingual, language="en", task="transcribe")
        tokens = list(tokenizer.sot_sequence_including_notimestamps)
        package = cpu_step(model, 1, features.dtype)
        package.set_audio(features)
        step = StaticStep(model, features)
        for position in range(context):
            t = torch.tensor([tokens[position]])
            hidden = package.pass_at(t[None], torch.tensor([position]), position, None)
            step(t, torch.tensor([position]))
            if position + 1 >= len(tokens):
                tokens.append(int(package.logits(hidden)[0, -1].argmax()))
        runs = {"eager": step}
        if compile_step:
            import torch._inductor.config as inductor_config
            inductor_config.freezing = True
            inductor_config.cpp_wrapper = cpp_wrapper  # the kernels called from generated C++, not Python
            runs["compiled"] = torch.compile(step.__call__, fullgraph=True, dynamic=False)
        for rows in rows_list:
            new = torch.tensor(tokens[context - rows:context]) if rows <= context else torch.randint(0, 50000, (rows,))
            positions = torch.arange(context, context + rows)
            mask = chain_mask(context, rows, "cpu")

            def package_pass():
                return package.logits(package.pass_at(new[None], positions, context, mask))[0]
            reference = package_pass()
            row = dict(compute_type=compute_type, rows=rows, package_ms=_median_ms(package_pass, reps))
            for name, fn in runs.items():
                began = time.perf_counter()
                logits = fn(new, positions)
                row[f"{name}_first_call_s"] = time.perf_counter() - began
                row[f"{name}_ms"] = _median_ms(lambda: fn(new, positions), reps)
                row[f"{name}_same_argmax"] = bool(torch.equal(logits.argmax(-1), reference.argmax(-1)))
                row[f"{name}_max_rel_diff"] = float((logits - reference).abs().max() / reference.abs().max())
            results.append(row)
            print(row, flush=True)
    return results


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="base")
    parser.add_argument("--compute-type", default="int8")
    parser.add_argument("--rows", default="1,8")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--reps", type=int, default=30)
    parser.add_argument("--compile", action="store_true", help="also measure the step compiled (inductor, freezing)")
    parser.add_argument("--cpp-wrapper", action="store_true", help="with --compile: inductor's C++ wrapper (no "
                        "generated Python between the kernels)")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    print(f"{machine_id()['cpu']} ({isa_features()}), torch {torch.__version__}, {args.threads} threads, {args.model}")
    rows = measure(args.model, args.compute_type, [int(r) for r in args.rows.split(",")], args.compile, args.reps,
                   cpp_wrapper=args.cpp_wrapper)
    names = ["package", "eager"] + (["compiled"] if args.compile else [])
    print("\n| compute type | rows | " + " | ".join(f"{n} ms" for n in names) + " | next token equal |")
    print("|---|---|" + "---|" * (len(names) + 1))
    for r in rows:
        same = all(r[f"{n}_same_argmax"] for n in names[1:])
        print(f"| {r['compute_type']} | {r['rows']} | " + " | ".join(f"{r[n + '_ms']:.2f}" for n in names) +
              f" | {'yes' if same else 'no'} |")


if __name__ == "__main__":
    main()
