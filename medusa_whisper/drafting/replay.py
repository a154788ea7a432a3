"""Replay lossless decoding whose output is already known: how many passes would a proposer take?

Lossless speculative decoding outputs the greedy tokens whatever the proposer does; only the
number of decoder passes depends on it. When the greedy output of a window is known (the training
cache holds it), the verifier's verdict on any candidate chain is known too: the longest prefix
equal to the output, plus the next output token. So a proposer that needs nothing of the decoder's
states (the CTC draft) can be scored without running the decoder at all, exactly as the decoding
loop would drive it. Used for the held-out curve of CTC training and to choose draft settings.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import List, Sequence

import torch

from .base import Committed, Proposer
from .ctc_proposer import DraftSettings, pass_cost


@dataclass
class Replay:
    tokens: int  # output tokens, end of text included
    passes: int  # decoder passes, the first one (over the initial tokens) included
    cost: float  # sum of the passes' relative costs (a plain pass = 1)
    plain_cost: float  # the same for plain greedy decoding (one token per pass)
    proposed: int
    accepted: int


def replay(proposer: Proposer, initial: Sequence[int], output: Sequence[int], eot: int,
           settings: DraftSettings) -> Replay:
    """Drive ``proposer`` as the decoding loop (``loop.WindowDecoder``) would, with
    ``output`` as the verifier's greedy tokens.

    initial : the initial tokens (start-of-transcript sequence, prompt, prefix)
    output  : the sampled tokens, ending with ``eot`` (as the training cache stores them)
    settings: whose pass costs (``row_costs``, given or measured by ``for_model``) price the passes
    Chains only (unverified nodes, the lossy option, are not replayed).
    """
    empty = torch.zeros(1, 0, 0)
    proposer.commit(Committed(tokens=list(initial), hidden=empty, position=0, next_token=output[0],
                              n_accepted=0, n_proposed=0))
    position = len(initial)  # cache slots
    done = 1  # output tokens produced (output[done - 1] is fed next)
    passes, cost, proposed, accepted = 1, pass_cost(len(initial), settings), 0, 0
    while output[done - 1] != eot and done < len(output):
        tree = proposer.propose()
        if not tree.is_chain or tree.unverified:
            raise ValueError("replay scores chains of verified candidates only")
        chain = list(tree.tokens)
        k = 0
        while k < len(chain) and done + k < len(output) and chain[k] == output[done + k]:
            k += 1
            if output[done + k - 1] == eot:
                break
        passes += 1
        cost += pass_cost(1 + len(chain), settings)
        proposed += len(chain)
        accepted += k
        fed = [output[done - 1]] + chain[:k]
        if output[done + k - 1] == eot or done + k >= len(output):
            done += k
            break
        proposer.commit(Committed(tokens=fed, hidden=empty, position=position, next_token=output[done + k],
                                  n_accepted=k, n_proposed=len(chain)))
        position += len(fed)
        done += k + 1
    plain_cost = pass_cost(len(initial), settings) + done - 1
    return Replay(tokens=done, passes=passes, cost=cost, plain_cost=plain_cost, proposed=proposed, accepted=accepted)


def summarize(replays: List[Replay]) -> dict:
    tokens = sum(r.tokens for r in replays)
    passes = sum(r.passes for r in replays)
    cost = sum(r.cost for r in replays)
    plain = sum(r.plain_cost for r in replays)
    return dict(tokens_per_pass=round(tokens / max(passes, 1), 3),
                passes_per_window=round(passes / max(len(replays), 1), 2),
                # by the pass-cost table: the decoder's expected speedup over plain greedy passes
                speedup_over_plain=round(plain / max(cost, 1e-9), 3),
                acceptance=round(sum(r.accepted for r in replays) / max(sum(r.proposed for r in replays), 1), 3))
