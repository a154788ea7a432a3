"""The systems `make bench` compares, each one callable on a 16-kHz float32 array of up to 30 s.

Every system is built by a function that imports only what that system needs, so that the memory
probe (``python -m tools.bench.systems --probe SYSTEM ...``, run in a fresh process per system)
measures faster-whisper and whisper.cpp without torch and openai-whisper without CTranslate2.

Times, the same for every system:
- encoder seconds: the log-Mel features plus the encoder, on one 30-s window (the clip padded);
- decoder seconds: everything after that (prompt, decoding loop, detokenising);
- end-to-end seconds: both, i.e. the whole call on the audio array.
"""

from __future__ import annotations

import argparse
import resource
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Dict, List, Optional

import numpy as np

from tools import module_command, module_env

VANILLA = "openai-whisper greedy"


@dataclass
class Run:
    text: str
    encode_seconds: float
    decode_seconds: float
    total_seconds: float
    tokens: int = 0  # sampled tokens, end-of-text included
    steps: int = 0  # decoder forward passes (of the main model, with a draft model)
    draft_seconds: float = 0.0  # the draft model's share of decode_seconds (its encoder pass included)
    draft_proposed: int = 0  # main-model tokens the draft proposed
    draft_accepted: int = 0  # and how many of them the main model accepted


@dataclass
class System:
    name: str
    run: Optional[Callable[[np.ndarray], Run]]  # None: not measured, ``note`` says why
    note: str = ""
    runs: Dict[str, List[Run]] = field(default_factory=dict)  # clip name -> one Run per round
    probe: List[str] = field(default_factory=list)  # arguments of this file's --probe that rebuild it


# -- openai-whisper and medusa_whisper -----------------------------------------------------------------

def torch_system(name: str, model_name: str, device: str, mode: Optional[str], note: str = "",
                 draft: Optional[str] = None, adaptive: bool = False, compute_type: str = "float32",
                 draft_compute_type: Optional[str] = None, decode_options: Optional[dict] = None) -> System:
    """openai-whisper's ``whisper.decode`` (mode None) or ``medusa_whisper.decode`` in ``mode``.

    Both run on one MedusaWhisper, a whisper.model.Whisper subclass, so whisper.decode on it is
    openai-whisper itself; fp16 on CUDA as openai-whisper does by default, fp32 on the CPU.
    With ``draft``, that model proposes the candidates; it encodes the audio itself, inside the
    timed decoding, since it is work that vanilla decoding does not do. ``decode_options`` go to
    ``medusa_whisper.decode`` (candidate trees: tree_width, tree_nodes).
    """
    import torch
    import whisper

    import medusa_whisper

    model = medusa_whisper.load_model(model_name, device=device, draft=draft, compute_type=compute_type,
                                      draft_compute_type=draft_compute_type)
    fp16 = device == "cuda" and compute_type == "float32"  # other compute types cast the encoder's input themselves

    def sync() -> None:
        if device == "cuda":
            torch.cuda.synchronize()

    def run(audio: np.ndarray) -> Run:
        began = time.perf_counter()
        mel = whisper.log_mel_spectrogram(whisper.pad_or_trim(torch.from_numpy(audio)), model.dims.n_mels).to(device)
        with torch.no_grad():
            features = model.embed_audio((mel.half() if fp16 else mel)[None])[0]
        sync()
        encoded = time.perf_counter()
        if mode is None:
            r = whisper.decode(model, features, whisper.DecodingOptions(language="en", fp16=fp16,
                                                                        without_timestamps=True))
            tokens = steps = len(r.tokens) + 1  # one token per step by definition
        else:
            extra = {}
            if draft is not None:
                draft_mel = mel if model.draft_model.dims.n_mels == model.dims.n_mels else \
                    whisper.log_mel_spectrogram(whisper.pad_or_trim(torch.from_numpy(audio)),
                                                model.draft_model.dims.n_mels).to(device)
                extra = dict(draft_mel=draft_mel.half() if fp16 else draft_mel, adaptive_lookahead=adaptive)
            r = medusa_whisper.decode(model, features, language="en", fp16=fp16, without_timestamps=True, mode=mode,
                                      **extra, **(decode_options or {}))
            tokens, steps = r.tokens_produced, r.decoder_steps
        sync()
        done = time.perf_counter()
        return Run(r.text, encoded - began, done - encoded, done - began, tokens, steps,
                   getattr(r, "draft_seconds", 0.0), getattr(r, "draft_proposed", 0), getattr(r, "draft_accepted", 0))

    return System(name, run, note)


# -- faster-whisper -------------------------------------------------------------------------------------

class _Timed:
    """Wraps a callable of faster-whisper's and adds up the seconds spent in it."""

    def __init__(self, inner):
        self.inner, self.seconds = inner, 0.0

    def __getattr__(self, name):  # the feature extractor's attributes (nb_max_frames, ...) stay visible
        return getattr(self.inner, name)

    def __call__(self, *args, **kwargs):
        began = time.perf_counter()
        try:
            return self.inner(*args, **kwargs)
        finally:
            self.seconds += time.perf_counter() - began


def faster_whisper_system(name: str, model_dir: Path, compute_type: str, threads: int, device: str) -> System:
    """faster-whisper's own ``transcribe``, greedy (beam 1), temperature 0 only, no VAD, no timestamps.

    Its encoder and feature extractor are wrapped (as instance attributes, which its transcribe
    looks up on ``self``) so that one call yields the encoder/decoder split, with no second pass.
    The no-speech and log-prob thresholds are off: openai-whisper's decode applies neither.
    """
    try:
        from faster_whisper import WhisperModel
    except ImportError:
        return System(name, None, "not installed (pip install faster-whisper, or `make bench` installs it)")
    fw = WhisperModel(str(model_dir), device=device, compute_type=compute_type, cpu_threads=threads)
    encode = _Timed(fw.encode)
    features = _Timed(fw.feature_extractor)
    fw.encode, fw.feature_extractor = encode, features

    def run(audio: np.ndarray) -> Run:
        encode.seconds = features.seconds = 0.0
        began = time.perf_counter()
        segments, _ = fw.transcribe(audio, language="en", task="transcribe", beam_size=1, best_of=1,
                                    temperature=[0.0], without_timestamps=True, condition_on_previous_text=False,
                                    vad_filter=False, compression_ratio_threshold=None, log_prob_threshold=None,
                                    no_speech_threshold=None)
        segments = list(segments)  # a generator: the work happens here
        total = time.perf_counter() - began
        encoder = encode.seconds + features.seconds
        tokens = sum(len(s.tokens) for s in segments) + 1  # + end-of-text, as for whisper
        return Run("".join(s.text for s in segments), encoder, total - encoder, total, tokens, tokens)

    return System(name, run, f"CTranslate2 compute_type {compute_type}")


def isolated_faster_whisper_system(name: str, model_dir: Path, compute_type: str, threads: int,
                                   device: str) -> System:
    """``faster_whisper_system`` in a process of its own, which the bench sends each clip to.

    Why: once CTranslate2 has run in a process, every PyTorch system in it is slower for the rest of
    the process (measured: an int8 base decoder pass 4.5 -> 8.9 ms, float32 7.0 -> 11.0 ms, and
    openai-whisper's decoder 7 % slower; with one torch thread the int8 pass is 6.1 ms, so the
    second thread is what suffers). It ships its own copy of libgomp, and PyTorch's OpenMP threads
    then wait as if the machine were oversubscribed (the slowdown matches OMP_WAIT_POLICY=PASSIVE,
    which makes PyTorch as slow from the start). Users run one tool per process, and so does this
    bench now. The times are taken inside the worker, so the pipe costs nothing that is counted.
    """
    return _isolated_system(name, ["--serve", "faster-whisper", "--model", str(model_dir), "--compute-type",
                                   compute_type, "--threads", str(threads), "--device", device],
                            f"CTranslate2 compute_type {compute_type} (in its own process)")


def _isolated_system(name: str, serve_args: List[str], note: str) -> System:
    """A system served by this file's ``--serve`` in a worker process: a clip in, a Run out."""
    import json
    import subprocess

    worker = subprocess.Popen(module_command("tools.bench.systems", *serve_args), env=module_env(),
                              stdin=subprocess.PIPE, stdout=subprocess.PIPE)
    first = worker.stdout.readline().decode().strip()
    if first != "ready":
        worker.kill()
        return System(name, None, first or f"the {serve_args[1]} worker did not start")

    def run(audio: np.ndarray) -> Run:
        data = np.ascontiguousarray(audio, dtype=np.float32).tobytes()
        worker.stdin.write(f"{len(data)}\n".encode() + data)
        worker.stdin.flush()
        reply = worker.stdout.readline()
        if not reply:
            raise RuntimeError(f"{name}: the {serve_args[1]} worker stopped")
        return Run(**json.loads(reply))

    return System(name, run, note)


# -- whisper.cpp (pywhispercpp) -------------------------------------------------------------------------

# whisper.cpp's whisper_full_params for the decoding every other row does: greedy at temperature 0
# with no fallback (temperature_inc 0 leaves one temperature), no timestamps, English transcription,
# no previous-text prompt, the non-speech tokens suppressed as whisper.decode's suppress_tokens="-1"
# does. The no-speech test (which drops a window's text) and the entropy test are off: openai-whisper's
# decode applies neither.
WHISPER_CPP_GREEDY = dict(language="en", translate=False, detect_language=False, no_context=True, no_timestamps=True,
                          single_segment=True, temperature=0.0, temperature_inc=0.0, greedy={"best_of": 1},
                          suppress_blank=True, suppress_nst=True, no_speech_thold=1.0, entropy_thold=0.0,
                          print_progress=False, print_realtime=False, print_timestamps=False, print_special=False)


def ggml_file(model_name: str, file_type: str) -> Path:
    """whisper.cpp's ggml file of ``model_name``'s weights (the ones every other row runs), written
    under cache_dir()/ggml the first time and reused after."""
    from medusa_whisper.paths import cache_dir

    path = cache_dir() / "ggml" / f"{model_name}-{file_type}.bin"
    if not path.is_file():
        import medusa_whisper
        from medusa_whisper.checkpoints.ggml import write_ggml

        write_ggml(medusa_whisper.load_model(model_name, device="cpu"), path, file_type)
    return path


def whisper_cpp_system(name: str, model_file: Path, threads: int) -> System:
    """whisper.cpp's ``whisper_full`` on a ggml file, through pywhispercpp's bindings, with
    ``WHISPER_CPP_GREEDY``. Imports no torch.

    The encoder/decoder split is whisper.cpp's own: its mel and encode timers (whisper_print_timings,
    caught through its log callback) are the encoder seconds, the rest of the call the decoder's.
    If that text cannot be read, the split is NaN and the table prints "-".
    """
    try:
        import _pywhispercpp as pw
    except ImportError:
        return System(name, None, "not installed (pip install pywhispercpp, or `make bench` installs it)")
    import atexit

    log: List[str] = []
    pw.whisper_log_set(lambda level, text: log.append(text))  # also keeps whisper.cpp's loading chatter quiet
    context = pw.whisper_init_from_file_with_params(str(model_file), pw.whisper_context_default_params())
    if context is None:
        pw.whisper_log_set(None)
        return System(name, None, f"whisper.cpp could not load {model_file}: {''.join(log[-3:]).strip()}")
    # a Python log callback left in place at exit crashes the interpreter as it finalises
    atexit.register(pw.whisper_log_set, None)
    params = pw.whisper_full_default_params(pw.whisper_sampling_strategy.WHISPER_SAMPLING_GREEDY)
    for key, value in dict(WHISPER_CPP_GREEDY, n_threads=threads).items():
        setattr(params, key, value)
    eot = pw.whisper_token_eot(context)

    def run(audio: np.ndarray) -> Run:
        samples = np.ascontiguousarray(audio, dtype=np.float32)
        pw.whisper_reset_timings(context)
        began = time.perf_counter()
        if pw.whisper_full(context, params, samples, samples.size) != 0:
            raise RuntimeError(f"{name}: whisper_full failed")
        segments = range(pw.whisper_full_n_segments(context))
        text = "".join(pw.whisper_full_get_segment_text(context, i).decode("utf-8", "replace") for i in segments)
        total = time.perf_counter() - began
        del log[:]
        pw.whisper_print_timings(context)
        encoder = _whisper_cpp_encoder_seconds("".join(log))
        sampled = sum(pw.whisper_full_get_token_id(context, i, j) < eot
                      for i in segments for j in range(pw.whisper_full_n_tokens(context, i)))
        tokens = sampled + 1  # + end-of-text, as for whisper
        return Run(text.strip(), encoder, total - encoder, total, tokens, tokens)

    return System(name, run, f"whisper.cpp (pywhispercpp), {model_file.name}")


def _whisper_cpp_encoder_seconds(timings: str) -> float:
    """mel + encode seconds from whisper_print_timings' text; NaN when either line is missing."""
    import re

    found = {key: float(ms) for key, ms in re.findall(r"\b(mel|encode) time\s*=\s*([\d.]+) ms", timings)}
    return (found["mel"] + found["encode"]) / 1000 if len(found) == 2 else float("nan")


def isolated_whisper_cpp_system(name: str, model_file: Path, threads: int) -> System:
    """``whisper_cpp_system`` in its own process, for the reason ``isolated_faster_whisper_system`` gives:
    pywhispercpp's wheel also ships its own libgomp (and ggml's OpenMP threads spin while they wait)."""
    return _isolated_system(name, ["--serve", "whisper.cpp", "--model", str(model_file), "--threads", str(threads)],
                            f"whisper.cpp (pywhispercpp) on {model_file.name}, greedy, no timestamps "
                            f"(in its own process)")


def serve_main(argv: List[str]) -> None:
    """The worker of ``_isolated_system``: a clip in (its byte count, a newline, float32
    samples), one JSON line of its Run out, until stdin closes. Imports no torch."""
    import json
    from dataclasses import asdict

    parser = argparse.ArgumentParser()
    parser.add_argument("--serve", required=True, choices=("faster-whisper", "whisper.cpp"))
    parser.add_argument("--model", required=True)
    parser.add_argument("--compute-type", default="int8")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--device", default="cpu")
    args = parser.parse_args(argv)
    if args.serve == "whisper.cpp":
        system = whisper_cpp_system("worker", Path(args.model), args.threads)
    else:
        system = faster_whisper_system("worker", Path(args.model), args.compute_type, args.threads, args.device)
    out = sys.stdout
    if system.run is None:
        out.write(system.note.replace("\n", " ") + "\n")
        return
    out.write("ready\n")
    out.flush()
    while True:
        line = sys.stdin.buffer.readline()
        if not line:
            return
        data = sys.stdin.buffer.read(int(line))
        r = system.run(np.frombuffer(data, dtype=np.float32))
        out.write(json.dumps(asdict(r)) + "\n")
        out.flush()


# -- Hugging Face transformers (optional) -----------------------------------------------------------------

def transformers_system(name: str, model_name: str, device: str) -> System:
    """transformers' WhisperForConditionalGeneration.generate, greedy, on the same weights.

    Only when transformers is installed: the whisper checkpoint is converted to transformers'
    layout in memory (see ``_to_transformers``); nothing is downloaded.
    """
    try:
        import transformers  # noqa: F401
    except ImportError:
        return System(name, None, "not installed (pip install transformers)")
    import torch
    import whisper

    import medusa_whisper

    transformers.logging.set_verbosity_error()  # its own deprecation notices about its Whisper generate
    base = medusa_whisper.load_model(model_name, device="cpu")
    hf = _to_transformers(base).to(device).eval()
    if device == "cuda":
        hf = hf.half()
    tokenizer = whisper.tokenizer.get_tokenizer(base.is_multilingual, num_languages=base.num_languages,
                                                language="en", task="transcribe")
    n_mels = base.dims.n_mels
    # transformers refuses a language or task for an English-only model
    prompt = dict(language="en", task="transcribe") if base.is_multilingual else {}
    del base

    def sync() -> None:
        if device == "cuda":
            torch.cuda.synchronize()

    def run(audio: np.ndarray) -> Run:
        began = time.perf_counter()
        mel = whisper.log_mel_spectrogram(whisper.pad_or_trim(torch.from_numpy(audio)), n_mels).to(device)
        mel = mel[None].to(hf.dtype)  # (1, n_mels, 3000)
        with torch.no_grad():
            encoder_out = hf.get_encoder()(mel)
            sync()
            encoded = time.perf_counter()
            ids = hf.generate(encoder_outputs=encoder_out, return_timestamps=False, num_beams=1, do_sample=False,
                              **prompt)
        sync()
        done = time.perf_counter()
        sampled = [t for t in ids[0].tolist() if t < tokenizer.eot]  # text tokens only
        text = tokenizer.decode(sampled).strip()  # as whisper's DecodingResult.text
        return Run(text, encoded - began, done - encoded, done - began, len(sampled) + 1, len(sampled) + 1)

    return System(name, run, f"transformers {transformers.__version__}, weights converted in memory")


def _to_transformers(model):
    """A transformers WhisperForConditionalGeneration holding the weights of an openai-whisper model."""
    import transformers
    import whisper

    dims = model.dims
    tokenizer = whisper.tokenizer.get_tokenizer(model.is_multilingual, num_languages=model.num_languages)
    config = transformers.WhisperConfig(
        vocab_size=dims.n_vocab, num_mel_bins=dims.n_mels, d_model=dims.n_audio_state,
        encoder_layers=dims.n_audio_layer, encoder_attention_heads=dims.n_audio_head,
        decoder_layers=dims.n_text_layer, decoder_attention_heads=dims.n_text_head,
        encoder_ffn_dim=4 * dims.n_audio_state, decoder_ffn_dim=4 * dims.n_text_state,
        max_source_positions=dims.n_audio_ctx, max_target_positions=dims.n_text_ctx,
        decoder_start_token_id=tokenizer.sot, bos_token_id=tokenizer.eot, eos_token_id=tokenizer.eot,
        pad_token_id=tokenizer.eot, tie_word_embeddings=True,
    )
    hf = transformers.WhisperForConditionalGeneration(config)
    state = {}
    for key, tensor in model.state_dict().items():
        if key.startswith("medusa.") or key == "alignment_heads":
            continue
        state[_hf_key(key)] = tensor.float()
    state["model.decoder.embed_tokens.weight"] = model.decoder.token_embedding.weight.detach().float()
    missing, unexpected = hf.load_state_dict(state, strict=False)
    missing = [k for k in missing if k != "proj_out.weight" and not k.endswith("k_proj.bias")]
    if missing or unexpected:
        raise RuntimeError(f"whisper -> transformers key mapping incomplete: missing {missing[:5]}, "
                           f"unexpected {unexpected[:5]}")
    hf.tie_weights()
    _set_generation_config(hf.generation_config, tokenizer, dims)
    return hf


# openai-whisper module names -> transformers' (applied to each dotted component in order)
_BLOCK_NAMES = {"attn.query": "self_attn.q_proj", "attn.key": "self_attn.k_proj", "attn.value": "self_attn.v_proj",
                "attn.out": "self_attn.out_proj", "attn_ln": "self_attn_layer_norm",
                "cross_attn.query": "encoder_attn.q_proj", "cross_attn.key": "encoder_attn.k_proj",
                "cross_attn.value": "encoder_attn.v_proj", "cross_attn.out": "encoder_attn.out_proj",
                "cross_attn_ln": "encoder_attn_layer_norm", "mlp.0": "fc1", "mlp.2": "fc2", "mlp_ln": "final_layer_norm"}


def _hf_key(key: str) -> str:
    side, rest = key.split(".", 1)  # encoder | decoder
    if rest.startswith("blocks."):
        _, index, inner = rest.split(".", 2)
        module, param = inner.rsplit(".", 1)
        return f"model.{side}.layers.{index}.{_BLOCK_NAMES[module]}.{param}"
    fixed = {"positional_embedding": "embed_positions.weight", "ln_post.weight": "layer_norm.weight",
             "ln_post.bias": "layer_norm.bias", "ln.weight": "layer_norm.weight", "ln.bias": "layer_norm.bias",
             "token_embedding.weight": "embed_tokens.weight"}
    return f"model.{side}.{fixed.get(rest, rest)}"


def _set_generation_config(config, tokenizer, dims) -> None:
    """What transformers' Whisper generate looks up to build the prompt and the suppressions."""
    from whisper.tokenizer import LANGUAGES

    config.decoder_start_token_id = tokenizer.sot
    config.eos_token_id = config.pad_token_id = tokenizer.eot
    config.no_timestamps_token_id = tokenizer.no_timestamps
    config.max_length = dims.n_text_ctx
    config.is_multilingual = tokenizer.language is not None or dims.n_vocab >= 51865
    if config.is_multilingual:
        codes = list(LANGUAGES)[: tokenizer.num_languages]
        config.lang_to_id = {f"<|{c}|>": tokenizer.to_language_token(c) for c in codes}
        config.task_to_id = {"transcribe": tokenizer.transcribe, "translate": tokenizer.translate}
    config.suppress_tokens = list(tokenizer.non_speech_tokens) + [tokenizer.transcribe, tokenizer.translate,
                                                                  tokenizer.sot, tokenizer.sot_prev, tokenizer.sot_lm,
                                                                  tokenizer.no_speech]
    config.begin_suppress_tokens = [tokenizer.encode(" ")[0], tokenizer.eot]
    config.forced_decoder_ids = None


# -- building by name, and the memory probe ---------------------------------------------------------------

def peak_rss_mb() -> float:
    """This process's resident-set high-water mark in MB.

    Linux's VmHWM, not ru_maxrss: ru_maxrss survives execve, so a probe started from the bench
    (which holds every system in memory) would report the bench's own peak, the same for all.
    """
    try:
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) / 1024  # kB
    except OSError:
        pass
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024  # KiB on Linux; elsewhere a fallback


def probe_main(argv: Optional[List[str]] = None) -> None:
    """Fresh process: build one system, decode the clips given, print its peak RSS in MB."""
    import soundfile as sf

    parser = argparse.ArgumentParser()
    parser.add_argument("--probe", required=True, choices=("torch", "faster-whisper", "whisper.cpp", "transformers"))
    parser.add_argument("--model", required=True,
                        help="model name (torch, transformers), CTranslate2 folder or ggml file (whisper.cpp)")
    parser.add_argument("--mode", default=None, help="medusa_whisper mode; none: whisper.decode")
    parser.add_argument("--draft", default=None, help="draft model name")
    parser.add_argument("--adaptive", action="store_true", help="adaptive lookahead for --draft")
    parser.add_argument("--compute-type", default=None, help="default: int8 for faster-whisper, float32 for torch")
    parser.add_argument("--draft-compute-type", default=None)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--device", default="cpu")
    parser.add_argument("clips", nargs="+", type=Path)
    args = parser.parse_args(argv)
    if args.probe == "whisper.cpp":
        system = whisper_cpp_system("probe", Path(args.model), args.threads)
    elif args.probe == "faster-whisper":
        system = faster_whisper_system("probe", Path(args.model), args.compute_type or "int8", args.threads,
                                       args.device)
    else:
        import torch

        torch.set_num_threads(args.threads)
        system = (torch_system("probe", args.model, args.device, args.mode, draft=args.draft, adaptive=args.adaptive,
                               compute_type=args.compute_type or "float32",
                               draft_compute_type=args.draft_compute_type)
                  if args.probe == "torch"
                  else transformers_system("probe", args.model, args.device))
    if system.run is None:
        sys.exit(system.note)
    for clip in args.clips:
        audio, _ = sf.read(str(clip), dtype="float32")
        system.run(audio)
    if args.device == "cuda" and "torch" in sys.modules:  # CTranslate2's GPU memory is not torch's to report
        import torch

        print(f"cuda_peak_mb {torch.cuda.max_memory_allocated() / 2**20:.1f}")
    print(f"peak_rss_mb {peak_rss_mb():.1f}")


def main() -> None:
    """``--serve`` (a worker of ``_isolated_system``) or ``--probe`` (one system's peak memory)."""
    if "--serve" in sys.argv[1:]:
        serve_main(sys.argv[1:])
    else:
        probe_main()


if __name__ == "__main__":
    main()
