"""`make bench` on a fresh machine: what it needs is installed, or named in one line; never a traceback.

The packages step runs from a clean clone of the repository, with the synthesisers hidden from
PATH so that they count as missing, against a stand-in apt-get that records what it is asked.
(.ci/run runs the whole `make bench-setup` on CI's fresh machine.)
"""

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).parent.parent
NOBODY = ["setpriv", "--reuid=65534", "--regid=65534", "--clear-groups"]
IS_ROOT = os.geteuid() == 0
SYNTHESISER_PACKAGES = {"espeak-ng", "flite", "festival", "sox", "bible-kjv"}


@pytest.fixture(scope="module")
def clone(tmp_path_factory):
    """The repository as a fresh `git clone` has it (committed files only, no data, no venv)."""
    if shutil.which("git") is None or not (ROOT / ".git").exists():
        pytest.skip("not a git checkout")
    folder = tmp_path_factory.mktemp("clone") / "medusa_whisper"
    subprocess.run(["git", "clone", "--quiet", "--no-hardlinks", str(ROOT), str(folder)], check=True)
    # this work tree's version, committed or not
    shutil.copytree(ROOT / "tools", folder / "tools", dirs_exist_ok=True, ignore=shutil.ignore_patterns("__pycache__"))
    shutil.copy(ROOT / "Makefile", folder / "Makefile")
    folder.chmod(0o755)
    return folder


@pytest.fixture
def bare_path(tmp_path):
    """A PATH with the basic tools but no synthesiser, and a stand-in apt-get that logs its arguments."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    for tool in ("bash", "sh", "env", "id", "mktemp", "grep", "tail", "rm", "cat", "make", "git", "setpriv"):
        found = shutil.which(tool)
        if found:
            (bin_dir / tool).symlink_to(found)
    log = tmp_path / "apt-get.log"
    (bin_dir / "apt-get").write_text(f"#!/bin/sh\necho \"$@\" >> {log}\n")
    (bin_dir / "apt-get").chmod(0o755)
    return str(bin_dir), log


def _run(command, cwd, path, user=()):
    env = dict(os.environ, PATH=path)
    return subprocess.run([*user, *command], cwd=cwd, env=env, capture_output=True, text=True, timeout=300)


def test_missing_synthesisers_are_named_by_their_packages(clone, bare_path):
    path, _ = bare_path
    done = _run([sys.executable, "-m", "tools.data", "corpus", "--missing-packages"], clone, path)
    assert done.returncode == 0
    assert SYNTHESISER_PACKAGES <= set(done.stdout.split())


@pytest.mark.skipif(not IS_ROOT, reason="installs only as root")
def test_as_root_the_packages_step_installs_them(clone, bare_path):
    path, log = bare_path
    venv_python = Path(sys.executable)
    command = ["make", "--no-print-directory", "bench-packages", f"BIN={venv_python.parent}", "-o", "setup"]
    done = _run(command, clone, path)
    assert done.returncode == 0, done.stderr
    calls = log.read_text().splitlines()
    assert calls[0] == "update -qq"
    installed = calls[1].split()
    assert installed[:4] == ["install", "-y", "-qq", "--no-install-recommends"]
    assert SYNTHESISER_PACKAGES | {"ffmpeg"} <= set(installed[4:])


@pytest.mark.skipif(not IS_ROOT or shutil.which("setpriv") is None, reason="needs root to become another user")
def test_without_root_a_missing_package_is_one_line(clone, bare_path):
    script = (clone / "tools" / "install_packages.sh").read_text()  # on stdin: the user may not enter pytest's folders
    done = subprocess.run([*NOBODY, "bash", "-s", "--", "make bench", "espeak-ng", "sox"], input=script, cwd="/",
                          env=dict(os.environ, PATH="/usr/sbin:/usr/bin:/sbin:/bin"), capture_output=True, text=True,
                          timeout=60)
    assert done.returncode == 1
    assert done.stderr == ("make bench: error: needs the Debian packages espeak-ng sox; install them with: "
                           "sudo apt-get install espeak-ng sox\n")


def test_nothing_missing_is_silent(clone, bare_path):
    path, log = bare_path
    done = _run(["tools/install_packages.sh", "make bench"], clone, path)
    assert (done.returncode, done.stdout, done.stderr) == (0, "", "")
    assert not log.exists()


def test_a_failing_apt_get_is_one_line(clone, bare_path):
    path, _ = bare_path
    (Path(path) / "apt-get").write_text("#!/bin/sh\necho 'E: Unable to locate package nosuch' >&2\nexit 100\n")
    if not IS_ROOT:
        pytest.skip("apt-get runs only as root")
    done = _run(["tools/install_packages.sh", "make bench", "nosuch"], clone, path)
    assert done.returncode == 1
    assert done.stderr.count("\n") == 1 and "Unable to locate package nosuch" in done.stderr


def test_bench_without_synthesisers_stops_in_one_line_without_a_traceback(clone, bare_path, tmp_path):
    path, _ = bare_path
    real = tmp_path / "real" / "real.csv"  # as if fetched, so that nothing is downloaded here
    real.parent.mkdir()
    real.write_text("audio,sentence,language\n")
    done = _run([sys.executable, "-m", "tools.bench", "run", "--setup-only", "--corpus", str(tmp_path / "corpus"),
                 "--real", str(real)], clone, path)
    assert done.returncode == 1
    assert "Traceback" not in done.stderr
    errors = [line for line in done.stderr.splitlines() if "error" in line]
    assert errors[0].startswith("make_corpus: error: the speech synthesisers are not installed")
    assert "apt-get install" in errors[0] and "espeak-ng" in errors[0]
    assert errors[-1].startswith("bench: error: the held-out corpus could not be built")
