"""One long recording, fast: its speech cut into chunks of at most 30 s (vad.py), the chunks
transcribed side by side (``transcribe.transcribe_many``), their segments put back on the
recording's clock. ``transcribe(..., vad_chunks=True)`` and ``--vad-chunks`` use these pieces.

Opt-in, because the text is not ``whisper.transcribe``'s: whisper decodes window after window, each
conditioned on the previous text and starting where the previous one's last timestamp ended; here
each chunk is decoded on its own, without previous text, as faster-whisper's
``BatchedInferencePipeline`` and WhisperX do. Within a chunk everything is whisper's (timestamps,
temperature fallback, word timestamps), and a chunk gets the result it gets transcribed alone.
"""

from __future__ import annotations

from pathlib import Path
from typing import List, Optional, Tuple, Union

import numpy as np
from whisper.audio import FRAMES_PER_SECOND  # whisper's seek counts mel frames of 10 ms

from ..audio.files import load_audio
from ..audio.vad import SAMPLE_RATE, VadOptions, chunks, speech_spans

ADDED_STATS = ("windows", "fallback_windows", "tokens", "decoder_steps", "encode_seconds", "decode_seconds")


def cut(audio: Union[str, Path, np.ndarray], vad_options: VadOptions = VadOptions()
        ) -> Tuple[List[np.ndarray], List[float]]:
    """The recording's chunks (views of its samples) and each one's start in seconds."""
    samples = load_audio(audio) if isinstance(audio, (str, Path)) else np.asarray(audio, dtype=np.float32)
    stretches = chunks(speech_spans(samples, vad_options))
    return [samples[start:end] for start, end in stretches], [start / SAMPLE_RATE for start, _ in stretches]


def first_language(model, samples: np.ndarray) -> str:
    """The language of the first chunk, detected as whisper.transcribe detects it on its first window."""
    import whisper

    if not model.is_multilingual:
        return "en"
    mel = whisper.log_mel_spectrogram(whisper.pad_or_trim(samples), model.dims.n_mels).to(model.device)
    _, probs = model.detect_language(mel)
    return max(probs, key=probs.get)


def joined(results: List[Optional[dict]], offsets: List[float], language: Optional[str],
           verbose: Optional[bool]) -> dict:
    """The chunks' results as one: segments (and words) shifted by their chunk's start, numbered in
    order; ``medusa`` statistics summed, with ``chunks``."""
    segments: List[dict] = []
    totals = dict.fromkeys(ADDED_STATS, 0)
    for result, offset in zip(results, offsets):
        if result is None:
            continue
        for segment in result["segments"]:
            moved = dict(segment, id=len(segments), seek=segment["seek"] + round(offset * FRAMES_PER_SECOND),
                         start=round(segment["start"] + offset, 3), end=round(segment["end"] + offset, 3))
            if "words" in segment:
                moved["words"] = [dict(w, start=round(w["start"] + offset, 3), end=round(w["end"] + offset, 3))
                                  for w in segment["words"]]
            segments.append(moved)
            if verbose:
                from whisper.utils import format_timestamp, make_safe

                print(make_safe(f"[{format_timestamp(moved['start'])} --> {format_timestamp(moved['end'])}] "
                                f"{moved['text']}"))
        for key in ADDED_STATS:
            totals[key] += result.get("medusa", {}).get(key, 0)
    steps = totals["decoder_steps"]
    stats = dict(totals, tokens_per_step=totals["tokens"] / steps if steps else 0.0, chunks=len(offsets))
    done = [r for r in results if r is not None]
    if done:  # how the model computes, as each chunk's result says (longform.compute_of)
        stats.update({k: done[0]["medusa"][k] for k in ("compute_type", "encoder", "proposer")
                      if k in done[0].get("medusa", {})})
    return dict(text="".join(s["text"] for s in segments), segments=segments, language=language, medusa=stats)
