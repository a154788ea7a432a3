"""The one place that turns a decoding's options into its proposer.

Every speculative setting of ``MedusaDecodingOptions`` (``draft_tokens``, ``tree_width``,
``tree_nodes``, ``num_heads``, ``adaptive_lookahead``, ``lossy_ctc_entropy``) is read here and
nowhere else: the proposers take plain values, and the draft-head modules only compute (a
``DraftHead`` has no method that builds a proposer). What the model carries picks the proposer:

- a draft model passed to the decoding: ``draft_model.Drafter`` (on the host);
- Medusa heads (``model.medusa``, any kind): ``device.medusa.DeviceMedusa``;
- a draft head (``model.draft_head``): by its ``kind``, ``device.eagle.DeviceEagle``, the CTC
  head's pointer (``device.ctc.DeviceCtc``) or its host proposer (``ctc_proposer.CtcProposer``),
  or the union of its parts;
- nothing, or ``mode="off"``: no proposer (plain greedy steps).

The Medusa heads and the EAGLE head have one proposer each, which drafts inside the pass: on the
fixed-shape step with the device's acceptance (``device_spec``, then ``device_proposer``) it is
part of the captured program; where the host accepts (the CPU), the same proposer on the CPU's
step is driven between passes (``host_spec``, then ``make_proposer``'s ``Hosted``).
"""

from __future__ import annotations

import time
from dataclasses import dataclass, replace
from typing import Optional

from torch import Tensor
from whisper.tokenizer import get_tokenizer

from .base import Proposer
from .ctc_proposer import CtcProposer, DraftSettings
from .draft_head import DraftHead, head_part
from .draft_model import Drafter
from .eagle import DEFAULT_TREE_NODES
from .device.base import DeviceProposer
from .device.ctc import DeviceCtc, vocabulary_bytes
from .device.eagle import DeviceEagle
from .device.hosted import Hosted
from .device.medusa import DeviceMedusa
from .device.union import DeviceUnion
from .lookahead import MAX_TOKENS, Lookahead
from .pass_costs import chosen_chain_depth, draft_model_costs
from ..options import DRAFT_TOKENS, MedusaDecodingOptions
from .union import UnionProposer


def make_proposer(model, audio_features: Tensor, language: str, options: MedusaDecodingOptions,
                  task=None, draft=None, draft_mel: Optional[Tensor] = None,
                  in_pass: Optional[DeviceProposer] = None) -> Optional[Proposer]:
    """The host proposer of one decoding of ``model`` on a window, or None for plain greedy steps.

    audio_features : shape = (1, n_audio_ctx, n_audio_state), the window's encoder output
    language       : the decoding's language (given, or detected on this window)
    task           : whisper's DecodingTask of the decoding (needed by a draft model only)
    draft, draft_mel : a draft model and its log-mel of the window
    in_pass        : the proposer ``host_spec`` asks for, built on the decoder's step: the Medusa
                     heads and the EAGLE head draft by it, driven between passes (``Hosted``)
    """
    if options.mode == "off":
        return None
    if draft is not None:
        measured = None
        if options.draft_tokens is None and not options.adaptive_lookahead:
            measured = Lookahead(*draft_model_costs(model, draft, MAX_TOKENS))
        return Drafter(draft, draft_mel, task, language, options.draft_tokens or DRAFT_TOKENS,
                       options.adaptive_lookahead, measured)
    head = getattr(model, "draft_head", None)
    heads = getattr(model, "medusa", None)
    if head is None and (heads is None or in_pass is None):
        return None
    tokenizer = get_tokenizer(model.is_multilingual, num_languages=model.num_languages, language=language,
                              task=options.task or "transcribe")
    hosted = None if in_pass is None else Hosted(in_pass, audio_features, tokenizer, model.dims.n_text_ctx)
    if head is None:
        return hosted
    if head_part(head, "eagle") is not None and hosted is None and host_spec(model, options) is not None:
        raise ValueError("the EAGLE head drafts by its in-pass proposer: pass in_pass (host_spec's)")
    return head_proposer(head, model, audio_features, tokenizer, options, hosted)


def head_proposer(head: DraftHead, model, audio_features: Tensor, tokenizer, options: MedusaDecodingOptions,
                  hosted: Optional[Proposer] = None) -> Optional[Proposer]:
    """The host proposer of a draft head, by its kind (a union's parts each by theirs): the CTC
    head's own, or ``hosted`` (the EAGLE head's in-pass proposer, driven between passes). None
    for an EAGLE head without one: ``host_spec`` asks for none where no chain pays on this machine,
    so it drafts nothing (and a union is its other parts)."""
    if head.kind == "union":
        parts = [head_proposer(part, model, audio_features, tokenizer, options, hosted) for part in head.parts]
        parts = [part for part in parts if part is not None]
        return (UnionProposer(parts) if len(parts) > 1 else parts[0]) if parts else None
    if head.kind == "eagle":
        return hosted
    if head.kind == "ctc":
        began = time.perf_counter()
        draft = head.draft(audio_features)  # the whole window's draft, once: part of what drafting costs
        seconds = time.perf_counter() - began
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
        depth, width = options.draft_tokens or DRAFT_TOKENS, options.tree_width
        nodes = options.tree_nodes or (depth if width == 1 else DEFAULT_TREE_NODES)
        ctc = head_part(head, "ctc")
        settings = None if ctc is None else ctc.draft_settings()
        if kinds == ["eagle"]:
            return DeviceSpec("eagle", depth, width, nodes)
        if kinds == ["ctc"]:
            return DeviceSpec("ctc", ctc=settings)
        if kinds == ["ctc", "eagle"]:
            return DeviceSpec("ctc+eagle", depth, width, nodes, ctc=settings)
        return None
    heads = getattr(model, "medusa", None)
    if heads is None:
        return None
    num_heads = heads.num_heads if options.num_heads is None else min(heads.num_heads, options.num_heads)
    if num_heads == 0:
        return None
    width = options.tree_width
    return DeviceSpec("medusa", num_heads, width, options.tree_nodes or num_heads * width)


def host_spec(model, options: MedusaDecodingOptions, draft=None) -> Optional[DeviceSpec]:
    """The in-pass proposer that the host's acceptance drives between passes (``make_proposer``'s
    ``in_pass``): the Medusa heads and the EAGLE head, a union's EAGLE part among them. The CTC
    head drafts on the host there: its character alignment keeps in step better than the pointer
    (docs/gpu.md), and the host's walk does not pay for its long chunks' rows."""
    spec = device_spec(model, options, draft)
    if spec is None or spec.kind == "ctc":
        return None
    if spec.kind == "ctc+eagle":
        spec = replace(spec, kind="eagle", ctc=None)
    if spec.kind == "eagle" and spec.width == 1 and options.draft_tokens is None:
        depth = chosen_chain_depth(model, head_part(model.draft_head, "eagle"))
        if depth == 0:  # no chain pays on this machine: the EAGLE head drafts nothing (head_proposer)
            return None
        spec = replace(spec, depth=depth, nodes=options.tree_nodes or depth)
    return spec


def device_proposer(spec: DeviceSpec, model, step) -> DeviceProposer:
    """The proposer ``spec`` describes, drafting on the buffers of ``step`` (a ``FixedStep``)."""
    if spec.kind == "medusa":
        return DeviceMedusa(model.medusa, step, spec.depth, spec.width, spec.nodes)
    head = model.draft_head
    eagle = ctc = None
    if "eagle" in spec.kind:
        eagle = DeviceEagle(head_part(head, "eagle"), step, spec.depth, spec.width, spec.nodes)
    if "ctc" in spec.kind:
        tokenizer = get_tokenizer(model.is_multilingual, num_languages=model.num_languages)
        ctc = DeviceCtc(head_part(head, "ctc"), step, spec.ctc, tokenizer.eot, tokenizer.timestamp_begin,
                        *vocabulary_bytes(tokenizer, model.dims.n_vocab))
    if ctc is not None and eagle is not None:
        return DeviceUnion(ctc, eagle)
    return ctc if ctc is not None else eagle
