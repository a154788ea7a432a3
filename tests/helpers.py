"""Shared builders for tests: small random models and real-weight models with heads."""

import torch
from whisper.model import ModelDimensions

from medusa_whisper import MedusaConfig, MedusaWhisper

# tiny's shape with a 4-layer decoder; random weights, so no download and fast to build
TINY_DIMS = ModelDimensions(n_mels=80, n_audio_ctx=1500, n_audio_state=384, n_audio_head=6, n_audio_layer=4,
                            n_vocab=51864, n_text_ctx=448, n_text_state=384, n_text_head=6, n_text_layer=4)


def randomize_heads(model: MedusaWhisper, std: float = 0.05, seed: int = 0) -> MedusaWhisper:
    """Give the heads random weights: their candidates are then mostly wrong, forcing rejections."""
    generator = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in model.medusa.stacks.parameters():
            p.copy_(torch.randn(p.shape, generator=generator) * std)
    return model


# a width of 64 and two layers: the properties tested on random weights (speculation equal to greedy,
# rollback, a batch row equal to its stream alone, whisper's rules) hold for any shape, and a pass
# costs a fraction of tiny's; the vocabulary stays whisper's (its tokenizer and rules need it)
SMALL_DIMS = ModelDimensions(n_mels=80, n_audio_ctx=1500, n_audio_state=64, n_audio_head=2, n_audio_layer=2,
                             n_vocab=51864, n_text_ctx=448, n_text_state=64, n_text_head=2, n_text_layer=2)


def random_model(config: MedusaConfig, seed: int = 0, dims: ModelDimensions = SMALL_DIMS) -> MedusaWhisper:
    """A small model (``dims``: SMALL_DIMS, or TINY_DIMS for tiny.en's shape) with random weights that says varied tokens.

    whisper leaves the positional embedding uninitialised (torch.empty), and with unit-variance token
    embeddings a random decoder just repeats its last input token; small embeddings avoid both.
    """
    torch.manual_seed(seed)
    model = MedusaWhisper(dims, config).eval()
    with torch.no_grad():
        model.decoder.token_embedding.weight.normal_(0, 0.05)
        model.decoder.positional_embedding.normal_(0, 0.05)
    if model.medusa.block is not None:
        model.medusa.init_block_from(model.decoder.blocks[-1])
    return model


def with_heads(base: MedusaWhisper, config: MedusaConfig) -> MedusaWhisper:
    """A copy of a loaded base model with fresh (identity) heads of the given configuration."""
    model = MedusaWhisper(base.dims, config)
    model.load_whisper_state_dict(base.state_dict())
    return model.to(base.device).eval()


def window_step(model, audio):
    """The package's decoder step over the CPU's products, for one window of encoder output ``audio``."""
    from medusa_whisper.step.cpu import cpu_step

    step = cpu_step(model, 1, audio.dtype, audio.device)
    step.set_audio(audio)
    return step


def feed(step, tokens, start, positions=None, mask=None):
    """Rows ``tokens`` written at slots [start, start + n): a chain at those positions unless
    ``positions`` and ``mask`` (n, start + n) say otherwise; their post-LayerNorm states (1, n, d)."""
    from medusa_whisper.step.attention import chain_mask

    n = len(tokens)
    positions = torch.arange(start, start + n) if positions is None else positions
    mask = chain_mask(start, n, "cpu") if mask is None else mask
    return step.pass_at(torch.tensor([list(tokens)]), positions, start, mask)


def tiered(cases, fast: int = 1, ids=None):
    """``cases`` as pytest parameters: the first ``fast`` run in the fast tier (``make test``), the
    rest in the slow tier (``make test-slow``), so that a check over many clips keeps one in the
    fast tier and loses none."""
    import pytest

    ids = ids or [str(i) for i in range(len(cases))]
    return [pytest.param(*(case if isinstance(case, tuple) else (case,)), id=name,
                         marks=() if i < fast else pytest.mark.slow)
            for i, (case, name) in enumerate(zip(cases, ids))]
