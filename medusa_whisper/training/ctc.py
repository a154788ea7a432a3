"""Training the CTC draft head on cached encoder outputs, against the main model's own transcripts.

The cache of stage 1 (``features.py``) holds, per ~25-s window, the frozen model's encoder output
and its greedy tokens (self-labels; 30 % of windows with timestamps). The head learns to spell the
text of those tokens (timestamps dropped) in its units (``drafting.ctc_units``) with the CTC loss,
so its greedy path is a draft of what the main model will say. Nothing of the main model is
trained: lossless decoding with the head still gives the main model's greedy output.

Every ``eval_every`` steps the held-out windows are scored: CTC loss; the draft's token error rate
against the main model's tokens (the draft re-encoded with the main model's BPE) and its character
error rate; and, replaying lossless decoding with the known output (``drafting.replay``), the
tokens per decoder pass and passes per window the proposer would reach. ``history.json`` keeps the
curve and ``training.png`` plots it. Checkpoints every ``checkpoint_every`` steps; a rerun with the
same settings resumes at the same step with the same batches.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Dict, List, Optional, Sequence, Tuple

import numpy as np
import torch
import torch.nn.functional as F
from torch import Tensor
from whisper.tokenizer import Tokenizer, get_tokenizer

from ..drafting.ctc import CtcConfig, CtcHead
from ..drafting.ctc_draft import greedy_draft
from ..drafting.ctc_lexicon import edit_distance
from ..drafting.ctc_proposer import CtcProposer, DraftSettings
from ..drafting.replay import replay, summarize
from . import loop
from .features import Shard


@dataclass
class CtcTrainConfig:
    # the head (see drafting.ctc.CtcConfig)
    n_units: int = 256
    width: int = 384
    stride: int = 2
    layers: int = 2
    block: str = "conv"
    kernel: int = 5
    heads: int = 4
    dropout: float = 0.1
    # augmentation of the encoder output: this many spans of up to time_mask_frames frames zeroed per window
    time_masks: int = 0
    time_mask_frames: int = 25
    # optimisation
    epochs: float = 30.0
    batch_windows: int = 8
    lr: float = 2e-3
    weight_decay: float = 0.01
    warmup_steps: int = 50
    seed: int = 0
    eval_every: int = 100
    checkpoint_every: int = 100
    max_eval_windows: int = 64  # held-out windows scored at each evaluation
    keep_best: bool = True  # end with the weights of the best held-out tokens per pass (training/best.py)
    # the head's matrix products in bfloat16 while training (the loss in float32): about 1.8x faster
    # on a CPU with AVX-512 BF16; evaluation and decoding stay float32
    bf16: bool = True

    def head_config(self, encoding: str, decoding: Optional[dict] = None) -> CtcConfig:
        return CtcConfig(encoding=encoding, n_units=self.n_units, width=self.width, stride=self.stride,
                         layers=self.layers, block=self.block, kernel=self.kernel, heads=self.heads,
                         dropout=self.dropout, decoding=dict(decoding or {}))


# -- labels ------------------------------------------------------------------------------------------

@dataclass
class Labels:
    """Per window of a cache: the main model's text and the unit ids the head must spell."""

    texts: List[str]
    units: List[List[int]]
    timestamps: List[bool]


def tokenizer_of(model) -> Tokenizer:
    return get_tokenizer(model.is_multilingual, num_languages=model.num_languages, language="en", task="transcribe")


def text_tokens(tokens: Sequence[int], sample_begin: int, tokenizer: Tokenizer) -> List[int]:
    """The sampled text tokens of a cached window (timestamps and end of text dropped)."""
    return [t for t in tokens[sample_begin:] if t < tokenizer.eot]


def make_labels(shard: Shard, tokenizer: Tokenizer, head: CtcHead) -> Labels:
    texts, units, stamps = [], [], []
    for tokens, begin in zip(shard.tokens, shard.sample_begin):
        text = tokenizer.decode(text_tokens(tokens, begin, tokenizer))
        texts.append(text)
        units.append(head.units.encode(text))
        stamps.append(tokenizer.no_timestamps not in tokens[:begin])
    return Labels(texts, units, stamps)


# -- the loss ------------------------------------------------------------------------------------------

def _time_masked(features: Tensor, cfg: CtcTrainConfig, generator: torch.Generator) -> Tensor:
    if not cfg.time_masks:
        return features
    features = features.clone()
    batch, frames, _ = features.shape
    for b in range(batch):
        for _ in range(cfg.time_masks):
            width = int(torch.randint(0, cfg.time_mask_frames + 1, (1,), generator=generator))
            start = int(torch.randint(0, max(frames - width, 1), (1,), generator=generator))
            features[b, start : start + width] = 0
    return features


def ctc_loss(head: CtcHead, features: Tensor, targets: Sequence[Sequence[int]]) -> Tensor:
    """Mean CTC loss per target unit over a batch.

    features : shape = (batch, n_audio_ctx, n_audio_state)
    targets  : unit ids per window
    """
    logprobs = head(features)  # (B, T, C)
    batch, frames, _ = logprobs.shape
    flat = torch.tensor([u for t in targets for u in t], dtype=torch.long)
    lengths = torch.tensor([len(t) for t in targets], dtype=torch.long)
    return F.ctc_loss(logprobs.transpose(0, 1), flat, torch.full((batch,), frames, dtype=torch.long), lengths,
                      blank=head.blank, reduction="mean", zero_infinity=True)



# -- held-out scores -----------------------------------------------------------------------------------

@torch.no_grad()
def evaluate(head: CtcHead, shard: Shard, labels: Labels, tokenizer: Tokenizer, settings: DraftSettings,
             max_windows: Optional[int] = None) -> Dict:
    """Held-out loss, the draft's token and character error rates, and the replayed decoding."""
    was_training = head.training
    head.eval()
    rows = list(range(len(shard.tokens)))[:max_windows]
    losses, token_errors, tokens, char_errors, chars = [], 0, 0, 0, 0
    replays = {False: [], True: []}
    for i in range(0, len(rows), 8):
        batch = rows[i : i + 8]
        features = shard.audio_features[batch].float()
        losses.append(float(ctc_loss(head, features, [labels.units[r] for r in batch])))
        logprobs = head(features)
        for r, lp in zip(batch, logprobs):
            draft = greedy_draft(lp, head.units, head.blank, head.frame_seconds)
            reference = text_tokens(shard.tokens[r], shard.sample_begin[r], tokenizer)
            token_errors += edit_distance(tokenizer.encoding.encode(draft.text), reference)
            tokens += len(reference)
            char_errors += edit_distance(draft.text, labels.texts[r])
            chars += len(labels.texts[r])
            proposer = CtcProposer(draft, tokenizer, settings, timestamps=labels.timestamps[r])
            begin = shard.sample_begin[r]
            replays[labels.timestamps[r]].append(
                replay(proposer, shard.tokens[r][:begin], shard.tokens[r][begin:], tokenizer.eot, settings))
    head.train(was_training)
    out = dict(loss=round(float(np.mean(losses)), 4), token_error_rate=round(token_errors / max(tokens, 1), 4),
               char_error_rate=round(char_errors / max(chars, 1), 4), windows=len(rows))
    out.update(summarize(replays[False] + replays[True]))
    for stamped, name in ((False, "without_timestamps"), (True, "with_timestamps")):
        if replays[stamped]:
            out[name] = summarize(replays[stamped])
    return out


# -- what the training loop (loop.py) runs ----------------------------------------------------------------

class CtcTask:
    """The CTC head as a ``loop.HeadTask``: the CTC loss on the encoder output, scored by replayed decoding."""

    lr_floor = 0.05
    clip_norm = 1.0

    def __init__(self, model, train_shard: Shard, heldout_shard: Optional[Shard], cfg: CtcTrainConfig,
                 settings: DraftSettings):
        self.tokenizer = tokenizer_of(model)
        encoding = "multilingual" if model.is_multilingual else "gpt2"
        self.head = self.module = CtcHead(model.dims, cfg.head_config(encoding, asdict(settings)))
        self.head.train()
        self.cfg, self.settings = cfg, settings
        # held-out windows are scored by replayed decoding, priced by what a pass costs on this machine
        self.replay_settings = settings.for_model(model) if heldout_shard is not None else settings
        self.description = f"train ctc {cfg.block}x{cfg.layers} units {cfg.n_units}"
        self.best_metric = "tokens_per_pass" if cfg.keep_best else None
        self.train_shard, self.heldout = train_shard, heldout_shard
        self.labels = make_labels(train_shard, self.tokenizer, self.head)
        self.heldout_labels = None if heldout_shard is None else make_labels(heldout_shard, self.tokenizer, self.head)
        self.examples, self.batch_size = len(train_shard.tokens), cfg.batch_windows
        # the number of windows too: a resume on a grown cache would shuffle other batches
        self.config = dict(asdict(cfg), train_windows=self.examples)

    def param_groups(self) -> List[dict]:
        return [dict(params=list(self.head.parameters()), lr=self.cfg.lr)]

    def train_step(self, rows: Tensor, step: int) -> Tuple[float, Dict[str, str]]:
        batch = rows.tolist()
        # dropout and masks drawn from the step number: a resumed run draws what the straight one did
        torch.manual_seed(self.cfg.seed * 1_000_003 + step)
        generator = torch.Generator().manual_seed(self.cfg.seed * 1_000_003 + step)
        features = _time_masked(self.train_shard.audio_features[batch].float(), self.cfg, generator)
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=self.cfg.bf16):
            loss = ctc_loss(self.head, features, [self.labels.units[r] for r in batch])
        loss.backward()
        return float(loss.detach()), {}

    def evaluate(self) -> Optional[Dict]:
        if self.heldout is None:
            return None
        return evaluate(self.head, self.heldout, self.heldout_labels, self.tokenizer, self.replay_settings,
                        self.cfg.max_eval_windows)

    def checkpoint_weights(self) -> dict:
        return dict(head=self.head.state_dict())

    def load_checkpoint_weights(self, saved: dict) -> None:
        self.head.load_state_dict(saved["head"])


def train(model, train_shard: Shard, heldout_shard: Optional[Shard], cfg: CtcTrainConfig, work_dir: Path,
          settings: DraftSettings = DraftSettings(), resume: bool = True, max_steps: Optional[int] = None,
          log=print, minutes: Optional[float] = None,
          example_seconds: Optional[List[float]] = None) -> Tuple[CtcHead, loop.TrainState]:
    """Train a CTC head for ``cfg.epochs`` epochs over the cached windows of ``model``.

    max_steps : stop after this global step (the schedule still spans all epochs)
    minutes, example_seconds : a time budget and each example's seconds of audio (loop.train)
    """
    task, state = loop.train(lambda: CtcTask(model, train_shard, heldout_shard, cfg, settings), cfg, work_dir,
                             resume=resume, max_steps=max_steps, log=log, minutes=minutes,
                             example_seconds=example_seconds)
    task.head.eval()
    return task.head, state
