"""A CTC draft as plain data: the window's text with where each character was heard.

The CTC head (``ctc.py``) makes it, the proposer (``ctc_proposer.py``) and the lexicon
(``ctc_lexicon.py``) read it; it lives apart from all three so that none of them imports another
to name it.
"""

from __future__ import annotations

import codecs
from dataclasses import dataclass, field
from typing import List

import torch
from torch import Tensor

from .ctc_units import Units


@dataclass
class CtcDraft:
    """The greedy CTC path of one window, as text with where each character was heard."""

    text: str
    char_start: List[float]  # per character of ``text``: seconds at which its unit begins
    char_end: List[float]  # ... and ends (the last frame of its run)
    char_entropy: List[float]  # the largest frame entropy (nats) from the previous unit's end to this one's
    units: List[int] = field(default_factory=list)
    tail_entropy: float = 0.0  # the largest frame entropy after the last unit (the window's end)


def greedy_draft(logprobs: Tensor, units: Units, blank: int, frame_seconds: float) -> CtcDraft:
    """Collapse the per-frame argmax (repeats merged, blanks dropped) into text with timings.

    logprobs : shape = (frames, n_units + 1)
    """
    best = logprobs.argmax(dim=-1)
    entropy = -(logprobs.exp() * logprobs).sum(dim=-1)
    changes = torch.ones_like(best, dtype=torch.bool)
    changes[1:] = best[1:] != best[:-1]
    starts = torch.nonzero(changes & (best != blank)).flatten().tolist()
    best_list = best.tolist()
    entropy_list = entropy.tolist()
    n_frames = len(best_list)

    decoder = codecs.getincrementaldecoder("utf-8")(errors="replace")
    text: List[str] = []
    char_start: List[float] = []
    char_end: List[float] = []
    char_entropy: List[float] = []
    unit_ids: List[int] = []
    previous_end = -1
    for start in starts:
        unit = best_list[start]
        end = start
        while end + 1 < n_frames and best_list[end + 1] == unit:
            end += 1
        span_entropy = max(entropy_list[previous_end + 1 : end + 1])
        previous_end = end
        unit_ids.append(unit)
        chars = decoder.decode(units.pieces[unit])
        text.append(chars)
        char_start += [start * frame_seconds] * len(chars)
        char_end += [(end + 1) * frame_seconds] * len(chars)
        char_entropy += [span_entropy] * len(chars)
    tail = max(entropy_list[previous_end + 1 :], default=0.0)
    return CtcDraft("".join(text), char_start, char_end, char_entropy, unit_ids, tail)
