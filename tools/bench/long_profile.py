"""Where a long transcription's time goes, window by window (issue 46, items 2 and 3).

    python -m tools.bench long-profile --audio data/long/real_8min.flac
    python -m tools.bench long-profile --audio data/long/real_repeated_3min.flac --best-of 5
    python -m tools.bench long-profile --vad-chunks --batch-size 8

Runs ``medusa_whisper.transcribe`` once on the CPU's products (after a warm-up clip, so that the
first-use measurements of the routes do not count), with each part of the work timed where it is
called:

- the encoder (inside the attempts, as whisper's ``decode`` runs it, but counted apart);
- greedy attempts (temperature 0), and inside them the window's cross-attention keys and values
  (``FixedStep.set_audio``), its prompt pass (the pass from slot 0), the later passes, the vocabulary
  projections; what is left of an attempt is the host's (whisper's rules, acceptance, the loop);
- sampled attempts (the temperature fallback, ``best_of`` candidates), and inside them the
  candidates' decoder passes; what is left is the draws and the rules.

With ``--vad-chunks`` the recording is cut by the VAD and its chunks decoded side by side
(``transcribe(..., vad_chunks=True)``): then the VAD is timed, and the batch loop's parts (each
window's cross-attention keys and values and prompt pass, the passes over the items in use, their
vocabulary products); what is left of the loop is the host's (rules, mel, windows' results). Windows
decoded alone (the fallback) are timed as attempts, as above.

Prints the totals, the windows that cost the most, and the largest share; ``--out`` writes JSON.
"""

from __future__ import annotations

import argparse
import collections
import json
import time
from pathlib import Path
from typing import Callable, Dict, List

import torch

import medusa_whisper
from medusa_whisper.audio import vad
from medusa_whisper.decoding import batches, candidates
from medusa_whisper.step.fixed import FixedStep
from medusa_whisper.transcription import chunked, longform
from tools import ROOT

WARM_UP = ROOT / "data" / "real" / "alsa_front_center.flac"


class Clock:
    """Seconds and calls per part, and per window the seconds of each of its attempts."""

    def __init__(self):
        self.spent: Dict[str, float] = collections.defaultdict(float)
        self.calls: Dict[str, int] = collections.Counter()
        self.windows: List[Dict[str, object]] = []

    def clear(self) -> None:
        self.spent.clear()
        self.calls.clear()
        self.windows.clear()

    def timed(self, part: Callable[..., str], fn: Callable) -> Callable:
        """``fn`` with its time added to the part ``part(*args)`` names."""
        def wrapper(*args, **kwargs):
            began = time.perf_counter()
            try:
                return fn(*args, **kwargs)
            finally:
                key = part(*args, **kwargs)
                self.spent[key] += time.perf_counter() - began
                self.calls[key] += 1
        return wrapper


def instrument(model, clock: Clock) -> None:
    """Wrap the parts the module docstring lists (in this process only: a tool, not the package)."""
    model.encoder.forward = clock.timed(lambda *a, **k: "encoder", model.encoder.forward)
    step = FixedStep  # the one step: a window's (batch 1) or the batch loop's
    step.set_audio = clock.timed(lambda self, *a, **k: "greedy: cross keys and values" if self.batch == 1
                                 else "batch: cross keys and values", step.set_audio)
    step.pass_at = clock.timed(lambda self, tokens, positions, start, mask: "greedy: prompt pass" if start == 0
                               else "greedy: later passes", step.pass_at)
    step.logits = clock.timed(lambda self, *a, **k: "greedy: vocabulary" if self.batch == 1 else "batch: vocabulary",
                              step.logits)
    candidates.CandidatesInference.next_logits = clock.timed(lambda *a, **k: "sampled: candidates' passes",
                                                             candidates.CandidatesInference.next_logits)
    step.prompt = clock.timed(lambda *a, **k: "batch: prompt passes", step.prompt)
    step.rows = clock.timed(lambda *a, **k: "batch: passes", step.rows)
    batches.BatchDecoder.run = clock.timed(lambda *a, **k: "batch loop", batches.BatchDecoder.run)
    chunked.speech_spans = clock.timed(lambda *a, **k: "VAD", vad.speech_spans)
    real_decode = longform.decode

    def decode(model_, mel, options, **kwargs):
        greedy = options.temperature == 0
        if greedy:  # every window starts at temperature 0
            clock.windows.append({"attempts": [], "tokens": 0})
        began, encoder = time.perf_counter(), clock.spent["encoder"]
        result = real_decode(model_, mel, options, **kwargs)
        # the attempt's own time: the encoder runs inside it (whisper's decode takes the mel), counted apart
        seconds = time.perf_counter() - began - (clock.spent["encoder"] - encoder)
        clock.spent["greedy attempts" if greedy else "sampled attempts"] += seconds
        window = clock.windows[-1]
        window["attempts"].append({"temperature": options.temperature, "seconds": round(seconds, 3)})
        window["tokens"] = len(result.tokens)  # one window's mel: one result
        return result
    longform.decode = decode


def report(clock: Clock, total: float, segments: int) -> Dict[str, object]:
    spent = dict(clock.spent)
    greedy_parts = [k for k in spent if k.startswith("greedy: ")]
    if "greedy attempts" in spent:
        spent["greedy: host (rules, acceptance, loop)"] = spent["greedy attempts"] - sum(spent[k] for k in greedy_parts)
    if "sampled attempts" in spent:
        spent["sampled: draws, rules and the rest"] = (spent["sampled attempts"]
                                                       - spent.get("sampled: candidates' passes", 0.0))
    if "batch loop" in spent:  # the encoder and the windows decoded alone run inside the loop
        batch_parts = [k for k in spent if k.startswith("batch: ")]
        spent["batch: host (rules, mel, the loop)"] = spent["batch loop"] - sum(spent[k] for k in batch_parts) - sum(
            spent.get(k, 0.0) for k in ("encoder", "greedy attempts", "sampled attempts"))
        inside = spent.pop("batch loop") + spent.get("VAD", 0.0)
    else:
        inside = spent.get("greedy attempts", 0.0) + spent.get("sampled attempts", 0.0) + spent.get("encoder", 0.0)
    spent["outside the attempts and the encoder (audio, segments)"] = total - inside
    fallback = sum(1 for w in clock.windows if len(w["attempts"]) > 1)
    print(f"total {total:.2f} s, {len(clock.windows)} windows ({fallback} fell back), {segments} segments")
    print("\n| part | seconds | share | calls |\n|---|---|---|---|")
    for key in ("VAD", "encoder", "batch: cross keys and values", "batch: prompt passes", "batch: passes",
                "batch: vocabulary", "batch: host (rules, mel, the loop)", "greedy attempts",
                "greedy: cross keys and values", "greedy: prompt pass",
                "greedy: later passes", "greedy: vocabulary", "greedy: host (rules, acceptance, loop)",
                "sampled attempts", "sampled: candidates' passes", "sampled: draws, rules and the rest",
                "outside the attempts and the encoder (audio, segments)"):
        if key in spent:
            print(f"| {key} | {spent[key]:.2f} | {spent[key] / total:.0%} | {clock.calls.get(key, '')} |")
    leaves = {k: v for k, v in spent.items() if ":" in k or k in ("encoder", "VAD")}
    largest = max(leaves, key=leaves.get)
    print(f"\nlargest share: {largest} ({leaves[largest]:.2f} s, {leaves[largest] / total:.0%})")
    print("\nthe five dearest windows: | window | seconds | attempts | tokens |")
    costs = [(sum(a["seconds"] for a in w["attempts"]), i, w) for i, w in enumerate(clock.windows)]
    for seconds, i, w in sorted(costs, reverse=True)[:5]:
        print(f"| {i} | {seconds:.2f} | {len(w['attempts'])} | {w['tokens']} |")
    return {"total_s": round(total, 3), "seconds": {k: round(v, 3) for k, v in spent.items()},
            "calls": dict(clock.calls), "windows": clock.windows, "largest": largest}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--audio", type=Path, default=ROOT / "data" / "long" / "real_8min.flac")
    parser.add_argument("--model", default="base")
    parser.add_argument("--compute-type", default="int8")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--best-of", type=int, default=None,
                        help="candidates sampled per fallback temperature (default: transcribe's, as tools.bench long)")
    parser.add_argument("--vad-chunks", action="store_true", help="cut by the VAD, chunks side by side")
    parser.add_argument("--batch-size", type=int, default=8, help="chunks side by side, with --vad-chunks")
    parser.add_argument("--seed", type=int, default=0, help="torch's generator, which the fallback samples from")
    parser.add_argument("--out", type=Path, default=None)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    model = medusa_whisper.load_model(args.model, device="cpu", compute_type=args.compute_type)
    clock = Clock()
    instrument(model, clock)
    options = dict(language="en", verbose=None, **({} if args.best_of is None else {"best_of": args.best_of}))
    chunks = dict(vad_chunks=True, batch_size=args.batch_size) if args.vad_chunks else {}
    medusa_whisper.transcribe(model, str(WARM_UP), **options, **chunks)  # (the VAD's model loaded too)
    clock.clear()
    torch.manual_seed(args.seed)
    began = time.perf_counter()
    out = medusa_whisper.transcribe(model, str(args.audio), **options, **chunks)
    result = report(clock, time.perf_counter() - began, len(out["segments"]))
    if args.out:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(json.dumps({"audio": str(args.audio), "model": args.model, "compute_type": args.compute_type,
                                        "threads": args.threads, **chunks, **result}, indent=1) + "\n")


if __name__ == "__main__":
    main()
