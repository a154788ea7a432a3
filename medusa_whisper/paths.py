"""Where the package keeps what it makes on this machine, and how it writes a file there.

A bottom layer (standard library only): the weights store, the compute-type cache and the
kernel-route cache all live under ``cache_dir()``.
"""

from __future__ import annotations

import contextlib
import os
from pathlib import Path
from typing import Iterator

CACHE_ENV = "MEDUSA_WHISPER_CACHE"


def cache_dir() -> Path:
    """``$MEDUSA_WHISPER_CACHE``, or ``~/.cache/medusa_whisper``."""
    override = os.environ.get(CACHE_ENV)
    return Path(override).expanduser() if override else Path.home() / ".cache" / "medusa_whisper"


@contextlib.contextmanager
def atomic_path(path: Path) -> Iterator[Path]:
    """A temporary path beside ``path``; renamed onto it only if the block finishes, so a reader
    never sees a half-written file."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    try:
        yield tmp
        os.replace(tmp, path)
    finally:
        tmp.unlink(missing_ok=True)
