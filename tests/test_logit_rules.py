"""whisper's logit filters on the device (rules.DeviceRules) equal whisper's own, row by row."""

import pytest
import torch
from whisper.decoding import ApplyTimestampRules, SuppressBlank, SuppressTokens
from whisper.tokenizer import get_tokenizer

from medusa_whisper.decoding.rules import DeviceRules, RuleSettings


class Unknown(SuppressTokens):
    """A filter that is not one of whisper's own types: its apply() is the only definition."""


def _histories(tokenizer, generator, batch: int, n: int, sample_begin: int) -> torch.Tensor:
    """Token sequences that hit every branch of the timestamp rules: text, lone timestamps, pairs,
    timestamps that go back, end-of-text."""
    begin = tokenizer.timestamp_begin
    history = torch.randint(0, 5000, (batch, n), generator=generator)
    history[:, :sample_begin] = torch.tensor(list(tokenizer.sot_sequence) + [0] * sample_begin)[:sample_begin]
    stamps = torch.rand(batch, n, generator=generator) < 0.35
    history[stamps] = begin + torch.randint(0, 60, (int(stamps.sum()),), generator=generator)
    history[torch.rand(batch, n, generator=generator) < 0.03] = tokenizer.eot
    return history


@pytest.mark.parametrize("multilingual", [False, True])
@pytest.mark.parametrize("with_timestamps", [True, False])
def test_device_rules_equal_whisper_filters_row_by_row(multilingual, with_timestamps):
    tokenizer = get_tokenizer(multilingual, language="en" if multilingual else None, task="transcribe")
    n_vocab = 51865 if multilingual else 51864
    sample_begin = len(tokenizer.sot_sequence)
    filters = [SuppressBlank(tokenizer, sample_begin), SuppressTokens([1, 2, 7, 220, tokenizer.no_speech])]
    if with_timestamps:
        filters.append(ApplyTimestampRules(tokenizer, sample_begin, max_initial_timestamp_index=50))
    rules = DeviceRules.of(filters, n_vocab, "cpu")
    generator = torch.Generator().manual_seed(0)
    batch, rows, n = 24, 5, 40
    history = _histories(tokenizer, generator, batch, n, sample_begin)
    # contexts from empty (the first sampled token) to long; rows see the tokens before them
    lengths = torch.randint(sample_begin, n - rows, (batch, 1), generator=generator) + torch.arange(rows)
    lengths[:4] = sample_begin + torch.arange(rows)
    logits = torch.randn(batch, rows, n_vocab, generator=generator) * 3
    # rows where the timestamps together outweigh every text token, and rows where they do not
    logits[::3, :, tokenizer.timestamp_begin:] += 4.0
    expected = logits.clone()
    rules.apply(logits, history, lengths)
    branches = set()
    for b in range(batch):
        for r in range(rows):
            row = expected[b, r][None]
            context = history[b, :lengths[b, r]][None]
            for f in filters:
                f.apply(row, context)
            assert torch.equal(logits[b, r], row[0]), (b, r, context[0, sample_begin:].tolist())
            branches.add((bool(torch.isinf(row[0, :tokenizer.timestamp_begin]).all()),
                          bool(torch.isinf(row[0, tokenizer.timestamp_begin:]).all())))
    if with_timestamps:  # rows forced to a timestamp, rows forbidden one, and rows that may say either
        assert branches == {(True, False), (False, True), (False, False)}


def test_an_unknown_filter_is_left_to_the_eager_loop():
    tokenizer = get_tokenizer(False)
    assert DeviceRules.of([SuppressBlank(tokenizer, 1)], 51864, "cpu") is not None
    assert DeviceRules.of([SuppressBlank(tokenizer, 1), Unknown([1])], 51864, "cpu") is None


def test_reloaded_rules_equal_fresh_ones():
    """A captured graph keeps the tensors it read: loading another window's settings into them must
    give what rules made for that window give."""
    tokenizer = get_tokenizer(False)

    def filters(sample_begin, suppress):
        return [SuppressBlank(tokenizer, sample_begin), SuppressTokens(suppress),
                ApplyTimestampRules(tokenizer, sample_begin, max_initial_timestamp_index=50)]
    first = RuleSettings.of(filters(1, [1, 2]), 51864)
    second = RuleSettings.of(filters(7, [3, 220]), 51864)
    reused = DeviceRules(first, "cpu")
    reused.load(second)
    generator = torch.Generator().manual_seed(1)
    history = _histories(tokenizer, generator, 8, 30, 1)
    lengths = torch.randint(7, 25, (8, 1), generator=generator) + torch.arange(3)
    lengths[0] = torch.arange(7, 10)
    logits = torch.randn(8, 3, 51864, generator=generator)
    logits[::2, :, tokenizer.timestamp_begin:] += 4.0
    fresh = DeviceRules(second, "cpu").apply(logits.clone(), history, lengths)
    assert torch.equal(reused.apply(logits.clone(), history, lengths), fresh)
    assert not torch.equal(DeviceRules(first, "cpu").apply(logits.clone(), history, lengths), fresh)
    other_structure = RuleSettings.of(filters(7, [3])[:2], 51864)  # no timestamp rules
    with pytest.raises(ValueError, match="structure"):
        reused.load(other_structure)


def test_items_of_a_batch_keep_settings_of_their_own():
    """Windows side by side: each batch item filters with its own window's settings, and a pass over
    one item alone (``item=``) with that item's."""
    tokenizer = get_tokenizer(False)

    def settings(sample_begin, suppress):
        return RuleSettings.of([SuppressBlank(tokenizer, sample_begin), SuppressTokens(suppress),
                                ApplyTimestampRules(tokenizer, sample_begin, max_initial_timestamp_index=50)], 51864)
    mine = [settings(1, [1, 2]), settings(6, [3, 220])]
    batch = DeviceRules(mine[0], "cpu", batch=2)
    batch.load(mine[1], item=1)
    generator = torch.Generator().manual_seed(2)
    history = _histories(tokenizer, generator, 2, 30, 1)
    lengths = torch.tensor([[1, 2, 3], [6, 7, 8]])
    logits = torch.randn(2, 3, 51864, generator=generator)
    together = batch.apply(logits.clone(), history, lengths)
    for i in range(2):
        alone = DeviceRules(mine[i], "cpu").apply(logits[i:i + 1].clone(), history[i:i + 1], lengths[i:i + 1])
        assert torch.equal(together[i], alone[0])
        assert torch.equal(batch.apply(logits[i:i + 1].clone(), history[i:i + 1], lengths[i:i + 1], item=i), alone)
        # the item as a device value, as a captured prompt pass names it
        assert torch.equal(batch.apply(logits[i:i + 1].clone(), history[i:i + 1], lengths[i:i + 1],
                                       item=torch.tensor([i])), alone)


@pytest.mark.parametrize("multilingual", [False, True])
def test_the_rules_as_one_logit_filter_equal_whisper_filters_on_every_row(multilingual):
    """How the host's walk and whisper's DecodingTask (best_of, beams) apply the rules: whisper's
    filters (first) as one RulesFilter, every row of (rows, n_vocab) with its own tokens, and any
    filter that is not whisper's after it, as it is."""
    from medusa_whisper.decoding.acceptance import ExponentialDecayLengthPenalty
    from medusa_whisper.decoding.rules import RulesFilter, whisper_rules_first
    tokenizer = get_tokenizer(multilingual, language="en" if multilingual else None, task="transcribe")
    n_vocab = 51865 if multilingual else 51864
    sample_begin = len(tokenizer.sot_sequence)
    filters = [SuppressBlank(tokenizer, sample_begin), SuppressTokens([1, 2, 7, 220]),
               ApplyTimestampRules(tokenizer, sample_begin, max_initial_timestamp_index=50),
               ExponentialDecayLengthPenalty(tokenizer.eot, sample_begin, 3, 1.2)]
    ours = whisper_rules_first(filters, lambda whispers: DeviceRules.of(whispers, n_vocab, "cpu"))
    assert isinstance(ours[0], RulesFilter) and ours[1:] == filters[3:]
    assert whisper_rules_first([Unknown([1]), *filters], lambda w: DeviceRules.of(w, n_vocab, "cpu"))[0].__class__ is Unknown
    generator = torch.Generator().manual_seed(2)
    for n in range(sample_begin, sample_begin + 12):  # the first sampled token, then longer contexts
        tokens = _histories(tokenizer, generator, 6, n, sample_begin)  # six beams of one length
        logits = torch.randn(6, n_vocab, generator=generator) * 3
        logits[::2, tokenizer.timestamp_begin:] += 4.0
        expected = logits.clone()
        for f in ours:
            f.apply(logits, tokens)
        for r in range(6):
            row = expected[r:r + 1]
            for f in filters:
                f.apply(row, tokens[r:r + 1])
        assert torch.equal(logits, expected), n
        assert not logits.isnan().any()  # the penalty leaves a forbidden end-of-text forbidden
