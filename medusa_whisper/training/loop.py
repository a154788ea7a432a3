"""The one training loop every head type runs: seeding, the optimiser and its schedule, resuming,
the evaluation and checkpoint cadence, progress, and keeping the best held-out weights.

A head type (Medusa heads in ``trainer.py``, the EAGLE head in ``eagle.py``, the CTC head in
``ctc.py``) supplies only what differs, as a ``HeadTask``: how a batch becomes a loss, how held-out
data is scored, and what a checkpoint holds of its weights.

A run is resumable at any checkpoint and a resumed run ends where an uninterrupted one would: the
batches of an epoch are a permutation drawn from (seed, epoch) and the schedule from the step
number, so the loop can start at any step; a task that draws random numbers per step must draw them
from the step number too (see ``HeadTask.train_step``).

A time budget (``minutes``) makes a run fit a working session: the cosine schedule then follows
whichever is further along, the steps or the minutes spent (evaluations included), and the run
stops when the minutes are spent. Such a run depends on the machine's speed, so it is not
reproducible step for step; a resumed one still goes on from the minutes its checkpoint recorded.
With the seconds of audio in each example, every evaluation also records the hours of speech the
head has been shown so far: the x-axis of a learning curve.
"""

from __future__ import annotations

import json
import math
import os
import random
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Callable, Dict, List, Optional, Protocol, Sequence, Tuple

import numpy as np
import torch
from torch import Tensor, nn
from tqdm import tqdm

from ..checkpoints.weights import safe_torch_load
from .best import BestWeights


class LoopConfig(Protocol):
    """The fields of a head type's training config that the loop reads."""

    seed: int
    epochs: float
    warmup_steps: int
    weight_decay: float
    eval_every: int
    checkpoint_every: int


class HeadTask(Protocol):
    """What one head type supplies to the loop."""

    description: str  # the progress bar's label
    examples: int  # what an epoch shuffles: windows, or single positions for the linear Medusa heads
    batch_size: int  # examples per step
    lr_floor: float  # where the cosine schedule ends, as a share of each group's learning rate
    clip_norm: Optional[float]  # the gradients' norm is clipped to this, if given
    config: dict  # written with every checkpoint; a resume refuses a checkpoint written with another
    best_metric: Optional[str]  # the held-out score whose best weights the run ends with; None: the last weights
    module: nn.Module  # what trains: its weights are the ones kept as the best

    def param_groups(self) -> List[dict]:
        """The optimiser's parameter groups, each with its own "lr"."""

    def train_step(self, rows: Tensor, step: int) -> Tuple[float, Dict[str, str]]:
        """Forward and backward over the examples ``rows``; the loss and extra figures for the progress bar.

        Random draws (dropout, augmentation) must be seeded from ``step``, so that a resumed run
        draws what the uninterrupted one did.
        """

    def evaluate(self) -> Optional[dict]:
        """Held-out scores, or None without held-out data."""

    def checkpoint_weights(self) -> dict:
        """The entries of a checkpoint that hold the task's weights."""

    def load_checkpoint_weights(self, saved: dict) -> None:
        """Put back what ``checkpoint_weights`` wrote (``saved`` is the whole checkpoint)."""


@dataclass
class TrainState:
    step: int = 0
    history: List[Dict] = field(default_factory=list)
    seconds: float = 0.0
    best: Dict = field(default_factory=dict)  # the held-out best whose weights a draft head ends with
    speech_seconds_seen: float = 0.0  # audio in the examples trained on so far (when the task knows it)


def lr_factor(step: int, total: int, warmup: int, floor: float, time_progress: float = 0.0) -> float:
    """Linear warm-up, then a cosine from 1 down to ``floor`` at the last step, or earlier when
    ``time_progress`` (the share of a time budget spent) is further along than the steps."""
    if step < warmup:
        return (step + 1) / warmup
    progress = max((step - warmup) / max(total - warmup, 1), time_progress)
    return floor + (1 - floor) * 0.5 * (1 + math.cos(math.pi * min(progress, 1.0)))


def epoch_batches(examples: int, batch_size: int, seed: int, epoch: int) -> List[Tensor]:
    """The batches of one epoch, in an order fixed by (seed, epoch), so that a resume can skip to one."""
    generator = torch.Generator().manual_seed(seed * 1000 + epoch)
    order = torch.randperm(examples, generator=generator)
    return [order[i : i + batch_size] for i in range(0, examples, batch_size)]


def train(build: Callable[[], HeadTask], cfg: LoopConfig, work_dir: Path, resume: bool = True,
          max_steps: Optional[int] = None, log=print, minutes: Optional[float] = None,
          example_seconds: Optional[Sequence[float]] = None) -> Tuple[HeadTask, TrainState]:
    """Train the task ``build()`` returns for ``cfg.epochs`` epochs; checkpoints go to ``work_dir/checkpoint.pt``.

    build           : makes the task after seeding, so that its fresh weights depend on ``cfg.seed`` only
    max_steps       : stop after this global step (the schedule still spans all epochs), e.g. for a test
                      of resuming or to split a long run
    minutes         : a time budget for the whole run (resumed parts included): the schedule decays
                      by the minutes spent when they are further along than the steps, and the run
                      ends, evaluated and checkpointed, once they are spent
    example_seconds : seconds of audio in each example, for the speech-seen column of the history
    """
    torch.manual_seed(cfg.seed)
    random.seed(cfg.seed)
    work_dir = Path(work_dir)
    work_dir.mkdir(parents=True, exist_ok=True)
    task = build()
    optimizer = torch.optim.AdamW(task.param_groups(), weight_decay=cfg.weight_decay)
    # kept apart from the groups: a checkpoint's groups replace these when it is loaded
    base_lrs = [group["lr"] for group in optimizer.param_groups]
    steps_per_epoch = -(-task.examples // task.batch_size)
    total_steps = max(1, int(round(cfg.epochs * steps_per_epoch)))
    state = TrainState()

    checkpoint = work_dir / "checkpoint.pt"
    if resume and checkpoint.exists():
        saved = safe_torch_load(checkpoint)
        _check_same_config(checkpoint, saved["config"], task.config)
        task.load_checkpoint_weights(saved)
        optimizer.load_state_dict(saved["optimizer"])
        state = TrainState(**saved["state"])
        log(f"resuming at step {state.step} of {total_steps}")
    best = BestWeights(work_dir, task.best_metric, fresh=state.step == 0) if task.best_metric else None

    stop = total_steps if max_steps is None else min(total_steps, max_steps)
    budget = minutes * 60 if minutes else None
    bar = tqdm(total=stop if budget is None else None, initial=state.step, desc=task.description, unit="step")
    began = time.perf_counter() - state.seconds
    running: List[float] = []
    batches_of: Dict[int, List[Tensor]] = {}  # the current epoch's batches, drawn once rather than every step
    if budget is not None and state.step > 0 and state.seconds >= budget:
        stop = state.step  # resumed after the budget was spent: the last checkpoint already ends the run
    while state.step < stop:
        epoch, index = divmod(state.step, steps_per_epoch)
        if epoch not in batches_of:
            batches_of = {epoch: epoch_batches(task.examples, task.batch_size, cfg.seed, epoch)}
        spent = (time.perf_counter() - began) / budget if budget else 0.0
        factor = lr_factor(state.step, total_steps, cfg.warmup_steps, task.lr_floor, spent)
        for group, base_lr in zip(optimizer.param_groups, base_lrs):
            group["lr"] = base_lr * factor
        optimizer.zero_grad(set_to_none=True)
        rows = batches_of[epoch][index]
        loss, shown = task.train_step(rows, state.step)
        if example_seconds is not None:
            state.speech_seconds_seen += float(sum(example_seconds[i] for i in rows.tolist()))
        if task.clip_norm is not None:
            torch.nn.utils.clip_grad_norm_([p for g in optimizer.param_groups for p in g["params"]], task.clip_norm)
        optimizer.step()
        state.step += 1
        running.append(loss)
        bar.update(1)
        bar.set_postfix(loss=f"{np.mean(running[-20:]):.3f}", **shown)
        out_of_time = budget is not None and time.perf_counter() - began >= budget
        last = state.step == stop or out_of_time
        if state.step % cfg.eval_every == 0 or last:
            record = dict(step=state.step, epoch=round(state.step / steps_per_epoch, 3),
                          train_loss=round(float(np.mean(running)), 4), seconds=round(time.perf_counter() - began, 1))
            if example_seconds is not None:
                record["speech_hours_seen"] = round(state.speech_seconds_seen / 3600, 4)
            running = []
            heldout = task.evaluate()
            if heldout is not None:
                record["heldout"] = heldout
                if best is not None:
                    best.offer(task.module, state.step, heldout)
            state.history.append(record)
            tqdm.write(json.dumps(record))
        if state.step % cfg.checkpoint_every == 0 or last:
            state.seconds = time.perf_counter() - began
            _save_checkpoint(checkpoint, task, optimizer, state)
        if out_of_time:
            log(f"the {minutes:g}-minute budget is spent at step {state.step}")
            break
    bar.close()
    state.seconds = time.perf_counter() - began
    if best is not None:  # after the last checkpoint: a resumed run goes on from the last weights, not the best
        state.best = best.restore(task.module) or {}
    return task, state


def _check_same_config(path: Path, saved: dict, now: dict) -> None:
    differ = sorted(k for k in saved.keys() | now.keys() if saved.get(k) != now.get(k))
    if differ:
        changes = ", ".join(f"{k}: {saved.get(k)!r} then, {now.get(k)!r} now" for k in differ)
        raise ValueError(f"{path}: written with other settings ({changes}); delete it or pass the same options")


def _save_checkpoint(path: Path, task: HeadTask, optimizer, state: TrainState) -> None:
    # written aside and renamed: a run killed while saving keeps its previous checkpoint
    tmp = path.with_name(path.name + ".tmp")
    torch.save(dict(config=task.config, **task.checkpoint_weights(), optimizer=optimizer.state_dict(),
                    state=asdict(state)), tmp)
    os.replace(tmp, path)
