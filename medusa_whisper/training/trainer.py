"""Stage 2 of training: fit the heads on cached decoder states.

Losses (paper eq. 1-2 and the reference): head k, applied at position t, is scored by
cross-entropy against token t+k+1; the loss is the plain mean over heads. The base model is
frozen, so lossless decoding with the trained heads still gives vanilla greedy output.

Three variants, one task for the shared loop (``loop.py``):

- ``linear``: heads on the cached post-LayerNorm states ``h``; positions are independent, so they
  are shuffled across windows.
- ``block``: the Medusa block (initialised from the last decoder layer) runs causally over each
  window's ``h`` with cross-attention to the cached encoder output; heads read its output.
- ``base_head`` with ``fine_tune_last_layer`` (the paper's fine-tuned Medusa-Linear, NOT lossless
  with respect to the original model): the last decoder layer is retrained together with the heads
  and a next-token head 0; a KL term keeps its next-token distribution close to the original's.

The vocabulary projection is the expensive part on a CPU, so each head's loss is computed and
back-propagated on its own against a detached copy of the shared input, whose gradient is then
passed back once: the same gradients, a fraction of the memory.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Dict, List, Optional, Tuple

import numpy as np
import torch
import torch.nn.functional as F
from torch import Tensor, nn

from ..drafting.heads import MedusaConfig, MedusaHeads
from . import loop
from .features import Shard

IGNORE = -100


@dataclass
class TrainConfig:
    heads_type: str = "linear"  # linear | block | base_head
    num_heads: int = 10
    num_layers: int = 1
    proposal_vocab: int = 0
    fine_tune_last_layer: bool = False  # base_head only
    kl_weight: float = 0.01  # fine-tuned variant: weight of KL(original || new) on next-token probabilities
    epochs: float = 3.0
    batch_positions: int = 512  # linear: positions per step
    batch_windows: int = 4  # block / fine-tuned: windows per step
    lr: float = 1e-3
    last_layer_lr: float = 1e-5  # fine-tuned variant: a pretrained layer needs a far smaller step than new heads
    weight_decay: float = 0.0
    warmup_steps: int = 30
    seed: int = 0
    eval_every: int = 200
    checkpoint_every: int = 200

    def medusa_config(self) -> MedusaConfig:
        return MedusaConfig(num_heads=self.num_heads, heads_type=self.heads_type, num_layers=self.num_layers,
                            proposal_vocab=self.proposal_vocab)

    @property
    def per_window(self) -> bool:
        return self.heads_type == "block" or self.fine_tune_last_layer


# -- targets ----------------------------------------------------------------------------------------

def window_targets(tokens: List[int], sample_begin: int, num_heads: int) -> Tuple[int, Tensor]:
    """Targets of the positions that predict sampled tokens.

    Position t (from the last initial token on) predicts token t+1 (column 0) and head k predicts
    token t+k+1 (column k); beyond the end-of-text the target is IGNORE.
    returns: (first position, targets of shape (positions, num_heads + 1))
    """
    first = sample_begin - 1
    seq = torch.tensor(tokens)
    n = len(tokens) - 1 - first  # positions whose next token exists
    out = torch.full((n, num_heads + 1), IGNORE, dtype=torch.long)
    for k in range(num_heads + 1):
        later = seq[first + 1 + k :]
        out[: len(later), k] = later[:n]
    return first, out


@dataclass
class Examples:
    """Positions of a cache flattened for the linear heads: inputs and targets."""

    hidden: Tensor  # (positions, n_state) fp16
    targets: Tensor  # (positions, num_heads + 1)


def linear_examples(shard: Shard, num_heads: int) -> Examples:
    rows, targets = [], []
    for tokens, begin, offset in zip(shard.tokens, shard.sample_begin, shard.offsets):
        first, t = window_targets(tokens, begin, num_heads)
        rows.append(torch.arange(offset + first, offset + first + len(t)))
        targets.append(t)
    index = torch.cat(rows)
    return Examples(shard.hidden[index], torch.cat(targets))


# -- the trainable module -----------------------------------------------------------------------------

class HeadsTrainer(nn.Module):
    """The heads plus, for the fine-tuned variant, a trainable copy of the last decoder layer."""

    def __init__(self, model, config: TrainConfig):
        super().__init__()
        self.config = config
        self.heads = MedusaHeads(model.dims, config.medusa_config())
        self.embedding = model.decoder.token_embedding.weight.detach().float()
        # the proposal vocabulary's rows, gathered once: one contiguous matmul per head is ~20 %
        # faster than two matmuls over slices and a concatenation of their logits
        self.proposal_embedding = self.embedding[self.heads.proposal_token_ids()].contiguous()
        self.mask = model.decoder.mask
        self.ln = model.decoder.ln
        for p in self.ln.parameters():
            p.requires_grad_(False)
        self.last_layer: Optional[nn.Module] = None
        if config.heads_type == "block":
            self.heads.init_block_from(model.decoder.blocks[-1])
        if config.fine_tune_last_layer:
            import copy

            if config.heads_type != "base_head":
                raise ValueError("the fine-tuned variant trains a next-token head: use heads_type base_head")
            self.last_layer = copy.deepcopy(model.decoder.blocks[-1]).float()

    def shared_input(self, hidden: Tensor, pre_last: Optional[Tensor], audio: Optional[Tensor]) -> Tensor:
        """What the heads read: h (linear), block(h) (block), or LN(new last layer) (fine-tuned)."""
        if self.config.heads_type == "block":
            return self.heads.block(hidden, audio, mask=self.mask)
        if self.last_layer is not None:
            return self.ln(self.last_layer(pre_last, audio, mask=self.mask))
        return hidden

    def head_logits(self, shared: Tensor, k: int) -> Tensor:
        """Logits of head k (1-based), or of head 0 (the next-token head of base_head) for k = 0."""
        offset = 1 if self.heads.has_base_head else 0
        if k == 0:
            return self.heads.base_state(shared) @ self.embedding.T  # next-token: whole vocabulary
        states = self.heads.stacks[offset + k - 1](shared)
        return states @ self.proposal_embedding.T  # == heads.proposal_logits(states, embedding)


def _ce(logits: Tensor, columns: Tensor) -> Tuple[Tensor, int, Tensor]:
    """Summed cross-entropy, number of scored targets, and per position whether the argmax is right."""
    valid = columns != IGNORE
    hits = (logits.detach().argmax(-1) == columns) & valid
    n = int(valid.sum())
    if n == 0:
        return logits.sum() * 0.0, 0, hits
    loss = F.cross_entropy(logits[valid], columns[valid], reduction="sum")
    return loss, n, hits


def step_losses(trainer: HeadsTrainer, shared: Tensor, targets: Tensor, original: Optional[Tensor],
                backward: bool) -> Dict:
    """Per-head losses at the given positions; with ``backward``, gradients into the trainer.

    shared   : shape = (positions, n_state), the heads' input (with its graph, if any)
    targets  : shape = (positions, num_heads + 1), token ids or IGNORE
    original : shape = (positions, n_state), the frozen model's h (fine-tuned variant's KL), or None
    """
    cfg = trainer.config
    detached = shared.detach().requires_grad_(backward and shared.requires_grad)
    heads = list(range(1, cfg.num_heads + 1)) + ([0] if trainer.heads.has_base_head else [])
    stats = dict(loss=0.0, n=[0] * (cfg.num_heads + 1), correct=[0] * (cfg.num_heads + 1),
                 loss_per_head=[0.0] * (cfg.num_heads + 1), kl=0.0,
                 hits=torch.zeros(len(targets), cfg.num_heads + 1, dtype=torch.bool))
    for k in heads:
        logits = trainer.head_logits(detached, k)
        columns = targets[:, k] if k == 0 else trainer.heads.proposal_columns(targets[:, k])
        summed, n, hits = _ce(logits, columns)
        correct = int(hits.sum())
        stats["hits"][:, k] = hits
        mean = summed / max(n, 1)
        # plain mean over the Medusa heads (paper); head 0 and KL are added on top, weight 1 and kl_weight
        weight = 1.0 if k == 0 else 1.0 / cfg.num_heads
        total = weight * mean
        if k == 0 and original is not None:
            with torch.no_grad():
                reference = F.log_softmax(original.float() @ trainer.embedding.T, dim=-1)
            kl = F.kl_div(F.log_softmax(logits, dim=-1), reference, log_target=True, reduction="batchmean")
            total = total + cfg.kl_weight * kl
            stats["kl"] = float(kl)
        if backward and total.requires_grad:
            total.backward()
        stats["loss"] += float(total.detach())
        stats["n"][k], stats["correct"][k], stats["loss_per_head"][k] = n, correct, float(mean.detach())
    if backward and shared.requires_grad and detached.grad is not None:
        shared.backward(detached.grad)
    return stats


# -- batches ------------------------------------------------------------------------------------------

def _window_batch(shard: Shard, rows: List[int], num_heads: int, pre_last_needed: bool):
    """Padded (hidden, pre_last, audio, targets) of some windows, and the flat valid positions."""
    lengths = [len(shard.tokens[r]) for r in rows]
    n_state = shard.hidden.shape[1]
    length = max(lengths)
    hidden = torch.zeros(len(rows), length, n_state)
    pre_last = torch.zeros(len(rows), length, n_state) if pre_last_needed else None
    targets = torch.full((len(rows), length, num_heads + 1), IGNORE, dtype=torch.long)
    offsets = shard.offsets
    for i, r in enumerate(rows):
        o, n = offsets[r], lengths[i]
        hidden[i, :n] = shard.hidden[o : o + n].float()
        if pre_last is not None:
            pre_last[i, :n] = shard.pre_last[o : o + n].float()
        first, t = window_targets(shard.tokens[r], shard.sample_begin[r], num_heads)
        targets[i, first : first + len(t)] = t
    audio = shard.audio_features[rows].float()
    return hidden, pre_last, audio, targets


def _forward_batch(trainer: HeadsTrainer, data, batch, backward: bool) -> Dict:
    """batch : positions of ``data`` (linear heads, an index tensor) or windows (a list of rows)."""
    cfg = trainer.config
    if not cfg.per_window:
        return step_losses(trainer, data.hidden[batch].float(), data.targets[batch], None, backward)
    hidden, pre_last, audio, targets = _window_batch(data, batch, cfg.num_heads, trainer.last_layer is not None)
    with torch.set_grad_enabled(backward):
        shared = trainer.shared_input(hidden, pre_last, audio)
    valid = targets[..., 0] != IGNORE  # positions that predict something
    original = hidden[valid] if trainer.last_layer is not None else None
    return step_losses(trainer, shared[valid], targets[valid], original, backward)


def evaluate(trainer: HeadsTrainer, data) -> Dict:
    """Held-out loss, per-head top-1 accuracy, and the teacher-forced accepted-length estimate."""
    cfg = trainer.config
    trainer.eval()
    totals = dict(loss=0.0, batches=0, n=np.zeros(cfg.num_heads + 1), correct=np.zeros(cfg.num_heads + 1), runs=[])
    batches = ([list(range(i, min(i + 8, len(data.tokens)))) for i in range(0, len(data.tokens), 8)]
               if cfg.per_window else [torch.arange(i, min(i + 4096, len(data.targets)))
                                       for i in range(0, len(data.targets), 4096)])
    with torch.no_grad():
        for batch in batches:
            stats = _forward_batch(trainer, data, batch, backward=False)
            totals["loss"] += stats["loss"]
            totals["batches"] += 1
            totals["n"] += stats["n"]
            totals["correct"] += stats["correct"]
            # heads 1..k all right in a row: what lossless decoding would accept at that position
            hits = stats["hits"][:, 1:].int()
            totals["runs"].append(hits.cumprod(dim=1).sum(dim=1))
    trainer.train()
    runs = torch.cat(totals["runs"]).float()
    accuracy = (totals["correct"] / np.maximum(totals["n"], 1)).tolist()
    return dict(loss=totals["loss"] / max(totals["batches"], 1),
                accuracy_per_head=[round(a, 4) for a in accuracy[1:]],
                # teacher-forced estimate of lossless tokens per step with the first k heads, k = 1..K
                # (every position counted; real decoding visits a subset, so it is only a guide)
                estimated_tokens_per_step=[round(1 + float(runs.clamp(max=k).mean()), 3)
                                           for k in range(1, cfg.num_heads + 1)],
                next_token_accuracy=round(accuracy[0], 4) if trainer.heads.has_base_head else None)


# -- what the training loop (loop.py) runs --------------------------------------------------------------

def _prepare(cfg: TrainConfig, shard: Shard):
    return shard if cfg.per_window else linear_examples(shard, cfg.num_heads)


class MedusaTask:
    """The Medusa heads as a ``loop.HeadTask``: the per-head losses, scored on held-out positions."""

    lr_floor = 0.1
    clip_norm = None  # the heads train unclipped
    best_metric = None  # the heads end with the last step's weights

    def __init__(self, model, train_shard: Shard, heldout_shard: Optional[Shard], cfg: TrainConfig):
        self.trainer = self.module = HeadsTrainer(model, cfg)
        self.cfg = cfg
        self.config = asdict(cfg)
        self.description = f"train {cfg.heads_type} x{cfg.num_heads}"
        self.data = _prepare(cfg, train_shard)
        self.heldout = _prepare(cfg, heldout_shard) if heldout_shard is not None else None
        # the linear heads read positions independently, so they are shuffled across windows
        self.examples = len(self.data.tokens) if cfg.per_window else len(self.data.targets)
        self.batch_size = cfg.batch_windows if cfg.per_window else cfg.batch_positions

    def param_groups(self) -> List[dict]:
        groups = [dict(params=list(self.trainer.heads.parameters()), lr=self.cfg.lr)]
        if self.trainer.last_layer is not None:
            groups.append(dict(params=list(self.trainer.last_layer.parameters()), lr=self.cfg.last_layer_lr))
        return groups

    def train_step(self, rows: Tensor, step: int) -> Tuple[float, Dict[str, str]]:
        batch = rows.tolist() if self.cfg.per_window else rows
        return _forward_batch(self.trainer, self.data, batch, backward=True)["loss"], {}

    def evaluate(self) -> Optional[Dict]:
        return evaluate(self.trainer, self.heldout) if self.heldout is not None else None

    def checkpoint_weights(self) -> dict:
        # the trainable parts only: the frozen layer norm is the base model's
        return dict(trainer={k: v for k, v in self.trainer.state_dict().items()
                             if k.startswith(("heads.", "last_layer."))})

    def load_checkpoint_weights(self, saved: dict) -> None:
        self.trainer.load_state_dict(saved["trainer"], strict=False)


def train(model, train_shard: Shard, heldout_shard: Optional[Shard], cfg: TrainConfig, work_dir: Path,
          resume: bool = True, max_steps: Optional[int] = None, log=print,
          minutes: Optional[float] = None) -> Tuple[HeadsTrainer, loop.TrainState]:
    """Train heads for ``cfg.epochs`` epochs; checkpoints go to ``work_dir/checkpoint.pt``.

    max_steps : stop after this global step (the schedule still spans all epochs), e.g. for a test
                of resuming or to split a long run
    minutes   : a time budget (loop.train)
    """
    task, state = loop.train(lambda: MedusaTask(model, train_shard, heldout_shard, cfg), cfg, work_dir,
                             resume=resume, max_steps=max_steps, log=log, minutes=minutes)
    return task.trainer, state


def heads_file(trainer: HeadsTrainer, model, base_model: str, record: Dict) -> Dict:
    """The dict written to weights/NAME.pt (see ``loading.load_heads``)."""
    out = dict(medusa=trainer.heads.config.to_dict(),
               heads_state_dict={k: v.detach().clone() for k, v in trainer.heads.state_dict().items()},
               base_model=base_model, record=record)
    if trainer.last_layer is not None:
        layer = len(model.decoder.blocks) - 1
        # the fine-tuned last layer replaces the base model's: this model is not vanilla any more
        out["decoder_overrides"] = {f"decoder.blocks.{layer}.{k}": v.detach().clone()
                                    for k, v in trainer.last_layer.state_dict().items()}
        out["lossless_reference"] = "fine-tuned model (its own greedy output), not the original whisper"
    return out
