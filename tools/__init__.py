"""The project's own tools, run from the repository's root as modules:

    python -m tools.bench SUBCOMMAND ...   measurements (make bench, bench-long, bench-pass, ...)
    python -m tools.data SUBCOMMAND ...    the corpora and recordings they read (make corpus, speech, ...)
    python -m tools.ship_heads ...         trained heads into weights/ (also tools.ship_draft_head)

Nothing here is part of the installed package: medusa_whisper never imports tools. This file stays
free of heavy imports, because the bench's memory probe starts fresh processes through it.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path
from typing import Dict, List, Optional

ROOT = Path(__file__).resolve().parent.parent


def module_command(module: str, *args: object) -> List[str]:
    """The argv that runs ``python -m module args...`` with this interpreter."""
    return [sys.executable, "-m", module, *map(str, args)]


def module_env(env: Optional[Dict[str, str]] = None) -> Dict[str, str]:
    """An environment in which a child process finds ``tools`` and medusa_whisper in this checkout,
    whatever its working directory: the repository's root first on PYTHONPATH."""
    env = dict(os.environ if env is None else env)
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(ROOT), env.get("PYTHONPATH", "")) if p)
    return env
