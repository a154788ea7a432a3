"""Speculative output equals vanilla greedy output, token for token.

Random-weight models make the checks fast and independent of downloads; the real tiny.en and base
weights on synthesised speech make them count. Random head weights force frequent rejections, so
the rollback path is exercised on every clip.
"""

import pytest
import soundfile
import torch
import whisper
from whisper.decoding import DecodingOptions

import medusa_whisper
from medusa_whisper import MedusaConfig, MedusaDecodingOptions, decode
from medusa_whisper.decoding.acceptance import ExponentialDecayLengthPenalty, _accepts

from helpers import SMALL_DIMS, TINY_DIMS, random_model, randomize_heads, with_heads

GREEDY = DecodingOptions(language="en", without_timestamps=True, fp16=False)


def mel_of(path, n_mels=80):
    audio, _ = soundfile.read(path, dtype="float32")
    return whisper.log_mel_spectrogram(whisper.pad_or_trim(torch.from_numpy(audio)), n_mels)


@pytest.fixture(scope="module")
def random_mel():
    torch.manual_seed(3)
    return torch.randn(80, 3000)


@pytest.mark.parametrize("heads_type", ["linear", "block"])
@pytest.mark.parametrize("mode", ["off", "lossless"])
def test_random_model_matches_whisper_decode(heads_type, mode, random_mel):
    model = randomize_heads(random_model(MedusaConfig(num_heads=4, heads_type=heads_type)))
    expected = whisper.decode(model, random_mel, GREEDY)
    result = decode(model, random_mel, GREEDY, mode=mode)
    assert result.tokens == expected.tokens
    assert result.text == expected.text
    assert result.avg_logprob == pytest.approx(expected.avg_logprob, abs=1e-4)
    assert result.no_speech_prob == pytest.approx(expected.no_speech_prob, abs=1e-5)
    # a random model never says end-of-text: both stop at whisper's sample_len of 224 tokens
    assert len(result.tokens) == 224
    if mode == "off":
        assert result.decoder_steps == result.tokens_produced
    else:
        assert result.decoder_steps <= result.tokens_produced
    if mode == "lossless" and heads_type == "linear":
        assert result.decoder_steps < result.tokens_produced  # some candidates were accepted


@pytest.mark.parametrize("dims", [SMALL_DIMS, pytest.param(TINY_DIMS, marks=pytest.mark.slow)], ids=["small", "tiny"])
@pytest.mark.parametrize("heads_type", ["linear", "block"])
def test_random_model_tree_matches_whisper_decode(heads_type, dims, random_mel):
    model = randomize_heads(random_model(MedusaConfig(num_heads=4, heads_type=heads_type), dims=dims))
    expected = whisper.decode(model, random_mel, GREEDY)
    chain = decode(model, random_mel, GREEDY)
    tree = decode(model, random_mel, GREEDY, tree_width=4, tree_nodes=12)
    assert tree.tokens == expected.tokens
    assert tree.avg_logprob == pytest.approx(expected.avg_logprob, abs=1e-4)
    assert tree.draft_proposed > chain.draft_proposed and tree.draft_accepted > 0  # more candidates per pass ...
    if dims is TINY_DIMS:  # ... and, where the tree holds the chain's path (these weights), never more passes
        assert tree.decoder_steps <= chain.decoder_steps


def test_base_head_lossless_equals_its_own_greedy(random_mel):
    """For base_head models the next-token logits come from head 0: lossless means equal to that."""
    model = randomize_heads(random_model(MedusaConfig(num_heads=3, heads_type="base_head")))
    off = decode(model, random_mel, GREEDY, mode="off")
    lossless = decode(model, random_mel, GREEDY, mode="lossless")
    assert lossless.tokens == off.tokens
    assert off.tokens != whisper.decode(model, random_mel, GREEDY).tokens  # head 0 really is used


def test_encoder_output_is_accepted_like_whisper_decode(random_mel):
    model = random_model(MedusaConfig(num_heads=2))
    features = model.encoder(random_mel[None])[0]
    from_mel = decode(model, random_mel, GREEDY)
    from_features = decode(model, features, GREEDY)
    assert from_features.tokens == from_mel.tokens
    assert from_features.encode_seconds < from_mel.encode_seconds


def test_batch_of_mels_returns_a_list(random_mel):
    model = random_model(MedusaConfig(num_heads=2))
    results = decode(model, torch.stack([random_mel, random_mel.flip(-1)]), GREEDY, sample_len=20)
    assert isinstance(results, list) and len(results) == 2
    assert results[0].tokens == decode(model, random_mel, GREEDY, sample_len=20).tokens


def test_sample_len_is_respected(random_mel):
    model = randomize_heads(random_model(MedusaConfig(num_heads=4)))
    result = decode(model, random_mel, GREEDY, sample_len=17)
    assert result.tokens == whisper.decode(model, random_mel, GREEDY, sample_len=17).tokens
    assert len(result.tokens) == 17


def test_bad_options_raise_value_error(random_mel):
    model = random_model(MedusaConfig(num_heads=2))
    with pytest.raises(ValueError, match="mode"):
        decode(model, random_mel, GREEDY, mode="fast")
    with pytest.raises(ValueError):
        decode(model, random_mel, GREEDY, regulation_start=10, regulation_factor=0.5)


def test_typical_acceptance_rule():
    options = MedusaDecodingOptions(mode="typical")
    peaked = torch.log_softmax(torch.tensor([5.0, 4.0, -3.0, -3.0]), dim=-1)
    assert _accepts(0, 0, peaked, options)  # the argmax always passes
    assert _accepts(1, 0, peaked, options)  # p = 0.27 > min(0.09, 0.3 * exp(-H))
    assert not _accepts(2, 0, peaked, options)  # p = 0.0002
    assert not _accepts(1, 0, peaked, MedusaDecodingOptions(mode="lossless"))


def test_length_penalty_raises_end_of_text_after_start():
    penalty = ExponentialDecayLengthPenalty(eot=3, sample_begin=2, start=4, factor=1.5)
    logits = torch.full((1, 5), -2.0)
    penalty.apply(logits, torch.zeros(1, 2 + 4, dtype=torch.long))  # 4 sampled: not yet
    assert logits[0, 3] == -2.0
    penalty.apply(logits, torch.zeros(1, 2 + 6, dtype=torch.long))  # 6 sampled: 2 past the start
    assert logits[0, 3] == pytest.approx(-2.0 + 2.0 * (1.5**2 - 1))
    assert logits[0, 0] == -2.0


# --- real weights, real speech -------------------------------------------------------------------


@pytest.fixture(scope="module")
def tiny_en():
    return medusa_whisper.load_model("tiny.en", device="cpu")


def _check_lossless_on_clips(base, clips, n_mels=80, timestamps=False, kinds=("untrained", "random", "block")):
    options = GREEDY if not timestamps else DecodingOptions(language="en", fp16=False)
    untrained = with_heads(base, MedusaConfig(num_heads=4))
    random_heads = randomize_heads(with_heads(base, MedusaConfig(num_heads=4)))
    block = randomize_heads(with_heads(base, MedusaConfig(num_heads=3, heads_type="block")))
    models = {"untrained": untrained, "random": random_heads, "block": block}
    for clip in clips:
        mel = mel_of(clip, n_mels)
        expected = whisper.decode(base, mel, options)
        assert len(expected.tokens) > 5, f"{clip.name}: the clip should hold speech"
        for name, model in [(name, models[name]) for name in kinds]:
            for mode in ["off", "lossless"]:
                result = decode(model, mel, options, mode=mode)
                assert result.tokens == expected.tokens, f"{clip.name}: {name} heads, {mode}"
                assert result.avg_logprob == pytest.approx(expected.avg_logprob, abs=1e-3)
            # candidate trees from the heads' top 3 tokens: the same output, through compaction
            result = decode(model, mel, options, tree_width=3, tree_nodes=8)
            assert result.tokens == expected.tokens, f"{clip.name}: {name} heads, tree"
        # untrained heads guess rarely, yet every step yields at least one token
        result = decode(untrained, mel, options)
        assert result.decoder_steps <= result.tokens_produced


def test_tiny_en_lossless_equals_whisper_greedy(tiny_en, clips):
    """Random heads (rejections, rollback every pass) and a random block on one clip; every kind of
    heads on every clip in the slow tier."""
    _check_lossless_on_clips(tiny_en, clips[:1], kinds=("random", "block"))


@pytest.mark.slow
def test_tiny_en_lossless_equals_whisper_greedy_on_every_clip(tiny_en, clips):
    _check_lossless_on_clips(tiny_en, clips)


@pytest.mark.slow  # the fast tier decodes with timestamps through every proposer (test_device_proposers)
def test_tiny_en_lossless_with_timestamps(tiny_en, clips):
    _check_lossless_on_clips(tiny_en, clips[:2], timestamps=True)


@pytest.mark.slow
def test_base_lossless_equals_whisper_greedy(clips):
    base = medusa_whisper.load_model("base", device="cpu")
    _check_lossless_on_clips(base, clips)


def test_transcribe_returns_whisper_dict_and_statistics(tiny_en, clips):
    audio, _ = soundfile.read(clips[0], dtype="float32")
    result = tiny_en.transcribe(audio, language="en", temperature=0.0)
    expected = whisper.transcribe(tiny_en, audio, language="en", temperature=0.0, fp16=False)
    assert result["text"] == expected["text"]
    assert [s["start"] for s in result["segments"]] == [s["start"] for s in expected["segments"]]
    stats = result["medusa"]
    assert stats["decoder_steps"] >= 1 and stats["tokens"] >= stats["decoder_steps"] * 0.99
    assert stats["encode_seconds"] > 0 and stats["decode_seconds"] > 0
