"""Build one long recording from short clips, with pauses, for long-form tests and measurements.

Clips are drawn in a seeded random order (each used before any repeats) and joined by pauses of
0.2-3 s; every ``--long-pause-every`` clips a silence of ``--long-pause`` seconds is inserted, so
that some 30-s windows hold no speech at all (whisper's no-speech path). A little noise is added
to the silences, as a real room would have. Writes OUT (FLAC, 16 kHz mono) and OUT.txt, the
clips' sentences in order when a CSV with a ``sentence`` column is given.

``--repeat N`` says every clip N times in a row (short pauses between): the text is then very
compressible, so whisper's compression-ratio rule rejects greedy windows and the temperature
fallback fires, as it does on repetitive speech, chants or looping music.

    python -m tools.data long --csv data/real/real.csv --minutes 10 --out data/long/real_10min.flac
    python -m tools.data long tests/data/*.flac --minutes 5 --out /tmp/long.flac
    python -m tools.data long --csv data/real/real.csv --minutes 3 --repeat 3 --out data/long/real_repeated_3min.flac
"""

from __future__ import annotations

import argparse
import csv
import sys
from pathlib import Path
from typing import List, Optional, Sequence, Tuple

import numpy as np
import soundfile as sf

from medusa_whisper.audio.files import SAMPLE_RATE, load_audio


def read_clips(files: Sequence[Path], csv_path: Optional[Path]) -> List[Tuple[Path, str]]:
    clips = [(Path(f), "") for f in files]
    if csv_path is not None:
        with open(csv_path, newline="", encoding="utf-8") as f:
            for row in csv.DictReader(f):
                clips.append((csv_path.parent / row["audio"], row.get("sentence", "")))
    return clips


def build(clips: Sequence[Tuple[Path, str]], minutes: float, seed: int = 0, long_pause: float = 40.0,
          long_pause_every: int = 25, noise_db: float = -60.0, repeat: int = 1) -> Tuple[np.ndarray, List[str]]:
    """Samples (float32, 16 kHz) of at least ``minutes`` minutes, and the sentences in order."""
    rng = np.random.default_rng(seed)
    target = int(minutes * 60 * SAMPLE_RATE)
    pieces, sentences, total, used = [], [], 0, 0
    noise_amplitude = 10 ** (noise_db / 20)

    def silence(seconds: float) -> np.ndarray:
        return (rng.standard_normal(int(seconds * SAMPLE_RATE)) * noise_amplitude).astype(np.float32)

    while total < target:
        for index in rng.permutation(len(clips)):
            path, sentence = clips[index]
            samples = load_audio(path)
            peak = float(np.abs(samples).max())
            for _ in range(repeat):
                pieces += [samples * (0.5 / peak if peak > 0 else 1.0), silence(rng.uniform(0.2, 3.0))]
                sentences.append(sentence)
            used += 1
            if long_pause_every and used % long_pause_every == 0:
                pieces.append(silence(long_pause))
            total = sum(len(p) for p in pieces)
            if total >= target:
                break
    return np.concatenate(pieces).astype(np.float32), sentences


def main(argv: Optional[Sequence[str]] = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("files", nargs="*", type=Path, help="audio clips")
    parser.add_argument("--csv", type=Path, default=None, help="a CSV with columns audio (relative to it) and sentence")
    parser.add_argument("--minutes", type=float, required=True)
    parser.add_argument("--out", type=Path, required=True, help="FLAC file to write")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--long-pause", type=float, default=40.0, metavar="SECONDS")
    parser.add_argument("--long-pause-every", type=int, default=25, metavar="CLIPS")
    parser.add_argument("--repeat", type=int, default=1, metavar="N", help="say every clip N times in a row")
    args = parser.parse_args(argv)
    clips = read_clips(args.files, args.csv)
    if not clips:
        parser.error("give audio files or --csv")
    if args.repeat < 1:
        parser.error("--repeat must be at least 1")
    samples, sentences = build(clips, args.minutes, args.seed, args.long_pause, args.long_pause_every,
                               repeat=args.repeat)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    sf.write(args.out, samples, SAMPLE_RATE, subtype="PCM_16")
    if any(sentences):
        args.out.with_suffix(".txt").write_text("\n".join(sentences) + "\n", encoding="utf-8")
    print(f"wrote {args.out}: {len(samples) / SAMPLE_RATE / 60:.1f} min from {len(sentences)} clips")
    return 0


if __name__ == "__main__":
    sys.exit(main())
