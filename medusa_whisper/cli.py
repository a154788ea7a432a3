"""``medusa-whisper``: transcribe files, convert weights, list models.

``medusa-whisper AUDIO ...`` is openai-whisper's command line: whisper's options under whisper's
spellings (``--output_dir``, ``--word_timestamps True``) with whisper's meanings and defaults; each
is also accepted as ``--output-dir``. ``medusa-whisper transcribe AUDIO ...`` is the same command
with quieter defaults: the text on stdout, files only with ``--output-dir``.

A mistake of the user's (a bad file, an unknown model, no network) is one line on stderr,
``medusa-whisper: error: <message>``, and a non-zero exit; in a batch, the other files go on.
Anything else is a bug and keeps its traceback.
"""

from __future__ import annotations

import argparse
import copy
import os
import sys
from pathlib import Path
from typing import List, Optional, Sequence

import numpy as np
from tqdm import tqdm

from .options import MODES, SPECULATIVE_DEFAULTS, MedusaDecodingOptions, as_medusa_options, speculative_options
from .errors import MedusaWhisperError
from .transcription.outputs import OUTPUT_FORMATS, WRITER_OPTIONS, formats, output_record  # noqa: F401 (output_record: API)

PROG = "medusa-whisper"
COMMANDS = ("transcribe", "convert", "export-ggml", "eval", "train", "models", "tune")


class _Unset:
    """The default of an option whose default depends on the form of the command."""

    def __repr__(self) -> str:
        return "unset"


UNSET = _Unset()
# What whisper's command line does when an option is not given, where our `transcribe` differs
WHISPER_DEFAULTS = dict(output_dir=Path("."), output_format="all", verbose=True)
TRANSCRIBE_DEFAULTS = dict(output_dir=None, output_format="txt", verbose=UNSET)


def _error(message: object) -> None:
    _write(f"{PROG}: error: {_one_line(message)}", sys.stderr)


def _note(message: object) -> None:
    _write(f"{PROG}: note: {_one_line(message)}", sys.stderr)


def _one_line(message: object) -> str:
    """A message as one line, even when a file name holds a line break."""
    return str(message).replace("\r", "\\r").replace("\n", "\\n")


def _write(line: str, file) -> None:
    tqdm.write(line, file=file)  # keeps a progress bar on the terminal intact


# ---------------------------------------------------------------- argument types


def _positive_int(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a whole number, got {text!r}") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be at least 1, got {value}")
    return value


def _optional_positive_int(text: str) -> Optional[int]:
    return None if text.lower() == "none" else _positive_int(text)


def _threads(text: str) -> int:
    """whisper's --threads: 0 leaves torch's own choice."""
    return 0 if text.strip() == "0" else _positive_int(text)


def _optional_float(text: str) -> Optional[float]:
    if text.lower() == "none":
        return None
    try:
        return float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a number or none, got {text!r}") from None


def _bool(text: str) -> bool:
    value = {"true": True, "false": False, "1": True, "0": False, "yes": True, "no": False}.get(text.lower())
    if value is None:
        raise argparse.ArgumentTypeError(f"expected True or False, got {text!r}")
    return value


def _optional_bool(text: str) -> Optional[bool]:
    return None if text.lower() == "none" else _bool(text)


def _language(text: str) -> str:
    from whisper.tokenizer import LANGUAGES, TO_LANGUAGE_CODE

    code = text.lower()
    code = TO_LANGUAGE_CODE.get(code, code)  # "English" -> "en"
    if code not in LANGUAGES:
        raise argparse.ArgumentTypeError(f"unknown language {text!r}; use a code such as en, de, fr")
    return code


def _language_or_none(text: str) -> Optional[str]:
    return None if text.lower() == "none" else _language(text)


def _device(text: str) -> str:
    import torch

    try:
        torch.device(text)
    except (RuntimeError, ValueError):
        raise argparse.ArgumentTypeError(f"not a torch device: {text!r} (cpu, cuda, cuda:1, ...)") from None
    return text


# ---------------------------------------------------------------- the parser


class _HelpFormatter(argparse.HelpFormatter):
    """Lists each option under our spelling only; whisper's underscore spellings are named once in the
    description, so that the help stays readable."""

    def _format_action_invocation(self, action):
        ours = [s for s in action.option_strings if "_" not in s]
        if ours and len(ours) < len(action.option_strings):
            action = copy.copy(action)
            action.option_strings = ours
        return super()._format_action_invocation(action)


def _option(group, *names: str, **kwargs) -> argparse.Action:
    """An option under our spelling and whisper's: --output-format is also --output_format."""
    whispers = ["--" + n[2:].replace("-", "_") for n in names if n.startswith("--") and "-" in n[2:]]
    return group.add_argument(*names, *whispers, **kwargs)


def _switch(group, name: str, help: str) -> None:
    """Our on/off flag (--word-timestamps) beside whisper's spelling, which takes a value (--word_timestamps True)."""
    dest = name[2:].replace("-", "_")
    group.add_argument(name, dest=dest, action="store_true", default=False, help=help)
    group.add_argument("--" + dest, dest=dest, type=_bool, default=False, metavar="BOOL", help=argparse.SUPPRESS)


def _add_draft_arguments(parser: argparse.ArgumentParser) -> None:
    group = parser.add_argument_group("drafting (draft model, candidate trees)")
    group.add_argument("--draft", default=None, metavar="NAME|PATH",
                       help="a small Whisper that proposes tokens for the main model to verify (instead of "
                            "Medusa heads); its tokenizer may differ (e.g. tiny.en for base)")
    group.add_argument("--draft-tokens", type=_positive_int, default=SPECULATIVE_DEFAULTS["draft_tokens"], metavar="K",
                       help="draft tokens per step, at most (default: 5; an EAGLE chain on the CPU: the length "
                            "that makes a token cheapest on this machine, from the head's measured acceptance; "
                            "a --draft model: the length its measured costs make cheapest, 0 where none pays)")
    group.add_argument("--adaptive-lookahead", action="store_true",
                       help="grow K after well-accepted steps and shrink it after poor ones, up to --draft-tokens")
    group.add_argument("--tree-width", type=_positive_int, default=SPECULATIVE_DEFAULTS["tree_width"], metavar="W",
                       help="candidate trees: each drafted position offers its W best tokens (default %(default)s; "
                            "1: a chain)")
    group.add_argument("--tree-nodes", type=_positive_int, default=SPECULATIVE_DEFAULTS["tree_nodes"], metavar="N",
                       help="candidates verified per decoder pass in a tree, at most (default: the proposer's)")
    group.add_argument("--lossy-ctc-entropy", type=float, default=SPECULATIVE_DEFAULTS["lossy_ctc_entropy"],
                       metavar="NATS",
                       help="LOSSY (a <base>-ctc model only): accept drafted words whose CTC frames all have an "
                            "entropy below NATS without verification; the text may then differ from greedy "
                            "decoding (default: off, every token is verified)")


def _add_compute_type_arguments(parser: argparse.ArgumentParser) -> None:
    from .step.compute import COMPUTE_TYPES

    parser.add_argument("--compute-type", choices=("auto",) + COMPUTE_TYPES, default="float32",
                        help="float32; int8 (int8 weights, CPU); bfloat16; on CUDA also float16, int8_float16; "
                             "auto: the one that decodes a real window fastest on this machine (timed once, "
                             "`medusa-whisper tune`). lossless stays lossless: equal to greedy decoding at the "
                             "same compute type (default: float32)")
    parser.add_argument("--draft-compute-type", choices=COMPUTE_TYPES, default=None,
                        help="compute type of the --draft model (default: --compute-type)")


def _add_transcribe_parser(commands) -> None:
    t = commands.add_parser(
        "transcribe", help="transcribe audio files (the default command)", formatter_class=_HelpFormatter,
        description="Transcribe audio files; the text goes to stdout, files to --output-dir. "
                    "`medusa-whisper AUDIO ...` is this command with whisper's defaults (--output-dir ., "
                    "--output-format all, --verbose True). Every option is also accepted under "
                    "openai-whisper's spelling (--output_dir, --word_timestamps True, ...), with whisper's meaning.")
    t.add_argument("audio", nargs="*", metavar="AUDIO",
                   help="audio files, or folders searched for them (wav, flac, ogg, mp3; others through ffmpeg)")
    t.add_argument("--model", default=None, metavar="NAME|PATH",
                   help="model name (see `medusa-whisper models`; NAME-auto: NAME with the fastest of its "
                        "proposers on this machine, or none) or checkpoint path; default: tiny.en-auto")
    _option(t, "--model-dir", default=None, metavar="DIR",
            help="folder of openai-whisper checkpoints (tiny.en.pt, ...): used when there, downloaded into; "
                 "default: whisper's own, ~/.cache/whisper")
    t.add_argument("--mode", choices=MODES, default=SPECULATIVE_DEFAULTS["mode"],
                   help="lossless: same text as greedy decoding; typical: accept plausible "
                        "candidates too; off: no Medusa heads (default: lossless)")
    t.add_argument("--language", type=_language_or_none, default=None, metavar="LANG",
                   help="spoken language, e.g. en or English (default: detected)")
    t.add_argument("--task", choices=("transcribe", "translate"), default="transcribe",
                   help="transcribe, or translate into English (default: transcribe)")
    t.add_argument("--device", type=_device, default=None, help="cpu, cuda, cuda:1, ... (default: cuda when available)")
    _option(t, "--output-format", "-f", choices=OUTPUT_FORMATS + ("all",), default=UNSET,
            help="format of the files written; all: every one (default: txt; whisper's form: all)")
    _option(t, "--output-dir", "-o", type=Path, default=UNSET, metavar="DIR",
            help="write <stem>.<format> here for each file (default: none; whisper's form: .)")
    _option(t, "--skip-existing", action="store_true",
            help="skip files whose outputs are all in the output folder already (resumes a batch)")
    t.add_argument("--verbose", type=_optional_bool, default=UNSET, metavar="BOOL",
                   help="True: print segments as they are decoded; False: a progress bar; None: nothing "
                        "(default: the text of each file; whisper's form: True)")
    t.add_argument("--threads", type=_threads, default=0, metavar="N", help="CPU threads for torch (0: torch's choice)")
    _option(t, "--batch-size", type=_positive_int, default=None, metavar="N",
            help="decode the greedy windows of up to N files side by side, one decoder pass for all (each file's "
                 "result is the one it gets alone: bit for bit at int8); default for several files at --compute-type "
                 "int8: the size a pass measured on this machine makes cheapest per token (1 where batching does not "
                 "pay here; measured once per machine), else 1 (one file after another)")
    _option(t, "--vad-chunks", action="store_true",
            help="long recordings, fast: cut each file's speech into chunks of at most 30 s (Silero VAD; pip install "
                 "'medusa-whisper[vad]') and decode --batch-size of them side by side (default: the width measured "
                 "cheapest per token on this machine), each without the previous text, as faster-whisper's batched "
                 "pipeline does: not whisper's text")
    _option(t, "--vad-filter", action="store_true",
            help="leave out silences of 2 s or more (Silero VAD; pip install 'medusa-whisper[vad]') and transcribe the "
                 "rest window after window as whisper does, times on the recording's clock (faster-whisper's vad_filter)")
    _option(t, "--num-heads", type=_positive_int, default=SPECULATIVE_DEFAULTS["num_heads"], metavar="K",
            help="use the first K heads")
    _add_draft_arguments(t)
    _add_compute_type_arguments(t)

    many = t.add_argument_group("many machines (Ray; pip install 'medusa-whisper[ray]')")
    many.add_argument("--ray", nargs="?", const="local", default=None, metavar="ADDRESS",
                      help="transcribe on a pool of Ray workers: a local Ray on this machine, or the cluster at "
                           "ADDRESS (host:port or auto); outputs as without --ray, done files skipped, failures "
                           "in OUT/failed.tsv")
    _option(many, "--workers", type=_positive_int, default=1, metavar="N", help="Ray workers, one model each (default 1)")
    _option(many, "--threads-per-worker", type=_positive_int, default=1, metavar="N",
            help="torch threads (and Ray CPUs) per worker (default 1)")
    _option(many, "--manifest", type=Path, default=None, metavar="FILE",
            help="more inputs: one path or fsspec URL (s3://..., gs://...) per line")

    decoding = t.add_argument_group("decoding (whisper's options; speculation applies to greedy decoding)")
    decoding.add_argument("--temperature", type=float, default=0.0,
                          help="temperature of the first decode of each window (0: greedy, speculative)")
    _option(decoding, "--best-of", type=_optional_positive_int, default=5, metavar="N",
            help="candidates sampled at a fallback temperature (default: 5)")
    _option(decoding, "--beam-size", type=_optional_positive_int, default=None, metavar="N",
            help="beam search with N beams, whisper's, on medusa_whisper's decoder step (default: none, greedy; "
                 "whisper's command line defaults to 5)")
    decoding.add_argument("--patience", type=float, default=None, help="beam search patience (whisper's)")
    _option(decoding, "--length-penalty", type=float, default=None, metavar="ALPHA",
            help="length penalty when ranking candidates (whisper's)")
    _option(decoding, "--suppress-tokens", default="-1", metavar="IDS",
            help="comma-separated token ids to suppress; -1: most special characters (default)")
    decoding.add_argument("--fp16", type=_bool, default=True, metavar="BOOL",
                          help="half precision on a GPU (default: True; a CPU always uses fp32)")

    long_form = t.add_argument_group("long audio (whisper.transcribe's options, same defaults)")
    _option(long_form, "--temperature-increment-on-fallback", type=_optional_float, default=0.2, metavar="T",
            help="retry a failed window at temperatures this much higher, up to 1.0; none: no retry")
    _option(long_form, "--compression-ratio-threshold", type=_optional_float, default=2.4, metavar="X")
    _option(long_form, "--logprob-threshold", type=_optional_float, default=-1.0, metavar="X")
    _option(long_form, "--no-speech-threshold", type=_optional_float, default=0.6, metavar="X")
    _option(long_form, "--condition-on-previous-text", type=_bool, default=True, metavar="BOOL",
            help="prompt each window with the text before it (default: True)")
    _option(long_form, "--initial-prompt", default=None, metavar="TEXT", help="prompt for the first window")
    _switch(long_form, "--carry-initial-prompt", help="put --initial-prompt before the prompt of every window")
    _option(long_form, "--clip-timestamps", default="0", metavar="START,END,...",
            help="only these stretches, in seconds (default: all)")
    _switch(long_form, "--word-timestamps", help="word-level timestamps through whisper's cross-attention alignment")
    _option(long_form, "--prepend-punctuations", default="\"'“¿([{-", metavar="CHARS",
            help="with --word-timestamps: joined to the next word")
    _option(long_form, "--append-punctuations", default="\"'.。,，!！?？:：”)]}、", metavar="CHARS",
            help="with --word-timestamps: joined to the previous word")
    _option(long_form, "--hallucination-silence-threshold", type=_optional_float, default=None, metavar="S",
            help="with --word-timestamps: skip silences longer than S seconds around suspected hallucinations")

    writer = t.add_argument_group("subtitles (srt, vtt), with --word-timestamps")
    _switch(writer, "--highlight-words", help="underline each word as it is spoken")
    _option(writer, "--max-line-width", type=_optional_positive_int, default=None, metavar="CHARS")
    _option(writer, "--max-line-count", type=_optional_positive_int, default=None, metavar="LINES")
    _option(writer, "--max-words-per-line", type=_optional_positive_int, default=None, metavar="WORDS")
    t.set_defaults(run=_transcribe)


def build_parser() -> argparse.ArgumentParser:
    from . import __version__

    parser = argparse.ArgumentParser(
        prog=PROG, description="Whisper transcription with Medusa multi-token decoding. "
        "`medusa-whisper AUDIO ...` works as openai-whisper's `whisper AUDIO ...`.")
    parser.add_argument("--version", action="version", version=f"%(prog)s {__version__}")
    commands = parser.add_subparsers(title="commands", dest="command", required=True)
    _add_transcribe_parser(commands)

    c = commands.add_parser("convert", help="convert weights into a whisper .pt checkpoint",
                            description="Convert a CTranslate2 Whisper directory or an openai-whisper "
                                        ".pt checkpoint into a .pt file that --model accepts.")
    c.add_argument("src", metavar="SRC", help="CTranslate2 model directory or openai-whisper .pt")
    c.add_argument("out", metavar="OUT.pt", help="checkpoint file to write")
    c.set_defaults(run=_convert)

    g = commands.add_parser("export-ggml", help="write a model as whisper.cpp's ggml file",
                            description="Write a model's weights (no heads) as the ggml model file whisper.cpp "
                                        "loads: f16 (as whisper.cpp's own converter), q8_0 (as its quantize "
                                        "tool) or f32.")
    g.add_argument("model", metavar="MODEL", help="model name or checkpoint path, as --model takes")
    g.add_argument("out", metavar="OUT.bin", type=Path, help="ggml file to write")
    g.add_argument("--type", choices=("f16", "q8_0", "f32"), default="f16", dest="ggml_type")
    g.add_argument("--check", action="store_true",
                   help="read the written file back and compare every tensor with the model's")
    g.set_defaults(run=_export_ggml)

    e = commands.add_parser("eval", help="WER/CER and speed on a labelled CSV",
                            description="Evaluate on a CSV with columns audio, sentence, language (optional "
                                        "regulation-start, regulation-factor): WER and CER after whisper's text "
                                        "normaliser, tokens per decoder step, times.")
    e.add_argument("--data", type=Path, required=True, metavar="CSV")
    e.add_argument("--model", default=None, metavar="NAME|PATH", help="default: tiny.en-auto")
    e.add_argument("--mode", choices=MODES, default=SPECULATIVE_DEFAULTS["mode"])
    e.add_argument("--num-heads", type=_positive_int, default=SPECULATIVE_DEFAULTS["num_heads"], metavar="K",
                   help="use the first K heads")
    _add_draft_arguments(e)
    _add_compute_type_arguments(e)
    e.add_argument("--compare-vanilla", action="store_true",
                   help="also decode each file with whisper.decode greedy (same weights), interleaved")
    e.add_argument("--out", type=Path, default=None, metavar="PREFIX",
                   help="write PREFIX.csv and PREFIX.json (default: eval_<model>_<mode> beside the CSV)")
    e.add_argument("--limit", type=_positive_int, default=None, metavar="N", help="only the first N rows")
    e.add_argument("--device", choices=("cpu", "cuda"), default=None)
    e.add_argument("--threads", type=_positive_int, default=None, metavar="N")
    e.set_defaults(run=_eval)

    from .training.cli import add_parser as add_train_parser

    add_train_parser(commands, _positive_int, _language)

    m = commands.add_parser("models", help="list known models and whether they are present",
                            description="List the model names --model accepts.")
    m.set_defaults(run=_models)

    u = commands.add_parser("tune", help="time this machine's choices and print them",
                            description="Time on this machine, on the timing clip the package carries, the choices "
                                        "a first run takes from the recorded CPU kind nearest it: for a model, the "
                                        "compute type that --compute-type auto takes, the proposer of a -auto name, "
                                        "the int8 encoder's form, float32's products and the batch width for several "
                                        "files; then print what was measured and chosen (kept per machine, torch and "
                                        "thread count, and used from then on).")
    u.add_argument("--model", default=None, metavar="NAME|PATH", help="default: medusa_whisper.DEFAULT_MODEL")
    u.add_argument("--device", type=_device, default=None, help="cpu, cuda, ... (default: cuda when available)")
    u.add_argument("--threads", type=_threads, default=0, metavar="N", help="CPU threads for torch (0: torch's choice)")
    _option(u, "--model-dir", default=None, metavar="DIR", help="folder of openai-whisper checkpoints")
    u.add_argument("--kernels", action="store_true",
                   help="time every kernel choice here too (the products' routes and kernels, the pass costs)")
    u.set_defaults(run=_tune)
    return parser


def _with_command(argv: List[str]) -> "tuple[List[str], bool]":
    """whisper's habit: no command means transcribe (``medusa-whisper talk.mp3 --model base``)."""
    if argv and argv[0] not in COMMANDS and argv[0] not in ("-h", "--help", "--version"):
        return ["transcribe", *argv], True
    return argv, False


def main(argv: Optional[Sequence[str]] = None) -> int:
    for stream in (sys.stdout, sys.stderr):  # a file name with undecodable bytes must not crash a print
        if hasattr(stream, "reconfigure"):
            stream.reconfigure(errors="backslashreplace")
    argv, whisper_form = _with_command(list(sys.argv[1:] if argv is None else argv))
    parser = build_parser()
    try:
        args = parser.parse_args(argv)
    except SystemExit as e:  # argparse: 0 after --help or --version, 2 for a usage error
        return e.code if isinstance(e.code, int) else 2
    args.whisper_form = whisper_form
    try:
        return args.run(args)
    except MedusaWhisperError as e:
        _error(e)
        return 1
    except KeyboardInterrupt:
        _error("interrupted")
        return 130


# ---------------------------------------------------------------- transcribe


def _usage_problem(args: argparse.Namespace) -> Optional[str]:
    """Option combinations that cannot work, said before any file is read (exit status 2)."""
    if not args.audio and args.manifest is None:
        return "no audio files given (usage: medusa-whisper AUDIO ... [options]; see --help)"
    if args.ray is None and args.manifest is not None:
        return "--manifest needs --ray"
    if args.ray is not None and args.output_dir is None:
        return "--ray needs --output-dir"
    if args.hallucination_silence_threshold is not None and not args.word_timestamps:
        return "--hallucination-silence-threshold needs --word-timestamps"
    for flag in WRITER_OPTIONS:
        if getattr(args, flag) not in (None, False) and not args.word_timestamps:
            return f"--{flag.replace('_', '-')} needs --word-timestamps"
    if args.skip_existing and args.output_dir is None:
        return "--skip-existing needs --output-dir"
    if args.vad_filter and args.vad_chunks:
        return "--vad-chunks already leaves the silences out: give --vad-chunks or --vad-filter, not both"
    if args.vad_filter and args.clip_timestamps.strip() not in ("0", ""):
        return "--vad-filter chooses what to transcribe: it cannot be combined with --clip-timestamps"
    return None


def _options_notes(args: argparse.Namespace) -> List[str]:
    notes = []
    if args.beam_size is not None or args.temperature > 0:
        asked = f"--beam-size {args.beam_size}" if args.beam_size is not None else f"--temperature {args.temperature}"
        notes.append(f"{asked}: whisper's sampling and beam search, run on medusa_whisper's step; Medusa "
                     f"speculation (heads or a draft model) applies to greedy decoding only")
    if (args.batch_size or 1) > 1 and (args.beam_size is not None or args.mode == "typical"):
        asked = f"--beam-size {args.beam_size}" if args.beam_size is not None else "--mode typical"
        notes.append(f"{asked}: windows are decoded one at a time; --batch-size batches greedy windows only")
    if args.max_line_count and not args.max_line_width:
        notes.append("--max-line-count has no effect without --max-line-width")
    if args.max_words_per_line and args.max_line_width:
        notes.append("--max-words-per-line has no effect with --max-line-width")
    return notes


def _transcribe(args: argparse.Namespace) -> int:
    import torch

    import medusa_whisper
    from .audio.files import check_audio_path
    from .archive.batch import Summary, collect_jobs, output_clash

    for name, value in (WHISPER_DEFAULTS if args.whisper_form else TRANSCRIBE_DEFAULTS).items():
        if getattr(args, name) is UNSET:
            setattr(args, name, value)
    if args.ray not in (None, "local") and not _looks_like_address(args.ray):
        args.audio.insert(0, args.ray)  # `--ray talk.wav ...`: the first input, not an address
        args.ray = "local"
    problem = _usage_problem(args)
    if problem:
        _error(problem)
        return 2
    if args.vad_chunks or args.vad_filter:
        from .audio.vad import VadUnavailable, check_available

        try:
            check_available()
        except VadUnavailable as error:
            _error(str(error))
            return 1
    if args.ray is not None:
        return _transcribe_on_ray(args)
    if args.threads:
        torch.set_num_threads(args.threads)
    if args.device is not None and args.device.startswith("cuda") and not torch.cuda.is_available():
        _error(f"--device {args.device}: CUDA is not available on this machine")
        return 1
    for note in _options_notes(args):
        _note(note)

    failed = 0

    def problem_line(message: str) -> None:
        nonlocal failed
        _error(message)
        failed += 1

    jobs = collect_jobs(args.audio, problem_line)
    output_formats = formats(args.output_format)
    if args.output_dir is not None:
        clash = output_clash(jobs, output_formats)
        if clash:
            _error(clash)
            return 2
    summary = Summary()
    if args.skip_existing:
        todo = [job for job in jobs if not job.done(args.output_dir, output_formats)]
        summary.skipped = len(jobs) - len(todo)
        jobs = todo
    # Files that cannot be opened fail before the model is loaded (which may take a while or
    # need a download); decoding waits for each file's turn, so a long batch is never all in memory.
    readable = []
    for job in jobs:
        try:
            check_audio_path(job.path)
            readable.append(job)
        except MedusaWhisperError as e:
            problem_line(e)
    summary.failed = failed
    if not readable:
        if summary.skipped and not failed:
            _note(f"all {summary.skipped} files are done already (--skip-existing)")
            return 0
        return 1
    if args.output_dir is not None:
        try:
            args.output_dir.mkdir(parents=True, exist_ok=True)
        except OSError as e:
            _error(f"{args.output_dir}: cannot create output folder ({e.strerror or e})")
            return 1
    name = _model_name(args)
    model = medusa_whisper.load_model(name, device=args.device, draft=args.draft, download_root=args.model_dir,
                                      **_compute_types(args))
    if args.compute_type == "auto" and args.verbose is True:
        _note(f"--compute-type auto: {_auto_choice(model)}")
    if hasattr(model, "proposer_name") and args.verbose is True:
        _note(f"{name}: {_proposer_choice(model)}")
    if not model.is_multilingual and args.language not in (None, "en"):
        _note(f"the model is English-only; transcribing as English, not {args.language!r}")
        args.language = "en"
    many = len(jobs) + summary.skipped > 1
    _run_jobs(model, readable, args, output_formats, summary, many)
    if many:
        _write(f"{PROG}: {summary.line()}", sys.stderr)
    return 1 if summary.failed else 0


def _model_name(args: argparse.Namespace) -> str:
    """The model to load: the one named, or DEFAULT_MODEL. A name asking for the fastest proposer
    (``tiny.en-auto``) loads its plain model where no proposer would run (``--mode off``, beam search,
    sampling from the first temperature), so that nothing is timed or loaded for nothing."""
    import medusa_whisper
    from .tuning import auto_base

    name = args.model or medusa_whisper.DEFAULT_MODEL
    base = auto_base(name)
    if base is not None and (args.mode == "off" or getattr(args, "beam_size", None) is not None
                             or getattr(args, "temperature", 0) > 0):
        return base
    return name


def _proposer_choice(model) -> str:
    """What a ``-auto`` name decodes with and what it chose from, e.g. "tiny.en (this machine's timing
    of a short and a long window: tiny.en 1.18 + 2.87 s, tiny.en-ctc 1.23 + 2.61 s, ...)"."""
    from .tuning import describe_proposers

    costs = getattr(model, "proposer_costs", {})
    predicted = getattr(model, "proposer_predicted", None)
    if not costs or predicted == UNTIMED:
        return model.proposer_name + (_NOT_TIMED if costs else "")
    return f"{model.proposer_name} ({_whose_timing(predicted)} of a short and a long window: {describe_proposers(costs)})"


UNTIMED = "default"  # routes.RouteTable's mark of a choice no timing made (the caller's safe default)
_NOT_TIMED = " (not timed on this machine nor on a recorded CPU kind like it: `medusa-whisper tune` times it)"


def _whose_timing(predicted) -> str:
    """Whose timing a choice comes from: this machine's, or a recorded CPU kind's (step/kinds.py)."""
    if predicted is None:
        return "this machine's timing"
    return f"predicted from the recorded CPU kind {predicted}, as `medusa-whisper tune` would time it here: its timing"


def _auto_choice(model) -> str:
    """What --compute-type auto took and what it chose from, e.g. "int8 (this machine's timing of a
    30-s window: float32 3.10 s, int8 2.21 s)"."""
    from .step.compute import compute_type_of

    costs = getattr(model, "compute_type_costs", {})
    timed = ", ".join(f"{t} {us / 1e6:.2f} s" for t, us in costs.items())
    form = f", encoder {model.encoder_form}" if hasattr(model, "encoder_form") else ""
    chosen = compute_type_of(model)
    predicted = getattr(model, "compute_type_predicted", None)
    if predicted == UNTIMED:
        return chosen + form + _NOT_TIMED
    return f"{chosen}{form} ({_whose_timing(predicted)} of a window: {timed})" if timed else chosen


def _looks_like_address(text: str) -> bool:
    return text == "auto" or text.startswith("ray://") or (":" in text and not os.path.exists(text))


def _transcribe_on_ray(args: argparse.Namespace) -> int:
    import medusa_whisper
    from .archive import distributed
    from .archive.batch import output_clash

    failed = 0

    def problem_line(message) -> None:
        nonlocal failed
        _error(message)
        failed += 1

    ray = distributed.import_ray()  # noqa: F841 (one line now, before any work, when it is missing)
    jobs = distributed.collect_inputs(args.audio, args.manifest, problem_line)
    output_formats = formats(args.output_format)
    clash = output_clash(jobs, output_formats)
    if clash:
        _error(clash)
        return 2
    for note in _options_notes(args):
        _note(note)

    def done(outcome) -> None:
        if outcome.ok and args.verbose is UNSET:
            _write(f"{outcome.job.path}: {outcome.text.strip()}", sys.stdout)

    ray_options = distributed.RayOptions(
        address=None if args.ray == "local" else args.ray, workers=args.workers,
        threads_per_worker=args.threads_per_worker, model=_model_name(args),
        device=args.device, draft=args.draft, download_root=args.model_dir,
        load_options=_compute_types(args),
        # each worker batches files as one machine does (--vad-chunks batches within each file instead)
        batch_size=1 if args.vad_chunks else files_batch(args, len(jobs)))
    summary = distributed.transcribe_archive(
        jobs, args.output_dir, output_formats, transcribe_options(args, for_workers=True),
        {k: getattr(args, k) for k in WRITER_OPTIONS}, ray_options, on_problem=_error, on_done=done,
        progress=sys.stderr.isatty() and args.verbose is not None)
    summary.failed += failed
    _write(f"{PROG}: {summary.line()}", sys.stderr)
    return 1 if summary.failed else 0


def _run_jobs(model, jobs, args: argparse.Namespace, output_formats, summary, many: bool) -> None:
    from .archive.batch import transcribe_job

    options = transcribe_options(args)
    writer_options = {k: getattr(args, k) for k in WRITER_OPTIONS}
    show_bars = args.verbose is False or (args.verbose is UNSET and sys.stderr.isatty())
    batch_size = files_batch(args, len(jobs), model)
    if batch_size > 1 and not args.vad_chunks:  # --vad-chunks batches within a file
        _run_jobs_batched(model, jobs, args, options, output_formats, writer_options, summary, show_bars, batch_size)
        return
    files_bar = tqdm(jobs, unit="file", file=sys.stderr, disable=not many or not show_bars)
    for job in files_bar:
        def file_bar(**kwargs):
            return tqdm(**kwargs, desc=Path(job.path).name, file=sys.stderr, position=1 if many else 0,
                        leave=False, disable=not show_bars)

        outcome = transcribe_job(model, job, options, args.output_dir, output_formats, writer_options, file_bar)
        summary.add(outcome)
        if not outcome.ok:
            _error(outcome.error)
        elif args.verbose is UNSET:
            text = outcome.text.strip()
            _write(f"{job.path}: {text}" if many else text, sys.stdout)


def _run_jobs_batched(model, jobs, args: argparse.Namespace, options: dict, output_formats, writer_options,
                      summary, show_bars: bool, batch_size: int) -> None:
    """``--batch-size N`` over several files: their windows side by side (batch.transcribe_jobs); each
    file's text (or error) is printed as it ends, which need not be in input order."""
    from .archive.batch import transcribe_jobs

    if options.get("verbose"):
        options = dict(options, verbose=None)  # segments of several files as they are decoded would interleave
    files_bar = tqdm(total=len(jobs), unit="file", file=sys.stderr, disable=not show_bars)

    def done(outcome) -> None:
        summary.add(outcome)
        files_bar.update(1)
        if not outcome.ok:
            _error(outcome.error)
        elif args.verbose is not None:
            _write(f"{outcome.job.path}: {outcome.text.strip()}", sys.stdout)

    with files_bar:
        transcribe_jobs(model, jobs, options, args.output_dir, output_formats, writer_options, batch_size, done)


def _compute_types(args: argparse.Namespace) -> dict:
    """load_model's compute-type arguments; a type the device cannot run fails before any loading."""
    import torch

    from .step.compute import check_compute_type

    device = args.device or ("cuda" if torch.cuda.is_available() else "cpu")
    for compute_type in (args.compute_type, args.draft_compute_type):
        if compute_type is not None:
            check_compute_type(compute_type, device)
    chosen = {}  # only what differs from load_model's defaults
    if args.compute_type != "float32":
        chosen["compute_type"] = args.compute_type
    if args.draft_compute_type is not None:
        chosen["draft_compute_type"] = args.draft_compute_type
    return chosen


def transcribe_options(args: argparse.Namespace, for_workers: bool = False) -> dict:
    """model.transcribe's keyword arguments from the command line (whisper's CLI rules).

    for_workers: without ``verbose`` (a worker prints nothing) and with the English-only rule applied later
    """
    if args.temperature_increment_on_fallback is not None:
        steps = np.arange(args.temperature, 1.0 + 1e-6, args.temperature_increment_on_fallback)
        temperature = tuple(round(float(t), 6) for t in steps)  # 0.6, not whisper's 0.6000000000000001
    else:
        temperature = (args.temperature,)
    verbose = args.verbose if args.verbose in (True, False) and not for_workers else None
    return dict(**speculative_options(args),
                language=args.language, task=args.task,
                temperature=temperature, compression_ratio_threshold=args.compression_ratio_threshold,
                logprob_threshold=args.logprob_threshold, no_speech_threshold=args.no_speech_threshold,
                condition_on_previous_text=args.condition_on_previous_text, initial_prompt=args.initial_prompt,
                carry_initial_prompt=args.carry_initial_prompt, clip_timestamps=args.clip_timestamps,
                word_timestamps=args.word_timestamps, prepend_punctuations=args.prepend_punctuations,
                append_punctuations=args.append_punctuations,
                hallucination_silence_threshold=args.hallucination_silence_threshold, verbose=verbose,
                best_of=args.best_of, beam_size=args.beam_size, patience=args.patience,
                length_penalty=args.length_penalty, suppress_tokens=args.suppress_tokens, fp16=args.fp16,
                # transcribe's own default (8 chunks) when --batch-size is not given
                **(dict(vad_chunks=True, batch_size=args.batch_size) if getattr(args, "vad_chunks", False) else {}),
                **(dict(vad_filter=True) if getattr(args, "vad_filter", False) else {}))


# --batch-size's default for several files at int8 where no model is at hand to measure it (the Ray
# driver, whose workers may run elsewhere): on 64 real recordings (base, 2 threads, docs/batching.md)
# batch 8 was 1.42x batch 1 on an AVX-512 EPYC and batch 4 and 8 were equal (1.33x) on an AVX2 one
INT8_FILES_BATCH = 8


def files_batch(args: argparse.Namespace, n_files: int, model=None) -> int:
    """How many files' windows share a pass: --batch-size; else, for several files at int8 (where a
    batched file's outputs are byte-identical to its own), the size ``batches.default_batch_size``
    measures on this machine for ``model`` (INT8_FILES_BATCH without a model); else 1. float32
    batches only when asked: its products are not row-invariant, so a batched file may differ from
    the file alone in a logit's last bits."""
    from .step.compute import compute_type_of

    if args.batch_size is not None:
        return args.batch_size
    compute_type = args.compute_type if model is None else compute_type_of(model)
    if n_files <= 1 or compute_type != "int8":
        return 1
    if model is None:
        return INT8_FILES_BATCH
    from .decoding.batches import default_batch_size
    return default_batch_size(model)


def _tune(args: argparse.Namespace) -> int:
    import torch

    import medusa_whisper
    from . import tuning

    if args.threads:
        torch.set_num_threads(args.threads)
    device = torch.device(args.device or ("cuda" if torch.cuda.is_available() else "cpu"))
    if device.type == "cuda" and not torch.cuda.is_available():
        _error("--device cuda: CUDA is not available on this machine")
        return 1
    name = args.model or medusa_whisper.DEFAULT_MODEL

    def load_at(compute_type: str):
        return medusa_whisper.load_model(name, device=device, download_root=args.model_dir, compute_type=compute_type)
    _, lines = tuning.tune(name, device, load_at, kernels=args.kernels)
    for line in lines:
        _write(line, sys.stdout)
    return 0


def _eval(args: argparse.Namespace) -> int:
    import torch

    import medusa_whisper
    from . import evaluation

    if args.threads is not None:
        torch.set_num_threads(args.threads)
    if args.device == "cuda" and not torch.cuda.is_available():
        _error("--device cuda: CUDA is not available on this machine")
        return 1
    rows, problems = evaluation.read_eval_csv(args.data)
    for message in problems:
        _error(message)
    rows = rows[: args.limit] if args.limit else rows
    if not rows:
        _error(f"{args.data}: no row can be evaluated")
        return 1
    name = _model_name(args)
    model = medusa_whisper.load_model(name, device=args.device, draft=args.draft, **_compute_types(args))
    options = evaluation.EvalOptions(as_medusa_options(MedusaDecodingOptions(**speculative_options(args))),
                                     compare_vanilla=args.compare_vanilla)
    report = evaluation.evaluate(model, rows, options, on_problem=_error, progress=sys.stderr.isatty())
    report.problems[:0] = problems
    report.summary["skipped"] = len(report.problems)
    prefix = args.out or args.data.parent / f"eval_{Path(name).name}_{args.mode}"
    csv_path, json_path = evaluation.write_report(report, prefix)
    for line in evaluation.format_summary(report.summary):
        _write(line, sys.stdout)
    _write(f"wrote {csv_path} and {json_path}", sys.stdout)
    return 1 if report.problems else 0


# ---------------------------------------------------------------- convert, models


def _convert(args: argparse.Namespace) -> int:
    from .checkpoints.convert import convert

    out = convert(args.src, args.out)
    print(f"wrote {out}")
    return 0


def _export_ggml(args: argparse.Namespace) -> int:
    from .checkpoints import ggml
    from .loading import load_model

    model = load_model(args.model, device="cpu")
    try:
        out = ggml.write_ggml(model, args.out, args.ggml_type)
    except OSError as e:
        _error(f"{args.out}: cannot write ({e.strerror or e})")
        return 1
    print(f"wrote {out} ({args.ggml_type}, {out.stat().st_size / 1e6:.1f} MB)")
    if args.ggml_type == "f32":
        # whisper.cpp (1.8 on the CPU) still runs its conv kernels in f16 only: ggml-org/whisper.cpp#2557
        _note("whisper.cpp's CPU backend cannot run f32 files (its convolution asserts f16 kernels); "
              "use f16 or q8_0 with it")
    if args.check:
        problems = ggml.check_ggml(out, model)
        for problem in problems:
            _error(f"{out}: {problem}")
        if problems:
            return 1
        print(f"checked {out}: every tensor whisper.cpp loads is there, of the shape and type it expects, "
              f"equal to the model's within {args.ggml_type} rounding")
    return 0


def _models(args: argparse.Namespace) -> int:
    from .checkpoints import weights
    from .loading import DEFAULT_MODEL

    rows = [[row["name"], row["kind"], _present(row), str(row["source"])] for row in weights.model_table()]
    print(format_table(["NAME", "KIND", "PRESENT", "SOURCE"], rows))
    _note(f"each base name also as <name>-auto: that model with the fastest of its installed proposers on this "
          f"machine, or none, timed once (the default: {DEFAULT_MODEL}); and as <name>+<smaller name>: the smaller "
          f"drafting for it (base+tiny.en)")
    return 0


def _present(row: dict) -> str:
    """The local path when there is one, else yes or no."""
    present = row.get("path") or row.get("present")
    if isinstance(present, (str, Path)) and str(present):
        return str(present)
    return "yes" if present else "no"


def format_table(header: List[str], rows: List[List[str]]) -> str:
    """Columns left-aligned to their widest cell, two spaces apart; the last column is not padded."""
    widths = [max(len(r[i]) for r in [header] + rows) for i in range(len(header))]
    lines = ["  ".join(cell.ljust(w) for cell, w in zip(r, widths)).rstrip() for r in [header] + rows]
    return "\n".join(lines)


if __name__ == "__main__":
    sys.exit(main())
