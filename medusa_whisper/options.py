"""The options of Medusa decoding: whisper's ``DecodingOptions`` plus how speculation is done.

Below every layer that reads them (decoding, the proposers' factory, the command line, evaluation),
so that none of them imports another for the options alone.
"""

from __future__ import annotations

from dataclasses import dataclass, fields, replace
from typing import Optional

from whisper.decoding import DecodingOptions

MODES = ("lossless", "typical", "off")
DRAFT_TOKENS = 5  # draft_tokens where it is not given and not chosen by the machine


@dataclass(frozen=True)
class MedusaDecodingOptions(DecodingOptions):
    # "lossless": accept a head's token only where it equals the verifier's argmax, so the output
    # equals vanilla greedy decoding; "typical": the paper's threshold rule; "off": no speculation
    mode: str = "lossless"
    # how many of the model's heads to use (None: all)
    num_heads: Optional[int] = None
    # typical acceptance: accept token x if p(x) > min(typical_epsilon, typical_alpha * exp(-H(p)))
    typical_epsilon: float = 0.09
    typical_alpha: float = 0.3
    # exponential-decay length penalty on end-of-text from this many sampled tokens on (None: off)
    regulation_start: Optional[int] = None
    regulation_factor: float = 1.01
    # draft tokens per step, at most: a draft model's, and the EAGLE head's chain (None: DRAFT_TOKENS,
    # except an EAGLE chain where the host accepts, whose length the running machine's costs choose:
    # drafting.pass_costs.chosen_chain_depth); with a draft model, whether that number adapts to the
    # acceptance rate (seed 004's rule)
    draft_tokens: Optional[int] = None
    adaptive_lookahead: bool = False
    # candidate trees: each drafted position offers its `tree_width` best tokens (1: a chain) and
    # at most `tree_nodes` candidates are verified per pass (None: the proposer's default)
    tree_width: int = 1
    tree_nodes: Optional[int] = None
    # LOSSY, never the default: with a CTC draft head, drafted tokens whose CTC frames all have an
    # entropy below this many nats are accepted without verification (None: every token is verified)
    lossy_ctc_entropy: Optional[float] = None


# the fields that choose and shape speculation, which the command line and eval take as arguments
# (their defaults come from here: this class is where they are declared)
SPECULATIVE_OPTIONS = ("mode", "num_heads", "draft_tokens", "adaptive_lookahead", "tree_width", "tree_nodes",
                       "lossy_ctc_entropy")
SPECULATIVE_DEFAULTS = {f.name: f.default for f in fields(MedusaDecodingOptions) if f.name in SPECULATIVE_OPTIONS}


def speculative_options(source) -> dict:
    """The speculative fields of ``source`` (options, parsed arguments: anything with those attributes)."""
    return {name: getattr(source, name) for name in SPECULATIVE_OPTIONS}


def verify_options(options: MedusaDecodingOptions) -> MedusaDecodingOptions:
    if options.mode not in MODES:
        raise ValueError(f"mode must be one of {MODES}, got {options.mode!r}")
    if options.num_heads is not None and options.num_heads < 0:
        raise ValueError("num_heads must be >= 0")
    if not (0 < options.typical_epsilon <= 1 and options.typical_alpha > 0):
        raise ValueError("typical_epsilon must be in (0, 1] and typical_alpha > 0")
    if options.regulation_start is not None and options.regulation_factor < 1:
        raise ValueError("regulation_factor must be >= 1")
    if options.draft_tokens is not None and options.draft_tokens < 1:
        raise ValueError("draft_tokens must be >= 1")
    if options.tree_width < 1 or (options.tree_nodes is not None and options.tree_nodes < 1):
        raise ValueError("tree_width and tree_nodes must be >= 1")
    if options.lossy_ctc_entropy is not None and not options.lossy_ctc_entropy > 0:
        raise ValueError("lossy_ctc_entropy must be > 0 (or None: lossless)")
    return options


def as_medusa_options(options: DecodingOptions, **overrides) -> MedusaDecodingOptions:
    """Accept whisper's DecodingOptions too; ``overrides`` as in ``dataclasses.replace``."""
    if not isinstance(options, MedusaDecodingOptions):
        options = MedusaDecodingOptions(**{f.name: getattr(options, f.name) for f in fields(DecodingOptions)})
    return verify_options(replace(options, **overrides) if overrides else options)
