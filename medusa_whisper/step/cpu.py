"""The fixed-shape step's interface over the CPU's products: one decoding loop on every device.

``step.fixed.FixedStep`` is the decoder as one function of fixed shapes, for CUDA graphs: dense weights
in the products' dtype, every slot attended with a mask. On the CPU that arithmetic is neither the
fastest nor the exact one: an int8 model multiplies with the kernels ``routes`` measured for its
rows and attends with ``invariant_attention`` over the written slots, so that a row gets the same
bits in a verification pass as alone (what makes lossless decoding bit-exact there).

``CpuStep`` offers ``FixedStep``'s calls (``set_audio``, the step over rows at positions and slots
with a mask, ``logits``, moving a tree's accepted slots) over exactly those products: the eager
decoder's blocks (``decoder.decoder_hidden``) and cache, and the compute type's vocabulary
projection. So ``loop.WindowDecoder``, the loop CUDA captures, runs on the CPU with the
CPU's numbers: a pass reads the slots it writes from (a Python int: nothing is captured here), and
the prompt's pass runs with its rows together, as every way of opening a window does.
"""

from __future__ import annotations

from typing import List, Optional

import torch
from torch import Tensor, nn

from .decoder import (DecoderCache, block_caches, cross_cache, decoder_hidden, decoder_rows_step, new_cache,
                      next_token_logits)
from .attention import chain_mask
from .fixed import product_dtype
from .together import rows_together


class CpuStep:
    """The decoder of ``model`` for one window at a time, on the CPU's products; ``FixedStep``'s interface.

    residual : the dtype of the residual stream (the audio features')
    """

    batch = 1

    def __init__(self, model: nn.Module, residual: torch.dtype = torch.float32, device: Optional[torch.device] = None):
        decoder = model.decoder
        self.model, self.decoder = model, decoder
        self.device = torch.device(device) if device is not None else decoder.token_embedding.weight.device
        self.residual = residual
        self.dtype = product_dtype(decoder, residual)  # what the proposers' own products run in
        self.n_head = decoder.blocks[0].attn.n_head
        self.n_state = decoder.token_embedding.weight.shape[1]
        self.n_ctx = decoder.positional_embedding.shape[0]
        self.n_audio_ctx = model.dims.n_audio_ctx
        # what the proposers that draft in the pass read (drafting/device): embeddings and the tied vocabulary
        self.embedding = decoder.token_embedding.weight.detach().to(residual)
        self.positional = decoder.positional_embedding.detach().to(residual)
        self.vocabulary = decoder.token_embedding.weight.detach().to(self.dtype)
        self.slots = torch.arange(self.n_ctx, device=self.device)
        # a cache before any window's, so that a pass can be timed (row_costs) before set_audio
        self.cache: DecoderCache = new_cache(decoder, torch.zeros(1, self.n_audio_ctx, model.dims.n_audio_state,
                                                                  dtype=residual, device=self.device))

    def set_audio(self, features: Tensor) -> None:
        """The window's cache: self-attention slots, and the cross-attention keys and values of its
        encoder output (features, shape = (1, n_audio_ctx, n_audio_state)), computed with their rows
        together as every way of opening a window computes them."""
        self.cache = new_cache(self.decoder, features.to(self.residual))

    def forward(self, tokens: Tensor, positions: Tensor, mask: Optional[Tensor] = None,
                slots: Optional[Tensor] = None) -> Tensor:
        """``FixedStep.forward`` for one window: rows at consecutive slots from the first's (a chain
        at its positions, or a pending token and a tree's nodes), written there; post-LayerNorm
        states, shape = (1, rows, n_state). Reads the first slot on the host."""
        start = int((positions if slots is None else slots)[0, 0])
        n = tokens.shape[1]
        allowed = chain_mask(start, n, self.device) if mask is None else mask[0, :, :start + n]
        return self.pass_at(tokens, positions[0], start, allowed)

    __call__ = forward

    def pass_at(self, tokens: Tensor, positions: Tensor, start: int, mask: Tensor) -> Tensor:
        """Rows written at slots [start, start + rows), as the host's acceptance feeds them.

        tokens    : shape = (1, rows); positions : shape = (rows,)
        mask      : shape = (rows, start + rows) bool, where each row may attend
        returns   : shape = (1, rows, n_state), post-LayerNorm states
        """
        self.cache.self_attn.length = start  # what is at or after ``start`` is rewritten now
        return decoder_hidden(self.decoder, tokens, positions, self.cache, start, mask)

    def logits(self, states: Tensor) -> Tensor:
        """The next-token logits greedy decoding reads from states, float32: by the compute type's
        projection, through a ``base_head`` model's head 0 first (``decoder.next_token_logits``)."""
        return next_token_logits(self.model, states)

    def move_slots(self, dest: Tensor, src: Tensor) -> None:
        """Slots ``src`` copied to slots ``dest`` (a tree's accepted nodes follow the pending token)."""
        cache = self.cache.self_attn
        for buffer in (cache.keys, cache.values):
            buffer.index_copy_(cache.slot_dim, dest, buffer.index_select(cache.slot_dim, src))

    def compact(self, keep: List[int], start: int) -> None:
        """Slots ``keep`` (ascending, from ``start``) moved to [start, start + len(keep))."""
        self.cache.self_attn.compact(keep, start)


class CpuBatchStep:
    """``FixedStep``'s calls for windows side by side (one per batch item, each at its own
    position) over the CPU's products: ``decoder.decoder_rows_step``, whose int8 attention and
    products give a stream the bits it gets alone, over one cache of ``batch`` items."""

    def __init__(self, model: nn.Module, batch: int, residual: torch.dtype = torch.float32,
                 device: Optional[torch.device] = None):
        decoder = model.decoder
        self.model, self.decoder, self.batch = model, decoder, batch
        self.device = torch.device(device) if device is not None else decoder.token_embedding.weight.device
        self.residual = residual
        self.n_ctx = decoder.positional_embedding.shape[0]
        self.vocabulary = decoder.token_embedding.weight  # (its rows: the vocabulary's size)
        features = torch.zeros(batch, model.dims.n_audio_ctx, model.dims.n_audio_state, dtype=residual,
                               device=self.device)
        self_attn, cross_attn = block_caches(decoder.blocks, self.n_ctx, features)
        self.cache = DecoderCache(self_attn=self_attn, cross_attn=cross_attn, dtype=residual)

    def set_audio(self, features: Tensor, item: int) -> None:
        """Batch item ``item`` takes a window: the cross-attention keys and values of its encoder
        output (features, shape = (1, n_audio_ctx, n_audio_state)), computed for it alone, and
        zeroed self-attention slots, as a fresh cache has them."""
        self.cache.cross_attn.put(item, cross_cache(self.decoder.blocks, features.to(self.residual)))
        mine = self.cache.batch_items(item, item + 1)
        mine.self_attn.keys.zero_()
        mine.self_attn.values.zero_()

    def prompt(self, tokens: Tensor, item: int) -> Tensor:
        """The window's prompt pass in batch item ``item`` alone, its rows together as every way of
        opening a window has them; tokens, shape = (1, n) -> states, shape = (1, n, n_state)."""
        n = tokens.shape[1]
        with rows_together():
            return decoder_hidden(self.decoder, tokens, torch.arange(n, device=self.device),
                                  self.cache.batch_items(item, item + 1), 0, chain_mask(0, n, self.device))

    def rows(self, tokens: Tensor, positions: Tensor, first: int, stop: int) -> Tensor:
        """One token for each of batch items [first, stop), item b's at slot ``positions[b]``;
        tokens, positions : shape = (stop - first,) -> states, shape = (stop - first, n_state)."""
        return decoder_rows_step(self.decoder, tokens, positions, self.cache.batch_items(first, stop))

    def logits(self, states: Tensor) -> Tensor:
        return next_token_logits(self.model, states)
