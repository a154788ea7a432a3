"""Sampling with ``best_of`` candidates and beam search, run on this package's decoder step.

whisper's temperature fallback decodes a failed window again at temperatures 0.2 ... 1.0, each time
with ``best_of`` sampled candidates (or ``beam_size`` beams at temperature 0). Its ``DecodingTask``
repeats the audio features once per candidate, grows a hook cache by concatenation every token, and
projects every prompt position onto the vocabulary on its first pass: with a 200-token prompt and
five candidates that first pass alone multiplies 1,000 rows by the 51,865-word embedding.

Here whisper's own ``DecodingTask`` still does everything that decides what is written (its token
decoders, sampling, beam search with patience, logit filters, sum-logprob and length-penalty
ranking, result fields); only the decoder passes are ours, one ``Inference`` over the one decoder
step (``step.fixed.FixedStep``) with a batch item per candidate (``_Rows``), kept on the model for
later windows: every pass after the prompt adds each row's last token at the one position all rows
share (whisper's rows are always of one length), from static buffers into a static logits buffer;
beam search's reordering gathers the filled slots in place. Over the step's products:

- the fixed-shape ones (CUDA, or ``MEDUSA_WHISPER_STEP=fixed``): the prompt pass uncaptured, every
  later pass captured once per rows count on CUDA; each row reads its own copy of the audio's
  cross-attention keys and values;
- the CPU's: the audio's keys and values stored once and read by all of its candidates in one
  product (``step.cpu.CpuAttention.cross_attention``); a converted model runs the prompt, which
  whisper repeats in every row, once, and copies its keys and values.

Both project only the two prompt positions whisper reads (the start-of-transcript token's, for the
no-speech probability, and the last one's) and, for a Medusa model with a base head, the logits
greedy decoding uses (``heads.base_state``), which whisper's decoder would not apply.

A window's candidates are only ever computed together, so their passes run inside
``rows_together`` (one cross-attention product for all of them, among others).

Differs from whisper: the logits are the package's (same float32 math, other kernels), so a sampled
candidate draws from the same distribution but not necessarily the same bits; the draws themselves
are the ones whisper's ``Categorical.sample`` takes from torch's global generator, made without
its serial loop (``draws.py``, ``SampledTokens``).
"""

from __future__ import annotations

from typing import Callable, List, Optional, Tuple

import numpy as np
import torch
import torch.nn.functional as F
from torch import Tensor
from torch.distributions import Categorical
from whisper.decoding import (BeamSearchDecoder, DecodingOptions, DecodingResult, DecodingTask, GreedyDecoder,
                              Inference)
from whisper.model import Whisper

from . import loop
from .draws import multinomial_one
from .rules import DeviceRules, whisper_rules_first
from ..step.compute import compute_type_of
from ..step.cpu import step_on
from ..step.together import rows_together


def on_fixed_step(model: Whisper) -> bool:
    """Whether the candidates of ``model`` decode on the fixed-shape step: where greedy decoding
    would (``loop.wanted``: CUDA, or ``MEDUSA_WHISPER_STEP``) and the step has the model's
    decoder; not for a model whose next-token logits go through a Medusa head (``base_head``)."""
    return loop.wanted(model.device) and loop.step_takes(model)


class _Rows:
    """The one step for ``rows`` sequences (``step.fixed.FixedStep``, a batch item per row) and the
    buffers its later passes read and write: kept on the model between decodings (on CUDA its
    graph with it)."""

    def __init__(self, model, rows: int, residual: torch.dtype, device: torch.device, products: str):
        self.model = model
        self.step = step_on(products, model, rows, residual, device)
        self.tokens = torch.zeros(rows, 1, dtype=torch.long, device=device)
        self.positions = torch.zeros(rows, 1, dtype=torch.long, device=device)
        self.out = torch.zeros(rows, self.step.vocabulary.shape[0], dtype=torch.float32, device=device)
        self.graphs: List["torch.cuda.CUDAGraph"] = []
        self.run: Optional[Callable[[], None]] = None
        self.length = 0  # tokens in the cache

    def prompt(self, tokens: Tensor, audio_features: Tensor, rows_per_audio: int) -> Tensor:
        """The prompt pass's states, shape = (rows, n, n_state), uncaptured (its length is the
        prompt's), its rows together; the audio's cross-attention keys and values computed once."""
        k = rows_per_audio
        # one row per audio (whisper repeats only the tokens), or one per row (repeated)
        audio = audio_features if audio_features.shape[0] * k == tokens.shape[0] else audio_features[::k]
        self.step.set_audio(audio, repeat=k)
        n = tokens.shape[1]
        self.length = n
        positions = torch.arange(n, device=tokens.device)
        with rows_together():
            if self._one_prompt(tokens, k):
                return self._prompt_once(tokens)
            return self.step(tokens, positions.expand(tokens.shape[0], n))

    def _one_prompt(self, tokens: Tensor, k: int) -> bool:
        """Whether the prompt pass's rows are one audio's candidates, all with the same prompt (whisper
        repeats it best_of or beam_size times), on the CPU's products of a converted model: there the
        prompt runs once (``_prompt_once``). A float32 model computes every copy, as whisper does, so
        that its sampled retries stay whisper's to the last bit."""
        return (not self.step.products.fixed_shapes and k > 1 and tokens.shape[0] == k
                and compute_type_of(self.model) != "float32" and bool((tokens == tokens[:1]).all()))

    def _prompt_once(self, tokens: Tensor) -> Tensor:
        """The prompt pass over one copy of the prompt, its keys and values then copied to every
        candidate's slots: best_of 5 paid five prompt passes of up to 224 rows (0.45 s of base int8
        on one core) for one set of numbers."""
        hidden = self.step.prompt(tokens[:1], 0)
        self.reorder(torch.zeros(tokens.shape[0], dtype=torch.long, device=tokens.device))
        return hidden.expand(tokens.shape[0], -1, -1)

    def next(self, tokens: Tensor) -> Tensor:
        """The next-token logits of every row's last token, shape = (rows, 1, n_vocab): with fixed
        shapes the static buffer the next pass overwrites (whisper's filters and token decoders use
        it before then)."""
        if tokens.shape[1] != self.length + 1:
            raise ValueError(f"a pass adds one token per row: {self.length} in the cache, {tokens.shape[1]} given")
        self.tokens.copy_(tokens[:, -1:])
        self.positions.fill_(self.length)
        self.program()()
        self.length += 1
        return self.out[:, None]

    def _pass(self) -> None:
        """Every row's last token at its position; the next-token logits into ``self.out``. A
        window's candidates (best_of samples, beams) go through every pass together, in every way
        the window is decoded, as its prompt pass does: so their passes take the kernels made for
        rows computed together (together.py), e.g. one cross-attention product over the audio's keys
        for all candidates, where rows alone read its 1,500 keys once per candidate."""
        if self.step.products.fixed_shapes:  # into the buffer a captured pass writes (no context to trace)
            self.out.copy_(self.step.logits(self.step(self.tokens, self.positions)[:, 0]))
            return
        with rows_together():
            self.out = self.step.logits(self.step(self.tokens, self.positions)[:, 0])

    def program(self) -> Callable[[], None]:
        """The pass as a callable: with fixed shapes, captured (CUDA) or compiled
        (``MEDUSA_WHISPER_STEP=compiled``) on first use. The warm-up runs it for real: it writes the
        cache slot the pass writes anyway."""
        if self.run is None:
            device = self.step.device
            capture = device.type == "cuda"
            self.run = self._pass
            if self.step.products.fixed_shapes and (capture or loop.step_choice() == "compiled"):
                self.run = loop.program(self._pass, device if capture else torch.device("cpu"), (),
                                        self.graphs)
        return self.run

    def logits(self, states: Tensor) -> Tensor:
        return self.step.logits(states)

    def reorder(self, index: Tensor) -> None:
        """Row b's slots become row ``index[b]``'s (beam search keeps the best beams, some of them twice)."""
        for cache in (self.step.keys, self.step.values):  # (layer, row, head, slot, d): the filled slots only
            filled = cache[:, :, :, : self.length]
            filled.copy_(filled.index_select(1, index))


class CandidatesInference(Inference):
    """whisper's ``Inference`` over the package's step, one row per candidate.

    ``rows_per_audio`` (whisper's ``n_group``: best_of or beam_size) rows of the token batch belong to
    each audio, consecutively, as ``DecodingTask.run`` repeats them. ``products``: "fixed" (the
    fixed-shape step) or "cpu" (the CPU's products); default: ``on_fixed_step``.
    """

    def __init__(self, model: Whisper, rows_per_audio: int, products: Optional[str] = None):
        self.model = model
        self.rows_per_audio = rows_per_audio
        self.products = products or ("fixed" if on_fixed_step(model) else "cpu")
        self.rows = None  # this decoding's rows, made on its prompt pass
        self.passes = 0

    def _rows(self, batch: int, audio_features: Tensor) -> _Rows:
        # per products ("fixed_candidate_steps", "cpu_candidate_steps"); not a submodule: no state dict
        steps = self.model.__dict__.setdefault(f"{self.products}_candidate_steps", {})
        key = (audio_features.device, audio_features.dtype, batch, loop.step_choice())
        if key not in steps:
            steps[key] = _Rows(self.model, batch, audio_features.dtype, audio_features.device, self.products)
        return steps[key]

    def _logits(self, tokens: Tensor, audio_features: Tensor, wanted: Optional[List[int]]) -> Tensor:
        """Logits at the new positions ``wanted`` (indices into them; None: all) of the prompt pass,
        or at the one new position of a later pass."""
        self.passes += 1
        if self.rows is not None:
            return self.rows.next(tokens)
        self.rows = self._rows(tokens.shape[0], audio_features)
        hidden = self.rows.prompt(tokens, audio_features, self.rows_per_audio)
        return self.rows.logits(hidden if wanted is None else hidden[:, wanted])

    def logits(self, tokens: Tensor, audio_features: Tensor) -> Tensor:
        """whisper's interface: logits at every new position (what ``next_logits`` avoids)."""
        return self._logits(tokens, audio_features, None)

    def next_logits(self, tokens: Tensor, audio_features: Tensor, sot_index: Optional[int]
                    ) -> Tuple[Tensor, Optional[Tensor]]:
        """Logits at the last position (batch, n_vocab), and on the prompt pass also at ``sot_index``
        (None: not wanted), projecting only those rows."""
        if self.rows is None:
            n = tokens.shape[1]
            wanted = [n - 1] if sot_index is None else [sot_index, n - 1]
            logits = self._logits(tokens, audio_features, wanted)
            return logits[:, -1], (logits[:, 0] if len(wanted) == 2 else None)
        return self._logits(tokens, audio_features, None)[:, -1], None

    def rearrange_kv_cache(self, source_indices) -> None:
        if self.rows is not None and list(source_indices) != list(range(len(source_indices))):
            self.rows.reorder(torch.as_tensor(source_indices, device=self.model.device))

    def cleanup_caching(self) -> None:
        self.rows = None


class SampledTokens(GreedyDecoder):
    """whisper's ``GreedyDecoder``, whose draw at a temperature above 0 is ``draws.multinomial_one``:
    the tokens ``Categorical(...).sample()`` draws from the same generator state, in half the time or less."""

    def update(self, tokens: Tensor, logits: Tensor, sum_logprobs: Tensor) -> Tuple[Tensor, Tensor]:
        if self.temperature == 0:
            return super().update(tokens, logits, sum_logprobs)
        probs = Categorical(logits=logits / self.temperature).probs  # the distribution whisper samples
        chosen = multinomial_one(probs.reshape(-1, probs.shape[-1]))[:, 0]
        # whisper's bookkeeping: a finished row adds nothing to its sum and repeats end-of-text
        ended = tokens[:, -1] == self.eot
        logprobs = F.log_softmax(logits.float(), dim=-1)
        sum_logprobs += logprobs[torch.arange(logprobs.shape[0]), chosen] * ~ended
        chosen[ended] = self.eot
        tokens = torch.cat([tokens, chosen[:, None]], dim=-1)
        return tokens, (tokens[:, -1] == self.eot).all()


class StepDecodingTask(DecodingTask):
    """whisper's ``DecodingTask`` whose decoder passes are ``CandidatesInference``'s."""

    def __init__(self, model: Whisper, options: DecodingOptions):
        super().__init__(model, options)
        if type(self.decoder) is GreedyDecoder:
            self.decoder = SampledTokens(self.decoder.temperature, self.decoder.eot)
        # whisper's filters as the package's rules, every row at once (rules.py)
        self.logit_filters = whisper_rules_first(
            self.logit_filters, lambda whispers: DeviceRules.of(whispers, model.dims.n_vocab, model.device))
        self.inference = CandidatesInference(model, self.n_group)
        if isinstance(self.decoder, BeamSearchDecoder):
            self.decoder.inference = self.inference

    def _main_loop(self, audio_features: Tensor, tokens: Tensor):
        """whisper's ``_main_loop`` line for line, except that the first pass projects only the two
        positions it reads (``CandidatesInference.next_logits``)."""
        n_batch = tokens.shape[0]
        sum_logprobs: Tensor = torch.zeros(n_batch, device=audio_features.device)
        no_speech_probs = [np.nan] * n_batch
        wants_no_speech = self.tokenizer.no_speech is not None
        try:
            for i in range(self.sample_len):
                logits, sot_logits = self.inference.next_logits(
                    tokens, audio_features, self.sot_index if i == 0 and wants_no_speech else None)
                if sot_logits is not None:
                    no_speech_probs = sot_logits.float().softmax(dim=-1)[:, self.tokenizer.no_speech].tolist()
                for logit_filter in self.logit_filters:
                    logit_filter.apply(logits, tokens)
                tokens, completed = self.decoder.update(tokens, logits, sum_logprobs)
                if completed or tokens.shape[-1] > self.n_ctx:
                    break
        finally:
            self.inference.cleanup_caching()
        return tokens, sum_logprobs, no_speech_probs


def decode_candidates(model: Whisper, mel: Tensor, options: DecodingOptions) -> Tuple[List[DecodingResult], int]:
    """Sampling (temperature > 0, ``best_of`` candidates) or beam search (``beam_size``) of a batch of
    windows, with whisper's semantics, on the package's step: whisper's results and the number of
    decoder passes. mel : (batch, n_mels, 3000), or the encoder's output."""
    task = StepDecodingTask(model, options)
    results = task.run(mel)
    return results, task.inference.passes
