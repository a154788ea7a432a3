"""Nothing lost on interruption: output files appear whole or not at all, and --skip-existing resumes.

A batch is killed part-way (SIGKILL, as a crash or an out-of-memory kill does; SIGINT, as Ctrl-C
does); every output file then present is byte for byte the file an uninterrupted run writes, and a
resumed run with --skip-existing transcribes only what was not done, ending with every file.
"""

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import soundfile

from medusa_whisper.transcription import outputs
from medusa_whisper.transcription.outputs import atomic_write

ROOT = Path(__file__).parent.parent
JFK = Path(__file__).parent / "data" / "real" / "jfk.flac"
FORMATS = ("txt", "vtt", "srt", "tsv", "json")
N_FILES = 6


def test_an_interrupted_write_leaves_the_old_file_or_none(tmp_path, monkeypatch):
    target = tmp_path / "talk.srt"
    atomic_write(target, b"whole\n")

    def crash(fd):
        raise KeyboardInterrupt  # Ctrl-C while the new bytes are being flushed

    monkeypatch.setattr(outputs.os, "fsync", crash)
    with pytest.raises(KeyboardInterrupt):
        atomic_write(target, b"half of a new")
    with pytest.raises(KeyboardInterrupt):
        atomic_write(tmp_path / "new.srt", b"half")
    assert target.read_bytes() == b"whole\n"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["talk.srt"]  # no temporary file, no half file


def test_a_killed_writers_temporary_file_is_cleared_by_the_next_write(tmp_path):
    stale = tmp_path / ".talk.txt.12345.partial"
    stale.write_bytes(b"half")
    atomic_write(tmp_path / "talk.txt", b"whole\n")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["talk.txt"]


def _inputs(folder: Path, n: int = N_FILES) -> list:
    audio, rate = soundfile.read(JFK, dtype="float32", frames=3 * 16000)
    folder.mkdir()
    paths = []
    for i in range(n):
        path = folder / f"part {i}.flac"
        soundfile.write(path, audio[i * 2000:], rate)  # each a little different
        paths.append(path)
    return paths


def _command(paths, out: Path, *extra):
    return [sys.executable, "-m", "medusa_whisper.cli", "transcribe", *map(str, paths), "--output-dir", str(out),
            "--output-format", "all", "--threads", "2", "--temperature-increment-on-fallback", "none", *extra]


def _env():
    return dict(os.environ, PYTHONPATH=str(ROOT))


def _interrupt_after(command, out: Path, done: int, sig: int) -> subprocess.CompletedProcess:
    """Start the batch, wait until ``done`` files are written, then send ``sig``."""
    # SIGINT as a terminal delivers it: a test runner started in the background of a shell script
    # ignores SIGINT, and its children would inherit that (then Python installs no handler)
    process = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=_env(),
                               preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
    deadline = time.monotonic() + 900
    while time.monotonic() < deadline and process.poll() is None:
        if out.is_dir() and len(list(out.glob("*.json"))) >= done:
            break
        time.sleep(0.02)
    assert process.poll() is None, "the batch finished before it could be interrupted"
    process.send_signal(sig)
    stdout, stderr = process.communicate(timeout=120)
    return subprocess.CompletedProcess(command, process.returncode, stdout, stderr)


def _visible(folder: Path) -> dict:
    return {p.name: p.read_bytes() for p in folder.iterdir() if not p.name.startswith(".")}


@pytest.mark.slow
def test_a_killed_batch_leaves_whole_files_and_resumes(tmp_path):
    paths = _inputs(tmp_path / "in")
    reference = tmp_path / "reference"
    full = subprocess.run(_command(paths, reference), capture_output=True, text=True, env=_env(), timeout=900)
    assert full.returncode == 0, full.stderr
    expected = _visible(reference)
    assert len(expected) == N_FILES * len(FORMATS)

    out = tmp_path / "out"
    killed = _interrupt_after(_command(paths, out), out, done=2, sig=signal.SIGKILL)
    assert killed.returncode == -signal.SIGKILL
    partial = _visible(out)
    assert 2 * len(FORMATS) <= len(partial) < len(expected)
    for name, content in partial.items():
        assert content == expected[name], f"{name} was left half-written"

    done_before = {name.rsplit(".", 1)[0] for name in partial if name.endswith(".json")}
    resumed = subprocess.run(_command(paths, out, "--skip-existing"), capture_output=True, text=True, env=_env(),
                             timeout=900)
    assert resumed.returncode == 0, resumed.stderr
    transcribed = [line.split(":")[0] for line in resumed.stdout.splitlines()]
    assert sorted(Path(p).stem for p in transcribed) == sorted(p.stem for p in paths if p.stem not in done_before)
    assert f"{len(done_before)} skipped (already done)" in resumed.stderr
    assert _visible(out) == expected
    assert [p.name for p in out.iterdir() if p.name.startswith(".")] == []  # the killed run's temporary file is gone

    again = subprocess.run(_command(paths, out, "--skip-existing"), capture_output=True, text=True, env=_env(),
                           timeout=900)
    assert again.returncode == 0 and again.stdout == ""
    assert "done already" in again.stderr


@pytest.mark.slow
def test_ctrl_c_stops_the_batch_with_one_line_and_no_half_file(tmp_path):
    paths = _inputs(tmp_path / "in", n=3 * N_FILES)  # long enough that Ctrl-C lands mid-batch on an idle machine
    out = tmp_path / "out"
    stopped = _interrupt_after(_command(paths, out), out, done=1, sig=signal.SIGINT)
    assert stopped.returncode == 130
    assert stopped.stderr.strip().splitlines()[-1] == "medusa-whisper: error: interrupted"
    assert "Traceback" not in stopped.stderr
    assert len(list(out.glob("*.json"))) >= 1
    for path in out.iterdir():  # Ctrl-C lets the writer clean up: no temporary file either
        assert not path.name.startswith("."), path.name
        if path.suffix == ".json":
            assert json.loads(path.read_text())["text"]
        else:
            assert path.read_text().endswith("\n")
