"""``model.transcribe``: audio of any length, with Medusa decoding in every 30-s window.

The algorithm is openai-whisper's long-form transcription (``whisper.transcribe``), with the same
options and the same results: windows advanced by the decoded timestamps, temperature fallback on
compression ratio and average log-probability, no-speech skipping, the previous text as prompt,
word timestamps through whisper's own alignment, and the hallucination-silence skip. Tests check
that in lossless mode segments, text and timestamps equal whisper.transcribe's.

Where it departs from whisper.transcribe, and why:
- the spectrogram is computed a window at a time (``LogMelFrames``) from audio decoded block by block
  (``open_audio``), so memory stays flat however long the file is;
- each window is decoded by ``medusa_whisper.decode`` (greedy windows with the heads; sampled
  fallback windows with whisper's DecodingTask on the package's step, candidates.py), and a window
  that falls back is encoded once, not once per temperature;
- the nested loop over clips and windows is written out (whisper flattens it), and the progress
  bar counts seconds of audio instead of frames;
- the result has a ``medusa`` entry: tokens, decoder steps, tokens per step, fallback windows, times.
"""

from __future__ import annotations

import contextlib
import warnings
from dataclasses import dataclass, fields
from pathlib import Path
from typing import Callable, Generator, Iterator, List, Optional, Sequence, Tuple, Union

import torch
import tqdm
from whisper.audio import FRAMES_PER_SECOND, HOP_LENGTH, N_FRAMES, SAMPLE_RATE, pad_or_trim
from whisper.decoding import DecodingOptions
from whisper.timing import add_word_timestamps
from whisper.tokenizer import LANGUAGES, Tokenizer, get_tokenizer
from whisper.utils import format_timestamp, get_end, make_safe

from ..audio.files import AudioInput, load_audio, open_audio
from ..decoding.window import MedusaDecodingResult, decode
from ..options import MedusaDecodingOptions, as_medusa_options
from ..audio.mel import LogMelFrames

# options that exist in MedusaDecodingOptions but not in whisper's DecodingOptions
MEDUSA_ONLY_OPTIONS = {f.name for f in fields(MedusaDecodingOptions)} - {f.name for f in fields(DecodingOptions)}
DEFAULT_TEMPERATURES = (0.0, 0.2, 0.4, 0.6, 0.8, 1.0)
PREPEND_PUNCTUATIONS = "\"'“¿([{-"
APPEND_PUNCTUATIONS = "\"'.。,，!！?？:：”)]}、"
# words made only of these do not count in the hallucination score (whisper's list)
PUNCTUATION = "\"'“¿([{-\"'.。,，!！?？:：”)]}、"


@dataclass
class TranscriptionStats:
    windows: int = 0
    fallback_windows: int = 0
    tokens: int = 0
    decoder_steps: int = 0
    encode_seconds: float = 0.0
    decode_seconds: float = 0.0
    draft_proposed: int = 0
    draft_accepted: int = 0
    draft_seconds: float = 0.0

    def add(self, result: MedusaDecodingResult) -> None:
        self.tokens += result.tokens_produced
        self.decoder_steps += result.decoder_steps
        self.encode_seconds += result.encode_seconds
        self.decode_seconds += result.decode_seconds
        self.draft_proposed += result.draft_proposed
        self.draft_accepted += result.draft_accepted
        self.draft_seconds += result.draft_seconds

    def as_dict(self) -> dict:
        steps = self.decoder_steps
        stats = dict(windows=self.windows, fallback_windows=self.fallback_windows, tokens=self.tokens,
                     decoder_steps=steps, tokens_per_step=self.tokens / steps if steps else 0.0,
                     encode_seconds=self.encode_seconds, decode_seconds=self.decode_seconds)
        if self.draft_proposed:
            stats.update(draft_proposed=self.draft_proposed, draft_accepted=self.draft_accepted,
                         draft_acceptance=self.draft_accepted / self.draft_proposed, draft_seconds=self.draft_seconds)
        return stats


@dataclass
class _Thresholds:
    compression_ratio: Optional[float]
    logprob: Optional[float]
    no_speech: Optional[float]

    def needs_fallback(self, result) -> bool:
        too_repetitive = self.compression_ratio is not None and result.compression_ratio > self.compression_ratio
        too_improbable = self.logprob is not None and result.avg_logprob < self.logprob
        if too_improbable and self.no_speech is not None and result.no_speech_prob > self.no_speech:
            return False  # silence: whisper accepts it whatever the compression ratio
        return too_repetitive or too_improbable

    def is_silence(self, result) -> bool:
        if self.no_speech is None or result.no_speech_prob <= self.no_speech:
            return False
        # a confident transcript is kept whatever the no-speech probability says
        return not (self.logprob is not None and result.avg_logprob > self.logprob)


@dataclass
class WindowRequest:
    """One window to decode, as a transcription asks for it: ``decode(model, mel, options, draft_mel=...)``."""

    mel: torch.Tensor
    options: MedusaDecodingOptions
    draft_mel: Optional[torch.Tensor] = None


# A transcription in progress: yields the windows it needs decoded, is sent each one's result, and
# returns whisper's result dict. ``transcribe`` decodes its windows one by one; ``transcribe_many``
# decodes the windows of several files side by side (decoding/batches.py).
Transcription = Generator[WindowRequest, MedusaDecodingResult, dict]


def _decode_with_fallback(mel_segment: torch.Tensor, decode_options: dict, medusa_options: dict,
                          temperatures: Sequence[float], thresholds: _Thresholds, stats: TranscriptionStats,
                          draft_mel: Optional[torch.Tensor]) -> Generator[WindowRequest, MedusaDecodingResult,
                                                                          MedusaDecodingResult]:
    """Decode at each temperature in turn until the result passes the thresholds (whisper's rule).

    Departs from whisper, which encodes the window again at every temperature: after the first
    decoding, the window's encoder output is passed instead of its log-Mel (``decode`` then skips
    the encoder), the same numbers without another encoder pass."""
    result = None
    for i, t in enumerate(temperatures):
        if result is not None and result.audio_features is not None:
            mel_segment = result.audio_features
        kwargs = dict(decode_options)
        if t > 0:
            kwargs.pop("beam_size", None)  # sampling: no beam search
            kwargs.pop("patience", None)
        else:
            kwargs.pop("best_of", None)
        options = as_medusa_options(DecodingOptions(**kwargs, temperature=t), **medusa_options)
        result = yield WindowRequest(mel_segment, options, draft_mel)
        stats.add(result)
        stats.fallback_windows += i == 1
        if not thresholds.needs_fallback(result):
            break
    return result


def _new_segment(seek: int, start: float, end: float, tokens: List[int], result, tokenizer: Tokenizer) -> dict:
    return {
        "seek": seek,
        "start": start,
        "end": end,
        "text": tokenizer.decode([t for t in tokens if t < tokenizer.eot]),
        "tokens": tokens,
        "temperature": result.temperature,
        "avg_logprob": result.avg_logprob,
        "compression_ratio": result.compression_ratio,
        "no_speech_prob": result.no_speech_prob,
    }


def _split_at_timestamps(result, tokenizer: Tokenizer, seek: int, segment_size: int,
                         time_precision: float, input_stride: int) -> Tuple[List[dict], int, bool]:
    """The window's segments, where the next window starts, and whether it ended on one timestamp.

    Two timestamps in a row close a segment. An unfinished last segment is dropped and decoded
    again in the next window, which starts at its opening timestamp.
    """
    tokens = list(result.tokens)
    time_offset = seek * HOP_LENGTH / SAMPLE_RATE
    is_stamp = [t >= tokenizer.timestamp_begin for t in tokens]
    single_timestamp_ending = is_stamp[-2:] == [False, True]
    cuts = [i + 1 for i in range(len(tokens) - 1) if is_stamp[i] and is_stamp[i + 1]]

    if not cuts:
        # no complete segment: the whole window is one, ending at its last timestamp if any
        duration = segment_size * HOP_LENGTH / SAMPLE_RATE
        stamps = [t for t, s in zip(tokens, is_stamp) if s]
        if stamps and stamps[-1] != tokenizer.timestamp_begin:
            duration = (stamps[-1] - tokenizer.timestamp_begin) * time_precision
        return ([_new_segment(seek, time_offset, time_offset + duration, tokens, result, tokenizer)],
                seek + segment_size, single_timestamp_ending)

    if single_timestamp_ending:
        cuts.append(len(tokens))
    segments, last = [], 0
    for cut in cuts:
        piece = tokens[last:cut]
        start = time_offset + (piece[0] - tokenizer.timestamp_begin) * time_precision
        end = time_offset + (piece[-1] - tokenizer.timestamp_begin) * time_precision
        segments.append(_new_segment(seek, start, end, piece, result, tokenizer))
        last = cut
    if single_timestamp_ending:
        next_seek = seek + segment_size  # nothing is said after the last timestamp
    else:
        next_seek = seek + (tokens[last - 1] - tokenizer.timestamp_begin) * input_stride
    return segments, next_seek, single_timestamp_ending


def _word_anomaly_score(word: dict) -> float:
    """How unlike a real word it is: improbable, too short or too long."""
    score = 0.0
    if word.get("probability", 0.0) < 0.15:
        score += 1.0
    duration = word["end"] - word["start"]
    if duration < 0.133:
        score += (0.133 - duration) * 15
    if duration > 2.0:
        score += duration - 2.0
    return score


def _is_anomaly(segment: Optional[dict]) -> bool:
    if segment is None or not segment["words"]:
        return False
    words = [w for w in segment["words"] if w["word"] not in PUNCTUATION][:8]
    score = sum(_word_anomaly_score(w) for w in words)
    return score >= 3 or score + 0.01 >= len(words)


def _first_with_words(segments: Sequence[dict]) -> Optional[dict]:
    return next((s for s in segments if s["words"]), None)


@dataclass
class _Window:
    seek: int  # first frame
    size: int  # frames of audio in it (the rest is padding)

    @property
    def start_time(self) -> float:
        return self.seek * HOP_LENGTH / SAMPLE_RATE

    @property
    def end_time(self) -> float:  # of the full 30 s, as whisper counts it
        return (self.seek + N_FRAMES) * HOP_LENGTH / SAMPLE_RATE

    @property
    def duration(self) -> float:
        return self.size * HOP_LENGTH / SAMPLE_RATE


def _skip_hallucinations(segments: List[dict], window: _Window, next_seek: int, single_timestamp_ending: bool,
                         threshold: float, last_speech_timestamp: float,
                         content_duration: float, content_frames: int) -> Tuple[int, bool]:
    """whisper's ``hallucination_silence_threshold``: skip long silences next to suspect segments.

    Truncates ``segments`` in place; returns the next seek and whether the window is dropped whole.
    """
    if not single_timestamp_ending:
        last_word_end = get_end(segments)
        if last_word_end is not None and last_word_end > window.start_time:
            if window.end_time - last_word_end > threshold:
                next_seek = round(last_word_end * FRAMES_PER_SECOND)
            else:
                next_seek = window.seek + window.size

    # a suspect first segment after a long gap: decode again from where it starts
    first = _first_with_words(segments)
    if first is not None and _is_anomaly(first):
        gap = first["start"] - window.start_time
        if gap > threshold:
            return window.seek + round(gap * FRAMES_PER_SECOND), True

    # a suspect segment with silence (or more suspects) on both sides: drop it and what follows
    previous_end = last_speech_timestamp
    for i, segment in enumerate(segments):
        if not segment["words"]:
            continue
        if _is_anomaly(segment):
            following = _first_with_words(segments[i + 1 :])
            next_start = following["words"][0]["start"] if following is not None else window.start_time + window.duration
            silence_before = (segment["start"] - previous_end > threshold or segment["start"] < threshold
                              or segment["start"] - window.start_time < 2.0)
            silence_after = (next_start - segment["end"] > threshold or _is_anomaly(following)
                             or window.end_time - segment["end"] < 2.0)
            if silence_before and silence_after:
                next_seek = round(max(window.start_time + 1, segment["start"]) * FRAMES_PER_SECOND)
                if content_duration - segment["end"] < threshold:
                    next_seek = content_frames
                del segments[i:]
                break
        previous_end = segment["end"]
    return next_seek, False


def _clips(clip_timestamps: Union[str, List[float]], content_frames: int) -> List[Tuple[int, int]]:
    """(start, end) frame pairs to transcribe; an odd last start runs to the end of the audio."""
    if isinstance(clip_timestamps, str):
        clip_timestamps = [float(t) for t in clip_timestamps.split(",")] if clip_timestamps else []
    points = [round(t * FRAMES_PER_SECOND) for t in clip_timestamps] or [0]
    if len(points) % 2:
        points.append(content_frames)
    return list(zip(points[::2], points[1::2]))


def transcribe(
    model,
    audio: Union[AudioInput, Path],
    *,
    verbose: Optional[bool] = None,
    temperature: Union[float, Tuple[float, ...]] = DEFAULT_TEMPERATURES,
    compression_ratio_threshold: Optional[float] = 2.4,
    logprob_threshold: Optional[float] = -1.0,
    no_speech_threshold: Optional[float] = 0.6,
    condition_on_previous_text: bool = True,
    initial_prompt: Optional[str] = None,
    carry_initial_prompt: bool = False,
    word_timestamps: bool = False,
    prepend_punctuations: str = PREPEND_PUNCTUATIONS,
    append_punctuations: str = APPEND_PUNCTUATIONS,
    clip_timestamps: Union[str, List[float]] = "0",
    hallucination_silence_threshold: Optional[float] = None,
    progress: Optional[Callable[..., tqdm.tqdm]] = None,
    batch_size: Optional[int] = None,
    vad_chunks: bool = False,
    vad_filter: bool = False,
    **decode_options,
) -> Union[dict, List[Optional[dict]]]:
    """Transcribe audio of any length, as ``whisper.transcribe`` does, with Medusa decoding.

    audio    : a path (decoded block by block; memory stays flat), or samples at 16 kHz; or a list of
               them, transcribed side by side (``transcribe_many``; a list of results in input order)
    options  : whisper.transcribe's, with the same meaning and defaults; ``decode_options`` may also
               hold MedusaDecodingOptions' own fields (``mode``, ``num_heads``, ...)
    progress : makes the progress bar, called like ``tqdm.tqdm(total=..., unit="s")``; by default
               a bar is shown when ``verbose`` is False, as whisper does
    batch_size : for a list, how many recordings' windows share a decoder pass; with ``vad_chunks``, how
               many chunks (default for both: the size measured cheapest per token on this machine,
               ``batches.default_batch_size``)
    vad_chunks : cut the speech into chunks of at most 30 s (Silero VAD) and decode them side by side,
               each without the previous text (chunked.py): faster, but not whisper's text
    vad_filter : cut out the silences of 2 s or more (Silero VAD) and transcribe the rest window after
               window (vad_filter.py), as faster-whisper's ``vad_filter``; times stay the recording's
    returns  : whisper's dict (``text``, ``segments``, ``language``) plus ``medusa`` statistics
    """
    if vad_chunks:
        if isinstance(audio, (list, tuple)):
            raise ValueError("vad_chunks takes one recording, not a list")
        if vad_filter:
            raise ValueError("vad_chunks already leaves the silences out: give vad_chunks or vad_filter, not both")
        options = {k: v for k, v in locals().items()
                   if k not in ("model", "audio", "batch_size", "decode_options", "vad_chunks", "vad_filter", "verbose",
                                "progress")}
        if batch_size is None:  # the width a job of windows side by side measured cheapest per token here
            from ..decoding.batches import default_batch_size
            batch_size = default_batch_size(model)
        return _transcribe_chunked(model, audio, batch_size, verbose, **options, **decode_options)
    if isinstance(audio, (list, tuple)):
        options = {k: v for k, v in locals().items()
                   if k not in ("model", "audio", "batch_size", "decode_options", "vad_chunks")}
        if progress is None:
            del options["progress"]
        if batch_size is None:  # as the command line: what a pass over more streams costs on this machine
            from ..decoding.batches import default_batch_size
            batch_size = default_batch_size(model) if len(audio) > 1 else 1
        return transcribe_many(model, audio, batch_size=batch_size, **options, **decode_options)
    return run_transcription(transcription(model, audio, verbose=verbose, temperature=temperature,
                                           compression_ratio_threshold=compression_ratio_threshold,
                                           logprob_threshold=logprob_threshold,
                                           no_speech_threshold=no_speech_threshold,
                                           condition_on_previous_text=condition_on_previous_text,
                                           initial_prompt=initial_prompt, carry_initial_prompt=carry_initial_prompt,
                                           word_timestamps=word_timestamps, prepend_punctuations=prepend_punctuations,
                                           append_punctuations=append_punctuations, clip_timestamps=clip_timestamps,
                                           hallucination_silence_threshold=hallucination_silence_threshold,
                                           progress=progress, vad_filter=vad_filter, **decode_options),
                             lambda request: decode(model, request.mel, request.options, draft_mel=request.draft_mel))


def _transcribe_chunked(model, audio, batch_size: int, verbose: Optional[bool], **options) -> dict:
    """``transcribe(..., vad_chunks=True)``: see chunked.py."""
    from .chunked import cut, first_language, joined

    pieces, offsets = cut(audio)
    if pieces and options.get("language") is None:
        options["language"] = first_language(model, pieces[0])
    options["condition_on_previous_text"] = False
    bar = tqdm.tqdm(total=len(pieces), unit="chunk", disable=verbose is not False)

    def done(index: int, result: Optional[dict], error: Optional[Exception]) -> None:
        if error is not None:
            raise error
        bar.update(1)

    with bar:
        results = transcribe_many(model, pieces, batch_size=batch_size, verbose=None, on_done=done, **options)
    return joined(results, offsets, options.get("language"), verbose)


def run_transcription(steps: Transcription, decode_window: Callable[[WindowRequest], MedusaDecodingResult]) -> dict:
    """Drive a transcription to its end, decoding each window it asks for with ``decode_window``."""
    try:
        request = next(steps)
        while True:
            request = steps.send(decode_window(request))
    except StopIteration as end:
        return end.value


def transcription(
    model,
    audio: Union[AudioInput, Path],
    *,
    verbose: Optional[bool] = None,
    temperature: Union[float, Tuple[float, ...]] = DEFAULT_TEMPERATURES,
    compression_ratio_threshold: Optional[float] = 2.4,
    logprob_threshold: Optional[float] = -1.0,
    no_speech_threshold: Optional[float] = 0.6,
    condition_on_previous_text: bool = True,
    initial_prompt: Optional[str] = None,
    carry_initial_prompt: bool = False,
    word_timestamps: bool = False,
    prepend_punctuations: str = PREPEND_PUNCTUATIONS,
    append_punctuations: str = APPEND_PUNCTUATIONS,
    clip_timestamps: Union[str, List[float]] = "0",
    hallucination_silence_threshold: Optional[float] = None,
    progress: Optional[Callable[..., tqdm.tqdm]] = None,
    vad_filter: bool = False,
    **decode_options,
) -> Transcription:
    """``transcribe``'s work as a generator of the windows it needs decoded (see ``Transcription``);
    the same arguments. Nothing runs until the first ``next``: bad options and unreadable audio
    raise there."""
    medusa_options = {k: decode_options.pop(k) for k in list(decode_options) if k in MEDUSA_ONLY_OPTIONS}
    as_medusa_options(MedusaDecodingOptions(), **medusa_options)  # reject bad values before any work

    dtype = torch.float16 if decode_options.get("fp16", True) else torch.float32
    if model.device.type == "cpu":
        if dtype == torch.float16:
            dtype = torch.float32  # whisper warns about this; on a CPU fp32 is simply the right default
    if dtype == torch.float32:
        decode_options["fp16"] = False

    kept = None
    if vad_filter:  # departs from whisper: the silences cut out first (vad_filter.py)
        from .vad_filter import KeptSpeech

        if _clips(clip_timestamps, 1) != [(0, 1)]:
            raise ValueError("vad_filter chooses what to transcribe: it cannot be combined with clip_timestamps")
        recording = load_audio(audio)
        kept = KeptSpeech.find(recording)
        recording_seconds = len(recording) / SAMPLE_RATE
        audio = kept.joined(recording)
        del recording

    with open_audio(audio) as samples:
        mel = LogMelFrames(samples, model.dims.n_mels)
        draft = getattr(model, "draft_model", None)
        # a draft model with another front end (e.g. 80 bins for large-v3's 128) gets its own frames
        draft_frames = (LogMelFrames(samples, draft.dims.n_mels)
                        if draft is not None and draft.dims.n_mels != model.dims.n_mels else None)
        result = yield from _transcribe_frames(
            model, mel, draft_frames=draft_frames, verbose=verbose, temperatures=[temperature] if isinstance(temperature, (int, float)) else list(temperature),
            thresholds=_Thresholds(compression_ratio_threshold, logprob_threshold, no_speech_threshold),
            condition_on_previous_text=condition_on_previous_text, initial_prompt=initial_prompt,
            carry_initial_prompt=carry_initial_prompt, word_timestamps=word_timestamps,
            punctuations=(prepend_punctuations, append_punctuations), clip_timestamps=clip_timestamps,
            hallucination_silence_threshold=hallucination_silence_threshold, progress=progress, dtype=dtype,
            decode_options=decode_options, medusa_options=medusa_options)
    return kept.restore(result, recording_seconds) if kept is not None else result


def _transcribe_frames(model, mel: LogMelFrames, *, draft_frames: Optional[LogMelFrames], verbose, temperatures, thresholds: _Thresholds,
                       condition_on_previous_text, initial_prompt, carry_initial_prompt, word_timestamps,
                       punctuations, clip_timestamps, hallucination_silence_threshold, progress, dtype,
                       decode_options: dict, medusa_options: dict) -> Transcription:
    content_frames = mel.content_frames
    content_duration = content_frames * HOP_LENGTH / SAMPLE_RATE
    stats = TranscriptionStats()

    def window_mel(seek: int, size: int, frames: LogMelFrames = mel) -> torch.Tensor:
        return pad_or_trim(frames.frames(seek, seek + size), N_FRAMES).to(model.device).to(dtype)

    if decode_options.get("language") is None:
        if not model.is_multilingual:
            decode_options["language"] = "en"
        else:
            if verbose:
                print("Detecting language using up to the first 30 seconds. Use `--language` to specify the language")
            _, probs = model.detect_language(window_mel(0, N_FRAMES))
            decode_options["language"] = max(probs, key=probs.get)
            if verbose is not None:
                print(f"Detected language: {LANGUAGES[decode_options['language']].title()}")
    language = decode_options["language"]
    task = decode_options.get("task", "transcribe")
    tokenizer = get_tokenizer(model.is_multilingual, num_languages=model.num_languages, language=language, task=task)
    if word_timestamps and task == "translate":
        warnings.warn("Word-level timestamps on translations may not be reliable.")

    input_stride = N_FRAMES // model.dims.n_audio_ctx  # mel frames per output timestamp step: 2
    time_precision = input_stride * HOP_LENGTH / SAMPLE_RATE  # seconds per timestamp step: 0.02
    all_tokens: List[int] = []
    all_segments: List[dict] = []
    prompt_reset_since = 0
    remaining_prompt_length = model.dims.n_text_ctx // 2 - 1
    initial_prompt_tokens: List[int] = []
    if initial_prompt is not None:
        initial_prompt_tokens = tokenizer.encode(" " + initial_prompt.strip())
        all_tokens.extend(initial_prompt_tokens)
        remaining_prompt_length -= len(initial_prompt_tokens)

    make_bar = progress or (lambda **kw: tqdm.tqdm(**kw, disable=verbose is not False))
    last_speech_timestamp = 0.0
    with make_bar(total=round(content_duration, 2), unit="s") as bar:
        for clip_start, clip_end in _clips(clip_timestamps, content_frames):
            seek = clip_start
            while seek < clip_end:
                window = _Window(seek, min(N_FRAMES, content_frames - seek, clip_end - seek))
                mel_segment = window_mel(window.seek, window.size)

                if carry_initial_prompt:
                    carried = all_tokens[max(len(initial_prompt_tokens), prompt_reset_since):]
                    carried = carried[-remaining_prompt_length:] if remaining_prompt_length > 0 else []
                    decode_options["prompt"] = initial_prompt_tokens + carried
                else:
                    decode_options["prompt"] = all_tokens[prompt_reset_since:]

                draft_mel = window_mel(window.seek, window.size, draft_frames) if draft_frames is not None else None
                stats.windows += 1
                result = yield from _decode_with_fallback(mel_segment, decode_options, medusa_options,
                                                          temperatures, thresholds, stats, draft_mel)
                if thresholds.is_silence(result):
                    seek += window.size  # fast-forward to the next window
                    bar.update(_seconds(window.size))
                    continue

                segments, seek, single_timestamp_ending = _split_at_timestamps(
                    result, tokenizer, window.seek, window.size, time_precision, input_stride)

                if word_timestamps:
                    add_word_timestamps(segments=segments, model=model, tokenizer=tokenizer, mel=mel_segment,
                                        num_frames=window.size, prepend_punctuations=punctuations[0],
                                        append_punctuations=punctuations[1],
                                        last_speech_timestamp=last_speech_timestamp)
                    if not single_timestamp_ending:
                        last_word_end = get_end(segments)
                        if last_word_end is not None and last_word_end > window.start_time:
                            seek = round(last_word_end * FRAMES_PER_SECOND)
                    if hallucination_silence_threshold is not None:
                        seek, drop_window = _skip_hallucinations(
                            segments, window, seek, single_timestamp_ending, hallucination_silence_threshold,
                            last_speech_timestamp, content_duration, content_frames)
                        if drop_window:
                            continue
                    last_word_end = get_end(segments)
                    if last_word_end is not None:
                        last_speech_timestamp = last_word_end

                if verbose:
                    for s in segments:
                        print(make_safe(f"[{format_timestamp(s['start'])} --> {format_timestamp(s['end'])}] {s['text']}"))

                # an instantaneous or empty segment is kept, but emptied
                for s in segments:
                    if s["start"] == s["end"] or s["text"].strip() == "":
                        s["text"], s["tokens"], s["words"] = "", [], []

                all_segments.extend({"id": i, **s} for i, s in enumerate(segments, start=len(all_segments)))
                all_tokens.extend(t for s in segments for t in s["tokens"])
                if not condition_on_previous_text or result.temperature > 0.5:
                    prompt_reset_since = len(all_tokens)  # no prompt after a high-temperature window
                bar.update(_seconds(min(content_frames, seek) - window.seek))

    return dict(text=tokenizer.decode(all_tokens[len(initial_prompt_tokens):]), segments=all_segments,
                language=language, medusa=dict(stats.as_dict(), audio_seconds=round(content_duration, 3),
                                               **compute_of(model)))


def compute_of(model) -> dict:
    """How the model computes, for a result's statistics: its compute type (``auto``'s choice where it
    was asked for) and, where it is converted, its encoder's form. Not in the output files, which are
    the same on every machine (outputs.STAT_FIELDS). Where the model was asked for its fastest proposer
    (``tiny.en-auto``), the one chosen."""
    compute = {"compute_type": getattr(model, "compute_type", "float32")}
    if hasattr(model, "proposer_name"):
        compute["proposer"] = model.proposer_name
    if hasattr(model, "encoder_form"):
        compute["encoder"] = model.encoder_form
    return compute


def _seconds(frames: int) -> float:
    return round(frames * HOP_LENGTH / SAMPLE_RATE, 2)


def transcribe_many(model, audios: Sequence[Union[AudioInput, Path]], *, batch_size: int = 8,
                    on_done: Optional[Callable[[int, Optional[dict], Optional[Exception]], None]] = None,
                    **options) -> List[Optional[dict]]:
    """Transcribe several recordings, their greedy windows decoded side by side (decoding/batches.py).

    Each recording is transcribed as ``transcribe`` does (the same options, the same sequential rule
    within it: a window waits for its previous one's text and end), and gets the result it gets
    alone: bit for bit at int8, where a batched row equals the row alone (see decoding/batches.py). Up to
    ``batch_size`` recordings are open at once, so memory stays flat in their number. Windows that
    need sampling or beam search (the temperature fallback, ``beam_size``) are decoded alone as
    they come.

    on_done : called with (index, result, None) as each recording ends, or (index, None, error) when
              it fails with a MedusaWhisperError (the others go on); without it the error is raised
    returns : the results in input order (None for a failed recording)
    """
    from ..decoding.batches import batch_decoder, batchable
    from ..errors import MedusaWhisperError

    results: List[Optional[dict]] = [None] * len(audios)
    options.setdefault("progress", lambda **kw: tqdm.tqdm(**kw, disable=True))  # one bar per file would interleave
    waiting = iter(range(len(audios)))  # recordings not yet opened
    random_states: dict = {}  # index -> its random number generator's state (see own_random_state)
    running = {}  # index -> its transcription
    queue: List[Tuple[int, WindowRequest]] = []  # windows waiting for a batch item

    def advance(index: int, result: Optional[MedusaDecodingResult]) -> None:
        """Send a window's result (None: start) and queue the next window, decoding alone the ones
        that cannot be batched, until the recording asks for a batchable window or ends."""
        steps = running[index]
        try:
            request = next(steps) if result is None else steps.send(result)
            while not batchable(request.options) or request.draft_mel is not None:
                with own_random_state(random_states, index):  # sampling draws from this recording's own
                    decoded = decode(model, request.mel, request.options, draft_mel=request.draft_mel)
                request = steps.send(decoded)
        except StopIteration as end:
            del running[index]
            results[index] = end.value
            if on_done is not None:
                on_done(index, end.value, None)
            return
        except MedusaWhisperError as error:
            del running[index]
            if on_done is None:
                raise
            on_done(index, None, error)
            return
        queue.append((index, request))

    def source():
        while not queue:
            index = next(waiting, None)
            if index is None:
                return None
            running[index] = transcription(model, audios[index], **options)
            advance(index, None)
        index, request = queue.pop(0)
        return index, request.mel, request.options

    batch_decoder(model, batch_size).run(source, advance)
    return results


@contextlib.contextmanager
def own_random_state(states: dict, key) -> Iterator[None]:
    """Run with ``key``'s own state of torch's global random number generator, which starts where a
    fresh process starts (PyTorch's fixed default seed) and is kept between calls.

    The temperature fallback samples from the global generator (whisper's ``Categorical.sample``),
    so without this a recording's sampled windows would depend on how many other recordings drew
    before it, and in what order: each recording of a batch gets the draws it gets transcribed
    alone in a fresh process, whatever the batch size. Departs from whisper, whose draws continue
    from one file to the next in one process."""
    state = states.get(key)
    if state is None:
        state = torch.Generator().get_state()  # the default seed's state
    with torch.random.fork_rng(devices=[]):
        torch.set_rng_state(state)
        try:
            yield
        finally:
            states[key] = torch.get_rng_state()
