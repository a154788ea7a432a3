"""A transcript's output files, written so that an interrupted run never leaves a half file.

Each file is rendered in memory, written under a hidden temporary name beside its final one,
flushed to disk and renamed onto the final name (a rename within one folder is atomic on POSIX). A
batch killed at any moment leaves, for each output, either the complete file or no file; a
transcript counts as done when every one of its files exists (``is_done``), which is how
``--skip-existing`` resumes a batch. The CLI and the Ray runner both write through here, so their
files are byte for byte the same.
"""

from __future__ import annotations

import io
import json
import os
from pathlib import Path
from typing import Dict, List, Optional, Sequence, Tuple, Union

# whisper's writers, plus our own json (whisper's keys with whisper's values, and Medusa statistics)
OUTPUT_FORMATS = ("txt", "vtt", "srt", "tsv", "json")
# whisper's subtitle options, passed to its writers as they are
WRITER_OPTIONS = ("highlight_words", "max_line_width", "max_line_count", "max_words_per_line")
# result["medusa"] entries copied into each JSON file. Run times (encode_seconds, ...) are left out
# so that the same audio and model give the same file on every run and every machine.
STAT_FIELDS = ("audio_seconds", "windows", "fallback_windows", "tokens", "decoder_steps", "tokens_per_step",
               "draft_proposed",
               "draft_accepted", "draft_acceptance")
TEMPORARY_SUFFIX = ".partial"


def formats(output_format: str) -> Tuple[str, ...]:
    return OUTPUT_FORMATS if output_format == "all" else (output_format,)


def output_paths(out_dir: Union[str, os.PathLike], audio_path: str, output_formats: Sequence[str]) -> List[Path]:
    """``<out_dir>/<stem of audio_path>.<format>`` for each format: the names whisper gives them."""
    stem = os.path.splitext(os.path.basename(audio_path))[0]
    return [Path(out_dir) / f"{stem}.{fmt}" for fmt in output_formats]


def is_done(out_dir, audio_path: str, output_formats: Sequence[str]) -> bool:
    return all(p.is_file() for p in output_paths(out_dir, audio_path, output_formats))


def output_record(path: str, result: dict) -> dict:
    """A file's JSON: whisper's text, segments and language as whisper writes them, our statistics after."""
    stats = result.get("medusa", {})
    record = {"text": result["text"], "segments": result.get("segments", []), "language": result.get("language"),
              "file": _printable(str(path))}
    record.update({k: stats[k] for k in STAT_FIELDS if k in stats})
    return record


def render(result: dict, audio_path: str, output_format: str, options: Optional[Dict] = None) -> str:
    """One output file's text: whisper's own writer for txt, vtt, srt and tsv, ours for json."""
    if output_format == "json":
        record = output_record(audio_path, result)
        return json.dumps(record, indent=2, ensure_ascii=False, default=_to_plain) + "\n"
    from whisper.utils import get_writer

    text = io.StringIO()
    get_writer(output_format, ".").write_result(result, file=text, options=dict(options or {}))
    return text.getvalue()


def write_outputs(result: dict, audio_path: str, out_dir: Union[str, os.PathLike], output_formats: Sequence[str],
                  options: Optional[Dict] = None) -> List[Path]:
    """Write every format of one transcript atomically; returns the paths written.

    All files are rendered before the first is written, so a writer's error leaves nothing behind.
    """
    paths = output_paths(out_dir, audio_path, output_formats)
    contents = [render(result, audio_path, fmt, options) for fmt in output_formats]
    for path, content in zip(paths, contents):
        atomic_write(path, content.encode("utf-8", "surrogateescape"))
    return paths


def atomic_write(path: Path, data: bytes) -> None:
    """``data`` into ``path`` through a temporary file and a rename: readers see all of it or nothing."""
    for stale in path.parent.glob(f".{_glob_escape(path.name)}.*{TEMPORARY_SUFFIX}"):
        stale.unlink(missing_ok=True)  # left by a run that was killed while writing this very file
    tmp = path.with_name(f".{path.name}.{os.getpid()}{TEMPORARY_SUFFIX}")
    try:
        with open(tmp, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())  # the bytes are on disk before the name points at them
        os.replace(tmp, path)
    finally:
        tmp.unlink(missing_ok=True)


def _glob_escape(name: str) -> str:
    return "".join(f"[{c}]" if c in "*?[" else c for c in name)


def _printable(text: str) -> str:
    """A path that may hold undecodable bytes (surrogate escapes), as valid UTF-8 text."""
    return text.encode("utf-8", "surrogateescape").decode("utf-8", "replace")


def _to_plain(value):
    """numpy and torch scalars or arrays that may sit in whisper's segments, as JSON values."""
    if hasattr(value, "tolist"):
        return value.tolist()
    raise TypeError(f"{type(value).__name__} is not JSON serializable")
