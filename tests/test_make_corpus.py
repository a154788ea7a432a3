"""tools/make_corpus.py: a tiny corpus is made, in the agreed CSV layout, with disjoint splits."""

import csv
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import soundfile as sf

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tools"))

import make_corpus  # noqa: E402

ENGINES = ("espeak-ng", "flite", "text2wave", "sox")
needs_engines = pytest.mark.skipif(
    any(shutil.which(t) is None for t in ENGINES) or not make_corpus.FORTUNES.is_dir(),
    reason="speech synthesisers or fortunes not installed (apt-get install espeak-ng flite festival sox fortunes)")


@needs_engines
def test_splits_share_neither_text_nor_voices():
    make_corpus.check_disjoint()
    train, held = make_corpus.split_voices("train"), make_corpus.split_voices("heldout")
    assert all(train[e] and held[e] for e in train)  # every engine in both splits


@needs_engines
def test_a_small_corpus_is_written_as_16k_mono_flac_with_its_csv(tmp_path):
    argv = [sys.executable, str(ROOT / "tools" / "make_corpus.py"), "--out", str(tmp_path),
            "--train-minutes", "0.5", "--heldout-minutes", "0.3", "--jobs", "2"]
    subprocess.run(argv, check=True, capture_output=True)
    splits = {}
    for split in ("train", "heldout"):
        with (tmp_path / f"{split}.csv").open(newline="") as f:
            reader = csv.DictReader(f)
            assert reader.fieldnames == ["audio", "sentence", "language", "engine", "voice", "seconds"]
            rows = list(reader)
        assert rows
        for row in rows:
            info = sf.info(str(tmp_path / row["audio"]))
            assert (info.samplerate, info.channels) == (16000, 1)
            assert abs(info.duration - float(row["seconds"])) < 0.01 and row["sentence"]
        splits[split] = rows
    assert not {r["sentence"] for r in splits["train"]} & {r["sentence"] for r in splits["heldout"]}
    assert not {r["voice"] for r in splits["train"]} & {r["voice"] for r in splits["heldout"]}

    # a second run is a resume: same CSV, nothing re-synthesised
    before = (tmp_path / "train.csv").read_text()
    stamps = {p: p.stat().st_mtime for p in tmp_path.rglob("*.flac")}
    subprocess.run(argv, check=True, capture_output=True)
    assert (tmp_path / "train.csv").read_text() == before
    assert {p: p.stat().st_mtime for p in tmp_path.rglob("*.flac")} == stamps
