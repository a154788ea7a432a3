"""Greedy decoding of many windows side by side: one decoder pass advances every stream by a token.

A decoder pass on a CPU is bound by reading weights; a pass over B streams reads them once. Each
stream (one 30-s window) has its own batch item in one preallocated cache: its own audio's
cross-attention keys and values, its own self-attention slots, position, logit filters, prompt and
stopping rule. When a stream ends, the next waiting window takes its item at once (continuous
batching), so the batch stays full while there is work.

Each window's result is the one ``decoding.decode`` gives it alone with ``mode="off"`` (and so with
``mode="lossless"``, which gives greedy's tokens): its encoder pass, language detection and prompt
pass run on it alone, and its single-token steps run batched through ``decoder.decoder_rows_step``,
whose int8 attention and products give a stream the bits it gets alone (invariant_attention.py,
``_weight_int8pack_mm``). float32's products do not promise that: there a batched window may differ
from the window alone in the last bits of its logits, and rarely in a token.

Departs from whisper (``whisper.decode`` on a batch of windows runs them in lock step, with the same
prompt, until the longest ends): windows of different files, prompts and lengths share passes.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Callable, Dict, Iterable, Iterator, List, Optional, Sequence, Tuple

import torch
from torch import Tensor
from whisper.decoding import DecodingTask
from whisper.model import Whisper

from .compute import compute_type_of
from .decoder import DecoderCache, block_caches, decoder_hidden, decoder_rows_step, new_cache, next_token_logits
from .acceptance import verify
from .decoding import MedusaDecodingResult, window_filters, window_result
from .drafting.base import ProposerStats
from .drafting.tree import CandidateTree
from .fixed_decoding import Generation
from .masks import chain_mask
from .options import MedusaDecodingOptions, as_medusa_options
from .routes import ROUNDS, median_micros, table as routes_table
from .together import rows_together


def batchable(options: MedusaDecodingOptions) -> bool:
    """Whether a window with these options decodes to greedy's tokens: temperature 0, no beam search,
    no speculation that could change the tokens (``typical``) and no lossy shortcut."""
    return (options.temperature == 0 and options.beam_size is None and options.mode in ("off", "lossless")
            and options.lossy_ctc_entropy is None and options.task != "lang_id")


@dataclass
class _Stream:
    """One window being decoded in a batch item."""

    key: object
    task: DecodingTask
    options: MedusaDecodingOptions
    common: dict  # the result's audio_features, language and language_probs
    filters: list
    tokens: List[int]
    limit: int  # whisper's two stopping rules: sample length and context
    encode_seconds: float
    began: float
    sum_logprob: float = 0.0
    no_speech_prob: float = float("nan")
    steps: int = 0

    @property
    def done(self) -> bool:
        return self.tokens[-1] == self.task.tokenizer.eot or len(self.tokens) >= self.limit

    def take(self, logits: Tensor) -> None:
        """Greedy's next token from this stream's logits (1, n_vocab), filtered as a window alone
        is (``acceptance.verify``)."""
        verdict = verify(logits, _NO_TREE, self.tokens, self.filters, self.options, self.task.tokenizer.eot,
                         self.limit - len(self.tokens))
        self.tokens += verdict.tokens
        self.sum_logprob += verdict.logprob
        self.steps += 1

    def result(self) -> MedusaDecodingResult:
        gen = Generation(self.tokens, self.sum_logprob, self.no_speech_prob, self.steps)
        return window_result(self.task, replace_mode(self.options), self.common, gen, ProposerStats(),
                             self.encode_seconds, time.perf_counter() - self.began)


_NO_TREE = CandidateTree()


def replace_mode(options: MedusaDecodingOptions) -> MedusaDecodingOptions:
    return as_medusa_options(options, mode="off")


class BatchDecoder:
    """Decodes windows greedily, up to ``batch_size`` of them side by side in one pass.

    ``run(source, sink)`` asks ``source()`` for the next window whenever a batch item is free (None:
    none waiting now) and hands each result to ``sink(key, result)``, which may make more windows
    available (the next window of a file waits for its previous one's text and end).
    """

    def __init__(self, model: Whisper, batch_size: int):
        if batch_size < 1:
            raise ValueError(f"batch size must be at least 1, not {batch_size}")
        self.model, self.batch_size = model, batch_size
        self.passes = 0  # batched decoder passes, for the statistics
        self.rows = 0  # streams advanced, summed over those passes

    def _empty_cache(self) -> DecoderCache:
        decoder = self.model.decoder
        dims = self.model.dims
        features = torch.zeros(self.batch_size, dims.n_audio_ctx, dims.n_audio_state, device=self.model.device)
        self_attn, cross_attn = block_caches(decoder.blocks, decoder.positional_embedding.shape[0], features)
        return DecoderCache(self_attn=self_attn, cross_attn=cross_attn, dtype=features.dtype)

    @torch.no_grad()
    def run(self, source: Callable[[], Optional[Tuple[object, Tensor, MedusaDecodingOptions]]],
            sink: Callable[[object, MedusaDecodingResult], None]) -> None:
        cache = self._empty_cache()
        streams: List[Optional[_Stream]] = [None] * self.batch_size
        while True:
            refill(streams, source, lambda item, *request: self._start(cache, item, *request), sink)
            active = [i for i, s in enumerate(streams) if s is not None]
            if not active:
                return
            # the items in use, as one contiguous run when they are (a view), else gathered per pass
            first, stop = active[0], active[-1] + 1
            view = cache.batch_items(first, stop)
            rows = [streams[i] for i in range(first, stop)]
            device = self.model.device
            tokens = torch.tensor([s.tokens[-1] if s is not None else 0 for s in rows], device=device)
            positions = torch.tensor([len(s.tokens) - 1 if s is not None else 0 for s in rows], device=device)
            hidden = decoder_rows_step(self.model.decoder, tokens, positions, view)
            logits = next_token_logits(self.model, hidden)  # (items, n_vocab)
            self.passes += 1
            self.rows += len(active)
            for offset, stream in enumerate(rows):
                if stream is None:
                    continue
                stream.take(logits[offset:offset + 1])
                if stream.done:
                    streams[first + offset] = None
                    sink(stream.key, stream.result())

    def _start(self, cache: DecoderCache, item: int, key, mel: Tensor, options: MedusaDecodingOptions) -> _Stream:
        """Open the window, put its cross-attention keys and values in ``item``, run its prompt pass
        there alone and take its first token, as a window decoded alone does (``FixedDecoder``'s first pass)."""
        model = self.model
        stream, audio_features = open_stream(model, key, mel, options)
        alone = new_cache(model.decoder, audio_features)  # its keys and values, computed for it alone
        cache.cross_attn.put(item, alone.cross_attn)
        mine = cache.batch_items(item, item + 1)
        mine.self_attn.keys.zero_(), mine.self_attn.values.zero_()  # as a fresh cache is for attention over every slot
        task = stream.task
        n = len(stream.tokens)
        positions = torch.arange(n, device=model.device)
        with rows_together():  # the prompt pass, as a window alone has it
            hidden = decoder_hidden(model.decoder, torch.tensor([stream.tokens], device=model.device), positions,
                                    mine, 0, chain_mask(0, n, model.device))
        if task.tokenizer.no_speech is not None:
            sot_logits = next_token_logits(model, hidden[:, task.sot_index])
            stream.no_speech_prob = float(sot_logits.softmax(dim=-1)[0, task.tokenizer.no_speech])
        stream.take(next_token_logits(model, hidden[0, n - 1:]))
        return stream


def refill(streams: List[Optional[_Stream]], source: Callable[[], Optional[tuple]],
           start: Callable[..., Optional[_Stream]], sink: Callable[[object, MedusaDecodingResult], None]) -> None:
    """Give every free item (None in ``streams``) the next window from ``source`` while there is one:
    ``start(item, *request)`` opens it there (None: it was decoded some other way and handed to the
    sink already); a window that ended on its prompt pass goes to the sink at once. Both batch
    decoders (this one and fixed_batched's) refill so."""
    for item in range(len(streams)):
        while streams[item] is None:
            request = source()
            if request is None:
                break
            stream = start(item, *request)
            if stream is None:
                continue
            if stream.done:  # ended on its prompt pass (end-of-text first, or no room)
                sink(stream.key, stream.result())
            else:
                streams[item] = stream


def open_stream(model: Whisper, key, mel: Tensor, options: MedusaDecodingOptions) -> Tuple[_Stream, Tensor]:
    """A window's stream before its first pass: whisper's task for it, its encoder output (computed
    alone), its language (given or detected), filters and stopping rule; and the encoder output."""
    options = as_medusa_options(options)
    task = DecodingTask(model, options)
    began = time.perf_counter()
    mel = mel.unsqueeze(0) if mel.ndim == 2 else mel
    audio_features = task._get_audio_features(mel)
    encode_seconds = time.perf_counter() - began
    initial = torch.tensor([task.initial_tokens])
    languages, language_probs = task._detect_language(audio_features, initial)
    common = dict(audio_features=audio_features[0], language=languages[0],
                  language_probs=language_probs[0] if language_probs else None)
    limit = min(task.sample_begin + task.sample_len, task.n_ctx + 1)
    stream = _Stream(key, task, options, common, window_filters(task, options), initial[0].tolist(), limit,
                     encode_seconds, time.perf_counter())
    return stream, audio_features


# -- the default batch size, measured on the running machine ---------------------------------------------

BATCH_SIZES = (1, 2, 4, 8, 16)  # the sizes timed; more streams cost memory (16: about +30 % for base)
CONTEXT = 60  # cached tokens per stream in the timed pass: about the middle of a window's text
NEAR_BEST = 1.05  # of the sizes whose token costs at most this much over the cheapest, the smallest is taken
GAIN = 1.10  # and only where a token then costs at least this much less than decoded alone


def token_costs(model: Whisper, sizes: Sequence[int] = BATCH_SIZES) -> Dict[int, float]:
    """Microseconds per token of a batched greedy pass (every stream one token at its own position,
    after CONTEXT cached tokens, the vocabulary projection included) at each batch size: measured
    once per machine, model shape and compute type, and kept with the kernel routes (routes.py).
    Each size is timed in ROUNDS rounds alternating with the others, and its fastest round counts,
    so that a burst of load elsewhere does not decide."""
    dims = model.dims
    name = (f"batched pass {compute_type_of(model)} {dims.n_text_layer}x{dims.n_text_state} "
            f"vocab {dims.n_vocab} sizes {','.join(map(str, sizes))}")

    @torch.no_grad()
    def measure() -> Dict[str, float]:
        passes = {b: _timed_pass(model, b) for b in sizes}
        best = {b: float("inf") for b in sizes}
        for _ in range(ROUNDS):
            for b, run in passes.items():
                best[b] = min(best[b], median_micros(run) / b)
        return {str(b): t for b, t in best.items()}
    return {int(k): v for k, v in routes_table().costs(name, measure).items()}


def _timed_pass(model: Whisper, batch: int) -> Callable[[], Tensor]:
    """One batched pass of ``batch`` streams over a cache of CONTEXT tokens (values do not change the time)."""
    cache = BatchDecoder(model, batch)._empty_cache()
    device = model.device
    tokens = torch.zeros(batch, dtype=torch.long, device=device)
    positions = torch.full((batch,), CONTEXT, dtype=torch.long, device=device)
    for position in range(0, CONTEXT, 20):  # fill the slots the timed pass attends to
        decoder_rows_step(model.decoder, tokens, torch.full_like(positions, position), cache)
    return lambda: next_token_logits(model, decoder_rows_step(model.decoder, tokens, positions, cache))


def default_batch_size(model: Whisper, sizes: Optional[Sequence[int]] = None) -> int:
    """How many files' windows share a pass when the user does not say: from ``token_costs`` on
    this machine, the smallest size within NEAR_BEST of the cheapest token, or 1 where batching does
    not make a token GAIN times cheaper. A measured choice, so that no default is slower than
    decoding one file after another on whatever CPU runs it."""
    return choose_batch_size(token_costs(model, sizes or BATCH_SIZES))


def measured_choices() -> List[str]:
    """What this machine measured and chose, for a bench to print: the kernel routes and kernels
    (routes.py) and, for each model measured batched, the default batch size and its token costs."""
    table = routes_table()
    lines = table.describe()
    for name, entry in sorted(table.choices.items()):
        if name.startswith("batched pass "):
            costs = {int(k): v for k, v in entry["us"].items()}
            lines.append(f"  default --batch-size for several files ({name[len('batched pass '):]}): "
                         f"{choose_batch_size(costs)}")
    return lines


def choose_batch_size(costs: Dict[int, float]) -> int:
    best = min(costs.values())
    size = min(b for b, cost in costs.items() if cost <= NEAR_BEST * best)
    return size if size > 1 and costs[size] * GAIN <= costs[1] else 1


def decode_windows(model: Whisper, windows: Iterable[Tuple[object, Tensor, MedusaDecodingOptions]],
                   batch_size: int) -> Iterator[Tuple[object, MedusaDecodingResult]]:
    """Decode independent windows (key, log-Mel, options) side by side; yields (key, result) as they end."""
    pending = iter(windows)
    finished: List[Tuple[object, MedusaDecodingResult]] = []
    decoder = BatchDecoder(model, batch_size)
    decoder.run(lambda: next(pending, None), lambda key, result: finished.append((key, result)))
    yield from finished
