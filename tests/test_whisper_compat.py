"""A drop-in for openai-whisper users: whisper's command line and Python calls, with whisper's meanings.

The slow test runs one argument list through openai-whisper's own `whisper` command and through
`medusa-whisper`, on the same checkpoint file, and compares every file they write.
"""

import argparse
import json
import math
import os
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import soundfile
import torch
import whisper
from whisper.transcribe import cli as whisper_cli

import medusa_whisper
from medusa_whisper.checkpoints import weights
from medusa_whisper.cli import build_parser, main, transcribe_options

ROOT = Path(__file__).parent.parent
DATA = Path(__file__).parent / "data"
JFK = DATA / "real" / "jfk.flac"
GOOD = DATA / "flite_train.flac"


def whisper_cli_parser() -> argparse.ArgumentParser:
    """The parser openai-whisper's `whisper` command builds (captured as it parses)."""

    class Captured(Exception):
        pass

    def capture(parser, *args, **kwargs):
        raise Captured(parser)

    original = argparse.ArgumentParser.parse_args
    argparse.ArgumentParser.parse_args = capture
    try:
        whisper_cli()
    except Captured as e:
        return e.args[0]
    finally:
        argparse.ArgumentParser.parse_args = original
    raise AssertionError("whisper's cli() did not parse arguments")


def transcribe_parser() -> argparse.ArgumentParser:
    commands = next(a for a in build_parser()._actions if isinstance(a, argparse._SubParsersAction))
    return commands.choices["transcribe"]


def test_every_option_of_whispers_command_line_is_accepted():
    ours = {s for action in transcribe_parser()._actions for s in action.option_strings}
    theirs = {s for action in whisper_cli_parser()._actions for s in action.option_strings}
    assert theirs - ours == set()


def test_whisper_spellings_mean_what_they_mean_in_whisper():
    argv = ["a.wav", "--model", "base", "--output_dir", "out", "--output_format", "srt", "--language", "English",
            "--temperature", "0.2", "--best_of", "3", "--beam_size", "4", "--patience", "2", "--length_penalty", "0.5",
            "--suppress_tokens=-1,50", "--initial_prompt", "Hi.", "--carry_initial_prompt", "True",
            "--condition_on_previous_text", "False", "--fp16", "False", "--temperature_increment_on_fallback", "0.4",
            "--compression_ratio_threshold", "2.0", "--logprob_threshold", "-0.5", "--no_speech_threshold", "0.3",
            "--word_timestamps", "True", "--prepend_punctuations", "(", "--append_punctuations", ")",
            "--highlight_words", "True", "--max_line_width", "30", "--max_line_count", "2",
            "--max_words_per_line", "5", "--threads", "1", "--clip_timestamps", "0,5",
            "--hallucination_silence_threshold", "1.5", "--task", "translate", "--verbose", "False"]
    theirs = vars(whisper_cli_parser().parse_args(argv))
    ours = vars(transcribe_parser().parse_args(argv))
    assert ours["language"] == "en" and theirs["language"] == "English"  # whisper maps names later, as we do now
    assert ours["output_dir"] == Path("out")
    for name, value in theirs.items():
        if name not in ("language", "output_dir", "model", "device"):  # device: both default to cuda when there
            assert ours[name] == value, name
    options = transcribe_options(argparse.Namespace(**ours, whisper_form=True))
    assert options["temperature"] == (0.2, 0.6, 1.0)
    for name in ("best_of", "beam_size", "patience", "length_penalty", "suppress_tokens", "fp16",
                 "prepend_punctuations", "append_punctuations", "carry_initial_prompt", "word_timestamps"):
        assert options[name] == theirs[name], name


def test_none_is_accepted_where_whisper_accepts_it():
    ours = transcribe_parser().parse_args(["a.wav", "--beam_size", "None", "--best_of", "None", "--language", "None",
                                           "--logprob_threshold", "None", "--verbose", "None"])
    assert (ours.beam_size, ours.best_of, ours.language, ours.logprob_threshold, ours.verbose) == (None,) * 5


class FakeModel:
    is_multilingual = False

    def __init__(self):
        self.options = []

    def transcribe(self, audio, progress=None, **options):
        self.options.append(options)
        if options.get("verbose"):
            print("[00:00.000 --> 00:04.500]  Hello there.")
        segments = [{"id": 0, "seek": 0, "start": 0.0, "end": 4.5, "text": " Hello there.", "tokens": [50, 51]}]
        return {"text": " Hello there.", "segments": segments, "language": "en", "medusa": {"audio_seconds": 4.45}}


@pytest.fixture
def fake_model(monkeypatch):
    model = FakeModel()
    model.loaded = []

    def load_model(name, device=None, download_root=None, draft=None, **kwargs):
        model.loaded.append((name, download_root))
        return model

    monkeypatch.setattr(medusa_whisper, "load_model", load_model)
    return model


def test_no_command_is_whispers_command_with_whispers_defaults(fake_model, tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    assert main([str(GOOD), "--model", "base", "--model_dir", str(tmp_path / "models")]) == 0
    assert sorted(p.name for p in tmp_path.iterdir()) == [f"flite_train.{f}" for f in ("json", "srt", "tsv", "txt", "vtt")]
    captured = capsys.readouterr()
    assert captured.out == "[00:00.000 --> 00:04.500]  Hello there.\n"  # --verbose True: segments as decoded
    assert captured.err == ""
    assert fake_model.loaded == [("base", str(tmp_path / "models"))]
    assert fake_model.options[0]["best_of"] == 5 and fake_model.options[0]["beam_size"] is None


def test_transcribe_command_keeps_its_quiet_defaults(fake_model, tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    assert main(["transcribe", str(GOOD)]) == 0
    assert list(tmp_path.iterdir()) == []
    assert capsys.readouterr().out == "Hello there.\n"


def test_beam_search_is_whispers_and_said_once(fake_model, tmp_path, capsys):
    clip = tmp_path / "second.flac"
    shutil.copy(GOOD, clip)
    assert main([str(GOOD), str(clip), "--beam_size", "5", "-o", str(tmp_path / "out"), "-f", "txt",
                 "--verbose", "None"]) == 0
    err = capsys.readouterr().err.splitlines()
    notes = [line for line in err if "note:" in line]
    assert len(notes) == 1 and "--beam-size 5" in notes[0] and "greedy decoding only" in notes[0]
    assert [o["beam_size"] for o in fake_model.options] == [5, 5]


def test_english_only_model_with_another_language_says_so(fake_model, tmp_path, capsys):
    assert main([str(GOOD), "--language", "German", "-o", str(tmp_path), "-f", "txt"]) == 0
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "English-only" in err
    assert fake_model.options[0]["language"] == "en"


def test_model_dir_holding_openais_checkpoint_is_used_as_it_is(tmp_path, monkeypatch):
    folder = tmp_path / "whisper"
    folder.mkdir()
    checkpoint = folder / "tiny.en.pt"
    torch.save({"dims": {}, "model_state_dict": {}}, checkpoint)
    digest = weights.sha256_file(checkpoint)
    monkeypatch.setitem(whisper._MODELS, "tiny.en", f"https://example.org/models/{digest}/tiny.en.pt")
    assert weights.resolve("tiny.en", download_root=folder).checkpoint == checkpoint
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))  # whisper's default folder is looked in too
    assert weights.resolve("tiny.en").checkpoint == checkpoint
    checkpoint.write_bytes(b"changed")  # not openai's file any more: the offline package is used instead
    assert weights.resolve("tiny.en").checkpoint != checkpoint


def test_a_whisper_script_runs_with_medusa_whisper_imported_as_whisper():
    import medusa_whisper as mw

    model = mw.load_model("tiny.en", "cpu")
    reference = whisper.transcribe(model, str(JFK), fp16=False)["text"]
    assert mw.transcribe(model, str(JFK), fp16=False)["text"] == reference
    audio = mw.pad_or_trim(mw.load_audio(str(JFK)))
    mel = mw.log_mel_spectrogram(audio).to(model.device)
    ours = mw.decode(model, mel, mw.DecodingOptions(language="en", fp16=False, without_timestamps=True))
    theirs = whisper.decode(model, mel, whisper.DecodingOptions(language="en", fp16=False, without_timestamps=True))
    assert ours.text == theirs.text


# ---------------------------------------------------------------- the two command lines, file by file


@pytest.fixture(scope="module")
def openai_checkpoint(tmp_path_factory):
    """tiny.en as a plain openai-whisper checkpoint file, which whisper's command line loads from a path."""
    checkpoint = weights.load_checkpoint(weights.resolve("tiny.en").checkpoint)
    plain = {"dims": checkpoint["dims"], "model_state_dict": checkpoint["model_state_dict"]}
    path = tmp_path_factory.mktemp("model") / "model.pt"  # no known name: both use the default alignment heads
    torch.save(plain, path)
    return path


def _two_windows(folder: Path) -> Path:
    """JFK, a pause and a synthetic clip: over 30 s, so the long-form loop takes two windows."""
    jfk, rate = soundfile.read(JFK, dtype="float32")
    other, _ = soundfile.read(DATA / "espeak_weather.flac", dtype="float32")
    path = folder / "long talk.wav"
    soundfile.write(path, np.concatenate([jfk, np.zeros(rate * 12, np.float32), other]), rate)
    return path


def _run(command, args, cwd):
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    return subprocess.run([*command, *map(str, args)], cwd=cwd, capture_output=True, text=True, env=env, timeout=600)


def _same_json(ours: dict, theirs: dict) -> None:
    """whisper's keys hold whisper's values: exact, but for float statistics within rounding."""
    assert ours["text"] == theirs["text"] and ours["language"] == theirs["language"]
    assert len(ours["segments"]) == len(theirs["segments"])
    for mine, other in zip(ours["segments"], theirs["segments"]):
        assert set(mine) == set(other)
        for key, value in other.items():
            if key in ("avg_logprob", "compression_ratio", "no_speech_prob"):
                assert math.isclose(mine[key], value, rel_tol=1e-4, abs_tol=1e-5), key
            elif key == "words":
                assert [(w["word"], w["start"], w["end"]) for w in mine[key]] == \
                       [(w["word"], w["start"], w["end"]) for w in value]
            else:
                assert mine[key] == value, key


@pytest.mark.slow
def test_the_same_argument_list_writes_the_same_files_as_whispers_command_line(openai_checkpoint, tmp_path):
    whisper_command = [str(Path(sys.executable).parent / "whisper")]  # the venv's own, beside this python
    ours_command = [sys.executable, "-m", "medusa_whisper.cli"]
    inputs = [JFK, _two_windows(tmp_path)]

    # greedy (beam search off, as whisper.transcribe's own default), word timestamps, subtitle layout
    common = [*inputs, "--model", openai_checkpoint, "--beam_size", "None", "--word_timestamps", "True",
              "--max_line_width", "42", "--max_line_count", "2", "--fp16", "False", "--threads", "2",
              "--verbose", "False"]
    for name, command in (("whisper", whisper_command), ("ours", ours_command)):
        done = _run(command, [*common, "--output_dir", tmp_path / name], tmp_path)
        assert done.returncode == 0, done.stderr[-2000:]
    for stem in ("jfk", "long talk"):
        for fmt in ("txt", "vtt", "srt", "tsv"):
            ours = (tmp_path / "ours" / f"{stem}.{fmt}").read_bytes()
            assert ours == (tmp_path / "whisper" / f"{stem}.{fmt}").read_bytes(), (stem, fmt)
        _same_json(json.loads((tmp_path / "ours" / f"{stem}.json").read_text()),
                   json.loads((tmp_path / "whisper" / f"{stem}.json").read_text()))

    # beam search: whisper's own decoder, reached through the same options, and said once
    beam = [JFK, "--model", openai_checkpoint, "--beam_size", "3", "--patience", "1.5", "--output_format", "srt",
            "--fp16", "False", "--threads", "2", "--verbose", "False"]
    for name, command in (("whisper_beam", whisper_command), ("ours_beam", ours_command)):
        done = _run(command, [*beam, "--output_dir", tmp_path / name], tmp_path)
        assert done.returncode == 0, done.stderr[-2000:]
        if name == "ours_beam":
            assert done.stderr.count("greedy decoding only") == 1
    assert (tmp_path / "ours_beam" / "jfk.srt").read_bytes() == (tmp_path / "whisper_beam" / "jfk.srt").read_bytes()
