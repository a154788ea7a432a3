"""Accuracy and speed on a labelled set: WER/CER, tokens per step, and the same against vanilla.

The CSV is the reference implementation's: ``audio``, ``sentence``, ``language``, and optionally
``regulation-start`` and ``regulation-factor`` (the exponential length penalty per row). Texts are
normalised as Whisper's papers score them (whisper's English normaliser for English, the basic one
otherwise) and WER/CER are computed by jiwer over the whole set, not averaged per utterance.

With ``compare_vanilla`` every row is also decoded by ``whisper.decode`` greedy on the same weights
and the same encoder output, the two interleaved (alternating which goes first) so that drift of
the machine hits both alike; the report then has both WERs, the share of identical transcripts and
the decoder-time ratio.
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

from .audio import SAMPLE_RATE, load_audio
from .decoding import decode as medusa_decode
from .errors import MedusaWhisperError

REQUIRED_COLUMNS = ("audio", "sentence")
WINDOW_SECONDS = 30.0


class EvalDataError(MedusaWhisperError):
    """The evaluation CSV as a whole cannot be used."""


@dataclass(frozen=True)
class EvalRow:
    line: int  # line in the CSV (header = 1), for messages
    audio: Path
    sentence: str
    language: Optional[str]
    regulation_start: Optional[int] = None
    regulation_factor: float = 1.0


def read_eval_csv(path: Path) -> Tuple[List[EvalRow], List[str]]:
    """Rows that can be evaluated, and one message per row that cannot.

    A missing required column stops everything (EvalDataError); a row with no audio file or an
    empty transcript is reported and skipped, and the other rows go on.
    """
    path = Path(path)
    if not path.is_file():
        raise EvalDataError(f"{path}: no such file")
    with path.open(newline="", encoding="utf-8-sig") as f:
        reader = csv.DictReader(f)
        columns = reader.fieldnames or []
        for column in REQUIRED_COLUMNS:
            if column not in columns:
                raise EvalDataError(f"{path}: missing column {column!r} (has {', '.join(columns) or 'no header'})")
        raw = list(reader)
    rows, problems = [], []
    for line, row in enumerate(raw, start=2):
        where = f"{path}:{line}"
        audio = Path((row.get("audio") or "").strip())
        sentence = (row.get("sentence") or "").strip()
        if not str(audio) or str(audio) == ".":
            problems.append(f"{where}: no audio path")
            continue
        audio = audio if audio.is_absolute() else path.parent / audio
        if not audio.is_file():
            problems.append(f"{where}: {audio}: no such file")
            continue
        if not sentence:
            problems.append(f"{where}: {audio.name}: empty transcript")
            continue
        try:
            start = row.get("regulation-start")
            factor = row.get("regulation-factor")
            rows.append(EvalRow(line, audio, sentence, (row.get("language") or "").strip() or None,
                                int(start) if start not in (None, "") else None,
                                float(factor) if factor not in (None, "") else 1.0))
        except ValueError as e:
            problems.append(f"{where}: bad regulation value ({e})")
    return rows, problems


def normalizer(language: Optional[str]) -> Callable[[str], str]:
    return EnglishTextNormalizer() if language in (None, "en", "english") else BasicTextNormalizer()


@dataclass
class Utterance:
    audio: str
    language: Optional[str]
    seconds: float
    reference: str
    hypothesis: str
    reference_normalized: str
    hypothesis_normalized: str
    word_errors: int
    words: int
    char_errors: int
    chars: int
    tokens: int
    decoder_steps: int
    encode_seconds: float
    decode_seconds: float
    vanilla_hypothesis: Optional[str] = None
    vanilla_decode_seconds: Optional[float] = None
    identical: Optional[bool] = None


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


def _sync(device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


@dataclass
class EvalOptions:
    mode: str = "lossless"
    num_heads: Optional[int] = None
    compare_vanilla: bool = False


def _decode_row(model, row: EvalRow, audio, options: EvalOptions, vanilla_first: bool):
    """Our transcript and timings (and vanilla's), for one row."""
    device = model.device
    language = row.language if model.is_multilingual else "en"
    fp16 = device.type == "cuda"
    if len(audio) > WINDOW_SECONDS * SAMPLE_RATE:  # long-form: whisper's windowing, ours inside
        return _decode_long(model, audio, row, language, options, vanilla_first, fp16)

    mel = whisper.log_mel_spectrogram(whisper.pad_or_trim(torch.from_numpy(audio)), model.dims.n_mels).to(device)
    began = time.perf_counter()
    with torch.no_grad():
        features = model.embed_audio((mel.half() if fp16 else mel)[None])[0]
    _sync(device)
    encode_seconds = time.perf_counter() - began

    def ours():
        r = medusa_decode(model, features, language=language, fp16=fp16, mode=options.mode, num_heads=options.num_heads,
                          regulation_start=row.regulation_start, regulation_factor=row.regulation_factor,
                          without_timestamps=True)
        return r.text, r.tokens_produced, r.decoder_steps

    def vanilla():
        return whisper.decode(model, features, whisper.DecodingOptions(language=language, fp16=fp16,
                                                                       without_timestamps=True)).text

    return _interleave(ours, vanilla, options.compare_vanilla, vanilla_first, device, encode_seconds)


def _decode_long(model, audio, row, language, options, vanilla_first, fp16):
    def ours():
        r = model.transcribe(audio, language=language, fp16=fp16, mode=options.mode, num_heads=options.num_heads,
                             temperature=0.0, condition_on_previous_text=True)
        stats = r["medusa"]
        return r["text"], stats["tokens"], stats["decoder_steps"]

    def vanilla():
        return whisper.transcribe(model, audio, language=language, fp16=fp16, temperature=0.0)["text"]

    return _interleave(ours, vanilla, options.compare_vanilla, vanilla_first, model.device, 0.0)


def _interleave(ours, vanilla, compare: bool, vanilla_first: bool, device, encode_seconds: float):
    def timed(fn):
        began = time.perf_counter()
        out = fn()
        _sync(device)
        return out, time.perf_counter() - began

    v_text = v_seconds = None
    if compare and vanilla_first:
        v_text, v_seconds = timed(vanilla)
    (text, tokens, steps), seconds = timed(ours)
    if compare and not vanilla_first:
        v_text, v_seconds = timed(vanilla)
    return dict(text=text.strip(), tokens=tokens, steps=steps, encode_seconds=encode_seconds, decode_seconds=seconds,
                vanilla_text=v_text.strip() if v_text is not None else None, vanilla_seconds=v_seconds)


@dataclass
class EvalReport:
    utterances: List[Utterance] = field(default_factory=list)
    problems: List[str] = field(default_factory=list)
    summary: Dict = field(default_factory=dict)


def evaluate(model, rows: Sequence[EvalRow], options: EvalOptions = EvalOptions(),
             on_problem: Callable[[str], None] = lambda m: None, progress: bool = True) -> EvalReport:
    """Decode every row; an audio file that cannot be read is a problem, the rest go on."""
    report = EvalReport()
    if rows:  # warm-up, not counted: the first call pays for allocations and dispatch caches
        _decode_row(model, rows[0], load_audio(rows[0].audio)[: SAMPLE_RATE * 2], options, False)
    for i, row in enumerate(tqdm(rows, desc="eval", unit="file", disable=not progress)):
        try:
            audio = load_audio(row.audio)
        except MedusaWhisperError as e:
            report.problems.append(str(e))
            on_problem(str(e))
            continue
        out = _decode_row(model, row, audio, options, vanilla_first=i % 2 == 1)
        norm = normalizer(row.language)
        ref_n, hyp_n = norm(row.sentence), norm(out["text"])
        word_errors, words, char_errors, chars = _errors(ref_n, hyp_n) if ref_n.strip() else (0, 0, 0, 0)
        report.utterances.append(Utterance(
            audio=str(row.audio), language=row.language, seconds=round(len(audio) / SAMPLE_RATE, 3),
            reference=row.sentence, hypothesis=out["text"], reference_normalized=ref_n, hypothesis_normalized=hyp_n,
            word_errors=word_errors, words=words, char_errors=char_errors, chars=chars, tokens=out["tokens"],
            decoder_steps=out["steps"], encode_seconds=round(out["encode_seconds"], 4),
            decode_seconds=round(out["decode_seconds"], 4), vanilla_hypothesis=out["vanilla_text"],
            vanilla_decode_seconds=round(out["vanilla_seconds"], 4) if out["vanilla_seconds"] is not None else None,
            identical=(out["text"] == out["vanilla_text"]) if out["vanilla_text"] is not None else None,
        ))
    report.summary = summarize(report.utterances, options)
    report.summary["skipped"] = len(report.problems)
    return report


def summarize(utterances: Sequence[Utterance], options: EvalOptions) -> Dict:
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
    if compared:
        norm = [normalizer(u.language)(u.vanilla_hypothesis) for u in compared]
        vanilla = corpus_scores([u.reference_normalized for u in compared], norm)
        ratios = sorted(u.decode_seconds / u.vanilla_decode_seconds for u in compared if u.vanilla_decode_seconds)
        out.update(vanilla_wer=vanilla["wer"], vanilla_cer=vanilla["cer"],
                   identical_share=sum(bool(u.identical) for u in compared) / len(compared),
                   vanilla_decode_seconds=round(sum(u.vanilla_decode_seconds for u in compared), 3),
                   decoder_time_ratio=sum(u.decode_seconds for u in compared) / sum(u.vanilla_decode_seconds
                                                                                     for u in compared),
                   decoder_time_ratio_median=statistics.median(ratios),
                   decoder_time_ratio_range=[ratios[0], ratios[-1]])
    return out


def write_report(report: EvalReport, prefix: Path) -> Tuple[Path, Path]:
    """PREFIX.csv (one row per utterance) and PREFIX.json (summary, problems, utterances)."""
    prefix = Path(prefix)
    prefix.parent.mkdir(parents=True, exist_ok=True)
    csv_path, json_path = prefix.with_suffix(".csv"), prefix.with_suffix(".json")
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
    if not summary.get("utterances"):
        return ["no utterance could be evaluated"]
    lines = [f"{summary['utterances']} utterances ({summary['audio_seconds']:.0f} s of audio), mode {summary['mode']}: "
             f"WER {summary['wer']:.2%}, CER {summary['cer']:.2%}, {summary['tokens_per_step']:.2f} tokens per decoder "
             f"step, decoder {summary['decode_seconds']:.2f} s, encoder {summary['encode_seconds']:.2f} s"]
    if "vanilla_wer" in summary:
        lines.append(f"whisper.decode greedy: WER {summary['vanilla_wer']:.2%}, CER {summary['vanilla_cer']:.2%}, "
                     f"decoder {summary['vanilla_decode_seconds']:.2f} s; identical transcripts "
                     f"{summary['identical_share']:.0%}; decoder-time ratio ours/vanilla "
                     f"{summary['decoder_time_ratio']:.3f} (per file median {summary['decoder_time_ratio_median']:.3f}, "
                     f"range {summary['decoder_time_ratio_range'][0]:.3f}-{summary['decoder_time_ratio_range'][1]:.3f})")
    if summary.get("skipped"):
        lines.append(f"{summary['skipped']} rows skipped (see the messages above)")
    return lines
