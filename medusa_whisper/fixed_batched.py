"""Greedy decoding of many windows side by side on the device: ``batched.BatchDecoder`` with the
fixed-shape step, one pass captured as a CUDA graph for the whole batch, and one host read per pass.

Every batch item holds one window's stream at its own position. A pass advances every item by one
token (step.FixedStep over (batch, 1) rows, each at its position; logit_rules.DeviceRules with each
item's own settings), writes the greedy tokens into the items' histories and advances the lengths
of the items in use; the host reads the batch's tokens and log-probabilities at once, ends the
streams that said end-of-text or reached their limit, and starts waiting windows in the free items
(their encoder pass and prompt pass uncaptured, on that item alone). Items not in use are computed
with the rest (a graph has one shape) and ignored.

Greedy only, as ``BatchDecoder`` (``batched.batchable``). Used on CUDA by ``transcribe_many``
(``--batch-size``, ``--vad-chunks``, several files); ``MEDUSA_WHISPER_STEP=fixed`` uses it on the
CPU as well (tests compare its results with each window decoded alone).
"""

from __future__ import annotations

from typing import Callable, List, Optional, Tuple

import torch
import torch.nn.functional as F
from torch import Tensor
from whisper.model import Whisper

from . import fixed_candidates, fixed_decoding
from .batched import BatchDecoder, _Stream, open_stream, refill, replace_mode
from .decoding import MedusaDecodingResult, decode
from .logit_rules import DeviceRules, RuleSettings
from .options import MedusaDecodingOptions
from .step import FixedStep

Source = Callable[[], Optional[Tuple[object, Tensor, MedusaDecodingOptions]]]
Sink = Callable[[object, MedusaDecodingResult], None]


class FixedBatchDecoder:
    """``BatchDecoder``'s ``run(source, sink)`` over the fixed-shape step (see the module)."""

    def __init__(self, model: Whisper, batch_size: int, capture: Optional[bool] = None):
        if batch_size < 1:
            raise ValueError(f"batch size must be at least 1, not {batch_size}")
        self.model, self.batch_size = model, batch_size
        self.device = model.device
        self.step: Optional[FixedStep] = None  # made for the first window's features (their dtype)
        self.capture = self.device.type == "cuda" if capture is None else capture
        n_ctx = model.dims.n_text_ctx
        self.history = torch.zeros(batch_size, n_ctx + 2, dtype=torch.long, device=self.device)
        self.length = torch.ones(batch_size, dtype=torch.long, device=self.device)
        self.active = torch.zeros(batch_size, dtype=torch.long, device=self.device)  # 1 where an item is in use
        self.out = torch.zeros(batch_size, 2, dtype=torch.float64, device=self.device)
        self.rules: Optional[DeviceRules] = None
        self.run_pass: Optional[Callable[[], None]] = None
        self.graphs: List["torch.cuda.CUDAGraph"] = []
        self.passes = 0  # batched passes, for the statistics (as BatchDecoder's)
        self.rows = 0  # streams advanced, summed over those passes
        self.host_reads = 0

    def _pass(self) -> None:
        """One token for every item, each at its own position."""
        positions = (self.length - 1).clamp(0, self.step.n_ctx - 1)[:, None]  # (batch, 1)
        hidden = self.step(self.history.gather(1, positions), positions)
        logits = self.step.logits(hidden)
        self.rules.apply(logits, self.history, positions + 1)
        greedy = logits.argmax(dim=-1)  # (batch, 1)
        logprobs = F.log_softmax(logits, dim=-1).gather(-1, greedy[..., None])[..., 0]
        self.history.scatter_(1, positions + 1, greedy)
        self.length.add_(self.active)
        self.out.copy_(torch.cat([greedy.double(), logprobs.double()], dim=1))

    def _ready(self) -> Callable[[], None]:
        if self.run_pass is None:
            self.run_pass = self._pass
            if self.capture or fixed_decoding.step_choice() == "compiled":
                device = self.device if self.capture else torch.device("cpu")
                self.run_pass = fixed_decoding.program(self._pass, device, (self.history, self.length), self.graphs)
        return self.run_pass

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
            self._ready()()
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
            self.step = FixedStep(self.model, self.batch_size, features.dtype, self.device)
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
        hidden = self.step(history[:, :n], positions, item=item)
        logits = self.step.logits(hidden[:, [task.sot_index, n - 1]])
        no_speech = task.tokenizer.no_speech
        speech = logits[:, 0].softmax(dim=-1)[:, no_speech] if no_speech is not None else logits.new_zeros(1)
        last = self.rules.apply(logits[:, 1:], history, positions[:, -1:] + 1, item=item)
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


def batch_decoder(model: Whisper, batch_size: int):
    """The decoder of several windows side by side for ``model``: the fixed-shape one where
    ``fixed_decoding.wanted`` (CUDA) and the model's decoder allows it, else ``BatchDecoder``."""
    if fixed_candidates.wanted(model, model.device):  # the same condition as the fallback's candidates
        return FixedBatchDecoder(model, batch_size)
    return BatchDecoder(model, batch_size)
