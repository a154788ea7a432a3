"""The one place that turns a decoding's options into its proposer.

Every speculative setting of ``MedusaDecodingOptions`` (``draft_tokens``, ``tree_width``,
``tree_nodes``, ``num_heads``, ``adaptive_lookahead``, ``lossy_ctc_entropy``) is read here and
nowhere else: the proposers take plain values, and the draft-head modules only compute (a
``DraftHead`` has no method that builds a proposer). What the model carries picks the proposer:

- a draft model passed to the decoding: ``draft_model.Drafter``;
- a draft head (``model.draft_head``): by its ``kind``, EAGLE, CTC, or the union of its parts;
- Medusa heads (``model.medusa``): ``medusa.MedusaProposer``;
- nothing, or ``mode="off"``: no proposer (plain greedy steps).

On the fixed-shape step the same options build a proposer that drafts inside the pass
(``device_spec``, then ``device_proposer``; ``drafting.device``) wherever one exists: Medusa-Linear
heads, the EAGLE head, the CTC head and the two together. A draft model and Medusa-Block heads
propose on the host there too.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Optional

from torch import Tensor
from whisper.tokenizer import get_tokenizer

from .base import Proposer
from .ctc_proposer import CtcProposer, DraftSettings
from .draft_head import DraftHead
from .draft_model import Drafter
from .eagle import DEFAULT_TREE_NODES, EagleProposer
from .device.base import DeviceProposer
from .device.ctc import DeviceCtc, vocabulary_bytes
from .device.eagle import DeviceEagle
from .device.medusa import DeviceMedusa
from .device.union import DeviceUnion
from .medusa import MedusaProposer
from ..options import MedusaDecodingOptions
from .union import UnionProposer


def make_proposer(model, audio_features: Tensor, language: str, options: MedusaDecodingOptions,
                  task=None, draft=None, draft_mel: Optional[Tensor] = None) -> Optional[Proposer]:
    """The proposer of one decoding of ``model`` on a window, or None for plain greedy steps.

    audio_features : shape = (1, n_audio_ctx, n_audio_state), the window's encoder output
    language       : the decoding's language (given, or detected on this window)
    task           : whisper's DecodingTask of the decoding (needed by a draft model only)
    draft, draft_mel : a draft model and its log-mel of the window
    """
    if options.mode == "off":
        return None
    if draft is not None:
        return Drafter(draft, draft_mel, task, language, options.draft_tokens, options.adaptive_lookahead)
    draft_head = getattr(model, "draft_head", None)
    if draft_head is not None:
        return head_proposer(draft_head, model, audio_features, language, options)
    heads = getattr(model, "medusa", None)
    num_heads = 0 if heads is None else heads.num_heads
    if options.num_heads is not None:
        num_heads = min(num_heads, options.num_heads)
    if num_heads == 0:
        return None
    return MedusaProposer(heads, model.decoder, audio_features, num_heads, options.tree_width, options.tree_nodes)


def head_proposer(head: DraftHead, model, audio_features: Tensor, language: str,
                  options: MedusaDecodingOptions) -> Proposer:
    """The proposer of a draft head, by its kind (a union's parts each by theirs)."""
    if head.kind == "union":
        return UnionProposer([head_proposer(part, model, audio_features, language, options) for part in head.parts])
    if head.kind == "eagle":
        depth, width = options.draft_tokens, options.tree_width
        # a chain drafts ``depth`` nodes; a tree, the most probable DEFAULT_TREE_NODES paths
        nodes = options.tree_nodes or (depth if width == 1 else DEFAULT_TREE_NODES)
        return EagleProposer(head, model.decoder, audio_features, depth, width, nodes)
    if head.kind == "ctc":
        began = time.perf_counter()
        draft = head.draft(audio_features)  # the whole window's draft, once: part of what drafting costs
        seconds = time.perf_counter() - began
        tokenizer = get_tokenizer(model.is_multilingual, num_languages=model.num_languages, language=language,
                                  task=options.task or "transcribe")
        return CtcProposer(draft, tokenizer, head.draft_settings().for_model(model, audio_features),
                           timestamps=not options.without_timestamps, lossy_entropy=options.lossy_ctc_entropy,
                           setup_seconds=seconds)
    raise ValueError(f"no proposer for a draft head of kind {head.kind!r}")


@dataclass(frozen=True)
class DeviceSpec:
    """What proposes inside the pass, as plain values (a key of the fixed decoders kept per model).

    kind  : "medusa", "eagle", "ctc" or "ctc+eagle"
    depth, width, nodes : the Medusa heads' or the EAGLE head's chain length or tree (0 for "ctc")
    ctc   : the CTC head's settings (its ``decoding``; machine costs are measured where it runs)
    """

    kind: str
    depth: int = 0
    width: int = 1
    nodes: int = 0
    ctc: Optional[DraftSettings] = None


def device_spec(model, options: MedusaDecodingOptions, draft=None) -> Optional[DeviceSpec]:
    """The in-pass proposer these options ask of ``model``, or None where there is none: plain
    decoding, or a proposer that drafts on the host (a draft model, Medusa-Block heads)."""
    if options.mode == "off" or draft is not None:
        return None
    head = getattr(model, "draft_head", None)
    if head is not None:
        kinds = sorted(part.kind for part in head.parts) if head.kind == "union" else [head.kind]
        depth, width = options.draft_tokens, options.tree_width
        nodes = options.tree_nodes or (depth if width == 1 else DEFAULT_TREE_NODES)
        ctc = next((part for part in getattr(head, "parts", [head]) if part.kind == "ctc"), None)
        settings = None if ctc is None else ctc.draft_settings()
        if kinds == ["eagle"]:
            return DeviceSpec("eagle", depth, width, nodes)
        if kinds == ["ctc"]:
            return DeviceSpec("ctc", ctc=settings)
        if kinds == ["ctc", "eagle"]:
            return DeviceSpec("ctc+eagle", depth, width, nodes, ctc=settings)
        return None
    heads = getattr(model, "medusa", None)
    if heads is None or heads.config.heads_type != "linear":
        return None
    num_heads = heads.num_heads if options.num_heads is None else min(heads.num_heads, options.num_heads)
    if num_heads == 0:
        return None
    width = options.tree_width
    return DeviceSpec("medusa", num_heads, width, options.tree_nodes or num_heads * width)


def device_proposer(spec: DeviceSpec, model, step) -> DeviceProposer:
    """The proposer ``spec`` describes, drafting on the buffers of ``step`` (a ``FixedStep``)."""
    if spec.kind == "medusa":
        return DeviceMedusa(model.medusa, step, spec.depth, spec.width, spec.nodes)
    head = model.draft_head
    parts = {part.kind: part for part in head.parts} if head.kind == "union" else {head.kind: head}
    eagle = ctc = None
    if "eagle" in spec.kind:
        eagle = DeviceEagle(parts["eagle"], step, spec.depth, spec.width, spec.nodes)
    if "ctc" in spec.kind:
        tokenizer = get_tokenizer(model.is_multilingual, num_languages=model.num_languages)
        ctc = DeviceCtc(parts["ctc"], step, spec.ctc, tokenizer.eot, tokenizer.timestamp_begin,
                        *vocabulary_bytes(tokenizer, model.dims.n_vocab))
    if ctc is not None and eagle is not None:
        return DeviceUnion(ctc, eagle)
    return ctc if ctc is not None else eagle
