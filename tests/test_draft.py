"""Draft-model speculative decoding: exact output with a same-tokenizer and a remapped draft.

The main model is ``base`` (multilingual tokenizer, 51,865 tokens). The drafts are ``base`` itself
(same tokenizer: the degenerate case, where nearly every proposal should be accepted; the draft
encodes the audio only, so not quite every one) and ``tiny.en``
(English-only tokenizer, 51,864 tokens: every text token and special token goes through the
mapping). Output must equal whisper.decode greedy on the main model token for token.
"""

from pathlib import Path

import numpy as np
import pytest
import whisper
from whisper.tokenizer import get_tokenizer

import medusa_whisper
from medusa_whisper.audio.files import load_audio
from medusa_whisper.drafting.base import Committed, ProposerStats
from medusa_whisper.drafting.draft_audio import encode_content
from medusa_whisper.drafting.draft_model import GROW_ABOVE, SHRINK_BELOW, Drafter, TokenMapping, token_mapping

DATA = Path(__file__).parent / "data"
ENGLISH = get_tokenizer(False)
MULTILINGUAL = get_tokenizer(True, num_languages=99, language="en", task="transcribe")


@pytest.fixture(scope="module")
def mapping():
    return token_mapping((False, 99), (True, 99)), token_mapping((True, 99), (False, 99))


def test_special_tokens_map_by_meaning_and_round_trip(mapping):
    to_main, to_draft = mapping
    pairs = [(ENGLISH.eot, MULTILINGUAL.eot), (ENGLISH.sot, MULTILINGUAL.sot), (ENGLISH.no_timestamps,
             MULTILINGUAL.no_timestamps), (ENGLISH.sot_prev, MULTILINGUAL.sot_prev),
             (ENGLISH.no_speech, MULTILINGUAL.no_speech), (ENGLISH.transcribe, MULTILINGUAL.transcribe)]
    pairs += [(ENGLISH.timestamp_begin + i, MULTILINGUAL.timestamp_begin + i) for i in (0, 1, 750, 1500)]
    for english, multilingual in pairs:
        assert english != multilingual, "the ids differ, so an id-based mapping would be wrong"
        assert to_main(english) == (multilingual,)
        assert to_draft(multilingual) == (english,)
    # every special token of the English tokenizer comes back to itself
    for name, token in ENGLISH.special_tokens.items():
        assert to_draft.sequence(to_main(token)) == [token], name


def test_text_tokens_keep_their_text_and_coverage_is_reported(mapping):
    to_main, to_draft = mapping
    coverage = to_main.coverage()
    assert coverage.tokens == ENGLISH.encoding.n_vocab and coverage.unmapped == 0
    assert coverage.one_to_one > 25000 and coverage.one_to_many > 0
    checked = 0
    for token in range(0, ENGLISH.eot, 7):
        data = ENGLISH.encoding.decode_single_token_bytes(token)
        mapped = to_main(token)
        assert mapped and all(t < MULTILINGUAL.eot for t in mapped)
        assert b"".join(MULTILINGUAL.encoding.decode_single_token_bytes(t) for t in mapped) == data
        checked += 1
    assert checked > 7000
    assert to_main(ENGLISH.encode(" hello")[0]) == tuple(MULTILINGUAL.encode(" hello"))


def test_same_tokenizer_is_the_identity():
    same = TokenMapping(MULTILINGUAL, get_tokenizer(True, num_languages=99))
    assert same.identity and same(12345) == (12345,) and same.coverage().unmapped == 0


def commit(drafter, kept, n_accepted, n_proposed):
    """What the decoding loop tells a proposer: ``kept`` is the accepted candidates, then the main's own token."""
    assert len(kept) == n_accepted + 1
    drafter.commit(Committed(tokens=kept[:n_accepted], hidden=None, position=0, next_token=kept[-1],
                             n_accepted=n_accepted, n_proposed=n_proposed))


def test_adaptive_lookahead_follows_the_acceptance_rate():
    drafter = Drafter.__new__(Drafter)  # only the bookkeeping of accept() is exercised
    drafter.adaptive, drafter.max_tokens, drafter.lookahead = True, 6, 3
    drafter.resting, drafter.measured = False, None
    drafter.length, drafter.context_length, drafter.pending = 0, 0, []
    drafter.drafted, drafter.mapped_lengths = [], []
    drafter.to_draft = TokenMapping(MULTILINGUAL, MULTILINGUAL)
    drafter.stats = ProposerStats()
    assert GROW_ABOVE > SHRINK_BELOW
    commit(drafter, [1, 2, 3, 4], n_accepted=3, n_proposed=3)  # all accepted: grow
    assert drafter.lookahead == 4
    commit(drafter, [1], n_accepted=0, n_proposed=4)  # none: shrink
    assert drafter.lookahead == 3
    commit(drafter, [1, 2, 3], n_accepted=2, n_proposed=4)  # half: stay
    assert drafter.lookahead == 3
    for _ in range(10):
        commit(drafter, [1, 2, 3, 4, 5, 6, 7], n_accepted=6, n_proposed=6)
    assert drafter.lookahead == 6  # bounded above
    for _ in range(10):
        commit(drafter, [9], n_accepted=0, n_proposed=2)
    assert drafter.lookahead == 1  # and below


@pytest.fixture(scope="module")
def base_with_drafts():
    main = medusa_whisper.load_model("base", device="cpu")
    return main, {"self": main, "tiny.en": medusa_whisper.load_model("tiny.en", device="cpu")}


# a real recording (public domain, see data/real/SOURCE.txt) and a synthetic one
DRAFT_CLIPS = [DATA / "real" / "jfk.flac", DATA / "espeak_weather.flac"]


@pytest.mark.slow
@pytest.mark.parametrize("draft_name", ["self", "tiny.en"])
@pytest.mark.parametrize("without_timestamps", [True, False], ids=["no-timestamps", "timestamps"])
def test_draft_decoding_equals_main_greedy(base_with_drafts, draft_name, without_timestamps):
    main, drafts = base_with_drafts
    draft = drafts[draft_name]
    per_step = []
    for clip in DRAFT_CLIPS:
        mel = whisper.log_mel_spectrogram(whisper.pad_or_trim(load_audio(clip)))
        options = dict(language="en", fp16=False, without_timestamps=without_timestamps)
        expected = whisper.decode(main, mel, whisper.DecodingOptions(**options))
        for adaptive in (False, True):
            # K given (or adaptive): the lookahead measured here may choose to draft nothing (test_draft_side)
            result = medusa_whisper.decode(main, mel, draft=draft, adaptive_lookahead=adaptive,
                                           draft_tokens=None if adaptive else 4, **options)
            assert result.tokens == expected.tokens, (clip.name, adaptive)
            assert result.text == expected.text
            assert result.avg_logprob == pytest.approx(expected.avg_logprob, abs=1e-4)
            assert result.draft_accepted <= result.draft_proposed
            per_step.append(result.tokens_per_step)
    # a draft that is the model itself proposes the model's own tokens: nearly all are accepted
    floor = 3.0 if draft_name == "self" else 1.5
    assert min(per_step) > floor, per_step


@pytest.mark.slow
def test_long_form_with_a_remapped_draft_equals_whisper_transcribe(base_with_drafts):
    main, drafts = base_with_drafts
    audio = np.concatenate([load_audio(p) for p in sorted(DATA.glob("*.flac"))] * 2)  # about 56 s: two windows
    expected = whisper.transcribe(main, audio, fp16=False, language="en", temperature=0.0)
    model = medusa_whisper.load_model("base", device="cpu", draft=drafts["tiny.en"])
    result = model.transcribe(audio, language="en", temperature=0.0, adaptive_lookahead=True)
    assert [(s["start"], s["end"], s["tokens"]) for s in result["segments"]] == \
        [(s["start"], s["end"], s["tokens"]) for s in expected["segments"]]
    stats = result["medusa"]
    assert stats["tokens_per_step"] > 1.5 and 0 < stats["draft_acceptance"] <= 1


def test_rolled_back_draft_cache_equals_a_fresh_cache_of_the_kept_tokens(clips):
    """Propose, have the main model keep only part, and compare the draft's cache with one fed only
    what was kept: same length, same keys and values (up to the rounding of other chunk sizes)."""
    import torch
    from whisper.decoding import DecodingOptions, DecodingTask

    from medusa_whisper.step.attention import chain_mask
    from medusa_whisper.step.cpu import cpu_step

    tiny = medusa_whisper.load_model("tiny.en", device="cpu")
    mel = whisper.log_mel_spectrogram(whisper.pad_or_trim(load_audio(clips[0])))[None]
    task = DecodingTask(tiny, DecodingOptions(language="en", fp16=False, without_timestamps=True))
    drafter = Drafter(tiny, mel, task, "en", max_tokens=4, adaptive=False)
    initial = list(drafter.pending)
    with torch.no_grad():
        first = list(drafter.propose().tokens)
        commit(drafter, first[:2], n_accepted=1, n_proposed=len(first))  # one accepted, then the main's own
        proposal = list(drafter.propose().tokens)
        assert len(proposal) == 4
        other = (proposal[2] + 1) % ENGLISH.eot  # the main model disagrees at the third token
        kept = proposal[:2] + [other]
        commit(drafter, kept, n_accepted=2, n_proposed=4)
        context = initial + first[:2] + proposal[:2]  # in the cache; `other` waits to be fed
        assert drafter.length == len(context) and drafter.pending == [other]

        fresh = cpu_step(tiny)
        fresh.set_audio(encode_content(tiny, mel))  # the draft encodes the clip's audio only
        n = len(context)
        fresh.pass_at(torch.tensor([context]), torch.arange(n), 0, chain_mask(0, n, "cpu"))
    for ours, theirs in ((drafter.step.keys, fresh.keys), (drafter.step.values, fresh.values)):
        torch.testing.assert_close(ours[..., :n, :], theirs[..., :n, :], atol=1e-4, rtol=1e-4)
