"""A batch of audio files: which files, which are done, one file's transcription, the summary.

Shared by the single-machine command and the Ray runner (``distributed.py``), so that both find
the same files under the same inputs, name their outputs alike and write the same bytes.
"""

from __future__ import annotations

import os
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Dict, Iterable, List, Optional, Sequence, Tuple

from ..errors import AudioError, MedusaWhisperError
from ..transcription.outputs import is_done, output_paths, write_outputs

# What a folder given as input is searched for (lower case). Any file named on the command line is
# tried whatever its name.
AUDIO_EXTENSIONS = frozenset(
    ".wav .wave .flac .mp3 .ogg .oga .opus .m4a .mp4 .aac .wma .webm .mkv .mka .aiff .aif .aifc .au .snd .caf "
    ".w64 .rf64 .amr .wv .ape .mov .avi .3gp .voc .sf .nist .spx".split())


@dataclass(frozen=True)
class Job:
    """One input file and where its outputs go."""

    path: str  # as the user gave it, or as found under a folder they gave
    subdir: str = ""  # the file's folder below the input folder, mirrored below the output folder

    def out_dir(self, output_dir: Path) -> Path:
        return output_dir / self.subdir if self.subdir else output_dir

    def outputs(self, output_dir: Path, output_formats: Sequence[str]) -> List[Path]:
        return output_paths(self.out_dir(output_dir), self.path, output_formats)

    def done(self, output_dir: Path, output_formats: Sequence[str]) -> bool:
        return is_done(self.out_dir(output_dir), self.path, output_formats)


def collect_jobs(inputs: Iterable[str], on_problem: Callable[[str], None]) -> List[Job]:
    """A job per file named, and per audio file found (recursively, in name order) under a folder named.

    Hidden files and folders are skipped. A folder holding no audio is reported, not an error
    that stops the others.
    """
    jobs: List[Job] = []
    for given in inputs:
        if not os.path.isdir(given):
            jobs.append(Job(given))  # missing or unreadable files are reported by check_audio_path
            continue
        found = list(_audio_under(given))
        if not found:
            on_problem(f"{given}: is a directory with no audio files in it")
        jobs.extend(found)
    return jobs


def _audio_under(folder: str) -> Iterable[Job]:
    for root, dirs, files in os.walk(folder, followlinks=False):
        dirs[:] = sorted(d for d in dirs if not d.startswith("."))
        subdir = os.path.relpath(root, folder)
        for name in sorted(files):
            if not name.startswith(".") and os.path.splitext(name)[1].lower() in AUDIO_EXTENSIONS:
                yield Job(os.path.join(root, name), "" if subdir == "." else subdir)


def output_clash(jobs: Sequence[Job], output_formats: Sequence[str]) -> Optional[str]:
    """Two inputs that would write the same output file: said before any work, as a usage error."""
    seen: Dict[Tuple[str, str], str] = {}
    for job in jobs:
        stem = os.path.splitext(os.path.basename(job.path))[0]
        key = (job.subdir, stem)
        if key in seen and seen[key] != job.path:
            name = os.path.join(job.subdir, f"{stem}.{output_formats[0]}")
            return f"{seen[key]} and {job.path} would both write {name} in the output folder"
        seen[key] = job.path
    return None


@dataclass
class FileOutcome:
    """What became of one file: its transcript, or the one-line reason it failed."""

    job: Job
    text: Optional[str] = None
    error: Optional[str] = None
    audio_seconds: float = 0.0
    seconds: float = 0.0
    result: Optional[dict] = field(default=None, repr=False)

    @property
    def ok(self) -> bool:
        return self.error is None


def transcribe_job(model, job: Job, options: dict, output_dir: Optional[Path], output_formats: Sequence[str],
                   writer_options: Optional[dict] = None, progress=None) -> FileOutcome:
    """Transcribe one file and write its outputs; a user's error (bad audio, full disk) is the outcome's
    ``error``, one line naming the file. Anything else is a bug and is raised."""
    from ..transcription.longform import own_random_state

    began = time.perf_counter()
    try:
        with own_random_state({}, job.path):  # as transcribe_jobs: each file's sampled windows as in a fresh process
            result = model.transcribe(job.path, progress=progress, **options)
    except MedusaWhisperError as e:
        return FileOutcome(job, error=str(e), seconds=time.perf_counter() - began)
    return _finish(job, result, output_dir, output_formats, writer_options, began)


def transcribe_jobs(model, jobs: Sequence[Job], options: dict, output_dir: Optional[Path],
                    output_formats: Sequence[str], writer_options: Optional[dict], batch_size: int,
                    on_outcome: Callable[[FileOutcome], None]) -> None:
    """Transcribe files with their greedy windows side by side (``transcribe.transcribe_many``), writing
    each file's outputs as it ends and handing ``on_outcome`` what ``transcribe_job`` would have
    returned for it (``seconds``: from the start of the batch to that file's end)."""
    from ..transcription.longform import transcribe_many

    began = time.perf_counter()

    def done(index: int, result: Optional[dict], error: Optional[Exception]) -> None:
        job = jobs[index]
        if error is not None:
            on_outcome(FileOutcome(job, error=str(error), seconds=time.perf_counter() - began))
        else:
            on_outcome(_finish(job, result, output_dir, output_formats, writer_options, began))

    transcribe_many(model, [job.path for job in jobs], batch_size=batch_size, on_done=done, **options)


def _finish(job: Job, result: dict, output_dir: Optional[Path], output_formats: Sequence[str],
            writer_options: Optional[dict], began: float) -> FileOutcome:
    """Write one file's outputs (when there is an output folder) and say how it went."""
    outcome = FileOutcome(job)
    try:
        if output_dir is not None:
            out_dir = job.out_dir(output_dir)
            try:
                out_dir.mkdir(parents=True, exist_ok=True)
                write_outputs(result, job.path, out_dir, output_formats, writer_options)
            except OSError as e:
                where = e.filename or out_dir
                raise AudioError(f"{where}: cannot write the output ({e.strerror or e})") from None
    except MedusaWhisperError as e:
        outcome.error = str(e)
    else:
        outcome.text, outcome.result = result["text"], result
        outcome.audio_seconds = float(result.get("medusa", {}).get("audio_seconds", 0.0))
    outcome.seconds = time.perf_counter() - began
    return outcome


@dataclass
class Summary:
    """Files done, failed and skipped, hours of audio, wall time: the last line of a batch."""

    done: int = 0
    failed: int = 0
    skipped: int = 0
    audio_seconds: float = 0.0
    began: float = field(default_factory=time.perf_counter)

    def add(self, outcome: FileOutcome) -> None:
        if outcome.ok:
            self.done += 1
            self.audio_seconds += outcome.audio_seconds
        else:
            self.failed += 1

    @property
    def wall_seconds(self) -> float:
        return time.perf_counter() - self.began

    def line(self) -> str:
        wall = self.wall_seconds
        parts = [f"{self.done} file{'s' if self.done != 1 else ''} done", f"{self.failed} failed"]
        if self.skipped:
            parts.append(f"{self.skipped} skipped (already done)")
        speed = ""
        if self.audio_seconds > 0 and wall > 0:
            speed = (f"; real-time factor {wall / self.audio_seconds:.3f} "
                     f"({self.audio_seconds / wall:.1f}x real time, {60 * self.done / wall:.1f} files per minute)")
        return (f"{', '.join(parts)}: {_duration(self.audio_seconds)} of audio in {_duration(wall)}{speed}")


def _duration(seconds: float) -> str:
    if seconds >= 3600:
        return f"{seconds / 3600:.2f} h"
    if seconds >= 60:
        return f"{int(seconds // 60)} min {seconds % 60:.0f} s"
    return f"{seconds:.1f} s"
