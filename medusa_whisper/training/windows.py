"""Training audio: read a CSV or a folder of audio, and pack utterances into ~25-second windows.

Whisper always decodes a 30-second window, so one encoder pass over a window holding several
sentences yields about a hundred target tokens instead of a dozen (issue 3, "pack several
sentences into one window"). Utterances of one speaker (the CSV's ``voice`` column when there is
one) are packed together with short pauses between them, as in a real recording.
"""

from __future__ import annotations

import csv
import random
from dataclasses import dataclass, field
from pathlib import Path
from typing import Dict, Iterable, List, Optional, Sequence

import numpy as np

from ..audio.files import SAMPLE_RATE, load_audio
from ..errors import MedusaWhisperError

AUDIO_SUFFIXES = (".wav", ".flac", ".ogg", ".mp3", ".m4a", ".opus", ".webm", ".mp4")
REQUIRED_COLUMNS = ("audio",)
# whisper's window is 30 s; leave room so that the last word is never cut by pad_or_trim
MAX_WINDOW_SECONDS = 29.0


@dataclass(frozen=True)
class Utterance:
    path: str
    sentence: str = ""
    language: str = "en"
    group: str = ""  # utterances of one group (speaker) are packed together
    seconds: Optional[float] = None


@dataclass
class Window:
    """Utterances that are played one after the other, ``pauses[i]`` seconds before utterance i."""

    utterances: List[Utterance]
    pauses: List[float] = field(default_factory=list)

    @property
    def language(self) -> str:
        return self.utterances[0].language

    @property
    def sentence(self) -> str:
        return " ".join(u.sentence.strip() for u in self.utterances if u.sentence.strip())


class DataError(MedusaWhisperError):
    """A training data file or folder that cannot be used."""


def read_csv(path: Path) -> List[Utterance]:
    """The reference's CSV (``audio``, ``sentence``, ``language``); ``voice``/``seconds`` if present.

    Audio paths are taken relative to the CSV's folder unless absolute.
    """
    path = Path(path)
    if not path.is_file():
        raise DataError(f"{path}: no such file")
    with path.open(newline="", encoding="utf-8") as f:
        reader = csv.DictReader(f)
        missing = [c for c in REQUIRED_COLUMNS if c not in (reader.fieldnames or [])]
        if missing:
            raise DataError(f"{path}: missing column {missing[0]!r} (has {reader.fieldnames})")
        rows = list(reader)
    utterances = []
    for row in rows:
        audio = Path(row["audio"])
        audio = audio if audio.is_absolute() else path.parent / audio
        seconds = row.get("seconds")
        utterances.append(Utterance(
            path=str(audio),
            sentence=(row.get("sentence") or "").strip(),
            language=(row.get("language") or "en").strip() or "en",
            group=(row.get("voice") or "").strip(),
            seconds=float(seconds) if seconds else None,
        ))
    if not utterances:
        raise DataError(f"{path}: no rows")
    return utterances


def read_audio_dir(folder: Path, language: str = "en") -> List[Utterance]:
    """Every audio file under a folder, unlabelled; files in one sub-folder form one group."""
    folder = Path(folder)
    if not folder.is_dir():
        raise DataError(f"{folder}: no such folder")
    files = sorted(p for p in folder.rglob("*") if p.suffix.lower() in AUDIO_SUFFIXES and p.is_file())
    if not files:
        raise DataError(f"{folder}: no audio files ({', '.join(AUDIO_SUFFIXES)})")
    return [Utterance(path=str(p), language=language, group=str(p.parent.relative_to(folder))) for p in files]


def duration(u: Utterance) -> float:
    """Seconds of an utterance: the CSV's `seconds` when given, else measured from the file."""
    if u.seconds is not None:
        return u.seconds
    import soundfile as sf

    try:
        return sf.info(u.path).duration
    except Exception:  # not readable by libsndfile: decode it (through ffmpeg) to measure
        return len(load_audio(u.path)) / SAMPLE_RATE


def pack(utterances: Sequence[Utterance], seed: int = 0, min_seconds: float = 20.0,
         max_seconds: float = 28.0, pause: Sequence[float] = (0.2, 1.0), first_fit: bool = False) -> List[Window]:
    """Group utterances into windows of about ``min_seconds``..``max_seconds`` of audio.

    Each window's target length is drawn uniformly from that range; utterances of one group are
    shuffled and added while they fit. An utterance longer than the window limit gets a window of
    its own (it is cut to 30 s later, as whisper would). Deterministic for a given seed.

    first_fit : an utterance goes into the first window of its group it fits in, not only the last
                one: fewer, fuller windows (about an eighth fewer on make speech's voices, whose
                long utterances often close a window early), and the encoder pass per window is
                most of what caching costs. Off by default: caches built without it keep their windows.
    """
    rng = random.Random(seed)
    groups: Dict[str, List[Utterance]] = {}
    for u in utterances:
        groups.setdefault(u.group, []).append(u)
    windows: List[Window] = []
    for name in sorted(groups):
        members = list(groups[name])
        rng.shuffle(members)
        open_windows: List[List] = []  # [window, seconds so far, target seconds], the group's windows
        for u in members:
            seconds = duration(u)
            gap = rng.uniform(*pause)
            candidates = open_windows if first_fit else open_windows[-1:]
            slot = next((c for c in candidates if c[1] + gap + seconds <= min(c[2], MAX_WINDOW_SECONDS)), None)
            if slot is not None:
                slot[0].utterances.append(u)
                slot[0].pauses.append(gap)
                slot[1] += gap + seconds
                continue
            current = Window([u], [rng.uniform(0.0, pause[1])])
            windows.append(current)
            open_windows.append([current, current.pauses[0] + seconds, rng.uniform(min_seconds, max_seconds)])
    rng.shuffle(windows)
    return windows


def render(window: Window) -> np.ndarray:
    """The window's audio: its utterances with silence before each, 16 kHz float32."""
    pieces = []
    for u, gap in zip(window.utterances, window.pauses):
        pieces.append(np.zeros(int(gap * SAMPLE_RATE), dtype=np.float32))
        pieces.append(load_audio(u.path))
    return np.concatenate(pieces)


def read_sources(csv_paths: Iterable[Path] = (), audio_dirs: Iterable[Path] = (), language: str = "en") -> List[Utterance]:
    utterances: List[Utterance] = []
    for p in csv_paths:
        utterances += read_csv(Path(p))
    for d in audio_dirs:
        utterances += read_audio_dir(Path(d), language)
    return utterances
