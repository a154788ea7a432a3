"""The EAGLE draft head's proposer: its commit, its chain or its tree, at fixed shapes.

The head's block runs over the committed rows with a cache of its own, then drafts a chain (one
block row per token) or grows EAGLE-2's tree (one block pass per level over the ``width`` best
nodes, then the ``max_nodes`` best of all). It runs on buffers of fixed shape, so that it is part
of the captured pass on CUDA; on the CPU the same proposer runs on the CPU's products, driven
between passes (``hosted.Hosted``). Its arithmetic:

- the head's cache has a slot per position (and room for a tree's drafted rows after the last
  one); a commit writes rows for every row the pass fed, at their positions, but only the first
  ``count`` are committed: a drafted row is always written at a slot before any row reads it, and
  a row reads only slots at or before its own (a chain) or its ancestors' (a tree), so the rows
  after ``count`` are overwritten before they matter, as a rollback would drop them;
- a level's best nodes are taken by a stable sort of their scores, and the tree's best nodes the
  same way, which is the host's ``sorted`` (ties keep the earlier node); scores add in float64,
  as the host's Python floats do.
"""

from __future__ import annotations

from typing import List, Optional, Sequence

import torch
import torch.nn.functional as F
from torch import Tensor

from ...step.fixed import DraftBlock, FixedStep, layer_norm, linear
from ..tree_layout import pack_on_device
from .base import DeviceProposer


def chain_depth(accepted_at_depth: Sequence[float], pass_costs: Sequence[float], draft_costs: Sequence[float]) -> int:
    """The chain length d that makes a token cheapest: a pass over a chain of d gives 1 + the sum of
    the first d acceptances tokens (``accepted_at_depth[k]``: the share of passes whose candidate at
    depth k + 1 is accepted) and costs ``pass_costs[d - 1]`` (the decoder's pass over 1 + d rows)
    plus ``draft_costs[d - 1]`` (the head's drafting of the chain), both in one-row passes. 0 where
    no chain makes a token cheaper than plain decoding's one-row pass (on a CPU whose extra rows
    cost nearly a pass each: an AVX2-only EPYC's int8 decoder). Ties take the shorter chain."""
    best, depth = 1.0, 0  # d = 0: plain decoding, one one-row pass a token, nothing drafted
    for d in range(1, min(len(accepted_at_depth), len(pass_costs), len(draft_costs)) + 1):
        per_token = (pass_costs[d - 1] + draft_costs[d - 1]) / (1 + sum(accepted_at_depth[:d]))
        if per_token < best - 1e-12:
            best, depth = per_token, d
    return depth


class DeviceEagle(DeviceProposer):
    """An ``EagleHead`` (``model.draft_head``, or a union's part) as a device proposer.

    depth     : tokens of a chain, and levels of a tree
    width     : nodes a tree level expands, and children per node (1: a chain)
    max_nodes : a tree's candidates per pass
    """

    def __init__(self, head, step: FixedStep, depth: int, width: int = 1, max_nodes: int = 0):
        device, products = step.device, step.products
        self.step = step
        self.depth_, self.width = depth, width
        self.tree = width > 1
        # the head's layers by the step's products (dense for a captured pass, the compute type's
        # kernels on the CPU)
        self.fuse = products.head(head.fuse)
        self.ln = products.norm(head.ln)
        self.ids = head.token_ids.to(device)
        self.shortlist = products.projection(self.ids)
        drafted_rows = (depth - 1) * width
        # a slot per position, and after the last one the slots of a tree's drafted rows
        self.slots = torch.arange(step.n_ctx + drafted_rows + 1, device=device)
        self.block = DraftBlock(head.block, products, len(self.slots), step.n_audio_ctx, device)
        if self.tree:
            grown = width + (depth - 1) * width * width
            self.tree_nodes = min(max_nodes or grown, grown)
            self.packed = torch.zeros(4 + 2 * self.tree_nodes, self.tree_nodes, dtype=torch.long, device=device)
            self.own_rows = torch.arange(width, device=device)
            # level d's rows in the drafted slots, and which row drafted each of a level's children
            # (comparisons, not one_hot or repeat_interleave: neither may wait on the device)
            drafted = torch.arange(drafted_rows, device=device)
            self.level_slots = [drafted == ((d - 1) * width + self.own_rows)[:, None] for d in range(1, depth)]
            self.child_rows = self.own_rows[:, None].expand(width, width).flatten()
            # constants of the pass, made once (every operation in it is a kernel a GPU pass replays):
            # the drafted rows' slots after the committed ones, each level's node numbers in the grown
            # tree, the kept nodes' new numbers and validity
            self.drafted_slots = drafted
            self.root_rows = torch.zeros(width, dtype=torch.long, device=device)
            self.level_node_ids = [width + (d - 1) * width * width + torch.arange(width * width, device=device)
                                   for d in range(1, depth)]
            self.kept_index = torch.arange(self.tree_nodes, device=device)
            self.kept_valid = torch.ones(self.tree_nodes, dtype=torch.bool, device=device)
        else:
            self.tokens = torch.zeros(1, depth, dtype=torch.long, device=device)

    # ------------------------------------------------------------------ host

    def begin(self, audio_features: Tensor, tokenizer) -> None:
        self.block.set_audio(audio_features.to(self.step.residual))

    def next_shape(self, room: int) -> Optional[int]:
        """A chain of ``depth`` tokens, or the tree: one shape each."""
        if room < self.depth_:
            return None
        return self.tree_nodes if self.tree else self.depth_

    def is_tree(self, shape: int) -> bool:
        return self.tree

    def nodes(self, shape: int) -> int:
        return shape

    def depth(self, shape: int) -> int:
        return self.depth_

    def state(self) -> List[Tensor]:
        # the cache's rows are rewritten before they are read (see the module)
        return [self.packed if self.tree else self.tokens]

    def candidates(self, shape: int) -> Tensor:
        return self.tokens[:, :shape]

    def layout(self, shape: int) -> Tensor:
        return self.packed

    # ------------------------------------------------------------------ the pass

    def _fused(self, features: Tensor, tokens: Tensor, positions: Tensor) -> Tensor:
        """The block's input: [f_t ; embedding of token t+1 at position t+1], shape = (1, rows, n_state)."""
        step = self.step
        embedded = step.embedding[tokens] + step.positional[positions.clamp(max=step.n_ctx - 1)]
        return linear(torch.cat([features, embedded.to(features.dtype)], dim=-1), self.fuse)

    def _block(self, x: Tensor, slots: Tensor, allowed: Tensor) -> Tensor:
        """The head's block and LayerNorm over rows written at consecutive ``slots`` (1, rows),
        attending where ``allowed`` (1, rows, cache slots)."""
        return layer_norm(self.block(x, slots, allowed), self.ln)

    def _logprobs(self, features: Tensor) -> Tensor:
        return F.log_softmax(self.shortlist(features), dim=-1)

    def advance(self, states: Tensor, history: Tensor, start: Tensor, count: Tensor, greedy: Tensor,
                shape: Optional[int]) -> None:
        rows = states.shape[1]
        slots = start[:, None] + self.slots[:rows]  # (1, rows): row i at position start + i
        x = self._fused(states.to(self.step.residual), history.gather(1, slots + 1), slots + 1)
        out = self._block(x, slots, self.slots <= slots[..., None])
        # the drafted feature after the committed rows: the state of the verifier's next token
        feature = out.gather(1, (count - 1)[:, None, None].expand(-1, 1, out.shape[-1]))[:, 0]  # (1, n_state)
        committed = start + count  # the next token's position and the first slot a draft may write
        if self.tree:
            self._draft_tree(feature, committed)
        else:
            self._draft_chain(feature, committed)

    def _draft_chain(self, feature: Tensor, committed: Tensor) -> None:
        tokens: List[Tensor] = []
        slot = committed[:, None]  # (1, 1)
        for d in range(self.depth_):
            token = self.ids[self._logprobs(feature).argmax(dim=-1)]  # (1,)
            tokens.append(token)
            if d + 1 == self.depth_:
                break
            x = self._fused(feature[:, None], token[:, None], slot + 1)
            feature = self._block(x, slot, self.slots <= slot[..., None])[:, 0]
            slot = slot + 1
        self.tokens.copy_(torch.stack(tokens, dim=1))

    def _draft_tree(self, feature: Tensor, committed: Tensor) -> None:
        """EAGLE-2's tree (tests/reference_drafts.py grows it node by node): level d's ``width`` best nodes are
        expanded in one block pass (rows at slots after ``committed``, each seeing the committed
        slots, its ancestors' rows and its own), each into its ``width`` best tokens."""
        width = self.width
        best, columns = self._logprobs(feature).topk(width, dim=-1)  # (1, width)
        level_tokens, level_scores = self.ids[columns[0]], best[0].double()
        level_rows = self.root_rows  # the row whose output drafted each node (the feature's, the only one)
        level_nodes = self.own_rows  # their numbers in the grown tree
        tokens, parents, scores = [level_tokens], [torch.full_like(level_tokens, -1)], [level_scores]
        outputs, seen = feature, None  # the last level's block outputs; its rows' ancestor rows
        committed_slots = self.slots < committed[:, None]  # (1, slots)
        for d in range(1, self.depth_):
            frontier = torch.sort(-level_scores, stable=True).indices[:width]
            own = self.level_slots[d - 1]  # (width, drafted)
            seen = own if seen is None else seen[level_rows[frontier]] | own
            allowed = committed_slots.expand(width, -1).clone()
            allowed.scatter_(1, committed + self.drafted_slots.expand(width, -1), seen)
            row_slots = (committed + (d - 1) * width + self.own_rows)[None]  # (1, width)
            x = self._fused(outputs[level_rows[frontier]][None], level_tokens[frontier][None],
                            (committed + d).expand(1, width))
            outputs = self._block(x, row_slots, allowed[None])[0]  # (width, n_state)
            best, columns = self._logprobs(outputs).topk(width, dim=-1)  # (width, width)
            parents.append(level_nodes[frontier][:, None].expand(width, width).flatten())
            level_tokens = self.ids[columns].flatten()
            level_scores = (level_scores[frontier][:, None] + best.double()).flatten()
            level_rows = self.child_rows
            level_nodes = self.level_node_ids[d - 1]
            tokens.append(level_tokens)
            scores.append(level_scores)
        all_tokens, all_parents, all_scores = torch.cat(tokens), torch.cat(parents), torch.cat(scores)
        # the best nodes of the grown tree, in the grown order (EAGLE-2's re-ranking)
        chosen = torch.sort(torch.sort(-all_scores, stable=True).indices[:self.tree_nodes]).values
        new_index = torch.full_like(all_parents, -1)
        new_index[chosen] = self.kept_index
        parent = all_parents[chosen]
        tree_parents = torch.where(parent >= 0, new_index[parent.clamp(min=0)], parent)
        self.packed.copy_(pack_on_device(all_tokens[chosen], tree_parents, self.kept_valid))
