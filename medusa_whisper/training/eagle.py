"""Training the EAGLE draft head on the frozen model's cached states (see drafting/eagle.py).

Data: the same cache as the Medusa heads (features.py): per window the main model's own greedy
tokens (self-labels; 30 % of windows with timestamps), its post-LayerNorm states f at every token
and the encoder output. Row t of a window feeds [f_t ; token t+1] and is scored on two things:
- the feature: SmoothL1 between the head's f^_{t+1} and the main model's f_{t+1}, per dimension in
  units of that dimension's spread in the training data;
- the token: cross-entropy of f^_{t+1}'s shortlist logits against token t+2.
Only rows that predict sampled tokens are scored (the start-of-transcript sequence is context).

Drafting feeds the head its own features after the first drafted position, and errors compound.
So on a share of the steps (``rollout_prob``) a second pass replaces every f_t after the prompt by
the head's own f^_t from the first pass (detached) and is scored the same way: the head learns to
go on from its own drift.

Held out, ``simulate`` replays lossless chain decoding exactly as the decoder runs it, with the
main model's cached states standing in for its passes: tokens per step and the acceptance at each
drafted depth, without running the main decoder.
"""

from __future__ import annotations

import random
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Dict, List, Optional, Tuple

import numpy as np
import torch
import torch.nn.functional as F
from torch import Tensor

from ..drafting.base import Committed
from ..drafting.device.eagle import DeviceEagle
from ..drafting.device.hosted import Hosted
from ..drafting.eagle import DEFAULT_TREE_NODES, EagleConfig, EagleHead
from ..drafting.tree import CandidateTree
from ..step.cpu import cpu_step
from . import loop
from .features import Shard

IGNORE = -100


@dataclass
class EagleTrainConfig:
    shortlist: int = 8192  # proposal vocabulary: the most frequent tokens of the training labels
    epochs: float = 10.0
    batch_windows: int = 8
    lr: float = 1e-3
    weight_decay: float = 0.0
    warmup_steps: int = 20
    feature_weight: float = 1.0  # weight of the feature regression beside the token cross-entropy
    rollout_prob: float = 0.5  # share of steps with a second pass on the head's own features
    simulate_depth: int = 5  # drafted positions per step in the held-out simulation
    simulate_windows: int = 48  # held-out windows replayed by the simulation
    seed: int = 0
    eval_every: int = 100
    checkpoint_every: int = 100
    keep_best: bool = True  # end with the weights of the best held-out tokens per step (training/best.py)


def token_frequencies(shard: Shard, n_vocab: int) -> Tensor:
    """How often each token is a sampled token (end-of-text included) in the shard's windows."""
    counts = torch.zeros(n_vocab, dtype=torch.long)
    for tokens, begin in zip(shard.tokens, shard.sample_begin):
        counts += torch.bincount(torch.tensor(tokens[begin:]), minlength=n_vocab)
    return counts


def choose_shortlist(counts: Tensor, size: int) -> Tensor:
    """The ``size`` most frequent tokens, most frequent first (ties by id, so it is reproducible)."""
    size = min(size, len(counts))
    order = sorted(range(len(counts)), key=lambda t: (-int(counts[t]), t))
    return torch.tensor(order[:size], dtype=torch.long)


# -- batches ------------------------------------------------------------------------------------------

@dataclass
class Batch:
    features: Tensor  # (B, L, n_state) main post-LN states f_0..f_{L-1}
    tokens: Tensor  # (B, L) token ids (0 past the end)
    scored: Tensor  # (B, L - 1) bool: row t predicts a sampled token (t + 1 >= sample_begin, t + 2 < length)
    audio: Tensor  # (B, n_audio_ctx, n_audio_state)
    begins: List[int]


def make_batch(shard: Shard, rows: List[int]) -> Batch:
    lengths = [len(shard.tokens[r]) for r in rows]
    length = max(lengths)
    n_state = shard.hidden.shape[1]
    features = torch.zeros(len(rows), length, n_state)
    tokens = torch.zeros(len(rows), length, dtype=torch.long)
    scored = torch.zeros(len(rows), length - 1, dtype=torch.bool)
    offsets = shard.offsets
    for i, r in enumerate(rows):
        n, begin = lengths[i], shard.sample_begin[r]
        features[i, :n] = shard.hidden[offsets[r] : offsets[r] + n].float()
        tokens[i, :n] = torch.tensor(shard.tokens[r])
        # row t feeds f_t and token t+1, predicts f_{t+1} and token t+2
        scored[i, max(begin - 1, 0) : n - 2] = True
    return Batch(features, tokens, scored, shard.audio_features[rows].float(), [shard.sample_begin[r] for r in rows])


def _head_pass(head: EagleHead, decoder, features: Tensor, batch: Batch) -> Tensor:
    """The head over whole windows, teacher-forced: row t sees rows 0..t. returns (B, L-1, n_state)."""
    n = features.shape[1] - 1
    x = head.fused(features[:, :n], batch.tokens[:, 1 : n + 1], torch.arange(1, n + 1), decoder)
    return head.ln(head.block(x, batch.audio, mask=decoder.mask[:n, :n]))


def _scores(head: EagleHead, decoder, predicted: Tensor, batch: Batch, columns: Tensor, cfg: EagleTrainConfig,
            scale: Tensor) -> Dict:
    """Losses and hits of predicted features f^_{t+1} (rows t) against the batch.

    scale : shape = (n_state,), the spread of each feature dimension: the regression is measured in
            units of it, since post-LayerNorm states range from about 1 to over 100 by dimension
            and unscaled errors of the widest ones would drown the token loss
    """
    valid = batch.scored
    target_features = batch.features[:, 1:]
    regression = F.smooth_l1_loss(predicted[valid] / scale, target_features[valid] / scale)
    targets = columns[batch.tokens[:, 2:]]  # token t+2 as a shortlist column, IGNORE outside
    targets = F.pad(targets, (0, 1), value=IGNORE)  # the last row has no t+2
    targets = targets.masked_fill(~valid, IGNORE)
    logits = head.shortlist_logits(predicted[valid], decoder)
    labels = targets[valid]
    ce = F.cross_entropy(logits, labels, ignore_index=IGNORE)
    hits = (logits.detach().argmax(-1) == labels) & (labels != IGNORE)
    return dict(loss=ce + cfg.feature_weight * regression, ce=ce, regression=regression,
                hits=int(hits.sum()), n=int(valid.sum()))


def feature_scale(shard: Shard) -> Tensor:
    """Standard deviation of each feature dimension over the shard's states (at least 1e-3)."""
    return shard.hidden.float().std(dim=0).clamp(min=1e-3)


def step_losses(head: EagleHead, decoder, batch: Batch, columns: Tensor, cfg: EagleTrainConfig,
                rollout: bool, scale: Tensor) -> Dict:
    predicted = _head_pass(head, decoder, batch.features, batch)
    first = _scores(head, decoder, predicted, batch, columns, cfg, scale)
    result = dict(first)
    if rollout:
        # the head's own features in place of the main model's after the prompt (EAGLE's drift)
        own = batch.features.clone()
        drafted = predicted.detach()
        for i, begin in enumerate(batch.begins):
            own[i, begin + 1 :] = drafted[i, begin:]
        second = _scores(head, decoder, _head_pass(head, decoder, own, batch), batch, columns, cfg, scale)
        result["loss"] = (first["loss"] + second["loss"]) / 2
        result["rollout_hits"], result["rollout_n"] = second["hits"], second["n"]
    return result


# -- the held-out replay of lossless decoding ----------------------------------------------------------

@torch.no_grad()
def simulate(head: EagleHead, model, shard: Shard, depth: int, windows: Optional[int] = None,
             width: int = 1, max_nodes: Optional[int] = None) -> Dict:
    """Lossless decoding replayed on cached windows: the main model's cached states play its passes.

    Each step the proposer drafts from what was committed; the accepted candidates are the longest
    path that equals the labels (the main model's greedy tokens), plus the next label as the
    verifier's own token. returns tokens per step, the share of steps whose depth-d candidate was
    accepted, and the first drafted token's accuracy.
    """
    head.eval()
    # the head's proposer as decoding drives it on the CPU, on the main model's step (whose passes
    # the cached states stand in for: only its embeddings and vocabulary are read)
    step = cpu_step(model)
    drafter = DeviceEagle(head, step, depth, width, max_nodes or (depth if width == 1 else DEFAULT_TREE_NODES))
    steps = produced = 0
    per_depth = np.zeros(depth)
    offsets = shard.offsets
    rows = range(len(shard.tokens)) if windows is None else range(min(windows, len(shard.tokens)))
    for r in rows:
        tokens, begin = shard.tokens[r], shard.sample_begin[r]
        hidden = shard.hidden[offsets[r] : offsets[r] + len(tokens)].float()[None]
        proposer = Hosted(drafter, shard.audio_features[r : r + 1].float(), None, step.n_ctx)
        # the first pass feeds the prompt; its last state gives the first sampled token
        position, fed, tree = 0, begin, CandidateTree()
        last = len(tokens) - 1  # the end-of-text
        while True:
            steps += 1
            end = position + fed  # the verifier's token after the fed ones is tokens[end]
            path, node = [], -1
            while end + len(path) < last:  # the longest path of candidates equal to the labels
                want = tokens[end + len(path)]
                node = next((c for c in tree.children(node) if tree.tokens[c] == want), None)
                if node is None:
                    break
                path.append(node)
            for d in range(len(path)):
                per_depth[d] += 1
            produced += 1 + len(path)
            following = end + len(path)  # the verifier's own token: fed next pass
            if following >= last:
                break
            proposer.commit(Committed(tokens=tokens[position:following], hidden=hidden[:, position:following],
                                      position=position, next_token=tokens[following], n_accepted=len(path),
                                      n_proposed=len(tree)))
            tree = proposer.propose()
            position, fed = following, 1
    head.train()
    # produced: the verifier's token of every pass and the accepted candidates (end-of-text included)
    return dict(tokens_per_step=round(produced / max(steps, 1), 3),
                accepted_at_depth=[round(float(x) / max(steps, 1), 3) for x in per_depth],
                windows=len(rows))


@torch.no_grad()
def evaluate(head: EagleHead, model, shard: Shard, columns: Tensor, cfg: EagleTrainConfig,
             scale: Optional[Tensor] = None) -> Dict:
    """Held-out loss and teacher-forced first-token accuracy, plus the decoding replay."""
    scale = feature_scale(shard) if scale is None else scale
    head.eval()
    totals = dict(loss=0.0, ce=0.0, regression=0.0, hits=0, n=0, batches=0)
    for i in range(0, len(shard.tokens), cfg.batch_windows):
        batch = make_batch(shard, list(range(i, min(i + cfg.batch_windows, len(shard.tokens)))))
        stats = step_losses(head, model.decoder, batch, columns, cfg, rollout=False, scale=scale)
        for key in ("loss", "ce", "regression"):
            totals[key] += float(stats[key])
        totals["hits"] += stats["hits"]
        totals["n"] += stats["n"]
        totals["batches"] += 1
    b = max(totals["batches"], 1)
    result = dict(loss=round(totals["loss"] / b, 4), ce=round(totals["ce"] / b, 4),
                  regression=round(totals["regression"] / b, 4),
                  first_token_accuracy=round(totals["hits"] / max(totals["n"], 1), 4))
    result.update(simulate(head, model, shard, cfg.simulate_depth, cfg.simulate_windows))
    head.train()
    return result


# -- what the training loop (loop.py) runs --------------------------------------------------------------

def new_head(model, train: Shard, cfg: EagleTrainConfig) -> EagleHead:
    dims = model.dims
    head = EagleHead(EagleConfig(dims.n_text_state, dims.n_text_head, dims.n_text_ctx,
                                 min(cfg.shortlist, dims.n_vocab)))
    head.init_from(model.decoder)
    head.set_shortlist(choose_shortlist(token_frequencies(train, dims.n_vocab), head.config.shortlist))
    return head


class EagleTask:
    """The EAGLE head as a ``loop.HeadTask``: feature and token losses, scored by replayed decoding."""

    description = "train eagle"
    lr_floor = 0.1
    clip_norm = 1.0

    def __init__(self, model, train_shard: Shard, heldout: Optional[Shard], cfg: EagleTrainConfig):
        self.model, self.decoder = model, model.decoder
        for p in model.parameters():
            p.requires_grad_(False)
        self.head = self.module = new_head(model, train_shard, cfg)
        self.head.train()
        self.cfg, self.config = cfg, asdict(cfg)
        self.best_metric = "tokens_per_step" if cfg.keep_best else None
        self.train_shard, self.heldout = train_shard, heldout
        self.examples, self.batch_size = len(train_shard.tokens), cfg.batch_windows
        self.columns = torch.full((model.dims.n_vocab,), IGNORE, dtype=torch.long)
        self.columns[self.head.token_ids] = torch.arange(len(self.head.token_ids))
        self.scale = feature_scale(train_shard)

    def param_groups(self) -> List[dict]:
        return [dict(params=list(self.head.parameters()), lr=self.cfg.lr)]

    def train_step(self, rows: Tensor, step: int) -> Tuple[float, Dict[str, str]]:
        batch = make_batch(self.train_shard, rows.tolist())
        # the rollout draws must not depend on where a run was resumed: one generator per step
        rollout = random.Random(self.cfg.seed * 7919 + step).random() < self.cfg.rollout_prob
        stats = step_losses(self.head, self.decoder, batch, self.columns, self.cfg, rollout, self.scale)
        stats["loss"].backward()
        return float(stats["loss"].detach()), dict(acc=f"{stats['hits'] / max(stats['n'], 1):.2f}")

    def evaluate(self) -> Optional[Dict]:
        if self.heldout is None:
            return None
        return evaluate(self.head, self.model, self.heldout, self.columns, self.cfg, self.scale)

    def checkpoint_weights(self) -> dict:
        return dict(head=self.head.state_dict())

    def load_checkpoint_weights(self, saved: dict) -> None:
        self.head.load_state_dict(saved["head"])


def train(model, train_shard: Shard, heldout: Optional[Shard], cfg: EagleTrainConfig, work_dir: Path,
          resume: bool = True, max_steps: Optional[int] = None, log=print, minutes: Optional[float] = None,
          example_seconds: Optional[List[float]] = None) -> Tuple[EagleHead, loop.TrainState]:
    """Train for ``cfg.epochs`` epochs; ``work_dir/checkpoint.pt`` after every ``checkpoint_every`` steps.

    max_steps : stop after this global step (the schedule still spans all epochs), to split a long run
    minutes, example_seconds : a time budget and each example's seconds of audio (loop.train)
    """
    task, state = loop.train(lambda: EagleTask(model, train_shard, heldout, cfg), cfg, work_dir,
                             resume=resume, max_steps=max_steps, log=log, minutes=minutes,
                             example_seconds=example_seconds)
    return task.head, state
