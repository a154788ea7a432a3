"""The GPU bench's own logic, on the CPU (tools/bench/gpu.py): how it reads a transcription's
windows, and how it explains a long recording's window whose text leaves whisper's."""

import pytest
import whisper

import medusa_whisper
from medusa_whisper.audio.files import load_audio
from tools.bench.gpu import Clip, Row, long_differences, windows_of

from conftest import DATA

JFK = DATA / "real" / "jfk.flac"


def test_windows_are_the_segments_grouped_by_seek():
    result = {"segments": [dict(seek=0, temperature=0.0, tokens=[1, 2]), dict(seek=0, temperature=0.0, tokens=[3]),
                           dict(seek=2900, temperature=0.4, tokens=[4])]}
    assert windows_of(result) == [(0, 0.0, [1, 2, 3]), (2900, 0.4, [4])]


@pytest.fixture(scope="module")
def jfk_window():
    """The recording as one window, and whisper's own tokens for it."""
    audio = load_audio(str(JFK))
    model = medusa_whisper.load_model("tiny.en", device="cpu")
    result = whisper.transcribe(model, audio, language="en", fp16=False, temperature=0.0)
    return Clip("jfk", audio, ""), windows_of(result)


def test_a_greedy_window_that_differs_gets_its_margin(jfk_window):
    clip, theirs = jfk_window
    (seek, temperature, tokens), = theirs
    changed = list(tokens)
    changed[3] = tokens[4]  # not what the verifier would say there
    whisper_row = Row("whisper", windows={clip.name: theirs})
    ours = Row("ours", windows={clip.name: [(seek, temperature, changed)]})
    (entry,) = long_differences(ours, whisper_row, clip, "tiny.en", "cpu")
    assert (entry["index"], entry["ours"], entry["reference"]) == (3, tokens[4], tokens[3])
    assert entry["same_prompt"] and entry["margin"] > 0.5  # the verifier prefers whisper's token, clearly
    same = Row("ours", windows={clip.name: theirs})
    assert long_differences(same, whisper_row, clip, "tiny.en", "cpu") == []


def test_a_sampled_window_is_reported_without_a_margin(jfk_window):
    clip, theirs = jfk_window
    (seek, _, tokens), = theirs
    ours = Row("ours", windows={clip.name: [(seek, 0.2, tokens[:5] + tokens[6:])]})
    (entry,) = long_differences(ours, Row("whisper", windows={clip.name: theirs}), clip, "tiny.en", "cpu")
    assert entry["ours_temperature"] == 0.2 and "margin" not in entry


def test_the_plan_carries_the_earlier_package_when_asked(tmp_path):
    """``tools.gpu pack --before``: the last call carries .before and runs the before and after."""
    from tools.gpu.pack import BEFORE, write_plan

    out = tmp_path / ".gpu"
    out.mkdir()
    for before in (False, True):
        write_plan(out, 3, before)
        last = (out / "PLAN.md").read_text().splitlines()[4]
        assert last.startswith("3. carry")
        assert (f'"{BEFORE}"' in last and f"AB_BEFORE={BEFORE} bash tools/gpu/run.sh" in last) == before
        assert last.endswith("bash tools/gpu/run.sh`")


def test_the_earlier_package_is_the_commits(tmp_path, monkeypatch):
    """``--before COMMIT`` writes that commit's medusa_whisper, file for file, where run.sh reads it."""
    import subprocess

    from tools.gpu import pack

    monkeypatch.setattr(pack, "ROOT", tmp_path)
    subprocess.run(["git", "init", "-q"], cwd=tmp_path, check=True)
    (tmp_path / "medusa_whisper").mkdir()
    (tmp_path / "medusa_whisper" / "x.py").write_text("A = 1\n")
    subprocess.run(["git", "add", "."], cwd=tmp_path, check=True)
    subprocess.run(["git", "-c", "user.email=t@t", "-c", "user.name=t", "commit", "-qm", "one"], cwd=tmp_path,
                   check=True)
    (tmp_path / "medusa_whisper" / "x.py").write_text("A = 2\n")  # the tree moved on
    package = pack.earlier_package("HEAD")
    assert package == tmp_path / pack.BEFORE / "medusa_whisper"
    assert (package / "x.py").read_text() == "A = 1\n"
