"""whisper.cpp's legacy ggml model file, written from a loaded openai-whisper model, and read back.

One job: the bytes whisper.cpp's ``whisper_model_load`` reads, so that whisper.cpp can run the very
weights our other systems run (``make bench``). The layout, in order (all little-endian):

1. magic ``0x67676d6c`` ("ggml"), eleven int32 hyper-parameters: n_vocab, n_audio_ctx,
   n_audio_state, n_audio_head, n_audio_layer, n_text_ctx, n_text_state, n_text_head,
   n_text_layer, n_mels, ftype;
2. the mel filter bank: int32 n_mel, int32 n_fft, then n_mel * n_fft float32 (whisper's own
   mel_filters.npz);
3. the vocabulary: int32 count, then per token (in rank order, id = position) an int32 length and
   the token's bytes, from whisper's tiktoken file; whisper.cpp names the special tokens itself;
4. the tensors until the end of the file: int32 n_dims, int32 name length, int32 ttype, n_dims int32
   sizes innermost first (ggml's ``ne``, i.e. torch's shape reversed), the name, the data.

Which tensor has which type is not the writer's choice: whisper.cpp's loader allocates each tensor
with a fixed type and reads ``ggml_nbytes`` of it, so a file must match it (see ``tensor_types``).
Places where this module departs from whisper.cpp's own tools (models/convert-pt-to-ggml.py and
examples/quantize) are marked "Departs from".
"""

from __future__ import annotations

import base64
import os
import struct
from dataclasses import dataclass, field
from pathlib import Path
from typing import BinaryIO, Dict, List, Optional, Tuple, Union

import numpy as np

from ..errors import CheckpointError
from ..paths import atomic_path

MAGIC = 0x67676D6C

# ggml_type ids, as in ggml.h (the same in the whisper.cpp that pywhispercpp 1.5.1 bundles)
GGML_TYPE_F32 = 0
GGML_TYPE_F16 = 1
GGML_TYPE_Q8_0 = 8
TYPE_NAMES = {GGML_TYPE_F32: "f32", GGML_TYPE_F16: "f16", GGML_TYPE_Q8_0: "q8_0"}
TYPES = {name: ttype for ttype, name in TYPE_NAMES.items()}

# The header's ftype is a ggml_ftype (MOSTLY_F16 = 1, MOSTLY_Q8_0 = 7), and a quantised file adds
# GGML_QNT_VERSION * GGML_QNT_VERSION_FACTOR (2 * 1000) as whisper.cpp's quantize tool does; the
# loader takes ``ftype % 1000``.
QNT_VERSION_FACTOR = 1000
QNT_VERSION = 2
FILE_FTYPES = {"f32": 0, "f16": 1, "q8_0": QNT_VERSION * QNT_VERSION_FACTOR + 7}

QK8_0 = 32  # values per q8_0 block
Q8_0_BLOCK = np.dtype([("d", "<f2"), ("qs", "i1", (QK8_0,))])  # 34 bytes: an fp16 scale, 32 int8

HPARAMS = ("n_vocab", "n_audio_ctx", "n_audio_state", "n_audio_head", "n_audio_layer", "n_text_ctx",
           "n_text_state", "n_text_head", "n_text_layer", "n_mels")

# The conv biases are (n_state,) in whisper and (n_state, 1) in whisper.cpp (ggml ne = [1, n_state]),
# so that they broadcast over time in ggml; both converter and loader say so.
CONV_BIASES = ("encoder.conv1.bias", "encoder.conv2.bias")


# -- what whisper.cpp expects --------------------------------------------------------------------------

def tensor_shapes(dims) -> Dict[str, Tuple[int, ...]]:
    """{name: shape in torch order} of every tensor whisper.cpp's loader creates, nothing more.

    Departs from convert-pt-to-ggml.py, which writes whatever the checkpoint holds: a checkpoint of
    ours may carry more (Medusa or draft heads), and whisper.cpp refuses a file with an unknown
    tensor, so the list comes from the loader's side.
    """
    a, t = dims.n_audio_state, dims.n_text_state
    shapes: Dict[str, Tuple[int, ...]] = {
        "encoder.positional_embedding": (dims.n_audio_ctx, a),
        "encoder.conv1.weight": (a, dims.n_mels, 3), "encoder.conv1.bias": (a, 1),
        "encoder.conv2.weight": (a, a, 3), "encoder.conv2.bias": (a, 1),
        "encoder.ln_post.weight": (a,), "encoder.ln_post.bias": (a,),
        "decoder.positional_embedding": (dims.n_text_ctx, t),
        "decoder.token_embedding.weight": (dims.n_vocab, t),
        "decoder.ln.weight": (t,), "decoder.ln.bias": (t,),
    }

    def block(prefix: str, n: int, attentions: Tuple[str, ...]) -> None:
        for attn in attentions:
            shapes[f"{prefix}.{attn}_ln.weight"] = shapes[f"{prefix}.{attn}_ln.bias"] = (n,)
            for proj in ("query", "key", "value", "out"):
                shapes[f"{prefix}.{attn}.{proj}.weight"] = (n, n)
                if proj != "key":  # whisper's key projections have no bias
                    shapes[f"{prefix}.{attn}.{proj}.bias"] = (n,)
        shapes[f"{prefix}.mlp_ln.weight"] = shapes[f"{prefix}.mlp_ln.bias"] = (n,)
        shapes[f"{prefix}.mlp.0.weight"], shapes[f"{prefix}.mlp.0.bias"] = (4 * n, n), (4 * n,)
        shapes[f"{prefix}.mlp.2.weight"], shapes[f"{prefix}.mlp.2.bias"] = (n, 4 * n), (n,)

    for i in range(dims.n_audio_layer):
        block(f"encoder.blocks.{i}", a, ("attn",))
    for i in range(dims.n_text_layer):
        block(f"decoder.blocks.{i}", t, ("attn", "cross_attn"))
    return shapes


def tensor_types(shapes: Dict[str, Tuple[int, ...]], file_type: str) -> Dict[str, int]:
    """{name: ggml_type} as whisper.cpp's loader allocates them for a file of ``file_type``.

    The loader's rule: the weight matrices (attention, MLP, token embedding) in the file's type;
    the conv kernels in f16 unless the file is f32; the rest (positional embeddings, conv biases,
    layer norms, biases) always f32. For f16 this is what convert-pt-to-ggml.py writes (f32 when
    n_dims < 2, for the conv biases and the positional embeddings); for q8_0 what examples/quantize
    writes (it quantises only 2-D tensors and skips the conv biases and positional embeddings).
    """
    matrix = TYPES[file_type]
    kernel = GGML_TYPE_F32 if file_type == "f32" else GGML_TYPE_F16
    types = {}
    for name, shape in shapes.items():
        if len(shape) == 3:
            types[name] = kernel
        elif len(shape) == 2 and name.endswith(".weight"):  # not the (n, 1) conv biases
            types[name] = matrix
        else:
            types[name] = GGML_TYPE_F32
    return types


# -- encoding ------------------------------------------------------------------------------------------

def quantize_q8_0(values: np.ndarray) -> np.ndarray:
    """q8_0 blocks of ``values`` (rows a multiple of 32 long): per 32 values d = max|x| / 127 stored
    as float16, q = round(x / d) as int8, as ggml's reference quantize_row_q8_0.

    In float32 throughout, with x * (1 / d) and rounding half away from zero as C's roundf, so the
    blocks equal ggml's own for the same float32 input.
    """
    x = np.ascontiguousarray(values, dtype=np.float32).reshape(-1, QK8_0)
    d = np.abs(x).max(axis=1) / np.float32(127)
    with np.errstate(divide="ignore"):
        inverse = np.where(d > 0, np.float32(1) / d, np.float32(0)).astype(np.float32)
    scaled = x * inverse[:, None]
    magnitude = np.abs(scaled)
    rounded = np.floor(magnitude)
    rounded += (magnitude - rounded) >= 0.5  # exact for |x| < 2**23: roundf, not numpy's half-to-even
    blocks = np.empty(len(x), dtype=Q8_0_BLOCK)
    blocks["d"] = d.astype(np.float16)
    blocks["qs"] = (np.sign(scaled) * rounded).astype(np.int8)
    return blocks


def dequantize_q8_0(blocks: np.ndarray, shape: Tuple[int, ...]) -> np.ndarray:
    """float32 values of q8_0 blocks: q * d (d widened from float16), as ggml does."""
    values = blocks["qs"].astype(np.float32) * blocks["d"].astype(np.float32)[:, None]
    return values.reshape(shape)


def encode_tensor(values: np.ndarray, ttype: int) -> bytes:
    """The data bytes of one tensor of ``ttype``, rows contiguous (C order = ggml's ne0 innermost)."""
    if ttype == GGML_TYPE_F32:
        return np.ascontiguousarray(values, dtype="<f4").tobytes()
    if ttype == GGML_TYPE_F16:
        return np.ascontiguousarray(values, dtype="<f2").tobytes()
    if ttype == GGML_TYPE_Q8_0:
        if values.shape[-1] % QK8_0:
            raise ValueError(f"q8_0 needs rows a multiple of {QK8_0} long, not {values.shape[-1]}")
        return quantize_q8_0(values).tobytes()
    raise ValueError(f"ggml type {ttype} is not written here")


def tensor_nbytes(shape: Tuple[int, ...], ttype: int) -> int:
    count = int(np.prod(shape))
    if ttype == GGML_TYPE_Q8_0:
        return count // QK8_0 * Q8_0_BLOCK.itemsize
    return count * (4 if ttype == GGML_TYPE_F32 else 2)


# -- whisper's assets -----------------------------------------------------------------------------------

def _whisper_assets() -> Path:
    import whisper

    return Path(whisper.__file__).parent / "assets"


def mel_filters(n_mels: int) -> np.ndarray:
    """whisper's own filter bank (n_mels, 201), float32: the one openai-whisper computes with."""
    with np.load(_whisper_assets() / "mel_filters.npz") as f:
        return np.asarray(f[f"mel_{n_mels}"], dtype=np.float32)


def vocabulary(multilingual: bool) -> List[bytes]:
    """The tokens of whisper's tiktoken file, index = rank; the special tokens are not in it."""
    name = "multilingual" if multilingual else "gpt2"
    ranks = {}
    for line in (_whisper_assets() / f"{name}.tiktoken").read_bytes().splitlines():
        if line:
            token, rank = line.split()
            ranks[int(rank)] = base64.b64decode(token)
    if sorted(ranks) != list(range(len(ranks))):
        raise ValueError(f"{name}.tiktoken: ranks are not 0..{len(ranks) - 1}")
    return [ranks[i] for i in range(len(ranks))]


# -- writing -------------------------------------------------------------------------------------------

def write_ggml(model, out: Union[str, os.PathLike], file_type: str = "f16") -> Path:
    """Write ``model`` (an openai-whisper ``Whisper``, e.g. a MedusaWhisper) as whisper.cpp's ggml file.

    Only the base model's tensors are written (no Medusa or draft heads: whisper.cpp has no use
    for them). Written beside ``out`` and renamed onto it when complete.
    """
    if file_type not in FILE_FTYPES:
        raise ValueError(f"ggml type {file_type!r}: expected one of {', '.join(FILE_FTYPES)}")
    out = Path(out)
    dims = model.dims
    shapes = tensor_shapes(dims)
    types = tensor_types(shapes, file_type)
    state = model.state_dict()
    missing = [name for name in shapes if name not in state]
    if missing:
        raise CheckpointError(f"the model has no {missing[0]} (and {len(missing) - 1} more): not a whisper model")
    filters = mel_filters(dims.n_mels)
    tokens = vocabulary(model.is_multilingual)
    with atomic_path(out) as tmp, tmp.open("wb") as f:
        f.write(struct.pack("<12i", MAGIC, *(getattr(dims, h) for h in HPARAMS), FILE_FTYPES[file_type]))
        f.write(struct.pack("<2i", *filters.shape))
        f.write(filters.astype("<f4").tobytes())
        # Departs from convert-pt-to-ggml.py only in source: the converter reads the same tiktoken
        # file from a whisper checkout; this reads the installed openai-whisper's copy.
        f.write(struct.pack("<i", len(tokens)))
        for token in tokens:
            f.write(struct.pack("<i", len(token)) + token)
        for name, shape in shapes.items():
            values = state[name].detach().to("cpu").float().numpy().reshape(shape)
            _write_tensor(f, name, values, types[name])
    return out


def _write_tensor(f: BinaryIO, name: str, values: np.ndarray, ttype: int) -> None:
    encoded = name.encode()
    f.write(struct.pack("<3i", values.ndim, len(encoded), ttype))
    f.write(struct.pack(f"<{values.ndim}i", *reversed(values.shape)))  # ggml's ne: innermost first
    f.write(encoded)
    f.write(encode_tensor(values, ttype))


# -- reading -------------------------------------------------------------------------------------------

@dataclass
class GgmlTensor:
    name: str
    ttype: int
    shape: Tuple[int, ...]  # torch order (ggml's ne reversed)
    offset: int  # of the data in the file
    nbytes: int


@dataclass
class GgmlFile:
    path: Path
    hparams: Dict[str, int]
    ftype: int  # as written, quantisation version included
    mel_filters: np.ndarray
    vocab: List[bytes]
    tensors: Dict[str, GgmlTensor] = field(default_factory=dict)

    @property
    def file_type(self) -> Optional[str]:
        """"f32", "f16" or "q8_0" from the header's ftype, None for another."""
        return {0: "f32", 1: "f16", 7: "q8_0"}.get(self.ftype % QNT_VERSION_FACTOR)

    def array(self, name: str) -> np.ndarray:
        """A tensor's values as float32 in torch order (q8_0 dequantised)."""
        t = self.tensors[name]
        with self.path.open("rb") as f:
            f.seek(t.offset)
            raw = f.read(t.nbytes)
        if t.ttype == GGML_TYPE_Q8_0:
            return dequantize_q8_0(np.frombuffer(raw, dtype=Q8_0_BLOCK), t.shape)
        dtype = "<f4" if t.ttype == GGML_TYPE_F32 else "<f2"
        return np.frombuffer(raw, dtype=dtype).astype(np.float32).reshape(t.shape)


def read_ggml(path: Union[str, os.PathLike]) -> GgmlFile:
    """Header, filters, vocabulary and the tensor table (not the data) of a ggml file."""
    path = Path(path)
    size = path.stat().st_size
    with path.open("rb") as f:
        def ints(n: int) -> Tuple[int, ...]:
            raw = f.read(4 * n)
            if len(raw) != 4 * n:
                raise CheckpointError(f"{path}: truncated ggml file (at byte {f.tell()})")
            return struct.unpack(f"<{n}i", raw)

        magic, *values = ints(12)
        if magic & 0xFFFFFFFF != MAGIC:
            raise CheckpointError(f"{path}: not a ggml file (magic {magic & 0xFFFFFFFF:#x}, expected {MAGIC:#x})")
        hparams = dict(zip(HPARAMS, values[:10]))
        n_mel, n_fft = ints(2)
        filters = np.frombuffer(f.read(4 * n_mel * n_fft), dtype="<f4").reshape(n_mel, n_fft)
        vocab = [f.read(ints(1)[0]) for _ in range(ints(1)[0])]
        file = GgmlFile(path, hparams, values[10], filters, vocab)
        while f.tell() < size:
            n_dims, name_length, ttype = ints(3)
            if not 0 < n_dims <= 4 or ttype not in TYPE_NAMES:
                raise CheckpointError(f"{path}: unreadable tensor header at byte {f.tell() - 12}")
            shape = tuple(reversed(ints(n_dims)))
            name = f.read(name_length).decode()
            nbytes = tensor_nbytes(shape, ttype)
            file.tensors[name] = GgmlTensor(name, ttype, shape, f.tell(), nbytes)
            f.seek(nbytes, os.SEEK_CUR)
        if f.tell() != size:
            raise CheckpointError(f"{path}: truncated ggml file (the last tensor ends past the end)")
    return file


# -- checking ------------------------------------------------------------------------------------------

def q8_0_bound(values: np.ndarray) -> np.ndarray:
    """The largest error q8_0 may make on each value: half a step of d = max|x| / 127, plus up to 127
    times the error of storing d as float16 (relative 2**-11, but absolute 2**-25 where d is below
    float16's normal range, 2**-14: small blocks of a trained model have such scales)."""
    x = np.asarray(values, dtype=np.float32).reshape(-1, QK8_0)
    d = np.abs(x).max(axis=1, keepdims=True).astype(np.float64) / 127
    scale_error = np.maximum(d * 2.0 ** -11, 2.0 ** -25)
    return np.broadcast_to((d / 2 + 127 * scale_error) * (1 + 1e-6), x.shape).reshape(values.shape)


def check_ggml(path: Union[str, os.PathLike], model=None) -> List[str]:
    """Problems of a ggml file as whisper.cpp would see them: header, names, shapes, types; with
    ``model``, also each tensor against the model's (f32 exact, f16 as float16, q8_0 within its
    bound). An empty list: none found."""
    file = read_ggml(path)
    problems = []
    if file.file_type is None:
        return [f"header ftype {file.ftype} is not f32, f16 or q8_0"]
    dims = _Dims(**file.hparams) if model is None else model.dims
    for name in HPARAMS:
        if file.hparams[name] != getattr(dims, name):
            problems.append(f"header {name} = {file.hparams[name]}, the model's is {getattr(dims, name)}")
    expected = tensor_shapes(dims)
    types = tensor_types(expected, file.file_type)
    for name in sorted(set(expected) - set(file.tensors)):
        problems.append(f"{name}: missing")
    for name in sorted(set(file.tensors) - set(expected)):
        problems.append(f"{name}: whisper.cpp does not know it")
    state = model.state_dict() if model is not None else {}
    for name, t in file.tensors.items():
        if name not in expected:
            continue
        if t.shape != expected[name] or t.ttype != types[name]:
            problems.append(f"{name}: {TYPE_NAMES[t.ttype]} {t.shape}, whisper.cpp expects "
                            f"{TYPE_NAMES[types[name]]} {expected[name]}")
        elif name in state:
            want = state[name].detach().to("cpu").float().numpy().reshape(t.shape)
            got = file.array(name)
            if t.ttype == GGML_TYPE_Q8_0:
                ok = bool(np.all(np.abs(got - want) <= q8_0_bound(want)))
            else:
                ok = np.array_equal(got, want.astype(np.float16 if t.ttype == GGML_TYPE_F16 else np.float32))
            if not ok:
                problems.append(f"{name}: values differ from the model's beyond {TYPE_NAMES[t.ttype]} rounding")
    return problems


@dataclass
class _Dims:
    """The header's dimensions, standing in for a model's ``dims`` when there is no model."""
    n_vocab: int
    n_audio_ctx: int
    n_audio_state: int
    n_audio_head: int
    n_audio_layer: int
    n_text_ctx: int
    n_text_state: int
    n_text_head: int
    n_text_layer: int
    n_mels: int
