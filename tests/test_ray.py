"""Transcribing an archive on a local Ray (2 CPUs) gives the single-machine command's files.

Real speech (pieces of the JFK recording, one of them 33 s so that long-form decoding crosses a
window) and one bad file, through the real command line and the real Ray: the outputs equal the
single-machine command's byte for byte; the bad file is one line in OUT/failed.tsv and the others
finish; a run killed part-way and started again transcribes each file once; a worker killed while
transcribing is replaced and its file done.
"""

import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import numpy as np
import pytest
import soundfile

ray = pytest.importorskip("ray")

from medusa_whisper.archive import distributed  # noqa: E402
from medusa_whisper.archive.batch import collect_jobs  # noqa: E402
from medusa_whisper.cli import WRITER_OPTIONS, build_parser, transcribe_options  # noqa: E402
from medusa_whisper.transcription.outputs import formats  # noqa: E402

pytestmark = pytest.mark.slow

ROOT = Path(__file__).parent.parent
JFK = Path(__file__).parent / "data" / "real" / "jfk.flac"
FORMATS = ("txt", "vtt", "srt", "tsv", "json")
MODEL = "tiny.en"


@pytest.fixture(scope="module")
def inputs(tmp_path_factory) -> Path:
    """Six real clips (one of 33 s, two windows) and a file that is not audio, in one folder."""
    folder = tmp_path_factory.mktemp("in")
    audio, rate = soundfile.read(JFK, dtype="float32")
    soundfile.write(folder / "long talk.flac", np.concatenate([audio, audio, audio]), rate)
    for i in range(5):
        soundfile.write(folder / f"part {i}.flac", audio[i * 8000 : i * 8000 + 4 * rate], rate)
    (folder / "broken.wav").write_bytes(b"RIFF\x10\x00\x00\x00WAVEjunk" + bytes(200))
    return folder


def _command(out: Path, *extra) -> list:
    return [sys.executable, "-m", "medusa_whisper.cli", "transcribe", "--model", MODEL, "--output-dir", str(out),
            "--output-format", "all", "--temperature-increment-on-fallback", "none", *extra]


def _env() -> dict:
    return dict(os.environ, PYTHONPATH=str(ROOT))


def _visible(folder: Path) -> dict:
    return {p.name: p.read_bytes() for p in folder.iterdir() if not p.name.startswith(".") and p.name != "failed.tsv"}


@pytest.fixture(scope="module")
def reference(inputs, tmp_path_factory) -> dict:
    """The single-machine command's files and its line about the bad file. One thread, as each Ray worker
    below has: floating-point sums depend on the number of threads, and the json holds log-probabilities."""
    out = tmp_path_factory.mktemp("single")
    run = subprocess.run(_command(out, str(inputs), "--threads", "1"), capture_output=True, text=True,
                         env=_env(), timeout=900)
    assert run.returncode == 1, run.stderr  # the bad file
    files = _visible(out)
    assert len(files) == 6 * len(FORMATS)
    bad_lines = [line for line in run.stderr.splitlines() if "broken.wav" in line]
    assert len(bad_lines) == 1, run.stderr
    return dict(files=files, bad_line=bad_lines[0])


def test_ray_writes_the_single_machine_files_and_records_the_bad_one(inputs, reference, tmp_path):
    out = tmp_path / "out"
    run = subprocess.run(_command(out, str(inputs), "--ray", "--workers", "2", "--threads-per-worker", "1"),
                         capture_output=True, text=True, env=_env(), timeout=900)
    assert run.returncode == 1, run.stderr  # a file failed: the exit status says so
    assert "Traceback" not in run.stderr
    assert _visible(out) == reference["files"]
    failed = (out / "failed.tsv").read_text().splitlines()
    assert failed[0] == "file\treason"
    assert len(failed) == 2 and failed[1].startswith(str(inputs / "broken.wav") + "\t")
    # the same one line as the single-machine command gives for it
    assert failed[1].split("\t", 1)[1] in reference["bad_line"]
    assert "6 files done, 1 failed" in run.stderr.splitlines()[-1]


def test_a_killed_run_restarts_and_does_each_file_once(inputs, reference, tmp_path):
    out = tmp_path / "out"
    command = _command(out, str(inputs), "--ray", "--workers", "1", "--threads-per-worker", "1")
    process = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=_env(),
                               start_new_session=True)
    deadline = time.monotonic() + 900
    while time.monotonic() < deadline and process.poll() is None:
        if out.is_dir() and len(list(out.glob("*.json"))) >= 2:
            break
        time.sleep(0.05)
    assert process.poll() is None, "the run finished before it could be killed"
    os.killpg(process.pid, signal.SIGKILL)  # the driver and the Ray it started, as a crash would
    process.communicate(timeout=60)

    partial = _visible(out)
    done_before = {name.rsplit(".", 1)[0] for name in partial if name.endswith(".json")}
    assert 2 <= len(done_before) < 6
    for name, content in partial.items():  # a file present is a whole file
        assert content == reference["files"][name], f"{name} was left half-written"
    written_before = {name: (out / name).stat().st_mtime_ns for name in partial}

    resumed = subprocess.run(command, capture_output=True, text=True, env=_env(), timeout=900)
    assert resumed.returncode == 1, resumed.stderr  # the bad file, again
    transcribed = sorted(Path(line.split(":")[0]).stem for line in resumed.stdout.splitlines())
    assert transcribed == sorted({"long talk", *(f"part {i}" for i in range(5))} - done_before)
    assert f"{len(done_before)} skipped (already done)" in resumed.stderr
    assert _visible(out) == reference["files"]
    for name, mtime in written_before.items():  # what the killed run wrote was not done again
        assert (out / name).stat().st_mtime_ns == mtime, name


def test_a_killed_worker_is_replaced_and_its_file_done(inputs, reference, tmp_path):
    args = build_parser().parse_args(["transcribe", "--model", MODEL, "--temperature-increment-on-fallback", "none"])
    jobs = collect_jobs([str(inputs)], print)
    killed = []

    def kill_during_the_first_file(job, pid):
        if not killed:  # the longest file goes first; kill its worker a second into it
            killed.append((job.path, pid))
            threading.Timer(1.0, os.kill, (pid, signal.SIGKILL)).start()

    problems = []
    out = tmp_path / "out"
    summary = distributed.transcribe_archive(
        jobs, out, formats("all"), transcribe_options(args, for_workers=True),
        {k: getattr(args, k) for k in WRITER_OPTIONS},
        distributed.RayOptions(workers=2, threads_per_worker=1, model=MODEL),
        on_problem=problems.append, on_dispatch=kill_during_the_first_file)
    assert killed and killed[0][0].endswith("long talk.flac")
    with pytest.raises(ProcessLookupError):
        os.kill(killed[0][1], 0)  # that worker is gone ...
    assert (summary.done, summary.failed) == (6, 1)  # ... and its file was done by its replacement
    assert len(problems) == 1 and "broken.wav" in problems[0]
    assert _visible(out) == reference["files"]


def test_ray_workers_batch_files_and_give_each_its_own_files(inputs, tmp_path):
    """--batch-size with --ray: each worker decodes a group of files side by side. At int8 a batched
    file's outputs are byte-identical to the file alone, so they equal the single-machine command's at
    --batch-size 1; a bad file is one line and its group's other files finish. A second bad file looks
    the longest by its size, so it goes out first, at the head of a group."""
    folder = tmp_path / "in"
    folder.mkdir()
    for path in inputs.iterdir():
        (folder / path.name).write_bytes(path.read_bytes())
    (folder / "big broken.wav").write_bytes(b"RIFF\x10\x00\x00\x00WAVEjunk" + bytes(1_500_000))
    inputs = folder
    single = tmp_path / "single"
    run = subprocess.run(_command(single, str(inputs), "--threads", "1", "--compute-type", "int8", "--batch-size", "1"),
                         capture_output=True, text=True, env=_env(), timeout=900)
    assert run.returncode == 1, run.stderr
    reference = _visible(single)
    assert len(reference) == 6 * len(FORMATS)

    out = tmp_path / "out"
    run = subprocess.run(_command(out, str(inputs), "--ray", "--workers", "2", "--threads-per-worker", "1",
                                  "--compute-type", "int8", "--batch-size", "3"),
                         capture_output=True, text=True, env=_env(), timeout=900)
    assert run.returncode == 1, run.stderr
    assert "Traceback" not in run.stderr
    assert _visible(out) == reference
    failed = sorted((out / "failed.tsv").read_text().splitlines()[1:])
    assert [line.split("\t")[0] for line in failed] == [str(inputs / "big broken.wav"), str(inputs / "broken.wav")]
    assert "6 files done, 2 failed" in run.stderr.splitlines()[-1]


def test_a_group_goes_to_an_actor_as_one_call(monkeypatch, tmp_path):
    """With a batch size, files are handed out in groups of GROUP_BATCHES batches, longest first."""
    calls = []

    class FakeRay:
        class exceptions:
            RayActorError = RayTaskError = RuntimeError

        initialized = False

        def is_initialized(self):
            return True

        def remote(self, **kw):
            return lambda cls: FakeActorClass

        def get(self, ref):
            return ref.value

        def wait(self, refs, num_returns):
            return refs[:1], refs[1:]

    class FakeMethod:
        def __init__(self, name):
            self.name = name

        def remote(self, paths, *rest):
            calls.append((self.name, paths if isinstance(paths, list) else [paths]))
            made = [distributed.WorkerResult(p, contents={"txt": p}, text=p) for p in calls[-1][1]]
            return type("Ref", (), {"value": made if self.name == "run_many" else made[0]})()

    class FakeActor:
        pid = type("P", (), {"remote": staticmethod(lambda: 1)})
        run, run_many = FakeMethod("run"), FakeMethod("run_many")

    class FakeActorClass:
        @staticmethod
        def remote(*args):
            return FakeActor()

    monkeypatch.setattr(distributed, "import_ray", lambda: FakeRay())
    monkeypatch.setattr(distributed, "audio_seconds_guess", lambda path: float(Path(path).stem[1:]))
    monkeypatch.setattr(distributed, "_start", lambda ray, actors: {a: 1 for a in actors})
    from medusa_whisper.archive.batch import Job

    jobs = [Job(f"/x/a{seconds}.wav") for seconds in (5, 50, 20, 40, 10, 30, 60)]
    summary = distributed.transcribe_archive(jobs, tmp_path, ["txt"], {}, {},
                                             distributed.RayOptions(workers=1, batch_size=2), skip_existing=False)
    assert [name for name, _ in calls] == ["run_many", "run_many"]
    assert [[Path(p).stem for p in paths] for _, paths in calls] == [["a60", "a50", "a40", "a30"], ["a20", "a10", "a5"]]
    assert summary.done == 7
    assert {p.name: p.read_text() for p in tmp_path.iterdir()} == {Path(j.path).stem + ".txt": j.path for j in jobs}
