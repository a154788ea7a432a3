"""``medusa-whisper convert``: any supported source of Whisper weights into one whisper ``.pt`` file.

Sources, recognised by what they contain:
- a Hugging Face ``WhisperForConditionalGeneration`` directory, or a Whisper-Medusa one (``medusa_heads_type``
  in config.json; ``base_head`` or ``medusa_block``): see ``hf.py``;
- a CTranslate2 model directory (model.bin or model.bin.part*, config.json);
- an openai-whisper checkpoint ``.pt`` (or one of ours), which is checked and written again.
The output is always written atomically with torch.save and loads with ``weights_only=True``.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Union

import torch

from ..errors import CheckpointError
from ..model import model_shapes  # moved to model.py, beside the model it measures; still importable here
from .weights import save_checkpoint

EXPECTED = ("a Hugging Face Whisper or Whisper-Medusa directory, a CTranslate2 Whisper model directory, "
            "or an openai-whisper .pt checkpoint")


def convert(src: Union[str, os.PathLike], out: Union[str, os.PathLike]) -> Path:
    """Write the checkpoint dict {"dims": ..., "model_state_dict": ...} read from ``src`` to ``out``."""
    src, out = Path(src), Path(out)
    checkpoint = read_source(src)
    save_checkpoint(checkpoint, out)
    return out


def read_source(src: Path) -> dict:
    """Our checkpoint dict {"dims", "model_state_dict", optional "medusa", "alignment_heads"} from ``src``."""
    from .hf import is_hf_dir

    if is_hf_dir(src):
        from .hf import convert_hf

        return convert_hf(src, model_shapes)
    if src.is_dir():
        from .ctranslate2 import convert_ctranslate2

        checkpoint = convert_ctranslate2(src)
    elif src.is_file():
        checkpoint = _load_whisper_pt(src)
    else:
        raise CheckpointError(f"{src}: no such file or directory; expected {EXPECTED}")
    return checkpoint


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
