"""The sampled fallback's draw (decoding/draws.py) is torch.multinomial's: the same tokens, the same
generator state after, so a seeded run writes what whisper's Categorical.sample would have drawn."""

import pytest
import torch
from whisper.decoding import GreedyDecoder

from medusa_whisper.decoding.candidates import SampledTokens
from medusa_whisper.decoding.draws import exact, multinomial_one

EOT = 50256


def _probabilities(rows: int, n: int, temperature: float, seed: int) -> torch.Tensor:
    """Softmax of logits at a temperature, with entries forbidden (-inf, as whisper's rules set them)."""
    generator = torch.Generator().manual_seed(seed)
    logits = torch.randn(rows, n, generator=generator)
    logits[:, torch.randperm(n, generator=generator)[: n // 3]] = float("-inf")
    return torch.softmax(logits / temperature, dim=-1)


def test_this_pytorch_draws_as_the_module_says():
    assert exact(), "draws.py's reading of exponential_ no longer holds here: multinomial_one falls back"


@pytest.mark.parametrize("rows,n,temperature", [(5, 51865, 0.2), (5, 51865, 1.0), (1, 1000, 0.6), (3, 7, 0.8)])
def test_the_draw_is_torch_multinomials_from_the_global_generator(rows, n, temperature):
    probs = _probabilities(rows, n, temperature, seed=rows * n)
    torch.manual_seed(1234)
    theirs = [torch.multinomial(probs, 1, True) for _ in range(4)]
    after_theirs = torch.get_rng_state()
    torch.manual_seed(1234)
    ours = [multinomial_one(probs) for _ in range(4)]
    assert all(torch.equal(a, b) for a, b in zip(theirs, ours))
    assert torch.equal(torch.get_rng_state(), after_theirs)
    assert len({tuple(t[:, 0].tolist()) for t in ours}) > 1, "draws that never vary would test nothing"


def test_probabilities_torch_would_reject_get_its_error():
    for bad in (torch.tensor([[0.5, float("nan")]]), torch.tensor([[0.0, 0.0]]), torch.tensor([[1.5, -0.5]])):
        with pytest.raises(RuntimeError) as theirs:
            torch.multinomial(bad, 1, True)
        with pytest.raises(RuntimeError) as ours:
            multinomial_one(bad)
        assert str(ours.value) == str(theirs.value)


def test_sampled_tokens_update_as_whispers_greedy_decoder_does():
    """Four sampled steps of five rows, one of them already ended: the same tokens, sums of
    log-probabilities, completion and generator state as whisper's GreedyDecoder."""
    generator = torch.Generator().manual_seed(7)
    tokens = torch.randint(0, EOT, (5, 4), generator=generator)
    tokens[2, -1] = EOT
    steps = [torch.randn(5, 51865, generator=generator) * 3 for _ in range(4)]
    results = []
    for decoder in (GreedyDecoder(0.6, EOT), SampledTokens(0.6, EOT)):
        torch.manual_seed(99)
        rows, sums, completed = tokens, torch.zeros(5), []
        for logits in steps:
            rows, done = decoder.update(rows, logits, sums)
            completed.append(bool(done))
        results.append((rows, sums, completed, torch.get_rng_state()))
    (rows, sums, completed, state), (our_rows, our_sums, our_completed, our_state) = results
    assert torch.equal(our_rows, rows) and torch.equal(our_sums, sums) and our_completed == completed
    assert torch.equal(our_state, state)
    assert (rows[2, 4:] == EOT).all() and sums[2] == 0  # the ended row stays ended and adds nothing


def test_greedy_updates_are_left_to_whisper():
    logits = torch.randn(3, 100)
    tokens = torch.zeros(3, 2, dtype=torch.long)
    theirs = GreedyDecoder(0.0, 99).update(tokens, logits, torch.zeros(3))[0]
    assert torch.equal(SampledTokens(0.0, 99).update(tokens, logits, torch.zeros(3))[0], theirs)
