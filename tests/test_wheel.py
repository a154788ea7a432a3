"""A built wheel, installed in a fresh virtual environment, loads every head the repository ships.

The wheel is built from this checkout (``pip wheel``) and installed without dependencies in a new
venv; that venv reads torch, whisper and the offline base weights from this environment's
site-packages (a path in a .pth file, so this environment's editable install of medusa_whisper is
not seen). Run from an empty folder without PYTHONPATH or $MEDUSA_WHISPER_HEADS_DIR, the installed
package must find its heads inside the installation.
"""

import configparser
import json
import os
import shutil
import subprocess
import sys
import sysconfig
import zipfile
from pathlib import Path

import pytest

pytestmark = pytest.mark.slow

ROOT = Path(__file__).resolve().parent.parent
SHIPPED = sorted(p.stem for p in (ROOT / "weights").glob("*.pt"))


def test_setup_cfg_lists_every_package_folder():
    """setup.cfg lists the packages by hand (the heads package is mapped from weights/): a new
    subpackage must be added there or the wheel would lack it."""
    config = configparser.ConfigParser()
    config.read(ROOT / "setup.cfg")
    listed = set(config["options"]["packages"].split())
    folders = {".".join(p.parent.relative_to(ROOT).parts) for p in (ROOT / "medusa_whisper").rglob("__init__.py")}
    assert folders | {"medusa_whisper_heads"} == listed


@pytest.fixture(scope="module")
def wheel(tmp_path_factory) -> Path:
    """Built from a copy of what git tracks, so that no build/ folder of an earlier build leaks in."""
    source = tmp_path_factory.mktemp("source")
    tracked = subprocess.run(["git", "ls-files", "-z", "medusa_whisper", "weights", "setup.cfg", "pyproject.toml",
                              "README.md"], cwd=ROOT, check=True, capture_output=True).stdout.decode().split("\0")
    for name in filter(None, tracked):
        (source / name).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(ROOT / name, source / name)
    out = tmp_path_factory.mktemp("dist")
    subprocess.run([sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "-q", "-w", str(out),
                    str(source)], check=True, capture_output=True, timeout=600)
    (built,) = out.glob("medusa_whisper-*.whl")
    return built


def test_the_wheel_holds_the_heads_and_no_plots(wheel):
    names = zipfile.ZipFile(wheel).namelist()
    for name in SHIPPED:
        assert f"medusa_whisper_heads/{name}.pt" in names
    assert not [n for n in names if n.endswith(".png")]
    assert "medusa_whisper/cli.py" in names and "medusa_whisper/drafting/eagle.py" in names
    assert "medusa_whisper/audio/timing_clip.flac" in names  # what the package times its choices on
    assert "medusa_whisper/kinds/xeon-amx.json" in names  # the recorded CPU kinds a first run predicts from
    from medusa_whisper.step import native

    for source in native.SOURCES + native.HEADERS:  # the kernels' sources, built at set-up
        assert f"medusa_whisper/step/native/{source.name}" in names


def test_an_installed_wheel_loads_every_shipped_head(wheel, tmp_path):
    assert SHIPPED, "no heads in weights/"
    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True, timeout=300)
    python = venv / "bin" / "python"
    purelib = Path(subprocess.run([str(python), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                                  check=True, capture_output=True, text=True).stdout.strip())
    subprocess.run([sys.executable, "-m", "pip", "--python", str(python), "install", "--no-deps", "--no-index", "-q",
                    str(wheel)], check=True, capture_output=True, timeout=600)
    # this environment's packages after the venv's own (a plain path: its .pth files, among them the
    # editable install's finder, are not run)
    (purelib / "zz_parent_env.pth").write_text(sysconfig.get_paths()["purelib"] + "\n")
    bases = sorted({name.split("-")[0] for name in SHIPPED})
    script = (
        "import json, medusa_whisper\n"
        "from medusa_whisper.checkpoints import weights\n"
        f"names = {[*bases, *SHIPPED]!r}\n"
        "loaded = {}\n"
        "for name in names:\n"
        "    model = medusa_whisper.load_model(name, device='cpu')\n"
        "    loaded[name] = sum(p.numel() for p in model.parameters())\n"
        "print(json.dumps(dict(package=medusa_whisper.__file__, heads=str(weights.heads_dir()), loaded=loaded)))\n")
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "MEDUSA_WHISPER_HEADS_DIR")}
    run = subprocess.run([str(python), "-c", script], cwd=tmp_path, env=env, capture_output=True, text=True,
                         timeout=900)
    assert run.returncode == 0, run.stderr[-3000:]
    report = json.loads(run.stdout.strip().splitlines()[-1])
    assert Path(report["package"]).is_relative_to(venv)
    assert Path(report["heads"]).is_relative_to(venv)
    loaded = report["loaded"]
    assert sorted(loaded) == sorted([*bases, *SHIPPED])
    for name in SHIPPED:  # its heads came with it: more parameters than its base model
        assert loaded[name] > loaded[name.split("-")[0]], name
