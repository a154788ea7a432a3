"""The package's layers, bottom to top: a module imports only from its own layer or those below.

``tests/test_layers.py`` reads every module's imports (with ``ast``: those inside functions too,
relative and absolute) and fails on an import cycle between package modules, on an import from a
layer to a higher one, and on a module missing from this table. Imports under
``if TYPE_CHECKING:`` are exempt: they never run. Within a layer, imports may go either way as long
as they make no cycle.

Importing ``medusa_whisper.x`` runs ``medusa_whisper/__init__.py`` first (Python imports every
parent package), and that imports the whole facade; such implicit parent imports are not counted,
only the import statements a module writes.

This module imports nothing of the package; it is data for the test and for a newcomer.
"""

from __future__ import annotations

from typing import NamedTuple, Tuple


class Layer(NamedTuple):
    name: str
    reason: str  # why these modules sit here, in one line
    modules: Tuple[str, ...]


LAYERS: Tuple[Layer, ...] = (
    Layer("foundation", "the error hierarchy, where files go, this table: everything may use them, they use nothing",
          ("medusa_whisper.errors", "medusa_whisper.paths", "medusa_whisper.layers")),
    Layer("options", "what a decoding is asked to do (whisper's DecodingOptions and speculation's): plain data, "
                     "read by the decoding loop, the proposers' factory, the command line and evaluation",
          ("medusa_whisper.options",)),
    Layer("audio", "audio/: reading audio files, the streamed mel front end, voice activity, the clip the package "
                   "times itself on: no model, no options",
          ("medusa_whisper.audio", "medusa_whisper.audio.sniff", "medusa_whisper.audio.files",
           "medusa_whisper.audio.mel", "medusa_whisper.audio.vad", "medusa_whisper.audio.timing_clip")),
    Layer("kernels", "step/, its tensor-level pieces: the recorded CPU kinds, measured linear routes, int8 arithmetic, row-invariant "
                     "attention and masks, the encoder's bfloat16 attention, the static cache, the vocabulary "
                     "projection modules, rows together or alone, the package's own row kernels (step/native, built "
                     "at set-up): no model, no I/O beyond the route timings' cache file and the built kernels",
          ("medusa_whisper.step", "medusa_whisper.step.kinds", "medusa_whisper.step.routes",
           "medusa_whisper.step.int8_kernels", "medusa_whisper.step.native", "medusa_whisper.step.native.__main__",
           "medusa_whisper.step.attention", "medusa_whisper.step.cache", "medusa_whisper.step.projection",
           "medusa_whisper.step.encoder_attention",
           "medusa_whisper.step.together")),
    Layer("proposer seam", "drafting/, what the decoding loop sees of any proposer (candidate trees and their packing "
                           "for the device's pass, propose() and commit(), the in-pass proposers' calls): plain data "
                           "and masks, no model",
          ("medusa_whisper.drafting", "medusa_whisper.drafting.tree", "medusa_whisper.drafting.base",
           "medusa_whisper.drafting.tree_layout", "medusa_whisper.drafting.device",
           "medusa_whisper.drafting.device.base")),
    Layer("compute types", "step/compute: int8/bfloat16 layers and the load-time surgery that swaps them in (the "
                           "linears, and the decoder's projection for its compute type); step/encoder_form: the int8 "
                           "encoder's form, timed on a window (the conversion handed in by compute)",
          ("medusa_whisper.step.encoder_form", "medusa_whisper.step.compute")),
    Layer("step", "step/: the one decoder step (fixed.FixedStep) over dense products (what CUDA graphs replay) "
                  "or the CPU's (cpu.CpuProducts), and a draft head's block on either (fixed.DraftBlock); drafting/heads: the Medusa "
                  "head modules",
          ("medusa_whisper.step.fixed", "medusa_whisper.step.cpu", "medusa_whisper.step.native_decoder",
           "medusa_whisper.drafting.heads")),
    Layer("drafters", "drafting/: draft head modules, the proposers (inside the pass: drafting.device, driven between "
                      "passes where the host accepts: device.hosted; the draft model's and the CTC head's on the "
                      "host), and the one factory that builds a proposer from the options; draft_head "
                      "loads eagle/ctc/union by name (importlib), unseen by ast",
          ("medusa_whisper.drafting.draft_head", "medusa_whisper.drafting.ctc_units",
           "medusa_whisper.drafting.ctc_draft", "medusa_whisper.drafting.ctc_lexicon",
           "medusa_whisper.drafting.ctc_proposer", "medusa_whisper.drafting.ctc", "medusa_whisper.drafting.eagle",
           "medusa_whisper.drafting.union", "medusa_whisper.drafting.draft_audio",
           "medusa_whisper.drafting.lookahead", "medusa_whisper.drafting.draft_model",
           "medusa_whisper.drafting.replay", "medusa_whisper.drafting.pass_costs",
           "medusa_whisper.drafting.device.medusa", "medusa_whisper.drafting.device.eagle",
           "medusa_whisper.drafting.device.ctc", "medusa_whisper.drafting.device.union",
           "medusa_whisper.drafting.device.hosted",
           "medusa_whisper.drafting.factory")),
    Layer("decoding", "decoding/: whisper's rules as tensor operations (rules), the host's acceptance (acceptance), "
                      "the one loop of a window (loop), knowing proposers only through the seam; best_of and beams "
                      "as whisper's DecodingTask over the step (candidates), with whisper's sampled draw made "
                      "whole-tensor (draws); the encoder captured on CUDA (encoder_graph); the public decode "
                      "(window); many windows side by side (batches)",
          ("medusa_whisper.decoding", "medusa_whisper.decoding.rules", "medusa_whisper.decoding.acceptance",
           "medusa_whisper.decoding.draws", "medusa_whisper.decoding.candidates", "medusa_whisper.decoding.loop",
           "medusa_whisper.decoding.encoder_graph", "medusa_whisper.decoding.window",
           "medusa_whisper.decoding.batches")),
    Layer("transcription and model", "transcription/: long form over windows, VAD chunks and filter, the transcript "
                                     "formats; the whisper-shaped model, which imports transcribe at top level for "
                                     "its method, as whisper/model.py does, while transcribe takes the model as an "
                                     "argument and never imports it",
          ("medusa_whisper.transcription", "medusa_whisper.transcription.outputs",
           "medusa_whisper.transcription.chunked", "medusa_whisper.transcription.vad_filter",
           "medusa_whisper.transcription.longform", "medusa_whisper.model")),
    Layer("checkpoints", "checkpoints/: where weights come from: source formats (CTranslate2, Hugging Face), the "
                         "catalogue of names, downloads, the file cache and its manifest; reads model.model_shapes "
                         "to check conversions",
          ("medusa_whisper.checkpoints", "medusa_whisper.checkpoints.ctranslate2", "medusa_whisper.checkpoints.hf",
           "medusa_whisper.checkpoints.weights")),
    Layer("loading", "a ready model from a name or path (heads, draft heads, compute type); tuning: the choices "
                     "timed on a job (auto's compute type, float32's routes), which loading calls and which load "
                     "models through the loader handed in; checkpoints' convert writes any source as a whisper .pt, "
                     "ggml a model as whisper.cpp's file",
          ("medusa_whisper.tuning", "medusa_whisper.loading", "medusa_whisper.checkpoints.convert",
           "medusa_whisper.checkpoints.ggml")),
    Layer("facade", "the whisper-compatible top-level names (import medusa_whisper as whisper)",
          ("medusa_whisper",)),
    Layer("applications", "archive/: many files, Ray; WER evaluation: users of the facade",
          ("medusa_whisper.archive", "medusa_whisper.archive.batch", "medusa_whisper.archive.distributed",
           "medusa_whisper.evaluation")),
    Layer("training", "training/: fitting heads on a frozen base model: windows, cached features, one loop and what "
                      "each head type gives it (trainer: Medusa, eagle, ctc), their CLIs",
          ("medusa_whisper.training", "medusa_whisper.training.windows", "medusa_whisper.training.features",
           "medusa_whisper.training.blocks", "medusa_whisper.training.plots", "medusa_whisper.training.best",
           "medusa_whisper.training.loop", "medusa_whisper.training.trainer", "medusa_whisper.training.eagle",
           "medusa_whisper.training.ctc", "medusa_whisper.training.ctc_cli", "medusa_whisper.training.cli")),
    Layer("command line", "medusa-whisper: every subcommand, training's included",
          ("medusa_whisper.cli",)),
)


def layer_of() -> dict:
    """{module name: index of its layer in LAYERS}."""
    return {module: i for i, layer in enumerate(LAYERS) for module in layer.modules}
