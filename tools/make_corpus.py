#!/usr/bin/env python
"""Synthesise an English speech corpus for head training and evaluation, from text on this machine.

No speech dataset can be downloaded here, so speech is made: text from Debian's ``fortunes``
package (a public collection of quotations, jokes, poems and sayings; /usr/share/games/fortunes)
is read aloud by three engines with many voices:

- espeak-ng: several English accents x voice variants (m1..m8, f1..f5, ...), rate and pitch varied;
- flite: kal, kal16, awb, rms, slt, duration stretch and pitch varied;
- festival: kal_diphone, ked_diphone, cmu_us_slt_arctic_hts, duration stretch varied.
(mbrola voices are not packaged for this Debian release, so they are left out.)

About a third of the utterances get white or pink noise at 15-35 dB SNR. Everything is resampled
to 16 kHz mono FLAC by sox.

The held-out split shares neither text nor voices with training: whole fortune files are held out
(text) and a set of voices per engine is held out; both are asserted disjoint.

    python tools/make_corpus.py --out data/corpus                       # 240 + 25 minutes
    python tools/make_corpus.py --out /tmp/c --train-minutes 2 --heldout-minutes 1

Writes DIR/train.csv and DIR/heldout.csv (audio, sentence, language, engine, voice, seconds; audio
paths relative to DIR) and the audio under DIR/train/ and DIR/heldout/. Deterministic for a seed;
re-running skips utterances whose file exists.

Install the engines on Debian/Ubuntu with:
    apt-get install espeak-ng flite festival festvox-kallpc16k festvox-kdlpc16k festvox-us-slt-hts sox
"""

from __future__ import annotations

import argparse
import csv
import os
import random
import re
import shutil
import subprocess
import sys
import tempfile
import time
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Dict, List, Optional, Sequence, Tuple

from tqdm import tqdm

FORTUNES = Path("/usr/share/games/fortunes")
# fortune files whose text is held out (never trained on)
HELDOUT_TEXT = ("wisdom", "science", "literature", "people", "work", "food", "pets")
SKIP_TEXT = ("art", "ascii-art", "translate-me", "startrek", "perl", "debian", "linux", "linuxcookie",
             "computers", "zippy", "knghtbrd", "drugs", "ethnic", "men-women")

ESPEAK_ACCENTS = ("en-us", "en-gb", "en-gb-scotland", "en-gb-x-rp", "en-029", "en-gb-x-gbclan",
                  "en-gb-x-gbcwmd", "en-us-nyc")
ESPEAK_VARIANTS = ("m1", "m2", "m3", "m4", "m5", "m6", "m7", "m8", "f1", "f2", "f3", "f4", "f5",
                   "klatt", "klatt2", "klatt3", "croak", "grandpa")
FLITE_VOICES = ("kal", "kal16", "awb", "rms", "slt")
FESTIVAL_VOICES = ("kal_diphone", "ked_diphone", "cmu_us_slt_arctic_hts")

HELDOUT_VOICES = {
    "espeak-ng": {f"{a}+{v}" for a, v in [("en-gb-scotland", "f3"), ("en-us", "m5"), ("en-029", "f2"),
                                          ("en-gb-x-rp", "klatt2"), ("en-us-nyc", "m2"), ("en-gb", "f5")]},
    # flite's slt and festival's slt_arctic_hts are one speaker (CMU ARCTIC SLT), held out together;
    # flite's kal and festival's kal_diphone are one speaker too, both in training
    "flite": {"slt", "rms"},
    "festival": {"ked_diphone", "cmu_us_slt_arctic_hts"},
}
ENGINE_WEIGHTS = (("espeak-ng", 0.5), ("flite", 0.3), ("festival", 0.2))
REQUIRED = {"espeak-ng": "espeak-ng", "flite": "flite", "text2wave": "festival", "sox": "sox"}


@dataclass(frozen=True)
class Job:
    path: str
    text: str
    engine: str
    voice: str
    rate: float  # 1.0 = the engine's default speed
    pitch: int  # espeak-ng pitch 0-99 / flite f0 mean in Hz; unused by festival
    noise_db: Optional[float]  # SNR of added noise, or None
    noise_kind: str


# -- text -------------------------------------------------------------------------------------------

def _clean(text: str) -> Optional[str]:
    text = text.replace("\n", " ").replace("\t", " ")
    text = re.sub(r"\s+", " ", text).strip()
    # quotation marks are not spoken, and fortunes often leave them unbalanced across sentences
    text = text.replace("``", "").replace("''", "").replace('"', "").strip()
    if not re.fullmatch(r"[A-Za-z ,.;:'!?\"()-]+", text):
        return None  # digits, URLs, code, odd symbols: a synthesiser would read them unpredictably
    if re.search(r"\b[A-Z]{3,}\b", text) or "--" in text or "(" in text:
        return None
    words = text.split()
    if not 3 <= len(words) <= 45:
        return None
    return text


def read_fortunes(name: str) -> List[str]:
    """Sentences of one fortune file, attributions dropped, cleaned."""
    raw = (FORTUNES / name).read_text(encoding="utf-8", errors="ignore")
    sentences = []
    for entry in raw.split("\n%\n"):
        lines = [ln for ln in entry.splitlines() if not re.match(r"^\s*(--|-- |\t\t--)", ln)]
        body = re.sub(r"\s+", " ", " ".join(lines)).strip()
        for sentence in re.split(r"(?<=[.!?])\s+(?=[A-Z\"])", body):
            cleaned = _clean(sentence)
            if cleaned:
                sentences.append(cleaned)
    return sentences


def text_pool(split: str) -> List[str]:
    names = sorted(p.name for p in FORTUNES.iterdir() if p.is_file() and "." not in p.name
                   and p.name not in SKIP_TEXT)
    chosen = [n for n in names if (n in HELDOUT_TEXT) == (split == "heldout")]
    # a saying in several files belongs to the held-out split only
    seen = set() if split == "heldout" else {s.lower() for s in text_pool("heldout")}
    pool = []
    for name in chosen:
        for s in read_fortunes(name):
            if s.lower() not in seen:
                seen.add(s.lower())
                pool.append(s)
    return pool


def utterance_texts(pool: Sequence[str], rng: random.Random) -> List[str]:
    """Groups of 1-3 consecutive sentences, each sentence used once; shuffled."""
    texts, i = [], 0
    while i < len(pool):
        n = rng.choice((1, 1, 1, 2, 2, 3))
        texts.append(" ".join(pool[i : i + n]))
        i += n
    rng.shuffle(texts)
    return texts


# -- voices -----------------------------------------------------------------------------------------

def all_voices() -> Dict[str, List[str]]:
    return {"espeak-ng": [f"{a}+{v}" for a in ESPEAK_ACCENTS for v in ESPEAK_VARIANTS],
            "flite": list(FLITE_VOICES), "festival": list(FESTIVAL_VOICES)}


def split_voices(split: str) -> Dict[str, List[str]]:
    out = {}
    for engine, voices in all_voices().items():
        held = HELDOUT_VOICES[engine]
        out[engine] = [v for v in voices if (v in held) == (split == "heldout")]
    return out


def make_job(text: str, path: Path, voices: Dict[str, List[str]], rng: random.Random) -> Job:
    engine = rng.choices([e for e, _ in ENGINE_WEIGHTS], [w for _, w in ENGINE_WEIGHTS])[0]
    voice = rng.choice(voices[engine])
    noisy = rng.random() < 0.33
    return Job(str(path), text, engine, voice, rate=rng.uniform(0.8, 1.25),
               pitch=rng.randint(25, 75) if engine == "espeak-ng" else rng.randint(90, 180),
               noise_db=rng.uniform(15, 35) if noisy else None, noise_kind=rng.choice(("whitenoise", "pinknoise")))


# -- synthesis --------------------------------------------------------------------------------------

def _run(cmd: List[str], stdin: Optional[str] = None) -> None:
    subprocess.run(cmd, input=stdin, text=True, check=True, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)


def synthesise(job: Job) -> Tuple[Job, Optional[float], str]:
    """Render one utterance; returns (job, seconds or None on failure, error message)."""
    out = Path(job.path)
    if out.exists() and out.stat().st_size > 0:
        return job, _seconds(out), ""
    with tempfile.TemporaryDirectory() as tmp:
        raw = Path(tmp) / "raw.wav"
        try:
            if job.engine == "espeak-ng":
                _run(["espeak-ng", "-v", job.voice, "-s", str(int(165 * job.rate)), "-p", str(job.pitch),
                      "-w", str(raw), job.text])
            elif job.engine == "flite":
                _run(["flite", "-voice", job.voice, "--setf", f"duration_stretch={1 / job.rate:.3f}",
                      "--setf", f"int_f0_target_mean={job.pitch}", "-t", job.text, "-o", str(raw)])
            else:
                _run(["text2wave", "-eval", f"(voice_{job.voice})", "-eval",
                      f"(Parameter.set 'Duration_Stretch {1 / job.rate:.3f})", "-o", str(raw)], stdin=job.text)
            clean = Path(tmp) / "clean.wav"
            _run(["sox", str(raw), "-r", "16000", "-c", "1", "-b", "16", str(clean), "norm", "-3"])
            out.parent.mkdir(parents=True, exist_ok=True)
            partial = out.with_suffix(".part.flac")
            if job.noise_db is None:
                _run(["sox", str(clean), str(partial)])
            else:
                noise = Path(tmp) / "noise.wav"
                seconds = _seconds(clean)
                # noise level: the speech is normalised to -3 dBFS peak; its RMS is ~15 dB lower
                level = 10 ** ((-3 - 15 - job.noise_db) / 20)
                _run(["sox", "-n", "-r", "16000", "-c", "1", "-b", "16", str(noise), "synth", f"{seconds:.3f}",
                      job.noise_kind, "vol", f"{level:.6f}"])
                _run(["sox", "-m", str(clean), str(noise), str(partial)])
            os.replace(partial, out)
        except subprocess.CalledProcessError as e:
            return job, None, (e.stderr or "").strip().splitlines()[-1:] and (e.stderr or "").strip().splitlines()[-1] or str(e)
    return job, _seconds(out), ""


def _seconds(path: Path) -> float:
    import soundfile as sf

    return sf.info(str(path)).duration


# -- the corpus -------------------------------------------------------------------------------------

def plan(split: str, minutes: float, out: Path, seed: int) -> List[Job]:
    """Enough jobs for about ``minutes`` of audio (at ~2.6 words per second)."""
    rng = random.Random(f"{seed}-{split}")
    voices = split_voices(split)
    texts = utterance_texts(text_pool(split), rng)
    jobs, words = [], 0.0
    budget = minutes * 60 * 2.6
    for i, text in enumerate(texts):
        if words >= budget:
            break
        jobs.append(make_job(text, out / split / f"{split}_{i:06d}.flac", voices, rng))
        words += len(text.split())
    if words < budget:
        print(f"note: {split}: text for only ~{words / 2.6 / 60:.0f} of {minutes:.0f} minutes", file=sys.stderr)
    return jobs


def write_csv(path: Path, rows: List[Tuple[Job, float]], root: Path) -> None:
    tmp = path.with_suffix(".csv.tmp")
    with tmp.open("w", newline="", encoding="utf-8") as f:
        writer = csv.writer(f)
        writer.writerow(["audio", "sentence", "language", "engine", "voice", "seconds"])
        for job, seconds in rows:
            writer.writerow([os.path.relpath(job.path, root), job.text, "en", job.engine, job.voice, f"{seconds:.2f}"])
    os.replace(tmp, path)


def build(split: str, minutes: float, out: Path, seed: int, jobs: int) -> Dict:
    planned = plan(split, minutes, out, seed)
    done: List[Tuple[Job, float]] = []
    failures = 0
    began = time.perf_counter()
    with ProcessPoolExecutor(max_workers=jobs) as pool:
        for i, (job, seconds, error) in enumerate(tqdm(pool.map(synthesise, planned, chunksize=4), total=len(planned),
                                                       desc=f"synthesise {split}", unit="utt")):
            if seconds is None:
                failures += 1
                tqdm.write(f"skipped {job.engine}/{job.voice}: {error}")
            else:
                done.append((job, seconds))
            if i % 500 == 499:
                write_csv(out / f"{split}.csv", done, out)  # a partial corpus is usable meanwhile
    write_csv(out / f"{split}.csv", done, out)
    per_engine: Dict[str, int] = {}
    for job, _ in done:
        per_engine[job.engine] = per_engine.get(job.engine, 0) + 1
    return dict(split=split, utterances=len(done), failed=failures,
                minutes=round(sum(s for _, s in done) / 60, 1), per_engine=per_engine,
                voices=len({(j.engine, j.voice) for j, _ in done}), wall_seconds=round(time.perf_counter() - began, 1))


def check_disjoint() -> None:
    train_text, held_text = set(text_pool("train")), set(text_pool("heldout"))
    assert not train_text & held_text, "a sentence is in both splits"
    for engine in all_voices():
        assert not set(split_voices("train")[engine]) & set(split_voices("heldout")[engine]), engine


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", type=Path, default=Path("data/corpus"))
    parser.add_argument("--train-minutes", type=float, default=240)
    parser.add_argument("--heldout-minutes", type=float, default=25)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--jobs", type=int, default=2)
    parser.add_argument("--only", choices=("train", "heldout"), default=None)
    args = parser.parse_args()

    missing = [f"{tool} (apt-get install {pkg})" for tool, pkg in REQUIRED.items() if shutil.which(tool) is None]
    if missing or not FORTUNES.is_dir():
        if not FORTUNES.is_dir():
            missing.append(f"{FORTUNES} (apt-get install fortunes)")
        sys.exit(f"make_corpus: error: missing {', '.join(missing)}")
    check_disjoint()
    args.out.mkdir(parents=True, exist_ok=True)
    splits = [("heldout", args.heldout_minutes), ("train", args.train_minutes)]
    for split, minutes in splits:
        if args.only in (None, split):
            print(build(split, minutes, args.out, args.seed, args.jobs))


if __name__ == "__main__":
    main()
