"""Sampling with ``best_of`` candidates and beam search, run on this package's decoder step.

whisper's temperature fallback decodes a failed window again at temperatures 0.2 ... 1.0, each time
with ``best_of`` sampled candidates (or ``beam_size`` beams at temperature 0). Its ``DecodingTask``
repeats the audio features once per candidate, grows a hook cache by concatenation every token, and
projects every prompt position onto the vocabulary on its first pass: with a 200-token prompt and
five candidates that first pass alone multiplies 1,000 rows by the 51,865-word embedding.

Here whisper's own ``DecodingTask`` still does everything that decides what is written (its token
decoders, sampling, beam search with patience, logit filters, sum-logprob and length-penalty
ranking, result fields); only the decoder passes are ours:

- one preallocated cache (``decoder.new_cache``) with a row per candidate, the audio's
  cross-attention keys and values computed and stored once and read by all of its candidates in one
  product (``decoder.cross_attention``);
- the first pass projects only the two positions whisper reads (the start-of-transcript token's,
  for the no-speech probability, and the last one's);
- beam search's reordering is an index_select of the cache rows (``StaticKVCache.reorder``);
- the model's compute type (int8, bfloat16) and, for a Medusa model with a base head, the logits
  greedy decoding uses (``heads.base_state``), which whisper's decoder would not apply.

Differs from whisper: the logits are the package's (same float32 math, other kernels), so a sampled
candidate draws from the same distribution but not necessarily the same bits; the draws themselves
come from torch's global generator exactly as whisper's ``Categorical.sample`` takes them.
"""

from __future__ import annotations

import contextlib
from typing import List, Optional, Tuple

import numpy as np
import torch
from torch import Tensor
from whisper.decoding import BeamSearchDecoder, DecodingOptions, DecodingResult, DecodingTask, Inference
from whisper.model import Whisper

from . import fixed_candidates
from .compute import compute_type_of
from .decoder import DecoderCache, decoder_hidden, new_cache, next_token_logits
from .masks import chain_mask
from .together import rows_together


class StepInference(Inference):
    """whisper's ``Inference`` over ``decoder.decoder_hidden`` and a static cache.

    ``rows_per_audio`` (whisper's ``n_group``: best_of or beam_size) rows of the token batch belong to
    each audio, consecutively, as ``DecodingTask.run`` repeats them.
    """

    def __init__(self, model: Whisper, rows_per_audio: int):
        self.model = model
        self.rows_per_audio = rows_per_audio
        self.cache: Optional[DecoderCache] = None
        self.passes = 0

    def _hidden(self, tokens: Tensor, audio_features: Tensor) -> Tensor:
        """The decoder states of the tokens not yet in the cache: all of them on the first pass,
        the last one after."""
        decoder = self.model.decoder
        if self.cache is None:
            self.cache = new_cache(decoder, audio_features[:: self.rows_per_audio], self.rows_per_audio)
        start = self.cache.length
        new = tokens[:, start:]
        n = new.shape[1]
        positions = torch.arange(start, start + n, device=tokens.device)
        self.passes += 1
        if start == 0 and self._one_prompt(new):
            return self._prompt_once(new, positions)
        # the first pass is the prompt, every candidate's copy of it, only ever computed together
        with rows_together() if start == 0 else contextlib.nullcontext():
            return decoder_hidden(decoder, new, positions, self.cache, start, chain_mask(start, n, tokens.device))

    def _one_prompt(self, new: Tensor) -> bool:
        """Whether the first pass's rows are one audio's candidates, all with the same prompt (whisper
        repeats it best_of or beam_size times), in a converted model: there the prompt runs once
        (``_prompt_once``). A float32 model computes every copy, as whisper does, so that its
        sampled retries stay whisper's to the last bit."""
        k = self.rows_per_audio
        return (k > 1 and new.shape[0] == k and compute_type_of(self.model) != "float32"
                and bool((new == new[:1]).all()))

    def _prompt_once(self, new: Tensor, positions: Tensor) -> Tensor:
        """The prompt pass over one copy of the prompt, its keys and values then copied to every
        candidate's slots: best_of 5 paid five prompt passes of up to 224 rows (0.45 s of base int8
        on one core) for one set of numbers."""
        n = new.shape[1]
        one = self.cache.batch_items(0, 1)
        with rows_together():
            hidden = decoder_hidden(self.model.decoder, new[:1], positions, one, 0, chain_mask(0, n, new.device))
        self.cache.self_attn.reorder(torch.zeros(self.rows_per_audio, dtype=torch.long, device=new.device))
        self.cache.self_attn.length = n
        return hidden.expand(self.rows_per_audio, -1, -1)

    def logits(self, tokens: Tensor, audio_features: Tensor) -> Tensor:
        """whisper's interface: logits at every new position (what ``next_logits`` avoids)."""
        return next_token_logits(self.model, self._hidden(tokens, audio_features))

    def next_logits(self, tokens: Tensor, audio_features: Tensor, sot_index: Optional[int]
                    ) -> Tuple[Tensor, Optional[Tensor]]:
        """Logits at the last position (batch, n_vocab), and on the first pass also at ``sot_index``
        (None: not wanted), projecting only those rows."""
        first = self.cache is None
        hidden = self._hidden(tokens, audio_features)
        wanted = [hidden.shape[1] - 1] if not first or sot_index is None else [sot_index, hidden.shape[1] - 1]
        logits = next_token_logits(self.model, hidden[:, wanted])
        return logits[:, -1], (logits[:, 0] if len(wanted) == 2 else None)

    def rearrange_kv_cache(self, source_indices) -> None:
        if self.cache is not None and list(source_indices) != list(range(len(source_indices))):
            self.cache.self_attn.reorder(torch.as_tensor(source_indices, device=self.cache.self_attn.keys.device))

    def cleanup_caching(self) -> None:
        self.cache = None


class StepDecodingTask(DecodingTask):
    """whisper's ``DecodingTask`` whose decoder passes are ``StepInference``'s, or on the fixed-shape
    step ``fixed_candidates.FixedInference``'s."""

    def __init__(self, model: Whisper, options: DecodingOptions):
        super().__init__(model, options)
        # the fixed-shape step where greedy decoding takes it (CUDA: one graph per rows count)
        on_fixed_step = fixed_candidates.wanted(model, model.device)
        self.inference = (fixed_candidates.FixedInference if on_fixed_step else StepInference)(model, self.n_group)
        if isinstance(self.decoder, BeamSearchDecoder):
            self.decoder.inference = self.inference

    def _main_loop(self, audio_features: Tensor, tokens: Tensor):
        """whisper's ``_main_loop`` line for line, except that the first pass projects only the two
        positions it reads (``StepInference.next_logits``)."""
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
