"""Every proposer on the same real recordings: tokens per decoder pass, acceptance by depth, speed.

Decodes each clip (real recordings of at most 30 s from data/real/real.csv, taken from its sources
in turn as make bench does; never used in training) once with the encoder, then, on the same encoder
output and interleaved clip by clip, with whisper.decode greedy and with each system. A system is a
model name with optional decoding options after a colon:

    python -m tools.bench drafters --systems base:off base-medusa base-medusa:tree_width=3,tree_nodes=10 \\
        base-eagle base-eagle:tree_width=3,draft_tokens=6 base-ctc@int8 --clips 40 --out bench_out/drafters_base

``NAME@TYPE`` loads the model at that compute type (int8, bfloat16); every system decodes the float32
encoder's output, so only the decoders differ. ``step=fixed`` (or ``eager``) among a system's options
decodes it on that step (``MEDUSA_WHISPER_STEP``): on the fixed-shape step, the proposers that
draft inside the pass (``drafting.device``) take the place of the host's. ``chunk=N`` makes a CTC
head draft N tokens every pass (its ``fixed_chunk``), as flat pass costs (a GPU's) would choose.
``draft=NAME[@TYPE]`` decodes with that draft model proposing (its own encoder pass over the window's
audio is part of the system's decoder time), e.g. ``base@int8:draft=tiny.en@int8`` beside
``base@int8:off``; ``draft_tokens=K`` fixes its lookahead, which is otherwise chosen from the costs
measured here (``drafting/lookahead.py``).

All systems must share one base model (their heads differ). Reports, per system: tokens per decoder
pass, the share of passes whose depth-d candidate was accepted, identical output to whisper.decode
and to the same model's ``:off`` system where there is one (lossless at its compute type), decoder
time against whisper.decode's and against that ``:off`` (ratios of summed seconds), and the
proposer's share.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import time
from pathlib import Path
from typing import Dict, List, Tuple

import torch
import whisper
from tqdm import tqdm

import medusa_whisper
from medusa_whisper.decoding import loop
from medusa_whisper.audio.files import load_audio
from medusa_whisper.checkpoints.weights import split_medusa_name
from tools import ROOT


def parse_system(text: str) -> Tuple[str, Dict]:
    """``name[:key=value,...]`` -> (model name, decode options); values are ints, else strings."""
    name, _, rest = text.partition(":")
    options: Dict = {}
    for item in filter(None, rest.split(",")):
        key, _, value = item.partition("=")
        if not key or not value and key != "off":
            raise SystemExit(f"drafters_report: bad option {item!r} in {text!r} (want key=value)")
        options[key] = int(value) if value.lstrip("-").isdigit() else value
    if "off" in options:  # plain decoding (on the step asked for)
        options = dict(mode="off", **{k: v for k, v in options.items() if k == "step"})
    return name, options


@contextlib.contextmanager
def on_step(choice):
    """``MEDUSA_WHISPER_STEP`` = ``choice`` inside the block (None: as it is)."""
    old = os.environ.get(loop.STEP_ENV)
    if choice is not None:
        os.environ[loop.STEP_ENV] = choice
    try:
        yield
    finally:
        if old is None:
            os.environ.pop(loop.STEP_ENV, None)
        else:
            os.environ[loop.STEP_ENV] = old


@contextlib.contextmanager
def ctc_chunk(model, chunk):
    """The model's CTC head (alone or in a union) drafting ``chunk`` tokens every pass inside the
    block (None: as its settings say)."""
    head = getattr(model, "draft_head", None)
    parts = [] if head is None or chunk is None else list(head.parts) if head.kind == "union" else [head]
    heads = [part for part in parts if part.kind == "ctc"]
    saved = [part.config.decoding for part in heads]
    for part in heads:
        part.config.decoding = dict(part.config.decoding, fixed_chunk=chunk)
    try:
        yield
    finally:
        for part, decoding in zip(heads, saved):
            part.config.decoding = decoding


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--systems", nargs="+", required=True, help="NAME[:key=value,...] (NAME:off for mode off)")
    parser.add_argument("--real", type=Path, default=ROOT / "data" / "real" / "real.csv")
    parser.add_argument("--clips", type=int, default=40, help="real recordings to decode (default 40)")
    parser.add_argument("--timestamps", action="store_true", help="decode with timestamp tokens")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--out", type=Path, required=True, help="writes OUT.json and OUT.md")
    args = parser.parse_args()

    from tools.bench.run import _real_records

    torch.set_num_threads(args.threads)
    systems = [parse_system(s) for s in args.systems]
    def load(name: str):
        return medusa_whisper.load_model(name.partition("@")[0], device="cpu",
                                         compute_type=name.partition("@")[2] or "float32")

    models = {name: load(name) for name, _ in systems}
    drafts = {options["draft"]: load(options["draft"]) for _, options in systems if "draft" in options}
    # the system whose tokens and time each system is held against: its model's :off, where given
    plain = {name: text for text, (name, options) in zip(args.systems, systems) if options.get("mode") == "off"}
    # whisper.decode and the encoder run on a float32 model (a system's, or the plain base model), so
    # that a report of int8 systems alone still compares them with float32 whisper.decode
    base = next((models[name] for name, _ in systems if name.partition("@")[2] in ("", "float32")), None)
    if base is None:
        first = systems[0][0].partition("@")[0]
        base = medusa_whisper.load_model(split_medusa_name(first) or first, device="cpu")
    records = _real_records(args.real, args.clips)
    common = dict(language="en", fp16=False, without_timestamps=not args.timestamps)
    totals = {text: dict(tokens=0, steps=0, same=0, same_as_off=0, seconds=0.0, draft=0.0, proposed=0, accepted=[])
              for text in args.systems}

    def with_draft(options: Dict, audio_mel) -> Dict:
        """The system's decode options, with its draft model and that model's log-Mel of the window."""
        options = dict(options)
        name = options.pop("draft", None)
        if name is not None:
            draft = drafts[name]
            options.update(draft=draft, draft_mel=audio_mel(draft.dims.n_mels))
        return options
    vanilla_seconds, audio_seconds = 0.0, 0.0
    with torch.no_grad():  # warm-up, not counted
        warm = base.embed_audio(torch.zeros(1, base.dims.n_mels, 3000))[0]
        whisper.decode(base, warm, whisper.DecodingOptions(**common))
        for text, (name, options) in zip(args.systems, systems):
            options = with_draft(options, lambda n_mels: torch.zeros(n_mels, 3000))
            with on_step(options.pop("step", None)), ctc_chunk(models[name], options.pop("chunk", None)):
                medusa_whisper.decode(models[name], warm, **common, **options)
    for record in tqdm(records, desc="clips", unit="clip"):
        audio = load_audio(record["audio"])
        audio_seconds += len(audio) / 16000
        mel = whisper.log_mel_spectrogram(whisper.pad_or_trim(torch.from_numpy(audio)), base.dims.n_mels)
        with torch.no_grad():
            features = base.embed_audio(mel[None])[0]
        began = time.perf_counter()
        vanilla = whisper.decode(base, features, whisper.DecodingOptions(**common))
        vanilla_seconds += time.perf_counter() - began
        padded = whisper.pad_or_trim(torch.from_numpy(audio))
        tokens = {}
        for text, (name, options) in zip(args.systems, systems):
            options = with_draft(options, lambda n_mels: mel if n_mels == mel.shape[0] else
                                 whisper.log_mel_spectrogram(padded, n_mels))
            began = time.perf_counter()
            with on_step(options.pop("step", None)), ctc_chunk(models[name], options.pop("chunk", None)):
                r = medusa_whisper.decode(models[name], features, **common, **options)
            row = totals[text]
            row["seconds"] += time.perf_counter() - began
            row["tokens"] += r.tokens_produced
            row["steps"] += r.decoder_steps
            row["same"] += r.tokens == vanilla.tokens
            tokens[text] = r.tokens
            row["draft"] += r.draft_seconds
            row["proposed"] += r.draft_proposed
            accepted = row["accepted"]
            accepted.extend([0] * (len(r.accepted_per_head) - len(accepted)))
            for d, a in enumerate(r.accepted_per_head):
                accepted[d] += a
        for text, (name, _) in zip(args.systems, systems):
            if name in plain:
                totals[text]["same_as_off"] += tokens[text] == tokens[plain[name]]

    results: List[dict] = []
    for text, (name, _) in zip(args.systems, systems):
        row = totals[text]
        results.append(dict(
            system=text, clips=len(records), tokens_per_step=round(row["tokens"] / row["steps"], 3),
            accepted_at_depth=[round(a / row["steps"], 3) for a in row["accepted"]],
            proposed_per_step=round(row["proposed"] / row["steps"], 2),
            identical_to_vanilla=round(row["same"] / len(records), 3),
            decoder_speedup=round(vanilla_seconds / row["seconds"], 3),
            identical_to_off=round(row["same_as_off"] / len(records), 3) if name in plain else None,
            speedup_vs_off=round(totals[plain[name]]["seconds"] / row["seconds"], 3) if name in plain else None,
            decoder_seconds=round(row["seconds"], 2), draft_seconds=round(row["draft"], 2)))
    info = dict(real=str(args.real), clips=len(records), audio_seconds=round(audio_seconds, 1),
                timestamps=args.timestamps, threads=args.threads, torch=torch.__version__,
                vanilla_decoder_seconds=round(vanilla_seconds, 2), load_average=list(__import__("os").getloadavg()))
    args.out.parent.mkdir(parents=True, exist_ok=True)
    Path(f"{args.out}.json").write_text(json.dumps(dict(info=info, results=results), indent=1))
    lines = [f"{len(records)} real recordings ({audio_seconds:.0f} s, {'with' if args.timestamps else 'without'} "
             f"timestamps), {args.threads} threads; whisper.decode's decoder: {vanilla_seconds:.2f} s; "
             f"load average {info['load_average'][0]:.1f}", "",
             "| system | tokens/pass | candidates/pass | identical | same as its :off | decoder speedup vs whisper.decode | vs its :off | decoder s (proposer) | accepted at depth 1, 2, ... |",
             "|---|---|---|---|---|---|---|---|---|"]

    def share(value) -> str:
        return "-" if value is None else f"{value:.0%}"

    for r in results:
        against_off = "-" if r["speedup_vs_off"] is None else f"{r['speedup_vs_off']:.2f}x"
        lines.append(f"| {r['system']} | {r['tokens_per_step']:.2f} | {r['proposed_per_step']:.1f} | "
                     f"{r['identical_to_vanilla']:.0%} | {share(r['identical_to_off'])} | {r['decoder_speedup']:.2f}x | "
                     f"{against_off} | {r['decoder_seconds']:.2f} "
                     f"({r['draft_seconds']:.2f}) | {' '.join(f'{a:.2f}' for a in r['accepted_at_depth'])} |")
    text = "\n".join(lines)
    Path(f"{args.out}.md").write_text(text + "\n")
    print(text)


if __name__ == "__main__":
    main()
