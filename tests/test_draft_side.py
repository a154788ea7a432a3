"""The draft model's side: its encoder over the window's audio only (drafting/draft_audio.py) and its
lookahead from measured costs (drafting/lookahead.py), with the output still the main model's greedy."""

from pathlib import Path

import numpy as np
import pytest
import torch
import whisper

import medusa_whisper
from medusa_whisper.audio.files import load_audio
from medusa_whisper.drafting import factory
from medusa_whisper.drafting.draft_audio import POSITION_STEP, content_frames, content_positions, encode_content
from medusa_whisper.drafting.lookahead import MAX_TOKENS, Lookahead
from medusa_whisper.step.compute import compute_type_of

DATA = Path(__file__).parent / "data"
JFK = DATA / "real" / "jfk.flac"

# a 2-core AVX2 EPYC's measured costs (base int8 verifying, tiny.en int8 drafting), in one-row passes
CPU_PASSES, CPU_STEP = (1.29, 1.68, 1.91, 2.4, 2.91, 3.3, 3.7, 4.1), 0.72
# a GPU's: extra rows nearly free, a draft step a tenth of a pass
FLAT_PASSES, FLAT_STEP = (1.02,) * MAX_TOKENS, 0.1


@pytest.fixture(scope="module")
def models():
    return medusa_whisper.load_model("base", device="cpu"), medusa_whisper.load_model("tiny.en", device="cpu")


def test_the_padding_is_found_whichever_way_the_window_was_padded():
    audio = load_audio(JFK)  # 11 s
    frames = len(audio) // whisper.audio.HOP_LENGTH
    silence_padded = whisper.log_mel_spectrogram(whisper.pad_or_trim(audio))  # whisper.decode's way
    zero_padded = whisper.pad_or_trim(whisper.log_mel_spectrogram(audio))  # transcribe's, for a short segment
    for mel in (silence_padded, zero_padded, silence_padded[None]):
        assert abs(content_frames(mel) - frames) <= 2
    assert content_positions(silence_padded, 1500) == 600  # 550.5 positions, rounded up to a second
    nothing = whisper.log_mel_spectrogram(torch.zeros(whisper.audio.N_SAMPLES))
    assert content_frames(nothing) == 0 and content_positions(nothing, 1500) == POSITION_STEP
    assert content_positions(torch.randn(80, 3000), 1500) == 1500


def test_over_a_full_window_the_draft_encoder_is_whispers(models):
    _, tiny = models
    audio = np.concatenate([load_audio(JFK)] * 3)[:whisper.audio.N_SAMPLES]  # 30 s of speech: no padding
    mel = whisper.log_mel_spectrogram(torch.from_numpy(audio))[None]
    with torch.no_grad():
        assert torch.equal(encode_content(tiny, mel), tiny.embed_audio(mel))
        short = encode_content(tiny, whisper.log_mel_spectrogram(whisper.pad_or_trim(load_audio(JFK)))[None])
    assert short.shape == (1, 600, tiny.dims.n_audio_state)


def test_a_chain_is_chosen_only_where_the_measured_costs_let_it_pay():
    cpu = Lookahead(CPU_PASSES, CPU_STEP)
    assert cpu.tokens() == 0  # a draft step costing 0.72 of a pass: no chain pays at the prior
    for _ in range(50):
        cpu.record(proposed=3, accepted=3)
    assert cpu.tokens() == 0  # nor were every token accepted
    flat = Lookahead(FLAT_PASSES, FLAT_STEP)
    first = flat.tokens()
    assert first >= 3  # from the prior alone
    for _ in range(20):
        flat.record(proposed=first, accepted=first)  # every token accepted: the chain grows to the longest
    assert flat.tokens() == MAX_TOKENS
    rejected = Lookahead(FLAT_PASSES, FLAT_STEP)
    for _ in range(30):
        rejected.record(proposed=4, accepted=0)  # nothing ever accepted: no chain pays any more
    assert rejected.tokens() == 0


def test_acceptance_is_counted_by_depth():
    lookahead = Lookahead(FLAT_PASSES, FLAT_STEP)
    lookahead.record(proposed=5, accepted=2)  # depths 1 and 2 accepted, depth 3 reached and rejected
    lookahead.record(proposed=2, accepted=2)  # both accepted: depth 3 never reached
    assert lookahead.reached[:4] == [2, 2, 1, 0]
    assert lookahead.accepted[:4] == [2, 2, 0, 0]


def _decode(main, draft, language="en", **options):
    mel = whisper.log_mel_spectrogram(whisper.pad_or_trim(load_audio(JFK)))
    return medusa_whisper.decode(main, mel, language=language, fp16=False, without_timestamps=True, draft=draft,
                                 **options)


@pytest.mark.parametrize("costs", [(CPU_PASSES, CPU_STEP), (FLAT_PASSES, FLAT_STEP)], ids=["cpu", "flat"])
def test_the_measured_lookahead_drafts_where_it_pays_and_the_output_stays_greedy(models, monkeypatch, costs):
    main, tiny = models
    monkeypatch.setattr(factory, "draft_model_costs", lambda model, draft, depths: (costs[0][:depths], costs[1]))
    greedy = _decode(main, None, mode="off")
    result = _decode(main, tiny)
    assert result.tokens == greedy.tokens
    if costs[1] == CPU_STEP:  # the draft rests: nothing encoded, nothing proposed
        assert result.draft_proposed == 0 and result.tokens_per_step == 1.0
    else:
        assert result.draft_proposed > 0 and result.tokens_per_step > 2.0


def test_an_english_only_draft_rests_for_another_language(models):
    main, tiny = models
    greedy = _decode(main, None, language="de", mode="off")
    result = _decode(main, tiny, language="de", draft_tokens=4)
    assert result.tokens == greedy.tokens and result.draft_proposed == 0


def test_the_costs_are_measured_once_per_pair_of_models(models, unpinned, monkeypatch):
    from medusa_whisper.drafting import pass_costs

    main, tiny = models
    timed = []
    real = pass_costs._draft_model_micros
    monkeypatch.setattr(pass_costs, "_draft_model_micros", lambda *a: timed.append(a) or real(*a))
    passes, step = pass_costs.draft_model_costs(main, tiny, 3)
    assert len(passes) == 3 and all(p > 0 for p in passes) and step > 0
    assert pass_costs.draft_model_costs(main, tiny, 3) == (passes, step) and len(timed) == 1


def test_a_pair_named_main_plus_draft_loads_the_main_model_with_that_draft():
    model = medusa_whisper.load_model("base+tiny.en", device="cpu", compute_type="int8")
    assert model.dims.n_text_state == 512 and model.draft_model.dims.n_text_state == 384
    assert compute_type_of(model) == compute_type_of(model.draft_model) == "int8"
