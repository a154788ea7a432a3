"""Issue 34's measurements on a CUDA machine, in one process and one run (``make bench-gpu``).

    python -m tools.bench gpu --clips CLIPS.csv --long LONG.flac --model base --out OUT

Every system transcribes the same real recordings with the same weights, whisper's default options
and ``language="en"``, one after the other, each after a warm-up clip (which also captures its
CUDA graphs; the capture time is reported). Systems: openai-whisper's ``whisper.transcribe`` at
float16 (the baseline); ours ``--mode off`` with the eager step and with the fixed-shape step on
CUDA graphs; every shipped proposer; the clips at ``--batch-size 32``; Hugging Face transformers'
``generate`` (eager, sdpa) and with its static cache and ``torch.compile`` on the clips of at most
30 s (its compile time reported, not counted); faster-whisper where its CUDA libraries import.

Also: one window's passes profiled (kernels, launches and host waits per pass, time by kind of
kernel) for the eager step, the captured one and every proposer drafting inside it; one captured
pass over 1 to 32 rows; peak GPU memory per system; per clip, whether the text equals our eager
``--mode off``'s and, where it differs, the first differing token. Every clip's run is seeded. On
the long recording, every window where a row's text leaves whisper's: its first differing token,
greedy or sampled, and the verifier's logit margin there.

Writes OUT/gpu.json and OUT/gpu.md (and OUT/gpu.png where matplotlib imports). On a machine without
CUDA (``--device cpu``) the same script runs as a rehearsal: the fixed-shape step uncaptured.
"""

from __future__ import annotations

import argparse
import contextlib
import csv
import json
import os
import platform
import sys
import time
import traceback
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Callable, Dict, List, Optional, Tuple

import numpy as np
import torch

import medusa_whisper
from medusa_whisper.decoding import loop
from medusa_whisper.audio.files import load_audio

SAMPLE_RATE = 16000


@dataclass
class Clip:
    name: str
    audio: np.ndarray
    reference: str

    @property
    def seconds(self) -> float:
        return len(self.audio) / SAMPLE_RATE


@dataclass
class Row:
    name: str
    note: str = ""
    error: str = ""
    seconds: float = 0.0  # wall time over the clips (warm-up excluded)
    setup_seconds: float = 0.0  # loading, and the warm-up clip (graph capture, compilation)
    tokens: int = 0
    passes: int = 0
    peak_gpu_mb: float = 0.0
    texts: Dict[str, str] = field(default_factory=dict)
    token_ids: Dict[str, List[int]] = field(default_factory=dict)
    short_only: bool = False  # measured on the clips of at most 30 s only
    compare_with: str = ""  # the row whose texts it should give ("": eager --mode off's)
    windows: Dict[str, list] = field(default_factory=dict)  # per clip: (seek, temperature, tokens) per window


def read_clips(csv_path: Path, limit: Optional[int]) -> List[Clip]:
    with open(csv_path, newline="", encoding="utf-8") as f:
        rows = list(csv.DictReader(f))
    if limit is not None:  # a rehearsal: the shortest
        rows = sorted(rows, key=lambda r: float(r.get("seconds") or 0))[:limit]
    return [Clip(Path(r["audio"]).stem, load_audio(str(csv_path.parent / r["audio"])), r.get("sentence", ""))
            for r in rows]


def pick_clips(real_csv: Path, longest: int, librivox: int) -> List[dict]:
    """Issue 34's set: the ``longest`` longest recordings other than the LibriVox readings, and the
    first ``librivox`` LibriVox sentences."""
    with open(real_csv, newline="", encoding="utf-8") as f:
        rows = list(csv.DictReader(f))
    read = [r for r in rows if "librivox" in r["source"].lower()]
    other = sorted((r for r in rows if r not in read), key=lambda r: -float(r["seconds"]))
    sentences = [r for r in read if "sense and sensibility" in r["source"].lower()] or read
    return other[:longest] + sentences[:librivox]


@contextlib.contextmanager
def step(choice: str):
    """The decoder step ours uses inside the block (loop.STEP_ENV)."""
    old = os.environ.get(loop.STEP_ENV)
    os.environ[loop.STEP_ENV] = choice
    try:
        yield
    finally:
        if old is None:
            os.environ.pop(loop.STEP_ENV, None)
        else:
            os.environ[loop.STEP_ENV] = old


def sync(device: str) -> None:
    if device == "cuda":
        torch.cuda.synchronize()


SEED = 0  # every clip's run starts from this seed: the temperature fallback's draws repeat run after run


def seeded(run: Callable[[Clip], dict], clip: Clip) -> dict:
    torch.manual_seed(SEED)
    return run(clip)


def windows_of(result: dict) -> List[Tuple[int, float, List[int]]]:
    """(seek, temperature, tokens) of each window a transcription decoded into segments, in order."""
    windows: List[Tuple[int, float, List[int]]] = []
    for segment in result.get("segments", []):
        if windows and windows[-1][0] == segment.get("seek"):
            windows[-1][2].extend(segment.get("tokens", []))
        else:
            windows.append((segment.get("seek"), segment.get("temperature", 0.0), list(segment.get("tokens", []))))
    return windows


def timed_rows(name: str, note: str, device: str, clips: List[Clip], make: Callable[[], Callable[[Clip], dict]],
               batch: Optional[Callable[[List[Clip]], List[dict]]] = None) -> Row:
    """One system over the clips: ``make()`` loads it and returns its per-clip call (a result dict
    of whisper's shape, ``medusa`` statistics where it has them). Failures become the row's error."""
    row = Row(name, note)
    try:
        if device == "cuda":
            torch.cuda.empty_cache()
            torch.cuda.reset_peak_memory_stats()
        began = time.perf_counter()
        run = make()
        run(clips[0])  # warm-up: kernels chosen, graphs captured, compilation
        sync(device)
        row.setup_seconds = time.perf_counter() - began
        began = time.perf_counter()
        results = batch(clips) if batch is not None else [seeded(run, c) for c in clips]
        sync(device)
        row.seconds = time.perf_counter() - began
        for clip, result in zip(clips, results):
            row.texts[clip.name] = result["text"].strip()
            row.token_ids[clip.name] = [t for s in result.get("segments", []) for t in s.get("tokens", [])]
            row.windows[clip.name] = windows_of(result)
            stats = result.get("medusa", {})
            row.tokens += int(stats.get("tokens", 0))
            row.passes += int(stats.get("decoder_steps", 0))
        if device == "cuda":
            row.peak_gpu_mb = torch.cuda.max_memory_allocated() / 2**20
    except Exception as e:  # one system's failure must not cost the other rows: the run is the device time
        row.error = f"{type(e).__name__}: {e}".splitlines()[0][:300]
        traceback.print_exc()
    print(f"{name}: {row.seconds:.2f} s (setup {row.setup_seconds:.1f} s) {row.error}", flush=True)
    return row


# -- the systems -----------------------------------------------------------------------------------------


def whisper_row(model_name: str, device: str, clips: List[Clip], label: str = "openai-whisper transcribe",
                **options) -> Row:
    import whisper

    def make():
        model = medusa_whisper.load_model(model_name, device=device)  # float32 weights, as whisper.load_model
        return lambda c: whisper.transcribe(model, c.audio, language="en", fp16=device == "cuda", verbose=None,
                                            **options)
    described = "".join(f", {k}={v}" for k, v in options.items())
    return timed_rows(label, f"whisper's own decoding, fp16 products on float32 weights{described}", device, clips,
                      make)


def ours_row(label: str, name: str, device: str, clips: List[Clip], step_choice: str, batch_size: int = 0,
             ctc_settings: Optional[dict] = None, **options) -> Row:
    """ctc_settings : settings over the CTC head's own (``DraftSettings``), e.g. without its second branch"""
    compute_type = "float16" if device == "cuda" else "float32"

    def make():
        model = medusa_whisper.load_model(name, device=device, compute_type=compute_type)
        if ctc_settings:
            head = model.draft_head
            for part in (head.parts if head.kind == "union" else [head]):
                if part.kind == "ctc":
                    part.config.decoding = dict(part.config.decoding, **ctc_settings)

        def run(c: Clip) -> dict:
            with step(step_choice):
                return medusa_whisper.transcribe(model, c.audio, language="en", verbose=None, **options)
        make.model = model
        return run

    def batch(cs: List[Clip]) -> List[dict]:
        with step(step_choice):
            return medusa_whisper.transcribe(make.model, [c.audio for c in cs], language="en", verbose=None,
                                             batch_size=batch_size, **options)
    described = ", ".join(f"{k}={v}" for k, v in {**options, **(ctc_settings or {})}.items())
    note = f"{compute_type}, {step_choice} step" + (f", {described}" if described else "")
    return timed_rows(label, note, device, clips, make, batch if batch_size else None)


def beam_rows(name: str, device: str, clips: List[Clip], fixed: str) -> List[Row]:
    """Beam search of 5: whisper's, ours on the eager step (same text as whisper's?) and on the fixed
    step (same text as the eager step's?)."""
    theirs = whisper_row(name, device, clips, "openai-whisper transcribe, beam 5", beam_size=5)
    theirs.compare_with = theirs.name  # itself: no comparison
    eager = ours_row("ours, beam 5, eager step", name, device, clips, "eager", beam_size=5)
    eager.compare_with = theirs.name
    fixed_row = ours_row("ours, beam 5, fixed step", name, device, clips, fixed, beam_size=5)
    fixed_row.compare_with = eager.name
    return [theirs, eager, fixed_row]


def transformers_rows(model_name: str, device: str, clips: List[Clip], compile_mode: Optional[str] = None,
                      eager: bool = True) -> List[Row]:
    """transformers' generate on the clips of at most 30 s: eager with sdpa, and with ``compile_mode``
    its static cache compiled by that mode (the compilation happens in the warm-up and is reported
    as setup)."""
    short = [c for c in clips if c.seconds <= 30.0]
    try:
        import transformers
        from tools.bench.systems import _to_transformers
    except Exception as e:
        return [Row("transformers generate", error=f"not importable: {type(e).__name__}: {e}".splitlines()[0])]
    import whisper

    base = medusa_whisper.load_model(model_name, device="cpu")
    tokenizer = whisper.tokenizer.get_tokenizer(base.is_multilingual, num_languages=base.num_languages,
                                                language="en", task="transcribe")
    prompt = dict(language="en", task="transcribe") if base.is_multilingual else {}
    n_mels = base.dims.n_mels
    transformers.logging.set_verbosity_error()

    def make_for(mode: Optional[str]):
        def make():
            hf = _to_transformers(base).to(device).eval()
            hf.config._attn_implementation = "sdpa"
            if device == "cuda":
                hf = hf.half()
            extra = {}
            if mode is not None:
                hf.generation_config.cache_implementation = "static"
                hf.forward = torch.compile(hf.forward, mode=mode, fullgraph=True)

            def run(c: Clip) -> dict:
                mel = whisper.log_mel_spectrogram(whisper.pad_or_trim(torch.from_numpy(c.audio)), n_mels)
                with torch.no_grad():
                    ids = hf.generate(mel[None].to(device, hf.dtype), return_timestamps=False, num_beams=1,
                                      do_sample=False, **prompt, **extra)
                sampled = [t for t in ids[0].tolist() if t < tokenizer.eot]
                return {"text": tokenizer.decode(sampled), "medusa": {"tokens": len(sampled) + 1,
                                                                      "decoder_steps": len(sampled) + 1}}
            return run
        return make
    dtype = "float16" if device == "cuda" else "float32"
    rows = []
    if eager:
        rows.append(timed_rows("transformers generate (sdpa)", f"transformers {transformers.__version__}, {dtype}",
                               device, short, make_for(None)))
    if compile_mode is not None:
        rows.append(timed_rows(f"transformers generate (static cache, compiled {compile_mode})",
                               f"cache_implementation=static, torch.compile mode={compile_mode}", device, short,
                               make_for(compile_mode)))
    for row in rows:
        row.short_only = True
    return rows


# transformers' static cache compiled, in this order: the first that runs is measured. A compiled
# run once killed the process (a segmentation fault after inductor's cudagraph warnings), so each
# runs in a child process of its own, and a death is reported as the row's error.
COMPILE_MODES = ("reduce-overhead", "default")
COMPILE_TIMEOUT_S = 240


def _compiled_child(model_name: str, device: str, clips: List[Clip], mode: str, results) -> None:
    row = transformers_rows(model_name, device, clips, compile_mode=mode, eager=False)[0]
    results.put(asdict(row))


def transformers_compiled_rows(model_name: str, device: str, clips: List[Clip]) -> List[Row]:
    """One row per compile mode tried, up to the first that ran; a crash or a hang is its row's error."""
    import multiprocessing
    import queue
    import signal

    context = multiprocessing.get_context("spawn")  # a fresh CUDA context in the child
    rows: List[Row] = []
    for mode in COMPILE_MODES:
        results = context.Queue()
        child = context.Process(target=_compiled_child, args=(model_name, device, clips, mode, results))
        began = time.perf_counter()
        child.start()
        try:
            row = Row(**results.get(timeout=COMPILE_TIMEOUT_S))
        except queue.Empty:
            code = child.exitcode
            how = (f"killed by {signal.Signals(-code).name}" if code is not None and code < 0 else
                   f"exit status {code}" if code is not None else f"no result in {COMPILE_TIMEOUT_S} s")
            row = Row(f"transformers generate (static cache, compiled {mode})", short_only=True,
                      error=f"the process died ({how}) after {time.perf_counter() - began:.0f} s")
            print(f"{row.name}: {row.error}", flush=True)
        child.join(timeout=10)
        if child.is_alive():
            child.kill()
        rows.append(row)
        if not row.error:
            break
    return rows


def faster_whisper_row(device: str) -> Row:
    try:
        import ctranslate2  # noqa: F401
        import faster_whisper  # noqa: F401
    except Exception as e:
        return Row("faster-whisper", error=f"not measured: {type(e).__name__}: {e}".splitlines()[0])
    return Row("faster-whisper", error="not measured: its CTranslate2 weights are not carried to this machine")


# -- one pass, profiled ------------------------------------------------------------------------------------

KINDS = (("gemm", ("gemm", "cutlass", "sm90_", "sm80_", "matmul", "cublas")),
         ("attention", ("flash", "fmha", "attention", "sdpa", "efficient")),
         ("softmax / reduce", ("softmax", "reduce", "argmax", "max_", "sum", "logsumexp", "norm")),
         ("copy / index", ("copy", "index", "gather", "scatter", "cat", "fill")),
         ("elementwise", ("elementwise", "vectorized", "unrolled")))


def kind_of(kernel: str) -> str:
    low = kernel.lower()
    return next((kind for kind, keys in KINDS if any(k in low for k in keys)), "other")


# what one pass is profiled for: label, the model name's suffix, decoding options, the step
PROFILED = (("--mode off, eager step", "", dict(mode="off"), "eager"),
            ("--mode off, CUDA graphs", "", dict(mode="off"), "auto"),
            ("medusa, CUDA graphs", "-medusa", {}, "auto"),
            ("ctc, CUDA graphs", "-ctc", {}, "auto"),
            ("eagle chain of 2, CUDA graphs", "-eagle", dict(draft_tokens=2), "auto"),
            ("eagle tree 3 x 8, CUDA graphs", "-eagle", dict(tree_width=3, tree_nodes=8), "auto"),
            ("ctc+eagle, CUDA graphs", "-ctc+eagle", dict(draft_tokens=2), "auto"))


def profile_pass(model_name: str, device: str, clip: Clip) -> Dict[str, dict]:
    """Kernels, launches and host waits per decoder pass on one 30-s window of ``clip`` (the encoder
    excluded: its features are computed first): plain decoding on the eager step and captured, and
    each proposer drafting inside the captured pass."""
    if device != "cuda":
        return {}
    import whisper
    from torch.profiler import ProfilerActivity, profile

    out = {}
    for label, suffix, options, choice in PROFILED:
        try:
            model = medusa_whisper.load_model(model_name + suffix, device=device, compute_type="float16")
            mel = whisper.log_mel_spectrogram(whisper.pad_or_trim(torch.from_numpy(clip.audio)), model.dims.n_mels)
            with torch.no_grad():
                features = model.embed_audio(mel[None].to(device).half())[0]
            with step(choice):
                medusa_whisper.decode(model, features, language="en", **options)  # warm-up, capture
                sync(device)
                with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
                    result = medusa_whisper.decode(model, features, language="en", **options)
                    sync(device)
        except Exception as e:  # one profile's failure must not cost the others
            out[label] = dict(error=f"{type(e).__name__}: {e}".splitlines()[0][:200])
            continue
        passes = max(result.decoder_steps, 1)
        events = prof.key_averages()
        kernels = [e for e in events if e.device_type == torch.autograd.DeviceType.CUDA]
        by_kind: Dict[str, float] = {}
        for e in kernels:
            by_kind[kind_of(e.key)] = by_kind.get(kind_of(e.key), 0.0) + e.device_time_total / 1e3 / passes
        calls = {e.key: e.count for e in events}
        out[label] = dict(
            passes=passes, tokens_per_pass=result.tokens_produced / passes,
            decode_ms_per_pass=result.decode_seconds * 1e3 / passes,
            kernels_per_pass=sum(e.count for e in kernels) / passes,
            kernel_launches_per_pass=calls.get("cudaLaunchKernel", 0) / passes,
            graph_launches_per_pass=calls.get("cudaGraphLaunch", 0) / passes,
            host_waits_per_pass=sum(calls.get(k, 0) for k in ("cudaStreamSynchronize", "cudaDeviceSynchronize",
                                                                "cudaMemcpyAsync", "cudaMemcpy")) / passes,
            gpu_ms_per_pass_by_kind={k: round(v, 4) for k, v in sorted(by_kind.items(), key=lambda kv: -kv[1])})
        print(label, out[label], flush=True)
    return out


ROW_COUNTS = (1, 2, 4, 8, 16, 32)


def pass_by_rows(model_name: str, device: str) -> Dict[str, float]:
    """Milliseconds of one pass of the fixed-shape step (decoder and vocabulary) over each of
    ROW_COUNTS rows, captured on CUDA: what verifying more candidates costs (the issue asks for 8 or
    16 rows at most 1.25 times one row)."""
    model = medusa_whisper.load_model(model_name, device=device,
                                      compute_type="float16" if device == "cuda" else "float32")
    dtype = torch.float16 if device == "cuda" else torch.float32
    decoder = loop.WindowDecoder(model, dtype, torch.device(device))
    with torch.no_grad():
        decoder.step.set_audio(torch.zeros(1, model.dims.n_audio_ctx, model.dims.n_audio_state, device=device,
                                           dtype=dtype))
    seconds = decoder.pass_seconds(ROW_COUNTS, rounds=20 if device == "cuda" else 3)
    out = {str(n): round(seconds[n] * 1e3, 4) for n in ROW_COUNTS}
    print("pass by rows (ms):", out, flush=True)
    return out


# what the parts are measured for: label, the model name's suffix, decoding options
PARTS = (("--mode off, fixed step", "", dict(mode="off")), ("base-medusa", "-medusa", {}), ("base-ctc", "-ctc", {}))


def window_parts(model_name: str, device: str, clips: List[Clip], fixed: str) -> Dict[str, dict]:
    """Where each clip's time goes besides the passes (gpu_parts.py), for plain decoding and the two
    proposers that pay: every part timed over all the clips, after a warm-up clip."""
    from tools.bench import gpu_parts

    out = {}
    for label, suffix, options in PARTS:
        try:
            model = medusa_whisper.load_model(model_name + suffix, device=device,
                                              compute_type="float16" if device == "cuda" else "float32")

            def run(c: Clip, model=model, options=options) -> dict:
                torch.manual_seed(SEED)
                with step(fixed):
                    return medusa_whisper.transcribe(model, c.audio, language="en", verbose=None, **options)
            run(clips[0])
            out[label] = gpu_parts.measure_parts(run, clips, lambda: sync(device))
        except Exception as e:  # one row's failure must not cost the others
            out[label] = dict(error=f"{type(e).__name__}: {e}".splitlines()[0][:200])
        print(label, out[label], flush=True)
    return out


def capture_seconds(model_name: str, device: str, clip: Clip) -> Dict[str, float]:
    """The fixed-shape decoder's first window (its graphs captured) against its second."""
    import whisper

    model = medusa_whisper.load_model(model_name, device=device, compute_type="float16" if device == "cuda" else "float32")
    mel = whisper.log_mel_spectrogram(whisper.pad_or_trim(torch.from_numpy(clip.audio)), model.dims.n_mels)
    with torch.no_grad():
        features = model.embed_audio(mel[None].to(device).to(torch.float16 if device == "cuda" else torch.float32))[0]
    times = []
    with step("fixed" if device != "cuda" else "auto"):
        for _ in range(2):
            began = time.perf_counter()
            medusa_whisper.decode(model, features, language="en", mode="off", fp16=device == "cuda")
            sync(device)
            times.append(time.perf_counter() - began)
    return dict(first_window_s=times[0], second_window_s=times[1], capture_s=times[0] - times[1])


# -- comparing texts ----------------------------------------------------------------------------------------


def word_errors(reference: str, hypothesis: str) -> int:
    ref, hyp = reference.split(), hypothesis.split()
    row = list(range(len(hyp) + 1))
    for i, r in enumerate(ref, start=1):
        previous, row[0] = row[0], i
        for j, h in enumerate(hyp, start=1):
            previous, row[j] = row[j], min(row[j] + 1, row[j - 1] + 1, previous + (r != h))
    return row[-1]


def wer(row: Row, clips: List[Clip]) -> Optional[float]:
    from whisper.normalizers import EnglishTextNormalizer
    normalise = EnglishTextNormalizer()
    pairs = [(normalise(c.reference), normalise(row.texts[c.name])) for c in clips
             if c.reference and c.name in row.texts]
    words = sum(len(r.split()) for r, _ in pairs)
    return 100.0 * sum(word_errors(r, h) for r, h in pairs) / words if words else None


def first_difference(a: List[int], b: List[int]) -> Optional[dict]:
    for i, (x, y) in enumerate(zip(a, b)):
        if x != y:
            return dict(index=i, ours=x, reference=y)
    return None if len(a) == len(b) else dict(index=min(len(a), len(b)), ours=None, reference=None)


class Margins:
    """The verifier's logit margin where a clip's text first differs from the eager ``--mode off``:
    the reference tokens of its first window fed through the fixed-shape step in one pass (the
    rules applied, each row with its own context), and at the first differing position the gap
    between the best logit and the one of our token. Small gaps say the texts part where the two
    steps' last bits decide a near tie."""

    def __init__(self, model_name: str, device: str):
        import whisper
        from medusa_whisper.decoding.rules import DeviceRules
        from medusa_whisper.step.fixed import FixedStep

        self.whisper, self.DeviceRules = whisper, DeviceRules
        self.device = device
        self.model = medusa_whisper.load_model(model_name, device=device,
                                               compute_type="float16" if device == "cuda" else "float32")
        dtype = torch.float16 if device == "cuda" else torch.float32
        self.dtype = dtype
        self.step = FixedStep(self.model, 1, dtype, torch.device(device))
        options = whisper.DecodingOptions(language="en", fp16=device == "cuda")
        self.task = whisper.decoding.DecodingTask(self.model, options)
        self.rules = DeviceRules.of(self.task.logit_filters, self.model.dims.n_vocab, device)

    @torch.no_grad()
    def at(self, clip: Clip, reference: List[int], difference: dict) -> Optional[float]:
        index = difference["index"]
        initial = list(self.task.initial_tokens)
        tokens = initial + reference[:index]
        if difference["ours"] is None or len(tokens) >= self.step.n_ctx:
            return None
        whisper = self.whisper
        mel = whisper.log_mel_spectrogram(whisper.pad_or_trim(torch.from_numpy(clip.audio)), self.model.dims.n_mels)
        self.step.set_audio(self.model.embed_audio(mel[None].to(self.device).to(self.dtype)))
        history = torch.tensor([tokens], device=self.device)
        positions = torch.arange(len(tokens), device=self.device)[None]
        logits = self.step.logits(self.step(history, positions))[:, -1:]
        self.rules.apply(logits, history, positions[:, -1:] + 1)
        row = logits[0, 0]
        return float(row.max() - row[difference["ours"]])


def window_margin(margins: "Margins", audio: np.ndarray, seek: int, prompt: List[int], reference: List[int],
                  index: int, ours: int) -> Optional[float]:
    """The verifier's logit margin at token ``index`` of the long recording's window at ``seek`` (mel
    frames), decoded as whisper decodes it: its log-mel cut from the whole recording's, after
    ``prompt`` (the text since the last prompt reset); best logit minus the one of ``ours``."""
    whisper = margins.whisper
    model = margins.model
    mel = whisper.log_mel_spectrogram(torch.from_numpy(audio), model.dims.n_mels, padding=whisper.audio.N_SAMPLES)
    segment = whisper.pad_or_trim(mel[:, seek:seek + whisper.audio.N_FRAMES], whisper.audio.N_FRAMES)
    options = whisper.DecodingOptions(language="en", fp16=margins.device == "cuda", prompt=prompt or None)
    task = whisper.decoding.DecodingTask(model, options)
    tokens = list(task.initial_tokens) + reference[:index]
    if len(tokens) >= margins.step.n_ctx:
        return None
    rules = margins.DeviceRules.of(task.logit_filters, model.dims.n_vocab, margins.device)
    with torch.no_grad():
        margins.step.set_audio(model.embed_audio(segment[None].to(margins.device).to(margins.dtype)))
        history = torch.tensor([tokens], device=margins.device)
        positions = torch.arange(len(tokens), device=margins.device)[None]
        logits = margins.step.logits(margins.step(history, positions))[:, -1:]
        rules.apply(logits, history, positions[:, -1:] + 1)
    row = logits[0, 0]
    return float(row.max() - row[ours])


def long_differences(ours: Row, theirs: Row, recording: Clip, model_name: str, device: str) -> List[dict]:
    """Every window of the long recording where our text leaves whisper's at the same seek: its
    first differing token, whether either side sampled it (temperature > 0), and where both decoded
    it after the same prompt, the verifier's logit margin there (a greedy window that differs without
    a near tie would be a bug)."""
    mine, whispers = ours.windows.get(recording.name, []), theirs.windows.get(recording.name, [])
    by_seek = {seek: (temperature, tokens) for seek, temperature, tokens in mine}
    out: List[dict] = []
    margins = None
    prompt: List[int] = []  # whisper's prompt for each of its windows: the tokens since the last reset
    same_so_far = True
    for seek, temperature, tokens in whispers:
        mine_here = by_seek.get(seek)
        if mine_here is None or mine_here[1] != tokens:
            entry = dict(seek=seek, seconds=round(seek * 0.01, 2), whisper_temperature=temperature,
                         ours_temperature=None if mine_here is None else mine_here[0],
                         same_prompt=same_so_far)
            if mine_here is not None:
                difference = first_difference(mine_here[1], tokens)
                entry.update(difference or {})
                if same_so_far and difference and difference["ours"] is not None and not temperature \
                        and not mine_here[0]:
                    try:
                        margins = margins or Margins(model_name, device)
                        entry["margin"] = window_margin(margins, recording.audio, seek, prompt, tokens,
                                                        difference["index"], difference["ours"])
                    except Exception as e:  # a margin is a detail: its failure must not cost the report
                        entry["margin_error"] = f"{type(e).__name__}: {e}".splitlines()[0][:200]
            out.append(entry)
            same_so_far = False
        prompt = [] if temperature > 0.5 else prompt + tokens  # as whisper.transcribe's prompt_reset_since
    return out


def add_margins(report: dict, rows: List[Row], clips: List[Clip], model_name: str, device: str) -> None:
    reference = rows[1]
    by_name = {c.name: c for c in clips}
    margins = None
    for entry, row in zip(report["rows"], rows):
        for name, difference in (entry.get("differences") or {}).items():
            if difference is None:
                continue
            margins = margins or Margins(model_name, device)
            try:
                difference["margin"] = margins.at(by_name[name], reference.token_ids[name], difference)
            except Exception as e:  # a margin is a detail: its failure must not cost the report
                difference["margin_error"] = f"{type(e).__name__}: {e}".splitlines()[0][:200]


# -- the run ---------------------------------------------------------------------------------------------------


def main(argv: Optional[List[str]] = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    source = parser.add_mutually_exclusive_group(required=True)
    source.add_argument("--clips", type=Path, help="CSV with columns audio (relative to it), sentence")
    source.add_argument("--real", type=Path, help="data/real/real.csv (python -m tools.data real): the issue's set "
                        "of 35 recordings is picked from it")
    parser.add_argument("--long", type=Path, default=None, help="a long recording (issue 34: 6 minutes)")
    parser.add_argument("--model", default="base")
    parser.add_argument("--device", choices=("cuda", "cpu"), default="cuda")
    parser.add_argument("--limit", type=int, default=None, help="only the N shortest clips (a rehearsal)")
    parser.add_argument("--skip", default="", help="comma-separated row groups to leave out: inductor "
                        "(our pass compiled), inductor-medusa and inductor-ctc (those proposers compiled), proposers, "
                        "parts, batch, beam, transformers, compile (transformers' static "
                        "cache compiled), long, profile")
    parser.add_argument("--out", type=Path, required=True)
    args = parser.parse_args(argv)
    if args.device == "cuda" and not torch.cuda.is_available():
        sys.exit("bench gpu: error: --device cuda: CUDA is not available on this machine")
    skip = set(filter(None, args.skip.split(",")))
    args.out.mkdir(parents=True, exist_ok=True)
    if args.real is not None:  # the issue's set, as tools.gpu pack picks it
        picked = args.out / "clips.csv"
        with open(picked, "w", newline="", encoding="utf-8") as f:
            writer = csv.DictWriter(f, fieldnames=["audio", "sentence", "seconds"])
            writer.writeheader()
            for row in pick_clips(args.real, 30, 5):
                writer.writerow(dict(audio=str((args.real.parent / row["audio"]).resolve()), sentence=row["sentence"],
                                     seconds=row["seconds"]))
        args.clips = picked
    clips = read_clips(args.clips, args.limit)
    device, name = args.device, args.model
    info = dict(model=name, device=device, clips=len(clips), audio_seconds=sum(c.seconds for c in clips),
                torch=torch.__version__, python=platform.python_version(),
                gpu=torch.cuda.get_device_name(0) if device == "cuda" else None)
    print(info, flush=True)
    fixed = "auto" if device == "cuda" else "fixed"
    # most wanted first: the report is rewritten after every system, so a run cut short by the
    # device's time limit still leaves what it measured
    jobs: List[Tuple[str, Callable[[], List[Row]]]] = [
        ("", lambda: [whisper_row(name, device, clips)]),
        ("", lambda: [ours_row("ours --mode off, eager step", name, device, clips, "eager", mode="off")]),
        ("", lambda: [ours_row("ours --mode off, fixed step", name, device, clips, fixed, mode="off")])]
    # every shipped proposer drafts inside the captured pass (drafting/device/)
    for suffix, options in (("-medusa", {}), ("-ctc", {}), ("-eagle", dict(draft_tokens=2)),
                            ("-eagle", dict(tree_width=3, tree_nodes=8)), ("-ctc+eagle", dict(draft_tokens=2))):
        label = f"{name}{suffix} lossless" + (f" ({', '.join(f'{k}={v}' for k, v in options.items())})"
                                              if options else "")
        jobs.append(("proposers", lambda label=label, suffix=suffix, options=options: [
            ours_row(label, name + suffix, device, clips, fixed, **options)]))
    # the CTC head with its second branch after a refusal: a tree pass then (more kernels a pass, docs/gpu.md)
    jobs.append(("proposers", lambda: [ours_row(f"{name}-ctc lossless, second branch in the pass", name + "-ctc",
                                                device, clips, fixed, ctc_settings=dict(branch_in_pass=True))]))
    jobs.append(("batch", lambda: [ours_row("ours --mode off, --batch-size 32", name, device, clips, fixed,
                                            batch_size=32, mode="off")]))
    # beam search (and the fallback's best_of candidates): whisper's DecodingTask on our passes,
    # eager against one CUDA graph per rows count (candidates._FixedRows)
    jobs.append(("beam", lambda: beam_rows(name, device, clips, fixed)))
    jobs.append(("inductor", lambda: [ours_row("ours --mode off, fixed step compiled", name, device, clips,
                                               "compiled", mode="off")]))
    # the proposers that pay, compiled (each pass shape compiled once: its time is the row's setup)
    for suffix in ("-medusa", "-ctc"):
        jobs.append(("inductor" + suffix, lambda suffix=suffix: [
            ours_row(f"{name}{suffix} lossless, compiled", name + suffix, device, clips, "compiled")]))
    jobs.append(("transformers", lambda: transformers_rows(name, device, clips)))
    jobs.append(("compile", lambda: transformers_compiled_rows(name, device, clips)))
    rows: List[Row] = [faster_whisper_row(device)]
    long_rows: List[Row] = []
    extra = dict(profile={}, capture={}, long_differences={}, parts={})

    started = time.perf_counter()

    def save() -> None:
        print(f"[{time.perf_counter() - started:.0f} s into the run] report saved", flush=True)
        report = summarise(rows, long_rows, clips, info, extra)
        (args.out / "gpu.json").write_text(json.dumps(report, indent=2) + "\n", encoding="utf-8")
        (args.out / "gpu.md").write_text(markdown(report), encoding="utf-8")

    for group, job in jobs[:3]:
        rows[-1:-1] = job()  # faster-whisper's line stays last
    save()
    for group, job in jobs[3:]:  # the proposers next: what the GPU issue is about
        if group == "proposers" and group not in skip:
            rows[-1:-1] = job()
            save()
    if "parts" not in skip:
        extra["parts"] = window_parts(name, device, clips, fixed)
        save()
    if "profile" not in skip:
        extra["profile"] = profile_pass(name, device, max(clips, key=lambda c: c.seconds))
    extra["capture"] = capture_seconds(name, device, clips[0])
    extra["capture"]["pass_ms_by_rows"] = pass_by_rows(name, device)
    save()
    if args.long is not None and "long" not in skip:
        recording = [Clip(args.long.stem, load_audio(str(args.long)), "")]  # timed twice: warm-up, then a run
        long_rows += [whisper_row(name, device, recording * 2, "openai-whisper transcribe, long"),
                      ours_row("ours --mode off, fixed step, long", name, device, recording * 2, fixed, mode="off")]
        save()
        if "proposers" not in skip:
            long_rows += [ours_row(f"{name}-eagle lossless (draft_tokens=2), long", name + "-eagle", device,
                                   recording * 2, fixed, draft_tokens=2),
                          ours_row(f"{name}-ctc lossless, long", name + "-ctc", device, recording * 2, fixed)]
        extra["long_differences"] = {row.name: long_differences(row, long_rows[0], recording[0], name, device)
                                     for row in long_rows[1:]}
        save()
    for group, job in jobs[3:]:
        if group not in skip and group != "proposers":
            rows[-1:-1] = job()
            save()
    report = summarise(rows, long_rows, clips, info, extra)
    add_margins(report, rows, clips, name, device)
    (args.out / "gpu.json").write_text(json.dumps(report, indent=2) + "\n", encoding="utf-8")
    print(markdown(report))
    plot(report, args.out / "gpu.png")
    return 0


def summarise(rows: List[Row], long_rows: List[Row], clips: List[Clip], info: dict, extra: dict) -> dict:
    """The report: every row's figures against whisper's and our eager --mode off's, and ``extra``'s
    profile, capture and long-form differences."""
    baseline, reference = rows[0], rows[1]  # whisper.transcribe; ours --mode off with the eager step
    short = [c for c in clips if c.seconds <= 30.0]

    def seconds_on(row: Row, subset: List[Clip]) -> Optional[float]:
        return row.seconds if not row.short_only or subset is short else None

    by_name = {row.name: row for row in rows}
    table = []
    for row in rows:
        entry = {k: v for k, v in asdict(row).items() if k not in ("texts", "token_ids", "windows")}
        entry["wer"] = wer(row, clips) if row.texts else None
        if row.seconds and baseline.seconds and not row.short_only:
            entry["vs_whisper"] = baseline.seconds / row.seconds
        entry["tokens_per_pass"] = row.tokens / row.passes if row.passes else None
        other = by_name.get(row.compare_with, reference) if row.compare_with != row.name else None
        if row.texts and other is not None and other.texts:
            same = [c.name for c in clips if c.name in row.texts and row.texts[c.name] == other.texts.get(c.name)]
            entry["same_text"] = f"{len(same)}/{len([c for c in clips if c.name in row.texts])}" + (
                f" (as {other.name})" if other is not reference else "")
            if other is reference:  # the first differing tokens, and add_margins' margins there
                entry["differences"] = {c.name: first_difference(row.token_ids.get(c.name, []),
                                                                 reference.token_ids.get(c.name, []))
                                        for c in clips if c.name in row.texts and c.name not in same}
        table.append(entry)
    long_table = [{k: v for k, v in asdict(r).items() if k not in ("token_ids", "windows")} for r in long_rows]
    return dict(info=info, rows=table, long=long_table, profile=extra["profile"], capture=extra["capture"],
                long_differences=extra["long_differences"], parts=extra.get("parts", {}), short_clips=len(short))


def markdown(report: dict) -> str:
    info = report["info"]
    lines = [f"`{info['model']}` on {info.get('gpu') or info['device']}, torch {info['torch']}: "
             f"{info['clips']} real recordings, {info['audio_seconds']:.0f} s of audio "
             f"({report['short_clips']} of at most 30 s).", "",
             "| system | seconds | vs whisper.transcribe | tokens per pass | WER % | same text (as eager --mode off, or as named) | "
             "setup s | peak GPU MB | note |", "|---|---|---|---|---|---|---|---|---|"]
    for r in report["rows"]:
        if r["error"]:
            lines.append(f"| {r['name']} | | | | | | | | {r['error']} |")
            continue
        fmt = lambda v, f: "" if v is None else format(v, f)  # noqa: E731
        seconds = fmt(r["seconds"], ".2f") + (" (clips <= 30 s)" if r["short_only"] else "")
        lines.append(f"| {r['name']} | {seconds} | {fmt(r.get('vs_whisper'), '.2f')} | "
                     f"{fmt(r['tokens_per_pass'], '.2f')} | {fmt(r['wer'], '.1f')} | "
                     f"{r.get('same_text', '')} | {r['setup_seconds']:.1f} | {r['peak_gpu_mb']:.0f} | "
                     f"{r['note']} |")
    differing = [(r["name"], clip, d) for r in report["rows"] for clip, d in (r.get("differences") or {}).items()]
    if differing:
        lines += ["", "Where a text differs from eager `--mode off`'s (first differing token of the clip's "
                  "segments; margin: best logit minus ours there, fixed step):", ""]
        for name, clip, d in differing:
            detail = "texts differ, tokens equal" if d is None else (
                f"token {d['index']}: ours {d['ours']}, reference {d['reference']}" +
                (f", margin {d['margin']:.3f}" if d.get("margin") is not None else ""))
            lines.append(f"- {name}: {clip}: {detail}")
    for r in report["long"]:
        lines.append(f"\nLong recording, {r['name']}: {r['seconds'] / 2:.2f} s per run {r['error']}")
    for name, windows in (report.get("long_differences") or {}).items():
        lines.append(f"\n{name}: {len(windows)} windows differ from whisper's (seeded runs)" + (":" if windows else "."))
        for w in windows:
            kind = "greedy" if not w["whisper_temperature"] and not w.get("ours_temperature") else (
                f"sampled (whisper at {w['whisper_temperature']}, ours at {w.get('ours_temperature')})")
            where = (f"token {w['index']}: ours {w['ours']}, whisper {w['reference']}" if "index" in w
                     else "no window of ours at this seek")
            margin = f", margin {w['margin']:.3f}" if w.get("margin") is not None else ""
            lines.append(f"- at {w['seconds']:.2f} s, {kind}, {where}{margin}"
                         + ("" if w["same_prompt"] else " (after an earlier difference)"))
    if report["profile"]:
        lines += ["", "| one window, per pass | ms per pass | tokens per pass | kernels | kernel launches | "
                  "graph launches | host waits | GPU ms by kind |", "|---|---|---|---|---|---|---|---|"]
        for label, p in report["profile"].items():
            if "error" in p:
                lines.append(f"| {label} | | | | | | | {p['error']} |")
                continue
            kinds = ", ".join(f"{k} {v:.3f}" for k, v in p["gpu_ms_per_pass_by_kind"].items())
            lines.append(f"| {label} | {p['decode_ms_per_pass']:.3f} | {p.get('tokens_per_pass', 1.0):.2f} | "
                         f"{p['kernels_per_pass']:.0f} | {p['kernel_launches_per_pass']:.1f} | "
                         f"{p['graph_launches_per_pass']:.2f} | {p['host_waits_per_pass']:.2f} | {kinds} |")
    if report.get("parts"):
        from tools.bench.gpu_parts import parts_markdown
        for label, measured in report["parts"].items():
            lines += ["", f"{label}: {measured['error']}" if "error" in measured else parts_markdown(label, measured)]
    c = report["capture"]
    if c:
        lines.append(f"\nFixed-shape decoder: first window {c['first_window_s']:.3f} s, second "
                     f"{c['second_window_s']:.3f} s (capture about {c['capture_s']:.3f} s).")
        by_rows = c.get("pass_ms_by_rows") or {}
        if by_rows:
            one = by_rows["1"]
            lines.append("One pass over n rows (ms, and relative to one row): " + ", ".join(
                f"{n}: {ms:.3f} ({ms / one:.2f}x)" for n, ms in by_rows.items()) + ".")
    return "\n".join(lines) + "\n"


def plot(report: dict, path: Path) -> None:
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return
    rows = [r for r in report["rows"] if r["seconds"] and not r["short_only"]]
    fig, ax = plt.subplots(figsize=(8, 0.45 * len(rows) + 1.2))
    ax.barh([r["name"] for r in rows][::-1], [r["seconds"] for r in rows][::-1], color="tab:blue")
    ax.set_xlabel(f"seconds for {report['info']['clips']} recordings ({report['info']['audio_seconds']:.0f} s of audio)")
    ax.set_title(f"{report['info']['model']} on {report['info'].get('gpu') or report['info']['device']}", fontsize=9)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


if __name__ == "__main__":
    sys.exit(main())
