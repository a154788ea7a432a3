"""The EAGLE draft head: training lowers the loss and resumes, its cache rolls back exactly, the
held-out replay is the decoder's own count, and decoding with it (chain and tree) is lossless on
real speech with and without timestamps."""

from dataclasses import replace

import pytest
import torch
import whisper

import medusa_whisper
from medusa_whisper import decode
from medusa_whisper.audio.files import load_audio
from medusa_whisper.drafting.base import Committed
from medusa_whisper.drafting.draft_head import draft_head_file
from medusa_whisper.drafting.device.eagle import DeviceEagle
from medusa_whisper.drafting.device.hosted import Hosted
from medusa_whisper.step.cpu import cpu_step
from medusa_whisper.training import eagle, features

from conftest import DATA
from helpers import tiered

QUICK = eagle.EagleTrainConfig(shortlist=2048, epochs=12, batch_windows=2, lr=2e-3, warmup_steps=2,
                               eval_every=1000, checkpoint_every=1000, simulate_windows=4)


@pytest.fixture(scope="module")
def tiny_en():
    return medusa_whisper.load_model("tiny.en", device="cpu")


@pytest.fixture(scope="module")
def shard(tiny_en_cache):
    return features.load_cache(tiny_en_cache)


@pytest.fixture(scope="module")
def trained(tiny_en, shard, tmp_path_factory):
    head, state = eagle.train(tiny_en, shard, shard, QUICK, tmp_path_factory.mktemp("eagle"))
    return head, state


def test_shortlist_is_the_most_frequent_labels(shard):
    counts = eagle.token_frequencies(shard, 51864)
    shortlist = eagle.choose_shortlist(counts, 50)
    assert counts[shortlist].tolist() == sorted(counts[shortlist].tolist(), reverse=True)
    assert int(counts[shortlist[-1]]) >= int(counts.sort(descending=True).values[50])
    eot = 50256
    assert eot in shortlist.tolist()  # every window ends with it


def test_a_short_training_run_lowers_the_held_out_loss(tiny_en, shard, trained):
    head, state = trained
    untrained = eagle.new_head(tiny_en, shard, QUICK)
    columns = torch.full((51864,), eagle.IGNORE, dtype=torch.long)
    columns[untrained.token_ids] = torch.arange(len(untrained.token_ids))
    before = eagle.evaluate(untrained, tiny_en, shard, columns, QUICK)
    after = state.history[-1]["heldout"]
    assert after["loss"] < before["loss"] - 0.5
    assert after["first_token_accuracy"] > before["first_token_accuracy"]
    assert after["tokens_per_step"] > before["tokens_per_step"]


def test_resuming_continues_at_the_same_step(tiny_en, shard, tmp_path):
    cfg = replace(QUICK, epochs=3, checkpoint_every=2)
    straight, _ = eagle.train(tiny_en, shard, None, cfg, tmp_path / "straight")
    eagle.train(tiny_en, shard, None, cfg, tmp_path / "split", max_steps=2)
    logs = []
    resumed, state = eagle.train(tiny_en, shard, None, cfg, tmp_path / "split", log=logs.append)
    assert logs == [f"resuming at step 2 of {state.step}"]
    for (name, a), (_, b) in zip(straight.state_dict().items(), resumed.state_dict().items()):
        torch.testing.assert_close(a, b, msg=name, rtol=0, atol=1e-6)
    with pytest.raises(ValueError, match="other settings"):
        eagle.train(tiny_en, shard, None, replace(cfg, lr=0.5), tmp_path / "split")


def test_a_heads_file_scores_as_the_trainer_scored_it(tiny_en, shard, trained, tmp_path):
    """tools.score_eagle (shipped heads against new runs on one held-out cache) reads a heads file
    back into the trainer's own evaluation: the same figures for the file as for the head in memory,
    and nearly the same for its half-precision shipped copy."""
    from medusa_whisper.loading import load_heads
    from tools.score_eagle import score

    head, _ = trained
    columns = torch.full((51864,), eagle.IGNORE, dtype=torch.long)
    columns[head.token_ids] = torch.arange(len(head.token_ids))
    cfg = replace(QUICK, simulate_windows=len(shard.tokens))
    direct = eagle.evaluate(head, tiny_en, shard, columns, cfg, eagle.feature_scale(shard))
    path = tmp_path / "tiny.en-eagle.pt"
    torch.save(draft_head_file(head, "tiny.en", {}), path)
    from_file = score(load_heads(path), tiny_en, shard, cfg.simulate_depth, None, cfg.batch_windows)
    for key in ("tokens_per_step", "first_token_accuracy", "accepted_at_depth", "windows", "loss"):
        assert from_file[key] == direct[key], key
    half = draft_head_file(head, "tiny.en", {})
    half["state_dict"] = {k: v.half() if v.is_floating_point() else v for k, v in half["state_dict"].items()}
    torch.save(half, path)
    shipped = score(load_heads(path), tiny_en, shard, cfg.simulate_depth, None, cfg.batch_windows)
    assert shipped["tokens_per_step"] == pytest.approx(direct["tokens_per_step"], abs=0.1)
    with pytest.raises(ValueError, match="not an EAGLE heads file"):
        score(dict(draft_head=dict(kind="ctc"), state_dict={}), tiny_en, shard)


@torch.no_grad()
def test_rolled_back_draft_cache_equals_a_fresh_one_of_the_committed_tokens(tiny_en, shard, trained):
    head, _ = trained
    tokens, begin = shard.tokens[0], shard.sample_begin[0]
    hidden = shard.hidden[: len(tokens)].float()[None]
    audio = shard.audio_features[:1].float()
    stepwise = eagle_proposer(head, tiny_en, audio)
    stepwise.commit(Committed(tokens[:begin], hidden[:, :begin], 0, tokens[begin], 0, 0))
    assert len(stepwise.propose()) == 6  # drafted rows written after the committed ones ...
    n = begin + 5
    stepwise.commit(Committed(tokens[begin:n], hidden[:, begin:n], begin, tokens[n], 2, 6))  # ... written over here

    fresh = eagle_proposer(head, tiny_en, audio)
    fresh.commit(Committed(tokens[:n], hidden[:, :n], 0, tokens[n], 0, 0))
    blocks = stepwise.proposer.block, fresh.proposer.block
    torch.testing.assert_close(blocks[0].keys[..., :n, :], blocks[1].keys[..., :n, :], atol=1e-5, rtol=1e-5)
    a, b = stepwise.propose(), fresh.propose()
    assert (a.tokens, a.parents) == (b.tokens, b.parents)


def eagle_proposer(head, model, audio):
    """The head's proposer on the CPU's step, driven between passes as the CPU's loop drives it."""
    return Hosted(DeviceEagle(head, cpu_step(model), depth=4, width=2, max_nodes=6), audio, None,
                  model.dims.n_text_ctx)


def test_replay_counts_what_decoding_counts(tiny_en, trained, tiny_en_cache, tmp_path, monkeypatch):
    """The held-out replay, fed the cached states, gives the tokens per step of real decoding of the
    same windows (up to the fp16 rounding of the cache)."""
    head, _ = trained
    shard = features.load_cache(tiny_en_cache)
    replay = eagle.simulate(head, tiny_en, shard, depth=5, windows=2)
    model = _with_head(head, tmp_path, monkeypatch)
    produced = steps = 0
    for r in range(2):
        meta = shard.meta[r]
        result = decode(model, shard.audio_features[r].float(), language="en", fp16=False,
                        without_timestamps=not meta["timestamps"])
        assert result.tokens == shard.tokens[r][shard.sample_begin[r]:-1]
        produced += result.tokens_produced
        steps += result.decoder_steps
    assert replay["tokens_per_step"] == pytest.approx(produced / steps, rel=0.1)


def _with_head(head, folder, monkeypatch):
    torch.save(draft_head_file(head, "tiny.en", {"test": True}), folder / "tiny.en-eagle.pt")
    monkeypatch.setenv("MEDUSA_WHISPER_HEADS_DIR", str(folder))
    model = medusa_whisper.load_model("tiny.en-eagle", device="cpu")
    assert model.draft_head is not None and model.draft_head.kind == "eagle"
    return model


CLIPS = [DATA / "real" / "jfk.flac", DATA / "espeak_weather.flac", DATA / "flite_recipe.flac"]


@pytest.mark.parametrize("speech", tiered([CLIPS[:1], CLIPS[1:]], ids=["real", "synthetic"]))
@pytest.mark.parametrize("without_timestamps", [True, False], ids=["no-timestamps", "timestamps"])
def test_eagle_decoding_is_lossless_on_real_speech(tiny_en, trained, tmp_path, monkeypatch, without_timestamps, speech):
    head, _ = trained
    model = _with_head(head, tmp_path, monkeypatch)
    for clip in speech:
        mel = whisper.log_mel_spectrogram(whisper.pad_or_trim(load_audio(clip)))
        options = dict(language="en", fp16=False, without_timestamps=without_timestamps)
        expected = whisper.decode(tiny_en, mel, whisper.DecodingOptions(**options))
        # a chain of a given length (the length chosen from this machine's costs may be 0: tested
        # below), and a tree
        for tree in (dict(draft_tokens=3), dict(tree_width=3, tree_nodes=8)):
            result = decode(model, mel, **options, **tree)
            assert result.tokens == expected.tokens, (clip.name, tree)
            assert result.avg_logprob == pytest.approx(expected.avg_logprob, abs=1e-3)
            assert result.draft_proposed > 0 and result.decoder_steps < result.tokens_produced


# what one Intel Xeon with AMX measured for base-eagle (2 threads; drafting.pass_costs, relative to
# a one-row pass), and what a captured GPU pass is like: rows and drafting nearly free
ACCEPTED = (0.567, 0.317, 0.167, 0.095, 0.049)  # base-eagle's held-out record
INT8_PASSES, INT8_CHAINS = (0.992, 1.028, 1.082, 1.187, 1.195), (0.228, 0.429, 0.563, 0.677, 0.86)
FLOAT32_PASSES, FLOAT32_CHAINS = (1.135, 1.286, 1.509, 1.548, 1.639), (0.252, 0.412, 0.564, 0.714, 0.85)
FLAT_PASSES, FLAT_CHAINS = (1.0, 1.0, 1.01, 1.01, 1.02), (0.01, 0.02, 0.03, 0.04, 0.05)
# what an AVX2-only AMD EPYC measured for base-eagle int8 (2 threads; python -m tools.bench
# eagle-chain, 2026-11-28): a second row costs 0.39 of a pass, so no chain beats plain decoding
AVX2_INT8_PASSES, AVX2_INT8_CHAINS = (1.387, 1.626, 1.817, 2.507, 2.812), (0.472, 0.482, 0.719, 0.876, 1.115)


def test_the_chain_is_as_long_as_makes_a_token_cheapest():
    from medusa_whisper.drafting.device.eagle import chain_depth

    assert chain_depth(ACCEPTED, INT8_PASSES, INT8_CHAINS) == 2  # a token 0.77 passes, against 0.93 at 5
    assert chain_depth(ACCEPTED, FLOAT32_PASSES, FLOAT32_CHAINS) == 1
    assert chain_depth(ACCEPTED, FLAT_PASSES, FLAT_CHAINS) == 5
    assert chain_depth(ACCEPTED[:3], FLAT_PASSES, FLAT_CHAINS) == 3  # no deeper than the record measured
    assert chain_depth(ACCEPTED, AVX2_INT8_PASSES, AVX2_INT8_CHAINS) == 0  # the best chain, 2: 1.12 passes a token
    assert chain_depth((0.5, 0.0), (1.5, 1.5), (0.0, 0.0)) == 0  # ties: the shorter chain, here none
    assert chain_depth((0.5, 0.0), (1.2, 1.2), (0.0, 0.0)) == 1


def test_where_no_chain_pays_the_eagle_head_drafts_nothing(monkeypatch):
    """Where the machine's costs choose no chain (length 0), decoding with the EAGLE head is plain
    greedy decoding with no drafting at all, and a CTC + EAGLE union drafts by its CTC part alone;
    both still give greedy decoding's tokens."""
    from medusa_whisper.drafting import factory
    from medusa_whisper.options import MedusaDecodingOptions

    monkeypatch.setattr(factory, "chosen_chain_depth", lambda m, head: 0)
    mel = whisper.log_mel_spectrogram(whisper.pad_or_trim(load_audio(DATA / "real" / "jfk.flac")))
    for name, drafts in (("tiny.en-eagle", False), ("tiny.en-ctc+eagle", True)):
        model = medusa_whisper.load_model(name, device="cpu")
        assert factory.host_spec(model, MedusaDecodingOptions()) is None
        expected = decode(model, mel, language="en", fp16=False, mode="off")
        result = decode(model, mel, language="en", fp16=False)
        assert result.tokens == expected.tokens, name
        assert (result.draft_proposed > 0) == drafts, name
        assert (result.decoder_steps < result.tokens_produced) == drafts, name
        given = decode(model, mel, language="en", fp16=False, draft_tokens=2)  # a length given is kept
        assert given.tokens == expected.tokens and given.draft_proposed > 0, name


def test_the_cpus_eagle_chain_takes_the_chosen_length_unless_one_is_given(monkeypatch):
    """Where the host accepts, an EAGLE chain's length is the one the machine's costs choose from
    the head's record (loaded from the heads file); a length the user gives, a tree, and the
    device's pass (CUDA) keep theirs."""
    from medusa_whisper.drafting import factory
    from medusa_whisper.options import DRAFT_TOKENS, MedusaDecodingOptions

    model = medusa_whisper.load_model("tiny.en-ctc+eagle", device="cpu")
    eagle_part = next(part for part in model.draft_head.parts if part.kind == "eagle")
    assert len(eagle_part.config.accepted_at_depth) >= 3  # from its heads file's record
    chosen = []
    monkeypatch.setattr(factory, "chosen_chain_depth", lambda m, head: chosen.append(head) or 3)
    options = MedusaDecodingOptions()
    assert factory.host_spec(model, options).depth == 3 and chosen == [eagle_part]
    assert factory.host_spec(model, replace(options, draft_tokens=4)).depth == 4
    assert factory.host_spec(model, replace(options, tree_width=2)).depth == DRAFT_TOKENS
    assert factory.device_spec(model, options).depth == DRAFT_TOKENS
    assert len(chosen) == 1
