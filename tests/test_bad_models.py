"""Bad model files through the command line: each is one line naming the file and the problem.

Truncated, empty and foreign files, checkpoints of the wrong shape, CTranslate2 and Hugging Face
folders with a file missing, and pickles that would run code when loaded: nothing of theirs may
run (a payload that would leave a marker file proves it), and no traceback or library noise
reaches stderr.
"""

import json
import os
from pathlib import Path

import pytest
import torch
from safetensors.torch import save_file
from whisper.model import ModelDimensions

from medusa_whisper.cli import main
from medusa_whisper.checkpoints.weights import HEADS_ENV

from test_ctranslate2 import write_ct2_dir

GOOD = Path(__file__).parent / "data" / "flite_train.flac"
DIMS = ModelDimensions(n_mels=80, n_audio_ctx=1500, n_audio_state=64, n_audio_head=4, n_audio_layer=1,
                       n_vocab=51864, n_text_ctx=448, n_text_state=64, n_text_head=4, n_text_layer=1)

HF_CONFIG = dict(model_type="whisper", vocab_size=51865, num_mel_bins=80, d_model=64, encoder_layers=1,
                 decoder_layers=1, encoder_attention_heads=4, decoder_attention_heads=4, encoder_ffn_dim=256,
                 decoder_ffn_dim=256, max_source_positions=1500, max_target_positions=448)


class Payload:
    """Unpickled, it would create ``marker``: what a malicious checkpoint does with os.system."""

    def __init__(self, marker: Path):
        self.marker = marker

    def __reduce__(self):
        return (open, (str(self.marker), "w"))


def small_checkpoint() -> dict:
    from whisper.model import Whisper

    state = Whisper(DIMS).state_dict()
    return {"dims": DIMS.__dict__, "model_state_dict": state}


def _cases(folder: Path, marker: Path) -> dict:
    """name -> (model path, words the error line must hold)."""
    folder.mkdir()
    cases = {}

    def pt(name: str, content, words: str):
        path = folder / name
        if isinstance(content, bytes):
            path.write_bytes(content)
        else:
            torch.save(content, path)
        cases[name] = (path, words)

    good = small_checkpoint()
    torch.save(good, folder / "full.pt")
    data = (folder / "full.pt").read_bytes()
    pt("truncated.pt", data[: len(data) // 2], "not a readable checkpoint")
    pt("cut_at_end.pt", data[:-100], "not a readable checkpoint")
    pt("empty.pt", b"", "not a readable checkpoint")
    pt("random.pt", os.urandom(5000), "not a readable checkpoint")
    pt("text.pt", b"this is not a model\n" * 50, "not a readable checkpoint")
    pt("tensor.pt", torch.zeros(3), "not a whisper checkpoint")
    pt("no_state.pt", {"dims": DIMS.__dict__}, "not a whisper checkpoint")
    pt("bad_dims.pt", {"dims": {"n_mels": 80}, "model_state_dict": good["model_state_dict"]}, "not a usable checkpoint")
    pt("dims_wrong_type.pt", {"dims": dict(DIMS.__dict__, n_text_layer="one"), "model_state_dict": {}},
       "not a usable checkpoint")
    wrong_shape = dict(good["model_state_dict"])
    wrong_shape["decoder.ln.weight"] = torch.zeros(32)
    pt("wrong_shape.pt", dict(good, model_state_dict=wrong_shape), "decoder.ln.weight")
    missing = {k: v for k, v in good["model_state_dict"].items() if k != "encoder.conv1.weight"}
    pt("missing_tensor.pt", dict(good, model_state_dict=missing), "encoder.conv1.weight")
    extra = dict(good["model_state_dict"], **{"decoder.surprise": torch.zeros(2)})
    pt("extra_tensor.pt", dict(good, model_state_dict=extra), "decoder.surprise")
    pt("pickle_payload.pt", {"dims": DIMS.__dict__, "model_state_dict": {}, "evil": Payload(marker)},
       "could run code")
    pt("payload_only.pt", Payload(marker), "could run code")

    cases["empty_folder"] = ((folder / "empty_folder"), "model.bin")
    (folder / "empty_folder").mkdir()
    ct2 = write_ct2_dir(folder / "ct2_no_bin")
    (ct2 / "model.bin").unlink()
    cases["ct2_no_bin"] = (ct2, "model.bin")
    ct2 = write_ct2_dir(folder / "ct2_truncated")
    (ct2 / "model.bin").write_bytes((ct2 / "model.bin").read_bytes()[:5000])
    cases["ct2_truncated"] = (ct2, "truncated")
    cases["ct2_toy_dims"] = (write_ct2_dir(folder / "ct2_toy_dims"), "whisper needs 80 or 128 mel bins")

    hf = folder / "hf_missing_shard"
    hf.mkdir()
    (hf / "config.json").write_text(json.dumps({"model_type": "whisper"}))
    save_file({"model.encoder.conv1.weight": torch.zeros(1)}, str(hf / "model-00001-of-00002.safetensors"))
    (hf / "model.safetensors.index.json").write_text(json.dumps({"weight_map": {
        "model.encoder.conv1.weight": "model-00001-of-00002.safetensors",
        "model.decoder.embed_tokens.weight": "model-00002-of-00002.safetensors"}}))
    cases["hf_missing_shard"] = (hf, "model-00002-of-00002.safetensors")
    hf = folder / "hf_no_config"
    hf.mkdir()
    save_file({"model.encoder.conv1.weight": torch.zeros(1)}, str(hf / "model.safetensors"))
    cases["hf_no_config"] = (hf, "config.json")
    hf = folder / "hf_truncated"
    hf.mkdir()
    (hf / "config.json").write_text(json.dumps(HF_CONFIG))
    save_file({"model.encoder.conv1.weight": torch.zeros(1000)}, str(hf / "model.safetensors"))
    (hf / "model.safetensors").write_bytes((hf / "model.safetensors").read_bytes()[:200])
    cases["hf_truncated"] = (hf, "model.safetensors")
    hf = folder / "hf_pickle_payload"
    hf.mkdir()
    (hf / "config.json").write_text(json.dumps(HF_CONFIG))
    torch.save({"model.encoder.conv1.weight": Payload(marker)}, hf / "pytorch_model.bin")
    cases["hf_pickle_payload"] = (hf, "could run code")
    cases["safetensors_file"] = (hf.parent / "hf_truncated" / "model.safetensors", "model.safetensors")
    cases["typo"] = (Path("tiny-en"), "unknown model")
    cases["missing.pt"] = (folder / "missing.pt", "no such file")
    return cases


@pytest.fixture(scope="module")
def bad_models(tmp_path_factory):
    root = tmp_path_factory.mktemp("bad_models")
    marker = root / "MARKER_payload_ran"
    return _cases(root / "models", marker), marker


CASE_NAMES = ["truncated.pt", "cut_at_end.pt", "empty.pt", "random.pt", "text.pt", "tensor.pt", "no_state.pt",
              "bad_dims.pt", "dims_wrong_type.pt", "wrong_shape.pt", "missing_tensor.pt", "extra_tensor.pt",
              "pickle_payload.pt", "payload_only.pt", "empty_folder", "ct2_no_bin", "ct2_truncated",
              "ct2_toy_dims", "hf_missing_shard", "hf_no_config", "hf_truncated", "hf_pickle_payload",
              "safetensors_file", "typo", "missing.pt"]


@pytest.mark.parametrize("name", CASE_NAMES)
def test_bad_model_is_one_line(bad_models, name, capfd, tmp_path):
    cases, marker = bad_models
    path, words = cases[name]
    code = main([str(GOOD), "--model", str(path), "--output_dir", str(tmp_path), "--verbose", "None"])
    out, err = capfd.readouterr()
    assert not marker.exists(), "a pickled payload ran"
    assert code == 1, err
    assert err.count("\n") == 1 and err.startswith("medusa-whisper: error: "), err
    assert str(path) in err and words in err, err
    assert list(tmp_path.iterdir()) == []


def test_a_heads_file_carrying_a_payload_does_not_run(bad_models, monkeypatch, tmp_path, capfd):
    cases, marker = bad_models
    heads_dir = tmp_path / "heads"
    heads_dir.mkdir()
    torch.save({"medusa": {}, "heads_state_dict": {}, "evil": Payload(marker)}, heads_dir / "tiny.en-medusa.pt")
    monkeypatch.setenv(HEADS_ENV, str(heads_dir))
    assert main(["transcribe", str(GOOD), "--model", "tiny.en-medusa"]) == 1
    err = capfd.readouterr().err
    assert not marker.exists()
    assert err.count("\n") == 1 and "tiny.en-medusa.pt" in err and "could run code" in err
