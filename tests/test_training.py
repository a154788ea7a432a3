"""Head training on real tiny.en weights and the bundled clips: cache, loss, resume, loading by name."""

import csv
from dataclasses import replace

import pytest
import torch
import whisper

import medusa_whisper
from medusa_whisper import MedusaConfig
from medusa_whisper.audio.files import load_audio
from medusa_whisper.cli import main
from medusa_whisper.drafting.heads import MedusaHeads
from medusa_whisper.training import features, trainer, windows
from medusa_whisper.training.trainer import IGNORE, HeadsTrainer, TrainConfig, window_targets

from helpers import TINY_DIMS


@pytest.fixture(scope="module")
def base():
    return medusa_whisper.load_model("tiny.en", device="cpu")


@pytest.fixture(scope="module")
def cache(tiny_en_cache):
    return tiny_en_cache


def test_window_targets_shift_each_head_by_its_offset():
    tokens = [1, 2, 3, 10, 11, 12, 99]  # 3 initial tokens, then 10 11 12, then end-of-text 99
    first, targets = window_targets(tokens, sample_begin=3, num_heads=2)
    assert first == 2  # the last initial token predicts the first sampled one
    assert targets.tolist() == [[10, 11, 12], [11, 12, 99], [12, 99, IGNORE], [99, IGNORE, IGNORE]]


def test_pack_respects_the_window_limit_and_keeps_every_utterance(clips):
    utterances = [windows.Utterance(path=str(c), group=str(i % 2)) for i, c in enumerate(clips)]
    packed = windows.pack(utterances, seed=3, min_seconds=6, max_seconds=9)
    assert sorted(u.path for w in packed for u in w.utterances) == sorted(str(c) for c in clips)
    for w in packed:
        assert len({u.group for u in w.utterances}) == 1  # one speaker per window
        if len(w.utterances) > 1:
            assert len(windows.render(w)) / 16000 <= 9 + 1e-6
    assert [[u.path for u in w.utterances] for w in packed] == [
        [u.path for u in w.utterances] for w in windows.pack(utterances, seed=3, min_seconds=6, max_seconds=9)]


def test_cached_states_reproduce_the_greedy_labels(base, cache):
    """The stored h, projected, predicts the next label token: cache and labels line up."""
    shard = features.load_cache(cache)
    assert shard.tokens and any(m["timestamps"] for m in shard.meta) and not all(m["timestamps"] for m in shard.meta)
    embedding = base.decoder.token_embedding.weight
    agree = total = 0
    for tokens, begin, offset in zip(shard.tokens, shard.sample_begin, shard.offsets):
        h = shard.hidden[offset + begin - 1 : offset + len(tokens) - 1].float()
        predicted = (h @ embedding.T).argmax(-1)
        expected = torch.tensor(tokens[begin:])
        # whisper's logit filters (suppressed tokens, timestamp rules) can overrule the raw argmax
        agree += int((predicted == expected).sum())
        total += len(expected)
    assert total > 50 and agree / total > 0.9


def test_the_labels_are_what_whisper_decode_says(base, cache):
    shard = features.load_cache(cache)
    meta = shard.meta[0]
    w = windows.Window([windows.Utterance(path=p) for p in meta["audio"]], meta["pauses"])
    mel = whisper.log_mel_spectrogram(whisper.pad_or_trim(torch.from_numpy(windows.render(w))))
    result = whisper.decode(base, mel, whisper.DecodingOptions(language="en", fp16=False,
                                                               without_timestamps=not meta["timestamps"]))
    assert shard.tokens[0][shard.sample_begin[0]:-1] == result.tokens


@pytest.mark.parametrize("heads_type", ["linear", "block"])
def test_a_short_training_run_lowers_the_held_out_loss(base, cache, tmp_path, heads_type):
    shard = features.load_cache(cache)
    cfg = TrainConfig(heads_type=heads_type, num_heads=3, epochs=8 if heads_type == "linear" else 4,
                      batch_positions=128, batch_windows=2, eval_every=1000, checkpoint_every=1000, warmup_steps=2)
    trained, state = trainer.train(base, shard, shard, cfg, tmp_path)
    before = trainer.evaluate(trainer.HeadsTrainer(base, cfg), trainer._prepare(cfg, shard))
    after = state.history[-1]["heldout"]
    assert after["loss"] < before["loss"] - 1.0
    assert sum(after["accuracy_per_head"]) > sum(before["accuracy_per_head"])


def test_resuming_from_a_checkpoint_continues_at_the_same_step(base, cache, tmp_path):
    shard = features.load_cache(cache)
    cfg = TrainConfig(num_heads=2, epochs=4, batch_positions=64, eval_every=1000, checkpoint_every=3, warmup_steps=2)
    straight, _ = trainer.train(base, shard, None, cfg, tmp_path / "straight")

    trainer.train(base, shard, None, cfg, tmp_path / "split", max_steps=6)
    saved = torch.load(tmp_path / "split" / "checkpoint.pt", weights_only=True)
    assert saved["state"]["step"] == 6
    logs = []
    resumed, state = trainer.train(base, shard, None, cfg, tmp_path / "split", log=logs.append)
    assert logs == [f"resuming at step 6 of {state.step}"]
    for (name, a), (_, b) in zip(straight.heads.state_dict().items(), resumed.heads.state_dict().items()):
        torch.testing.assert_close(a, b, msg=name, rtol=0, atol=1e-6)

    with pytest.raises(ValueError, match="other settings"):
        trainer.train(base, shard, None, replace(cfg, lr=0.5), tmp_path / "split")


def test_a_trained_heads_file_loads_by_name_and_decodes_losslessly(base, cache, tmp_path, monkeypatch, clips):
    shard = features.load_cache(cache)
    cfg = TrainConfig(num_heads=3, epochs=15, batch_positions=64, eval_every=1000, checkpoint_every=1000,
                      warmup_steps=2, lr=3e-3)
    trained, state = trainer.train(base, shard, None, cfg, tmp_path / "work")
    torch.save(trainer.heads_file(trained, base, "tiny.en", {"steps": state.step}), tmp_path / "tiny.en-medusa.pt")
    monkeypatch.setenv("MEDUSA_WHISPER_HEADS_DIR", str(tmp_path))

    model = medusa_whisper.load_model("tiny.en-medusa", device="cpu")
    assert model.num_heads == 3
    for (name, a), (_, b) in zip(trained.heads.state_dict().items(), model.medusa.state_dict().items()):
        assert torch.equal(a, b), name
    mel = whisper.log_mel_spectrogram(whisper.pad_or_trim(load_audio(clips[0])))
    ours = medusa_whisper.decode(model, mel, language="en")
    assert ours.tokens == whisper.decode(model, mel, whisper.DecodingOptions(language="en", fp16=False)).tokens
    assert ours.tokens_per_step > 1.0


def test_proposal_vocabulary_maps_ids_and_columns_both_ways():
    heads = MedusaHeads(TINY_DIMS, MedusaConfig(num_heads=1, proposal_vocab=1000))
    ids = torch.tensor([0, 999, 1000, 50255, 50256, 51863])
    columns = heads.proposal_columns(ids)
    assert columns.tolist() == [0, 999, IGNORE, IGNORE, 1000, 1000 + 51863 - 50256]
    kept = columns != IGNORE
    assert torch.equal(heads.proposal_ids(columns[kept]), ids[kept])
    states = torch.randn(2, 384)
    embedding = torch.randn(51864, 384)
    logits = heads.proposal_logits(states, embedding)
    assert logits.shape == (2, heads.proposal_size)
    full = states @ embedding.T
    assert torch.allclose(logits, full[:, heads.proposal_ids(torch.arange(heads.proposal_size))], atol=1e-4)


def test_the_trainer_scores_heads_over_the_same_proposal_columns(base):
    trainer = HeadsTrainer(base, TrainConfig(num_heads=2, proposal_vocab=1000))
    for p in trainer.heads.parameters():
        torch.nn.init.normal_(p, std=0.05)  # not the identity, so that a head mix-up would show
    states = torch.randn(3, base.dims.n_text_state)
    for k in (1, 2):
        expected = trainer.heads.proposal_logits(trainer.heads.stacks[k - 1](states), trainer.embedding)
        assert torch.allclose(trainer.head_logits(states, k), expected, atol=1e-4)


def test_train_cli_reports_a_bad_csv_in_one_line(tmp_path, capsys):
    bad = tmp_path / "bad.csv"
    bad.write_text("path,sentence\nx.wav,hello\n")
    assert main(["train", "--data", str(bad), "--out", str(tmp_path / "h.pt")]) == 1
    err = capsys.readouterr().err.strip().splitlines()
    assert err == [f"medusa-whisper: error: {bad}: missing column 'audio' (has ['path', 'sentence'])"]


def test_train_cli_end_to_end_writes_a_loadable_heads_file(tmp_path, clips, capsys):
    data = tmp_path / "train.csv"
    with data.open("w", newline="") as f:
        writer = csv.writer(f)
        writer.writerow(["audio", "sentence", "language"])
        for c in clips:
            writer.writerow([str(c), "", "en"])
    out = tmp_path / "tiny.en-medusa.pt"
    argv = ["train", "--data", str(data), "--heldout", str(data), "--base", "tiny.en", "--num-heads", "2",
            "--epochs", "2", "--window-seconds", "8", "12", "--out", str(out), "--threads", "2"]
    assert main(argv) == 0
    heads = medusa_whisper.loading.load_heads(out)
    record = heads["record"]
    assert heads["medusa"]["num_heads"] == 2 and record["steps"] > 0
    assert record["cache"]["train"]["windows"] >= 2 and len(record["final"]["heldout"]["accuracy_per_head"]) == 2
    assert (out.with_suffix(".work") / "history.json").exists()
