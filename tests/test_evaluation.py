"""medusa-whisper eval: the CSV reader's bad input, and WER/CER that jiwer reproduces independently."""

import csv
import json
from pathlib import Path

import jiwer
import pytest
from whisper.normalizers import EnglishTextNormalizer

from medusa_whisper.cli import main
from medusa_whisper.evaluation import EvalDataError, corpus_scores, read_eval_csv

DATA = Path(__file__).parent / "data"
TRANSCRIPTS = {
    "espeak_weather": "The weather today will be mostly sunny, with a light breeze from the west and a high of "
                      "twenty degrees.",
    "espeak_library": "Please return your books to the library before the end of the month, or you will have to "
                      "pay a small fine.",
    "flite_train": "The next train to the city centre leaves from platform four in about ten minutes.",
    "flite_recipe": "Mix the flour and the sugar in a large bowl, then add two eggs and a cup of warm milk.",
    "espeak_meeting": "Thank you all for coming to the meeting. Today we will talk about the budget for next year "
                      "and the new office.",
}


def write_csv(path: Path, rows, header=("audio", "sentence", "language")) -> Path:
    with path.open("w", newline="") as f:
        writer = csv.writer(f)
        writer.writerow(header)
        writer.writerows(rows)
    return path


def clips_csv(tmp_path: Path, names=TRANSCRIPTS) -> Path:
    return write_csv(tmp_path / "set.csv", [[str(DATA / f"{n}.flac"), TRANSCRIPTS[n], "en"] for n in names])


def test_a_missing_column_stops_with_one_line_naming_file_and_column(tmp_path, capsys):
    bad = write_csv(tmp_path / "bad.csv", [["x.flac", "en"]], header=("audio", "language"))
    with pytest.raises(EvalDataError, match="missing column 'sentence'"):
        read_eval_csv(bad)
    assert main(["eval", "--data", str(bad)]) == 1
    assert capsys.readouterr().err.strip() == (f"medusa-whisper: error: {bad}: missing column 'sentence' "
                                               f"(has audio, language)")


def test_bad_rows_are_reported_and_the_others_still_evaluated(tmp_path, capsys):
    data = write_csv(tmp_path / "mixed.csv", [
        [str(DATA / "flite_train.flac"), TRANSCRIPTS["flite_train"], "en"],
        ["nowhere.flac", "some words", "en"],  # relative to the CSV's folder: does not exist
        [str(DATA / "flite_recipe.flac"), "", "en"],
        [str(DATA / "espeak_weather.flac"), TRANSCRIPTS["espeak_weather"], "en"],
    ])
    rows, problems = read_eval_csv(data)
    assert [r.audio.name for r in rows] == ["flite_train.flac", "espeak_weather.flac"]
    assert problems == [f"{data}:3: {tmp_path / 'nowhere.flac'}: no such file",
                        f"{data}:4: flite_recipe.flac: empty transcript"]

    code = main(["eval", "--data", str(data), "--model", "tiny.en", "--mode", "off", "--out", str(tmp_path / "r"),
                 "--threads", "2"])
    captured = capsys.readouterr()
    assert code == 1  # like a batch transcription: something failed, the rest was done
    assert captured.err.strip().splitlines() == [f"medusa-whisper: error: {p}" for p in problems]
    assert captured.out.startswith("2 utterances")
    report = json.loads((tmp_path / "r.json").read_text())
    assert report["summary"]["utterances"] == 2 and report["summary"]["skipped"] == 2


def test_wer_and_cer_match_jiwer_computed_independently_and_lossless_equals_vanilla(tmp_path, capsys):
    data = clips_csv(tmp_path)
    code = main(["eval", "--data", str(data), "--model", "tiny.en", "--mode", "lossless", "--compare-vanilla",
                 "--out", str(tmp_path / "r"), "--threads", "2"])
    assert code == 0
    printed = capsys.readouterr().out

    with (tmp_path / "r.csv").open(newline="") as f:
        rows = list(csv.DictReader(f))
    assert len(rows) == len(TRANSCRIPTS)
    norm = EnglishTextNormalizer()
    references = [norm(r["reference"]) for r in rows]
    hypotheses = [norm(r["hypothesis"]) for r in rows]
    wer, cer = jiwer.wer(references, hypotheses), jiwer.cer(references, hypotheses)
    summary = json.loads((tmp_path / "r.json").read_text())["summary"]
    assert summary["wer"] == pytest.approx(wer) and summary["cer"] == pytest.approx(cer)
    assert f"WER {wer:.2%}, CER {cer:.2%}" in printed
    assert 0 < wer < 0.5  # tiny.en understands these clips, not perfectly
    # per-utterance errors add up to the corpus figure
    assert sum(int(r["word_errors"]) for r in rows) / sum(int(r["words"]) for r in rows) == pytest.approx(wer)

    # lossless: the very same text as whisper.decode greedy, file by file
    assert summary["identical_share"] == 1.0 and summary["wer"] == summary["vanilla_wer"]
    assert all(r["identical"] == "True" for r in rows)
    assert summary["decoder_time_ratio"] > 0 and "decoder-time ratio" in printed


def test_corpus_scores_leave_out_empty_references():
    scores = corpus_scores(["a b c", "", "d"], ["a b x", "anything", "d"])
    assert scores["wer"] == pytest.approx(1 / 4)
