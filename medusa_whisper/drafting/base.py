"""The proposer seam: everything that drafts candidates implements these two calls.

The decoding loop (``loop.WindowDecoder``) does not know which proposer it has. Each step it
1. asks ``propose()`` for a ``CandidateTree`` (a chain is a tree with one branch),
2. verifies the tree in one decoder pass and keeps the longest greedy path plus the verifier's
   own next token,
3. tells the proposer what was committed (``commit``): the tokens now in the main model's cache,
   the main decoder's states at them, and the next token. The proposer rolls its own state back to
   match (its cache, its draft) and prepares the next proposal.

The first ``commit`` comes after the pass over the initial tokens, so ``propose`` is always called
after at least one ``commit``. As in transformers' ``CandidateGenerator`` (``get_candidates`` and
``update_candidate_strategy``), two methods are the whole interface.
"""

from __future__ import annotations

import time
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import List

from torch import Tensor

from .tree import CandidateTree


@dataclass
class Committed:
    """What one verification pass committed to the main model's cache."""

    tokens: List[int]  # the tokens fed this pass and kept: the pending ones, then the accepted candidates
    hidden: Tensor  # (1, len(tokens), n_state): the main decoder's post-LayerNorm states at them
    position: int  # position (== cache slot) of tokens[0]
    next_token: int  # the verifier's own token after them: fed, and committed, next pass
    n_accepted: int  # how many of ``tokens`` were candidates (they are its tail)
    n_proposed: int  # how many candidate nodes were verified
    # the verifier's argmax (before logit filters) at the last pending token (index 0) and at each
    # candidate node (1 + node), rejected ones included: what it would say after each of them
    predictions: List[int] = field(default_factory=list)

    @property
    def accepted(self) -> List[int]:
        return self.tokens[len(self.tokens) - self.n_accepted:]

    @property
    def end(self) -> int:
        """Committed slots after this pass: the next token's position."""
        return self.position + len(self.tokens)


@dataclass
class ProposerStats:
    proposed: int = 0  # candidate nodes verified
    accepted: int = 0  # of which accepted
    seconds: float = 0.0  # time spent proposing and committing (part of the decoder time)
    # accepted_per_depth[d]: steps in which a candidate at depth d+1 was accepted
    accepted_per_depth: List[int] = field(default_factory=list)


class Proposer:
    """Base class: bookkeeping and timing; subclasses implement ``_propose`` and ``_commit``."""

    def __init__(self):
        self.stats = ProposerStats()

    @contextmanager
    def _timed(self):
        began = time.perf_counter()
        try:
            yield
        finally:
            self.stats.seconds += time.perf_counter() - began

    def propose(self) -> CandidateTree:
        with self._timed():
            tree = self._propose()
        self.stats.proposed += len(tree)
        return tree

    def commit(self, committed: Committed) -> None:
        self.stats.accepted += committed.n_accepted
        per_depth = self.stats.accepted_per_depth
        per_depth.extend([0] * (committed.n_accepted - len(per_depth)))
        for d in range(committed.n_accepted):
            per_depth[d] += 1
        with self._timed():
            self._commit(committed)

    def _propose(self) -> CandidateTree:
        raise NotImplementedError

    def _commit(self, committed: Committed) -> None:
        raise NotImplementedError
