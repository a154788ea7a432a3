"""What windows decoded side by side share: which windows may be batched, a window's stream from
its opening to its result, the refilling of free batch items, and the default batch size, measured
on the running machine. The batch loop itself is ``fixed_batched.FixedBatchDecoder``, on every device.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Callable, Dict, List, Optional, Sequence, Tuple

import torch
from torch import Tensor
from whisper.decoding import DecodingTask
from whisper.model import Whisper

from .compute import compute_type_of
from .cpu_step import CpuBatchStep
from .decoding import MedusaDecodingResult, window_filters, window_result
from .drafting.base import ProposerStats
from .fixed_decoding import Generation
from .options import MedusaDecodingOptions, as_medusa_options
from .routes import ROUNDS, median_micros, table as routes_table


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

    def result(self) -> MedusaDecodingResult:
        gen = Generation(self.tokens, self.sum_logprob, self.no_speech_prob, self.steps)
        return window_result(self.task, replace_mode(self.options), self.common, gen, ProposerStats(),
                             self.encode_seconds, time.perf_counter() - self.began)


def replace_mode(options: MedusaDecodingOptions) -> MedusaDecodingOptions:
    return as_medusa_options(options, mode="off")


def refill(streams: List[Optional[_Stream]], source: Callable[[], Optional[tuple]],
           start: Callable[..., Optional[_Stream]], sink: Callable[[object, MedusaDecodingResult], None]) -> None:
    """Give every free item (None in ``streams``) the next window from ``source`` while there is one:
    ``start(item, *request)`` opens it there (None: it was decoded some other way and handed to the
    sink already); a window that ended on its prompt pass goes to the sink at once."""
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
    step = CpuBatchStep(model, batch, device=model.device)
    device = model.device
    tokens = torch.zeros(batch, dtype=torch.long, device=device)
    positions = torch.full((batch,), CONTEXT, dtype=torch.long, device=device)
    for position in range(0, CONTEXT, 20):  # fill the slots the timed pass attends to
        step.rows(tokens, torch.full_like(positions, position), 0, batch)
    return lambda: step.logits(step.rows(tokens, positions, 0, batch))


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
