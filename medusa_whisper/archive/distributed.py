"""Transcribing an archive on many machines: a pool of Ray actors, each holding one loaded model.

The driver (the machine that runs the command) lists the files, skips those whose outputs are all
there, and hands the rest out longest first to idle actors: one file at a time, or with a batch size
above 1 a group of files that the actor decodes side by side (``transcribe.transcribe_many``, as
``--batch-size`` does on one machine). An actor transcribes whole files (long-form decoding is
sequential: a file is never split) and sends back the rendered output files; the driver writes
them atomically (``outputs.atomic_write``), so the bytes are the single-machine command's and
workers need no access to the output folder. A file that fails is one line in ``OUT/failed.tsv``;
an actor whose process dies is restarted by Ray and its file (or group) tried once more
(``max_restarts=1, max_task_retries=1``).

Ray stays optional: ``pip install medusa-whisper[ray]``.
"""

from __future__ import annotations

import contextlib
import os
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Dict, List, Optional, Sequence

from .batch import FileOutcome, Job, Summary, collect_jobs
from ..errors import MedusaWhisperError
from ..transcription.outputs import atomic_write, render

FAILED_TSV = "failed.tsv"
INSTALL_HINT = "pip install 'medusa-whisper[ray]'"


class RayMissingError(MedusaWhisperError):
    """--ray without the ray package."""


def import_ray():
    try:
        import ray
    except ImportError:
        raise RayMissingError(f"--ray needs the ray package; install it with `{INSTALL_HINT}`") from None
    return ray


def read_manifest(path: Path) -> List[str]:
    """One path or fsspec URL per line; blank lines and lines starting with # are skipped."""
    try:
        lines = Path(path).read_text(encoding="utf-8").splitlines()
    except OSError as e:
        raise MedusaWhisperError(f"{path}: cannot read the manifest ({e.strerror or e})") from None
    return [line.strip() for line in lines if line.strip() and not line.lstrip().startswith("#")]


def is_url(path: str) -> bool:
    return "://" in path and not path.startswith("file://")


def audio_seconds_guess(path: str) -> float:
    """How long a file is, from its header (cheap); its size in bytes stands in when that fails."""
    if is_url(path):
        try:
            import fsspec

            return float(fsspec.filesystem(path.split("://")[0]).size(path)) / 32000
        except Exception:  # a URL that cannot be sized goes last; the worker says what is wrong
            return 0.0
    try:
        import soundfile

        return float(soundfile.info(os.fsencode(path)).duration)
    except Exception:
        try:
            return os.path.getsize(path) / 32000  # about 16 kHz 16-bit
        except OSError:
            return 0.0


@dataclass
class WorkerResult:
    """What an actor sends back for one file: rendered outputs, or the one-line reason it failed."""

    path: str
    contents: Dict[str, str] = field(default_factory=dict)
    text: Optional[str] = None
    error: Optional[str] = None
    audio_seconds: float = 0.0
    seconds: float = 0.0
    pid: int = 0


class Transcriber:
    """One loaded model in one process; the body of the Ray actor."""

    def __init__(self, model: str, device: Optional[str], threads: int, draft: Optional[str] = None,
                 download_root: Optional[str] = None, load_options: Optional[dict] = None):
        import torch

        import medusa_whisper

        torch.set_num_threads(threads)
        self.model = medusa_whisper.load_model(model, device=device, draft=draft, download_root=download_root,
                                                **(load_options or {}))

    def pid(self) -> int:
        return os.getpid()

    def run(self, path: str, options: dict, output_formats: Sequence[str], writer_options: dict) -> WorkerResult:
        began = time.perf_counter()
        result = WorkerResult(path, pid=os.getpid())
        try:
            with contextlib.ExitStack() as copies:
                _fill(result, self.model.transcribe(_readable(path, copies), **options), output_formats,
                      writer_options)
        except MedusaWhisperError as e:
            result.error = str(e)
        result.seconds = time.perf_counter() - began
        return result

    def run_many(self, paths: Sequence[str], options: dict, output_formats: Sequence[str], writer_options: dict,
                 batch_size: int) -> List[WorkerResult]:
        """Several files with their windows side by side (``transcribe_many``); one result per path, in
        order. ``seconds``: from the start of the group to that file's end."""
        from ..transcription.longform import transcribe_many

        began = time.perf_counter()
        results = [WorkerResult(path, pid=os.getpid()) for path in paths]
        with contextlib.ExitStack() as copies:
            readable: List[int] = []  # indices of paths that reach the decoder
            local: List[str] = []
            for index, path in enumerate(paths):
                try:
                    local.append(_readable(path, copies))
                    readable.append(index)
                except MedusaWhisperError as e:
                    results[index].error = str(e)

            def done(position: int, transcript: Optional[dict], error: Optional[Exception]) -> None:
                result = results[readable[position]]
                try:
                    if error is not None:
                        raise error
                    _fill(result, transcript, output_formats, writer_options)
                except MedusaWhisperError as e:
                    result.error = str(e)
                result.seconds = time.perf_counter() - began

            transcribe_many(self.model, local, batch_size=batch_size, on_done=done, **options)
        return results


def _readable(path: str, copies: contextlib.ExitStack) -> str:
    """A local path for ``path``: an fsspec URL copied to a temporary file (removed when ``copies``
    closes), a local file checked."""
    from ..audio.files import check_audio_path

    if is_url(path):
        return copies.enter_context(_local_copy(path))
    check_audio_path(path)
    return path


def _fill(result: WorkerResult, transcript: dict, output_formats: Sequence[str], writer_options: dict) -> None:
    """A transcript's rendered output files, text and audio length into ``result``."""
    result.contents = {fmt: render(transcript, result.path, fmt, writer_options) for fmt in output_formats}
    result.text = transcript["text"]
    result.audio_seconds = float(transcript["medusa"].get("audio_seconds", 0.0))


class _local_copy:
    """An fsspec URL copied to a local temporary file (decoders want a path), removed afterwards."""

    def __init__(self, url: str):
        self.url = url
        self.path: Optional[str] = None

    def __enter__(self) -> str:
        import fsspec

        suffix = os.path.splitext(self.url)[1]
        handle, self.path = tempfile.mkstemp(prefix="medusa_whisper_", suffix=suffix)
        try:
            with os.fdopen(handle, "wb") as out, fsspec.open(self.url, "rb") as source:
                while block := source.read(1 << 20):
                    out.write(block)
        except Exception as e:  # fsspec's backends raise their own types
            os.unlink(self.path)
            raise MedusaWhisperError(f"{self.url}: cannot be read ({type(e).__name__}: {e})") from None
        return self.path

    def __exit__(self, *exc) -> None:
        if self.path is not None:
            os.unlink(self.path)


@dataclass
class RayOptions:
    address: Optional[str] = None  # None: a local Ray on this machine; "auto" or host:port: join a cluster
    workers: int = 1
    threads_per_worker: int = 1
    model: str = "tiny.en"
    device: Optional[str] = None
    draft: Optional[str] = None
    download_root: Optional[str] = None
    load_options: dict = field(default_factory=dict)  # more load_model arguments (compute types)
    batch_size: int = 1  # above 1: each actor decodes this many files' windows side by side


# with a batch size above 1, an actor is handed this many batches' worth of files at once: enough for
# its batch to stay full as files end (files go out longest first, so a group's files are of about one
# length), few enough that a lost worker costs little work and outputs reach the folder as they go
GROUP_BATCHES = 2


def transcribe_archive(jobs: Sequence[Job], output_dir: Path, output_formats: Sequence[str], options: dict,
                       writer_options: dict, ray_options: RayOptions, *, skip_existing: bool = True,
                       on_problem: Callable[[str], None] = print, on_done: Optional[Callable[[FileOutcome], None]] = None,
                       on_dispatch: Optional[Callable[[Job, int], None]] = None, progress: bool = False) -> Summary:
    """Transcribe ``jobs`` on a pool of Ray actors, writing each file's outputs as it finishes.

    on_problem  : called with each one-line failure (also written to OUT/failed.tsv)
    on_dispatch : called with (job, worker pid) when a file is handed to a worker
    returns     : the summary (done, failed, skipped, audio seconds, wall time)
    """
    ray = import_ray()
    summary = Summary()
    if skip_existing:
        todo = [job for job in jobs if not job.done(output_dir, output_formats)]
        summary.skipped = len(jobs) - len(todo)
        jobs = todo
    output_dir.mkdir(parents=True, exist_ok=True)
    failed_tsv = output_dir / FAILED_TSV
    failures: List[str] = []
    if not jobs:
        return summary
    jobs = sorted(jobs, key=lambda j: -audio_seconds_guess(j.path))  # longest first: no long tail at the end
    group = 1 if ray_options.batch_size <= 1 else ray_options.batch_size * GROUP_BATCHES

    started_here = not ray.is_initialized()
    if started_here:
        init = dict(address=ray_options.address) if ray_options.address else dict(
            num_cpus=ray_options.workers * ray_options.threads_per_worker)
        ray.init(**init, include_dashboard=False, log_to_driver=False, configure_logging=False)
    try:
        actor_class = ray.remote(num_cpus=ray_options.threads_per_worker, max_restarts=1,
                                 max_task_retries=1)(Transcriber)
        actors = [actor_class.remote(ray_options.model, ray_options.device, ray_options.threads_per_worker,
                                     ray_options.draft, ray_options.download_root, ray_options.load_options)
                  for _ in range(min(ray_options.workers, len(jobs)))]
        pids = _start(ray, actors)
        pending = list(jobs)
        running: Dict[object, tuple] = {}
        bar = _bar(len(jobs), progress)
        while pending or running:
            for actor in actors:
                if pending and actor not in {a for a, _ in running.values()}:
                    given, pending = pending[:group], pending[group:]
                    if on_dispatch is not None:
                        for job in given:
                            on_dispatch(job, pids[actor])
                    if group == 1:
                        ref = actor.run.remote(given[0].path, options, output_formats, writer_options)
                    else:
                        ref = actor.run_many.remote([job.path for job in given], options, output_formats,
                                                    writer_options, ray_options.batch_size)
                    running[ref] = (actor, given)
            ready, _ = ray.wait(list(running), num_returns=1)
            actor, given = running.pop(ready[0])
            for outcome in _collect(ray, ready[0], given, output_dir, output_formats):
                summary.add(outcome)
                if not outcome.ok:
                    failures.append(f"{outcome.job.path}\t{outcome.error}")
                    on_problem(outcome.error)
                    _write_failures(failed_tsv, failures)
                if on_done is not None:
                    on_done(outcome)
                bar.update(1)
        bar.close()
    finally:
        if started_here:
            ray.shutdown()
    _write_failures(failed_tsv, failures)
    return summary


def _start(ray, actors) -> dict:
    """Wait until every actor has loaded its model; their process ids."""
    return dict(zip(actors, ray.get([a.pid.remote() for a in actors])))


def _collect(ray, ref, jobs: Sequence[Job], output_dir: Path, output_formats: Sequence[str]) -> List[FileOutcome]:
    """The outcomes of one call (``run``: one file, ``run_many``: several), each file's outputs written."""
    try:
        returned = ray.get(ref)
    except ray.exceptions.RayActorError:
        return [FileOutcome(job, error=f"{job.path}: the worker died twice while transcribing it (out of memory?)")
                for job in jobs]
    except ray.exceptions.RayTaskError as e:  # a bug in a worker: one line here, the traceback in Ray's log
        return [FileOutcome(job, error=f"{job.path}: failed in the worker ({type(e.cause).__name__}: {e.cause})")
                for job in jobs]
    results = returned if isinstance(returned, list) else [returned]
    return [_write_result(job, result, output_dir, output_formats) for job, result in zip(jobs, results)]


def _write_result(job: Job, result: WorkerResult, output_dir: Path, output_formats: Sequence[str]) -> FileOutcome:
    outcome = FileOutcome(job)
    if result.error is not None:
        outcome.error = result.error
        return outcome
    out_dir = job.out_dir(output_dir)
    try:
        out_dir.mkdir(parents=True, exist_ok=True)
        for path, fmt in zip(job.outputs(output_dir, output_formats), output_formats):
            atomic_write(path, result.contents[fmt].encode("utf-8", "surrogateescape"))
    except OSError as e:
        outcome.error = f"{e.filename or out_dir}: cannot write the output ({e.strerror or e})"
        return outcome
    outcome.text, outcome.audio_seconds, outcome.seconds = result.text, result.audio_seconds, result.seconds
    return outcome


def _write_failures(path: Path, failures: List[str]) -> None:
    """OUT/failed.tsv: file and reason, one per line; removed when a run has none."""
    if failures:
        atomic_write(path, ("file\treason\n" + "\n".join(failures) + "\n").encode("utf-8", "surrogateescape"))
    elif path.exists():
        path.unlink()


def _bar(total: int, show: bool):
    import sys

    from tqdm import tqdm

    return tqdm(total=total, unit="file", file=sys.stderr, disable=not show)


def collect_inputs(inputs: Sequence[str], manifest: Optional[Path], on_problem: Callable[[str], None]) -> List[Job]:
    """The jobs of the command line's inputs and of a manifest (paths or fsspec URLs)."""
    listed = read_manifest(manifest) if manifest is not None else []
    local = [p for p in [*inputs, *listed] if not is_url(p)]
    urls = [Job(p) for p in listed if is_url(p)]
    return collect_jobs(local, on_problem) + urls
