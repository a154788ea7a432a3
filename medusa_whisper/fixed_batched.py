"""Greedy decoding of many windows side by side, on every device: one pass advances every stream
by a token.

A decoder pass is bound by reading weights; a pass over B streams reads them once. Every batch item
holds one window's stream (its own audio's cross-attention keys and values, its own self-attention
slots, position, rules, prompt and stopping rule) at its own position. A pass advances the items
by one token (``logit_rules.DeviceRules`` with each item's own settings), writes the greedy tokens
into the items' histories and advances the lengths of the items in use; the host reads the batch's
tokens and log-probabilities at once, ends the streams that said end-of-text or reached their
limit, and starts waiting windows in the free items at once (continuous batching: their encoder
pass and prompt pass on that item alone).

The step is the fixed-shape one on CUDA (``step.FixedStep`` over every item, one pass captured as
a CUDA graph for the whole batch) and the CPU's own elsewhere (``cpu_step.CpuBatchStep``: the
pass covers the items from the first in use to the last, whose int8 attention and products give a
stream the bits it gets alone). So each window's result is the one ``decoding.decode`` gives it
alone with ``mode="off"`` (and so with ``lossless``): bit for bit at int8 on the CPU; float32's
products do not promise that, and there a batched window may differ in the last bits of its
logits, and rarely in a token.

Greedy only (``batched.batchable``). Used by ``transcribe_many`` (``--batch-size``, ``--vad-chunks``,
several files). Departs from whisper (``whisper.decode`` on a batch of windows runs them in lock
step, with the same prompt, until the longest ends): windows of different files, prompts and
lengths share passes.
"""

from __future__ import annotations

from typing import Callable, Iterable, Iterator, List, Optional, Tuple

import torch
import torch.nn.functional as F
from torch import Tensor
from whisper.model import Whisper

from . import fixed_decoding
from .batched import _Stream, open_stream, refill, replace_mode
from .candidates import on_fixed_step
from .cpu_step import CpuBatchStep
from .decoding import MedusaDecodingResult, decode
from .logit_rules import DeviceRules, RuleSettings
from .options import MedusaDecodingOptions
from .step import FixedStep

Source = Callable[[], Optional[Tuple[object, Tensor, MedusaDecodingOptions]]]
Sink = Callable[[object, MedusaDecodingResult], None]


class FixedBatchDecoder:
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
        self.rules: Optional[DeviceRules] = None
        self.run_pass: Optional[Callable[[], None]] = None
        self.graphs: List["torch.cuda.CUDAGraph"] = []
        self.passes = 0  # batched passes, for the statistics
        self.rows = 0  # streams advanced, summed over those passes
        self.host_reads = 0

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
            if self.capture or fixed_decoding.step_choice() == "compiled":
                device = self.device if self.capture else torch.device("cpu")
                self.run_pass = fixed_decoding.program(self._pass, device, (self.history, self.length), self.graphs)
        self.run_pass()

    # ------------------------------------------------------------------------------------------- host

    @torch.no_grad()
    def run(self, source: Source, sink: Sink) -> None:
        streams: List[Optional[_Stream]] = [None] * self.batch_size
        while True:
            # a window _start decodes alone comes back as None, already in the sink
            refill(streams, source, lambda item, *request: self._start(item, sink, *request), sink)
            active = [i for i, s in enumerate(streams) if s is not None]
            if not active:
                return
            self._run_pass(active)
            self.host_reads += 1
            values = self.out.tolist()
            self.passes += 1
            self.rows += len(active)
            for item in active:
                stream = streams[item]
                token, logprob = values[item]
                stream.tokens.append(int(token))
                stream.sum_logprob += logprob
                stream.steps += 1
                if stream.done:
                    streams[item] = None
                    self.active[item:item + 1].fill_(0)
                    sink(stream.key, stream.result())

    def _start(self, item: int, sink: Sink, key, mel: Tensor, options: MedusaDecodingOptions) -> Optional[_Stream]:
        """Open the window in ``item``: its encoder output into the item's buffers, its rules, and its
        prompt pass on the item alone, which gives its first token. A window whose filters the device
        rules do not have (or not of the batch's structure) is decoded alone by ``decoding.decode``
        and handed to ``sink`` here; returns None then."""
        stream, features = open_stream(self.model, key, mel, options)
        task = stream.task
        if self.step is None:
            make = FixedStep if self.products == "fixed" else CpuBatchStep
            self.step = make(self.model, self.batch_size, features.dtype, self.device)
        settings = RuleSettings.of(stream.filters, self.step.vocabulary.shape[0])
        if self.rules is None and settings is not None:
            self.rules = DeviceRules(settings, self.device, self.batch_size)
        if settings is None or settings.key != self.rules.key:
            sink(key, decode(self.model, features[0], replace_mode(stream.options)))
            return None
        self.rules.load(settings, item)
        self.step.set_audio(features, item)
        tokens = stream.tokens
        n = len(tokens)
        history = self.history[item:item + 1]
        history.zero_()
        history[0, :n] = torch.tensor(tokens, device=self.device)
        positions = torch.arange(n, device=self.device)[None]
        hidden = self.step.prompt(history[:, :n], item)
        # each row alone, as a window decoded alone projects them
        first = self.step.logits(hidden[:, task.sot_index:task.sot_index + 1])
        last = self.step.logits(hidden[:, n - 1:n])
        no_speech = task.tokenizer.no_speech
        speech = first[:, 0].softmax(dim=-1)[:, no_speech] if no_speech is not None else first.new_zeros(1)
        last = self.rules.apply(last, history, positions[:, -1:] + 1, item=item)
        greedy = last.argmax(dim=-1)
        logprob = F.log_softmax(last, dim=-1).gather(-1, greedy[..., None])[..., 0]
        history[:, n] = greedy[:, 0]
        self.length[item:item + 1].fill_(n + 1)
        self.active[item:item + 1].fill_(1)
        self.host_reads += 1
        first, first_logprob, speech_prob = torch.cat([greedy[0].double(), logprob[0].double(),
                                                       speech.double()]).tolist()
        stream.tokens.append(int(first))
        stream.sum_logprob += first_logprob
        stream.steps += 1
        if no_speech is not None:
            stream.no_speech_prob = speech_prob
        if stream.done:
            self.active[item:item + 1].fill_(0)
        return stream


def batch_decoder(model: Whisper, batch_size: int) -> FixedBatchDecoder:
    """The decoder of several windows side by side for ``model``: on the fixed-shape step where
    ``fixed_decoding.wanted`` (CUDA) and the model's decoder allows it, else on the CPU's products."""
    return FixedBatchDecoder(model, batch_size)


def decode_windows(model: Whisper, windows: Iterable[Tuple[object, Tensor, MedusaDecodingOptions]],
                   batch_size: int) -> Iterator[Tuple[object, MedusaDecodingResult]]:
    """Decode independent windows (key, log-Mel, options) side by side; yields (key, result) as they end."""
    pending = iter(windows)
    finished: List[Tuple[object, MedusaDecodingResult]] = []
    decoder = batch_decoder(model, batch_size)
    decoder.run(lambda: next(pending, None), lambda key, result: finished.append((key, result)))
    yield from finished
