"""How a CTC draft head does on recordings: its draft's errors, the passes it saves, the time it costs.

For each clip of a CSV (``audio``, ``sentence``; at most 30 s, one window) with ``<model>-ctc``:

- the head's greedy draft against the main model's greedy output (``whisper.decode``): token error
  rate (the draft re-encoded with the main model's BPE) and character error rate;
- lossless decoding with the draft: decoder passes, tokens per pass, passes per window, whether the
  text equals ``whisper.decode``'s, and the proposer's counts (re-alignments, timestamps drafted and
  accepted, end of text drafted and accepted);
- times, interleaved per clip in a rotating order (whisper.decode, ours with the draft, ours
  without speculation): decoder seconds, of which the head's pass and the proposer; speedups.

    python -m tools.bench ctc --csv data/real/real.csv --model base --limit 60 --threads 2 [--timestamps]

Writes OUT.json and prints a summary with the machine's load average at start and end.
"""

from __future__ import annotations

import argparse
import csv
import json
import os
import time
from pathlib import Path

import torch
import whisper
from tqdm import tqdm

import medusa_whisper
from medusa_whisper.audio.files import load_audio
from medusa_whisper.drafting import factory
from medusa_whisper.drafting.ctc_lexicon import edit_distance
from tools import ROOT


def read_rows(path: Path, limit: int, max_seconds: float = 30.0):
    with path.open(newline="") as f:
        rows = [r for r in csv.DictReader(f) if 0 < float(r.get("seconds") or 0) <= max_seconds]
    return rows[:limit] if limit else rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--csv", type=Path, default=ROOT / "data" / "real" / "real.csv")
    parser.add_argument("--model", default="base", help="base model; the head is <model>-ctc")
    parser.add_argument("--head", default=None, help="a heads file (named <model>-ctc.pt) instead of weights/<model>-ctc.pt")
    parser.add_argument("--limit", type=int, default=0)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--compute-type", default="float32", help="float32, int8 or bfloat16 (whisper.decode runs "
                        "the same converted model)")
    parser.add_argument("--timestamps", action="store_true", help="decode with timestamps")
    parser.add_argument("--no-timing", action="store_true", help="skip whisper.decode and --mode off (draft stats only)")
    parser.add_argument("--decoding", type=json.loads, default=None,
                        help="override the head's proposer settings (JSON), e.g. '{\"timestamps\": \"none\"}'")
    parser.add_argument("--out", type=Path, default=None)
    args = parser.parse_args()

    torch.set_num_threads(args.threads)
    load_start = os.getloadavg()[0]
    name = args.head or f"{args.model}-ctc"
    if Path(name).is_file():  # a heads file elsewhere: loaded by its name from its folder
        os.environ["MEDUSA_WHISPER_HEADS_DIR"] = str(Path(name).resolve().parent)
        name = Path(name).stem
    model = medusa_whisper.load_model(name, device="cpu", compute_type=args.compute_type)
    head = model.draft_head
    if args.decoding:
        head.config.decoding = {**head.config.decoding, **args.decoding}
    made = []  # the proposer of each decoding, for its counts
    original = factory.head_proposer

    def keep(*a, **k):
        proposer = original(*a, **k)
        made.append(proposer)
        return proposer

    factory.head_proposer = keep
    tokenizer = whisper.tokenizer.get_tokenizer(model.is_multilingual, num_languages=model.num_languages,
                                                language="en", task="transcribe")
    rows = read_rows(args.csv, args.limit)
    options = dict(language="en", fp16=False, without_timestamps=not args.timestamps)
    per_clip = []
    began = time.perf_counter()
    for i, row in enumerate(tqdm(rows, desc="clips", unit="clip")):
        audio = load_audio(args.csv.parent / row["audio"])
        mel = whisper.log_mel_spectrogram(whisper.pad_or_trim(torch.from_numpy(audio)))
        with torch.no_grad():
            features = model.embed_audio(mel[None])[0]
        runs = {}

        def vanilla():
            t = time.perf_counter()
            r = whisper.decode(model, features, whisper.DecodingOptions(**options))
            runs["vanilla"] = (r, time.perf_counter() - t)

        def ours():
            t = time.perf_counter()
            r = medusa_whisper.decode(model, features, **options)
            runs["ctc"] = (r, time.perf_counter() - t)

        def off():
            t = time.perf_counter()
            r = medusa_whisper.decode(model, features, mode="off", **options)
            runs["off"] = (r, time.perf_counter() - t)

        order = [vanilla, ours, off] if not args.no_timing else [vanilla, ours]
        shift = i % len(order)
        for fn in order[shift:] + order[:shift]:
            fn()
        v, v_seconds = runs["vanilla"]
        r, r_seconds = runs["ctc"]
        proposer = made[-1]
        draft_tokens = tokenizer.encoding.encode(proposer.draft.text)
        reference = [t for t in v.tokens if t < tokenizer.eot]
        reference_text = tokenizer.decode(reference)
        per_clip.append(dict(
            audio=row["audio"], seconds=float(row["seconds"]), identical=r.tokens == v.tokens,
            tokens=r.tokens_produced, passes=r.decoder_steps, draft_token_errors=edit_distance(draft_tokens, reference),
            reference_tokens=len(reference), draft_char_errors=edit_distance(proposer.draft.text.strip(),
                                                                             reference_text.strip()),
            reference_chars=len(reference_text.strip()), vanilla_seconds=v_seconds, ctc_seconds=r_seconds,
            off_seconds=runs["off"][1] if "off" in runs else None, draft_seconds=r.draft_seconds,
            head_seconds=proposer.setup_seconds, counts=proposer.counts,
            draft=proposer.draft.text, vanilla_text=v.text))
    wall = time.perf_counter() - began

    n = len(per_clip)
    total = lambda key: sum(c[key] for c in per_clip if c[key] is not None)  # noqa: E731
    counts = {k: sum(c["counts"][k] for c in per_clip) for k in per_clip[0]["counts"]} if per_clip else {}
    summary = dict(
        model=args.model, head=args.head or f"{args.model}-ctc", compute_type=args.compute_type, clips=n, timestamps=args.timestamps,
        threads=args.threads, identical_share=sum(c["identical"] for c in per_clip) / max(n, 1),
        tokens_per_pass=total("tokens") / max(total("passes"), 1), passes_per_window=total("passes") / max(n, 1),
        tokens_per_window=total("tokens") / max(n, 1),
        draft_token_error_rate=total("draft_token_errors") / max(total("reference_tokens"), 1),
        draft_char_error_rate=total("draft_char_errors") / max(total("reference_chars"), 1),
        head_ms_per_window=1000 * total("head_seconds") / max(n, 1),
        draft_ms_per_window=1000 * total("draft_seconds") / max(n, 1),
        decoder_seconds=dict(vanilla=total("vanilla_seconds"), ctc=total("ctc_seconds"),
                             off=total("off_seconds") if not args.no_timing else None),
        speedup_vs_whisper_decode=total("vanilla_seconds") / max(total("ctc_seconds"), 1e-9),
        speedup_vs_off=(total("off_seconds") / max(total("ctc_seconds"), 1e-9)) if not args.no_timing else None,
        counts=counts, load_start=load_start, load_end=os.getloadavg()[0], wall_seconds=round(wall, 1),
        decoding=head.config.decoding, pass_costs=made[-1].settings.row_costs if made else None)
    out = args.out or ROOT / "bench_out" / f"ctc_report_{args.model}_{args.compute_type}{'_ts' if args.timestamps else ''}.json"
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(dict(summary=summary, clips=per_clip), indent=1))
    print(json.dumps(summary, indent=1))
    print(f"wrote {out}")


if __name__ == "__main__":
    main()
