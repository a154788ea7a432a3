"""Decoding 30-second windows as ``whisper.decode`` does, with speculation: the public entry.

One window is decoded by ``loop.WindowDecoder``, the one loop on every device: each pass
feeds the last accepted token plus a tree of candidates (a chain is a tree with one branch), each
candidate at the position of its depth and attending only to its ancestors; the longest path of
acceptable candidates is kept, plus the verifier's own token after it (the bonus token), so every
pass yields at least one token. Who proposes (Medusa heads, a draft model, a draft head) is behind
``drafting.base.Proposer``, or drafts inside the pass (``drafting.device``). Sampling and beam
search go to whisper's ``DecodingTask`` over the package's passes (``candidates``).

Setup (tokenizer, initial tokens, logit filters, sample length, language detection) is whisper's
own ``DecodingTask``, so options mean exactly what they mean in ``whisper.decode``.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field, fields
from typing import List, Optional, Union

import torch
from torch import Tensor
from whisper.decoding import DecodingOptions, DecodingResult, DecodingTask, LogitFilter
from whisper.model import Whisper
from whisper.utils import compression_ratio

from . import loop
from .acceptance import ExponentialDecayLengthPenalty
from .candidates import decode_candidates
from .encoder_graph import audio_features as audio_features_of
from ..drafting.base import ProposerStats
from ..drafting.factory import make_proposer
from .loop import Generation
from ..options import MedusaDecodingOptions, as_medusa_options


@dataclass(frozen=True)
class MedusaDecodingResult(DecodingResult):
    # decoder forward passes for this audio (language detection excluded, as it is for vanilla)
    decoder_steps: int = 0
    # tokens produced, end-of-text included, so that plain greedy decoding gives exactly 1.0
    tokens_produced: int = 0
    # accepted_per_head[k]: in how many passes a candidate at depth k+1 (head k+1's, or the draft's
    # (k+1)-th token) was accepted
    accepted_per_head: List[int] = field(default_factory=list)
    mode: str = "lossless"
    encode_seconds: float = 0.0
    decode_seconds: float = 0.0
    # candidates proposed (tree nodes verified) and accepted, and the proposer's share of the time
    # (a draft model's encoder pass included; it is part of decode_seconds)
    draft_proposed: int = 0
    draft_accepted: int = 0
    draft_seconds: float = 0.0

    @property
    def tokens_per_step(self) -> float:
        return self.tokens_produced / self.decoder_steps if self.decoder_steps else 0.0


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def _decode_one(model: Whisper, mel: Tensor, options: MedusaDecodingOptions, draft=None,
                draft_mel: Optional[Tensor] = None) -> MedusaDecodingResult:
    task = DecodingTask(model, options)

    began = time.perf_counter()
    audio_features = audio_features_of(task, mel)  # (1, n_audio_ctx, n_audio_state)
    _sync(audio_features.device)
    encode_seconds = time.perf_counter() - began

    initial = torch.tensor([task.initial_tokens])
    languages, language_probs = task._detect_language(audio_features, initial)
    common = dict(audio_features=audio_features[0], language=languages[0],
                  language_probs=language_probs[0] if language_probs else None)
    if options.task == "lang_id":
        return MedusaDecodingResult(**common, encode_seconds=encode_seconds, mode=options.mode)

    filters = window_filters(task, options)
    began = time.perf_counter()
    stats = ProposerStats()
    window = loop.decoder_for(model, audio_features, options, draft)
    proposer = None if window.drafts_in_pass else make_proposer(
        model, audio_features, languages[0], options, task, draft, draft_mel, window.proposer)
    gen = window.generate(task, audio_features, initial[0].tolist(), filters, stats, proposer, options)
    if gen is None:  # a filter that is not whisper's: the host's acceptance applies it as it is
        window = loop.decoder_for(model, audio_features, options, draft, acceptance="host")
        if proposer is None:  # (a draft model's, made above, serves either loop)
            proposer = make_proposer(model, audio_features, languages[0], options, task, draft, draft_mel,
                                     window.proposer)
        gen = window.generate(task, audio_features, initial[0].tolist(), filters, stats, proposer, options)
    stats = proposer.stats if proposer is not None else stats
    _sync(audio_features.device)
    decode_seconds = time.perf_counter() - began
    return window_result(task, options, common, gen, stats, encode_seconds, decode_seconds)


def window_filters(task: DecodingTask, options: MedusaDecodingOptions) -> List[LogitFilter]:
    """whisper's logit filters for this task, and the optional length penalty on end-of-text."""
    filters = list(task.logit_filters)
    if options.regulation_start is not None:
        filters.append(ExponentialDecayLengthPenalty(
            task.tokenizer.eot, task.sample_begin, options.regulation_start, options.regulation_factor))
    return filters


def window_result(task: DecodingTask, options: MedusaDecodingOptions, common: dict, gen: Generation,
                  stats: ProposerStats, encode_seconds: float, decode_seconds: float) -> MedusaDecodingResult:
    """whisper's result fields from one window's tokens, as ``whisper.decode`` computes them."""
    tokenizer = task.tokenizer
    sampled = gen.tokens[task.sample_begin:]
    text_tokens = sampled[: sampled.index(tokenizer.eot)] if tokenizer.eot in sampled else sampled
    text = tokenizer.decode(text_tokens).strip()
    return MedusaDecodingResult(
        **common,
        tokens=text_tokens,
        text=text,
        avg_logprob=gen.sum_logprob / (len(text_tokens) + 1),
        no_speech_prob=gen.no_speech_prob,
        temperature=options.temperature,
        compression_ratio=compression_ratio(text),
        decoder_steps=gen.decoder_steps,
        tokens_produced=len(sampled),
        accepted_per_head=list(stats.accepted_per_depth),
        mode=options.mode,
        encode_seconds=encode_seconds,
        decode_seconds=decode_seconds,
        draft_proposed=stats.proposed,
        draft_accepted=stats.accepted,
        draft_seconds=stats.seconds,
    )


def _decode_candidates(model: Whisper, mel: Tensor, options: MedusaDecodingOptions) -> List[MedusaDecodingResult]:
    """Sampling (temperature > 0) and beam search: whisper's DecodingTask with the package's decoder
    passes (candidates.py), timed.

    Differs from whisper: the passes only (one cache, cross keys and values once per audio, the
    compute type's kernels); what is chosen and how it is ranked is whisper's. Speculation is only
    defined for greedy decoding.
    """
    began = time.perf_counter()
    results, passes = decode_candidates(model, mel, options)
    seconds = time.perf_counter() - began
    return [
        MedusaDecodingResult(**{f.name: getattr(r, f.name) for f in fields(DecodingResult)},
                             decoder_steps=passes, tokens_produced=len(r.tokens) + 1,
                             mode="vanilla", decode_seconds=seconds / len(results))
        for r in results
    ]


@torch.no_grad()
def decode(
    model: Whisper,
    mel: Tensor,
    options: DecodingOptions = MedusaDecodingOptions(),
    draft: Optional[Whisper] = None,
    draft_mel: Optional[Tensor] = None,
    **kwargs,
) -> Union[MedusaDecodingResult, List[MedusaDecodingResult]]:
    """Decode 30-second segment(s) with Medusa heads; a drop-in for ``whisper.decode``.

    mel : shape = (n_mels, 3000) or (batch, n_mels, 3000), a log-Mel spectrogram; or the encoder
          output, shape = ([batch,] n_audio_ctx, n_audio_state), in which case the encoder is skipped
    options : whisper's DecodingOptions or MedusaDecodingOptions; keyword arguments override fields
    draft   : a draft model that proposes the candidates instead of the heads (default: the model's
              ``draft_model``, set by ``load_model(..., draft=...)``); ``mode="off"`` ignores it
    draft_mel : the draft's own log-Mel when its number of bins differs from the main model's
    """
    options = as_medusa_options(options, **kwargs)
    single = mel.ndim == 2
    if single:
        mel = mel.unsqueeze(0)
    if options.temperature > 0 or options.beam_size is not None:
        return _single_or_list(_decode_candidates(model, mel, options), single)
    draft = draft if draft is not None else getattr(model, "draft_model", None)
    if draft is not None:
        draft_mel = _draft_input(draft, mel, draft_mel)
    results = [_decode_one(model, mel[i : i + 1], options, draft, None if draft is None else draft_mel[i : i + 1])
               for i in range(mel.shape[0])]
    return _single_or_list(results, single)


def _single_or_list(results: list, single: bool):
    return results[0] if single else results


def _draft_input(draft: Whisper, mel: Tensor, draft_mel: Optional[Tensor]) -> Tensor:
    """What the draft model encodes: ``draft_mel``, or the main model's log-Mel when it fits."""
    if draft_mel is None:
        if mel.shape[-2] != draft.dims.n_mels:
            raise ValueError(f"the draft model takes a log-Mel of {draft.dims.n_mels} bins, but the input is "
                             f"{tuple(mel.shape[1:])}; pass draft_mel=log_mel_spectrogram(audio, "
                             f"{draft.dims.n_mels}) as well")
        return mel
    return draft_mel.unsqueeze(0) if draft_mel.ndim == 2 else draft_mel
