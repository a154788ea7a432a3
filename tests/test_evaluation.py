"""medusa-whisper eval and make bench: bad CSV input, WER/CER that jiwer reproduces independently,
the same text as whisper.decode, and a bench run whose rows are real runs of the packages.

Real tiny.en weights and real audio clips throughout; no trained heads (``--mode off`` and lossless
without heads decode one token per step), so the speed figures are checked for shape, not size.
"""

import csv
import json
import os
import subprocess
import sys
from pathlib import Path

import jiwer
import pytest
from whisper.normalizers import EnglishTextNormalizer

from medusa_whisper.cli import main
from medusa_whisper.evaluation import EvalDataError, EvalReport, corpus_scores, read_eval_csv, write_report

DATA = Path(__file__).parent / "data"
ROOT = Path(__file__).parent.parent
THREADS = os.environ.get("MEDUSA_TEST_THREADS", "2")
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


def test_a_missing_column_stops_with_one_line_naming_file_and_column(tmp_path, capsys):
    bad = write_csv(tmp_path / "bad.csv", [["x.flac", "en"]], header=("audio", "language"))
    with pytest.raises(EvalDataError, match="missing column 'sentence'"):
        read_eval_csv(bad)
    assert main(["eval", "--data", str(bad)]) == 1
    assert capsys.readouterr().err.strip() == (f"medusa-whisper: error: {bad}: missing column 'sentence' "
                                               f"(has audio, language)")


def test_a_csv_that_is_not_text_is_one_line(tmp_path, capsys):
    bad = tmp_path / "binary.csv"
    bad.write_bytes(b"\xff\xfe\x00\x81\x82 not utf-8")
    assert main(["eval", "--data", str(bad)]) == 1
    err = capsys.readouterr().err.strip()
    assert err.startswith(f"medusa-whisper: error: {bad}: not a readable UTF-8 CSV file") and "\n" not in err


def test_row_problems_name_the_row_and_file(tmp_path):
    (tmp_path / "clips").mkdir()
    good = tmp_path / "clips" / "good.flac"
    good.write_bytes((DATA / "flite_train.flac").read_bytes())
    data = write_csv(tmp_path / "set.csv", [
        ["clips/good.flac", "fine", "en"],  # relative to the CSV's folder, not the working directory
        ["", "no audio", "en"],
        ["clips/good.flac", "   ", "en"],
        ["clips/good.flac", "text", "klingon"],
        ["clips/good.flac", "text", "English"],  # a language name is accepted
    ], header=("audio", "sentence", "language", "regulation-start"))
    rows, problems = read_eval_csv(data)
    assert [(r.audio, r.language) for r in rows] == [(good, "en"), (good, "en")]
    assert problems == [f"{data}:3: no audio path", f"{data}:4: good.flac: empty transcript",
                        f"{data}:5: good.flac: unknown language 'klingon'"]

    bad_number = write_csv(tmp_path / "reg.csv", [[str(good), "x", "en", "soon", ""]],
                           header=("audio", "sentence", "language", "regulation-start", "regulation-factor"))
    rows, problems = read_eval_csv(bad_number)
    assert rows == [] and len(problems) == 1 and problems[0].startswith(f"{bad_number}:2: good.flac: regulation-start")


def test_bad_rows_are_reported_and_the_others_still_evaluated(tmp_path, capsys):
    unreadable = tmp_path / "noise.flac"
    unreadable.write_bytes(b"this is not a FLAC file at all" * 10)
    data = write_csv(tmp_path / "mixed.csv", [
        [str(unreadable), "words that cannot be heard", "en"],  # first: the warm-up must not trip on it
        [str(DATA / "flite_train.flac"), TRANSCRIPTS["flite_train"], "en"],
        ["nowhere.flac", "some words", "en"],  # relative to the CSV's folder: does not exist
        [str(DATA / "flite_recipe.flac"), "", "en"],
        [str(DATA / "espeak_weather.flac"), TRANSCRIPTS["espeak_weather"], "en"],
    ])
    rows, problems = read_eval_csv(data)
    assert [r.audio.name for r in rows] == ["noise.flac", "flite_train.flac", "espeak_weather.flac"]
    assert problems == [f"{data}:4: {tmp_path / 'nowhere.flac'}: no such file",
                        f"{data}:5: flite_recipe.flac: empty transcript"]

    code = main(["eval", "--data", str(data), "--model", "tiny.en", "--mode", "off", "--out", str(tmp_path / "r")])
    captured = capsys.readouterr()
    assert code == 1  # like a batch transcription: something failed, the rest was done
    errors = captured.err.strip().splitlines()
    assert errors[:2] == [f"medusa-whisper: error: {p}" for p in problems]
    assert len(errors) == 3 and errors[2] == (f"medusa-whisper: error: {data}:2: {unreadable}: not an audio "
                                                    f"file: it holds text")
    assert captured.out.startswith("2 utterances")
    report = json.loads((tmp_path / "r.json").read_text())
    assert report["summary"]["utterances"] == 2 and report["summary"]["skipped"] == 3
    assert [Path(u["audio"]).name for u in report["utterances"]] == ["flite_train.flac", "espeak_weather.flac"]
    assert all(u["tokens"] == u["decoder_steps"] > 5 for u in report["utterances"])  # off: one token per step


def test_wer_and_cer_match_jiwer_computed_independently_and_lossless_equals_vanilla(tmp_path, capsys):
    data = write_csv(tmp_path / "set.csv", [[str(DATA / f"{n}.flac"), t, "en"] for n, t in TRANSCRIPTS.items()])
    code = main(["eval", "--data", str(data), "--model", "tiny.en", "--mode", "lossless", "--compare-vanilla",
                 "--out", str(tmp_path / "r")])
    assert code == 0
    printed = capsys.readouterr().out

    with (tmp_path / "r.csv").open(newline="") as f:
        rows = list(csv.DictReader(f))
    assert [Path(r["audio"]).stem for r in rows] == list(TRANSCRIPTS)
    norm = EnglishTextNormalizer()
    references = [norm(t) for t in TRANSCRIPTS.values()]  # from the test's own transcripts, not the output
    hypotheses = [norm(r["hypothesis"]) for r in rows]
    wer, cer = jiwer.wer(references, hypotheses), jiwer.cer(references, hypotheses)
    summary = json.loads((tmp_path / "r.json").read_text())["summary"]
    assert summary["wer"] == pytest.approx(wer) and summary["cer"] == pytest.approx(cer)
    assert f"WER {wer:.2%}, CER {cer:.2%}" in printed
    assert 0 < wer < 0.5  # tiny.en understands these clips, not perfectly
    # the per-utterance error counts add up to the corpus figures
    assert sum(int(r["word_errors"]) for r in rows) / sum(int(r["words"]) for r in rows) == pytest.approx(wer)
    assert sum(int(r["char_errors"]) for r in rows) / sum(int(r["chars"]) for r in rows) == pytest.approx(cer)

    # lossless: the very same text as whisper.decode greedy, file by file, on the same encoder output
    assert summary["identical_share"] == 1.0 and summary["wer"] == summary["vanilla_wer"]
    assert all(r["identical"] == "True" and r["hypothesis"] == r["vanilla_hypothesis"] for r in rows)
    assert summary["decoder_speedup"] > 0 and "speedup over it: decoder" in printed
    assert summary["tokens_per_step"] == 1.0  # no trained heads: one token per step


def test_corpus_scores_leave_out_empty_references():
    scores = corpus_scores(["a b c", "", "d"], ["a b x", "anything", "d"])
    assert scores["wer"] == pytest.approx(1 / 4)


def test_report_files_keep_dots_in_the_prefix(tmp_path):
    csv_path, json_path = write_report(EvalReport(summary={"utterances": 0}), tmp_path / "eval_tiny.en_off")
    assert (csv_path.name, json_path.name) == ("eval_tiny.en_off.csv", "eval_tiny.en_off.json")
    assert write_report(EvalReport(), tmp_path / "given.csv")[0].name == "given.csv"


def test_bench_runs_openai_whisper_and_faster_whisper_and_says_what_it_skipped(tmp_path):
    pytest.importorskip("faster_whisper")
    pytest.importorskip("matplotlib")
    clips = write_csv(tmp_path / "clips.csv", [[str(DATA / "flite_train.flac"), TRANSCRIPTS["flite_train"], "5"],
                                               [str(DATA / "espeak_weather.flac"), TRANSCRIPTS["espeak_weather"],
                                                "real"]], header=("audio", "sentence", "bucket"))
    env = dict(os.environ, MEDUSA_WHISPER_HEADS_DIR=str(tmp_path / "no_heads"))
    done = subprocess.run([sys.executable, "-m", "tools.bench", "run", "--model", "tiny.en", "--quick",
                           "--clips", str(clips), "--threads", THREADS, "--out", str(tmp_path / "out")],
                          env=env, capture_output=True, text=True, timeout=300, cwd=ROOT)
    assert done.returncode == 0, done.stderr[-2000:]
    result = json.loads((tmp_path / "out" / "bench_quick.json").read_text())
    rows = {r["system"]: r for r in result["rows"]}
    for name in ("openai-whisper greedy", "medusa_whisper off", "faster-whisper int8", "faster-whisper float32"):
        row = rows[name]
        assert 0 <= row["wer"] < 0.5 and row["encoder_seconds"] > 0 and row["decoder_seconds"] > 0
        assert row["e2e_seconds"] == pytest.approx(row["encoder_seconds"] + row["decoder_seconds"], rel=1e-6)
    assert rows["openai-whisper greedy"]["decoder_speedup"] == 1.0
    assert rows["medusa_whisper off"]["same_text_as_vanilla"] == 1.0
    assert rows["medusa_whisper lossless"]["note"] == "skipped: no trained heads (weights/tiny.en-medusa.pt)"
    assert "wer" not in rows["medusa_whisper lossless (block)"]
    table = (tmp_path / "out" / "bench_quick.md").read_text()
    assert "| openai-whisper greedy |" in table and "skipped: no trained heads" in table and table in done.stdout
    assert (tmp_path / "out" / "speedup_by_length_quick.png").stat().st_size > 10_000


def test_paired_bootstrap_separates_a_worse_system_and_not_an_equal_one():
    from tools.bench import wer_compare

    refs = [f"the cat sat on mat number {i}" for i in range(60)]
    same = {f"{i}.flac": (r, r) for i, r in enumerate(refs)}
    # one word wrong in every second recording: 30 errors in 420 words
    worse = {f"{i}.flac": (r, r.replace("cat", "hat") if i % 2 else r) for i, r in enumerate(refs)}
    result = wer_compare.compare({"a": same, "b": dict(same), "c": worse}, resamples=500, seed=1)
    systems = result["systems"]
    assert result["rows"] == 60 and result["words"] == 420
    assert systems["a"]["wer"] == 0 and systems["b"]["minus_first_ci95"] == [0.0, 0.0]
    assert systems["c"]["wer"] == pytest.approx(30 / 420)
    assert systems["c"]["minus_first_ci95"][0] > 0  # the interval excludes "no difference"
    assert systems["c"]["share_first_no_better"] == 0 and systems["c"]["rows_differing_from_first"] == 30
    assert "| c | 7.14 % |" in wer_compare.markdown(result, "# t")
    with pytest.raises(SystemExit, match="other references"):
        wer_compare.compare({"a": same, "d": {k: ("x", h) for k, (_, h) in same.items()}}, resamples=10, seed=0)


def test_bench_long_checks_each_compute_type_against_its_own_greedy_output():
    from tools.bench import long as bench_long

    rows = {r["name"]: r for r in bench_long.systems("base")}
    whisper_row = "openai-whisper transcribe"
    assert rows["medusa_whisper off"]["reference"] == whisper_row
    assert rows["medusa_whisper off int8"]["reference"] == "medusa_whisper off int8"
    heads = [r for r in rows.values() if r.get("mode") == "lossless"]
    assert heads, "base has shipped heads"
    for row in heads:
        want = whisper_row if row["compute_type"] == "float32" else "medusa_whisper off int8"
        assert row["reference"] == want, row["name"]
    plain = [r["name"] for r in bench_long.systems("base", ("int8",), heads=False)]
    assert plain == [whisper_row, "medusa_whisper off int8"]


def test_bench_long_counts_each_systems_fallback_from_its_segments():
    """A window's final temperature t took t / 0.2 sampled attempts; its segments share it."""
    from tools.bench import long as bench_long

    segments = [(0, 0.0), (0, 0.0), (3000, 0.4), (3000, 0.4), (5800, 1.0), (8800, 0.0), (11000, 0.2)]
    assert bench_long.sampled_attempts(segments) == dict(fallback_windows=3, sampled_attempts=2 + 5 + 1)
    assert bench_long.sampled_attempts([]) == dict(fallback_windows=0, sampled_attempts=0)
