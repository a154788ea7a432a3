"""Over 200 bad and odd inputs through the real command line in one batch, good files among them.

Every bad file is one line on stderr that names it and says what is wrong; nothing else reaches
stderr (no decoder's notes, no traceback, no warning); every good file is written; the exit status
says that some failed. Run as an unprivileged user when the tests run as root, so that a file
without read permission is one. The inputs are built by tests/fuzz_inputs.py.
"""

import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest

from medusa_whisper.checkpoints import weights

from fuzz_inputs import build

ROOT = Path(__file__).parent.parent
NOBODY = 65534
AS_NOBODY = os.geteuid() == 0 and shutil.which("setpriv") is not None


def _shown(name: str) -> str:
    """A file name as the error line shows it (one line; undecodable bytes escaped)."""
    return name.replace("\n", "\\n").encode("utf-8", "backslashreplace").decode("utf-8")


@pytest.fixture
def shared_dir(tmp_path):
    """A folder the unprivileged user may use (pytest's own is private to root)."""
    if not AS_NOBODY:
        yield tmp_path
        return
    folder = Path(tempfile.mkdtemp(prefix="medusa_fuzz_"))
    folder.chmod(0o777)
    yield folder
    shutil.rmtree(folder, ignore_errors=True)


@pytest.mark.slow
def test_every_bad_input_is_one_line_and_every_good_file_is_written(shared_dir):
    cases = build(shared_dir / "in")
    assert len(cases) >= 200
    model = shared_dir / "tiny.en.pt"  # a copy the unprivileged user can read
    shutil.copy(weights.resolve("tiny.en").checkpoint, model)
    out = shared_dir / "out"
    for folder in (shared_dir / "in", shared_dir):
        folder.chmod(0o777)
    model.chmod(0o644)
    argv = [sys.executable, "-m", "medusa_whisper.cli", "--model", str(model), "--output_dir", str(out),
            "--output_format", "txt", "--temperature_increment_on_fallback", "None", "--threads", "2",
            "--", *[c.name for c in cases]]
    prefix = ["setpriv", f"--reuid={NOBODY}", f"--regid={NOBODY}", "--clear-groups"] if AS_NOBODY else []
    env = dict(os.environ, HOME=str(shared_dir), MEDUSA_WHISPER_CACHE=str(shared_dir / "cache"),
               PYTHONPATH=str(ROOT))
    done = subprocess.run(prefix + argv, cwd=shared_dir / "in", capture_output=True, env=env, timeout=3000)
    stderr = done.stderr.decode("utf-8", "backslashreplace")
    lines = stderr.splitlines()

    assert done.returncode == 1, stderr[-3000:]
    assert "Traceback" not in stderr, stderr[stderr.find("Traceback") - 500:][:4000]
    summary = [line for line in lines if not line.startswith(("medusa-whisper: error: ", "medusa-whisper: note: "))]
    assert len(summary) == 1 and summary[0].startswith("medusa-whisper: "), summary[:20]  # nothing but ours

    written = {p.name for p in out.iterdir()} if out.is_dir() else set()
    assert not [name for name in written if name.startswith(".")], "a temporary file was left behind"
    outcomes, wrong = {}, []
    for case in cases:
        name = case.name
        if name.startswith(("unreadable",)) and not AS_NOBODY:
            case.kind = "good"  # root reads any file
        errors = [line for line in lines if line.startswith(f"medusa-whisper: error: {_shown(name)}: ")]
        has_output = f"{os.path.splitext(os.path.basename(name))[0]}.txt" in written
        outcomes[name] = (len(errors), has_output)
        if case.kind == "good":
            ok = (len(errors), has_output) == (0, True)
        elif case.kind == "bad":
            ok = (len(errors), has_output) == (1, False) and case.problem in errors[0].lower()
        else:
            ok = (len(errors), has_output) in ((1, False), (0, True))
        if not ok:
            wrong.append((name, case.kind, case.problem, errors))
    assert wrong == [], "\n".join(map(str, wrong))
    failed = sum(n for n, _ in outcomes.values())
    assert len([line for line in lines if line.startswith("medusa-whisper: error: ")]) == failed
    print(f"{len(cases)} inputs: {sum(o for _, o in outcomes.values())} written, {failed} one-line errors")
    for line in lines:
        print(line)
