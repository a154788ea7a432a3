"""Accuracy and speed on a labelled set: WER/CER, tokens per step, and the same against vanilla.

The CSV is the reference implementation's: ``audio``, ``sentence``, ``language``, and optionally
``regulation-start`` and ``regulation-factor`` (the exponential length penalty per row). Texts are
normalised as Whisper's papers score them (whisper's English normaliser for English, the basic one
otherwise) and WER/CER are computed by jiwer over the whole set, not averaged per utterance.
Audio paths are relative to the CSV's folder. Rows of up to 30 s are one window (``decode``);
longer ones go through whisper's long-form loop (``transcribe``), greedy without fallback.

With ``compare_vanilla`` every row is also decoded by ``whisper.decode`` greedy on the same weights
(and, for one window, the same encoder output), the two interleaved (alternating which goes first)
so that drift of the machine hits both alike; the report then has both WERs, the share of identical
transcripts and the speedups.
"""

from __future__ import annotations

import csv
import json
import statistics
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Callable, Dict, List, Optional, Sequence, Tuple

import jiwer
import torch
import whisper
from tqdm import tqdm
from whisper.normalizers import BasicTextNormalizer, EnglishTextNormalizer

from .audio.files import SAMPLE_RATE, load_audio
from .options import MedusaDecodingOptions, speculative_options
from .decoding.window import decode as medusa_decode
from .errors import MedusaWhisperError

REQUIRED_COLUMNS = ("audio", "sentence")
WINDOW_SECONDS = 30.0


class EvalDataError(MedusaWhisperError):
    """The evaluation CSV as a whole cannot be used."""


@dataclass(frozen=True)
class EvalRow:
    where: str  # "CSV:LINE" (header = line 1), the prefix of every message about this row
    audio: Path
    sentence: str
    language: Optional[str]  # None: detected by the model
    regulation_start: Optional[int] = None
    regulation_factor: float = MedusaDecodingOptions.regulation_factor


def read_eval_csv(path: Path) -> Tuple[List[EvalRow], List[str]]:
    """Rows that can be evaluated, and one message per row that cannot.

    A missing required column stops everything (EvalDataError); a row with no audio file or an
    empty transcript is reported and skipped, and the other rows go on.
    """
    path = Path(path)
    if not path.is_file():
        raise EvalDataError(f"{path}: no such file")
    try:
        with path.open(newline="", encoding="utf-8-sig") as f:
            reader = csv.DictReader(f)
            columns = reader.fieldnames or []
            raw = list(reader)
    except (UnicodeDecodeError, csv.Error) as e:
        raise EvalDataError(f"{path}: not a readable UTF-8 CSV file ({e})") from e
    for column in REQUIRED_COLUMNS:
        if column not in columns:
            raise EvalDataError(f"{path}: missing column {column!r} (has {', '.join(columns) or 'no header'})")
    rows, problems = [], []
    for line, row in enumerate(raw, start=2):
        where = f"{path}:{line}"
        try:
            rows.append(_parse_row(row, where, path.parent))
        except ValueError as e:
            problems.append(f"{where}: {e}")
    return rows, problems


def _parse_row(row: Dict[str, Optional[str]], where: str, folder: Path) -> EvalRow:
    """One CSV row as an EvalRow; ValueError says what is wrong with it."""
    from whisper.tokenizer import LANGUAGES, TO_LANGUAGE_CODE

    text = (row.get("audio") or "").strip()
    if not text:
        raise ValueError("no audio path")
    audio = Path(text).expanduser()
    audio = audio if audio.is_absolute() else folder / audio  # relative to the CSV, not the working directory
    if not audio.exists():
        raise ValueError(f"{audio}: no such file")
    sentence = (row.get("sentence") or "").strip()
    if not sentence:
        raise ValueError(f"{audio.name}: empty transcript")
    language = (row.get("language") or "").strip().lower() or None
    if language is not None:
        language = TO_LANGUAGE_CODE.get(language, language)  # "english" -> "en"
        if language not in LANGUAGES:
            raise ValueError(f"{audio.name}: unknown language {row['language']!r}")
    start, factor = (row.get("regulation-start") or "").strip(), (row.get("regulation-factor") or "").strip()
    try:
        regulation_start = int(start) if start else None
        regulation_factor = float(factor) if factor else MedusaDecodingOptions.regulation_factor
    except ValueError:
        raise ValueError(f"{audio.name}: regulation-start must be a whole number and regulation-factor a "
                         f"number, got {start!r} and {factor!r}") from None
    return EvalRow(where, audio, sentence, language, regulation_start, regulation_factor)


def normalizer(language: Optional[str]) -> Callable[[str], str]:
    return EnglishTextNormalizer() if language in (None, "en", "english") else BasicTextNormalizer()


@dataclass
class Utterance:
    audio: str
    language: Optional[str]  # the CSV's, or the detected one
    seconds: float
    reference: str
    hypothesis: str
    reference_normalized: str
    hypothesis_normalized: str
    word_errors: int  # substitutions + deletions + insertions, on the normalised texts
    words: int
    char_errors: int
    chars: int
    tokens: int  # sampled tokens, end-of-text included (what the decoder had to produce)
    decoder_steps: int  # decoder forward passes; tokens / decoder_steps is the Medusa gain
    encode_seconds: float
    decode_seconds: float
    vanilla_hypothesis: Optional[str] = None
    vanilla_encode_seconds: Optional[float] = None
    vanilla_decode_seconds: Optional[float] = None
    identical: Optional[bool] = None  # our text == whisper.decode's, character for character


def _errors(reference: str, hypothesis: str) -> Tuple[int, int, int, int]:
    words = jiwer.process_words(reference, hypothesis)
    chars = jiwer.process_characters(reference, hypothesis)
    word_errors = words.substitutions + words.deletions + words.insertions
    char_errors = chars.substitutions + chars.deletions + chars.insertions
    return word_errors, len(reference.split()), char_errors, len(reference)


def corpus_scores(references: Sequence[str], hypotheses: Sequence[str]) -> Dict[str, float]:
    """WER and CER over a set of normalised texts (empty references are left out, as jiwer requires)."""
    pairs = [(r, h) for r, h in zip(references, hypotheses) if r.strip()]
    if not pairs:
        return dict(wer=float("nan"), cer=float("nan"))
    refs, hyps = [r for r, _ in pairs], [h for _, h in pairs]
    return dict(wer=jiwer.wer(refs, hyps), cer=jiwer.cer(refs, hyps))


@dataclass
class EvalOptions:
    # the speculative fields (decoding.SPECULATIVE_OPTIONS) are read from here; the row sets the rest
    decoding: MedusaDecodingOptions = field(default_factory=MedusaDecodingOptions)
    compare_vanilla: bool = False

    @property
    def mode(self) -> str:
        return self.decoding.mode

    def decode_options(self) -> dict:
        """What every decoding of ours gets, beside the row's own options."""
        return speculative_options(self.decoding)


@dataclass
class _Decoded:
    """One system's output for one row."""

    text: str
    language: Optional[str]
    tokens: int
    steps: int
    encode_seconds: float
    decode_seconds: float


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def _timed(fn, device):
    began = time.perf_counter()
    out = fn()
    _sync(device)
    return out, time.perf_counter() - began


def _decode_window(model, row: EvalRow, audio, options: EvalOptions, vanilla_first: bool):
    """Up to 30 s: one encoder pass, then our decoder and (optionally) whisper.decode on its output.

    Sharing the encoder output means the two decoders see exactly the same input, so any
    difference in text is the decoders', and the time ratio is the decoders' alone.
    """
    device, fp16 = model.device, model.device.type == "cuda"
    mel = whisper.log_mel_spectrogram(whisper.pad_or_trim(torch.from_numpy(audio)), model.dims.n_mels).to(device)
    with torch.no_grad():
        features, encode_seconds = _timed(lambda: model.embed_audio((mel.half() if fp16 else mel)[None])[0], device)
    language = row.language if model.is_multilingual else "en"

    draft = getattr(model, "draft_model", None)
    draft_mel = None
    if draft is not None:  # the draft encodes the audio itself, with its own front end (timed as decoding)
        draft_mel = mel if draft.dims.n_mels == model.dims.n_mels else whisper.log_mel_spectrogram(
            whisper.pad_or_trim(torch.from_numpy(audio)), draft.dims.n_mels).to(device)
        draft_mel = draft_mel.half() if fp16 else draft_mel

    def ours() -> _Decoded:
        (r, seconds) = _timed(lambda: medusa_decode(
            model, features, language=language, fp16=fp16, without_timestamps=True, **options.decode_options(),
            regulation_start=row.regulation_start, regulation_factor=row.regulation_factor, draft_mel=draft_mel), device)
        return _Decoded(r.text, r.language, r.tokens_produced, r.decoder_steps, encode_seconds, seconds)

    def vanilla() -> _Decoded:
        options = whisper.DecodingOptions(language=language, fp16=fp16, without_timestamps=True)
        r, seconds = _timed(lambda: whisper.decode(model, features, options), device)
        return _Decoded(r.text, r.language, len(r.tokens) + 1, len(r.tokens) + 1, encode_seconds, seconds)

    return _interleave(ours, vanilla if options.compare_vanilla else None, vanilla_first)


class _VanillaTimingProxy:
    """The model as whisper.transcribe sees it, with each window's encoder and decoder timed apart.

    whisper.decode on a log-Mel runs the encoder inside; running it here first and handing the
    features to whisper.decode changes nothing in the result (whisper.decode accepts either).
    """

    def __init__(self, model):
        self._model, self.encode_seconds, self.decode_seconds, self.tokens = model, 0.0, 0.0, 0

    def __getattr__(self, name):
        return getattr(self._model, name)

    def decode(self, mel, options):
        model, device = self._model, self._model.device
        with torch.no_grad():
            features, seconds = _timed(lambda: model.embed_audio(mel[None])[0], device)
        self.encode_seconds += seconds
        result, seconds = _timed(lambda: whisper.decode(model, features, options), device)
        self.decode_seconds += seconds
        self.tokens += len(result.tokens) + 1
        return result


def _decode_long(model, row: EvalRow, audio, options: EvalOptions, vanilla_first: bool):
    """Over 30 s: whisper's long-form loop (greedy, no temperature fallback), ours in each window."""
    language = row.language if model.is_multilingual else "en"
    fp16 = model.device.type == "cuda"
    common = dict(language=language, fp16=fp16, temperature=0.0, condition_on_previous_text=True)

    def ours() -> _Decoded:
        r = model.transcribe(audio, **options.decode_options(), regulation_start=row.regulation_start,
                             regulation_factor=row.regulation_factor, **common)
        stats = r["medusa"]
        return _Decoded(r["text"], r.get("language"), stats["tokens"], stats["decoder_steps"],
                        stats["encode_seconds"], stats["decode_seconds"])

    def vanilla() -> _Decoded:
        proxy = _VanillaTimingProxy(model)
        r = whisper.transcribe(proxy, audio, **common)
        return _Decoded(r["text"], r.get("language"), proxy.tokens, proxy.tokens, proxy.encode_seconds,
                        proxy.decode_seconds)

    return _interleave(ours, vanilla if options.compare_vanilla else None, vanilla_first)


def _interleave(ours, vanilla, vanilla_first: bool) -> Tuple[_Decoded, Optional[_Decoded]]:
    """Run both, alternating which goes first from row to row, so that neither always runs on a
    warmer cache or a quieter machine."""
    theirs = vanilla() if vanilla is not None and vanilla_first else None
    mine = ours()
    if vanilla is not None and not vanilla_first:
        theirs = vanilla()
    return mine, theirs


def decode_row(model, row: EvalRow, audio, options: EvalOptions, vanilla_first: bool = False):
    """(ours, vanilla or None) for one row's audio (a float32 array at 16 kHz)."""
    if len(audio) > WINDOW_SECONDS * SAMPLE_RATE:
        return _decode_long(model, row, audio, options, vanilla_first)
    return _decode_window(model, row, audio, options, vanilla_first)


@dataclass
class EvalReport:
    utterances: List[Utterance] = field(default_factory=list)
    problems: List[str] = field(default_factory=list)
    summary: Dict = field(default_factory=dict)


def _load(row: EvalRow, report: EvalReport, on_problem: Callable[[str], None]):
    try:
        return load_audio(row.audio)
    except MedusaWhisperError as e:
        message = f"{row.where}: {e}"
        report.problems.append(message)
        on_problem(message)
        return None


def evaluate(model, rows: Sequence[EvalRow], options: EvalOptions = EvalOptions(),
             on_problem: Callable[[str], None] = lambda m: None, progress: bool = True) -> EvalReport:
    """Decode every row; a row whose audio cannot be read is a problem, and the others go on."""
    report = EvalReport()
    warmed = False
    for i, row in enumerate(tqdm(rows, desc="eval", unit="file", disable=not progress)):
        audio = _load(row, report, on_problem)
        if audio is None:
            continue
        if not warmed:  # not counted: the first decode pays for allocations and dispatch caches
            decode_row(model, row, audio[: SAMPLE_RATE * 2], options)
            warmed = True
        mine, theirs = decode_row(model, row, audio, options, vanilla_first=i % 2 == 1)
        report.utterances.append(_utterance(row, audio, mine, theirs))
    report.summary = summarize(report.utterances, options)
    report.summary["skipped"] = len(report.problems)
    return report


def _utterance(row: EvalRow, audio, mine: _Decoded, theirs: Optional[_Decoded]) -> Utterance:
    language = row.language or mine.language
    norm = normalizer(language)
    text = mine.text.strip()
    ref_n, hyp_n = norm(row.sentence), norm(text)
    # a reference that normalises to nothing (only a filler word, say) cannot be scored by word
    word_errors, words, char_errors, chars = _errors(ref_n, hyp_n) if ref_n.strip() else (0, 0, 0, 0)
    vanilla_text = theirs.text.strip() if theirs is not None else None
    return Utterance(
        audio=str(row.audio), language=language, seconds=round(len(audio) / SAMPLE_RATE, 3),
        reference=row.sentence, hypothesis=text, reference_normalized=ref_n, hypothesis_normalized=hyp_n,
        word_errors=word_errors, words=words, char_errors=char_errors, chars=chars, tokens=mine.tokens,
        decoder_steps=mine.steps, encode_seconds=round(mine.encode_seconds, 4),
        decode_seconds=round(mine.decode_seconds, 4), vanilla_hypothesis=vanilla_text,
        vanilla_encode_seconds=round(theirs.encode_seconds, 4) if theirs is not None else None,
        vanilla_decode_seconds=round(theirs.decode_seconds, 4) if theirs is not None else None,
        identical=(text == vanilla_text) if theirs is not None else None,
    )


def summarize(utterances: Sequence[Utterance], options: EvalOptions) -> Dict:
    """Corpus WER/CER, tokens per step, times; with the comparison, vanilla's and the speedups.

    A speedup is vanilla time / our time over the whole set (decoder only, and encoder plus
    decoder); the per-file median and range show how much it varies from file to file.
    """
    if not utterances:
        return dict(utterances=0)
    scores = corpus_scores([u.reference_normalized for u in utterances], [u.hypothesis_normalized for u in utterances])
    tokens, steps = sum(u.tokens for u in utterances), sum(u.decoder_steps for u in utterances)
    out = dict(utterances=len(utterances), mode=options.mode, wer=scores["wer"], cer=scores["cer"],
               tokens=tokens, decoder_steps=steps, tokens_per_step=tokens / steps if steps else 0.0,
               audio_seconds=round(sum(u.seconds for u in utterances), 2),
               encode_seconds=round(sum(u.encode_seconds for u in utterances), 3),
               decode_seconds=round(sum(u.decode_seconds for u in utterances), 3))
    compared = [u for u in utterances if u.vanilla_hypothesis is not None]
    if not compared:
        return out
    vanilla = corpus_scores([u.reference_normalized for u in compared],
                            [normalizer(u.language)(u.vanilla_hypothesis) for u in compared])
    ours_dec = sum(u.decode_seconds for u in compared)
    theirs_dec = sum(u.vanilla_decode_seconds for u in compared)
    ours_e2e = sum(u.encode_seconds + u.decode_seconds for u in compared)
    theirs_e2e = sum(u.vanilla_encode_seconds + u.vanilla_decode_seconds for u in compared)
    per_file = sorted(u.vanilla_decode_seconds / u.decode_seconds for u in compared if u.decode_seconds > 0)
    out.update(vanilla_wer=vanilla["wer"], vanilla_cer=vanilla["cer"],
               identical_share=sum(bool(u.identical) for u in compared) / len(compared),
               vanilla_decode_seconds=round(theirs_dec, 3),
               decoder_speedup=theirs_dec / ours_dec if ours_dec > 0 else float("nan"),
               decoder_speedup_per_file_median=statistics.median(per_file) if per_file else float("nan"),
               decoder_speedup_per_file_range=[per_file[0], per_file[-1]] if per_file else None,
               e2e_speedup=theirs_e2e / ours_e2e if ours_e2e > 0 else float("nan"))
    return out


def write_report(report: EvalReport, prefix: Path) -> Tuple[Path, Path]:
    """PREFIX.csv (one row per utterance) and PREFIX.json (summary, problems, utterances)."""
    prefix = Path(prefix)
    if prefix.suffix in (".csv", ".json"):  # "--out results.csv" means the prefix "results"
        prefix = prefix.with_suffix("")
    prefix.parent.mkdir(parents=True, exist_ok=True)
    # not with_suffix: a prefix such as "eval_tiny.en" has a dot that is not a suffix
    csv_path, json_path = prefix.parent / (prefix.name + ".csv"), prefix.parent / (prefix.name + ".json")
    names = [f.name for f in Utterance.__dataclass_fields__.values()]
    with csv_path.open("w", newline="", encoding="utf-8") as f:
        writer = csv.DictWriter(f, fieldnames=names)
        writer.writeheader()
        for u in report.utterances:
            writer.writerow(asdict(u))
    json_path.write_text(json.dumps(dict(summary=report.summary, problems=report.problems,
                                         utterances=[asdict(u) for u in report.utterances]), indent=1))
    return csv_path, json_path


def format_summary(summary: Dict) -> List[str]:
    """The lines `medusa-whisper eval` prints."""
    if not summary.get("utterances"):
        return ["no utterance could be evaluated"]
    lines = [f"{summary['utterances']} utterances ({summary['audio_seconds']:.0f} s of audio), mode {summary['mode']}: "
             f"WER {summary['wer']:.2%}, CER {summary['cer']:.2%}, {summary['tokens_per_step']:.2f} tokens per decoder "
             f"step, decoder {summary['decode_seconds']:.2f} s, encoder {summary['encode_seconds']:.2f} s"]
    if "vanilla_wer" in summary:
        spread = summary["decoder_speedup_per_file_range"] or [float("nan")] * 2
        lines.append(f"whisper.decode greedy on the same weights: WER {summary['vanilla_wer']:.2%}, "
                     f"CER {summary['vanilla_cer']:.2%}, decoder {summary['vanilla_decode_seconds']:.2f} s; "
                     f"identical transcripts {summary['identical_share']:.0%}; speedup over it: decoder "
                     f"{summary['decoder_speedup']:.2f}x (per file median {summary['decoder_speedup_per_file_median']:.2f}x, "
                     f"range {spread[0]:.2f}-{spread[1]:.2f}x), encoder + decoder {summary['e2e_speedup']:.2f}x")
    if summary.get("skipped"):
        lines.append(f"{summary['skipped']} rows skipped (see the messages above)")
    return lines
