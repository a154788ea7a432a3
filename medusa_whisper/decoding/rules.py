"""whisper's logit filters for every row of a pass at once, on the logits' device, with no host read.

whisper's filters (``SuppressBlank``, ``SuppressTokens``, ``ApplyTimestampRules``) take one
sequence's tokens as a tensor and decide in Python: ``ApplyTimestampRules`` reads each sequence's
tokens back with ``tolist()`` and compares log-probabilities with ``if``. On a GPU every such read
waits for the device. ``DeviceRules`` decides the same things with tensor operations over a token
history buffer: row r of a pass sees ``history[:lengths[r]]`` as its context, so the rows of a
verified chain (each with the candidates before it as context) are filtered in one go, as
``acceptance.verify`` filters them one at a time. The masked logits are whisper's, value for value.

``DeviceRules`` apply whisper's rules on the device's acceptance over every row of a pass, in the
batch loop over its items, and, as one of whisper's ``LogitFilter``s (``RulesFilter``, from
``whisper_rules_first``), in whisper's own ``DecodingTask`` for best_of candidates and beams (every
candidate's row at once, and on CUDA without the per-row reads of ``ApplyTimestampRules``). The
host's walk of a tree on the CPU keeps whisper's own filters: it filters one row at a time, and
one row costs about 80 small tensor operations here (measured on an Intel Xeon with AMX, 2
threads: 253 us a row against whisper's 130 us; at 5 rows 471 against 503 us).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import List, Optional, Sequence, Tuple, Union

import torch
import torch.nn.functional as F
from torch import Tensor
from whisper.decoding import ApplyTimestampRules, LogitFilter, SuppressBlank, SuppressTokens

NEG_INF = float("-inf")


@dataclass(frozen=True)
class RuleSettings:
    """What whisper's filters of one decoding task decide by, as plain values (no tensors)."""

    n_vocab: int
    suppress: Tuple[int, ...] = ()  # always suppressed (SuppressTokens, and <|notimestamps|> with timestamps)
    blank: Optional[Tuple[int, ...]] = None  # suppressed at the first sampled position (SuppressBlank)
    sample_begin: int = 0
    timestamp_begin: Optional[int] = None  # ApplyTimestampRules' settings; None without it
    eot: Optional[int] = None
    max_initial: Optional[int] = None

    @classmethod
    def of(cls, filters: Sequence[LogitFilter], n_vocab: int) -> Optional["RuleSettings"]:
        """The settings of whisper's filters (a DecodingTask's ``logit_filters``), or None when one of
        them is not whisper's own (its Python ``apply`` is then the only definition of what it does)."""
        suppress: List[int] = []
        fields = {}
        for f in filters:
            kind = type(f)
            if kind is SuppressTokens:
                suppress += f.suppress_tokens
            elif kind is SuppressBlank:
                fields.update(blank=tuple(f.tokenizer.encode(" ") + [f.tokenizer.eot]), sample_begin=f.sample_begin)
            elif kind is ApplyTimestampRules:
                tokenizer = f.tokenizer
                if tokenizer.no_timestamps is not None:
                    suppress.append(tokenizer.no_timestamps)
                fields.update(timestamp_begin=tokenizer.timestamp_begin, eot=tokenizer.eot,
                              max_initial=f.max_initial_timestamp_index, sample_begin=f.sample_begin)
            else:
                return None
        return cls(n_vocab, tuple(sorted(set(suppress))), **fields)

    @property
    def key(self) -> tuple:
        """What a captured graph depends on beyond the tensors ``DeviceRules.load`` rewrites."""
        return (self.n_vocab, None if self.blank is None else len(self.blank), self.timestamp_begin, self.eot,
                self.max_initial is not None)


WHISPER_FILTERS = (SuppressTokens, SuppressBlank, ApplyTimestampRules)


def _items(item: Union[int, slice, Tensor, None], t: Tensor) -> Tensor:
    """The rows of a per-item settings tensor ``t`` that ``DeviceRules.apply``'s ``item`` names, as
    (items, ...): a view for an int or a slice, a gather for a device tensor."""
    if isinstance(item, Tensor):
        return t.index_select(0, item)
    return t if item is None else t[item] if isinstance(item, slice) else t[item:item + 1]


def _forbid(condition: Tensor, like: Tensor) -> Tensor:
    """-inf where ``condition`` (a row's rule applies), else 0, in ``like``'s dtype: added to a range
    of logits, it forbids the range on those rows and leaves the others' values as they are."""
    return torch.where(condition, NEG_INF, 0.0).to(like.dtype)


class DeviceRules:
    """The filters of one decoding task, as masks over (batch, rows, n_vocab) logits.

    What may change from window to window (the suppressed tokens, where sampling begins, the last
    allowed initial timestamp) is held in tensors that ``load`` rewrites in place, so that a
    captured graph that reads them reads the next window's settings; the rest is ``key``.
    """

    def __init__(self, settings: RuleSettings, device, batch: int = 1):
        """batch : sequences side by side, each with settings of its own (``load(settings, item)``)
        and the same ``key``"""
        vocab = torch.arange(settings.n_vocab, device=device)
        self.vocab, self.key, self.batch = vocab, settings.key, batch
        self.sample_begin = torch.zeros(batch, dtype=torch.long, device=device)
        self.always = torch.zeros(batch, settings.n_vocab, device=device)
        # the blank tokens by index (two or so): filling them costs a few small operations, where a mask
        # over the vocabulary would cost a pass over it
        self.blank = None if settings.blank is None else torch.zeros(batch, len(settings.blank), dtype=torch.long,
                                                                      device=device)
        self.timestamps = settings.timestamp_begin is not None
        self.last_initial = None
        if self.timestamps:
            begin = settings.timestamp_begin
            self.begin = begin
            self.eot = settings.eot  # the text is what comes before it: it may not follow a lone timestamp
            self.stamp_index = vocab[begin:] - begin  # the timestamps, counted from the first
            # the last token and the one before it, read in one gather
            self.last_two = torch.tensor([1, 2], device=device)
            if settings.max_initial is not None:  # counted from the first timestamp, as stamp_index
                self.last_initial = torch.zeros(batch, dtype=torch.long, device=device)
        self.settings: List[Optional[RuleSettings]] = [None] * batch
        self.load(settings)

    @classmethod
    def of(cls, filters: Sequence[LogitFilter], n_vocab: int, device) -> Optional["DeviceRules"]:
        settings = RuleSettings.of(filters, n_vocab)
        return None if settings is None else cls(settings, device)

    def load(self, settings: RuleSettings, item: Optional[int] = None) -> None:
        """Take ``settings`` (of the same ``key``) into the tensors of batch item ``item`` (default:
        every item), in place. Only what changed is written, and scalars by ``fill_``: a new window
        costs no copy from the host unless its suppressed tokens differ."""
        if settings.key != self.key:
            raise ValueError(f"rules of another structure: {settings.key} against {self.key}")
        for i in range(self.batch) if item is None else (item,):
            old, self.settings[i] = self.settings[i], settings
            at = slice(i, i + 1)
            if old is None or old.sample_begin != settings.sample_begin:
                self.sample_begin[at].fill_(settings.sample_begin)
            if self.last_initial is not None and (old is None or old.max_initial != settings.max_initial):
                self.last_initial[at].fill_(settings.max_initial)
            if old is None or old.suppress != settings.suppress:
                self.always[i].zero_()
                self.always[i, list(settings.suppress)] = NEG_INF
            if self.blank is not None and (old is None or old.blank != settings.blank):
                self.blank[i].copy_(torch.tensor(settings.blank))

    def apply(self, logits: Tensor, history: Tensor, lengths: Tensor,
              item: Union[int, slice, Tensor, None] = None) -> Tensor:
        """Filter ``logits`` in place, as whisper's filters would for each row on its own; returns them.

        logits  : shape = (batch, rows, n_vocab), float
        history : shape = (batch, n), long: the tokens of each sequence (initial ones included)
        lengths : shape = (batch, rows), long: row r's context is history[b, :lengths[b, r]]; at least 1
        item    : the one batch item these are (a pass over that sequence alone; an int, or a (1,)
                  tensor on the device, which a captured pass reads), a slice of the items (a pass
                  over those), or None for all
        """
        sample_begin = _items(item, self.sample_begin)[:, None]  # (batch, 1)
        logits.add_(_items(item, self.always)[:, None, :])
        sampled = lengths - sample_begin  # (batch, rows): tokens sampled before each row
        first = (sampled == 0)[..., None]
        if self.blank is not None:
            blank = _items(item, self.blank)[:, None, :].expand(*logits.shape[:2], -1)  # (batch, rows, k)
            logits.scatter_(-1, blank, torch.where(first, NEG_INF, logits.gather(-1, blank)))
        if self.timestamps:
            last_initial = None if self.last_initial is None else _items(item, self.last_initial)[:, None, None]
            self._timestamp_rules(logits, history, lengths, sampled, first, sample_begin, last_initial)
        return logits

    def _timestamp_rules(self, logits: Tensor, history: Tensor, lengths: Tensor, sampled: Tensor,
                         first: Tensor, sample_begin: Tensor, last_initial: Optional[Tensor]) -> None:
        """ApplyTimestampRules.apply, for every row at once. Each rule masks a contiguous range of the
        vocabulary (the timestamps from ``begin``, the text before ``eot``, everything before the
        timestamps), so it fills a view of that range under a per-row condition, rather than the
        whole vocabulary under a (rows, n_vocab) mask; over the long ranges, by adding -inf or 0
        per row (``_forbid``: the same values, a quarter of a broadcast mask's time on the CPU).
        Every operation here is a kernel of a GPU pass (they cost about as much as the pass's
        products there), so what two rules share is computed once and constants are kept."""
        begin = self.begin
        stamps = logits[..., begin:]  # (batch, rows, timestamps): views, filled in place
        before = logits[..., :begin]
        batch, rows = lengths.shape
        back = (lengths[..., None] - self.last_two).clamp(min=0).view(batch, rows * 2)
        were = (history.gather(1, back) >= begin).view(batch, rows, 2)  # the last two tokens: timestamps?
        last_was = (sampled >= 1) & were[..., 0]
        penultimate_was = (sampled < 2) | were[..., 1]
        closing = last_was & ~penultimate_was  # a lone timestamp closes a segment: the text may not follow
        # timestamps come in pairs, except directly before end-of-text
        stamps.masked_fill_((last_was & penultimate_was)[..., None], NEG_INF)
        logits[..., :self.eot].add_(_forbid(closing[..., None], logits))
        # no timestamp before the last one sampled (nor equal to it, unless it opens a pair)
        n = history.shape[1]
        slots = self.stamp_index[:n] if n <= self.stamp_index.shape[0] else torch.arange(n, device=history.device)
        in_sample = (slots >= sample_begin[..., None]) & (slots < lengths[..., None])  # (batch, rows, n)
        is_stamp = in_sample & (history[:, None, :] >= begin)
        latest = torch.where(is_stamp, slots, -1).amax(dim=-1)  # index of the last sampled timestamp
        bound = history.gather(1, latest.clamp(min=0)) + (1 - begin) - closing.long()  # first allowed, from begin
        stamps.masked_fill_((latest >= 0)[..., None] & (self.stamp_index < bound[..., None]), NEG_INF)
        # the first sampled token is a timestamp, at most max_initial after the start
        before.add_(_forbid(first, logits))
        if last_initial is not None:
            stamps.masked_fill_(first & (self.stamp_index > last_initial), NEG_INF)
        # a timestamp when the timestamps together are more probable than any text token
        logprobs = F.log_softmax(logits.float(), dim=-1)
        together = logprobs[..., begin:].logsumexp(dim=-1)
        text = logprobs[..., :begin].amax(dim=-1)
        before.add_(_forbid((together > text)[..., None], logits))


class RulesFilter(LogitFilter):
    """``DeviceRules`` as one of whisper's ``LogitFilter``s: every row of ``logits`` (rows, n_vocab)
    filtered at once, each with its own row of ``tokens`` (rows, n) as its context."""

    def __init__(self, rules: DeviceRules):
        self.rules = rules

    def apply(self, logits: Tensor, tokens: Tensor) -> None:
        lengths = torch.full((tokens.shape[0], 1), tokens.shape[1], dtype=torch.long, device=tokens.device)
        self.rules.apply(logits[:, None, :], tokens, lengths)


def whisper_rules_first(filters: Sequence[LogitFilter], rules_of) -> List[LogitFilter]:
    """``filters`` with whisper's own (which a DecodingTask puts first) as one ``RulesFilter`` over
    ``rules_of(those filters)`` (a ``DeviceRules``, or None where it has none), and any others after
    it as they are, in their order. Unchanged where none of whisper's lead or ``rules_of`` gives None."""
    lead = 0
    while lead < len(filters) and type(filters[lead]) in WHISPER_FILTERS:
        lead += 1
    rules = rules_of(list(filters[:lead])) if lead else None
    return list(filters) if rules is None else [RulesFilter(rules), *filters[lead:]]
