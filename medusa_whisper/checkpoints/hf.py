"""Hugging Face checkpoints: ``WhisperForConditionalGeneration`` and Whisper-Medusa, into our format.

A Hugging Face directory holds ``config.json`` and the weights as ``model.safetensors``,
``pytorch_model.bin``, or shards listed in ``model.safetensors.index.json`` /
``pytorch_model.bin.index.json``. safetensors are read without pickle; ``.bin`` files with
``torch.load(weights_only=True)``, so no code in them runs.

Whisper-Medusa (aiola's reference implementation, see FACTS.md) keeps the whole Whisper model under
``whisper_model.`` (its ``proj_out`` tied to the token embedding and absent), the heads as
``medusa_heads.{head}.{layer}.linear.{weight,bias}`` and, for ``medusa_block``, an extra decoder
layer as ``medusa_block.*``. Its ``base_head`` layout has N+1 heads, head 0 giving the next-token
logits; ``medusa_block`` has N heads and vanilla next-token logits.

Every tensor is mapped by an explicit rule and checked against the model it must fill: a tensor that
is missing, left over or of the wrong shape stops the conversion with one line naming it.
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Dict, List, Optional, Tuple

import torch
from whisper.model import ModelDimensions

from ..errors import CheckpointError
from ..drafting.heads import MedusaConfig

HF_WEIGHT_FILES = ("model.safetensors", "pytorch_model.bin")
HF_INDEX_FILES = ("model.safetensors.index.json", "pytorch_model.bin.index.json")
MEDUSA_HEAD_TYPES = {"base_head": "base_head", "medusa_block": "block"}

# names inside one transformer layer: Hugging Face -> openai-whisper
_LAYER_NAMES = [
    ("self_attn.q_proj.", "attn.query."),
    ("self_attn.k_proj.", "attn.key."),
    ("self_attn.v_proj.", "attn.value."),
    ("self_attn.out_proj.", "attn.out."),
    ("self_attn_layer_norm.", "attn_ln."),
    ("encoder_attn.q_proj.", "cross_attn.query."),
    ("encoder_attn.k_proj.", "cross_attn.key."),
    ("encoder_attn.v_proj.", "cross_attn.value."),
    ("encoder_attn.out_proj.", "cross_attn.out."),
    ("encoder_attn_layer_norm.", "cross_attn_ln."),
    ("fc1.", "mlp.0."),
    ("fc2.", "mlp.2."),
    ("final_layer_norm.", "mlp_ln."),
]
# names outside the layers
_MODEL_NAMES = {
    "model.encoder.conv1.weight": "encoder.conv1.weight",
    "model.encoder.conv1.bias": "encoder.conv1.bias",
    "model.encoder.conv2.weight": "encoder.conv2.weight",
    "model.encoder.conv2.bias": "encoder.conv2.bias",
    "model.encoder.embed_positions.weight": "encoder.positional_embedding",
    "model.encoder.layer_norm.weight": "encoder.ln_post.weight",
    "model.encoder.layer_norm.bias": "encoder.ln_post.bias",
    "model.decoder.embed_tokens.weight": "decoder.token_embedding.weight",
    "model.decoder.embed_positions.weight": "decoder.positional_embedding",
    "model.decoder.layer_norm.weight": "decoder.ln.weight",
    "model.decoder.layer_norm.bias": "decoder.ln.bias",
}
_LAYER_KEY = re.compile(r"^model\.(encoder|decoder)\.layers\.(\d+)\.(.+)$")
_HEAD_KEY = re.compile(r"^medusa_heads\.(\d+)\.(\d+)\.linear\.(weight|bias)$")


def is_hf_dir(path: Path) -> bool:
    return path.is_dir() and (path / "config.json").is_file() and any(
        (path / name).is_file() for name in HF_WEIGHT_FILES + HF_INDEX_FILES)


def _layer_name(rest: str) -> Optional[str]:
    for hf, ours in _LAYER_NAMES:
        if rest.startswith(hf):
            return ours + rest[len(hf):]
    return None


def map_whisper_key(key: str) -> Optional[str]:
    """openai-whisper's name of a ``WhisperForConditionalGeneration`` tensor; None if it has none."""
    if key in _MODEL_NAMES:
        return _MODEL_NAMES[key]
    match = _LAYER_KEY.match(key)
    if match:
        stack, index, rest = match.groups()
        inner = _layer_name(rest)
        if inner is not None:
            return f"{stack}.blocks.{index}.{inner}"
    return None


def map_medusa_key(key: str) -> Optional[str]:
    """Our name of a Whisper-Medusa head or block tensor (``medusa.*``); None if it has none."""
    match = _HEAD_KEY.match(key)
    if match:
        head, layer, kind = match.groups()
        return f"medusa.stacks.{head}.{layer}.linear.{kind}"
    if key.startswith("medusa_block."):
        inner = _layer_name(key[len("medusa_block."):])
        return None if inner is None else "medusa.block." + inner
    return None


def read_config(folder: Path) -> dict:
    try:
        return json.loads((folder / "config.json").read_text(encoding="utf-8"))
    except (OSError, ValueError) as e:
        raise CheckpointError(f"{folder / 'config.json'}: cannot be read as JSON ({e})") from e


def dims_from_config(config: dict, source: str) -> ModelDimensions:
    """whisper's ModelDimensions from a Hugging Face WhisperConfig."""
    names = dict(n_mels="num_mel_bins", n_audio_ctx="max_source_positions", n_audio_state="d_model",
                 n_audio_head="encoder_attention_heads", n_audio_layer="encoder_layers", n_vocab="vocab_size",
                 n_text_ctx="max_target_positions", n_text_state="d_model", n_text_head="decoder_attention_heads",
                 n_text_layer="decoder_layers")
    missing = [hf for hf in names.values() if not isinstance(config.get(hf), int)]
    if missing:
        raise CheckpointError(f"{source}: config.json lacks {', '.join(sorted(set(missing)))}; "
                              f"not a Whisper configuration")
    for ffn in ("encoder_ffn_dim", "decoder_ffn_dim"):
        if config.get(ffn, 4 * config["d_model"]) != 4 * config["d_model"]:
            # openai-whisper's MLP is fixed at 4 x d_model
            raise CheckpointError(f"{source}: {ffn} is {config[ffn]}, but openai-whisper's layers need "
                                  f"4 x d_model = {4 * config['d_model']}")
    return ModelDimensions(**{ours: config[hf] for ours, hf in names.items()})


def medusa_config_from(config: dict, source: str) -> Optional[MedusaConfig]:
    """The head configuration of a Whisper-Medusa config.json; None for plain Whisper."""
    heads_type = config.get("medusa_heads_type")
    if heads_type is None:
        return None
    if heads_type not in MEDUSA_HEAD_TYPES:
        raise CheckpointError(f"{source}: medusa_heads_type {heads_type!r} is not one of {sorted(MEDUSA_HEAD_TYPES)}")
    hidden = config.get("medusa_hidden_size", config.get("d_model"))
    if hidden != config.get("d_model"):
        # RB(x) = x + SiLU(W x + b) only adds up when W is square
        raise CheckpointError(f"{source}: medusa_hidden_size {hidden} differs from d_model {config.get('d_model')}")
    return MedusaConfig(num_heads=int(config.get("medusa_num_heads", 0)), heads_type=MEDUSA_HEAD_TYPES[heads_type],
                        num_layers=int(config.get("medusa_num_layers", 1)))


def weight_files(folder: Path) -> List[Path]:
    """The files holding the weights: the shards an index lists, or the single file."""
    for index_name in HF_INDEX_FILES:
        index = folder / index_name
        if index.is_file():
            try:
                weight_map = json.loads(index.read_text(encoding="utf-8"))["weight_map"]
            except (OSError, ValueError, KeyError) as e:
                raise CheckpointError(f"{index}: not a weight index (needs 'weight_map')") from e
            shards = sorted(set(weight_map.values()))
            absent = [s for s in shards if not (folder / s).is_file()]
            if absent:
                raise CheckpointError(f"{index}: lists shard {absent[0]}, which is not in {folder}")
            return [folder / s for s in shards]
    for name in HF_WEIGHT_FILES:
        if (folder / name).is_file():
            return [folder / name]
    raise CheckpointError(f"{folder}: no {' or '.join(HF_WEIGHT_FILES)} and no index of shards")


def read_tensors(path: Path) -> Dict[str, torch.Tensor]:
    """One weight file, read without running code in it."""
    try:
        if path.suffix == ".safetensors":
            from safetensors.torch import load_file

            return load_file(str(path), device="cpu")
        state = torch.load(path, map_location="cpu", weights_only=True)
    except Exception as e:  # safetensors and torch raise many types for truncated or foreign files
        if "Unsupported global" in str(e) or "Weights only load failed" in str(e):
            raise CheckpointError(f"{path}: refused: it holds Python objects, which could run code when "
                                  f"loaded; only tensors are read") from None
        first = str(e).splitlines()[0][:120] if str(e) else ""
        raise CheckpointError(f"{path}: cannot be read as weights (truncated or damaged: {type(e).__name__}"
                              f"{': ' + first if first else ''})") from None
    if not isinstance(state, dict) or not all(isinstance(v, torch.Tensor) for v in state.values()):
        raise CheckpointError(f"{path}: does not hold a dict of tensors")
    return state


def convert_hf(folder: Path, expected_shapes) -> dict:
    """Our checkpoint dict from a Hugging Face Whisper or Whisper-Medusa directory.

    expected_shapes : callable(dims, medusa config) -> {name: shape} of the model to fill
    """
    folder = Path(folder)
    source = str(folder)
    config = read_config(folder)
    dims = dims_from_config(config, source)
    medusa = medusa_config_from(config, source)
    tensors: Dict[str, torch.Tensor] = {}
    for path in weight_files(folder):
        tensors.update(read_tensors(path))

    prefix = "whisper_model." if medusa is not None else ""
    state: Dict[str, torch.Tensor] = {}
    tied: Optional[Tuple[str, torch.Tensor]] = None
    for key, tensor in tensors.items():
        if prefix and not key.startswith(prefix):
            name = map_medusa_key(key)
        elif key[len(prefix):] == "proj_out.weight":
            tied = (key, tensor)  # the output projection is the token embedding; checked below
            continue
        else:
            name = map_whisper_key(key[len(prefix):])
        if name is None:
            raise CheckpointError(f"{source}: unexpected tensor {key} {tuple(tensor.shape)}; no rule maps it")
        state[name] = tensor.float()

    if tied is not None:
        embedding = state.get("decoder.token_embedding.weight")
        if embedding is None or tied[1].shape != embedding.shape or not torch.equal(tied[1].float(), embedding):
            raise CheckpointError(f"{source}: {tied[0]} differs from the token embedding; Whisper ties them, "
                                  f"and an untied projection is not supported")

    expected = expected_shapes(dims, medusa or MedusaConfig())
    for name, shape in expected.items():
        if name not in state:
            raise CheckpointError(f"{source}: missing tensor for {name} {tuple(shape)} "
                                  f"(Hugging Face name {_hf_name(name, prefix)})")
        if tuple(state[name].shape) != tuple(shape):
            raise CheckpointError(f"{source}: tensor {_hf_name(name, prefix)} has shape {tuple(state[name].shape)}, "
                                  f"expected {tuple(shape)}")
    leftover = sorted(set(state) - set(expected))
    if leftover:
        raise CheckpointError(f"{source}: unexpected tensor {_hf_name(leftover[0], prefix)}; the configuration "
                              f"does not use it")

    checkpoint = {"dims": dims.__dict__, "model_state_dict": state}
    if medusa is not None:
        checkpoint["medusa"] = medusa.to_dict()
    alignment = _alignment_heads(folder)
    if alignment:
        checkpoint["alignment_heads"] = alignment
    return checkpoint


def _hf_name(name: str, prefix: str) -> str:
    """The Hugging Face name of one of our tensors, for messages."""
    if name.startswith("medusa.stacks."):
        head, layer, rest = name[len("medusa.stacks."):].split(".", 2)
        return f"medusa_heads.{head}.{layer}.{rest}"
    for hf, ours in _MODEL_NAMES.items():
        if ours == name:
            return prefix + hf
    match = re.match(r"^(medusa\.block|encoder\.blocks\.(\d+)|decoder\.blocks\.(\d+))\.(.+)$", name)
    if match:
        head, rest = match.group(1), match.group(4)
        for hf, ours in _LAYER_NAMES:
            if rest.startswith(ours):
                inner = hf + rest[len(ours):]
                if head == "medusa.block":
                    return "medusa_block." + inner
                stack, index = head.split(".blocks.")
                return f"{prefix}model.{stack}.layers.{index}.{inner}"
    return name


def _alignment_heads(folder: Path) -> Optional[List[List[int]]]:
    """Word-alignment heads from generation_config.json, when it lists them."""
    path = folder / "generation_config.json"
    if not path.is_file():
        return None
    try:
        heads = json.loads(path.read_text(encoding="utf-8")).get("alignment_heads")
    except (OSError, ValueError):
        return None
    if not heads:
        return None
    return [[int(layer), int(head)] for layer, head in heads]
