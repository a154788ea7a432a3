"""``medusa-whisper convert``: any supported source of Whisper weights into one whisper ``.pt`` file.

Sources: a CTranslate2 model directory (model.bin or model.bin.part*, config.json), or an
openai-whisper checkpoint ``.pt``, which is checked and written again (atomically, with torch.save).
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Union

import torch

from .errors import CheckpointError

EXPECTED = "a CTranslate2 Whisper model directory or an openai-whisper .pt checkpoint"


def convert(src: Union[str, os.PathLike], out: Union[str, os.PathLike]) -> Path:
    """Write the checkpoint dict {"dims": ..., "model_state_dict": ...} read from ``src`` to ``out``."""
    from .weights import save_checkpoint

    src, out = Path(src), Path(out)
    if src.is_dir():
        from .ctranslate2 import convert_ctranslate2

        checkpoint = convert_ctranslate2(src)
    elif src.is_file():
        checkpoint = _load_whisper_pt(src)
    else:
        raise CheckpointError(f"{src}: no such file or directory; expected {EXPECTED}")
    save_checkpoint(checkpoint, out)
    return out


def _load_whisper_pt(path: Path) -> dict:
    try:
        checkpoint = torch.load(path, map_location="cpu", weights_only=True)
    except Exception as e:  # torch raises many types for truncated or foreign files
        raise CheckpointError(f"{path}: cannot be read as a checkpoint ({type(e).__name__}); "
                              f"expected {EXPECTED}") from e
    if not (isinstance(checkpoint, dict) and isinstance(checkpoint.get("dims"), dict)
            and isinstance(checkpoint.get("model_state_dict"), dict)):
        raise CheckpointError(f"{path}: has no 'dims' and 'model_state_dict'; expected {EXPECTED}")
    return checkpoint
