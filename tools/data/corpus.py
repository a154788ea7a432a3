"""Synthesise an English speech corpus for Medusa-head training and evaluation.

No speech dataset can be downloaded here, so speech is made from freely licensed text that
Debian ships, read aloud by three engines with many voices:

Text (each split gets whole documents, never shared sentences):
- Debian ``fortunes`` (/usr/share/games/fortunes; BSD-licensed collection of quotations, jokes,
  poems and sayings in modern English): about 80 % of the words. Topic files that are mostly
  code, ASCII art, offensive or non-English are skipped.
- The King James Bible (``bible`` from Debian bible-kjv / bible-kjv-text; public domain, 1611):
  the rest, so the modern text dominates. ``LORD``/``GOD`` are written ``Lord``/``God``.
Sentences are cleaned (ASCII letters and ordinary punctuation only; none with digits, URLs,
ALL-CAPS words or odd symbols; 3 to 45 words) and grouped 1 to 3 consecutive sentences of one
document per utterance, at most 36 words, so utterances run from about 1 s to about 15 s.

Voices (rate and pitch drawn per utterance):
- espeak-ng: English accents (en-us, en-gb, en-gb-scotland, en-gb-x-rp, en-gb-x-gbclan, en-us-nyc)
  x voice variants (m1..m8, f1..f5, klatt, klatt2, klatt3, croak, grandpa); ``-s`` and ``-p``.
  en-029 and en-gb-x-gbcwmd are left out: whisper tiny.en cannot mostly transcribe them.
- flite: kal, kal16, awb, rms, slt; ``duration_stretch`` and ``int_f0_target_mean``.
- festival (text2wave): kal_diphone, ked_diphone, cmu_us_slt_arctic_hts; ``Duration_Stretch``
  and a sox ``pitch`` shift.
mbrola voices (espeak-ng's mb-*) are not packaged in this Debian release, so they are not used.
About a third of the utterances get white, pink or brown noise at 15-35 dB SNR (measured
against the active speech). Everything is 16 kHz mono 16-bit FLAC, resampled by sox.

The held-out split shares neither text nor voices with training: whole fortune files and Bible
books are held out, and so are some voices of every engine (flite's slt and festival's
slt_arctic_hts are one speaker, held out together). Both are asserted disjoint.

    python -m tools.data corpus --out data/corpus               # 240 + 25 minutes, ~15 min on 2 cores
    python -m tools.data corpus --out /tmp/c --train-minutes 2 --heldout-minutes 1

Writes DIR/train.csv and DIR/heldout.csv (audio, sentence, language, engine, voice, seconds;
audio paths relative to DIR) and the audio under DIR/train/ and DIR/heldout/. A split holds the
shortest prefix of its seeded plan that reaches the requested minutes, so the corpus is
deterministic for a seed and a bigger run extends a smaller one. Re-running skips utterances
whose FLAC exists and reads as 16 kHz mono (file names carry a hash of what they say and how,
so a changed plan never reuses stale audio); the CSVs are rewritten atomically every few
hundred utterances and at the end.

Needs (Debian/Ubuntu): apt-get install espeak-ng flite festival festvox-kallpc16k
festvox-kdlpc16k festvox-us-slt-hts sox fortunes bible-kjv
"""

from __future__ import annotations

import argparse
import collections
import csv
import hashlib
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
from typing import Dict, Iterator, List, Optional, Sequence, Tuple

import numpy as np
import soundfile as sf
from tqdm import tqdm

SAMPLE_RATE = 16000
COLUMNS = ["audio", "sentence", "language", "engine", "voice", "seconds"]
SPLITS = ("train", "heldout")

# -- text sources -----------------------------------------------------------------------------------

FORTUNES = Path("/usr/share/games/fortunes")
# whole fortune files held out (never trained on)
HELDOUT_FORTUNES = ("wisdom", "science", "literature", "people", "work", "food", "pets")
# mostly code, ASCII art, Debian/Linux jargon, non-English, or material unfit to read aloud
SKIP_FORTUNES = ("art", "ascii-art", "translate-me", "startrek", "perl", "debian", "linux",
                 "linuxcookie", "computers", "zippy", "knghtbrd", "drugs", "ethnic", "men-women")
# whole Bible books held out (abbreviations as the `bible` program prints them)
HELDOUT_BOOKS = ("Ruth", "Est", "Jonah", "Mark", "Jas", "1Jn")
# share of each split's words taken from the Bible; fortunes (modern English) are the rest
BIBLE_SHARE = 0.2

MIN_WORDS, MAX_SENTENCE_WORDS, MAX_UTTERANCE_WORDS = 3, 45, 36
MAX_SECONDS = 20.0  # a very slow voice on a long utterance; such outputs are dropped


def clean_sentence(text: str) -> Optional[str]:
    """The sentence as a person would write it, or None when a synthesiser would misread it."""
    text = re.sub(r"\s+", " ", text).strip()
    # quotation marks are not spoken, and fortunes often leave them unbalanced across sentences
    text = text.replace("``", "").replace("''", "").replace('"', "").strip()
    if not re.fullmatch(r"[A-Za-z][A-Za-z ,.;:'!?-]*", text):
        return None  # digits, URLs, code, brackets, odd symbols
    if re.search(r"\b[A-Z]{2,}\b", text) or "--" in text or re.search(r"[a-z][.][a-z]", text):
        return None  # ALL-CAPS (acronyms are spelt out unpredictably), dashes, dotted names
    if not MIN_WORDS <= len(text.split()) <= MAX_SENTENCE_WORDS:
        return None
    return text


def split_sentences(body: str) -> List[str]:
    body = re.sub(r"\s+", " ", body).strip()
    parts = re.split(r"(?<=[.!?])\s+(?=[A-Z\"'])", body)
    return [s for s in (clean_sentence(p) for p in parts) if s]


def fortune_documents() -> Dict[str, List[str]]:
    """Sentences of each usable fortune file, attributions dropped."""
    docs = {}
    for path in sorted(FORTUNES.iterdir()):
        if not path.is_file() or "." in path.name or path.name in SKIP_FORTUNES:
            continue
        sentences = []
        for entry in path.read_text(encoding="utf-8", errors="ignore").split("\n%\n"):
            # attribution lines ("-- Mark Twain") are not part of what is read
            lines = [ln for ln in entry.splitlines() if not re.match(r"^\s*--", ln)]
            sentences += split_sentences(" ".join(lines))
        docs[path.name] = sentences
    return docs


def bible_documents() -> Dict[str, List[str]]:
    """Sentences of each book of the King James Bible, from Debian's `bible` program."""
    out = subprocess.run(["bible", "-f", "Gen1:1-Rev22:21"], capture_output=True, text=True, check=True).stdout
    books: Dict[str, List[str]] = collections.defaultdict(list)
    chapter_text: Dict[Tuple[str, str], List[str]] = collections.defaultdict(list)
    for line in out.splitlines():
        m = re.match(r"^(\d?[A-Za-z]+)(\d+):\d+ (.*)$", line)
        if m:
            chapter_text[(m.group(1), m.group(2))].append(m.group(3))
    for (book, _), verses in chapter_text.items():
        text = re.sub(r"\b(LORD|GOD)\b", lambda w: w.group(1).title(), " ".join(verses))
        books[book] += split_sentences(text)
    return dict(books)


@dataclass(frozen=True)
class Utterance:
    source: str  # fortunes / kjv
    doc: str
    text: str


def group_sentences(source: str, doc: str, sentences: Sequence[str], rng: random.Random) -> List[Utterance]:
    """Runs of 1-3 consecutive sentences of one document, at most MAX_UTTERANCE_WORDS words."""
    out, i = [], 0
    while i < len(sentences):
        want = rng.choice((1, 1, 1, 2, 2, 3))
        group = [sentences[i]]
        while len(group) < want and i + len(group) < len(sentences):
            nxt = sentences[i + len(group)]
            if sum(len(s.split()) for s in group) + len(nxt.split()) > MAX_UTTERANCE_WORDS:
                break
            group.append(nxt)
        i += len(group)
        if len(" ".join(group).split()) <= MAX_UTTERANCE_WORDS:
            out.append(Utterance(source, doc, " ".join(group)))
    return out


def split_documents() -> Dict[str, Dict[Tuple[str, str], List[str]]]:
    """(source, document) -> sentences for each split; a sentence of the held-out split never
    appears in training (fortune files repeat some sayings)."""
    docs = {("fortunes", k): v for k, v in fortune_documents().items()}
    docs.update({("kjv", k): v for k, v in bible_documents().items()})
    held_names = set(HELDOUT_FORTUNES) | set(HELDOUT_BOOKS)
    split = {s: {k: v for k, v in docs.items() if (k[1] in held_names) == (s == "heldout")} for s in SPLITS}
    held_sentences = {s.lower() for v in split["heldout"].values() for s in v}
    split["train"] = {k: [s for s in v if s.lower() not in held_sentences] for k, v in split["train"].items()}
    return split


def utterance_pool(docs: Dict[Tuple[str, str], List[str]], rng: random.Random) -> List[Utterance]:
    """All fortune utterances plus enough Bible ones for BIBLE_SHARE of the words, shuffled."""
    by_source: Dict[str, List[Utterance]] = collections.defaultdict(list)
    for (source, doc), sentences in sorted(docs.items()):
        by_source[source] += group_sentences(source, doc, sentences, rng)
    fortune_words = sum(len(u.text.split()) for u in by_source["fortunes"])
    bible = list(by_source["kjv"])
    rng.shuffle(bible)
    want, taken, words = fortune_words * BIBLE_SHARE / (1 - BIBLE_SHARE), [], 0
    for u in bible:
        if words >= want:
            break
        taken.append(u)
        words += len(u.text.split())
    pool = by_source["fortunes"] + taken
    rng.shuffle(pool)
    return pool


# -- voices -----------------------------------------------------------------------------------------

ESPEAK_ACCENTS = ("en-us", "en-gb", "en-gb-scotland", "en-gb-x-rp", "en-gb-x-gbclan", "en-us-nyc")
# Dropped: whisper tiny.en could not mostly transcribe them (median WER 55 % for en-029, 63 % for
# en-gb-x-gbcwmd over 36 utterances each, against 22-40 % for the other accents), so their audio
# would teach the heads the base model's confusions rather than its ordinary decoding.
DROPPED_ESPEAK_ACCENTS = ("en-029", "en-gb-x-gbcwmd")
ESPEAK_VARIANTS = ("m1", "m2", "m3", "m4", "m5", "m6", "m7", "m8", "f1", "f2", "f3", "f4", "f5",
                   "klatt", "klatt2", "klatt3", "croak", "grandpa")
FLITE_VOICES = ("kal", "kal16", "awb", "rms", "slt")
# flite's f0 target (Hz) per voice: each speaker's own register, so shifts stay natural
FLITE_F0 = {"kal": (85, 135), "kal16": (85, 135), "awb": (85, 135), "rms": (80, 130), "slt": (150, 210)}
FESTIVAL_VOICES = {  # voice -> the Debian package that ships it and its directory
    "kal_diphone": ("festvox-kallpc16k", "english/kal_diphone"),
    "ked_diphone": ("festvox-kdlpc16k", "english/ked_diphone"),
    "cmu_us_slt_arctic_hts": ("festvox-us-slt-hts", "us/cmu_us_slt_arctic_hts"),
}
FESTIVAL_VOICE_DIR = Path("/usr/share/festival/voices")

HELDOUT_VOICES = {
    "espeak-ng": {"en-gb-scotland+f3", "en-us+m5", "en-gb-x-rp+klatt2", "en-us-nyc+m2", "en-gb+f5"},
    # flite's slt and festival's slt_arctic_hts are one speaker (CMU ARCTIC SLT), held out together;
    # flite's kal and festival's kal_diphone are one speaker too, both in training
    "flite": {"slt", "rms"},
    "festival": {"ked_diphone", "cmu_us_slt_arctic_hts"},
}
ENGINE_WEIGHTS = {"espeak-ng": 0.5, "flite": 0.3, "festival": 0.2}


def all_voices() -> Dict[str, List[str]]:
    return {"espeak-ng": [f"{a}+{v}" for a in ESPEAK_ACCENTS for v in ESPEAK_VARIANTS],
            "flite": list(FLITE_VOICES), "festival": list(FESTIVAL_VOICES)}


def split_voices(split: str) -> Dict[str, List[str]]:
    return {e: [v for v in vs if (v in HELDOUT_VOICES[e]) == (split == "heldout")] for e, vs in all_voices().items()}


# -- the plan ---------------------------------------------------------------------------------------

@dataclass(frozen=True)
class Job:
    path: str  # absolute path of the FLAC
    text: str
    source: str
    engine: str
    voice: str
    rate: float  # 1.0 = the engine's default speed
    pitch: float  # espeak-ng -p (0-99), flite f0 mean (Hz), festival shift (cents)
    noise: str  # "", or white / pink / brown
    snr_db: float


def job_key(text: str, engine: str, voice: str, rate: float, pitch: float, noise: str, snr_db: float) -> str:
    spec = f"{text}|{engine}|{voice}|{rate:.3f}|{pitch:.1f}|{noise}|{snr_db:.1f}"
    return hashlib.sha1(spec.encode()).hexdigest()[:8]


def draw_voice_params(engine: str, voice: str, rng: random.Random) -> Tuple[float, float]:
    """(rate, pitch) for one utterance: rate 1.0 is the engine's default speed; pitch is espeak-ng's
    -p (0-99), flite's f0 mean (Hz, in the speaker's own register) or festival's shift (cents)."""
    rate = round(rng.uniform(0.8, 1.25), 3)
    if engine == "espeak-ng":
        return rate, float(rng.randint(30, 70))
    if engine == "flite":
        return rate, float(rng.randint(*FLITE_F0[voice]))
    return rate, float(rng.randint(-150, 150))


def plan_jobs(split: str, out: Path, seed: int, docs: Dict) -> Iterator[Job]:
    """The split's utterances in their fixed order; a corpus is a prefix of this sequence."""
    rng = random.Random(f"{seed}-{split}")
    voices = split_voices(split)
    engines = [e for e in ENGINE_WEIGHTS if voices[e]]
    for i, utt in enumerate(utterance_pool(docs, rng)):
        engine = rng.choices(engines, [ENGINE_WEIGHTS[e] for e in engines])[0]
        voice = rng.choice(voices[engine])
        rate, pitch = draw_voice_params(engine, voice, rng)
        noise = rng.choice(("white", "pink", "brown")) if rng.random() < 1 / 3 else ""
        snr_db = round(rng.uniform(15, 35), 1) if noise else 0.0
        key = job_key(utt.text, engine, voice, rate, pitch, noise, snr_db)
        path = out / split / f"{split}_{i:06d}_{key}.flac"
        yield Job(str(path), utt.text, utt.source, engine, voice, rate, pitch, noise, snr_db)


# -- synthesis --------------------------------------------------------------------------------------

def _run(cmd: List[str], stdin: Optional[str] = None) -> None:
    subprocess.run(cmd, input=stdin, text=True, check=True, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)


def render_raw(job: Job, tmp: Path) -> Path:
    """The engine's own output (any rate), text passed by stdin or file so it is never an option."""
    raw = tmp / "raw.wav"
    if job.engine == "espeak-ng":
        # 160 words per minute, a little under espeak-ng's default 175, which tiny.en finds hard
        _run(["espeak-ng", "-v", job.voice, "-s", str(round(160 * job.rate)), "-p", str(int(job.pitch)),
              "-w", str(raw), "--stdin"], stdin=job.text)
    elif job.engine == "flite":
        text = tmp / "text.txt"
        text.write_text(job.text + "\n")
        _run(["flite", "-voice", job.voice, "--setf", f"duration_stretch={1 / job.rate:.3f}",
              "--setf", f"int_f0_target_mean={job.pitch:.0f}", "-f", str(text), "-o", str(raw)])
    else:
        _run(["text2wave", "-eval", f"(voice_{job.voice})",
              "-eval", f"(Parameter.set 'Duration_Stretch {1 / job.rate:.3f})", "-o", str(raw)], stdin=job.text)
    return raw


def add_noise(speech: np.ndarray, kind: str, snr_db: float, seed: int) -> np.ndarray:
    """Speech plus coloured noise at snr_db against the speech's active (non-silent) part."""
    rng = np.random.default_rng(seed)
    n = len(speech)
    spectrum = np.fft.rfft(rng.standard_normal(n))
    freqs = np.fft.rfftfreq(n, 1 / SAMPLE_RATE)
    freqs[0] = freqs[1] if n > 1 else 1.0
    spectrum *= {"white": 1.0, "pink": freqs ** -0.5, "brown": 1 / freqs}[kind]
    noise = np.fft.irfft(spectrum, n)
    frames = speech[: n - n % 400].reshape(-1, 400)  # 25 ms frames
    power = (frames ** 2).mean(axis=1)
    active = power[power > power.max() * 1e-3]  # within 30 dB of the loudest frame
    speech_power = active.mean() if active.size else (speech ** 2).mean()
    noise *= np.sqrt(speech_power / 10 ** (snr_db / 10) / max((noise ** 2).mean(), 1e-12))
    mixed = speech + noise
    return mixed / max(1.0, np.abs(mixed).max() / 0.97)  # never clip


def is_valid(path: Path) -> bool:
    try:
        info = sf.info(str(path))
    except Exception:
        return False
    return info.samplerate == SAMPLE_RATE and info.channels == 1 and info.frames > 0


def render_clean(job: Job) -> np.ndarray:
    """The engine's reading of job.text as 16 kHz mono float64 samples peaking at -3 dB (festival's
    pitch shift applied); raises subprocess.CalledProcessError when a tool fails."""
    with tempfile.TemporaryDirectory() as tmp:
        raw = render_raw(job, Path(tmp))
        clean = Path(tmp) / "clean.wav"
        pitch = ["pitch", f"{job.pitch:.0f}"] if job.engine == "festival" and job.pitch else []
        _run(["sox", str(raw), "-c", "1", "-b", "16", str(clean), *pitch, "rate", str(SAMPLE_RATE), "norm", "-3"])
        audio, _ = sf.read(str(clean), dtype="float64")
    return audio


def command_error(e: subprocess.CalledProcessError) -> str:
    """One line saying why a tool failed: the last line it printed, or its exit status."""
    lines = (e.stderr or "").strip().splitlines() if isinstance(e.stderr, str) else []
    return lines[-1] if lines else f"{Path(e.cmd[0]).name} exited with {e.returncode}"


def synthesise(job: Job) -> Tuple[Job, Optional[float], str]:
    """Render one utterance to its FLAC; returns (job, seconds, "") or (job, None, why not)."""
    out = Path(job.path)
    if is_valid(out):
        return job, sf.info(str(out)).duration, ""
    out.parent.mkdir(parents=True, exist_ok=True)
    try:
        audio = render_clean(job)
    except subprocess.CalledProcessError as e:
        return job, None, command_error(e)
    seconds = len(audio) / SAMPLE_RATE
    if seconds < 0.3 or seconds > MAX_SECONDS:
        return job, None, f"{seconds:.1f} s of audio"
    if job.noise:
        audio = add_noise(audio, job.noise, job.snr_db, int(Path(job.path).stem.rsplit("_", 1)[1], 16))
    partial = out.with_name(out.stem + ".part.flac")
    sf.write(str(partial), audio, SAMPLE_RATE, subtype="PCM_16", format="FLAC")
    os.replace(partial, out)  # a file under its final name is always complete
    return job, seconds, ""


# -- the corpus -------------------------------------------------------------------------------------

def write_csv(path: Path, rows: Sequence[Tuple[Job, float]], root: Path) -> None:
    tmp = path.with_name(path.name + ".tmp")
    with tmp.open("w", newline="", encoding="utf-8") as f:
        writer = csv.writer(f)
        writer.writerow(COLUMNS)
        for job, seconds in rows:
            writer.writerow([Path(os.path.relpath(job.path, root)).as_posix(), job.text, "en", job.engine,
                             job.voice, f"{seconds:.2f}"])
    os.replace(tmp, path)


# assumed speaking rate for sizing batches; the real durations decide where the split ends
WORDS_PER_SECOND = 2.9


def build(split: str, minutes: float, out: Path, seed: int, workers: int, docs: Dict) -> List[Tuple[Job, float]]:
    """Synthesise the shortest prefix of the split's plan that holds `minutes` of audio."""
    planned = plan_jobs(split, out, seed, docs)
    target = minutes * 60
    done: List[Tuple[Job, float]] = []
    failures: collections.Counter = collections.Counter()
    total, exhausted = 0.0, False
    bar = tqdm(total=round(target / 60, 1), desc=f"{split} (minutes)", unit="min", dynamic_ncols=True)
    with ProcessPoolExecutor(max_workers=workers) as pool:
        while total < target and not exhausted:
            # a batch sized for what is still missing; batches stay short so the CSV is fresh
            batch, words = [], 0.0
            need_words = min((target - total) * WORDS_PER_SECOND * 1.02 + 20, 250 * 12)
            for job in planned:
                batch.append(job)
                words += len(job.text.split())
                if words >= need_words:
                    break
            else:
                exhausted = True
            for job, seconds, error in pool.map(synthesise, batch, chunksize=2):
                if seconds is None:
                    failures[(job.engine, job.voice, error)] += 1
                    continue
                if total >= target:
                    continue  # past the prefix; the file stays for a bigger run to reuse
                done.append((job, seconds))
                total += seconds
                bar.update(round(min(total, target) / 60, 1) - bar.n)
            write_csv(out / f"{split}.csv", done, out)  # a partial corpus is usable meanwhile
    bar.close()
    if exhausted and total < target:
        print(f"note: {split}: the text ran out at {total / 60:.1f} of {minutes:g} minutes", file=sys.stderr)
    for (engine, voice, error), count in sorted(failures.items()):
        print(f"note: {split}: {count} utterance(s) of {engine}/{voice} skipped: {error}", file=sys.stderr)
    return done


# -- checks and summary -----------------------------------------------------------------------------

def check_disjoint(docs: Dict[str, Dict]) -> None:
    """The splits share no document, no sentence and no voice."""
    assert not set(docs["train"]) & set(docs["heldout"]), "a document is in both splits"
    train_sentences = {s.lower() for v in docs["train"].values() for s in v}
    held_sentences = {s.lower() for v in docs["heldout"].values() for s in v}
    assert not train_sentences & held_sentences, "a sentence is in both splits"
    train, held = split_voices("train"), split_voices("heldout")
    for engine in ENGINE_WEIGHTS:
        assert train[engine] and held[engine], f"{engine} must have voices in both splits"
        assert not set(train[engine]) & set(held[engine]), f"{engine} voices in both splits"


def read_rows(path: Path) -> List[Dict[str, str]]:
    with path.open(newline="", encoding="utf-8") as f:
        return list(csv.DictReader(f))


def summarise(out: Path) -> None:
    """Print what each split holds; assert the written CSVs share no voice and no text."""
    rows = {s: read_rows(out / f"{s}.csv") for s in SPLITS if (out / f"{s}.csv").exists()}
    for split, rs in rows.items():
        secs = [float(r["seconds"]) for r in rs]
        if not secs:
            print(f"{split}: empty")
            continue
        engines = collections.Counter(r["engine"] for r in rs)
        voices = collections.Counter(f"{r['engine']}/{r['voice']}" for r in rs)
        print(f"{split}: {len(rs)} utterances, {sum(secs) / 60:.1f} min; {len(voices)} voices; "
              f"{100 * sum(s < 2 for s in secs) / len(secs):.1f}% under 2 s, "
              f"{100 * sum(s > 15 for s in secs) / len(secs):.1f}% over 15 s, longest {max(secs):.1f} s")
        print("  per engine: " + ", ".join(f"{e} {n}" for e, n in engines.most_common()))
        print("  per voice: " + ", ".join(f"{v} {n}" for v, n in sorted(voices.items())))
    if len(rows) == 2:
        voice_sets = [{(r["engine"], r["voice"]) for r in rows[s]} for s in SPLITS]
        text_sets = [{r["sentence"].lower() for r in rows[s]} for s in SPLITS]
        assert not voice_sets[0] & voice_sets[1], f"voices in both splits: {voice_sets[0] & voice_sets[1]}"
        assert not text_sets[0] & text_sets[1], "an utterance text is in both splits"
        print("train and heldout share no voice and no text")


def _unmet() -> List[Tuple[str, str]]:
    """(what is missing, the Debian package that provides it), for each missing synthesiser or text."""
    missing = []
    for tool, package in (("espeak-ng", "espeak-ng"), ("flite", "flite"), ("text2wave", "festival"),
                          ("sox", "sox"), ("bible", "bible-kjv")):
        if shutil.which(tool) is None:
            missing.append((f"{tool} not found", package))
    for voice, (package, rel) in FESTIVAL_VOICES.items():
        if not (FESTIVAL_VOICE_DIR / rel).is_dir():
            missing.append((f"festival voice {voice} not found", package))
    if not FORTUNES.is_dir():
        missing.append((f"{FORTUNES} not found", "fortunes"))
    if shutil.which("bible"):
        probe = subprocess.run(["bible", "Ge1:1"], capture_output=True, text=True)
        if "beginning" not in probe.stdout:
            missing.append(("the King James text is not found", "bible-kjv-text"))
    return missing


def missing_requirements() -> List[str]:
    """One line per missing synthesiser or text, naming the Debian package that provides it."""
    return [f"{what} (apt-get install {package})" for what, package in _unmet()]


def missing_packages() -> List[str]:
    """The Debian packages to install for what is missing, each once, in a stable order."""
    return list(dict.fromkeys(package for _, package in _unmet()))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                     epilog="See the module docstring for sources, voices and licences.")
    parser.add_argument("--out", type=Path, default=Path("data/corpus"))
    parser.add_argument("--train-minutes", type=float, default=240)
    parser.add_argument("--heldout-minutes", type=float, default=25)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--jobs", type=int, default=2, help="synthesis worker processes")
    parser.add_argument("--only", choices=SPLITS, default=None, help="build one split only")
    parser.add_argument("--missing-packages", action="store_true",
                        help="print the Debian packages still to install (space-separated; nothing when all are "
                             "there) and stop")
    args = parser.parse_args()
    if args.missing_packages:
        print(" ".join(missing_packages()))
        return

    missing = missing_packages()
    if missing:
        sys.exit(f"make_corpus: error: the speech synthesisers are not installed; run `make bench-setup` "
                 f"(as root it installs them) or `sudo apt-get install {' '.join(missing)}`")
    began = time.perf_counter()
    docs = split_documents()
    check_disjoint(docs)
    out = args.out.resolve()
    out.mkdir(parents=True, exist_ok=True)
    for split, minutes in (("heldout", args.heldout_minutes), ("train", args.train_minutes)):
        if args.only in (None, split):
            build(split, minutes, out, args.seed, max(1, args.jobs), docs[split])
    summarise(out)
    print(f"wrote {out} in {time.perf_counter() - began:.0f} s")


if __name__ == "__main__":
    main()
