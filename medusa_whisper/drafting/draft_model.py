"""Draft-model speculative decoding: a small Whisper proposes, the main model verifies.

Seed 004 and the paper's "Whisper + Assistance" baseline. Each step the draft model, with its own
encoder pass, front end and rollback cache, proposes up to K tokens greedily; the main model verifies
them all in one decoder pass (the same ``verify`` as the Medusa heads), keeps the longest correct
prefix plus its own next token, and the draft's cache rolls back to what was kept. In ``lossless``
mode the output is the main model's greedy output, whatever the draft proposes.

**Cross-version remapping.** When the two tokenisers differ (an English-only draft for a
multilingual model, or versions with different special tokens) a ``TokenMapping`` translates:
- text tokens through their bytes: the same bytes as one token of the other vocabulary where it
  has one, else the other tokeniser's encoding of them, so one token may map to several (a draft
  token that maps to several main tokens is proposed as all of them);
- special tokens (end of text, start of transcript, languages, tasks, no-timestamps, timestamps)
  by name, i.e. by meaning, never by id.
Seed 004 keeps only the first token of a multi-token mapping and maps special tokens through text;
both lose proposals. The main model's verification keeps the output exact whatever the mapping does.

**Lookahead.** Where K is not given, it is the chain the measured costs choose (``lookahead.py``);
with ``adaptive_lookahead`` (seed 004, eq. 6) K grows by one after a step whose acceptance rate is
above 0.8 and shrinks by one below 0.3, within [1, max]; else it is the given K.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass, replace
from typing import Dict, List, Optional, Sequence, Tuple

import torch
from torch import Tensor
from whisper.decoding import DecodingTask
from whisper.tokenizer import Tokenizer

from ..step.cpu import cpu_step
from ..step.attention import chain_mask
from .base import Committed, Proposer
from .draft_audio import encode_content
from .lookahead import Lookahead
from .tree import CandidateTree

# seed 004's thresholds for growing and shrinking the lookahead
GROW_ABOVE, SHRINK_BELOW = 0.8, 0.3


@dataclass(frozen=True)
class MappingCoverage:
    tokens: int  # source-vocabulary tokens
    one_to_one: int
    one_to_many: int
    unmapped: int

    def as_dict(self) -> dict:
        return dict(tokens=self.tokens, one_to_one=self.one_to_one, one_to_many=self.one_to_many,
                    unmapped=self.unmapped, coverage=(self.tokens - self.unmapped) / self.tokens)


class TokenMapping:
    """Token ids of one Whisper tokeniser in another's vocabulary, built once per pair."""

    def __init__(self, source: Tokenizer, target: Tokenizer):
        self.source, self.target = source, target
        self.identity = _same_vocabulary(source, target)
        self._table: Optional[List[Tuple[int, ...]]] = None

    @property
    def table(self) -> List[Tuple[int, ...]]:
        if self._table is None:
            self._table = [] if self.identity else _build_table(self.source, self.target)
        return self._table

    def __call__(self, token: int) -> Tuple[int, ...]:
        """The target tokens of one source token; () when it has none."""
        if self.identity:
            return (token,)
        table = self.table
        return table[token] if 0 <= token < len(table) else ()

    def sequence(self, tokens: Sequence[int]) -> List[int]:
        return [t for token in tokens for t in self(token)]

    def coverage(self) -> MappingCoverage:
        if self.identity:
            n = self.source.encoding.n_vocab
            return MappingCoverage(n, n, 0, 0)
        sizes = [len(t) for t in self.table]
        return MappingCoverage(len(sizes), sizes.count(1), sum(s > 1 for s in sizes), sizes.count(0))


def _same_vocabulary(a: Tokenizer, b: Tokenizer) -> bool:
    return a.encoding.name == b.encoding.name and a.encoding.n_vocab == b.encoding.n_vocab


def _special_names(tokenizer: Tokenizer) -> Dict[int, str]:
    return {token: name for name, token in tokenizer.special_tokens.items()}


def _build_table(source: Tokenizer, target: Tokenizer) -> List[Tuple[int, ...]]:
    table: List[Tuple[int, ...]] = []
    source_specials = _special_names(source)
    target_specials = target.special_tokens  # name -> id
    for token in range(source.encoding.n_vocab):
        if token in source_specials:
            target_token = target_specials.get(source_specials[token])
            table.append(() if target_token is None else (target_token,))
            continue
        table.append(_map_bytes(source.encoding.decode_single_token_bytes(token), target))
    return table


def _map_bytes(data: bytes, target: Tokenizer) -> Tuple[int, ...]:
    encoding = target.encoding
    try:
        return (encoding.encode_single_token(data),)
    except KeyError:
        pass
    try:
        tokens = encoding.encode(data.decode("utf-8"), disallowed_special=())
    except UnicodeDecodeError:  # part of a multi-byte character: map the bytes themselves
        tokens = encoding._encode_bytes(data) if hasattr(encoding, "_encode_bytes") else []
    return tuple(t for t in tokens if t < target.eot)


@functools.lru_cache(maxsize=8)
def token_mapping(source_key: Tuple[bool, int], target_key: Tuple[bool, int]) -> TokenMapping:
    """The mapping between two tokenisers, built once per process (about a second) and reused."""
    from whisper.tokenizer import get_tokenizer

    source = get_tokenizer(source_key[0], num_languages=source_key[1])
    target = get_tokenizer(target_key[0], num_languages=target_key[1])
    return TokenMapping(source, target)


def tokenizer_key(model) -> Tuple[bool, int]:
    return (model.is_multilingual, model.num_languages)


class Drafter(Proposer):
    """The draft model's side of one decoding: its encoder output, cache, and proposals.

    It works in its own token ids; ``to_main`` and ``to_draft`` translate at the boundary. It encodes
    the window's audio only (``draft_audio``). With a ``Lookahead`` it proposes the chain the measured
    costs choose, and rests (no encoder pass, no proposals) where none pays on this machine; an
    English-only draft rests for other languages.
    """

    def __init__(self, draft, draft_mel: Tensor, main_task: DecodingTask, language: str,
                 max_tokens: int, adaptive: bool, measured: Optional[Lookahead] = None):
        super().__init__()
        self.measured = measured
        self.resting = (measured is not None and measured.tokens() == 0) or (
            not draft.is_multilingual and language not in (None, "en"))
        if self.resting:
            return
        with self._timed():  # its encoder pass is part of what drafting costs
            self.model = draft
            self.to_main = token_mapping(tokenizer_key(draft), tokenizer_key(main_task.model))
            self.to_draft = token_mapping(tokenizer_key(main_task.model), tokenizer_key(draft))
            options = main_task.options
            # the draft's own initial tokens: its start-of-transcript sequence, with the prompt and
            # prefix translated (whisper's DecodingTask builds it, so the rules are whisper's)
            draft_options = replace(
                options, language=language if draft.is_multilingual else "en",
                prompt=self._translated(options.prompt), prefix=self._translated(options.prefix))
            task = DecodingTask(draft, draft_options)
            self.eot = task.tokenizer.eot
            self.max_tokens, self.adaptive = max_tokens, adaptive
            self.lookahead = max_tokens
            features = self._features(draft, draft_mel)  # (1, positions, n_audio_state)
            self.step = cpu_step(draft, 1, features.dtype, features.device)
            self.step.set_audio(features)
            self.length = 0  # slots of the step's cache that hold kept tokens
            self.device = features.device
            self.context_length = 0
            self.n_ctx = draft.dims.n_text_ctx
            self.pending: List[int] = list(task.initial_tokens)
            self.drafted: List[int] = []  # this step's draft tokens
            self.mapped_lengths: List[int] = []  # how many main tokens each of them became

    @staticmethod
    def _features(draft, draft_mel: Tensor) -> Tensor:
        """The draft's encoder output over the window's audio (in the encoder's own dtype), or
        ``draft_mel`` where it is one already."""
        if draft_mel.shape[-1] == draft.dims.n_audio_state:
            return draft_mel
        return encode_content(draft, draft_mel)

    def _translated(self, tokens):
        if tokens is None or isinstance(tokens, str):
            return tokens
        return self.to_draft.sequence(tokens)

    def _propose(self) -> CandidateTree:
        """Up to K draft tokens, greedily, as main-model token ids (a draft token may give several)."""
        if self.resting:
            return CandidateTree()
        wanted = self.lookahead if self.measured is None else self.measured.tokens()
        if wanted == 0:  # at the acceptance this window has shown, no chain pays: decode plainly from here
            self.resting = True
            return CandidateTree()
        k = min(wanted, self.n_ctx - self.length - len(self.pending))
        self.drafted, self.mapped_lengths = [], []
        self.context_length = self.length
        if k <= 0 or not self.pending:
            return CandidateTree()
        proposal: List[int] = []
        inputs = self.pending
        for _ in range(k):
            start, n = self.length, len(inputs)
            hidden = self.step.pass_at(torch.tensor([inputs], device=self.device),
                                       torch.arange(start, start + n, device=self.device), start,
                                       chain_mask(start, n, self.device))
            self.length = start + n
            token = int(self.step.logits(hidden[0, -1:])[0].argmax())
            mapped = self.to_main(token)
            if not mapped:
                break  # no main-model token says this: stop proposing here
            self.drafted.append(token)
            self.mapped_lengths.append(len(mapped))
            proposal.extend(mapped)
            if token == self.eot:
                break
            inputs = [token]
        # the cache now holds the context, the old pending tokens and some of the drafted ones
        self.context_length += len(self.pending)
        self.pending = []
        return CandidateTree.chain(proposal)

    def _commit(self, committed: Committed) -> None:
        """The main model kept its accepted candidates, then its own token: roll back to match."""
        if self.resting:
            return
        kept = committed.accepted + [committed.next_token]
        n_accepted, n_proposed = committed.n_accepted, committed.n_proposed
        if self.measured is not None and n_proposed:
            self.measured.record(n_proposed, n_accepted)
        # draft tokens whose every main token was accepted stay
        whole, covered = 0, 0
        for length in self.mapped_lengths:
            if covered + length > n_accepted:
                break
            whole += 1
            covered += length
        in_cache = min(whole, self.length - self.context_length)
        self.length = self.context_length + in_cache  # the slots after it are written over
        self.pending = self.pending + self.drafted[in_cache:whole] + self.to_draft.sequence(kept[covered:])
        self.drafted, self.mapped_lengths = [], []
        if self.adaptive and n_proposed:
            rate = n_accepted / n_proposed
            if rate > GROW_ABOVE:
                self.lookahead = min(self.lookahead + 1, self.max_tokens)
            elif rate < SHRINK_BELOW:
                self.lookahead = max(self.lookahead - 1, 1)
