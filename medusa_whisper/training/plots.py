"""Training curves as a PNG: train and held-out loss, and held-out accuracy per head."""

from __future__ import annotations

from pathlib import Path
from typing import Dict, List, Optional


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
    """Write the plot; returns None (and writes nothing) when matplotlib is not installed."""
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
    mark_best(best_step, left, right)
    fig.suptitle(title)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return Path(path)


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
    mark_best(best_step, left, right)
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
