"""Stage 1 of training: run the frozen base model once and keep what the heads learn from.

The base model never changes while heads train, so everything it computes is computed once per
window and stored in fp16 shards on disk:

- the labels: by default the base model's own greedy transcript of the window (self-supervised,
  paper III.B), which is also exactly what lossless decoding will verify the heads against;
  a share of windows is labelled with timestamps so that the heads learn timestamp tokens too;
- the decoder's post-LayerNorm states ``h`` over the labelled sequence (teacher-forced), the input
  of Medusa-Linear heads and of the Medusa block;
- the input of the last decoder layer, for the fine-tuned variant that retrains that layer;
- the encoder output, for the Medusa block's (and the last layer's) cross-attention.

Shards are written atomically and skipped when present, so an interrupted run resumes.
"""

from __future__ import annotations

import json
import os
import random
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Dict, List, Optional, Sequence

import torch
import whisper
from tqdm import tqdm
from whisper.decoding import DecodingOptions
from whisper.tokenizer import get_tokenizer
from whisper.utils import compression_ratio

from ..checkpoints.weights import safe_torch_load
from .windows import Window, render

# whisper.transcribe's default threshold: above it a transcript is a repetition loop
MAX_COMPRESSION_RATIO = 2.4
SHARD_WINDOWS = 16


@dataclass(frozen=True)
class LabelOptions:
    # "self": the base model's greedy transcript; "transcript": the CSV's sentences
    labels: str = "self"
    # share of windows decoded with timestamp tokens (self labels only)
    timestamps_fraction: float = 0.3
    seed: int = 0
    batch_size: int = 8


@dataclass
class Shard:
    tokens: List[List[int]]  # per window: initial tokens, sampled tokens, end-of-text
    sample_begin: List[int]  # per window: index of the first sampled token
    hidden: torch.Tensor  # (sum of lengths, n_state) fp16, post-LayerNorm decoder states
    pre_last: torch.Tensor  # (sum of lengths, n_state) fp16, input of the last decoder layer
    audio_features: torch.Tensor  # (windows, n_audio_ctx, n_audio_state) fp16
    meta: List[dict]

    @property
    def offsets(self) -> List[int]:
        out, total = [], 0
        for t in self.tokens:
            out.append(total)
            total += len(t)
        return out

    def to_dict(self) -> dict:
        return dict(tokens=self.tokens, sample_begin=self.sample_begin, hidden=self.hidden,
                    pre_last=self.pre_last, audio_features=self.audio_features, meta=self.meta)

    @classmethod
    def load(cls, path: Path) -> "Shard":
        return cls(**safe_torch_load(path))


def _initial_tokens(tokenizer, timestamps: bool) -> List[int]:
    # as whisper's DecodingTask builds them (no prompt, no prefix)
    return list(tokenizer.sot_sequence if timestamps else tokenizer.sot_sequence_including_notimestamps)


@torch.no_grad()
def teacher_forced_states(model, audio_features: torch.Tensor, tokens: torch.Tensor):
    """Decoder states over whole sequences in one pass, through whisper's own modules.

    tokens : shape = (batch, length), right-padded (padding only affects later positions)
    returns: (input of the last layer, post-LayerNorm output), each (batch, length, n_state)
    """
    decoder = model.decoder
    x = decoder.token_embedding(tokens) + decoder.positional_embedding[: tokens.shape[1]]
    x = x.to(audio_features.dtype)
    for block in decoder.blocks[:-1]:
        x = block(x, audio_features, mask=decoder.mask)
    pre_last = x
    x = decoder.blocks[-1](x, audio_features, mask=decoder.mask)
    return pre_last, decoder.ln(x)


def _label(model, features: torch.Tensor, windows: Sequence[Window], stamps: Sequence[bool],
           options: LabelOptions, fp16: bool):
    """Sampled tokens per window, or None for a window to drop (a repetition loop or no end)."""
    out: List[Optional[List[int]]] = [None] * len(windows)
    if options.labels == "transcript":
        tokenizer = get_tokenizer(model.is_multilingual, num_languages=model.num_languages,
                                  language=windows[0].language, task="transcribe")
        for i, w in enumerate(windows):
            if w.sentence:
                out[i] = tokenizer.encode(" " + w.sentence)
        return out
    for flag in (False, True):
        rows = [i for i in range(len(windows)) if stamps[i] == flag]
        if not rows:
            continue
        language = windows[rows[0]].language
        decode_options = DecodingOptions(language=language, without_timestamps=not flag, fp16=fp16)
        results = whisper.decode(model, features[rows], decode_options)
        for i, r in zip(rows, results):
            # no end-of-text within whisper's 224-token budget means a loop; so does a high ratio
            if r.compression_ratio <= MAX_COMPRESSION_RATIO and len(r.tokens) < model.dims.n_text_ctx // 2 - 1:
                out[i] = list(r.tokens)
    return out


@torch.no_grad()
def _featurize(model, windows: Sequence[Window], stamps: Sequence[bool], options: LabelOptions) -> Shard:
    device = next(model.parameters()).device
    fp16 = device.type == "cuda"
    mels = torch.stack([
        whisper.log_mel_spectrogram(whisper.pad_or_trim(torch.from_numpy(render(w))), model.dims.n_mels)
        for w in windows
    ]).to(device)
    features = model.embed_audio(mels.half() if fp16 else mels)
    labels = _label(model, features, windows, stamps, options, fp16)

    kept = [i for i, tokens in enumerate(labels) if tokens is not None]
    sequences, begins, meta = [], [], []
    for i in kept:
        w = windows[i]
        tokenizer = get_tokenizer(model.is_multilingual, num_languages=model.num_languages,
                                  language=w.language, task="transcribe")
        initial = _initial_tokens(tokenizer, stamps[i] and options.labels == "self")
        sequences.append(initial + labels[i] + [tokenizer.eot])
        begins.append(len(initial))
        text = tokenizer.decode([t for t in labels[i] if t < tokenizer.eot]).strip()
        meta.append(dict(audio=[u.path for u in w.utterances], pauses=list(w.pauses), text=text, sentence=w.sentence,
                         timestamps=bool(stamps[i]), compression_ratio=compression_ratio(text)))

    n_state = model.dims.n_text_state
    if not kept:
        empty = torch.zeros(0, n_state, dtype=torch.float16)
        return Shard([], [], empty, empty.clone(), torch.zeros(0, *features.shape[1:], dtype=torch.float16), [])
    length = max(len(s) for s in sequences)
    padded = torch.zeros(len(kept), length, dtype=torch.long)
    for row, s in enumerate(sequences):
        padded[row, : len(s)] = torch.tensor(s)
    pre_last, hidden = teacher_forced_states(model, features[kept], padded.to(device))
    flat = lambda x: torch.cat([x[row, : len(s)] for row, s in enumerate(sequences)]).half().cpu()  # noqa: E731
    return Shard(sequences, begins, flat(hidden), flat(pre_last), features[kept].half().cpu(), meta)


def _atomic_save(obj, path: Path) -> None:
    tmp = path.with_name(path.name + ".tmp")
    torch.save(obj, tmp)
    os.replace(tmp, path)


def build_cache(model, windows: Sequence[Window], out_dir: Path, options: LabelOptions = LabelOptions(),
                description: str = "cache") -> Dict:
    """Write one shard per ``SHARD_WINDOWS`` windows under ``out_dir``; existing shards are kept.

    returns the cache's summary (also written to ``out_dir/cache.json``)
    """
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    rng = random.Random(options.seed)
    # decided up front for all windows, so a resumed run labels each window as the first run would
    stamps = [options.labels == "self" and rng.random() < options.timestamps_fraction for _ in windows]
    began = time.perf_counter()
    n_shards = (len(windows) + SHARD_WINDOWS - 1) // SHARD_WINDOWS
    bar = tqdm(total=len(windows), desc=description, unit="window")
    for s in range(n_shards):
        path = out_dir / f"shard_{s:05d}.pt"
        lo, hi = s * SHARD_WINDOWS, min((s + 1) * SHARD_WINDOWS, len(windows))
        if not path.exists():
            parts = [_featurize(model, windows[i : i + options.batch_size], stamps[i : i + options.batch_size], options)
                     for i in range(lo, hi, options.batch_size)]
            _atomic_save(merge(parts).to_dict(), path)
        bar.update(hi - lo)
    bar.close()
    summary = summarize(out_dir)
    summary.update(options=asdict(options), seconds_this_run=round(time.perf_counter() - began, 1))
    (out_dir / "cache.json").write_text(json.dumps(summary, indent=2))
    return summary


def merge(parts: Sequence[Shard]) -> Shard:
    """Shards as one (windows in order)."""
    return Shard(
        tokens=[t for p in parts for t in p.tokens],
        sample_begin=[b for p in parts for b in p.sample_begin],
        hidden=torch.cat([p.hidden for p in parts]),
        pre_last=torch.cat([p.pre_last for p in parts]),
        audio_features=torch.cat([p.audio_features for p in parts]),
        meta=[m for p in parts for m in p.meta],
    )


def shard_paths(cache_dir: Path) -> List[Path]:
    return sorted(Path(cache_dir).glob("shard_*.pt"))


def load_cache(cache_dir: Path, audio_features: bool = True, max_shards: Optional[int] = None) -> Shard:
    """The shards of a cache (the first ``max_shards``) as one; ``audio_features=False`` leaves the
    encoder output out."""
    shards = []
    for p in shard_paths(cache_dir)[:max_shards]:
        shard = Shard.load(p)
        if not audio_features:
            shard.audio_features = shard.audio_features[:0]
        shards.append(shard)
    if not shards:
        raise FileNotFoundError(f"{cache_dir}: no cached shards")
    return merge(shards)


def summarize(cache_dir: Path) -> Dict:
    windows = tokens = stamped = 0
    for p in shard_paths(cache_dir):
        shard = Shard.load(p)
        windows += len(shard.tokens)
        tokens += sum(len(t) - b for t, b in zip(shard.tokens, shard.sample_begin))
        stamped += sum(m["timestamps"] for m in shard.meta)
    return dict(windows=windows, target_tokens=tokens, windows_with_timestamps=stamped)
