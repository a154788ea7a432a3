"""Greedy and lossless Medusa decoding on the device: one fixed-shape program per pass, captured
once as a CUDA graph and replayed, and one read by the host per pass.

``decoding._generate`` decides each pass on the host: it reads the logits' argmax, filters them
with whisper's Python filters, walks the candidate tree and asks the proposer for the next one,
so a pass on a GPU waits for the device several times and launches a few hundred kernels one by
one. Here one pass is a single function of buffers on the device (``FixedDecoder._pass``):

1. the pending token and the candidates are read from the token history at their positions;
2. ``step.FixedStep`` runs the decoder over them (keys and values written at those positions);
3. ``logit_rules.DeviceRules`` filters every row as whisper would, with its row's context;
4. the greedy tokens, their log-probabilities, and the number of candidates accepted (the longest
   prefix equal to the greedy tokens) are computed on the device; the greedy tokens go into the
   history, the length advances past the accepted ones and the verifier's own next token;
5. the Medusa heads propose the next candidates from the state at the last accepted token.

On CUDA each rows count's pass is captured once as a ``torch.cuda.CUDAGraph``; every pass then is
a replay and one copy to the host of what was accepted (which the host needs, to know when to
stop). Lossless: a candidate is kept only where it equals the filtered argmax, so the tokens are
the step's own greedy tokens; with a chain the rejected slots need no rollback, since the next
pass writes from the new length and each row reads only slots at or before its own position.

Used for greedy decoding (``mode="off"``, or a model without a proposer) and Medusa-Linear chains
on CUDA; anything else (trees, draft heads, draft models, typical acceptance, a filter that is not
whisper's) takes ``decoding._generate``. ``MEDUSA_WHISPER_STEP`` = ``fixed`` uses it on the CPU as
well (tests compare it there with the eager loop), ``eager`` never.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Callable, Dict, List, Optional, Sequence, Tuple

import torch
import torch.nn.functional as F
from torch import Tensor
from whisper.decoding import DecodingTask, LogitFilter

from .drafting.base import ProposerStats
from .logit_rules import DeviceRules, RuleSettings
from .step import FixedStep, UnsupportedStep, dense, linear

STEP_ENV = "MEDUSA_WHISPER_STEP"
STEP_CHOICES = ("auto", "fixed", "eager")


def step_choice() -> str:
    choice = os.environ.get(STEP_ENV, "auto")
    if choice not in STEP_CHOICES:
        raise ValueError(f"{STEP_ENV} must be one of {STEP_CHOICES}, got {choice!r}")
    return choice


def wanted(device: torch.device) -> bool:
    """Whether decoding on ``device`` should take the fixed-shape step (where it can)."""
    choice = step_choice()
    return choice == "fixed" or (choice == "auto" and device.type == "cuda")


@dataclass
class Generation:
    """What one window's decoding gives ``decoding.window_result`` (from either loop)."""

    tokens: List[int]
    sum_logprob: float
    no_speech_prob: float
    decoder_steps: int


class _Heads:
    """Medusa-Linear heads as fixed-shape tensors: head k's residual block, and the proposal
    vocabulary (the token ids heads may propose and their embedding rows)."""

    def __init__(self, heads, num_heads: int, vocabulary: Tensor):
        """vocabulary : the tied embedding in the products' dtype (``FixedStep.vocabulary``)"""
        dtype = vocabulary.dtype
        self.blocks: List[List[Tuple[Tensor, Optional[Tensor]]]] = [
            [dense(block.linear, dtype) for block in heads.stacks[k]] for k in range(num_heads)]
        self.ids = heads.proposal_token_ids().to(vocabulary.device)
        self.vocabulary = vocabulary[self.ids].contiguous()

    def propose(self, state: Tensor) -> Tensor:
        """(batch, n_state) decoder states at the last accepted token -> (batch, num_heads) token ids."""
        states = []
        for blocks in self.blocks:
            x = state
            for product in blocks:
                x = x + F.silu(linear(x, product))
            states.append(x)
        logits = torch.stack(states, dim=1).to(self.vocabulary.dtype) @ self.vocabulary.T
        return self.ids[logits.argmax(dim=-1)]


def _medusa_heads(model, options) -> Tuple[object, int]:
    """The model's Medusa heads and how many of them propose (0: none)."""
    if options.mode == "off":
        return None, 0
    heads = getattr(model, "medusa", None)
    num = 0 if heads is None else heads.num_heads
    if options.num_heads is not None:
        num = min(num, options.num_heads)
    return heads, num


def supported(model, options, draft=None) -> bool:
    """Whether the fixed-shape loop decodes what ``options`` ask of ``model`` (else the eager loop)."""
    if options.mode not in ("off", "lossless") or options.regulation_start is not None:
        return False
    if options.mode == "off":
        return True
    if draft is not None or getattr(model, "draft_head", None) is not None:
        return False  # draft models and draft heads propose on the host (decoding._generate)
    heads, num = _medusa_heads(model, options)
    if num == 0:
        return True
    return heads.config.heads_type == "linear" and options.tree_width == 1


class FixedDecoder:
    """The fixed-shape decoding of one model on one device, reused window after window.

    num_heads : Medusa heads proposing a chain of that many candidates per pass (0: greedy)
    capture   : capture each pass as a CUDA graph (CUDA only; the default there)
    """

    def __init__(self, model, residual: torch.dtype, device: torch.device, num_heads: int = 0,
                 capture: Optional[bool] = None):
        self.device = torch.device(device)
        self.step = FixedStep(model, 1, residual, self.device)
        self.num_heads = num_heads
        self.heads: Optional[_Heads] = None
        if num_heads:
            self.heads = _Heads(model.medusa, num_heads, self.step.vocabulary)
        self.capture = self.device.type == "cuda" if capture is None else capture
        if self.capture and self.device.type != "cuda":
            raise ValueError("CUDA graphs need a CUDA device")
        n_ctx = self.step.n_ctx
        # token history: position p's token at index p; the candidates go after the pending token
        self.history = torch.zeros(1, n_ctx + num_heads + 2, dtype=torch.long, device=self.device)
        self.length = torch.ones(1, dtype=torch.long, device=self.device)  # tokens so far, the pending one included
        self.candidates = torch.zeros(1, max(num_heads, 1), dtype=torch.long, device=self.device)
        self.offsets = torch.arange(num_heads + 1, device=self.device)
        self.rules: Dict[tuple, DeviceRules] = {}
        self.passes: Dict[Tuple[tuple, int], Tuple[Callable[[], None], Tensor]] = {}
        self.pool = torch.cuda.graph_pool_handle() if self.capture else None
        self.host_reads = 0  # copies from the device the loop waited for (tests count them)

    # ------------------------------------------------------------------ the pass on the device

    def _pass(self, rows: int, rules: DeviceRules, out: Tensor) -> None:
        """One verification pass of the pending token and ``rows - 1`` candidates; see the module."""
        k = rows - 1
        length = self.length
        positions = (length - 1)[:, None] + self.offsets[:rows]  # (1, rows): the pending token, then candidates
        if k:
            self.history.scatter_(1, positions[:, 1:], self.candidates[:, :k])
        tokens = self.history.gather(1, positions)
        hidden = self.step(tokens, positions)
        logits = self.step.logits(hidden)
        rules.apply(logits, self.history, positions + 1)  # row r's context: the tokens up to its own
        greedy = logits.argmax(dim=-1)  # (1, rows)
        logprobs = F.log_softmax(logits, dim=-1).gather(-1, greedy[..., None])[..., 0]
        if k:
            accepted = (self.candidates[:, :k] == greedy[:, :k]).long().cumprod(dim=-1).sum(dim=-1)
        else:
            accepted = torch.zeros_like(length)
        self.history.scatter_(1, positions + 1, greedy)  # accepted candidates equal these; the rest is overwritten
        self.length.add_(accepted + 1)
        if k and self.heads is not None:
            last = hidden.gather(1, accepted[:, None, None].expand(-1, 1, hidden.shape[-1]))[:, 0]
            self.candidates.copy_(self.heads.propose(last))
        out.copy_(torch.cat([accepted.double(), greedy[0].double(), logprobs[0].double()]))

    def _program(self, rows: int, rules: DeviceRules) -> Tuple[Callable[[], None], Tensor]:
        """The pass over ``rows`` rows as a callable (a graph's replay on CUDA) and its output buffer."""
        key = (rules.key, rows)
        if key not in self.passes:
            out = torch.zeros(1 + 2 * rows, dtype=torch.float64, device=self.device)
            run = lambda: self._pass(rows, rules, out)  # noqa: E731
            self.passes[key] = (self._captured(run) if self.capture else run, out)
        return self.passes[key]

    def _captured(self, run: Callable[[], None]) -> Callable[[], None]:
        """``run`` captured as a CUDA graph. Warming up runs it for real, so the state it advances
        (history, length, candidates) is put back afterwards; the cache slots it writes are at or
        after the pending token's, which the next pass writes again before any row reads them."""
        saved = [t.clone() for t in (self.history, self.length, self.candidates)]
        stream = torch.cuda.Stream(self.device)
        stream.wait_stream(torch.cuda.current_stream(self.device))
        with torch.cuda.stream(stream):
            for _ in range(2):  # kernels chosen and workspaces made outside the capture
                run()
        torch.cuda.current_stream(self.device).wait_stream(stream)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph, pool=self.pool):
            run()
        for mine, before in zip((self.history, self.length, self.candidates), saved):
            mine.copy_(before)
        self.graphs = getattr(self, "graphs", []) + [graph]  # kept alive with the decoder
        return graph.replay

    def _read(self, out: Tensor) -> List[float]:
        self.host_reads += 1
        return out.tolist()

    # ------------------------------------------------------------------ one window on the host

    def _rules(self, filters: Sequence[LogitFilter], n_vocab: int) -> Optional[DeviceRules]:
        """The device rules of ``filters``: one set of tensors per structure, reloaded in place."""
        settings = RuleSettings.of(filters, n_vocab)
        if settings is None:
            return None
        rules = self.rules.get(settings.key)
        if rules is None:
            rules = self.rules[settings.key] = DeviceRules(settings, self.device)
        else:
            rules.load(settings)
        return rules

    @torch.no_grad()
    def generate(self, task: DecodingTask, audio_features: Tensor, initial: List[int],
                 filters: Sequence[LogitFilter], stats: ProposerStats) -> Optional[Generation]:
        """Decode one window, as ``decoding._generate`` does; None when a filter is not whisper's."""
        rules = self._rules(filters, self.step.vocabulary.shape[0])
        if rules is None:
            return None
        eot, no_speech = task.tokenizer.eot, task.tokenizer.no_speech
        limit = min(task.sample_begin + task.sample_len, task.n_ctx + 1)  # whisper's two stopping rules
        self.step.set_audio(audio_features)
        first, no_speech_prob = self._prefill(initial, rules, task.sot_index, no_speech)
        tokens = list(initial) + [int(first[1])]
        sum_logprob, steps = first[2], 1
        while tokens[-1] != eot and len(tokens) < limit:
            room = min(limit - len(tokens) - 1, task.n_ctx - len(tokens))
            k = self.num_heads if room >= self.num_heads else 0
            run, out = self._program(k + 1, rules)
            run()
            values = self._read(out)
            steps += 1
            accepted = int(values[0])
            kept = 0
            for token, logprob in zip(values[1:2 + accepted], values[2 + k:3 + k + accepted]):
                tokens.append(int(token))
                sum_logprob += logprob
                kept += 1
                if token == eot or len(tokens) >= limit:
                    break
            _count(stats, k, min(accepted, kept))
        return Generation(tokens, sum_logprob, no_speech_prob, steps)

    def _prefill(self, initial: List[int], rules: DeviceRules, sot_index: int,
                 no_speech: Optional[int]) -> Tuple[List[float], float]:
        """The pass over the initial tokens (eager: their number changes with the prompt): the first
        sampled token, its log-probability, the no-speech probability, and the first candidates."""
        n = len(initial)
        self.history.zero_()
        self.history[0, :n] = torch.tensor(initial, device=self.device)
        positions = torch.arange(n, device=self.device)[None]
        hidden = self.step(self.history[:, :n], positions)
        logits = self.step.logits(hidden[:, [sot_index, n - 1]])
        speech = logits[:, 0].softmax(dim=-1)[:, no_speech] if no_speech is not None else logits.new_zeros(1)
        last = rules.apply(logits[:, 1:], self.history, positions[:, -1:] + 1)
        greedy = last.argmax(dim=-1)  # (1, 1)
        logprob = F.log_softmax(last, dim=-1).gather(-1, greedy[..., None])[..., 0]
        self.history[:, n] = greedy[:, 0]
        self.length.fill_(n + 1)
        if self.heads is not None:
            self.candidates.copy_(self.heads.propose(hidden[:, n - 1]))
        values = self._read(torch.cat([torch.zeros(1, device=self.device, dtype=torch.float64), greedy[0].double(),
                                       logprob[0].double(), speech.double()]))
        return values[:3], values[3] if no_speech is not None else float("nan")


def _count(stats: ProposerStats, proposed: int, accepted: int) -> None:
    """A pass's candidates in the proposer's statistics (accepted ones that were kept)."""
    stats.proposed += proposed
    stats.accepted += accepted
    depth = stats.accepted_per_depth
    depth.extend([0] * (accepted - len(depth)))
    for d in range(accepted):
        depth[d] += 1


def decoder_for(model, audio_features: Tensor, options) -> Optional[FixedDecoder]:
    """The model's fixed-shape decoder for these options and features (made once, kept on the
    model), or None where the eager loop must decode (``supported``, ``UnsupportedStep``)."""
    if not (wanted(audio_features.device) and supported(model, options)):
        return None
    _, num_heads = _medusa_heads(model, options)
    key = (audio_features.device, audio_features.dtype, num_heads)
    decoders = model.__dict__.setdefault("fixed_decoders", {})  # not a submodule: no state-dict entries
    if key not in decoders:
        try:
            decoders[key] = FixedDecoder(model, audio_features.dtype, audio_features.device, num_heads)
        except UnsupportedStep:
            decoders[key] = None
    return decoders[key]
