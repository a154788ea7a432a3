"""Bad and odd audio inputs, as users will hand them to the CLI, built into one folder.

``build(folder)`` writes every case and returns what each should give: ``good`` (transcribed, its
output written), ``bad`` (one error line naming the file and containing ``problem``), or ``either``
(a damaged file that a decoder may still partly read: written, or one error line, never noise).
Deterministic: every random byte comes from a seeded generator.

Run as a script to build the folder by hand: ``python tests/fuzz_inputs.py OUT_DIR``.
"""

from __future__ import annotations

import io
import os
import stat
import struct
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, List

import numpy as np
import soundfile as sf

DATA = Path(__file__).parent / "data"
SPEECH_SECONDS = 2.5  # "And so my fellow Americans": short, so a good file costs one quick window
RATE = 16000


@dataclass
class Case:
    name: str
    kind: str  # "good", "bad" or "either"
    problem: str = ""  # bad: words the error line must contain (lower case)


def speech(rate: int = RATE, seconds: float = SPEECH_SECONDS) -> np.ndarray:
    """The start of the JFK recording, float32 mono at ``rate``."""
    samples, source_rate = sf.read(DATA / "real" / "jfk.flac", dtype="float32", frames=int(seconds * RATE))
    if rate == source_rate:
        return samples
    import soxr

    return soxr.resample(samples, source_rate, rate).astype(np.float32)


def encoded(samples: np.ndarray, rate: int, fmt: str, subtype: str = None) -> bytes:
    buffer = io.BytesIO()
    sf.write(buffer, samples, rate, format=fmt, subtype=subtype)
    return buffer.getvalue()


class Builder:
    def __init__(self, folder: Path):
        self.folder, self.cases = folder, []
        self.rng = np.random.default_rng(20241116)

    def bytes(self, name: str, data: bytes, kind: str, problem: str = "") -> None:
        (self.folder / name).write_bytes(data)
        self.cases.append(Case(name, kind, problem))

    def make(self, name: str, create: Callable[[Path], None], kind: str, problem: str = "") -> None:
        create(self.folder / name)
        self.cases.append(Case(name, kind, problem))

    def random(self, n: int) -> bytes:
        return self.rng.integers(0, 256, n, dtype=np.uint8).tobytes()


def build(folder: Path) -> List[Case]:
    folder.mkdir(parents=True, exist_ok=True)
    b = Builder(folder)
    voice = speech()
    valid = {  # one good file of each container soundfile reads, all of the same speech
        "wav": encoded(voice, RATE, "WAV", "PCM_16"),
        "flac": encoded(voice, RATE, "FLAC", "PCM_16"),
        "ogg": encoded(voice, RATE, "OGG", "VORBIS"),
        "mp3": encoded(voice, RATE, "MP3", "MPEG_LAYER_III"),
    }

    # -- good files of every kind: containers, sample formats, rates, channels, names
    for ext, data in valid.items():
        b.bytes(f"good_{ext}.{ext}", data, "good")
    b.bytes("good_opus.ogg", encoded(voice, RATE, "OGG", "OPUS"), "good")
    b.bytes("-starts with a dash.flac", valid["flac"], "good")
    for subtype in ("PCM_U8", "PCM_S8", "PCM_24", "PCM_32", "FLOAT", "DOUBLE", "ULAW", "ALAW", "IMA_ADPCM",
                    "MS_ADPCM", "GSM610"):
        fmt = "AIFF" if subtype == "PCM_S8" else "WAV"
        rate = 8000 if subtype == "GSM610" else RATE
        b.bytes(f"subtype_{subtype.lower()}.{fmt.lower()}", encoded(speech(rate), rate, fmt, subtype), "good")
    for subtype in ("PCM_S8", "PCM_24"):
        b.bytes(f"flac_{subtype.lower()}.flac", encoded(voice, RATE, "FLAC", subtype), "good")
    for fmt, ext in (("AIFF", "aiff"), ("AU", "au"), ("CAF", "caf"), ("W64", "w64"), ("RF64", "rf64"),
                     ("NIST", "nist"), ("IRCAM", "sf"), ("VOC", "voc")):
        b.bytes(f"container_{ext}.{ext}", encoded(voice, RATE, fmt, "PCM_16"), "good")
    for rate in (8000, 11025, 22050, 44100, 48000, 96000, 192000):
        b.bytes(f"rate_{rate}.flac" if rate <= 96000 else f"rate_{rate}.wav",
                encoded(speech(rate), rate, "FLAC" if rate <= 96000 else "WAV", "PCM_16"), "good")
    for channels in (2, 3, 6, 8):
        many = np.zeros((len(voice), channels), np.float32)
        many[:, 0] = voice  # speech in the first channel, the others silent
        b.bytes(f"channels_{channels}.wav", encoded(many, RATE, "WAV", "PCM_16"), "good")
    b.bytes("channels_8_all.flac", encoded(np.repeat(voice[:, None], 8, axis=1), RATE, "FLAC", "PCM_16"), "good")
    b.bytes("misnamed_flac_as.wav", valid["flac"], "good")
    b.bytes("misnamed_wav_as.mp3", valid["wav"], "good")
    b.bytes("no_extension", valid["flac"], "good")
    b.bytes("my talk – Ünïcödé 日本語.flac", valid["flac"], "good")
    b.bytes("UPPER CASE.WAV", valid["wav"], "good")
    b.bytes(os.fsdecode(b"latin1 caf\xe9.flac"), valid["flac"], "good")  # not UTF-8: a surrogate-escaped name
    b.bytes("line\nbreak.wav", b"", "bad", "empty")
    b.bytes("quiet.flac", encoded(voice * 0.01, RATE, "FLAC", "PCM_24"), "good")
    b.bytes("dc_offset.wav", encoded(np.full(RATE, 0.5, np.float32), RATE, "WAV", "FLOAT"), "good")
    b.bytes("full_scale_noise.wav",
            encoded(b.rng.uniform(-1, 1, RATE).astype(np.float32), RATE, "WAV", "FLOAT"), "good")
    b.bytes("int16_range_float.wav", encoded(voice * 32767, RATE, "WAV", "FLOAT"), "good")
    b.bytes("huge_values.wav", encoded(voice * 1e30, RATE, "WAV", "FLOAT"), "bad", "outside the range")
    for n in (1, 2, 10, 100):
        b.bytes(f"samples_{n}.wav", encoded(voice[1000:1000 + n] * 0 + 0.5, RATE, "WAV", "PCM_16"), "good")

    # -- empty, silent, not finite
    b.bytes("empty.wav", b"", "bad", "empty")
    b.bytes("empty_mp3.mp3", b"", "bad", "empty")
    for ext, fmt in (("wav", "WAV"), ("flac", "FLAC"), ("ogg", "OGG")):
        b.bytes(f"samples_0_{ext}.{ext}", encoded(np.zeros(0, np.float32), RATE, fmt), "bad",
                "empty" if ext == "flac" else "no audio")  # libFLAC writes no header for no samples
    b.bytes("silence_1s.wav", encoded(np.zeros(RATE, np.float32), RATE, "WAV", "PCM_16"), "bad", "silence")
    b.bytes("silence_1s_8ch.flac", encoded(np.zeros((RATE, 8), np.float32), RATE, "FLAC", "PCM_16"), "bad",
            "silence")
    b.make("silence_3h.flac", _three_hour_silence, "bad", "silence")
    for subtype in ("FLOAT", "DOUBLE"):
        for value, label in ((np.nan, "nan"), (np.inf, "inf"), (-np.inf, "neginf")):
            samples = voice.copy()
            samples[len(samples) // 2] = value
            b.bytes(f"{label}_{subtype.lower()}.wav", encoded(samples, RATE, "WAV", subtype), "bad", "nan or infinite")
    all_nan = np.full(RATE, np.nan, np.float32)
    b.bytes("all_nan.wav", encoded(all_nan, RATE, "WAV", "FLOAT"), "bad", "nan or infinite")

    # -- truncated files: every container cut at many lengths, header included
    for ext, data in valid.items():
        for cut in (1, 2, 3, 4, 8, 11, 12, 16, 20, 24, 36, 40, 43, 44, 64, 100, 300, 1000):
            if cut < len(data):
                kind, problem = ("bad", "") if cut <= 44 or ext == "ogg" else ("either", "")
                b.bytes(f"truncated_{ext}_{cut}.{ext}", data[:cut], "either" if cut > 44 else kind, problem)
        b.bytes(f"truncated_{ext}_half.{ext}", data[: len(data) // 2], "either")
        b.bytes(f"truncated_{ext}_minus_1.{ext}", data[:-1], "either")

    # -- random bytes behind valid magic numbers, and random bytes alone
    magics = {"wav": b"RIFF\x24\x00\x01\x00WAVEfmt ", "flac": b"fLaC", "ogg": b"OggS\x00\x02",
              "mp3": b"ID3\x04\x00\x00\x00\x00\x00\x00", "mp3sync": b"\xff\xfb\x90\x64", "aiff": b"FORM\x00\x00\x10\x00AIFF",
              "m4a": b"\x00\x00\x00\x20ftypM4A ", "webm": b"\x1a\x45\xdf\xa3"}
    for label, magic in magics.items():
        ext = "mp3" if label.startswith("mp3") else label
        for size in (0, 7, 100, 4096):
            b.bytes(f"magic_{label}_{size}.{ext}", magic + b.random(size), "either" if label == "mp3sync" else "bad")
    for size in (1, 10, 1000, 100000):
        b.bytes(f"random_{size}.wav", b.random(size), "bad")
    b.bytes("random_mp3_100000.mp3", b.random(100000), "either")  # an MP3 decoder may find frames in noise

    # -- damaged headers of a valid WAV: every field of the 44-byte header set to odd values
    wav = valid["wav"]
    for offset, label in ((22, "channels"), (24, "rate"), (34, "bits"), (20, "format")):
        for value in (0, 1, 0xFFFF):
            size = 4 if label == "rate" else 2
            patched = wav[:offset] + value.to_bytes(size, "little") + wav[offset + size:]
            b.bytes(f"header_{label}_{value}.wav", patched, "either")
    for value in (0, 8, 0xFFFFFFFF):
        b.bytes(f"header_datasize_{value}.wav", wav[:40] + struct.pack("<I", value) + wav[44:], "either")
        b.bytes(f"header_riffsize_{value}.wav", wav[:4] + struct.pack("<I", value) + wav[8:], "either")

    # -- bit rot inside the audio data of every container
    for ext, data in valid.items():
        for seed in range(4):
            rot = bytearray(data)
            rng = np.random.default_rng(seed)
            for i in rng.integers(len(data) // 4, len(data), 40):
                rot[i] = int(rng.integers(0, 256))
            b.bytes(f"bitrot_{ext}_{seed}.{ext}", bytes(rot), "either")

    # -- not audio at all
    b.bytes("notes.mp3", b"Meeting notes\nbring the slides\n" * 40, "bad", "it holds text")
    b.bytes("page.mp3", b"<!DOCTYPE html><html><body>404 Not Found</body></html>\n", "bad")
    b.bytes("image.png.wav", b"\x89PNG\r\n\x1a\n" + b.random(2000), "bad")
    b.bytes("archive.zip.flac", b"PK\x03\x04" + b.random(2000), "bad")
    b.bytes("document.pdf.ogg", b"%PDF-1.7\n" + b.random(2000), "bad")
    b.bytes("zeros_4k.wav", bytes(4096), "bad")
    b.bytes("utf16_text.wav", "hello".encode("utf-16"), "bad")

    # -- things that are not regular files, and files the user may not read
    b.make("folder.wav", lambda p: p.mkdir(), "bad", "directory")
    b.make("fifo.wav", lambda p: os.mkfifo(p), "bad", "not a regular file")
    b.make("broken_link.wav", lambda p: p.symlink_to(folder / "does_not_exist.wav"), "bad",
           "broken symbolic link")
    b.make("link_loop.wav", lambda p: p.symlink_to(p), "bad", "")
    b.make("good_link.flac", lambda p: p.symlink_to(folder / "good_flac.flac"), "good")
    b.make("unreadable.flac", lambda p: (p.write_bytes(valid["flac"]), p.chmod(0)), "bad", "permission")
    b.make("unreadable space é.wav", lambda p: (p.write_bytes(valid["wav"]), p.chmod(stat.S_IWUSR)), "bad",
           "permission")
    b.cases.append(Case("missing.wav", "bad", "no such file"))
    b.cases.append(Case("missing dir/missing ü.flac", "bad", "no such file"))
    return b.cases


def _three_hour_silence(path: Path) -> None:
    """Three hours of digital silence, written block by block (a few hundred kB as FLAC)."""
    block = np.zeros(RATE * 600, np.int16)
    with sf.SoundFile(path, "w", samplerate=RATE, channels=1, format="FLAC", subtype="PCM_16") as f:
        for _ in range(18):
            f.write(block)


if __name__ == "__main__":
    cases = build(Path(sys.argv[1]))
    print(f"{len(cases)} cases: " + ", ".join(f"{k} {sum(c.kind == k for c in cases)}" for k in ("good", "bad", "either")))
