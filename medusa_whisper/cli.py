"""``medusa-whisper``: transcribe files, convert weights, list models.

A mistake of the user's (a bad file, an unknown model, no network) is one line on stderr,
``medusa-whisper: error: <message>``, and a non-zero exit; in a batch, the other files go on.
Anything else is a bug and keeps its traceback.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import List, Optional, Sequence, Tuple

import numpy as np
from tqdm import tqdm

from .decoding import MODES
from .errors import MedusaWhisperError

PROG = "medusa-whisper"
# result["medusa"] entries copied into each file's JSON output
STAT_FIELDS = ("windows", "fallback_windows", "tokens", "decoder_steps", "tokens_per_step", "encode_seconds",
               "decode_seconds", "draft_proposed", "draft_accepted", "draft_acceptance", "draft_seconds")
# whisper's writers, plus our own json (a superset of whisper's: Medusa statistics added)
OUTPUT_FORMATS = ("txt", "vtt", "srt", "tsv", "json")


def _error(message: object) -> None:
    _write(f"{PROG}: error: {message}", sys.stderr)


def _write(line: str, file) -> None:
    tqdm.write(line, file=file)  # keeps a progress bar on the terminal intact


def _positive_int(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a whole number, got {text!r}") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be at least 1, got {value}")
    return value


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


def _language(text: str) -> str:
    from whisper.tokenizer import LANGUAGES, TO_LANGUAGE_CODE

    code = text.lower()
    code = TO_LANGUAGE_CODE.get(code, code)  # "English" -> "en"
    if code not in LANGUAGES:
        raise argparse.ArgumentTypeError(f"unknown language {text!r}; use a code such as en, de, fr")
    return code


def _add_draft_arguments(parser: argparse.ArgumentParser) -> None:
    group = parser.add_argument_group("drafting (draft model, candidate trees)")
    group.add_argument("--draft", default=None, metavar="NAME|PATH",
                       help="a small Whisper that proposes tokens for the main model to verify (instead of "
                            "Medusa heads); its tokenizer may differ (e.g. tiny.en for base)")
    group.add_argument("--draft-tokens", type=_positive_int, default=5, metavar="K",
                       help="draft tokens per step, at most (default: 5)")
    group.add_argument("--adaptive-lookahead", action="store_true",
                       help="grow K after well-accepted steps and shrink it after poor ones, up to --draft-tokens")
    group.add_argument("--tree-width", type=_positive_int, default=1, metavar="W",
                       help="candidate trees: each drafted position offers its W best tokens (default 1: a chain)")
    group.add_argument("--tree-nodes", type=_positive_int, default=None, metavar="N",
                       help="candidates verified per decoder pass in a tree, at most (default: the proposer's)")
    group.add_argument("--lossy-ctc-entropy", type=float, default=None, metavar="NATS",
                       help="LOSSY (a <base>-ctc model only): accept drafted words whose CTC frames all have an "
                            "entropy below NATS without verification; the text may then differ from greedy "
                            "decoding (default: off, every token is verified)")


def _add_compute_type_arguments(parser: argparse.ArgumentParser) -> None:
    from .compute import COMPUTE_TYPES

    parser.add_argument("--compute-type", choices=COMPUTE_TYPES, default="float32",
                        help="float32; int8 (int8 weights, CPU); bfloat16; on CUDA also float16, int8_float16. "
                             "lossless stays lossless: equal to greedy decoding at the same compute type "
                             "(default: float32)")
    parser.add_argument("--draft-compute-type", choices=COMPUTE_TYPES, default=None,
                        help="compute type of the --draft model (default: --compute-type)")


def build_parser() -> argparse.ArgumentParser:
    from . import __version__

    parser = argparse.ArgumentParser(prog=PROG, description="Whisper transcription with Medusa "
                                     "multi-token decoding.")
    parser.add_argument("--version", action="version", version=f"%(prog)s {__version__}")
    commands = parser.add_subparsers(title="commands", dest="command", required=True)

    t = commands.add_parser("transcribe", help="transcribe audio files",
                            description="Transcribe audio files; the text goes to stdout.")
    t.add_argument("audio", nargs="+", metavar="AUDIO", help="audio files (wav, flac, ogg, mp3; "
                   "others through ffmpeg)")
    t.add_argument("--model", default=None, metavar="NAME|PATH",
                   help="model name (see `medusa-whisper models`) or checkpoint path; "
                        "default: medusa_whisper.DEFAULT_MODEL")
    t.add_argument("--mode", choices=MODES, default="lossless",
                   help="lossless: same text as greedy decoding; typical: accept plausible "
                        "candidates too; off: no Medusa heads (default: lossless)")
    t.add_argument("--language", type=_language, default=None, metavar="LANG",
                   help="spoken language, e.g. en (default: detected)")
    t.add_argument("--device", choices=("cpu", "cuda"), default=None,
                   help="default: cuda when available")
    t.add_argument("--output-format", choices=OUTPUT_FORMATS + ("all",), default="txt",
                   help="format of the files written to --output-dir; all: every one (default: txt)")
    t.add_argument("--output-dir", type=Path, default=None, metavar="DIR",
                   help="also write <stem>.<format> here for each file")
    t.add_argument("--threads", type=_positive_int, default=None, metavar="N",
                   help="CPU threads for torch")
    t.add_argument("--num-heads", type=_positive_int, default=None, metavar="K", help="use the first K heads")
    _add_draft_arguments(t)
    _add_compute_type_arguments(t)

    long_form = t.add_argument_group("long audio (whisper.transcribe's options, same defaults)")
    long_form.add_argument("--task", choices=("transcribe", "translate"), default="transcribe")
    long_form.add_argument("--temperature", type=float, default=0.0,
                           help="temperature of the first decode of each window (0: greedy, Medusa)")
    long_form.add_argument("--temperature-increment-on-fallback", type=_optional_float, default=0.2, metavar="T",
                           help="retry a failed window at temperatures this much higher, up to 1.0; none: no retry")
    long_form.add_argument("--compression-ratio-threshold", type=_optional_float, default=2.4, metavar="X")
    long_form.add_argument("--logprob-threshold", type=_optional_float, default=-1.0, metavar="X")
    long_form.add_argument("--no-speech-threshold", type=_optional_float, default=0.6, metavar="X")
    long_form.add_argument("--condition-on-previous-text", type=_bool, default=True, metavar="BOOL",
                           help="prompt each window with the text before it (default: True)")
    long_form.add_argument("--initial-prompt", default=None, metavar="TEXT", help="prompt for the first window")
    long_form.add_argument("--carry-initial-prompt", action="store_true",
                           help="put --initial-prompt before the prompt of every window")
    long_form.add_argument("--clip-timestamps", default="0", metavar="START,END,...",
                           help="only these stretches, in seconds (default: all)")
    long_form.add_argument("--word-timestamps", action="store_true",
                           help="word-level timestamps through whisper's cross-attention alignment")
    long_form.add_argument("--hallucination-silence-threshold", type=_optional_float, default=None, metavar="S",
                           help="with --word-timestamps: skip silences longer than S seconds around "
                                "suspected hallucinations")
    writer = t.add_argument_group("subtitles (srt, vtt), with --word-timestamps")
    writer.add_argument("--highlight-words", action="store_true", help="underline each word as it is spoken")
    writer.add_argument("--max-line-width", type=_positive_int, default=None, metavar="CHARS")
    writer.add_argument("--max-line-count", type=_positive_int, default=None, metavar="LINES")
    writer.add_argument("--max-words-per-line", type=_positive_int, default=None, metavar="WORDS")
    t.set_defaults(run=_transcribe)

    c = commands.add_parser("convert", help="convert weights into a whisper .pt checkpoint",
                            description="Convert a CTranslate2 Whisper directory or an openai-whisper "
                                        ".pt checkpoint into a .pt file that --model accepts.")
    c.add_argument("src", metavar="SRC", help="CTranslate2 model directory or openai-whisper .pt")
    c.add_argument("out", metavar="OUT.pt", help="checkpoint file to write")
    c.set_defaults(run=_convert)

    e = commands.add_parser("eval", help="WER/CER and speed on a labelled CSV",
                            description="Evaluate on a CSV with columns audio, sentence, language (optional "
                                        "regulation-start, regulation-factor): WER and CER after whisper's text "
                                        "normaliser, tokens per decoder step, times.")
    e.add_argument("--data", type=Path, required=True, metavar="CSV")
    e.add_argument("--model", default=None, metavar="NAME|PATH", help="default: medusa_whisper.DEFAULT_MODEL")
    e.add_argument("--mode", choices=MODES, default="lossless")
    e.add_argument("--num-heads", type=_positive_int, default=None, metavar="K", help="use the first K heads")
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
    return parser


def main(argv: Optional[Sequence[str]] = None) -> int:
    parser = build_parser()
    try:
        args = parser.parse_args(argv)
    except SystemExit as e:  # argparse: 0 after --help or --version, 2 for a usage error
        return e.code if isinstance(e.code, int) else 2
    try:
        return args.run(args)
    except MedusaWhisperError as e:
        _error(e)
        return 1
    except KeyboardInterrupt:
        _error("interrupted")
        return 130


# ---------------------------------------------------------------- transcribe


def _transcribe(args: argparse.Namespace) -> int:
    import torch

    import medusa_whisper
    from .audio import check_audio_path

    if args.threads is not None:
        torch.set_num_threads(args.threads)
    if args.device == "cuda" and not torch.cuda.is_available():
        _error("--device cuda: CUDA is not available on this machine")
        return 1
    if args.output_dir is not None:
        clash = _output_clash(args.audio, _formats(args.output_format))
        if clash:
            _error(clash)
            return 2
    if args.hallucination_silence_threshold is not None and not args.word_timestamps:
        _error("--hallucination-silence-threshold needs --word-timestamps")
        return 2
    for flag in ("highlight_words", "max_line_width", "max_line_count", "max_words_per_line"):
        if getattr(args, flag) not in (None, False) and not args.word_timestamps:
            _error(f"--{flag.replace('_', '-')} needs --word-timestamps")
            return 2

    # Files that cannot be opened fail before the model is loaded (which may take a while or
    # need a download); decoding waits for each file's turn, so a long batch is never all in memory.
    paths, failed = [], 0
    for path in args.audio:
        try:
            check_audio_path(path)
            paths.append(path)
        except MedusaWhisperError as e:
            _error(e)
            failed += 1
    if not paths:
        return 1

    if args.output_dir is not None:
        try:
            args.output_dir.mkdir(parents=True, exist_ok=True)
        except OSError as e:
            _error(f"{args.output_dir}: cannot create output folder ({e.strerror or e})")
            return 1
    model = medusa_whisper.load_model(args.model or medusa_whisper.DEFAULT_MODEL, device=args.device,
                                      draft=args.draft, **_compute_types(args))

    show_bars = sys.stderr.isatty()
    files_bar = tqdm(paths, unit="file", file=sys.stderr, disable=len(paths) < 2 or not show_bars)
    for path in files_bar:
        failed += not _transcribe_file(model, path, args, show_path=len(args.audio) > 1, show_bar=show_bars)
    return 1 if failed else 0


def _compute_types(args: argparse.Namespace) -> dict:
    """load_model's compute-type arguments; a type the device cannot run fails before any loading."""
    import torch

    from .compute import check_compute_type

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


def transcribe_options(args: argparse.Namespace) -> dict:
    """model.transcribe's keyword arguments from the command line (whisper's CLI rules)."""
    if args.temperature_increment_on_fallback is not None:
        steps = np.arange(args.temperature, 1.0 + 1e-6, args.temperature_increment_on_fallback)
        temperature = tuple(round(float(t), 6) for t in steps)  # 0.6, not whisper's 0.6000000000000001
    else:
        temperature = (args.temperature,)
    return dict(mode=args.mode, num_heads=args.num_heads, draft_tokens=args.draft_tokens,
                adaptive_lookahead=args.adaptive_lookahead, tree_width=args.tree_width, tree_nodes=args.tree_nodes,
                lossy_ctc_entropy=args.lossy_ctc_entropy,
                language=args.language, task=args.task,
                temperature=temperature, compression_ratio_threshold=args.compression_ratio_threshold,
                logprob_threshold=args.logprob_threshold, no_speech_threshold=args.no_speech_threshold,
                condition_on_previous_text=args.condition_on_previous_text, initial_prompt=args.initial_prompt,
                carry_initial_prompt=args.carry_initial_prompt, clip_timestamps=args.clip_timestamps,
                word_timestamps=args.word_timestamps,
                hallucination_silence_threshold=args.hallucination_silence_threshold)


def _transcribe_file(model, path: str, args: argparse.Namespace, show_path: bool, show_bar: bool) -> bool:
    """Print (and write) one file's transcript; a failure is one error line and False."""

    def file_bar(**kwargs):
        return tqdm(**kwargs, desc=Path(path).name, file=sys.stderr, position=1 if show_path else 0,
                    leave=False, disable=not show_bar)

    try:
        result = model.transcribe(path, progress=file_bar, **transcribe_options(args))
    except MedusaWhisperError as e:
        _error(e)
        return False
    text = result["text"].strip()
    _write(f"{path}: {text}" if show_path else text, sys.stdout)
    if args.output_dir is None:
        return True
    for output_format in _formats(args.output_format):
        out = args.output_dir / (Path(path).stem + "." + output_format)
        try:
            _write_output(out, path, result, output_format, args)
        except OSError as e:
            _error(f"{out}: cannot write ({e.strerror or e})")
            return False
    return True


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
    name = args.model or medusa_whisper.DEFAULT_MODEL
    model = medusa_whisper.load_model(name, device=args.device, draft=args.draft, **_compute_types(args))
    options = evaluation.EvalOptions(mode=args.mode, num_heads=args.num_heads, compare_vanilla=args.compare_vanilla,
                                     draft_tokens=args.draft_tokens, adaptive_lookahead=args.adaptive_lookahead,
                                     tree_width=args.tree_width, tree_nodes=args.tree_nodes,
                                     lossy_ctc_entropy=args.lossy_ctc_entropy)
    report = evaluation.evaluate(model, rows, options, on_problem=_error, progress=sys.stderr.isatty())
    report.problems[:0] = problems
    report.summary["skipped"] = len(report.problems)
    prefix = args.out or args.data.parent / f"eval_{Path(name).name}_{args.mode}"
    csv_path, json_path = evaluation.write_report(report, prefix)
    for line in evaluation.format_summary(report.summary):
        _write(line, sys.stdout)
    _write(f"wrote {csv_path} and {json_path}", sys.stdout)
    return 1 if report.problems else 0


def _formats(output_format: str) -> Tuple[str, ...]:
    return OUTPUT_FORMATS if output_format == "all" else (output_format,)


def _output_clash(paths: List[str], formats: Sequence[str]) -> Optional[str]:
    """Two inputs of one stem would overwrite each other's output file: say so before any work."""
    seen = {}
    for path in paths:
        stem = Path(path).stem
        if stem in seen:
            return f"{seen[stem]} and {path} would both write {stem}.{formats[0]} in --output-dir"
        seen[stem] = path
    return None


def output_record(path: str, result: dict) -> dict:
    """What a file's JSON output holds: whisper's text, language and segments, and Medusa's statistics."""
    stats = result.get("medusa", {})
    record = {"file": str(path), "text": result["text"].strip(), "language": result.get("language"),
              "segments": result.get("segments", [])}
    record.update({k: stats[k] for k in STAT_FIELDS if k in stats})
    return record


def _write_output(out: Path, path: str, result: dict, output_format: str, args: argparse.Namespace) -> None:
    if output_format == "json":
        content = json.dumps(output_record(path, result), indent=2, ensure_ascii=False, default=_to_plain)
        out.write_text(content + "\n", encoding="utf-8")
        return
    from whisper.utils import get_writer

    # whisper's own writers, so that txt, vtt, srt and tsv are exactly what openai-whisper writes
    writer = get_writer(output_format, str(out.parent))
    options = {k: getattr(args, k) for k in ("highlight_words", "max_line_width", "max_line_count",
                                             "max_words_per_line")}
    writer(result, path, options)  # it names the file <stem of path>.<format> in out.parent


def _to_plain(value):
    """numpy and torch scalars or arrays that may sit in whisper's segments, as JSON values."""
    if hasattr(value, "tolist"):
        return value.tolist()
    raise TypeError(f"{type(value).__name__} is not JSON serializable")


# ---------------------------------------------------------------- convert, models


def _convert(args: argparse.Namespace) -> int:
    from .convert import convert

    out = convert(args.src, args.out)
    print(f"wrote {out}")
    return 0


def _models(args: argparse.Namespace) -> int:
    from . import weights

    rows = [[row["name"], row["kind"], _present(row), str(row["source"])] for row in weights.model_table()]
    print(format_table(["NAME", "KIND", "PRESENT", "SOURCE"], rows))
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
