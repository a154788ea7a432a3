"""best_of candidates and beams on the fixed-shape step: the temperature fallback's passes as one
CUDA graph per rows count.

``candidates.StepInference`` gives whisper's ``DecodingTask`` its decoder passes through the eager
decoder: on a GPU each of them launches a few hundred small kernels one by one, for 5 rows (best_of
5 or a beam of 5) as for one. ``FixedInference`` is the same interface over ``step.FixedStep`` with
a batch item per row (whisper's ``n_group`` rows per audio, consecutively):

- the first pass (the prompt, repeated in every row by whisper) runs uncaptured, its length being
  the prompt's; the cross-attention keys and values are computed once per audio and copied to its
  rows (``FixedStep.set_audio(repeat=...)``);
- every later pass feeds each row's last token at the same position (whisper's rows are always of
  one length) from static buffers, and writes the logits into a static buffer: one function of
  fixed shapes, captured once per rows count on CUDA (``fixed_decoding.program``) and replayed;
- beam search's reordering gathers the cache's rows in place (up to the filled slots).

Everything that decides what is written (sampling, beam search with patience, the logit filters,
ranking) stays whisper's, on the host side of the pass, as with ``StepInference``. The steps and
their graphs are kept on the model, one per (device, dtype, rows), so a window's fallback reuses
what an earlier window captured.
"""

from __future__ import annotations

from typing import Callable, List, Optional, Tuple

import torch
from torch import Tensor
from whisper.decoding import Inference

from . import fixed_decoding
from .step import FixedStep, supports


class _Rows:
    """A fixed-shape step for ``rows`` sequences and the static buffers its pass reads and writes."""

    def __init__(self, model, rows: int, residual: torch.dtype, device: torch.device):
        self.step = FixedStep(model, rows, residual, device)
        self.tokens = torch.zeros(rows, 1, dtype=torch.long, device=device)
        self.positions = torch.zeros(rows, 1, dtype=torch.long, device=device)
        self.logits = torch.zeros(rows, self.step.vocabulary.shape[0], dtype=torch.float32, device=device)
        self.graphs: List["torch.cuda.CUDAGraph"] = []
        self.run: Optional[Callable[[], None]] = None

    def _pass(self) -> None:
        """Every row's last token at its position; the next-token logits into ``self.logits``."""
        hidden = self.step(self.tokens, self.positions)
        self.logits.copy_(self.step.logits(hidden[:, 0]))

    def program(self) -> Callable[[], None]:
        """The pass as a callable: captured (CUDA) or compiled (``MEDUSA_WHISPER_STEP=compiled``) on
        first use. The warm-up runs it for real: it writes the cache slot the pass writes anyway."""
        if self.run is None:
            device = self.step.device
            capture = device.type == "cuda"
            self.run = self._pass
            if capture or fixed_decoding.step_choice() == "compiled":
                self.run = fixed_decoding.program(self._pass, device if capture else torch.device("cpu"), (),
                                                  self.graphs)
        return self.run


def wanted(model, device: torch.device) -> bool:
    """Whether the candidates of ``model`` decode on the fixed-shape step: where greedy decoding
    would (``fixed_decoding.wanted``: CUDA, or ``MEDUSA_WHISPER_STEP``) and the step has the model's
    decoder; not for a model whose next-token logits go through a Medusa head (``base_head``)."""
    heads = getattr(model, "medusa", None)
    return (fixed_decoding.wanted(device) and supports(model)
            and not (heads is not None and heads.has_base_head))


class FixedInference(Inference):
    """whisper's ``Inference`` (and ``StepInference``'s ``next_logits``) over ``FixedStep``.

    ``rows_per_audio`` (whisper's ``n_group``) consecutive rows of the token batch belong to each
    audio, as ``DecodingTask.run`` repeats them.
    """

    def __init__(self, model, rows_per_audio: int):
        self.model = model
        self.rows_per_audio = rows_per_audio
        self.rows: Optional[_Rows] = None
        self.length = 0  # tokens in the cache
        self.passes = 0

    def _rows_for(self, batch: int, audio_features: Tensor) -> _Rows:
        steps = self.model.__dict__.setdefault("fixed_candidate_steps", {})  # not a submodule: no state dict
        key = (audio_features.device, audio_features.dtype, batch, fixed_decoding.step_choice())
        if key not in steps:
            steps[key] = _Rows(self.model, batch, audio_features.dtype, audio_features.device)
        return steps[key]

    def _logits(self, tokens: Tensor, audio_features: Tensor, wanted: Optional[List[int]]) -> Tensor:
        """Logits at the new positions ``wanted`` (indices into them; None: all) of the prompt pass,
        or at the one new position of a later pass."""
        self.passes += 1
        if self.rows is None:  # the prompt pass
            rows = self.rows = self._rows_for(tokens.shape[0], audio_features)
            k = self.rows_per_audio
            # one row per audio (whisper repeats only the tokens), or one per row (repeated)
            audio = audio_features if audio_features.shape[0] * k == tokens.shape[0] else audio_features[::k]
            rows.step.set_audio(audio, repeat=k)
            n = tokens.shape[1]
            positions = torch.arange(n, device=tokens.device).expand(tokens.shape[0], n)
            hidden = rows.step(tokens, positions)
            self.length = n
            return rows.step.logits(hidden if wanted is None else hidden[:, wanted])
        rows = self.rows
        if tokens.shape[1] != self.length + 1:
            raise ValueError(f"a pass adds one token per row: {self.length} in the cache, {tokens.shape[1]} given")
        rows.tokens.copy_(tokens[:, -1:])
        rows.positions.fill_(self.length)
        rows.program()()
        self.length += 1
        return rows.logits[:, None]

    def logits(self, tokens: Tensor, audio_features: Tensor) -> Tensor:
        """whisper's interface: logits at every new position."""
        return self._logits(tokens, audio_features, None)

    def next_logits(self, tokens: Tensor, audio_features: Tensor, sot_index: Optional[int]
                    ) -> Tuple[Tensor, Optional[Tensor]]:
        """Logits at the last position (batch, n_vocab), and on the prompt pass also at ``sot_index``
        (None: not wanted). A later pass's logits are the static buffer the next pass overwrites:
        whisper's filters and token decoders use them before then."""
        if self.rows is None:
            n = tokens.shape[1]
            wanted = [n - 1] if sot_index is None else [sot_index, n - 1]
            logits = self._logits(tokens, audio_features, wanted)
            return logits[:, -1], (logits[:, 0] if len(wanted) == 2 else None)
        return self._logits(tokens, audio_features, None)[:, -1], None

    def rearrange_kv_cache(self, source_indices) -> None:
        if self.rows is None or list(source_indices) == list(range(len(source_indices))):
            return
        step = self.rows.step
        index = torch.as_tensor(source_indices, device=step.device)
        for cache in (step.keys, step.values):  # (layer, row, head, slot, d): the filled slots only
            filled = cache[:, :, :, : self.length]
            filled.copy_(filled.index_select(1, index))

    def cleanup_caching(self) -> None:
        self.rows = None
        self.length = 0
