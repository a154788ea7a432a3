"""whisper.cpp's ggml file (medusa_whisper/checkpoints/ggml.py): what is written reads back as the model's
weights, under the names, shapes and types whisper.cpp's loader expects, and whisper.cpp itself
transcribes with it what openai-whisper transcribes with the same weights."""

import json
import struct
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch
import whisper

import medusa_whisper
from medusa_whisper.checkpoints import ggml
from medusa_whisper.cli import main

DATA = Path(__file__).parent / "data"
ROOT = Path(__file__).parent.parent
CLIP = DATA / "espeak_weather.flac"


@pytest.fixture(scope="module")
def model():
    return medusa_whisper.load_model("tiny.en", device="cpu")


@pytest.fixture(scope="module")
def files(model, tmp_path_factory):
    out = tmp_path_factory.mktemp("ggml")
    return {t: ggml.write_ggml(model, out / f"tiny.en-{t}.bin", t) for t in ("f32", "f16", "q8_0")}


def test_header_holds_the_model_dims_and_whisper_assets(model, files):
    for file_type, path in files.items():
        f = ggml.read_ggml(path)
        with path.open("rb") as raw:
            assert struct.unpack("<I", raw.read(4))[0] == 0x67676D6C
        assert f.hparams == {name: getattr(model.dims, name) for name in ggml.HPARAMS}
        # f16 as convert-pt-to-ggml.py writes it; q8_0 as quantize does: GGML_FTYPE_MOSTLY_Q8_0 (7) + 2 * 1000
        assert f.ftype == {"f32": 0, "f16": 1, "q8_0": 2007}[file_type]
        assert f.file_type == file_type
        assert np.array_equal(f.mel_filters, whisper.audio.mel_filters("cpu", 80).numpy())
        # gpt2.tiktoken's 50256 tokens, id = position; whisper.cpp adds the 1608 special ones itself
        assert len(f.vocab) == 50256 and f.vocab[0] == b"!" and f.vocab[220] == b" "
        encoding = whisper.tokenizer.get_encoding("gpt2")
        assert f.vocab[encoding.encode(" weather")[0]] == b" weather"


def test_tensor_table_is_what_whisper_cpp_loads(files):
    """Names, shapes (torch order) and types against whisper.cpp's whisper_model_load, spelled out."""
    for file_type, path in files.items():
        tensors = ggml.read_ggml(path).tensors
        assert len(tensors) == 7 + 15 * 4 + 4 + 24 * 4  # the loader's count for 4 + 4 layers
        matrix = {"f32": ggml.GGML_TYPE_F32, "f16": ggml.GGML_TYPE_F16, "q8_0": ggml.GGML_TYPE_Q8_0}[file_type]
        kernel = ggml.GGML_TYPE_F32 if file_type == "f32" else ggml.GGML_TYPE_F16
        expect = {
            "encoder.positional_embedding": ((1500, 384), ggml.GGML_TYPE_F32),
            "encoder.conv1.weight": ((384, 80, 3), kernel),
            "encoder.conv1.bias": ((384, 1), ggml.GGML_TYPE_F32),  # ggml ne = [1, 384]
            "encoder.conv2.weight": ((384, 384, 3), kernel),
            "encoder.blocks.0.attn.query.weight": ((384, 384), matrix),
            "encoder.blocks.3.mlp.2.weight": ((384, 1536), matrix),
            "encoder.blocks.0.mlp_ln.bias": ((384,), ggml.GGML_TYPE_F32),
            "decoder.token_embedding.weight": ((51864, 384), matrix),
            "decoder.positional_embedding": ((448, 384), ggml.GGML_TYPE_F32),
            "decoder.blocks.3.cross_attn.out.weight": ((384, 384), matrix),
            "decoder.blocks.0.cross_attn.value.bias": ((384,), ggml.GGML_TYPE_F32),
            "decoder.ln.weight": ((384,), ggml.GGML_TYPE_F32),
        }
        for name, (shape, ttype) in expect.items():
            assert (tensors[name].shape, tensors[name].ttype) == (shape, ttype), (file_type, name)
        assert "encoder.blocks.0.attn.key.bias" not in tensors  # whisper has none; whisper.cpp refuses unknowns
        # the dims on disk are ggml's ne: innermost first
        with path.open("rb") as raw:
            t = tensors["encoder.conv1.weight"]
            raw.seek(t.offset - len(t.name) - 3 * 4)
            assert struct.unpack("<3i", raw.read(12)) == (3, 80, 384)


def test_values_read_back_as_the_model_s(model, files):
    state = model.state_dict()
    f32, f16, q8 = (ggml.read_ggml(files[t]) for t in ("f32", "f16", "q8_0"))
    for name, t in f32.tensors.items():
        want = state[name].float().reshape(t.shape)
        assert torch.equal(torch.from_numpy(f32.array(name)), want), name
        kind = f16.tensors[name].ttype
        expected16 = want.half().float() if kind == ggml.GGML_TYPE_F16 else want
        assert torch.equal(torch.from_numpy(f16.array(name)), expected16), name
        got8 = q8.array(name)
        if q8.tensors[name].ttype == ggml.GGML_TYPE_Q8_0:
            # per block of 32: |error| <= d / 2 + 127 * (error of d in float16), d = max|x| / 127
            blocks = want.numpy().reshape(-1, 32)
            d = np.abs(blocks).max(axis=1, keepdims=True).astype(np.float64) / 127
            bound = d / 2 + 127 * np.maximum(d * 2.0 ** -11, 2.0 ** -25)
            err = np.abs(got8.reshape(-1, 32) - blocks)
            assert np.all(err <= bound * (1 + 1e-6)), name
            assert err.max() > 0  # really quantised
        else:
            assert torch.equal(torch.from_numpy(got8), want.half().float() if q8.tensors[name].ttype == 1 else want)
    assert ggml.check_ggml(files["q8_0"], model) == []


def test_q8_0_blocks_are_ggml_s():
    x = np.zeros(64, dtype=np.float32)
    x[:4] = [127.0, -63.5, 0.5, 1.49]  # d = 1: ties round away from zero (C's roundf), not to even
    blocks = ggml.quantize_q8_0(x)
    assert blocks.dtype.itemsize == 34 and len(blocks) == 2
    assert blocks["d"][0] == 1.0 and list(blocks["qs"][0][:4]) == [127, -64, 1, 1]
    assert blocks["d"][1] == 0 and not blocks["qs"][1].any()  # an all-zero block: d 0, no division
    assert np.array_equal(ggml.dequantize_q8_0(blocks, (64,))[:4], [127, -64, 1, 1])


def test_a_failed_write_leaves_no_file(model, tmp_path, monkeypatch):
    out = tmp_path / "half.bin"
    calls = []

    def fail_later(values, ttype):
        calls.append(1)
        if len(calls) > 20:
            raise RuntimeError("disk full")
        return b""

    monkeypatch.setattr(ggml, "encode_tensor", fail_later)
    with pytest.raises(RuntimeError):
        ggml.write_ggml(model, out, "f16")
    assert list(tmp_path.iterdir()) == []


def test_check_finds_a_wrong_tensor(model, files, tmp_path):
    broken = tmp_path / "broken.bin"
    data = bytearray(files["f16"].read_bytes())
    t = ggml.read_ggml(files["f16"]).tensors["decoder.blocks.1.mlp.0.weight"]
    data[t.offset:t.offset + 2] = np.float16(1000).tobytes()
    broken.write_bytes(bytes(data))
    assert ggml.check_ggml(broken, model) == [
        "decoder.blocks.1.mlp.0.weight: values differ from the model's beyond f16 rounding"]


def test_cli_exports_and_bad_input_is_one_line(tmp_path, capsys):
    out = tmp_path / "m.bin"
    assert main(["export-ggml", "tiny.en", str(out), "--type", "q8_0", "--check"]) == 0
    assert ggml.read_ggml(out).file_type == "q8_0"
    capsys.readouterr()
    assert main(["export-ggml", "no-such-model", str(tmp_path / "x.bin")]) == 1
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "error" in err and "Traceback" not in err
    assert main(["export-ggml", "tiny.en", str(tmp_path)]) == 1  # a directory
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "cannot write" in err


# whisper.cpp runs in a subprocess: its wheel brings its own libgomp, which slows PyTorch for the
# rest of a process (tools/bench/systems.py), and a GGML_ASSERT would abort pytest itself.
WHISPER_CPP = """
import json, sys
import soundfile
sys.path.insert(0, sys.argv[3])
from tools.bench.systems import whisper_cpp_system
system = whisper_cpp_system("test", __import__("pathlib").Path(sys.argv[1]), threads=2)
if system.run is None:
    sys.exit(system.note)
audio, _ = soundfile.read(sys.argv[2], dtype="float32")
print(json.dumps(system.run(audio).__dict__))
"""


def test_whisper_cpp_transcribes_our_file_as_openai_whisper(model, files):
    pytest.importorskip("pywhispercpp", reason="whisper.cpp's bindings (the test extra installs them)")
    done = subprocess.run([sys.executable, "-c", WHISPER_CPP, str(files["f16"]), str(CLIP), str(ROOT)],
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    run = json.loads(done.stdout.strip().splitlines()[-1])
    audio = medusa_whisper.load_audio(str(CLIP))
    mel = whisper.log_mel_spectrogram(whisper.pad_or_trim(torch.from_numpy(audio)), 80)
    vanilla = whisper.decode(model, mel, whisper.DecodingOptions(language="en", fp16=False, without_timestamps=True))
    from medusa_whisper import evaluation

    norm = evaluation.normalizer("en")
    # Same weights rounded to f16 and another implementation's arithmetic (f16 matmuls, its own
    # mel): greedy may part at a near-tie, but on this clear 4-s clip it does not, so equal texts.
    assert norm(run["text"]) == norm(vanilla.text), (run["text"], vanilla.text)
    assert run["encode_seconds"] > 0 and run["decode_seconds"] > 0  # whisper.cpp's own split was read
