"""Early stopping by keeping the best: the weights at the best held-out score seen so far.

A draft head trained on a few hours of speech overfits long before its schedule ends (tiny.en-ctc's
held-out tokens per pass peaked at step 900 of 1,500), and what a user gets should be the weights
that scored best on held-out speech, not the last ones. Each evaluation offers the head's weights;
the best are written to ``work_dir/best.pt`` (so a resumed run remembers them) and put back into the
head when training ends. The schedule itself is unchanged: the run still goes to its last step, and
the curve shows what came after the best point.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Optional

import torch
from torch import nn

from ..checkpoints.weights import safe_torch_load


class BestWeights:
    def __init__(self, work_dir: Path, metric: str, fresh: bool = False):
        """metric : the key of the held-out record to maximise (for example "tokens_per_step")
        fresh  : a run that starts at step 0: an earlier run's best is forgotten"""
        self.path = Path(work_dir) / "best.pt"
        self.metric = metric
        if fresh:
            self.path.unlink(missing_ok=True)
        saved = safe_torch_load(self.path) if self.path.is_file() else None
        self.step: Optional[int] = saved["step"] if saved else None
        self.score: Optional[float] = saved["score"] if saved else None

    def offer(self, module: nn.Module, step: int, heldout: Optional[dict]) -> bool:
        """Keep ``module``'s weights if ``heldout[metric]`` beats every earlier offer (ties keep the earlier)."""
        if not heldout or self.metric not in heldout:
            return False
        score = float(heldout[self.metric])
        if self.score is not None and score <= self.score:
            return False
        tmp = self.path.with_name(self.path.name + ".tmp")
        torch.save(dict(step=step, score=score, metric=self.metric,
                        state_dict={k: v.detach().clone() for k, v in module.state_dict().items()}), tmp)
        os.replace(tmp, self.path)
        self.step, self.score = step, score
        return True

    def restore(self, module: nn.Module) -> Optional[dict]:
        """Load the best weights into ``module``; what was restored (None when nothing was offered)."""
        if not self.path.is_file():
            return None
        saved = safe_torch_load(self.path)
        module.load_state_dict(saved["state_dict"])
        return dict(step=saved["step"], metric=saved["metric"], score=saved["score"])

    def forget(self) -> None:
        """A fresh run (no resume) starts without an earlier run's best."""
        self.path.unlink(missing_ok=True)
        self.step = self.score = None
