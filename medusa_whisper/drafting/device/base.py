"""The seam between the fixed-shape pass and a proposer that drafts inside it.

A host proposer (``drafting.base.Proposer``) is asked for a tree between two passes, so on a GPU
every pass waits for the host: the pass's tokens are read back, the proposer runs its own small
kernels one by one, and its tree is copied over. A ``DeviceProposer`` is instead part of the pass:
``loop.WindowDecoder`` calls, in one program that a CUDA graph captures,

1. ``candidates(shape)`` (a chain) or ``layout(shape)`` (a tree, ``tree_layout.pack_on_device``'s
   tensor): what to verify, read from the proposer's device buffers;
2. the decoder step, whisper's rules and the acceptance, as for any proposer;
3. ``advance(...)``: the proposer takes what was committed (the main decoder's states at the
   committed rows, the tokens in the history, the verifier's tokens at every row) and writes its
   next proposal into its buffers.

Nothing in these calls may read a tensor's value on the host (``torch.compile`` with
``fullgraph=True`` checks it in the tests), and every tensor they keep must be allocated once and
written in place, since a captured graph replays fixed addresses. A proposal's ``shape`` is a plain
hashable value (a chain's length, a tree's size, a CTC chunk's length and whether a second branch
goes with it): one program per shape. The host's part is small and runs between passes from
values it reads anyway: ``begin`` once per window, ``next_shape`` to pick the next program,
``observe`` to learn from how many candidates the last pass accepted.
"""

from __future__ import annotations

from typing import Hashable, List, Optional, Sequence, Tuple

import torch
from torch import Tensor

Shape = Hashable


class DeviceProposer:
    """Base class of proposers that draft inside the verification pass."""

    # the row counts whose pass costs ``next_shape`` weighs (none: it needs no costs)
    cost_rows: Tuple[int, ...] = ()

    def set_row_costs(self, costs: Sequence[float]) -> None:
        """What a pass over each of ``cost_rows`` rows costs, relative to one row, measured on the
        passes that will run (``WindowDecoder.row_costs``)."""

    def begin(self, audio_features: Tensor, tokenizer) -> None:
        """Host, once per window, before the prompt's ``advance``: reset the window's state.

        audio_features : shape = (1, n_audio_ctx, n_audio_state), the window's encoder output
        """
        raise NotImplementedError

    def renew(self) -> None:
        """New tensors, zeros, for the buffers ``state`` names (its attributes that hold them).
        ``hosted.Hosted`` calls it once a window, where nothing replays those buffers: a proposer
        made under ``torch.inference_mode`` and kept on the model may not write its tensors in
        place outside it, as the step's own buffers may not (``FixedStep.set_audio``)."""
        kept = self.state()
        for name, value in list(vars(self).items()):
            if any(value is buffer for buffer in kept):
                setattr(self, name, torch.zeros_like(value))

    def next_shape(self, room: int) -> Optional[Shape]:
        """Host: the shape of the next pass's proposal, or None where no proposal fits in ``room``
        more tokens (the window ends with plain passes). A shape of no nodes is a plain pass that
        still advances the proposer."""
        raise NotImplementedError

    def is_tree(self, shape: Shape) -> bool:
        """Whether a proposal of ``shape`` is verified by the tree pass (``layout``), else the chain
        pass (``candidates``)."""
        return False

    def nodes(self, shape: Shape) -> int:
        """The candidates a proposal of ``shape`` holds (the rows of its pass, less one)."""
        raise NotImplementedError

    def depth(self, shape: Shape) -> int:
        """The longest path of a proposal of ``shape``: the committed rows a pass can give it, less one."""
        return self.nodes(shape)

    def state(self) -> List[Tensor]:
        """The buffers a pass rewrites that the next pass reads: put back after a capture's warm-up
        runs (``loop.program``), which run the pass for real."""
        raise NotImplementedError

    def observe(self, shape: Shape, accepted: int) -> None:
        """Host: the pass over a proposal of ``shape`` accepted ``accepted`` candidates."""

    def candidates(self, shape: Shape) -> Tensor:
        """In the pass: the chain to verify, shape = (1, nodes(shape)) long."""
        raise NotImplementedError

    def layout(self, shape: Shape) -> Tensor:
        """In the pass: the tree to verify, as ``tree_layout.pack_on_device`` returns it."""
        raise NotImplementedError

    def advance(self, states: Tensor, history: Tensor, start: Tensor, count: Tensor, greedy: Tensor,
                shape: Optional[Shape]) -> None:
        """In the pass: take what was committed and write the next proposal.

        states  : shape = (1, rows, n_state), the main decoder's post-LayerNorm states at the rows
                  fed from ``start`` on along the accepted path; the first ``count`` of them were
                  committed, the others are rejected rows (values to ignore, shapes to keep)
        history : shape = (1, n), position p's token at index p: the committed tokens at
                  ``start .. start + count - 1`` and the verifier's next token at ``start + count``
        start   : shape = (1,) long, the position of the first of ``states``
        count   : shape = (1,) long, how many rows were committed (the accepted candidates, plus one)
        greedy  : shape = (1, 1 + nodes(shape)), the verifier's token after each row of the pass:
                  the pending token's, then each candidate's, in the proposal's node order
        shape   : the shape of the proposal this pass verified (None for the window's prompt)
        """
        raise NotImplementedError
