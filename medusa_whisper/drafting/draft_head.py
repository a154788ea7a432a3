"""Trained draft heads that attach to a model (the EAGLE feature drafter, the CTC audio drafter).

A draft head is a small module trained on a frozen Whisper; it lives in ``model.draft_head`` (a
submodule, so ``.to(device)`` and compute types reach it, while ``whisper.decode`` never calls it)
and computes what its proposer (made by ``factory.head_proposer``, by the head's ``kind``) drafts from.
Its heads file, under ``weights/<base>-<kind>.pt``:

    {"draft_head": {"kind": "eagle", ...its config...}, "state_dict": ..., "base_model": name,
     "record": how it was trained and measured}
"""

from __future__ import annotations

import importlib
from typing import Dict, Optional

from torch import nn
from whisper.model import ModelDimensions

# kind -> module that defines ``build(dims, config) -> DraftHead``; imported on first use
KINDS: Dict[str, str] = {
    "eagle": "medusa_whisper.drafting.eagle",
    "ctc": "medusa_whisper.drafting.ctc",
    "union": "medusa_whisper.drafting.union",
}


class DraftHead(nn.Module):
    """What every draft head offers the decoder and the loader."""

    kind: str = ""

    def config_dict(self) -> dict:
        """Everything ``build`` needs to make the same module again (JSON-safe)."""
        raise NotImplementedError


def head_part(head: DraftHead, kind: str) -> Optional[DraftHead]:
    """``head`` itself if it is of ``kind``, else its union part of that kind, else None."""
    return next((part for part in getattr(head, "parts", [head]) if part.kind == kind), None)


def build_draft_head(dims: ModelDimensions, config: dict) -> DraftHead:
    """A draft head of the kind ``config["kind"]``, with fresh weights."""
    kind = config.get("kind")
    if kind not in KINDS:
        raise ValueError(f"unknown draft head kind {kind!r} (known: {', '.join(KINDS)})")
    module = importlib.import_module(KINDS[kind])
    return module.build(dims, {k: v for k, v in config.items() if k != "kind"})


def draft_head_file(head: DraftHead, base_model: str, record: dict) -> dict:
    """The dict written to weights/NAME.pt for a trained draft head."""
    return dict(draft_head=dict(kind=head.kind, **head.config_dict()),
                state_dict={k: v.detach().clone() for k, v in head.state_dict().items()},
                base_model=base_model, record=record)
