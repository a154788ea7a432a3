"""Greedy decoding of many windows side by side, on every device: one pass advances every stream
by a token.

A decoder pass is bound by reading weights; a pass over B streams reads them once. Every batch item
holds one window's stream (its own audio's cross-attention keys and values, its own self-attention
slots, position, rules, prompt and stopping rule) at its own position. A pass advances the items
by one token (``rules.DeviceRules`` with each item's own settings), writes the greedy tokens
into the items' histories and advances the lengths of the items in use; the host reads the batch's
tokens and log-probabilities at once, ends the streams that said end-of-text or reached their
limit, and starts waiting windows in the free items at once (continuous batching: their encoder
pass and prompt pass on that item alone).

The step is the fixed-shape one on CUDA (``step.fixed.FixedStep`` over every item, one pass captured as
a CUDA graph for the whole batch) and the same step over the CPU's products elsewhere (``step.cpu.cpu_step``:
the pass covers the items from the first in use to the last, whose int8 attention and products give a
stream the bits it gets alone). So each window's result is the one ``decoding.decode`` gives it
alone with ``mode="off"`` (and so with ``lossless``): bit for bit at int8 on the CPU; float32's
products do not promise that, and there a batched window may differ in the last bits of its
logits, and rarely in a token.

Greedy only (``batches.batchable``). Used by ``transcribe_many`` (``--batch-size``, ``--vad-chunks``,
several files). Departs from whisper (``whisper.decode`` on a batch of windows runs them in lock
step, with the same prompt, until the longest ends): windows of different files, prompts and
lengths share passes.

Beside the loop, what batches share: which windows may be batched (``batchable``), a window's stream
from its opening to its result, the refilling of free batch items, and the default batch size,
measured on the running machine (``default_batch_size``).
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass
from typing import Callable, Dict, Iterable, Iterator, List, Optional, Sequence, Tuple

import torch
import torch.nn.functional as F
from torch import Tensor
from whisper.decoding import DecodingTask
from whisper.model import Whisper
from whisper.tokenizer import get_tokenizer

from . import loop
from .candidates import on_fixed_step
from .encoder_graph import audio_features as audio_features_of
from ..step.compute import compute_type_of
from ..step.cpu import step_on
from .window import MedusaDecodingResult, decode, window_filters, window_result
from ..drafting.base import ProposerStats
from .loop import Generation
from .rules import DeviceRules, RuleSettings
from ..options import MedusaDecodingOptions, as_medusa_options
from ..step.routes import announce, table as routes_table
from ..step.together import rows_together

log = logging.getLogger(__name__)


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
           start: Callable[..., Optional[_Stream]], sink: Callable[[object, MedusaDecodingResult], None],
           width: Optional[int] = None) -> None:
    """Give every free item (None in ``streams``) below ``width`` (default: all) the next window from
    ``source`` while there is one: ``start(item, *request)`` opens it there (None: it was decoded some
    other way and handed to the sink already); a window that ended on its prompt pass goes to the
    sink at once."""
    for item in range(len(streams) if width is None else min(width, len(streams))):
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
    audio_features = audio_features_of(task, mel)  # captured on CUDA (encoder_graph.py)
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

BATCH_SIZES = (1, 4, 8, 16)  # the sizes timed; more streams cost memory (16: about +30 % for base)
# The timed job's windows, cycled: their lengths in tokens (a few words to a long clip's text), so
# that streams end at different passes and free items are refilled, as in an archive of short files.
JOB_TOKENS = (12, 40, 24, 56, 20, 48, 8, 32)
NEAR_BEST = 1.05  # of the sizes whose token costs at most this much over the cheapest, the smallest is taken
GAIN = 1.10  # and only where a token then costs at least this much less than decoded alone


BATCH_JOB_PREFIX = "batched job "  # how the batch-size choices' names begin in the routes table


def batch_job_name(model: Whisper, sizes: Sequence[int] = BATCH_SIZES) -> str:
    dims = model.dims
    return (f"{BATCH_JOB_PREFIX}{compute_type_of(model)} {dims.n_text_layer}x{dims.n_text_state} "
            f"vocab {dims.n_vocab} sizes {','.join(map(str, sizes))}")


def token_costs(model: Whisper, sizes: Sequence[int] = BATCH_SIZES) -> Dict[int, float]:
    """Microseconds per token of a whole job of windows at each batch size, as ``transcribe_many``
    runs it: at 1, each window decoded alone by ``decode`` (what ``--batch-size 1`` runs); above,
    ``size + size // 2`` windows through ``BatchDecoder``, every window's prompt pass, streams that
    end at different passes and the items refilled. Measured once per machine, model shape and
    compute type, and kept with the kernel routes (routes.py).

    A steady batched pass does not predict this: on an AVX2 EPYC it made a token 2.6x cheaper at 16
    than at 1 (7.2 against 18.5 ms), yet 45 short files took 70.3 s at 16 and 63.0 s one by one.
    The encoder is left out: every window runs it alone on either path."""
    name = batch_job_name(model, sizes)

    @torch.no_grad()
    def measure() -> Dict[str, float]:
        began = time.perf_counter()
        announce(f"timing windows side by side at {', '.join(map(str, sizes))} ({compute_type_of(model)}) on this "
                 f"machine, once")
        _job(model, 2, 2)  # a warm-up: the first passes allocate and choose kernels
        costs = {str(b): _job(model, b, max(3, b + b // 2)) for b in sizes}
        announce(f"batch width timed in {time.perf_counter() - began:.0f} s: "
                 f"{', '.join(f'{b}: {us / 1e3:.1f} ms' for b, us in costs.items())} a token "
                 f"-> {choose_batch_size({int(b): us for b, us in costs.items()})}")
        return costs
    # predicted until timed here (``medusa-whisper tune``): a recorded kind's, else costs that choose 4
    # (every recorded kind gained from 4 windows side by side; the loop narrows where a row costs more)
    default = {"1": 1.0, "4": 1.0 / (2 * GAIN)}
    return {int(k): v for k, v in routes_table().costs(name, measure, job=True, default=lambda: default).items()}


def _job(model: Whisper, batch: int, n_windows: int) -> float:
    """Microseconds per token of ``n_windows`` windows decoded at ``batch`` (1: each alone). The
    windows are random encoder outputs whose texts cannot end (end-of-text suppressed) before
    their JOB_TOKENS length: the time does not depend on the values, only on the lengths."""
    generator = torch.Generator().manual_seed(0)
    shape = (model.dims.n_audio_ctx, model.dims.n_audio_state)  # an encoder output, which decode takes for a mel
    features = torch.randn(shape, generator=generator).to(model.device)
    eot = get_tokenizer(model.is_multilingual, num_languages=model.num_languages).eot
    windows = [(i, features, MedusaDecodingOptions(language="en", fp16=False, sample_len=length,
                                                   suppress_tokens=[-1, eot]))
               for i, length in enumerate(JOB_TOKENS[i % len(JOB_TOKENS)] for i in range(n_windows))]
    began = time.perf_counter()
    if batch == 1:
        tokens = sum(len(decode(model, mel, options).tokens) for _, mel, options in windows)
    else:
        # the width held: this job is what the loop's own check compares with
        tokens = sum(len(result.tokens) for _, result in decode_windows(model, windows, batch, narrow=False))
    return (time.perf_counter() - began) * 1e6 / max(tokens, 1)


def default_batch_size(model: Whisper, sizes: Optional[Sequence[int]] = None) -> int:
    """How many files' windows share a pass when the user does not say: from ``token_costs`` (the
    whole job, timed) on this machine, the smallest size within NEAR_BEST of the cheapest token, or
    1 where batching does not make a token GAIN times cheaper than decoding alone. A measured
    choice, so that no default is slower than decoding one file after another on whatever CPU runs it."""
    return choose_batch_size(token_costs(model, sizes or BATCH_SIZES))


def measured_choices() -> List[str]:
    """What this machine measured and chose, for a bench to print: the kernel routes and kernels
    (routes.py) and, for each model measured batched, the default batch size."""
    return routes_table().describe() + measured_batch_sizes()


def measured_batch_sizes() -> List[str]:
    """For each model measured batched here: the default batch size and the token costs it came from."""
    lines = []
    for name, entry in sorted(routes_table().choices.items()):
        if name.startswith(BATCH_JOB_PREFIX):
            costs = {int(k): v for k, v in entry["us"].items()}
            timed = ", ".join(f"{size}: {us / 1e3:.1f} ms" for size, us in sorted(costs.items()))
            lines.append(f"  default --batch-size for several files ({name[len(BATCH_JOB_PREFIX):]}): {timed} a token "
                         f"-> {choose_batch_size(costs)}")
    return lines


def choose_batch_size(costs: Dict[int, float]) -> int:
    best = min(costs.values())
    size = min(b for b, cost in costs.items() if cost <= NEAR_BEST * best)
    return size if size > 1 and costs[size] * GAIN <= costs[1] else 1


# windows a width decodes (at least this many, and twice the width) before its cost is checked
NARROW_AFTER = 8


class Narrowing:
    """The batch loop's own check that a wider pass pays, while it runs.

    The batch width is chosen from a short job timed once (``token_costs``), and a job is not every
    archive: on an Intel Xeon with AVX-512 BF16 and no AMX the job made a token 2x cheaper at 16
    than at 1 (5.5 against 10.9 ms), yet 45 short files took 44.5 s at 16 and 41.8 s one at a
    time. So the loop times its own work (its passes, and each window's opening less its encoder:
    what decoding the window alone would also cost, ``spent``) and the tokens its windows gave;
    after NARROW_AFTER windows (and twice the width) it compares that cost a token with what
    decoding alone cost here (``alone_us``, the same job's width 1) and halves the width where the
    batch costs more. It checks again after every such stretch; it never widens. Only where a
    window's result does not depend on its company (int8 on the CPU: ``narrows``), so the
    width it ends at changes no output.
    """

    def __init__(self, width: int, alone_us: Optional[float]):
        self.width, self.alone_us = width, alone_us
        self.checked: List[Tuple[int, float]] = []  # (width, microseconds a token) of each stretch
        self._reset()

    def _reset(self) -> None:
        self.seconds, self.tokens, self.windows = 0.0, 0, 0

    def spent(self, seconds: float) -> None:
        self.seconds += seconds

    def window_done(self, tokens: int) -> int:
        """Count a finished window of ``tokens`` tokens; the width from now on."""
        if self.alone_us is None or self.width == 1:
            return self.width
        self.tokens += tokens
        self.windows += 1
        if self.windows >= max(NARROW_AFTER, 2 * self.width):
            cost = self.seconds * 1e6 / max(self.tokens, 1)
            self.checked.append((self.width, round(cost, 1)))
            if cost > self.alone_us:
                log.info("windows side by side at %d cost %.0f us a token, alone %.0f: narrowed to %d",
                         self.width, cost, self.alone_us, self.width // 2)
                self.width //= 2
            self._reset()
        return self.width


def narrows(model: Whisper, products: str) -> Optional[float]:
    """The cost a token of decoding alone that a batch of ``model`` is held to (``Narrowing``): the
    job's width-1 cost where the job was timed here and the batch's results do not depend on its
    width (int8 on the CPU's products); else None."""
    if products != "cpu" or compute_type_of(model) != "int8":
        return None
    entry = routes_table().choices.get(batch_job_name(model))
    return None if entry is None or "1" not in entry.get("us", {}) else float(entry["us"]["1"])


Source = Callable[[], Optional[Tuple[object, Tensor, MedusaDecodingOptions]]]
Sink = Callable[[object, MedusaDecodingResult], None]


class BatchDecoder:
    """Decodes windows greedily, up to ``batch_size`` of them side by side in one pass (see the module).

    ``run(source, sink)`` asks ``source()`` for the next window whenever a batch item is free (None:
    none waiting now) and hands each result to ``sink(key, result)``, which may make more windows
    available (the next window of a file waits for its previous one's text and end).

    products : "fixed" (the fixed-shape step, every item every pass: what CUDA captures) or "cpu"
               (the CPU's products, the items in use); default: ``batch_decoder``'s choice
    """

    def __init__(self, model: Whisper, batch_size: int, capture: Optional[bool] = None,
                 products: Optional[str] = None):
        if batch_size < 1:
            raise ValueError(f"batch size must be at least 1, not {batch_size}")
        self.model, self.batch_size = model, batch_size
        self.device = model.device
        self.products = products or ("fixed" if on_fixed_step(model) else "cpu")
        if self.products not in ("fixed", "cpu"):
            raise ValueError(f"products must be 'fixed' or 'cpu', not {self.products!r}")
        self.step = None  # made for the first window's features (their dtype)
        self.capture = self.device.type == "cuda" and self.products == "fixed" if capture is None else capture
        n_ctx = model.dims.n_text_ctx
        self.history = torch.zeros(batch_size, n_ctx + 2, dtype=torch.long, device=self.device)
        self.length = torch.ones(batch_size, dtype=torch.long, device=self.device)
        self.active = torch.zeros(batch_size, dtype=torch.long, device=self.device)  # 1 where an item is in use
        self.out = torch.zeros(batch_size, 2, dtype=torch.float64, device=self.device)
        # a window's prompt on the fixed step: its length, sot's index, the item, its tokens; one
        # program per size
        self.prompt = loop.PromptInput(3, n_ctx, self.device)
        self.prompt_programs: Dict[tuple, Tuple[Callable[[], None], Tensor]] = {}
        self.rules: Optional[DeviceRules] = None
        self.run_pass: Optional[Callable[[], None]] = None
        self.graphs: List["torch.cuda.CUDAGraph"] = []
        self.passes = 0  # batched passes, for the statistics
        self.rows = 0  # streams advanced, summed over those passes
        self.host_reads = 0
        self.narrowing = Narrowing(batch_size, narrows(model, self.products))

    def _pass(self, first: int = 0, stop: Optional[int] = None) -> None:
        """One token for each of items [first, stop) (all of them by default), each at its own position."""
        at = slice(first, self.batch_size if stop is None else stop)
        history, length = self.history[at], self.length[at]
        positions = (length - 1).clamp(0, self.step.n_ctx - 1)  # (items,)
        hidden = self.step.rows(history.gather(1, positions[:, None])[:, 0], positions, at.start, at.stop)
        logits = self.step.logits(hidden)[:, None]  # (items, 1, n_vocab)
        self.rules.apply(logits, history, positions[:, None] + 1, item=at)
        greedy = logits.argmax(dim=-1)  # (items, 1)
        logprobs = F.log_softmax(logits, dim=-1).gather(-1, greedy[..., None])[..., 0]
        history.scatter_(1, positions[:, None] + 1, greedy)
        length.add_(self.active[at])
        self.out[at].copy_(torch.cat([greedy.double(), logprobs.double()], dim=1))

    def _run_pass(self, active: List[int]) -> None:
        """The pass over the items in use: on the fixed step every item (one shape, a graph's replay
        on CUDA), on the CPU's products the items from the first in use to the last."""
        if self.products == "cpu":
            self._pass(active[0], active[-1] + 1)
            return
        if self.run_pass is None:
            self.run_pass = self._pass
            if self.capture or loop.step_choice() == "compiled":
                device = self.device if self.capture else torch.device("cpu")
                self.run_pass = loop.program(self._pass, device, (self.history, self.length), self.graphs)
        self.run_pass()

    # ------------------------------------------------------------------------------------------- host

    @torch.no_grad()
    def run(self, source: Source, sink: Sink) -> None:
        streams: List[Optional[_Stream]] = [None] * self.batch_size
        narrowing = self.narrowing
        while True:
            # a window _start decodes alone comes back as None, already in the sink
            refill(streams, source, lambda item, *request: self._start(item, sink, *request), sink, narrowing.width)
            active = [i for i, s in enumerate(streams) if s is not None]
            if not active:
                return
            began = time.perf_counter()
            self._run_pass(active)
            self.host_reads += 1
            values = self.out.tolist()
            self.passes += 1
            self.rows += len(active)
            finished = []
            for item in active:
                stream = streams[item]
                token, logprob = values[item]
                stream.tokens.append(int(token))
                stream.sum_logprob += logprob
                stream.steps += 1
                if stream.done:
                    streams[item] = None
                    self.active[item:item + 1].fill_(0)
                    finished.append(stream)
            narrowing.spent(time.perf_counter() - began)
            for stream in finished:
                narrowing.window_done(len(stream.tokens))
                sink(stream.key, stream.result())

    def _start(self, item: int, sink: Sink, key, mel: Tensor, options: MedusaDecodingOptions) -> Optional[_Stream]:
        """Open the window in ``item``: its encoder output into the item's buffers, its rules, and its
        prompt pass on the item alone, which gives its first token. A window whose filters the device
        rules do not have (or not of the batch's structure) is decoded alone by ``decoding.decode``
        and handed to ``sink`` here; returns None then."""
        began = time.perf_counter()
        stream = self._open(item, sink, key, mel, options)
        if stream is not None:  # what decoding it alone would cost too: all but its encoder
            self.narrowing.spent(time.perf_counter() - began - stream.encode_seconds)
        return stream

    def _open(self, item: int, sink: Sink, key, mel: Tensor, options: MedusaDecodingOptions) -> Optional[_Stream]:
        stream, features = open_stream(self.model, key, mel, options)
        task = stream.task
        if self.step is None:
            self.step = step_on(self.products, self.model, self.batch_size, features.dtype, self.device)
        settings = RuleSettings.of(stream.filters, self.step.vocabulary.shape[0])
        if self.rules is None and settings is not None:
            self.rules = DeviceRules(settings, self.device, self.batch_size)
        if settings is None or settings.key != self.rules.key:
            sink(key, decode(self.model, features[0], replace_mode(stream.options)))
            return None
        self.rules.load(settings, item)
        self.step.set_audio(features, item)
        no_speech = task.tokenizer.no_speech
        prompt = self._fixed_prompt if self.products == "fixed" else self._cpu_prompt
        first, first_logprob, speech_prob = prompt(item, stream.tokens, task.sot_index, no_speech)
        self.host_reads += 1
        stream.tokens.append(int(first))
        stream.sum_logprob += first_logprob
        stream.steps += 1
        if no_speech is not None:
            stream.no_speech_prob = speech_prob
        if stream.done:
            self.active[item:item + 1].fill_(0)
        return stream

    def _cpu_prompt(self, item: int, tokens: List[int], sot_index: int,
                    no_speech: Optional[int]) -> List[float]:
        """The window's prompt pass on item ``item`` of the CPU's products: its first token, that
        token's log-probability and the no-speech probability."""
        n = len(tokens)
        history = self.history[item:item + 1]
        history.zero_()
        history[0, :n] = torch.tensor(tokens, device=self.device)
        hidden = self.step.prompt(history[:, :n], item)
        length, sot = torch.tensor([n], device=self.device), torch.tensor([sot_index], device=self.device)
        greedy, logprob, _, speech = loop.first_token(self.step, self.rules, hidden, history, length, sot, no_speech,
                                                      item)
        history[:, n] = greedy[:, 0]
        self.length[item:item + 1].fill_(n + 1)
        self.active[item:item + 1].fill_(1)
        speech = torch.zeros_like(logprob[0]) if speech is None else speech
        return torch.cat([greedy[0].double(), logprob[0].double(), speech.double()]).tolist()  # one read

    def _fixed_prompt(self, item: int, tokens: List[int], sot_index: int,
                      no_speech: Optional[int]) -> List[float]:
        """``_cpu_prompt`` on the fixed-shape step: one program per size of prompt
        (``loop.prompt_rows``) for every item, the item a device value (captured on CUDA)."""
        n = len(tokens)
        self.prompt.write([n, sot_index, item], tokens)
        rows = loop.prompt_rows(n, self.step.n_ctx)
        key = (rows, no_speech)
        if key not in self.prompt_programs:
            out = torch.zeros(3, dtype=torch.float64, device=self.device)
            run = lambda: self._prompt_pass(rows, no_speech, out)  # noqa: E731
            if self.capture:
                run = loop.program(run, self.device, (self.history, self.length, self.active), self.graphs,
                                   compile=False)
            self.prompt_programs[key] = (run, out)
        run, out = self.prompt_programs[key]
        run()
        return out.tolist()

    def _prompt_pass(self, rows: int, no_speech: Optional[int], out: Tensor) -> None:
        """The prompt in ``self.prompt`` (its length, the start-of-transcript's index, the item,
        its tokens) in ``rows`` rows, as ``loop.WindowDecoder._prompt_pass`` runs a window's: the
        rows past it are padding at the positions after it, which later passes write again before
        reading. ``out``: the first token, its log-probability, the no-speech probability."""
        n, sot, item = self.prompt.field(0), self.prompt.field(1), self.prompt.field(2)
        positions = self.step.slots[:rows][None]
        row = torch.zeros_like(self.history[:1])
        row[:, :rows].copy_(self.prompt.tokens(positions, n))
        with rows_together():  # a window's prompt, computed alone in every way of decoding it
            hidden = self.step.prompt_at(row[:, :rows], positions, item)
        greedy, logprob, _, speech = loop.first_token(self.step, self.rules, hidden, row, n, sot, no_speech, item)
        row.scatter_(1, n[:, None], greedy)
        self.history.index_copy_(0, item, row)
        self.length.index_copy_(0, item, n + 1)
        self.active.index_fill_(0, item, 1)
        if speech is None:
            out[:2].copy_(torch.cat([greedy[0].double(), logprob[0].double()]))
        else:
            out.copy_(torch.cat([greedy[0].double(), logprob[0].double(), speech.double()]))


def batch_decoder(model: Whisper, batch_size: int) -> BatchDecoder:
    """The decoder of several windows side by side for ``model``: on the fixed-shape step where
    ``loop.wanted`` (CUDA) and the model's decoder allows it, else on the CPU's products."""
    return BatchDecoder(model, batch_size)


def decode_windows(model: Whisper, windows: Iterable[Tuple[object, Tensor, MedusaDecodingOptions]],
                   batch_size: int, narrow: bool = True) -> Iterator[Tuple[object, MedusaDecodingResult]]:
    """Decode independent windows (key, log-Mel, options) side by side; yields (key, result) as they
    end. ``narrow``: False keeps the width (``Narrowing``) whatever it costs."""
    pending = iter(windows)
    finished: List[Tuple[object, MedusaDecodingResult]] = []
    decoder = batch_decoder(model, batch_size)
    if not narrow:
        decoder.narrowing.alone_us = None
    decoder.run(lambda: next(pending, None), lambda key, result: finished.append((key, result)))
    yield from finished
