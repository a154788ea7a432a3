"""whisper's logit filters for every row of a pass at once, on the logits' device, with no host read.

whisper's filters (``SuppressBlank``, ``SuppressTokens``, ``ApplyTimestampRules``) take one
sequence's tokens as a tensor and decide in Python: ``ApplyTimestampRules`` reads each sequence's
tokens back with ``tolist()`` and compares log-probabilities with ``if``. On a GPU every such read
waits for the device. ``DeviceRules`` decides the same things with tensor operations over a token
history buffer: row r of a pass sees ``history[:lengths[r]]`` as its context, so the rows of a
verified chain (each with the candidates before it as context) are filtered in one go, as
``decoding.verify`` filters them one at a time. The masked logits are whisper's, value for value.
"""

from __future__ import annotations

from typing import Optional, Sequence

import torch
import torch.nn.functional as F
from torch import Tensor
from whisper.decoding import ApplyTimestampRules, LogitFilter, SuppressBlank, SuppressTokens

NEG_INF = float("-inf")


class DeviceRules:
    """The filters of one decoding task, as masks over (batch, rows, n_vocab) logits."""

    def __init__(self, n_vocab: int, device, suppress: Sequence[int] = (), blank: Optional[Sequence[int]] = None,
                 sample_begin: int = 0, timestamps: Optional[dict] = None):
        """suppress   : tokens always suppressed (SuppressTokens, and <|notimestamps|> with timestamps)
        blank      : tokens suppressed at the first sampled position (SuppressBlank), or None
        timestamps : ApplyTimestampRules' settings (timestamp_begin, eot, max_initial), or None

        What varies from window to window (the suppressed tokens, where sampling begins, which
        initial timestamps are allowed) is held in tensors, which ``load`` overwrites in place, so
        that a captured graph that read them reads the next window's; what is fixed for a model
        and a set of options is ``key``."""
        vocab = torch.arange(n_vocab, device=device)
        self.vocab = vocab
        self.sample_begin = torch.tensor(sample_begin, device=device)
        self.always = torch.zeros(n_vocab, device=device)
        self.always[list(suppress)] = NEG_INF
        self.blank = None
        if blank is not None:
            self.blank = torch.zeros(n_vocab, dtype=torch.bool, device=device)
            self.blank[list(blank)] = True
        self.timestamps = timestamps
        self.last_initial = None
        if timestamps is not None:
            begin, max_initial = timestamps["timestamp_begin"], timestamps["max_initial"]
            self.is_timestamp = vocab >= begin
            self.is_text = vocab < timestamps["eot"]  # what may not follow a lone timestamp
            self.before_timestamps = vocab < begin
            if max_initial is not None:
                self.last_initial = torch.tensor(begin + max_initial, device=device)
        self.key = (n_vocab, blank is not None, None if timestamps is None else (
            timestamps["timestamp_begin"], timestamps["eot"], self.last_initial is not None))

    def load(self, other: "DeviceRules") -> None:
        """Take ``other``'s settings (of the same ``key``) into this one's tensors, in place."""
        if other.key != self.key:
            raise ValueError(f"rules of another structure: {other.key} against {self.key}")
        for mine, theirs in ((self.sample_begin, other.sample_begin), (self.always, other.always),
                             (self.blank, other.blank), (self.last_initial, other.last_initial)):
            if mine is not None:
                mine.copy_(theirs)

    @classmethod
    def of(cls, filters: Sequence[LogitFilter], n_vocab: int, device) -> Optional["DeviceRules"]:
        """The rules of whisper's filters (a DecodingTask's ``logit_filters``), or None when one of
        them is not whisper's own (its Python ``apply`` is then the only definition of what it does)."""
        suppress, blank, sample_begin, timestamps = [], None, None, None
        for f in filters:
            kind = type(f)
            if kind is SuppressTokens:
                suppress += f.suppress_tokens
            elif kind is SuppressBlank:
                blank = f.tokenizer.encode(" ") + [f.tokenizer.eot]
                sample_begin = f.sample_begin
            elif kind is ApplyTimestampRules:
                tokenizer = f.tokenizer
                if tokenizer.no_timestamps is not None:
                    suppress.append(tokenizer.no_timestamps)
                timestamps = dict(timestamp_begin=tokenizer.timestamp_begin, eot=tokenizer.eot,
                                  max_initial=f.max_initial_timestamp_index)
                sample_begin = f.sample_begin
            else:
                return None
        if sample_begin is None:
            sample_begin = 0  # neither filter that reads it is there
        return cls(n_vocab, device, suppress, blank, sample_begin, timestamps)

    def apply(self, logits: Tensor, history: Tensor, lengths: Tensor) -> Tensor:
        """Filter ``logits`` in place, as whisper's filters would for each row on its own; returns them.

        logits  : shape = (batch, rows, n_vocab), float
        history : shape = (batch, n), long: the tokens of each sequence (initial ones included)
        lengths : shape = (batch, rows), long: row r's context is history[b, :lengths[b, r]]; at least 1
        """
        logits.add_(self.always)
        sampled = lengths - self.sample_begin  # (batch, rows): tokens sampled before each row
        first = (sampled == 0)[..., None]
        if self.blank is not None:
            logits.masked_fill_(first & self.blank, NEG_INF)
        if self.timestamps is not None:
            self._timestamp_rules(logits, history, lengths, sampled, first)
        return logits

    def _timestamp_rules(self, logits: Tensor, history: Tensor, lengths: Tensor, sampled: Tensor,
                         first: Tensor) -> None:
        """ApplyTimestampRules.apply, for every row at once."""
        begin = self.timestamps["timestamp_begin"]
        last = history.gather(1, (lengths - 1).clamp(min=0))
        penultimate = history.gather(1, (lengths - 2).clamp(min=0))
        last_was = (sampled >= 1) & (last >= begin)
        penultimate_was = (sampled < 2) | (penultimate >= begin)
        # timestamps come in pairs, except directly before end-of-text
        logits.masked_fill_((last_was & penultimate_was)[..., None] & self.is_timestamp, NEG_INF)
        logits.masked_fill_((last_was & ~penultimate_was)[..., None] & self.is_text, NEG_INF)
        # no timestamp before the last one sampled (nor equal to it, unless it opens a pair)
        slots = torch.arange(history.shape[1], device=history.device)
        in_sample = (slots >= self.sample_begin) & (slots < lengths[..., None])  # (batch, rows, n)
        is_stamp = in_sample & (history[:, None, :] >= begin)
        latest = torch.where(is_stamp, slots, -1).amax(dim=-1)  # index of the last sampled timestamp
        stamp = history.gather(1, latest.clamp(min=0))
        bound = stamp + (~(last_was & ~penultimate_was)).long()
        below = self.is_timestamp & (self.vocab < bound[..., None])
        logits.masked_fill_((latest >= 0)[..., None] & below, NEG_INF)
        # the first sampled token is a timestamp, at most max_initial after the start
        logits.masked_fill_(first & self.before_timestamps, NEG_INF)
        if self.last_initial is not None:
            logits.masked_fill_(first & (self.vocab > self.last_initial), NEG_INF)
        # a timestamp when the timestamps together are more probable than any text token
        logprobs = F.log_softmax(logits.float(), dim=-1)
        stamps = logprobs[..., begin:].logsumexp(dim=-1)
        text = logprobs[..., :begin].amax(dim=-1)
        logits.masked_fill_((stamps > text)[..., None] & self.before_timestamps, NEG_INF)
