"""Training on hours of speech within a time budget: hour blocks cached one by one (training/blocks.py),
the minutes budget and the speech-seen column of the loop (training/loop.py), the learning curve."""

import csv
import json

import pytest
import torch
from torch import nn

from medusa_whisper.cli import main
from medusa_whisper.training import blocks, features, loop, windows
from medusa_whisper.training.plots import Run, plot_learning_curve
from tools import learning_curve


def _utterances(seconds):
    return [windows.Utterance(path=f"u{i}.flac", group=f"v{i % 3}", seconds=s) for i, s in enumerate(seconds)]


def test_blocks_cut_the_rows_in_order_and_leave_the_incomplete_end_out():
    utterances = _utterances([4, 5, 3, 6, 2, 7, 1])
    cut, leftover = blocks.cut(utterances, block_hours=8 / 3600)
    assert [[u.path for u in b.utterances] for b in cut] == [["u0.flac", "u1.flac"], ["u2.flac", "u3.flac"],
                                                            ["u4.flac", "u5.flac"]]
    assert [b.seconds for b in cut] == [9, 9, 9] and leftover == 1


def test_the_block_counter_closes_blocks_where_cut_does():
    seconds = [float(s) for s in torch.randint(1, 9, (200,), generator=torch.Generator().manual_seed(0))]
    counter = blocks.BlockCounter(block_hours=20 / 3600)
    closes = [i for i, s in enumerate(seconds) if counter.add(s)]
    cut, leftover = blocks.cut(_utterances(seconds), block_hours=20 / 3600)
    assert closes == [int(b.utterances[-1].path[1:-5]) for b in cut] and counter.whole == len(cut) > 30
    assert counter.open_seconds == leftover


def test_a_block_packs_the_same_windows_whatever_rows_follow_it():
    utterances = _utterances([4, 5, 3, 6, 2, 7, 1, 3, 3, 3])
    short, _ = blocks.cut(utterances[:4], block_hours=8 / 3600)
    longer, _ = blocks.cut(utterances, block_hours=8 / 3600)
    as_paths = lambda ws: [[u.path for u in w.utterances] for w in ws]  # noqa: E731
    for block in short:
        assert as_paths(blocks.block_windows(block, 0, (5, 9))) == as_paths(blocks.block_windows(longer[block.index], 0, (5, 9)))
    # another block, another seed: the packings are not copies of each other
    label = features.LabelOptions()
    assert longer[0].key(0, (5, 9), label) != longer[1].key(0, (5, 9), label)
    assert longer[0].key(0, (5, 9), label) != longer[0].key(1, (5, 9), label)


def test_asking_for_more_hours_than_whole_blocks_hold_is_one_clear_error():
    cut, leftover = blocks.cut(_utterances([3600, 3600, 1800]))
    assert [b.index for b in blocks.select(cut, 1.5)] == [0, 1]
    with pytest.raises(windows.DataError, match=r"--hours 3: the training data holds 2 whole block\(s\) of 1 h "
                                                r"\(2.00 h, plus 0.50 h in an incomplete last block\)"):
        blocks.select(cut, 3, leftover_seconds=leftover)


def test_a_block_cached_from_other_rows_is_refused(tmp_path):
    cut, _ = blocks.cut(_utterances([5, 5, 5]), block_hours=4 / 3600)
    folder = blocks.block_dir(tmp_path, cut[1])
    folder.mkdir()
    (folder / "block.json").write_text(json.dumps({"key": "something else"}))
    with pytest.raises(windows.DataError, match="block_001: cached from other rows or settings"):
        blocks.build(None, cut, tmp_path, features.LabelOptions(), 0, (5, 9))


class _Task:
    """The smallest loop.HeadTask: a linear layer fitted to zero."""

    description, lr_floor, clip_norm, best_metric = "toy", 0.1, None, None

    def __init__(self, examples=8, batch_size=2):
        self.module = nn.Linear(2, 1)
        self.examples, self.batch_size, self.config = examples, batch_size, {"toy": 1}

    def param_groups(self):
        return [dict(params=list(self.module.parameters()), lr=0.1)]

    def train_step(self, rows, step):
        loss = self.module(torch.ones(len(rows), 2)).pow(2).mean()
        loss.backward()
        return float(loss.detach()), {}

    def evaluate(self):
        return None

    def checkpoint_weights(self):
        return dict(weights=self.module.state_dict())

    def load_checkpoint_weights(self, saved):
        self.module.load_state_dict(saved["weights"])


class _Config:
    seed, epochs, warmup_steps, weight_decay, eval_every, checkpoint_every = 0, 3.0, 1, 0.0, 2, 2


def test_the_loop_counts_the_speech_each_step_shows(tmp_path):
    seconds = [float(i + 1) * 360 for i in range(8)]  # example i holds (i + 1) tenths of an hour
    task, state = loop.train(lambda: _Task(), _Config(), tmp_path, example_seconds=seconds)
    assert state.step == 12  # 3 epochs of 4 batches
    assert [h["step"] for h in state.history] == [2, 4, 6, 8, 10, 12]
    assert state.history[1]["speech_hours_seen"] == pytest.approx(sum(seconds) / 3600)  # one epoch: every example
    assert state.history[-1]["speech_hours_seen"] == pytest.approx(3 * sum(seconds) / 3600)


def test_a_spent_budget_ends_the_run_evaluated_and_checkpointed(tmp_path):
    # a budget far below one step's time: the run stops after its first step, whatever the machine
    task, state = loop.train(lambda: _Task(), _Config(), tmp_path, minutes=1e-9, example_seconds=[1.0] * 8)
    assert state.step == 1 and [h["step"] for h in state.history] == [1]
    saved = torch.load(tmp_path / "checkpoint.pt", weights_only=True)
    assert saved["state"]["step"] == 1
    # resumed with the budget spent, it trains no further
    _, again = loop.train(lambda: _Task(), _Config(), tmp_path, minutes=1e-9)
    assert again.step == 1


def test_the_schedule_decays_by_the_budget_when_it_is_further_along_than_the_steps():
    assert loop.lr_factor(50, 1000, 10, 0.1) > 0.99
    assert loop.lr_factor(50, 1000, 10, 0.1, time_progress=0.5) == pytest.approx(0.55)
    assert loop.lr_factor(50, 1000, 10, 0.1, time_progress=1.0) == pytest.approx(0.1)
    assert loop.lr_factor(5, 1000, 10, 0.1, time_progress=0.9) == pytest.approx(0.6)  # warm-up first


def test_the_learning_curve_draws_runs_on_different_hours(tmp_path):
    history = lambda top: [dict(step=s, seconds=60.0 * s, speech_hours_seen=0.5 * s,  # noqa: E731
                                heldout=dict(tokens_per_step=top - 1 / s)) for s in (1, 2, 4)]
    runs = [Run("1 h", history(1.8), 1.0), Run("10 h", history(2.4), 10.0)]
    # the tool reads work folders: history.json, and the hours from record.json
    for run in runs:
        folder = tmp_path / run.label.replace(" ", "")
        folder.mkdir()
        (folder / "history.json").write_text(json.dumps(run.history))
        (folder / "record.json").write_text(json.dumps({"cache": {"train": {"hours": run.train_hours}}}))
    read = learning_curve.read_run(tmp_path / "10h")
    assert (read.label, read.train_hours, len(read.history)) == ("10.0 h of speech", 10.0, 3)
    pytest.importorskip("matplotlib")
    assert plot_learning_curve(runs, tmp_path / "curve.png", "toy").stat().st_size > 0


def test_train_with_hours_caches_blocks_that_a_second_run_reuses(tmp_path, clips, capsys):
    data = tmp_path / "train.csv"
    with data.open("w", newline="") as f:
        writer = csv.writer(f)
        writer.writerow(["audio", "sentence", "language", "voice"])
        for c in clips:
            writer.writerow([str(c), "", "en", "one"])
    cache = tmp_path / "cache"
    argv = ["train", "--heads-type", "eagle", "--base", "tiny.en", "--data", str(data),
            "--cache-dir", str(cache), "--hours", "0.003", "--block-hours", "0.0025", "--window-seconds", "8", "12",
            "--epochs", "1", "--batch-windows", "2", "--proposal-vocab", "512", "--threads", "2",
            "--out", str(tmp_path / "h.pt")]
    assert main(argv) == 0
    shards = sorted((cache / "train").glob("block_*/shard_*.pt"))
    assert [p.parent.name for p in shards] == ["block_000", "block_001"]
    record = json.loads((tmp_path / "h.work" / "record.json").read_text())
    assert record["budget"] == {"hours": 0.003, "minutes": None} and record["cache"]["train"]["blocks"] == 2
    assert record["final"]["speech_hours_seen"] > 0
    stamps = [p.stat().st_mtime_ns for p in shards]
    # one block only, for another head: the cached block is read, nothing is labelled again
    assert main(argv[:-1] + [str(tmp_path / "h1.pt"), "--hours", "0.002", "--no-resume"]) == 0
    assert [p.stat().st_mtime_ns for p in shards] == stamps
    assert json.loads((tmp_path / "h1.work" / "record.json").read_text())["cache"]["train"]["blocks"] == 1
    # another head type on the same blocks, within a budget
    ctc = ["train", "--heads-type", "ctc", "--base", "tiny.en", "--data", str(data), "--cache-dir", str(cache),
           "--hours", "0.003", "--block-hours", "0.0025", "--window-seconds", "8", "12", "--epochs", "1",
           "--minutes", "5", "--threads", "2", "--out", str(tmp_path / "c.pt")]
    assert main(ctc) == 0
    assert [p.stat().st_mtime_ns for p in shards] == stamps
    ctc_record = json.loads((tmp_path / "c.work" / "record.json").read_text())
    assert ctc_record["budget"] == {"hours": 0.003, "minutes": 5.0} and ctc_record["cache"]["train"]["blocks"] == 2
    # more hours than the rows hold: one line
    capsys.readouterr()
    assert main(argv[:-1] + [str(tmp_path / "h2.pt"), "--hours", "1"]) == 1
    assert capsys.readouterr().err.strip().startswith("medusa-whisper: error: --hours 1: the training data holds 2")


def test_first_fit_packing_fills_earlier_windows_and_keeps_every_utterance():
    seconds = [9, 9, 4, 9, 4, 3, 9, 2, 8, 4, 9, 3]
    utterances = [windows.Utterance(path=f"u{i}", group="one", seconds=s) for i, s in enumerate(seconds)]
    plain = windows.pack(utterances, seed=5, min_seconds=14, max_seconds=16)
    fitted = windows.pack(utterances, seed=5, min_seconds=14, max_seconds=16, first_fit=True)
    for packed in (plain, fitted):
        assert sorted(u.path for w in packed for u in w.utterances) == sorted(u.path for u in utterances)
        for w in packed:
            assert sum(u.seconds for u in w.utterances) + sum(w.pauses) <= 16 + 1e-9 or len(w.utterances) == 1
    assert len(fitted) < len(plain)
