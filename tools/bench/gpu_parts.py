"""Where a transcription's time goes on the GPU, part by part: what a clip costs besides its passes.

Part of ``python -m tools.bench gpu`` (its row group ``parts``). The captured pass costs about 1 ms,
so whatever a window or a clip does once (the spectrogram, the encoder, whisper's task set-up, the
cross-attention buffers, the proposer's window, the prompt pass, the result) can weigh as much as
its passes. Each part is timed where it is called, with the device synchronised before and after
(every part but the encoder ends in a host read anyway, so this moves little); what no part claims
is the host's: the loop between groups of passes, and the transcription around the windows.

Parts (seconds over the clips, and per window):

- ``spectrogram``: ``LogMelFrames`` (its scan for the global maximum and each window's frames), on
  the host as whisper computes it, and the copy of a window's frames to the device;
- ``encoder``; ``task set-up``: whisper's ``DecodingTask`` for the window;
- ``cross keys and values``: ``FixedStep.set_audio``; ``proposer's window``: an in-pass proposer's
  ``begin`` (the CTC head's draft is spelled there);
- ``prompt pass``: ``WindowDecoder._prefill``, uncaptured; ``passes``: ``WindowDecoder._verify``,
  each a group of captured passes and the host's read of them;
- ``window loop (host)``: ``WindowDecoder.generate`` less the parts inside it;
- ``window result``: whisper's result fields from the tokens (text, compression ratio);
- ``transcription (host)``: the clip's time less every part above (segments, fallback checks).
"""

from __future__ import annotations

import collections
import contextlib
import time
from typing import Callable, Dict, Iterator, List, Tuple

from medusa_whisper.audio import mel as mel_module
from medusa_whisper.decoding import loop, window
from medusa_whisper.drafting.device import ctc, eagle, medusa, union
from medusa_whisper.step.fixed import FixedStep

# each in-pass proposer's own ``begin`` (the union's calls its parts': counted once, the outer call)
PROPOSERS = (ctc.DeviceCtc, eagle.DeviceEagle, medusa.DeviceMedusa, union.DeviceUnion)

# (owner, attribute, part): every part but the two residues; order as the report lists them
TIMED: Tuple[Tuple[object, str, str], ...] = (
    (mel_module.LogMelFrames, "__init__", "spectrogram"),
    (mel_module.LogMelFrames, "frames", "spectrogram"),
    (window.DecodingTask, "_get_audio_features", "encoder"),
    (window, "audio_features_of", "encoder"),  # the encoder captured on CUDA (decoding/encoder_graph.py)
    (window.DecodingTask, "__init__", "task set-up"),
    (FixedStep, "set_audio", "cross keys and values"),
    *((proposer, "begin", "proposer's window") for proposer in PROPOSERS),
    (loop.WindowDecoder, "_prefill", "prompt pass"),
    (loop.WindowDecoder, "_verify", "passes"),
    (loop.WindowDecoder, "generate", "window decoding"),
    (window, "window_result", "window result"),
)
INSIDE_GENERATE = ("cross keys and values", "proposer's window", "prompt pass", "passes")
ORDER = ("spectrogram", "encoder", "task set-up", "cross keys and values", "proposer's window", "prompt pass",
         "passes", "window loop (host)", "window result", "transcription (host)")


class PartClock:
    """Seconds and calls per part; a part called inside itself (a subclass's method calling its
    base's) is counted once, at the outermost call."""

    def __init__(self, synchronize: Callable[[], None]):
        self.synchronize = synchronize
        self.seconds: Dict[str, float] = collections.defaultdict(float)
        self.calls: Dict[str, int] = collections.Counter()
        self.depth: Dict[str, int] = collections.Counter()

    def timed(self, part: str, fn: Callable) -> Callable:
        def wrapper(*args, **kwargs):
            if self.depth[part]:
                return fn(*args, **kwargs)
            self.depth[part] += 1
            self.synchronize()
            began = time.perf_counter()
            try:
                return fn(*args, **kwargs)
            finally:
                self.synchronize()
                self.seconds[part] += time.perf_counter() - began
                self.calls[part] += 1
                self.depth[part] -= 1
        return wrapper


@contextlib.contextmanager
def instrumented(clock: PartClock) -> Iterator[PartClock]:
    """TIMED's functions wrapped by ``clock`` inside the block, restored after it (the other rows of
    the run are timed unwrapped)."""
    # an earlier version of the package (tools/gpu/ab.py) lacks some
    present = [(owner, name, part) for owner, name, part in TIMED if name in vars(owner)]
    saved = [(owner, name, vars(owner)[name]) for owner, name, _ in present]
    for owner, name, part in present:
        setattr(owner, name, clock.timed(part, getattr(owner, name)))
    try:
        yield clock
    finally:
        for owner, name, original in saved:
            setattr(owner, name, original)


def parts_report(clock: PartClock, total: float, windows: int) -> Dict[str, dict]:
    """Seconds, share of ``total`` and milliseconds per window of each part in ORDER; the residues
    (the window loop's host time, the transcription's) by difference."""
    seconds = dict(clock.seconds)
    generate = seconds.pop("window decoding", 0.0)
    seconds["window loop (host)"] = generate - sum(seconds.get(p, 0.0) for p in INSIDE_GENERATE)
    seconds["transcription (host)"] = total - generate - sum(
        v for k, v in seconds.items() if k not in INSIDE_GENERATE and k != "window loop (host)")
    return {part: dict(seconds=round(seconds.get(part, 0.0), 4), share=round(seconds.get(part, 0.0) / total, 4),
                       ms_per_window=round(seconds.get(part, 0.0) * 1e3 / max(windows, 1), 3),
                       calls=int(clock.calls.get(part, 0)))
            for part in ORDER}


def measure_parts(run: Callable[[object], dict], clips: List[object], synchronize: Callable[[], None]) -> dict:
    """``run`` over ``clips`` (already warmed up) with every part timed: the report, the total, the
    windows and the passes."""
    clock = PartClock(synchronize)
    with instrumented(clock):
        synchronize()
        began = time.perf_counter()
        results = [run(clip) for clip in clips]
        synchronize()
        total = time.perf_counter() - began
    stats = [r.get("medusa", {}) for r in results]
    windows = sum(int(s.get("windows", 0)) for s in stats)
    return dict(total_s=round(total, 4), windows=windows, passes=sum(int(s.get("decoder_steps", 0)) for s in stats),
                parts=parts_report(clock, total, windows))


def parts_markdown(label: str, measured: dict) -> str:
    lines = [f"{label}: {measured['total_s']:.2f} s over {measured['windows']} windows, {measured['passes']} passes "
             "(every part synchronised)", "", "| part | seconds | share | ms per window | calls |",
             "|---|---|---|---|---|"]
    for part, p in measured["parts"].items():
        lines.append(f"| {part} | {p['seconds']:.3f} | {p['share']:.0%} | {p['ms_per_window']:.2f} | {p['calls']} |")
    return "\n".join(lines)
