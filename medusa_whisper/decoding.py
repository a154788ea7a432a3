"""Medusa decoding: propose with the heads, verify in one decoder pass, accept, commit.

One step feeds the last accepted token plus K candidates (positions t..t+K) through the decoder.
The base logits at those positions verify the candidates; the longest acceptable prefix is kept,
plus the verifier's own token at the first rejected position (the bonus token), so every step
yields at least one token. The heads, applied at the last accepted position of the same pass,
propose the next candidates. The cache rolls back to drop the rejected candidates.

Setup (tokenizer, initial tokens, logit filters, sample length, language detection) is whisper's
own ``DecodingTask``, so options mean exactly what they mean in ``whisper.decode``.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field, fields, replace
from typing import List, Optional, Sequence, Union

import numpy as np
import torch
import torch.nn.functional as F
from torch import Tensor
from whisper.decoding import DecodingOptions, DecodingResult, DecodingTask, LogitFilter
from whisper.model import Whisper
from whisper.utils import compression_ratio

from .decoder import chain_mask, decoder_hidden, medusa_block_hidden, new_cache, project, transposed_rows
from .heads import MedusaHeads

MODES = ("lossless", "typical", "off")


@dataclass(frozen=True)
class MedusaDecodingOptions(DecodingOptions):
    # "lossless": accept a head's token only where it equals the verifier's argmax, so the output
    # equals vanilla greedy decoding; "typical": the paper's threshold rule; "off": no speculation
    mode: str = "lossless"
    # how many of the model's heads to use (None: all)
    num_heads: Optional[int] = None
    # typical acceptance: accept token x if p(x) > min(typical_epsilon, typical_alpha * exp(-H(p)))
    typical_epsilon: float = 0.09
    typical_alpha: float = 0.3
    # exponential-decay length penalty on end-of-text from this many sampled tokens on (None: off)
    regulation_start: Optional[int] = None
    regulation_factor: float = 1.01
    # draft-model decoding (with a draft model): at most this many draft tokens per step, and
    # whether that number adapts to the acceptance rate (seed 004's rule)
    draft_tokens: int = 5
    adaptive_lookahead: bool = False


@dataclass(frozen=True)
class MedusaDecodingResult(DecodingResult):
    # decoder forward passes for this audio (language detection excluded, as it is for vanilla)
    decoder_steps: int = 0
    # tokens produced, end-of-text included, so that plain greedy decoding gives exactly 1.0
    tokens_produced: int = 0
    # accepted_per_head[k]: how often the candidate of head k+1 (or the draft's (k+1)-th) was accepted
    accepted_per_head: List[int] = field(default_factory=list)
    mode: str = "lossless"
    encode_seconds: float = 0.0
    decode_seconds: float = 0.0
    # draft-model decoding: main-model tokens proposed and accepted, and the draft's share of the time
    # (its encoder pass included; it is part of decode_seconds)
    draft_proposed: int = 0
    draft_accepted: int = 0
    draft_seconds: float = 0.0

    @property
    def tokens_per_step(self) -> float:
        return self.tokens_produced / self.decoder_steps if self.decoder_steps else 0.0


class ExponentialDecayLengthPenalty(LogitFilter):
    """Raise the end-of-text logit by |l| * (factor**(n - start) - 1) after ``start`` sampled tokens.

    The reference implementation's ``exponential_decay_length_penalty=(start, factor)``; it makes
    long hallucinated tails less likely.
    """

    def __init__(self, eot: int, sample_begin: int, start: int, factor: float):
        self.eot, self.sample_begin, self.start, self.factor = eot, sample_begin, start, factor

    def apply(self, logits: Tensor, tokens: Tensor) -> None:
        excess = tokens.shape[1] - self.sample_begin - self.start
        if excess > 0:
            logits[:, self.eot] += logits[:, self.eot].abs() * (self.factor**excess - 1)


def _verify_options(options: MedusaDecodingOptions) -> MedusaDecodingOptions:
    if options.mode not in MODES:
        raise ValueError(f"mode must be one of {MODES}, got {options.mode!r}")
    if options.num_heads is not None and options.num_heads < 0:
        raise ValueError("num_heads must be >= 0")
    if not (0 < options.typical_epsilon <= 1 and options.typical_alpha > 0):
        raise ValueError("typical_epsilon must be in (0, 1] and typical_alpha > 0")
    if options.regulation_start is not None and options.regulation_factor < 1:
        raise ValueError("regulation_factor must be >= 1")
    if options.draft_tokens < 1:
        raise ValueError("draft_tokens must be >= 1")
    return options


def as_medusa_options(options: DecodingOptions, **overrides) -> MedusaDecodingOptions:
    """Accept whisper's DecodingOptions too; ``overrides`` as in ``dataclasses.replace``."""
    if not isinstance(options, MedusaDecodingOptions):
        options = MedusaDecodingOptions(**{f.name: getattr(options, f.name) for f in fields(DecodingOptions)})
    return _verify_options(replace(options, **overrides) if overrides else options)


def _accepts(candidate: int, greedy: int, logprobs: Tensor, options: MedusaDecodingOptions) -> bool:
    if options.mode == "lossless" or candidate == greedy:
        return candidate == greedy
    # typical acceptance (paper eq. 3); the argmax always passes it, since max p >= exp(-H)
    probs = logprobs.exp()
    entropy = -torch.where(probs > 0, probs * logprobs, torch.zeros_like(probs)).sum()
    threshold = min(options.typical_epsilon, options.typical_alpha * float(torch.exp(-entropy)))
    return float(probs[candidate]) > threshold


@dataclass
class _Verdict:
    tokens: List[int]  # accepted candidates, then the verifier's token unless stopped by a candidate
    logprob: float  # sum of the base log-probabilities of `tokens`
    n_accepted: int  # how many of `tokens` were candidates


def verify(
    logits: Tensor,
    candidates: Sequence[int],
    context: List[int],
    filters: Sequence[LogitFilter],
    options: MedusaDecodingOptions,
    eot: int,
    max_tokens: int,
) -> _Verdict:
    """Walk the verified positions in order and decide what to keep.

    logits     : shape = (len(candidates) + 1, n_vocab), base logits at the last accepted token
                 and at each candidate; filtered here in place, as whisper filters each step
    context    : all tokens so far (initial tokens included), what whisper's filters see
    max_tokens : stop after this many tokens (the sample-length and context limits)
    """
    kept: List[int] = []
    total = 0.0
    n_accepted = 0
    for i in range(len(candidates) + 1):
        row = logits[i : i + 1]
        prefix = torch.tensor([context + kept])
        for logit_filter in filters:
            logit_filter.apply(row, prefix)
        logprobs = F.log_softmax(row[0], dim=-1)
        greedy = int(row[0].argmax())
        is_candidate = i < len(candidates) and _accepts(candidates[i], greedy, logprobs, options)
        token = candidates[i] if is_candidate else greedy
        kept.append(token)
        total += float(logprobs[token])
        n_accepted += is_candidate
        if not is_candidate or token == eot or len(kept) >= max_tokens:
            break
    return _Verdict(kept, total, n_accepted)


def propose(heads: MedusaHeads, decoder, head_input: Tensor, num_heads: int) -> List[int]:
    """Greedy candidates of heads 1..num_heads at one position.

    head_input : shape = (1, n_state), the decoder state (or Medusa block output) there
    """
    states = heads.head_states(head_input, num_heads)  # (1, K, n_state)
    # == heads.proposal_logits(states, embedding), through a cached contiguous copy (see transposed_rows)
    embedding = decoder.token_embedding.weight
    matrix = transposed_rows(heads, embedding, states.dtype, lambda: heads.proposal_token_ids(embedding.device),
                             rows_key=heads.proposal_size)
    columns = (states @ matrix)[0].argmax(dim=-1)
    return heads.proposal_ids(columns).tolist()


@dataclass
class _Generation:
    tokens: List[int]
    sum_logprob: float
    no_speech_prob: float
    decoder_steps: int
    accepted_per_head: List[int]


def _generate(model: Whisper, task: DecodingTask, audio_features: Tensor, initial: List[int],
              options: MedusaDecodingOptions, filters: Sequence[LogitFilter], drafter=None) -> _Generation:
    """Greedy decoding with candidates from the Medusa heads, or from ``drafter`` when given."""
    decoder = model.decoder
    heads: Optional[MedusaHeads] = getattr(model, "medusa", None)
    num_heads = 0 if heads is None or options.mode == "off" or drafter is not None else heads.num_heads
    if options.num_heads is not None:
        num_heads = min(num_heads, options.num_heads)
    use_block = num_heads > 0 and heads.block is not None
    cache = new_cache(decoder, heads if use_block else None, audio_features)
    base_state = heads.base_state if heads is not None else (lambda h: h)
    tokenizer = task.tokenizer
    device = audio_features.device

    tokens = list(initial)
    pending = list(initial)  # accepted tokens not yet in the cache
    candidates: List[int] = []
    limit = min(task.sample_begin + task.sample_len, task.n_ctx + 1)  # whisper's two stopping rules
    steps, sum_logprob, no_speech_prob = 0, 0.0, np.nan
    accepted_per_head = [0] * num_heads

    while True:
        start = cache.length
        room = min(limit - len(tokens) - 1, task.n_ctx - start - len(pending))
        candidates = candidates[: max(room, 0)]
        inputs = pending + candidates
        n = len(inputs)
        mask = chain_mask(start, n, device)
        positions = torch.arange(start, start + n, device=device)
        hidden = decoder_hidden(decoder, torch.tensor([inputs], device=device), positions, cache, start, mask)
        steps += 1

        if steps == 1 and tokenizer.no_speech is not None:
            sot_logits = project(decoder, base_state(hidden[:, task.sot_index]))
            no_speech_prob = float(sot_logits.softmax(dim=-1)[0, tokenizer.no_speech])

        last = len(pending) - 1  # row of the last accepted token
        logits = project(decoder, base_state(hidden[0, last:]))  # (1 + len(candidates), n_vocab)
        verdict = verify(logits, candidates, tokens, filters, options, tokenizer.eot, limit - len(tokens))
        tokens += verdict.tokens
        sum_logprob += verdict.logprob
        # per candidate position; a draft may propose more positions than it has tokens
        accepted_per_head.extend([0] * (verdict.n_accepted - len(accepted_per_head)))
        for k in range(verdict.n_accepted):
            accepted_per_head[k] += 1
        if tokens[-1] == tokenizer.eot or len(tokens) >= limit:
            break

        # keep the pending tokens and the accepted candidates; the bonus token is fed next step
        cache.rollback(start + len(pending) + verdict.n_accepted)
        pending = [tokens[-1]]
        if drafter is not None:
            drafter.accept(verdict.tokens, verdict.n_accepted, len(candidates))
            candidates = drafter.propose()
        elif num_heads:
            head_input = hidden[:, last + verdict.n_accepted]
            if use_block:
                # the block must see every new position to keep its cache complete
                block_out = medusa_block_hidden(heads, hidden, cache, start, mask)
                cache.block_self_attn.rollback(cache.length)
                head_input = block_out[:, last + verdict.n_accepted]
            candidates = propose(heads, decoder, head_input, num_heads)

    return _Generation(tokens, sum_logprob, no_speech_prob, steps, accepted_per_head)


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def _decode_one(model: Whisper, mel: Tensor, options: MedusaDecodingOptions, draft=None,
                draft_mel: Optional[Tensor] = None) -> MedusaDecodingResult:
    task = DecodingTask(model, options)
    tokenizer = task.tokenizer

    began = time.perf_counter()
    audio_features = task._get_audio_features(mel)  # (1, n_audio_ctx, n_audio_state)
    _sync(audio_features.device)
    encode_seconds = time.perf_counter() - began

    initial = torch.tensor([task.initial_tokens])
    languages, language_probs = task._detect_language(audio_features, initial)
    common = dict(audio_features=audio_features[0], language=languages[0],
                  language_probs=language_probs[0] if language_probs else None)
    if options.task == "lang_id":
        return MedusaDecodingResult(**common, encode_seconds=encode_seconds, mode=options.mode)

    filters = list(task.logit_filters)
    if options.regulation_start is not None:
        filters.append(ExponentialDecayLengthPenalty(
            tokenizer.eot, task.sample_begin, options.regulation_start, options.regulation_factor))

    began = time.perf_counter()
    drafter = None
    if draft is not None and options.mode != "off":
        from .draft import Drafter

        drafter = Drafter(draft, draft_mel, task, languages[0], options.draft_tokens, options.adaptive_lookahead)
    gen = _generate(model, task, audio_features, initial[0].tolist(), options, filters, drafter)
    _sync(audio_features.device)
    decode_seconds = time.perf_counter() - began
    draft_stats = dict(draft_proposed=drafter.stats.proposed, draft_accepted=drafter.stats.accepted,
                       draft_seconds=drafter.stats.seconds) if drafter is not None else {}

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
        accepted_per_head=gen.accepted_per_head,
        mode=options.mode,
        encode_seconds=encode_seconds,
        decode_seconds=decode_seconds,
        **draft_stats,
    )


def _decode_vanilla(model: Whisper, mel: Tensor, options: MedusaDecodingOptions) -> List[MedusaDecodingResult]:
    """Sampling (temperature > 0) and beam search: whisper's own decoder, timed.

    Differs from whisper: nothing, by design. Speculation is only defined here for greedy decoding.
    """
    began = time.perf_counter()
    results = DecodingTask(model, options).run(mel)
    seconds = time.perf_counter() - began
    return [
        MedusaDecodingResult(**{f.name: getattr(r, f.name) for f in fields(DecodingResult)},
                             decoder_steps=len(r.tokens) + 1, tokens_produced=len(r.tokens) + 1,
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
        return _single_or_list(_decode_vanilla(model, mel, options), single)
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
