"""A window's audio features on CUDA: whisper's encoder replayed as one CUDA graph.

whisper's encoder is a function of fixed shapes (a window's 3,000 frames), but run eagerly it
launches its hundred-odd kernels one by one from the host: 4.2 ms a window for ``base`` at float16
on an H100 (docs/gpu.md), where the GPU's own work is a fraction of that, and as much as six
captured decoder passes. So wherever a window is decoded on the fixed-shape step on CUDA
(``loop.wanted``), the encoder's pass is captured once per input shape and dtype and replayed: the
same kernels on the same buffers, so the same features bit for bit (a CUDA test compares them).
Everywhere else whisper's own ``DecodingTask._get_audio_features`` runs.

A graph reads the encoder's weights where they were when it was captured: the graphs are kept on
the model (``model.encoder_graphs``), made on first use after the model was loaded and moved.
"""

from __future__ import annotations

from typing import Callable, Dict, List, Optional, Tuple

import torch
from torch import Tensor
from whisper.decoding import DecodingTask

from . import loop


class EncoderGraph:
    """The encoder's pass over inputs of one shape and dtype, captured (``loop.program``)."""

    def __init__(self, encoder: Callable[[Tensor], Tensor], example: Tensor):
        self.input = example.clone()
        self.output: Optional[Tensor] = None
        self.graphs: List["torch.cuda.CUDAGraph"] = []

        def run() -> None:  # captured: the output is the graph's own buffer, written by every replay
            self.output = encoder(self.input)
        self.replay = loop.program(run, example.device, [], self.graphs, compile=False)

    @torch.no_grad()
    def __call__(self, mel: Tensor) -> Tensor:
        self.input.copy_(mel)
        self.replay()
        return self.output.clone()  # the caller keeps it (a result's audio_features): not the graph's buffer


def audio_features(task: DecodingTask, mel: Tensor) -> Tensor:
    """``task._get_audio_features(mel)``: the encoder's output for ``mel`` (float16 when the task's
    options say so), from a captured graph on CUDA where decoding takes the fixed-shape step;
    ``mel`` itself where it already holds audio features, as whisper's call does."""
    model = task.model
    is_features = mel.shape[-2:] == (model.dims.n_audio_ctx, model.dims.n_audio_state)
    if mel.device.type != "cuda" or not loop.wanted(mel.device) or is_features:
        return task._get_audio_features(mel)
    if task.options.fp16:
        mel = mel.half()
    graphs: Dict[Tuple[tuple, torch.dtype], EncoderGraph] = model.__dict__.setdefault("encoder_graphs", {})
    key = (tuple(mel.shape), mel.dtype)
    if key not in graphs:
        with torch.no_grad():
            graphs[key] = EncoderGraph(model.encoder, mel)
    return graphs[key](mel)
