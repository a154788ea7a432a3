"""The one decoding loop of a window, on every device: greedy and speculative decoding.

On CUDA a pass is one fixed-shape program, captured once as a CUDA graph and replayed, with one
read by the host per pass (or per group of passes). ``decoding``'s old host loop decided each pass
on the host: it read the logits' argmax, filtered them with whisper's Python filters, walked the
candidate tree and asked the proposer for the next one, so a pass on a GPU waited for the device
several times and launched a few hundred kernels one by one. Here one pass is a single function of
buffers on the device (``WindowDecoder._pass`` for a chain, ``_tree_pass`` for a tree):

1. the pending token and the candidates (the in-pass proposer's buffers) are put in the token
   history at their positions;
2. ``step.fixed.FixedStep`` runs the decoder over them (keys and values written at those positions);
3. ``rules.DeviceRules`` filters every row as whisper would, with its row's context;
4. the greedy tokens, their log-probabilities, and the number of candidates accepted (the longest
   prefix equal to the greedy tokens) are computed on the device; the greedy tokens go into the
   history, the length advances past the accepted ones and the verifier's own next token;
5. the proposer drafts the next candidates from what was committed (``drafting.device``: the
   Medusa heads from the state at the last accepted token, the EAGLE head's chain or tree, the CTC
   draft's next chunk, both draft heads merged into one tree).

Lossless: a candidate is kept only where it equals the filtered argmax, so the tokens are the
step's own greedy tokens; with a chain the rejected slots need no rollback, since the next pass
writes from the new length and each row reads only slots at or before its own position.

On the CPU the same loop and step run over the CPU's own products (``step.cpu.CpuProducts``: the
compute type's kernels, row-invariant attention over the written slots) with the host's acceptance
(``acceptance.verify``, ``_walk_window``): each pass's tree walked row by row, only the rows the
walk reaches filtered, which is cheaper there than every row at once, and which takes typical
acceptance, the lossy CTC shortcut, a ``base_head`` model's logits and any filter as they are, on
CUDA too (``decoder_for`` chooses). ``MEDUSA_WHISPER_STEP`` = ``fixed`` runs the fixed-shape step and
the device's acceptance on the CPU as well (tests compare them there), ``compiled`` compiles each
pass with inductor first, ``eager`` takes the CPU's products and the host's acceptance everywhere.
"""

from __future__ import annotations

import contextlib
import os
import time
from dataclasses import dataclass
from typing import Callable, Dict, List, Optional, Sequence, Tuple, Union

import torch
import torch.nn.functional as F
from torch import Tensor
from whisper.decoding import DecodingTask, LogitFilter

from .acceptance import verify
from ..drafting.base import Committed, Proposer, ProposerStats
from ..drafting.device.base import DeviceProposer, Shape
from ..drafting.factory import DeviceSpec, device_proposer, device_spec, host_spec
from ..drafting.tree import CandidateTree
from ..drafting.tree_layout import TreeLayout
from .rules import DeviceRules, RuleSettings
from ..options import MedusaDecodingOptions
from ..step.cpu import step_on
from ..step.fixed import supports as step_supports
from ..step.together import rows_together

MAX_NODES = 64  # the largest candidate tree a pass verifies (more nodes are left out)
COST_CONTEXT = 60  # cached tokens before the rows ``row_costs`` times: about the middle of a window's text
COST_ROUNDS = 3  # rounds of ``row_costs``; each rows count's fastest counts
PASSES_PER_READ = 4  # on CUDA: passes replayed back to back before the host reads them
STEP_ENV = "MEDUSA_WHISPER_STEP"
STEP_CHOICES = ("auto", "fixed", "compiled", "eager")


def step_choice() -> str:
    choice = os.environ.get(STEP_ENV, "auto")
    if choice not in STEP_CHOICES:
        raise ValueError(f"{STEP_ENV} must be one of {STEP_CHOICES}, got {choice!r}")
    return choice


def wanted(device: torch.device) -> bool:
    """Whether decoding on ``device`` should take the fixed-shape step (where it can)."""
    choice = step_choice()
    return choice in ("fixed", "compiled") or (choice == "auto" and device.type == "cuda")


def program(run: Callable[[], None], device: torch.device, state: Sequence[Tensor],
            graphs: List["torch.cuda.CUDAGraph"], compile: bool = True) -> Callable[[], None]:
    """A pass as what the decoding calls each time: ``run`` compiled by inductor first when
    ``MEDUSA_WHISPER_STEP=compiled`` and ``compile`` (fewer, fused kernels; the first call
    compiles), then on CUDA captured as a CUDA graph (its replay). The warm-up runs the pass for
    real, so ``state`` (what a pass advances) is put back afterwards; the cache slots it writes are
    at or after the pending token's, which the next pass writes again before any row reads them.
    The graph is appended to ``graphs``, which keep it alive."""
    if compile and step_choice() == "compiled":
        run = torch.compile(run, fullgraph=True, dynamic=False)
    if device.type != "cuda":
        return run
    saved = [t.clone() for t in state]
    stream = torch.cuda.Stream(device)
    stream.wait_stream(torch.cuda.current_stream(device))
    with torch.cuda.stream(stream):
        for _ in range(2):  # kernels chosen, workspaces made (and the compilation) outside the capture
            run()
    torch.cuda.current_stream(device).wait_stream(stream)
    graph = torch.cuda.CUDAGraph()
    # a memory pool of its own: a pass's tensors die within its replay, and graphs of several rows
    # counts replay in any order (a shared pool is safe only in capture order)
    with torch.cuda.graph(graph):
        run()
    for mine, before in zip(state, saved):
        mine.copy_(before)
    graphs.append(graph)
    return graph.replay


@dataclass
class Generation:
    """What one window's decoding gives ``decoding.window_result`` (from either loop)."""

    tokens: List[int]
    sum_logprob: float
    no_speech_prob: float
    decoder_steps: int


def supported(model, options) -> bool:
    """Whether the fixed-shape loop decodes what ``options`` ask of ``model`` (else the eager loop):
    greedy and lossless decoding with any proposer; not typical acceptance, the lossy CTC shortcut,
    the length penalty (not one of whisper's filters), nor a model whose next-token logits go
    through Medusa head 0 (``base_head``), which the step has not."""
    if options.mode not in ("off", "lossless") or options.regulation_start is not None:
        return False
    if options.lossy_ctc_entropy is not None:
        return False
    return step_takes(model)


def step_takes(model) -> bool:
    """Whether the fixed-shape step has ``model``'s decoder and next-token logits: not those of a
    model whose logits go through Medusa head 0 (``base_head``)."""
    heads = getattr(model, "medusa", None)
    return not (heads is not None and heads.has_base_head) and step_supports(model)


@dataclass
class Verdict:
    """What one pass gave the host: the tokens it commits (accepted candidates, then the verifier's
    own), their log-probabilities, the candidates it verified and how many it accepted."""

    tokens: List[float]
    logprobs: List[float]
    proposed: int
    accepted: int


class WindowDecoder:
    """The fixed-shape decoding of one model on one device, reused window after window.

    spec    : what drafts inside the pass (``drafting.factory.DeviceSpec``); None for plain passes
              or a host proposer handed to ``generate``. With the host's acceptance the proposer
              is built on this decoder's step and driven between passes by the host proposer
              handed to ``generate`` (``drafting.factory.make_proposer``'s ``in_pass``)
    capture : capture each pass as a CUDA graph (CUDA only; the default there)
    """

    def __init__(self, model, residual: torch.dtype, device: torch.device, spec: Optional[DeviceSpec] = None,
                 capture: Optional[bool] = None, products: str = "fixed", acceptance: str = "device"):
        self.device = torch.device(device)
        if products not in ("fixed", "cpu"):
            raise ValueError(f"products must be 'fixed' or 'cpu', not {products!r}")
        if acceptance not in ("device", "host") or (acceptance == "host" and products != "cpu"):
            raise ValueError(f"acceptance {acceptance!r}: 'device', or 'host' on the CPU's products")
        # how a pass's candidates are accepted: on the device, every row at once (what a captured
        # pass must do), or walked on the host row by row (acceptance.verify), which filters only
        # the rows it reaches and applies any filter and acceptance rule as it is
        self.acceptance = acceptance
        # the step's products: the fixed-shape ones (dense, every slot: what CUDA captures), or the
        # CPU's (its compute type's kernels, row-invariant attention over the written slots)
        self.step = step_on(products, model, 1, residual, self.device)
        self.spec = spec
        self.capture = self.device.type == "cuda" if capture is None else capture
        if self.capture and self.device.type != "cuda":
            raise ValueError("CUDA graphs need a CUDA device")
        n_ctx = self.step.n_ctx
        # token history: position p's token at index p; the candidates go after the pending token
        self.history = torch.zeros(1, n_ctx + MAX_NODES + 2, dtype=torch.long, device=self.device)
        self.length = torch.ones(1, dtype=torch.long, device=self.device)  # tokens so far, the pending one included
        self.node_index = torch.arange(MAX_NODES + 1, device=self.device)
        self.rules: Dict[tuple, DeviceRules] = {}
        self.passes: Dict[tuple, Tuple[Callable[[], None], Tensor]] = {}
        self.prompt_programs: Dict[tuple, Tuple[Callable[[], None], Tensor]] = {}  # per size (prompt_rows)
        self.graphs: List["torch.cuda.CUDAGraph"] = []
        self.trees: Dict[int, Tensor] = {}  # nodes -> a host proposer's packed tree (TreeLayout), on the device
        self.kept: Dict[int, Tensor] = {}  # nodes -> the states at the pending token and the accepted path
        self.staging: Dict[int, Tensor] = {}  # nodes -> the packed tree on the host (pinned on CUDA)
        self.prompt = PromptInput(2, n_ctx, self.device)  # the window's prompt: its length, sot's index, tokens
        self.prompt_states = torch.zeros(1, n_ctx, self.step.n_state, dtype=residual, device=self.device)
        self.host_reads = 0  # copies from the device the loop waited for (tests count them)
        # passes run before the host reads what they gave: on CUDA the host's wait and copy then
        # come once per group; on the CPU the passes run as they are called anyway
        self.passes_per_read = PASSES_PER_READ if self.capture else 1
        self.rings: Dict[tuple, Tensor] = {}  # (output buffer, group) -> the group's outputs
        self.proposer: Optional[DeviceProposer] = None if spec is None else device_proposer(spec, model, self.step)
        if self.proposer is not None and self.proposer.cost_rows:
            self.proposer.set_row_costs(self.row_costs(self.proposer.cost_rows))

    @property
    def drafts_in_pass(self) -> bool:
        """Whether ``proposer`` drafts inside the device's passes (else a host proposer drives it,
        or there is none)."""
        return self.acceptance == "device" and self.proposer is not None

    # ------------------------------------------------------------------ the pass on the device

    def _pass(self, rows: int, rules: DeviceRules, out: Tensor, drafting: bool = False,
              shape: Optional[Shape] = None) -> None:
        """One verification pass of the pending token and a chain of ``rows - 1`` candidates: the
        in-pass proposer's of ``shape``, advanced after it, when ``drafting``; see the module."""
        k = rows - 1
        length = self.length
        start = length - 1  # the pending token's position
        positions = start[:, None] + self.node_index[:rows]  # (1, rows): the pending token, then candidates
        candidates = self.proposer.candidates(shape) if k else None
        if k:
            self.history.scatter_(1, positions[:, 1:], candidates)
        tokens = self.history.gather(1, positions)
        hidden = self.step(tokens, positions)
        logits = self.step.logits(hidden)
        rules.apply(logits, self.history, positions + 1)  # row r's context: the tokens up to its own
        greedy = logits.argmax(dim=-1)  # (1, rows)
        logprobs = F.log_softmax(logits, dim=-1).gather(-1, greedy[..., None])[..., 0]
        if k:
            accepted = (candidates == greedy[:, :k]).long().cumprod(dim=-1).sum(dim=-1)
        else:
            accepted = torch.zeros_like(length)
        self.history.scatter_(1, positions + 1, greedy)  # accepted candidates equal these; the rest is overwritten
        if drafting:
            self.proposer.advance(hidden, self.history, start, accepted + 1, greedy, shape)
        length.add_(accepted + 1)
        # written in two parts, cast by the copies: every operation is a kernel a GPU pass replays
        out[:1 + rows].copy_(torch.cat([accepted, greedy[0]]))
        out[1 + rows:].copy_(logprobs[0])

    def _tree_pass(self, nodes: int, rules: DeviceRules, out: Tensor, drafting: bool = False,
                   shape: Optional[Shape] = None) -> None:
        """One verification pass of the pending token and a tree of ``nodes`` candidates: a host
        proposer's (``TreeLayout`` packs it into ``trees``), or when ``drafting`` the in-pass
        proposer's of ``shape`` (which is advanced after it). As ``acceptance.verify`` walks it, on the
        device. Node j sits at position L-1+depth(j) and slot L+j, sees the committed slots and its
        ancestors; the accepted path is the deepest node whose every ancestor's token equals the
        greedy token of its parent's row; its slots are moved to follow the pending token's, as
        ``compact`` does."""
        packed = self.proposer.layout(shape) if drafting else self.trees[nodes]
        layout = TreeLayout.unpack(packed, nodes)
        length, step = self.length, self.step
        rows = nodes + 1
        arange = self.node_index[:nodes]
        start = length - 1  # the pending token's position and slot
        positions = torch.cat([start, start + layout.depth])[None]  # (1, rows)
        node_slots = length + arange  # each node's own slot
        slots = torch.cat([start, node_slots])[None]
        committed = step.slots <= start  # (n_ctx,)
        own = torch.zeros(nodes, step.n_ctx, dtype=torch.bool, device=self.device)
        own.scatter_(1, node_slots.expand(nodes, nodes), layout.ancestors)  # ancestors' slots
        mask = torch.cat([committed[None], committed[None] | own])[None]  # (1, rows, n_ctx)
        tokens = torch.cat([self.history.gather(1, start[:, None])[0], layout.tokens])[None]
        hidden = step(tokens, positions, mask, slots)
        logits = step.logits(hidden)  # (1, rows, n_vocab)
        predictions = logits.argmax(dim=-1)[0]  # before the rules, for the proposer
        # each row's context: the history, then its path of candidates
        contexts = self.history.expand(rows, -1).clone()
        path_tokens = layout.tokens[layout.paths]  # (nodes, nodes): node j's path, root side first
        contexts[1:].scatter_(1, node_slots.expand(nodes, nodes), path_tokens)
        lengths = positions[0, :, None] + 1  # (rows, 1): each row's context ends with its own token
        logits = rules.apply(logits.view(rows, 1, -1), contexts, lengths).view(1, rows, -1)
        greedy = logits.argmax(dim=-1)[0]  # (rows,)
        logprobs = F.log_softmax(logits[0], dim=-1).gather(-1, greedy[:, None])[:, 0]
        fits = layout.valid & (layout.tokens == greedy[layout.parent_rows])
        on_path = ~((~fits)[None, :] & layout.ancestors).any(dim=-1)
        reach = torch.where(on_path, layout.depth, 0)
        accepted = reach.max().reshape(1)
        deepest = reach.argmax().reshape(1)
        path = layout.paths.index_select(0, deepest)[0]  # the accepted nodes in depth order, then unused
        path_rows = torch.cat([torch.zeros_like(accepted), 1 + path])  # (rows,)
        step.move_slots(node_slots, length + path)  # the accepted nodes' slots follow the pending token's
        committed_tokens = greedy[path_rows]  # the pending token's greedy token, then each accepted node's
        self.history.scatter_(1, (length + self.node_index[:rows])[None], committed_tokens[None])
        if drafting:  # rows past the deepest path are never committed
            depth = self.proposer.depth(shape)
            self.proposer.advance(hidden[:, path_rows[:1 + depth]], self.history, start, accepted + 1, greedy[None],
                                  shape)
        else:
            self.kept[nodes].copy_(hidden[:, path_rows])
        length.add_(accepted + 1)
        valid = layout.valid.sum().reshape(1)  # the candidates verified
        # written in three parts, cast by the copies (fewer kernels than a cast of each piece)
        out[:2 + rows].copy_(torch.cat([deepest, accepted, committed_tokens]))
        out[2 + rows:2 + 2 * rows].copy_(logprobs[path_rows])
        out[2 + 2 * rows:].copy_(torch.cat([predictions, valid]))

    def _program(self, rows: int, rules: DeviceRules, drafting: bool = False,
                 shape: Optional[Shape] = None) -> Tuple[Callable[[], None], Tensor]:
        """The chain pass over ``rows`` rows as a callable (a graph's replay on CUDA) and its output buffer."""
        key = (rules.key, "chain", rows, drafting, shape)
        if key not in self.passes:
            out = torch.zeros(1 + 2 * rows, dtype=torch.float64, device=self.device)
            run = lambda: self._pass(rows, rules, out, drafting, shape)  # noqa: E731
            self.passes[key] = (self._program_of(run), out)
        return self.passes[key]

    def _tree_program(self, nodes: int, rules: DeviceRules, drafting: bool = False,
                      shape: Optional[Shape] = None) -> Tuple[Callable[[], None], Tensor]:
        """The tree pass over ``nodes`` nodes (the in-pass proposer's of ``shape`` when ``drafting``,
        else a host tree) as a callable (a graph's replay on CUDA) and its output."""
        key = (rules.key, "tree", nodes, drafting, shape)
        if key not in self.passes:
            out = torch.zeros(3 + 3 * (nodes + 1), dtype=torch.float64, device=self.device)
            run = lambda: self._tree_pass(nodes, rules, out, drafting, shape)  # noqa: E731
            self.passes[key] = (self._program_of(run), out)
        return self.passes[key]

    def _program_of(self, run: Callable[[], None]) -> Callable[[], None]:
        if not self.capture and step_choice() != "compiled":
            return run
        state = [self.history, self.length] + (self.proposer.state() if self.proposer is not None else [])
        return program(run, self.device if self.capture else torch.device("cpu"), state, self.graphs)

    def _read(self, out: Tensor) -> List[float]:
        self.host_reads += 1
        return out.tolist()

    def row_costs(self, rows: Sequence[int]) -> Tuple[float, ...]:
        """What a pass over each of ``rows`` rows costs relative to one over ``rows[0]`` (``pass_seconds``)."""
        seconds = self.pass_seconds(rows)
        return tuple(round(seconds[n] / seconds[rows[0]], 3) for n in rows)

    @torch.no_grad()
    def pass_seconds(self, rows: Sequence[int], rounds: int = COST_ROUNDS) -> Dict[int, float]:
        """Seconds of this step's pass (decoder and vocabulary) over each of ``rows`` rows after
        COST_CONTEXT tokens, on CUDA captured as graphs (not compiled), timed on this device: the
        fastest of ``rounds`` interleaved rounds. Its keys and values land in slots that every window
        writes before reading."""
        step = self.step
        tokens = torch.zeros(1, max(rows), dtype=torch.long, device=self.device)
        positions = COST_CONTEXT + torch.arange(max(rows), device=self.device)[None].clamp(
            max=step.n_ctx - 1 - COST_CONTEXT)
        runs, graphs = {}, []  # the timing's graphs are freed with it
        for n in rows:
            run = lambda n=n: step.logits(step(tokens[:, :n], positions[:, :n]))  # noqa: E731
            runs[n] = program(run, self.device, [], graphs, compile=False) if self.capture else run
        timings = {n: float("inf") for n in rows}
        for n in rows:  # the first pass of a shape may choose kernels or allocate: untimed
            runs[n]()
        for _ in range(rounds):
            for n in rows:
                _synchronize(self.device)
                began = time.perf_counter()
                runs[n]()
                _synchronize(self.device)
                timings[n] = min(timings[n], time.perf_counter() - began)
        return timings

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
                 filters: Sequence[LogitFilter], stats: ProposerStats,
                 proposer: Optional[Proposer] = None,
                 options: Optional[MedusaDecodingOptions] = None) -> Optional[Generation]:
        """Decode one window; None when the device's acceptance meets a filter that is not whisper's.

        proposer : a proposer on the host (any of drafting/), whose trees each pass verifies; None
                   for this decoder's own in-pass proposer (``spec``), or plain greedy steps
        options  : how candidates are accepted (``mode``, typical acceptance's thresholds, a lossy CTC
                   draft's unverified nodes): the host's acceptance reads them; the device's is lossless
        """
        if self.acceptance == "host":
            return self._walk_window(task, audio_features, initial, filters, options or MedusaDecodingOptions(),
                                     proposer)
        rules = self._rules(filters, self.step.vocabulary.shape[0])
        if rules is None:
            return None
        eot, no_speech = task.tokenizer.eot, task.tokenizer.no_speech
        limit = min(task.sample_begin + task.sample_len, task.n_ctx + 1)  # whisper's two stopping rules
        self.step.set_audio(audio_features)
        drafting = proposer is None and self.proposer is not None
        if drafting:
            self.proposer.begin(audio_features, task.tokenizer)
        first, no_speech_prob, prompt_states = self._prefill(initial, rules, task.sot_index, no_speech, drafting,
                                                             keep=proposer is not None)
        tokens = list(initial) + [int(first[1])]
        sum_logprob, steps = first[2], 1
        if proposer is not None and tokens[-1] != eot and len(tokens) < limit:
            proposer.commit(Committed(tokens=list(initial), hidden=prompt_states, position=0, next_token=tokens[-1],
                                      n_accepted=0, n_proposed=0, predictions=[int(first[3])]))
        while tokens[-1] != eot and len(tokens) < limit:
            room = min(limit - len(tokens) - 1, task.n_ctx - len(tokens))
            if proposer is not None:
                tree = proposer.propose().truncated(max(room, 0))
                emitted, logprobs, commit = self._verify_tree(tree, rules, tokens)
                verdicts = [Verdict(emitted, logprobs, 0, 0)]  # counted by the proposer's own commit
            else:
                shape = self._shape(room, len(tokens)) if drafting else None
                drafting = shape is not None  # once nothing fits, the window ends with plain passes
                verdicts = self._verify(shape, rules, self._group(shape, room, len(tokens)))
                commit = None
            for verdict in verdicts:
                if tokens[-1] == eot or len(tokens) >= limit:
                    break  # the window ended in an earlier pass of the group: the rest ran for nothing
                steps += 1
                kept = 0
                for token, logprob in zip(verdict.tokens, verdict.logprobs):
                    tokens.append(int(token))
                    sum_logprob += logprob
                    kept += 1
                    if token == eot or len(tokens) >= limit:
                        break
                _count(stats, verdict.proposed, min(verdict.accepted, kept))
            if commit is not None and tokens[-1] != eot and len(tokens) < limit:
                proposer.commit(commit)
        return Generation(tokens, sum_logprob, no_speech_prob, steps)

    def _walk_window(self, task: DecodingTask, audio_features: Tensor, initial: List[int],
                     filters: Sequence[LogitFilter], options: MedusaDecodingOptions,
                     proposer: Optional[Proposer]) -> Generation:
        """The window with the host's acceptance: each pass over the pending tokens and the host
        proposer's tree, the tree walked row by row (``acceptance.verify``), the kept slots
        compacted (a tree) or simply written over by the next pass (a chain), the proposer told
        what was committed. The first pass is the window's prompt, with its rows together."""
        step, device = self.step, audio_features.device
        eot, no_speech = task.tokenizer.eot, task.tokenizer.no_speech
        step.set_audio(audio_features)
        tokens, pending, tree = list(initial), list(initial), CandidateTree()
        limit = min(task.sample_begin + task.sample_len, task.n_ctx + 1)  # whisper's two stopping rules
        start, steps, sum_logprob, no_speech_prob = 0, 0, 0.0, float("nan")
        while True:
            room = min(limit - len(tokens) - 1, task.n_ctx - start - len(pending))
            tree = tree.truncated(max(room, 0))
            positions, mask = tree.layout(start, len(pending), device)
            inputs = torch.tensor([pending + list(tree.tokens)], device=device)
            with rows_together() if steps == 0 else contextlib.nullcontext():
                hidden = step.pass_at(inputs, positions, start, mask)
            steps += 1
            if steps == 1 and no_speech is not None:
                no_speech_prob = float(step.logits(hidden[:, task.sot_index]).softmax(dim=-1)[0, no_speech])
            last = len(pending) - 1  # the row of the last accepted token
            logits = step.logits(hidden[0, last:])  # (1 + len(tree), n_vocab)
            # the verifier's own guess at every row, before filtering (beyond the accepted path too)
            predictions = logits.argmax(dim=-1).tolist() if proposer is not None else []
            verdict = verify(logits, tree, tokens, filters, options, eot, limit - len(tokens))
            tokens += verdict.tokens
            sum_logprob += verdict.logprob
            if tokens[-1] == eot or len(tokens) >= limit:
                break
            n_pending = len(pending)
            if tree.is_chain:  # the accepted nodes are a prefix: the next pass writes after them
                kept_hidden = hidden[:, :n_pending + verdict.n_accepted]
            else:
                rows = list(range(n_pending)) + [n_pending + node for node in verdict.path]
                step.compact([start + row for row in rows], start)
                kept_hidden = hidden[:, rows]
            if proposer is not None:
                accepted = [tree.tokens[node] for node in verdict.path]
                proposer.commit(Committed(tokens=pending + accepted, hidden=kept_hidden, position=start,
                                          next_token=tokens[-1], n_accepted=verdict.n_accepted,
                                          n_proposed=len(tree), predictions=predictions))
                tree = proposer.propose()
            start += n_pending + verdict.n_accepted
            pending = [tokens[-1]]
        return Generation(tokens, sum_logprob, no_speech_prob, steps)

    def _shape(self, room: int, length: int) -> Optional[Shape]:
        """The in-pass proposer's shape for the next pass, None where its proposal does not fit."""
        shape = self.proposer.next_shape(room)
        if shape is not None and self.proposer.nodes(shape) > min(MAX_NODES, self.step.n_ctx - length):
            return None
        return shape

    def _group(self, shape: Optional[Shape], room: int, length: int) -> int:
        """How many passes of ``shape`` run before the host reads what they gave: ``passes_per_read``
        where every one of them fits whatever the earlier ones accept (each advances at most
        depth + 1 tokens), else one. Passes after the window's end are harmless (it is over) and
        read for nothing."""
        group = self.passes_per_read
        if group <= 1:
            return 1
        depth = self.proposer.depth(shape) if shape is not None else 0
        nodes = self.proposer.nodes(shape) if shape is not None else 0
        growth = (group - 1) * (depth + 1)
        if room - growth < depth or length + growth + max(depth, nodes) + 1 > self.step.n_ctx:
            return 1
        return group

    def _verify(self, shape: Optional[Shape], rules: DeviceRules, group: int = 1) -> List["Verdict"]:
        """``group`` passes over the in-pass proposer's proposals of ``shape`` (None: plain passes
        without it), read by the host once: per pass, the tokens it gives (accepted candidates, then
        the verifier's own), their log-probabilities, how many candidates were verified and how many
        accepted."""
        drafting = shape is not None
        tree = drafting and self.proposer.is_tree(shape) and self.proposer.nodes(shape) > 0
        k = self.proposer.nodes(shape) if drafting else 0
        run, out = self._tree_program(k, rules, True, shape) if tree else self._program(k + 1, rules, drafting, shape)
        if group == 1:
            run()
            passes = [self._read(out)]
        else:  # each pass's output copied aside on the device, all of them read at once
            ring = self.rings.get((id(out), group))
            if ring is None:
                ring = self.rings[id(out), group] = torch.zeros(group, out.numel(), dtype=out.dtype, device=self.device)
            for i in range(group):
                run()
                ring[i].copy_(out)
            passes = self._read(ring)
        verdicts = []
        rows = k + 1
        for values in passes:
            if tree:  # deepest node, accepted, greedy and log-probabilities per row, ..., valid nodes
                accepted = int(values[1])
                verdict = Verdict(values[2:3 + accepted], values[2 + rows:3 + rows + accepted], int(values[-1]),
                                  accepted)
            else:  # accepted, greedy and log-probabilities per row
                accepted = int(values[0])
                verdict = Verdict(values[1:2 + accepted], values[2 + k:3 + k + accepted], k, accepted)
            if drafting:
                self.proposer.observe(shape, accepted)
            verdicts.append(verdict)
        return verdicts

    def _verify_tree(self, tree: CandidateTree, rules: DeviceRules,
                     tokens: List[int]) -> Tuple[List[float], List[float], Committed]:
        """One pass over a host proposer's tree after ``tokens`` (the last one pending): the tokens
        it gives (accepted candidates, then the verifier's own), their log-probabilities, and what
        to tell the proposer."""
        length = len(tokens)
        room = self.step.n_ctx - length  # slots left after the pending token's
        nodes = 1 << max(len(tree) - 1, 0).bit_length()  # a power of two: one graph per size
        while nodes > min(MAX_NODES, room) and nodes > 1:
            nodes //= 2
        if len(tree) > nodes:  # parents come first, so a prefix of the nodes is a tree
            tree = CandidateTree(tree.tokens[:nodes], tree.parents[:nodes], tree.scores[:nodes])
        packed = TreeLayout.pack(tree, nodes)
        if nodes not in self.trees:
            self.trees[nodes] = torch.zeros_like(packed, device=self.device)
            self.kept[nodes] = torch.zeros(1, nodes + 1, self.step.n_state, dtype=self.step.residual,
                                           device=self.device)
            self.staging[nodes] = packed.pin_memory() if self.device.type == "cuda" else packed
        self.staging[nodes].copy_(packed)
        self.trees[nodes].copy_(self.staging[nodes], non_blocking=True)
        run, out = self._tree_program(nodes, rules)
        run()
        values = self._read(out)
        rows = nodes + 1
        deepest, accepted = int(values[0]), int(values[1])
        path: List[int] = []
        node = deepest if accepted else -1
        while node >= 0:
            path.append(node)
            node = tree.parents[node]
        path.reverse()
        greedy = values[2:2 + rows]
        committed = Committed(tokens=[tokens[-1]] + [tree.tokens[j] for j in path],
                              hidden=self.kept[nodes][:, :1 + accepted].clone(), position=length - 1,
                              next_token=int(greedy[accepted]), n_accepted=accepted, n_proposed=len(tree),
                              predictions=[int(p) for p in values[2 + 2 * rows:2 + 2 * rows + 1 + len(tree)]])
        return greedy[:1 + accepted], values[2 + rows:3 + rows + accepted], committed

    def _prefill(self, initial: List[int], rules: DeviceRules, sot_index: int, no_speech: Optional[int],
                 drafting: bool, keep: bool = False) -> Tuple[List[float], float, Optional[Tensor]]:
        """The pass over the initial tokens, on the fixed-shape step a program of
        ``prompt_rows(len(initial))`` rows (the prompt's length changes from window to window: one
        program per size, captured on CUDA): [0, the first sampled token, its log-probability, the
        argmax before the rules], the no-speech probability (NaN without a no-speech token), and
        with ``keep`` the prompt's states (for a host proposer); with ``drafting``, the in-pass
        proposer's first proposal."""
        n = len(initial)
        self.prompt.write([n, sot_index], initial)
        # the fixed-shape step pads it to one of a few sizes; the CPU's products take it as it is,
        # as every other way of opening a window computes it (together.py)
        rows = prompt_rows(n, self.step.n_ctx) if self.step.products.fixed_shapes else n
        run, out = self._prompt_program(rows, rules, drafting, no_speech, keep)
        run()
        greedy, prediction, logprob, speech = self._read(out)
        states = self.prompt_states[:, :n].clone() if keep else None
        return [0.0, greedy, logprob, prediction], speech if no_speech is not None else float("nan"), states

    def _prompt_pass(self, rows: int, rules: DeviceRules, out: Tensor, drafting: bool, no_speech: Optional[int],
                     keep: bool) -> None:
        """The window's prompt (``self.prompt``: its length, the start-of-transcript's index, its
        tokens) in ``rows`` rows: the rows past it are padding at the positions after it, whose keys
        and values every later pass writes again before any row reads them (as a refused
        candidate's). Writes the history and length afresh; ``out``: the greedy token, the argmax
        before the rules, the greedy token's log-probability, the no-speech probability."""
        n, sot = self.prompt.field(0), self.prompt.field(1)
        positions = self.step.slots[:rows][None]  # (1, rows)
        tokens = self.prompt.tokens(positions, n)
        self.history.zero_()
        self.history[:, :rows].copy_(tokens)
        with rows_together():  # a window's prompt, computed alone in every way of decoding it
            hidden = self.step(tokens, positions)
        if keep:
            self.prompt_states[:, :rows].copy_(hidden)
        greedy, logprob, prediction, speech = first_token(self.step, rules, hidden, self.history, n, sot, no_speech)
        self.history.scatter_(1, n[:, None], greedy)
        self.length.copy_(n + 1)
        if drafting:
            self.proposer.advance(hidden, self.history, torch.zeros_like(n), n, greedy, None)
        out[:2].copy_(torch.cat([greedy[0], prediction]))  # cast by the copies
        if speech is None:
            out[2:3].copy_(logprob[0])
        else:
            out[2:].copy_(torch.cat([logprob[0], speech]))

    def _prompt_program(self, rows: int, rules: DeviceRules, drafting: bool, no_speech: Optional[int],
                        keep: bool) -> Tuple[Callable[[], None], Tensor]:
        """The prompt pass over ``rows`` rows as a callable (a graph's replay on CUDA; never
        compiled: it runs once a window) and its output buffer."""
        key = (rules.key, rows, drafting, no_speech, keep)
        if key not in self.prompt_programs:
            out = torch.zeros(4, dtype=torch.float64, device=self.device)
            run = lambda: self._prompt_pass(rows, rules, out, drafting, no_speech, keep)  # noqa: E731
            if self.capture:
                state = [self.history, self.length] + (self.proposer.state() if self.proposer is not None else [])
                run = program(run, self.device, state, self.graphs, compile=False)
            self.prompt_programs[key] = (run, out)
        return self.prompt_programs[key]


def prompt_rows(n: int, n_ctx: int) -> int:
    """The rows of the program a prompt of ``n`` tokens runs in: the next power of two from 4, at
    most ``n_ctx`` (whisper's prompts: 3 or 4 tokens, up to about 230 with the previous text)."""
    return min(max(4, 1 << (n - 1).bit_length()), n_ctx)


class PromptInput:
    """What a window's prompt program reads: a few integers (its length, where start-of-transcript
    is, ...) and then its tokens, in a device buffer written from a staging tensor (pinned on CUDA,
    so the copy takes its place in the stream without a wait)."""

    def __init__(self, header: int, n_ctx: int, device: torch.device):
        self.header = header
        self.values = torch.zeros(header + n_ctx, dtype=torch.long, device=device)
        self.staging = torch.zeros_like(self.values, device="cpu")
        if device.type == "cuda":
            self.staging = self.staging.pin_memory()

    def write(self, header: Sequence[int], tokens: Sequence[int]) -> None:
        values = list(header) + list(tokens)
        self.staging[:len(values)].copy_(torch.tensor(values, dtype=torch.long))
        self.values.copy_(self.staging, non_blocking=True)

    def field(self, i: int) -> Tensor:
        """Header value ``i``, shape = (1,)."""
        return self.values[i:i + 1]

    def tokens(self, positions: Tensor, n: Tensor) -> Tensor:
        """The prompt's token at each of ``positions`` (1, rows) below ``n``, 0 after it."""
        return torch.where(positions < n, self.values[self.header:self.header + positions.shape[1]][None], 0)


def first_token(step, rules: DeviceRules, hidden: Tensor, history: Tensor, n: Tensor, sot: Tensor,
                no_speech: Optional[int], item: Union[int, Tensor, None] = None
                ) -> Tuple[Tensor, Tensor, Tensor, Optional[Tensor]]:
    """From a prompt pass's states (1, rows, n_state) whose prompt has ``n`` tokens: the first
    sampled token (1, 1) after whisper's rules (``item``: the batch item they are), its
    log-probability (1, 1), the argmax before the rules (1,), and the no-speech probability at
    row ``sot`` (1,), or None without a no-speech token. Each row projected alone, as the eager
    loop projects them (a compute type's projection may round two rows otherwise than one)."""
    last = step.logits(hidden.index_select(1, n - 1))  # (1, 1, n_vocab)
    prediction = last[:, 0].argmax(dim=-1)
    last = rules.apply(last, history, n[:, None], item=item)
    greedy = last.argmax(dim=-1)
    logprob = F.log_softmax(last, dim=-1).gather(-1, greedy[..., None])[..., 0]
    speech = None
    if no_speech is not None:
        speech = step.logits(hidden.index_select(1, sot))[:, 0].softmax(dim=-1)[:, no_speech]
    return greedy, logprob, prediction, speech


def _count(stats: ProposerStats, proposed: int, accepted: int) -> None:
    """A pass's candidates in the proposer's statistics (accepted ones that were kept)."""
    stats.proposed += proposed
    stats.accepted += accepted
    depth = stats.accepted_per_depth
    depth.extend([0] * (accepted - len(depth)))
    for d in range(accepted):
        depth[d] += 1


def decoder_for(model, audio_features: Tensor, options, draft=None, acceptance: Optional[str] = None) -> WindowDecoder:
    """The model's decoder of a window for these options and features (made once, kept on the
    model): on the fixed-shape step with the device's acceptance where it is wanted (``wanted``:
    CUDA, or ``MEDUSA_WHISPER_STEP``) and can decode what ``options`` ask (``supported``), its
    ``proposer`` drafting inside the pass where one exists for them (``drafting.factory.device_spec``);
    else, or with ``acceptance="host"``, on the CPU's products with the host's acceptance, its
    ``proposer`` the one ``drafting.factory.host_spec`` names. Unless the decoder ``drafts_in_pass``,
    the caller hands ``generate`` a host proposer, if any (``make_proposer``, given ``proposer``)."""
    device = audio_features.device
    on_device = acceptance != "host" and wanted(device) and supported(model, options)
    spec = device_spec(model, options, draft) if on_device else host_spec(model, options, draft)
    key = (device, audio_features.dtype, on_device, spec, step_choice())
    decoders = model.__dict__.setdefault("fixed_decoders", {})  # not a submodule: no state-dict entries
    if key not in decoders:
        decoders[key] = (WindowDecoder(model, audio_features.dtype, device, spec) if on_device else
                         WindowDecoder(model, audio_features.dtype, device, spec, products="cpu", acceptance="host"))
    return decoders[key]


def _synchronize(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)
