"""The host's acceptance: a candidate tree walked row by row with whisper's own filters.

A verification pass gives logits at the last accepted token and at every candidate node. The walk
starts at the root, filters the row it stands on as whisper filters each step (with that row's
path as its context; on the CPU whisper's own filters, cheaper for one row than ``rules.RulesFilter``), and moves to the first child the rule accepts: in ``lossless`` mode the
child whose token is the filtered argmax, in ``typical`` mode also a plausible one (the paper's
threshold), and past a lossy CTC draft's leading nodes without comparing them. It stops at the
first row that accepts no child, and keeps that row's own token (the bonus token).

Only the rows the walk reaches are filtered, so on the CPU a pass that offered 16 candidates and
kept one pays whisper's rules twice, not 17 times: the host's counterpart of the device's
acceptance (``rules.DeviceRules`` over every row, in ``loop``), used wherever a pass
runs uncaptured.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import List, Sequence

import torch
import torch.nn.functional as F
from torch import Tensor
from whisper.decoding import LogitFilter

from ..drafting.tree import CandidateTree
from ..options import MedusaDecodingOptions


class ExponentialDecayLengthPenalty(LogitFilter):
    """Raise the end-of-text logit by |l| * (factor**(n - start) - 1) after ``start`` sampled tokens.

    The reference implementation's ``exponential_decay_length_penalty=(start, factor)``; it makes
    long hallucinated tails less likely.
    """

    def __init__(self, eot: int, sample_begin: int, start: int, factor: float):
        self.eot, self.sample_begin, self.start, self.factor = eot, sample_begin, start, factor

    def apply(self, logits: Tensor, tokens: Tensor) -> None:
        excess = tokens.shape[1] - self.sample_begin - self.start
        if excess > 0:
            eot = logits[:, self.eot]
            # an end-of-text another rule forbade (-inf) stays forbidden: -inf + inf would be NaN,
            # which argmax takes for the largest
            logits[:, self.eot] = torch.where(eot.isfinite(), eot + eot.abs() * (self.factor**excess - 1), eot)


def _accepts(candidate: int, greedy: int, logprobs: Tensor, options: MedusaDecodingOptions) -> bool:
    if options.mode == "lossless" or candidate == greedy:
        return candidate == greedy
    # typical acceptance (paper eq. 3); the argmax always passes it, since max p >= exp(-H)
    probs = logprobs.exp()
    entropy = -torch.where(probs > 0, probs * logprobs, torch.zeros_like(probs)).sum()
    threshold = min(options.typical_epsilon, options.typical_alpha * float(torch.exp(-entropy)))
    return float(probs[candidate]) > threshold


def _accept_unverified(tree: CandidateTree, node: int, options: MedusaDecodingOptions) -> int:
    """LOSSY: the chain's next node, taken without comparing it with the verifier's token.

    Reached only for a tree with unverified nodes, which a proposer makes only when the caller set
    ``lossy_ctc_entropy``; checked here too, so that lossless decoding can never pass this way.
    """
    if options.lossy_ctc_entropy is None:
        raise RuntimeError("unverified candidates without the lossy_ctc_entropy option")
    return tree.children(node)[0]


@dataclass
class Verdict:
    tokens: List[int]  # accepted candidates, then the verifier's token unless stopped by a candidate
    logprob: float  # sum of the base log-probabilities of `tokens`
    path: List[int]  # the accepted candidates' nodes in the tree, root to leaf

    @property
    def n_accepted(self) -> int:
        return len(self.path)


def verify(
    logits: Tensor,
    tree: CandidateTree,
    context: List[int],
    filters: Sequence[LogitFilter],
    options: MedusaDecodingOptions,
    eot: int,
    max_tokens: int,
) -> Verdict:
    """Walk the tree from the root along accepted candidates and decide what to keep.

    logits     : shape = (len(tree) + 1, n_vocab), base logits at the last accepted token (row 0)
                 and at each node (row 1 + node); filtered here in place, as whisper filters each
                 step, but only along the walked path (each row with its own path as context)
    context    : all tokens so far (initial tokens included), what whisper's filters see
    max_tokens : stop after this many tokens (the sample-length and context limits)
    """
    kept: List[int] = []
    path: List[int] = []
    total = 0.0
    node, row = -1, 0
    while True:
        row_logits = logits[row : row + 1]
        prefix = torch.tensor([context + kept])
        for logit_filter in filters:
            logit_filter.apply(row_logits, prefix)
        logprobs = F.log_softmax(row_logits[0], dim=-1)
        greedy = int(row_logits[0].argmax())
        if (0 if node < 0 else tree.depths[node]) < tree.unverified:
            chosen = _accept_unverified(tree, node, options)
        else:
            # children are in the proposer's order of preference: the first acceptable one is taken
            chosen = next((child for child in tree.children(node)
                           if _accepts(tree.tokens[child], greedy, logprobs, options)), None)
        token = greedy if chosen is None else tree.tokens[chosen]
        kept.append(token)
        total += float(logprobs[token])
        if chosen is not None:
            path.append(chosen)
        if chosen is None or token == eot or len(kept) >= max_tokens:
            break
        node, row = chosen, 1 + chosen
    return Verdict(kept, total, path)
