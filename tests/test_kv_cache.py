"""The cache invariants on the decoder step: one verification pass equals token-by-token decoding,
and a cache whose speculated slots were rejected (written over from the kept length, or compacted
after a tree) equals a fresh cache fed only the accepted tokens."""

import pytest
import torch

from medusa_whisper import MedusaConfig
from medusa_whisper.step.attention import chain_mask
from medusa_whisper.step.projection import project
from medusa_whisper.drafting.base import Committed
from medusa_whisper.drafting.device.hosted import Hosted
from medusa_whisper.drafting.device.medusa import DeviceMedusa

from helpers import feed, random_model, window_step

TOKENS = [50257, 50362, 440, 1500, 286, 262, 3329, 318, 1016, 13, 383, 2068]


@pytest.fixture(scope="module")
def setup():
    model = random_model(MedusaConfig(num_heads=3, heads_type="block"))
    torch.manual_seed(1)
    audio = model.encoder(torch.randn(1, 80, 3000))
    return model, audio


def commit_to_block(proposer, hidden, start):
    """Tell a Medusa-Block proposer on the CPU's step that the rows ``hidden`` were committed at
    ``start``; the block's output at the last of them (what its heads read)."""
    proposer.commit(Committed(tokens=[0] * hidden.shape[1], hidden=hidden, position=start, next_token=0,
                              n_accepted=0, n_proposed=0))
    medusa = proposer.proposer
    slots = torch.arange(start + hidden.shape[1] - 1, start + hidden.shape[1])[None]
    # the last row again: it writes its slot's keys and values as they were, and reads the slots before
    return medusa.block(hidden[:, -1:], slots, medusa.slots <= slots[..., None])


def block_proposer(model, audio):
    """The Medusa-Block heads' proposer on the CPU's step, driven between passes as the CPU's loop drives it."""
    medusa = DeviceMedusa(model.medusa, window_step(model, audio), 3)
    return Hosted(medusa, audio, None, model.dims.n_text_ctx)


def filled(step, n):
    """The first n slots of a step's self-attention keys and values."""
    return step.keys[..., :n, :], step.values[..., :n, :]


@torch.no_grad()
def test_one_pass_over_a_chain_equals_one_token_at_a_time(setup):
    model, audio = setup
    batched = window_step(model, audio)
    h_all = feed(batched, TOKENS[:4], 0)
    h_chain = feed(batched, TOKENS[4:], 4)

    single = window_step(model, audio)
    h_single = torch.cat([feed(single, [token], i) for i, token in enumerate(TOKENS)], dim=1)

    torch.testing.assert_close(torch.cat([h_all, h_chain], 1), h_single, atol=1e-5, rtol=1e-5)
    logits_chain = project(model.decoder, h_chain)
    logits_single = project(model.decoder, h_single[:, 4:])
    torch.testing.assert_close(logits_chain, logits_single, atol=1e-4, rtol=1e-5)
    assert torch.equal(logits_chain.argmax(-1), logits_single.argmax(-1))


@torch.no_grad()
def test_medusa_block_sees_commits_in_pieces_as_one_token_at_a_time(setup):
    """The block proposer runs its block over what each pass committed: in chunks or one token at a
    time, its cache and its output at the last token are the same."""
    model, audio = setup
    hidden = feed(window_step(model, audio), TOKENS, 0)
    chunked = block_proposer(model, audio)
    for lo, hi in [(0, 4), (4, 5), (5, len(TOKENS))]:
        out_chunked = commit_to_block(chunked, hidden[:, lo:hi], lo)
    single = block_proposer(model, audio)
    for i in range(len(TOKENS)):
        out_single = commit_to_block(single, hidden[:, i : i + 1], i)
    n = len(TOKENS)
    blocks = chunked.proposer.block, single.proposer.block
    torch.testing.assert_close(blocks[0].keys[..., :n, :], blocks[1].keys[..., :n, :], atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(out_chunked, out_single, atol=1e-5, rtol=1e-5)
    assert len(chunked.propose()) == 3


@torch.no_grad()
def test_rolled_back_cache_equals_fresh_cache_of_accepted_tokens(setup):
    model, audio = setup
    accepted, rejected = TOKENS[:7], [9999, 8888, 7777]
    rolled = window_step(model, audio)
    feed(rolled, accepted[:4], 0)
    feed(rolled, accepted[4:] + rejected, 4)  # speculated 3 tokens too many: slots 7-9 hold them

    fresh = window_step(model, audio)
    feed(fresh, accepted, 0)

    n = len(accepted)
    for ours, theirs in zip(filled(rolled, n), filled(fresh, n)):
        torch.testing.assert_close(ours, theirs, atol=1e-5, rtol=1e-5)
    # and what follows is the same as well: the rejected slots are written over, never read
    torch.testing.assert_close(feed(rolled, [TOKENS[7]], n), feed(fresh, [TOKENS[7]], n), atol=1e-5, rtol=1e-5)
    assert not torch.allclose(rolled.keys[..., n + 1:n + 3, :], fresh.keys[..., n + 1:n + 3, :])  # the rejected


@torch.no_grad()
def test_compaction_keeps_scattered_accepted_slots(setup):
    model, audio = setup
    step = window_step(model, audio)
    step.keys[..., :10, :] = torch.arange(10.0)[:, None].to(step.keys.dtype)
    step.values[..., :10, :] = -torch.arange(10.0)[:, None].to(step.values.dtype)
    step.compact(keep=[5, 7, 9], start=5)  # a tree branch: slots 5, 7, 9 were accepted
    assert step.keys[0, 0, 0, :8, 0].tolist() == [0, 1, 2, 3, 4, 5, 7, 9]
    assert step.values[1, 0, -1, :8, 0].tolist() == [0, -1, -2, -3, -4, -5, -7, -9]


def test_a_pass_past_the_cache_refuses(setup):
    model, audio = setup
    step = window_step(model, audio)
    with pytest.raises(RuntimeError, match="overflow"):
        feed(step, [440, 1500], step.n_ctx - 1)


def test_chain_mask_is_lower_right_causal():
    mask = chain_mask(start=3, n=3, device="cpu")
    assert mask.tolist() == [
        [True, True, True, True, False, False],
        [True, True, True, True, True, False],
        [True, True, True, True, True, True],
    ]
    assert chain_mask(start=5, n=1, device="cpu") is None
