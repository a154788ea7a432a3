"""What a file is, from its first bytes: the words for an error about a file no decoder can read.

Decoders' own reasons are often wrong about the real problem (libsndfile, failing on a text file
named ``.mp3``, says the file "does not exist or is not a regular file"), so the message a user sees
is built from what the file holds: a damaged file of a known audio format, or something that is not
audio at all (text, a web page, an image, an archive).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Optional

HEAD_BYTES = 4096


@dataclass(frozen=True)
class Kind:
    name: str  # "FLAC", "a PNG image", "text", ...
    audio: bool  # an audio (or audio-bearing) container


# (offset, magic, second offset, second magic, kind); checked in order, first match wins
_MAGIC = [
    (0, b"RIFF", 8, b"WAVE", Kind("WAV", True)),
    (0, b"RIFF", 8, b"AVI ", Kind("AVI video", True)),
    (0, b"RF64", 8, b"WAVE", Kind("RF64 WAV", True)),
    (0, b"riff", 0, b"", Kind("Wave64", True)),
    (0, b"fLaC", 0, b"", Kind("FLAC", True)),
    (0, b"OggS", 0, b"", Kind("Ogg", True)),
    (0, b"ID3", 0, b"", Kind("MP3", True)),
    (0, b"FORM", 8, b"AIFF", Kind("AIFF", True)),
    (0, b"FORM", 8, b"AIFC", Kind("AIFF", True)),
    (4, b"ftyp", 0, b"", Kind("MP4/M4A", True)),
    (0, b"\x1a\x45\xdf\xa3", 0, b"", Kind("Matroska/WebM", True)),
    (0, b".snd", 0, b"", Kind("AU", True)),
    (0, b"caff", 0, b"", Kind("CAF", True)),
    (0, b"#!AMR", 0, b"", Kind("AMR", True)),
    (0, b"wvpk", 0, b"", Kind("WavPack", True)),
    (0, b"MAC ", 0, b"", Kind("Monkey's Audio", True)),
    (0, b"0&\xb2u\x8ef\xcf\x11", 0, b"", Kind("WMA/ASF", True)),
    (0, b"\x89PNG", 0, b"", Kind("a PNG image", False)),
    (0, b"\xff\xd8\xff", 0, b"", Kind("a JPEG image", False)),
    (0, b"GIF8", 0, b"", Kind("a GIF image", False)),
    (0, b"%PDF", 0, b"", Kind("a PDF document", False)),
    (0, b"PK\x03\x04", 0, b"", Kind("a ZIP archive", False)),
    (0, b"\x1f\x8b", 0, b"", Kind("a gzip archive", False)),
    (0, b"7z\xbc\xaf", 0, b"", Kind("a 7-Zip archive", False)),
    (0, b"\xfd7zXZ", 0, b"", Kind("an xz archive", False)),
    (0, b"BZh", 0, b"", Kind("a bzip2 archive", False)),
    (0, b"\x7fELF", 0, b"", Kind("a program (ELF)", False)),
    (0, b"SQLite format 3", 0, b"", Kind("an SQLite database", False)),
]


def sniff(head: bytes) -> Optional[Kind]:
    """The kind of file these first bytes begin, or None when they say nothing known."""
    for offset, magic, offset2, magic2, kind in _MAGIC:
        # a file cut short of its second magic still counts (a truncated WAV is a WAV)
        second = head[offset2 : offset2 + len(magic2)] == magic2 or len(head) < offset2 + len(magic2)
        if head[offset : offset + len(magic)] == magic and second:
            return kind
    if head[:2] in (b"\xff\xfe", b"\xfe\xff") and _as_text(head) is not None:  # UTF-16 text, before MPEG's sync
        return Kind("text", False)
    if len(head) >= 2 and head[0] == 0xFF and head[1] & 0xE0 == 0xE0:  # an MPEG audio or AAC frame header
        return Kind("MPEG audio", True)
    if head and not any(head):
        return Kind("only zero bytes", False)
    text = _as_text(head)
    if text is not None:
        lowered = text.lstrip().lower()
        if lowered.startswith(("<!doctype html", "<html")):
            return Kind("a web page (HTML)", False)
        if lowered.startswith("<?xml"):
            return Kind("XML text", False)
        return Kind("text", False)
    return None


def sniff_file(path: Path) -> Optional[Kind]:
    try:
        with open(path, "rb") as f:
            return sniff(f.read(HEAD_BYTES))
    except OSError:
        return None


def _as_text(head: bytes) -> Optional[str]:
    """The bytes as text when they read as mostly printable UTF-8 or UTF-16 (with its byte-order mark)."""
    for encoding in ("utf-16",) if head[:2] in (b"\xff\xfe", b"\xfe\xff") else ("utf-8",):
        try:
            text = head.decode(encoding)
        except UnicodeDecodeError as e:
            if e.start < len(head) - 4:  # a character cut at the end of the head is fine
                return None
            text = head[: e.start].decode(encoding)
        if not text:
            return None
        printable = sum(c.isprintable() or c in "\n\r\t" for c in text)
        return text if printable >= 0.95 * len(text) else None
    return None


def describe_unreadable(kind: Optional[Kind], reason: str) -> str:
    """The words after ``<path>: `` for a file no decoder could open."""
    if kind is not None and not kind.audio:
        return f"not an audio file: it holds {kind.name}"
    what = f"a damaged or truncated {kind.name} file" if kind is not None else "not a readable audio file"
    return f"{what} ({reason})" if reason else what
