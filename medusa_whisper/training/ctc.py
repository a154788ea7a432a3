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

import json
import math
import os
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Dict, List, Optional, Sequence, Tuple

import numpy as np
import torch
import torch.nn.functional as F
from torch import Tensor
from tqdm import tqdm
from whisper.tokenizer import Tokenizer, get_tokenizer

from ..drafting.ctc import CtcConfig, CtcHead
from ..drafting.ctc_draft import greedy_draft
from ..drafting.ctc_lexicon import edit_distance
from ..drafting.ctc_proposer import CtcProposer, DraftSettings
from ..drafting.replay import replay, summarize
from ..weights import safe_torch_load
from .best import BestWeights
from .features import Shard
from .plots import mark_best
from .trainer import TrainState


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


# -- the loop --------------------------------------------------------------------------------------------

def _lr_factor(step: int, total: int, warmup: int) -> float:
    if step < warmup:
        return (step + 1) / warmup
    progress = (step - warmup) / max(total - warmup, 1)
    return 0.05 + 0.95 * 0.5 * (1 + math.cos(math.pi * min(progress, 1.0)))


def _batches(cfg: CtcTrainConfig, n_windows: int, epoch: int) -> List[List[int]]:
    """The batches of one epoch, in an order fixed by (seed, epoch), so that a resume can skip to one."""
    generator = torch.Generator().manual_seed(cfg.seed * 1000 + epoch)
    order = torch.randperm(n_windows, generator=generator).tolist()
    return [order[i : i + cfg.batch_windows] for i in range(0, len(order), cfg.batch_windows)]


def train(model, train_shard: Shard, heldout_shard: Optional[Shard], cfg: CtcTrainConfig, work_dir: Path,
          settings: DraftSettings = DraftSettings(), resume: bool = True, max_steps: Optional[int] = None,
          log=print) -> Tuple[CtcHead, TrainState]:
    """Train a CTC head for ``cfg.epochs`` epochs over the cached windows of ``model``.

    max_steps : stop after this global step (the schedule still spans all epochs)
    """
    torch.manual_seed(cfg.seed)
    work_dir = Path(work_dir)
    work_dir.mkdir(parents=True, exist_ok=True)
    tokenizer = tokenizer_of(model)
    encoding = "multilingual" if model.is_multilingual else "gpt2"
    head = CtcHead(model.dims, cfg.head_config(encoding, asdict(settings)))
    optimizer = torch.optim.AdamW(head.parameters(), lr=cfg.lr, weight_decay=cfg.weight_decay)
    labels = make_labels(train_shard, tokenizer, head)
    heldout_labels = make_labels(heldout_shard, tokenizer, head) if heldout_shard is not None else None
    n_windows = len(train_shard.tokens)
    steps_per_epoch = len(_batches(cfg, n_windows, 0))
    total_steps = max(1, int(round(cfg.epochs * steps_per_epoch)))
    state = TrainState()

    checkpoint = work_dir / "checkpoint.pt"
    saved_config = dict(asdict(cfg), train_windows=n_windows)
    if resume and checkpoint.exists():
        saved = safe_torch_load(checkpoint)
        if saved["config"] != saved_config:
            raise ValueError(f"{checkpoint}: written with other settings or data; delete it or pass the same options")
        head.load_state_dict(saved["head"])
        optimizer.load_state_dict(saved["optimizer"])
        state = TrainState(**saved["state"])
        log(f"resuming at step {state.step} of {total_steps}")
    best = BestWeights(work_dir, "tokens_per_pass", fresh=state.step == 0)

    stop = total_steps if max_steps is None else min(total_steps, max_steps)
    bar = tqdm(total=stop, initial=state.step, desc=f"train ctc {cfg.block}x{cfg.layers} units {cfg.n_units}",
               unit="step")
    began = time.perf_counter() - state.seconds
    running: List[float] = []
    head.train()
    while state.step < stop:
        epoch, index = divmod(state.step, steps_per_epoch)
        batch = _batches(cfg, n_windows, epoch)[index]
        for group in optimizer.param_groups:
            group["lr"] = cfg.lr * _lr_factor(state.step, total_steps, cfg.warmup_steps)
        # dropout and masks drawn from the step number: a resumed run draws what the straight one did
        torch.manual_seed(cfg.seed * 1_000_003 + state.step)
        generator = torch.Generator().manual_seed(cfg.seed * 1_000_003 + state.step)
        features = _time_masked(train_shard.audio_features[batch].float(), cfg, generator)
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=cfg.bf16):
            loss = ctc_loss(head, features, [labels.units[r] for r in batch])
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(head.parameters(), 1.0)
        optimizer.step()
        state.step += 1
        running.append(float(loss.detach()))
        bar.update(1)
        bar.set_postfix(loss=f"{np.mean(running[-20:]):.3f}")
        last = state.step == stop
        if state.step % cfg.eval_every == 0 or last:
            record = dict(step=state.step, epoch=round(state.step / steps_per_epoch, 3),
                          train_loss=round(float(np.mean(running)), 4), seconds=round(time.perf_counter() - began, 1))
            running = []
            if heldout_shard is not None:
                record["heldout"] = evaluate(head, heldout_shard, heldout_labels, tokenizer, settings.for_model(model),
                                             cfg.max_eval_windows)
                if cfg.keep_best:
                    best.offer(head, state.step, record["heldout"])
            state.history.append(record)
            tqdm.write(json.dumps(record))
        if state.step % cfg.checkpoint_every == 0 or last:
            state.seconds = time.perf_counter() - began
            _save_checkpoint(checkpoint, head, optimizer, state, saved_config)
    bar.close()
    state.seconds = time.perf_counter() - began
    if cfg.keep_best:  # (after the last checkpoint: a resumed run goes on from the last weights)
        state.best = best.restore(head) or {}
    head.eval()
    return head, state


def _save_checkpoint(path: Path, head: CtcHead, optimizer, state: TrainState, config: dict) -> None:
    tmp = path.with_name(path.name + ".tmp")
    torch.save(dict(config=config, head=head.state_dict(), optimizer=optimizer.state_dict(), state=asdict(state)), tmp)
    os.replace(tmp, path)


# -- the curve ---------------------------------------------------------------------------------------------

def plot_history(history: List[Dict], path: Path, title: str = "", best_step: Optional[int] = None) -> Optional[Path]:
    """Loss (train, held-out) and the held-out token error rate and tokens per pass; None without matplotlib."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return None
    if not history:
        return None
    fig, (left, right) = plt.subplots(1, 2, figsize=(11, 4))
    left.plot([h["step"] for h in history], [h["train_loss"] for h in history], label="train")
    scored = [h for h in history if "heldout" in h]
    if scored:
        steps = [h["step"] for h in scored]
        left.plot(steps, [h["heldout"]["loss"] for h in scored], label="held-out")
        right.plot(steps, [h["heldout"]["token_error_rate"] for h in scored], color="C3",
                   label="draft token error rate")
        right.plot(steps, [h["heldout"]["char_error_rate"] for h in scored], color="C1", label="draft char error rate")
        right.set_ylim(0, 1)
        right.set_ylabel("held-out error rate vs the main model's output")
        twin = right.twinx()
        twin.plot(steps, [h["heldout"]["tokens_per_pass"] for h in scored], color="C2",
                  label="tokens per pass (replayed)")
        twin.set_ylabel("lossless tokens per decoder pass (replayed)")
        lines = right.get_legend_handles_labels()[0] + twin.get_legend_handles_labels()[0]
        right.legend(lines, [ln.get_label() for ln in lines], fontsize=7, loc="center right")
    left.set_xlabel("step")
    left.set_ylabel("CTC loss per unit")
    left.legend()
    right.set_xlabel("step")
    mark_best(best_step, left, right)
    fig.suptitle(title)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return Path(path)
