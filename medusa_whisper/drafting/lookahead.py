"""How many tokens a draft model proposes a pass: the chain that makes a token cheapest here.

A chain of d draft tokens costs d steps of the draft model and one pass of the main model over 1 + d
rows, and gives 1 + (its accepted tokens) tokens. Both costs are measured on the running machine,
once per pair of models and compute types (``pass_costs.draft_model_costs``); the acceptance at each
depth is what the window has shown so far, from a prior of ``PRIOR`` a depth worth ``PRIOR_WEIGHT``
passes; the length is the EAGLE chain's rule (``chain_depth``), up to ``MAX_TOKENS``.

Where no chain pays at the prior, the draft rests for the window: it neither encodes the audio nor
proposes, and the window decodes as plain greedy; where the window's own acceptance makes every
chain lose, it rests from then on. On a 2-core AVX2 EPYC (base int8, tiny.en int8) a tiny.en step
costs 0.58-0.72 of base's one-row pass and base's pass over 2, 3, 4 and 6 rows 1.29, 1.68, 1.91 and
2.91 of it: a chain of 3 would pay 1 % were every draft token accepted, none at the prior.
"""

from __future__ import annotations

from typing import List, Sequence

from .device.eagle import chain_depth

MAX_TOKENS = 8  # the longest chain weighed
PRIOR = 0.8  # the share of draft tokens accepted at each depth, given the one before, before a window shows its own
PRIOR_WEIGHT = 2.0  # how many passes the prior counts for


class Lookahead:
    """The chain length of one window's draft-model proposals.

    pass_costs : the main model's pass over 1 + d rows for d = 1, 2, ..., in one-row passes
    step_cost  : one step of the draft model, in the main model's one-row passes
    """

    def __init__(self, pass_costs: Sequence[float], step_cost: float):
        self.pass_costs = tuple(pass_costs)
        depths = len(self.pass_costs)
        self.draft_costs = tuple(d * step_cost for d in range(1, depths + 1))  # a chain of d: d draft steps
        self.reached: List[int] = [0] * depths  # passes whose chain reached depth k + 1 with depth k accepted
        self.accepted: List[int] = [0] * depths  # of which the candidate at depth k + 1 was accepted

    def tokens(self) -> int:
        """The chain length that makes a token cheapest at the acceptance seen so far (0: none pays)."""
        shares, share = [], 1.0
        for reached, accepted in zip(self.reached, self.accepted):
            share *= (accepted + PRIOR * PRIOR_WEIGHT) / (reached + PRIOR_WEIGHT)
            shares.append(share)
        return chain_depth(shares, self.pass_costs, self.draft_costs)

    def record(self, proposed: int, accepted: int) -> None:
        """A pass verified a chain of ``proposed`` tokens and accepted its first ``accepted``."""
        for depth in range(min(accepted, len(self.reached))):
            self.reached[depth] += 1
            self.accepted[depth] += 1
        if accepted < min(proposed, len(self.reached)):
            self.reached[accepted] += 1
