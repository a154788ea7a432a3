"""Training curves: a run's history.json and its PNG, one plot per head type (Medusa heads, EAGLE, CTC)."""

from __future__ import annotations

import json
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Dict, List, Optional, Sequence


def write_curve(history: List[Dict], work_dir: Path, plot: Callable, title: str,
                best_step: Optional[int] = None) -> None:
    """``work_dir/history.json`` and, drawn by ``plot`` (one of the functions below), ``work_dir/training.png``."""
    curve = Path(work_dir) / "history.json"
    curve.write_text(json.dumps(history, indent=1))
    if plot(history, Path(work_dir) / "training.png", title=title, best_step=best_step) is None:
        print(f"no loss plot: matplotlib is not installed (pip install matplotlib); the curve is in {curve}",
              file=sys.stderr)


def _pyplot():
    """matplotlib's pyplot without a display, or None when matplotlib is not installed."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return None
    return plt


def plot_history(history: List[Dict], path: Path, title: str = "", best_step: Optional[int] = None) -> Optional[Path]:
    """The Medusa heads' curves: train and held-out loss, held-out accuracy per head. Each plot here
    returns None (and writes nothing) when matplotlib is not installed."""
    plt = _pyplot()
    if plt is None or not history:
        return None
    steps = [h["step"] for h in history]
    fig, (left, right) = plt.subplots(1, 2, figsize=(11, 4))
    left.plot(steps, [h["train_loss"] for h in history], label="train")
    scored = [h for h in history if "heldout" in h]
    if scored:
        left.plot([h["step"] for h in scored], [h["heldout"]["loss"] for h in scored], label="held-out")
        per_head = list(zip(*[h["heldout"]["accuracy_per_head"] for h in scored]))
        for k, acc in enumerate(per_head, start=1):
            right.plot([h["step"] for h in scored], acc, label=f"head {k}")
    left.set_xlabel("step")
    left.set_ylabel("loss (mean cross-entropy over heads)")
    left.legend()
    right.set_xlabel("step")
    right.set_ylabel("held-out top-1 accuracy")
    right.set_ylim(0, 1)
    if scored:
        right.legend(fontsize=7, ncol=2)
    return _save(plt, fig, path, title, best_step, left, right)


def plot_eagle_history(history: List[Dict], path: Path, title: str = "", best_step: Optional[int] = None) -> Optional[Path]:
    """The EAGLE head's curves: train and held-out loss; held-out first-token accuracy and the
    replayed tokens per decoder step; a dotted line at the step whose weights were kept."""
    plt = _pyplot()
    if plt is None or not history:
        return None
    fig, (left, right) = plt.subplots(1, 2, figsize=(11, 4))
    left.plot([h["step"] for h in history], [h["train_loss"] for h in history], label="train")
    scored = [h for h in history if "heldout" in h]
    steps = [h["step"] for h in scored]
    if scored:
        left.plot(steps, [h["heldout"]["loss"] for h in scored], label="held-out")
        right.plot(steps, [h["heldout"]["first_token_accuracy"] for h in scored], label="first draft right (held-out)")
        twin = right.twinx()
        twin.plot(steps, [h["heldout"]["tokens_per_step"] for h in scored], color="C3", label="tokens per step (replay)")
        twin.set_ylabel("tokens per decoder step")
        twin.legend(loc="lower right", fontsize=8)
        right.legend(loc="upper left", fontsize=8)
    left.set_xlabel("step")
    left.set_ylabel("loss (cross-entropy + feature regression)")
    left.legend()
    right.set_xlabel("step")
    right.set_ylabel("accuracy")
    right.set_ylim(0, 1)
    return _save(plt, fig, path, title, best_step, left, right)


def plot_ctc_history(history: List[Dict], path: Path, title: str = "", best_step: Optional[int] = None) -> Optional[Path]:
    """The CTC head's curves: train and held-out loss; the held-out draft's token and character error
    rates and the replayed tokens per pass; a dotted line at the step whose weights were kept."""
    plt = _pyplot()
    if plt is None or not history:
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
    return _save(plt, fig, path, title, best_step, left, right)


# the held-out score a draft head's run is judged by: the EAGLE replay's, then the CTC replay's
SCORE_KEYS = ("tokens_per_step", "tokens_per_pass")


@dataclass
class Run:
    """One training run of a learning curve: its label, its history.json and its training speech."""

    label: str
    history: List[Dict]
    train_hours: Optional[float] = None  # hours of distinct training speech the run had


def run_score(record: Dict) -> Optional[float]:
    """The held-out tokens per pass of one evaluation record, or None when it has none."""
    heldout = record.get("heldout") or {}
    return next((float(heldout[k]) for k in SCORE_KEYS if k in heldout), None)


def plot_learning_curve(runs: Sequence[Run], path: Path, title: str = "") -> Optional[Path]:
    """Held-out tokens per pass against minutes trained and hours of speech seen, one line per run,
    and, with runs on different amounts of speech, each run's best against its hours of speech: where
    the curves flatten, more training or more data stops paying."""
    plt = _pyplot()
    scored = [(run, [h for h in run.history if run_score(h) is not None]) for run in runs]
    scored = [(run, hs) for run, hs in scored if hs]
    if plt is None or not scored:
        return None
    by_data = sorted((run.train_hours, max(run_score(h) for h in hs)) for run, hs in scored
                     if run.train_hours is not None)
    panels = 3 if len({h for h, _ in by_data}) > 1 else 2
    fig, axes = plt.subplots(1, panels, figsize=(5.2 * panels, 4))
    for run, hs in scored:
        scores = [run_score(h) for h in hs]
        axes[0].plot([h["seconds"] / 60 for h in hs], scores, marker=".", label=run.label)
        if all("speech_hours_seen" in h for h in hs):
            axes[1].plot([h["speech_hours_seen"] for h in hs], scores, marker=".", label=run.label)
    axes[0].set_xlabel("minutes trained (1 CPU thread, evaluations included)")
    axes[1].set_xlabel("hours of speech seen (windows x epochs)")
    for ax in axes[:2]:
        ax.set_ylabel("held-out tokens per pass (replayed, lossless)")
        ax.grid(alpha=0.3)
        ax.legend(fontsize=8)
    if panels == 3:
        axes[2].plot([h for h, _ in by_data], [s for _, s in by_data], marker="o")
        axes[2].set_xlabel("hours of distinct training speech")
        axes[2].set_ylabel("best held-out tokens per pass")
        axes[2].grid(alpha=0.3)
    fig.suptitle(title)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return Path(path)


def _save(plt, fig, path: Path, title: str, best_step: Optional[int], *axes) -> Path:
    """The figure's last touches (the kept step, the title) and its PNG at ``path``."""
    mark_best(best_step, *axes)
    fig.suptitle(title)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return Path(path)


def mark_best(step: Optional[int], *axes) -> None:
    """A dotted vertical line at the step whose weights a draft head ends with (training/best.py)."""
    if step is None:
        return
    for ax in axes:
        ax.axvline(step, color="grey", linestyle=":", linewidth=1)
    axes[-1].annotate(f"kept: step {step}", xy=(step, 0.02), xycoords=("data", "axes fraction"), fontsize=8,
                      color="grey", ha="left")
