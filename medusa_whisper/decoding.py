"""Speculative greedy decoding: propose candidates, verify them in one decoder pass, accept, commit.

One step feeds the last accepted token plus a tree of candidates (a chain is a tree with one
branch) through the decoder, each candidate at the position of its depth and attending only to its
ancestors. The base logits verify the candidates: the longest path of acceptable candidates is
kept, plus the verifier's own token after it (the bonus token), so every step yields at least one
token. The cache drops the rest (a length reset for a chain, a compaction for a tree). Who proposes
(Medusa heads, a draft model, a draft head) is behind ``drafting.base.Proposer``.

Setup (tokenizer, initial tokens, logit filters, sample length, language detection) is whisper's
own ``DecodingTask``, so options mean exactly what they mean in ``whisper.decode``.
"""

from __future__ import annotations

import contextlib
import time
from dataclasses import dataclass, field, fields
from typing import List, Optional, Sequence, Union

import numpy as np
import torch
import torch.nn.functional as F
from torch import Tensor
from whisper.decoding import DecodingOptions, DecodingResult, DecodingTask, LogitFilter
from whisper.model import Whisper
from whisper.utils import compression_ratio

from . import fixed_decoding
from .candidates import decode_candidates
from .decoder import decoder_hidden, new_cache, next_token_logits
from .drafting.base import Committed, Proposer, ProposerStats
from .drafting.factory import make_proposer
from .drafting.tree import CandidateTree
from .fixed_decoding import Generation
from .options import MedusaDecodingOptions, as_medusa_options
from .together import rows_together

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


def _accepts(candidate: int, greedy: int, logprobs: Tensor, options: MedusaDecodingOptions) -> bool:
    if options.mode == "lossless" or candidate == greedy:
        return candidate == greedy
    # typical acceptance (paper eq. 3); the argmax always passes it, since max p >= exp(-H)
    probs = logprobs.exp()
    entropy = -torch.where(probs > 0, probs * logprobs, torch.zeros_like(probs)).sum()
    threshold = min(options.typical_epsilon, options.typical_alpha * float(torch.exp(-entropy)))
    return float(probs[candidate]) > threshold


def _accept_unverified(tree: CandidateTree, node: int, options: MedusaDecodingOptions) -> int:
    """LOSSY: the chain's next node, taken without comparing it with the verifier's token.

    Reached only for a tree with unverified nodes, which a proposer makes only when the caller set
    ``lossy_ctc_entropy``; checked here too, so that lossless decoding can never pass this way.
    """
    if options.lossy_ctc_entropy is None:
        raise RuntimeError("unverified candidates without the lossy_ctc_entropy option")
    return tree.children(node)[0]


@dataclass
class _Verdict:
    tokens: List[int]  # accepted candidates, then the verifier's token unless stopped by a candidate
    logprob: float  # sum of the base log-probabilities of `tokens`
    path: List[int]  # the accepted candidates' nodes in the tree, root to leaf

    @property
    def n_accepted(self) -> int:
        return len(self.path)


def verify(
    logits: Tensor,
    tree: CandidateTree,
    context: List[int],
    filters: Sequence[LogitFilter],
    options: MedusaDecodingOptions,
    eot: int,
    max_tokens: int,
) -> _Verdict:
    """Walk the tree from the root along accepted candidates and decide what to keep.

    logits     : shape = (len(tree) + 1, n_vocab), base logits at the last accepted token (row 0)
                 and at each node (row 1 + node); filtered here in place, as whisper filters each
                 step, but only along the walked path (each row with its own path as context)
    context    : all tokens so far (initial tokens included), what whisper's filters see
    max_tokens : stop after this many tokens (the sample-length and context limits)
    """
    kept: List[int] = []
    path: List[int] = []
    total = 0.0
    node, row = -1, 0
    while True:
        row_logits = logits[row : row + 1]
        prefix = torch.tensor([context + kept])
        for logit_filter in filters:
            logit_filter.apply(row_logits, prefix)
        logprobs = F.log_softmax(row_logits[0], dim=-1)
        greedy = int(row_logits[0].argmax())
        if (0 if node < 0 else tree.depths[node]) < tree.unverified:
            chosen = _accept_unverified(tree, node, options)
        else:
            # children are in the proposer's order of preference: the first acceptable one is taken
            chosen = next((child for child in tree.children(node)
                           if _accepts(tree.tokens[child], greedy, logprobs, options)), None)
        token = greedy if chosen is None else tree.tokens[chosen]
        kept.append(token)
        total += float(logprobs[token])
        if chosen is not None:
            path.append(chosen)
        if chosen is None or token == eot or len(kept) >= max_tokens:
            break
        node, row = chosen, 1 + chosen
    return _Verdict(kept, total, path)


def _generate(model: Whisper, task: DecodingTask, audio_features: Tensor, initial: List[int],
              filters: Sequence[LogitFilter], options: MedusaDecodingOptions,
              proposer: Optional[Proposer] = None) -> Generation:
    """Greedy decoding; each pass also verifies the candidates of ``proposer`` (when there is one).

    The loop knows nothing of which proposer it has: it asks for a tree, verifies it in one pass,
    keeps the accepted path in the cache (a length reset for a chain, a compaction for a tree) and
    tells the proposer what was committed.
    """
    decoder = model.decoder
    cache = new_cache(decoder, audio_features)
    tokenizer = task.tokenizer
    device = audio_features.device

    tokens = list(initial)
    pending = list(initial)  # accepted tokens not yet in the cache
    tree = CandidateTree()
    limit = min(task.sample_begin + task.sample_len, task.n_ctx + 1)  # whisper's two stopping rules
    steps, sum_logprob, no_speech_prob = 0, 0.0, np.nan

    while True:
        start = cache.length
        room = min(limit - len(tokens) - 1, task.n_ctx - start - len(pending))
        tree = tree.truncated(max(room, 0))
        positions, mask = tree.layout(start, len(pending), device)
        inputs = torch.tensor([pending + list(tree.tokens)], device=device)
        # the first pass is the window's prompt, alone and the same in every way of decoding it
        with rows_together() if steps == 0 else contextlib.nullcontext():
            hidden = decoder_hidden(decoder, inputs, positions, cache, start, mask)
        steps += 1

        if steps == 1 and tokenizer.no_speech is not None:
            sot_logits = next_token_logits(model, hidden[:, task.sot_index])
            no_speech_prob = float(sot_logits.softmax(dim=-1)[0, tokenizer.no_speech])

        last = len(pending) - 1  # row of the last accepted token
        logits = next_token_logits(model, hidden[0, last:])  # (1 + len(tree), n_vocab)
        # the verifier's own guess at every row, before filtering (beyond the accepted path too)
        predictions = logits.argmax(dim=-1).tolist() if proposer is not None else []
        verdict = verify(logits, tree, tokens, filters, options, tokenizer.eot, limit - len(tokens))
        tokens += verdict.tokens
        sum_logprob += verdict.logprob
        if tokens[-1] == tokenizer.eot or len(tokens) >= limit:
            break

        # keep the pending tokens and the accepted candidates; the bonus token is fed next pass
        n_pending = len(pending)
        if tree.is_chain:  # the accepted nodes are 0..n-1: a prefix
            cache.rollback(start + n_pending + verdict.n_accepted)
            kept_hidden = hidden[:, : n_pending + verdict.n_accepted]
        else:
            rows = list(range(n_pending)) + [n_pending + node for node in verdict.path]
            cache.compact([start + row for row in rows], start)
            kept_hidden = hidden[:, rows]
        if proposer is not None:
            accepted = [tree.tokens[node] for node in verdict.path]
            proposer.commit(Committed(tokens=pending + accepted, hidden=kept_hidden, position=start,
                                      next_token=tokens[-1], n_accepted=verdict.n_accepted, n_proposed=len(tree),
                                      predictions=predictions))
            tree = proposer.propose()
        pending = [tokens[-1]]

    return Generation(tokens, sum_logprob, no_speech_prob, steps)


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def _decode_one(model: Whisper, mel: Tensor, options: MedusaDecodingOptions, draft=None,
                draft_mel: Optional[Tensor] = None) -> MedusaDecodingResult:
    task = DecodingTask(model, options)

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

    filters = window_filters(task, options)
    began = time.perf_counter()
    gen, stats, proposer = None, ProposerStats(), None
    fixed = fixed_decoding.decoder_for(model, audio_features, options, draft)
    if fixed is not None:  # the fixed-shape step (CUDA graphs); its own proposer drafts in the pass, if any
        if fixed.proposer is None:
            proposer = make_proposer(model, audio_features, languages[0], options, task, draft, draft_mel)
        gen = fixed.generate(task, audio_features, initial[0].tolist(), filters, stats, proposer)
    if gen is None:  # not there, or a filter that is not whisper's
        if proposer is None:
            proposer = make_proposer(model, audio_features, languages[0], options, task, draft, draft_mel)
        gen = _generate(model, task, audio_features, initial[0].tolist(), filters, options, proposer)
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
