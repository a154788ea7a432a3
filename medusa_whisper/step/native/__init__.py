"""The package's own row-invariant products (rows.cpp), and a decoder pass's layers in one call on
them (decoder.cpp, used by ``step.native_decoder``), compiled once when the package is set up.

``python -m medusa_whisper.step.native`` (``make setup`` runs it) compiles them against the
installed PyTorch into ``kernels_dir()``, under a name that holds the sources' digest and the
versions it was built for. ``kernels()`` loads that build and never compiles: a transcription does
not wait for a compiler, and where none was there at set-up the package runs on PyTorch's own
kernels (``available()`` is False and the kernel choices do not offer these).

What the products guarantee is in rows.cpp's header: a row's result is its own whatever rows,
threads or instruction set it is computed with.
"""

from __future__ import annotations

import functools
import hashlib
import importlib.machinery
import importlib.util
import logging
import os
import platform
import shutil
import sys
from pathlib import Path
from types import ModuleType
from typing import Optional

import torch

from ...paths import cache_dir
from ..int8_kernels import Prepared

log = logging.getLogger(__name__)

SOURCES = [Path(__file__).with_name(name) for name in ("rows.cpp", "decoder.cpp")]
HEADERS = [Path(__file__).with_name("rows.h")]
KERNELS_ENV = "MEDUSA_WHISPER_KERNELS"  # where built kernels live; default: <cache>/kernels
FLAGS = ["-O3", "-fopenmp", "-ffp-contract=off"]  # OpenMP: at::parallel_for's threads are PyTorch's own


def kernels_dir() -> Path:
    override = os.environ.get(KERNELS_ENV)
    return Path(override).expanduser() if override else cache_dir() / "kernels"


def build_name() -> str:
    """The module's name: the sources and flags, PyTorch's and Python's versions, the machine."""
    texts = [path.read_text() for path in SOURCES + HEADERS]
    key = "|".join([*texts, " ".join(FLAGS), torch.__version__, sys.version, platform.machine()])
    return "medusa_whisper_rows_" + hashlib.sha256(key.encode()).hexdigest()[:16]


@functools.lru_cache(maxsize=1)
def kernels() -> Optional[ModuleType]:
    """The built module, or None where it was not built for this source and PyTorch (never builds)."""
    name = build_name()
    folder = kernels_dir() / name
    try:
        found = sorted(folder.glob(f"{name}*.so")) if folder.is_dir() else []
    except OSError as error:  # another user's build (set up as root, run as a user): PyTorch's kernels
        log.debug("the package's kernels in %s cannot be read (%s): using PyTorch's", folder, error)
        return None
    if not found:
        return None
    try:
        loader = importlib.machinery.ExtensionFileLoader(name, str(found[0]))
        spec = importlib.util.spec_from_file_location(name, found[0], loader=loader)
        module = importlib.util.module_from_spec(spec)
        loader.exec_module(module)
    except ImportError as error:  # a build that no longer loads (a changed system library): PyTorch's kernels
        log.warning("the package's kernels in %s do not load (%s): using PyTorch's", folder, error)
        return None
    return module


def available() -> bool:
    return kernels() is not None


def pack_int8(qweight: torch.Tensor):
    """The form ``int8_rows`` reads of (n, k) int8 weights: (packed weights, their column sums)."""
    return tuple(kernels().pack_int8(qweight.contiguous()))


def int8_rows(rows: torch.Tensor, packed, scale: torch.Tensor, bias: Optional[torch.Tensor]) -> torch.Tensor:
    """rows (m, k) @ W.T * scale + bias, float32 out: each row quantised to int8 with its own scale."""
    return kernels().int8_rows(rows.float().contiguous(), packed[0], packed[1], scale, bias, scale.shape[0])


def pack_float(weight: torch.Tensor) -> torch.Tensor:
    """The form ``float_rows`` reads of an (n, k) float32 weight."""
    return kernels().pack_float(weight.detach().float().contiguous())


def runs_float(linear: torch.nn.Module) -> bool:
    """Whether a pass's rows through this layer are multiplied by ``float_rows``: a float32
    ``nn.Linear`` (whisper's own included) on the CPU, where the kernels are built. Then the decoder's
    float32 products, and its attention (attention.row_invariant), give a row the bits it gets alone."""
    weight = getattr(linear, "weight", None)
    return (isinstance(linear, torch.nn.Linear) and weight is not None and weight.dtype == torch.float32
            and weight.device.type == "cpu" and available())


def float_form(linear: torch.nn.Linear) -> torch.Tensor:
    """``pack_float``'s form of a float32 linear's weight, made on first use and kept on the layer
    (made again when its weight is replaced, moved or changed in place, as a checkpoint loads)."""
    forms = linear.__dict__.get("_native_forms")
    if forms is None:
        forms = linear._native_forms = Prepared()
    weight = linear.weight
    return forms.get("float", lambda: pack_float(weight), weight, weight.data_ptr(), _version(weight))


def _version(tensor: torch.Tensor) -> int:
    """How often ``tensor`` was changed in place (an inference tensor keeps no count: 0)."""
    return 0 if tensor.is_inference() else tensor._version


def float_rows(rows: torch.Tensor, packed: torch.Tensor, bias: Optional[torch.Tensor], n: int) -> torch.Tensor:
    """rows (m, k) @ W.T + bias in float32, each output one fused multiply-add chain over k in order:
    a row's bits are its own whatever the rows beside it, the threads or the instruction set."""
    return kernels().float_rows(rows.float().contiguous(), packed, None if bias is None else bias.detach(), n)


def attends(dtype: torch.dtype, d_head: int) -> bool:
    """Whether ``attend`` takes keys and values of this dtype and head width (where built)."""
    return dtype in (torch.bfloat16, torch.float32) and d_head % 16 == 0 and available()


def attend(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, n_head: int,
           allowed: Optional[torch.Tensor]) -> torch.Tensor:
    """softmax(q k^T / sqrt(d_head)) v in float32, each query row on its own (rows.cpp's attention).

    q : (batch, rows, n_state) float32; k, v : (batch, n_head, n_key, d_head), each key's values
    contiguous; allowed : (rows, n_key) or (1 or batch, rows, n_key) bool, None: every key."""
    if allowed is not None and allowed.dim() == 2:
        allowed = allowed.unsqueeze(0)
    if allowed is not None and not allowed.is_contiguous():
        allowed = allowed.contiguous()
    d_head = k.shape[-1]
    return kernels().attend(q.float().contiguous(), k, v, allowed, n_head, d_head ** -0.5)


def build(verbose: bool = False) -> ModuleType:
    """Compile rows.cpp and decoder.cpp into ``kernels_dir()`` (a minute on 2 cores; nothing when already built)."""
    from torch.utils import cpp_extension

    name = build_name()
    folder = kernels_dir() / name
    folder.mkdir(parents=True, exist_ok=True)
    # PyTorch builds with ninja, found on PATH: the one pip put beside this Python counts too
    os.environ["PATH"] = os.pathsep.join([str(Path(sys.executable).parent), os.environ.get("PATH", "")])
    module = cpp_extension.load(name=name, sources=[str(path) for path in SOURCES], build_directory=str(folder),
                                extra_cflags=FLAGS, extra_ldflags=["-fopenmp"], verbose=verbose)
    kernels.cache_clear()
    for old in kernels_dir().glob("medusa_whisper_rows_*"):  # builds of other sources or PyTorch versions
        if old.name != name and old.is_dir():
            shutil.rmtree(old, ignore_errors=True)
    return module


def main() -> int:
    """Build, and say in one line what was built or why not (set-up goes on without: PyTorch's kernels)."""
    try:
        module = build()
    except Exception as error:  # no compiler, no headers: the package still works, on PyTorch's kernels
        first = str(error).strip().splitlines()[0] if str(error).strip() else type(error).__name__
        print(f"medusa_whisper: the row kernels were not built ({first}); PyTorch's kernels will be used")
        return 0
    print(f"medusa_whisper: row kernels built in {kernels_dir() / build_name()} ({module.isa()} here)")
    return 0
