"""tools/data/corpus.py: a tiny corpus in the agreed CSV layout, 16 kHz mono, disjoint splits, resumable."""

import csv
import subprocess
import sys
from pathlib import Path

import pytest
import soundfile as sf

from tools.data import corpus as make_corpus

ROOT = Path(__file__).resolve().parent.parent

_MISSING = make_corpus.missing_requirements()
needs_engines = pytest.mark.skipif(bool(_MISSING), reason="not installed: " + "; ".join(_MISSING))


@needs_engines
def test_splits_share_neither_documents_sentences_nor_voices():
    docs = make_corpus.split_documents()
    make_corpus.check_disjoint(docs)  # asserts
    train, held = make_corpus.split_voices("train"), make_corpus.split_voices("heldout")
    for engine in make_corpus.ENGINE_WEIGHTS:
        assert train[engine] and held[engine] and not set(train[engine]) & set(held[engine])
    for split in make_corpus.SPLITS:  # both sources in both splits
        assert {source for source, _ in docs[split]} == {"fortunes", "kjv"}


@pytest.mark.slow
@needs_engines
def test_a_small_corpus_is_16k_mono_flac_with_its_csv_and_resumes(tmp_path):
    argv = [sys.executable, "-m", "tools.data", "corpus", "--out", str(tmp_path),
            "--train-minutes", "0.4", "--heldout-minutes", "0.25", "--jobs", "2"]
    subprocess.run(argv, check=True, capture_output=True, cwd=ROOT)
    splits = {}
    for split in make_corpus.SPLITS:
        with (tmp_path / f"{split}.csv").open(newline="") as f:
            reader = csv.DictReader(f)
            assert reader.fieldnames == ["audio", "sentence", "language", "engine", "voice", "seconds"]
            rows = list(reader)
        assert rows
        assert sum(float(r["seconds"]) for r in rows) >= {"train": 0.4, "heldout": 0.25}[split] * 60
        for row in rows:
            assert row["audio"].startswith(f"{split}/") and row["language"] == "en" and row["sentence"]
            info = sf.info(str(tmp_path / row["audio"]))
            assert (info.samplerate, info.channels) == (16000, 1)
            assert abs(info.duration - float(row["seconds"])) < 0.01
        splits[split] = rows
    assert not {r["sentence"] for r in splits["train"]} & {r["sentence"] for r in splits["heldout"]}
    assert not ({(r["engine"], r["voice"]) for r in splits["train"]}
                & {(r["engine"], r["voice"]) for r in splits["heldout"]})

    # a second run is a resume: the same CSVs, nothing re-synthesised
    before = {s: (tmp_path / f"{s}.csv").read_text() for s in make_corpus.SPLITS}
    stamps = {p: p.stat().st_mtime_ns for p in tmp_path.rglob("*.flac")}
    subprocess.run(argv, check=True, capture_output=True, cwd=ROOT)
    assert {s: (tmp_path / f"{s}.csv").read_text() for s in make_corpus.SPLITS} == before
    assert {p: p.stat().st_mtime_ns for p in tmp_path.rglob("*.flac")} == stamps

    # a damaged file is made again
    victim = tmp_path / splits["train"][0]["audio"]
    victim.write_bytes(b"not audio")
    subprocess.run(argv + ["--only", "train"], check=True, capture_output=True, cwd=ROOT)
    assert sf.info(str(victim)).samplerate == 16000
    assert (tmp_path / "train.csv").read_text() == before["train"]
