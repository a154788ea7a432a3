"""Where an EAGLE head's first drafted token goes wrong: teacher-forced, by kind of token.

For each recording (real ones from data/real by default, as make bench picks them; never used in
training) the main model decodes greedily (whisper.decode, no timestamps); one teacher-forced pass
gives its post-LayerNorm state f_t at every position, and the head, fed [f_t ; token t+1] over the
whole window, predicts token t+2, as its first draft does in decoding. Counted per target token:
right or not (top 1 and top 5 over the head's shortlist), whether the target is in the shortlist at
all, whether a projection over the whole vocabulary would have got it, and the kind of token (a word
start, a word's continuation, punctuation, or a special token such as end-of-text).

    python -m tools.bench eagle --model base-eagle --clips 30
"""

from __future__ import annotations

import argparse
import collections
import json
from pathlib import Path

import torch
import whisper
from tqdm import tqdm

import medusa_whisper
from medusa_whisper.audio.files import load_audio
from medusa_whisper.training.features import teacher_forced_states
from tools import ROOT


def kind_of(token: int, tokenizer) -> str:
    if token >= tokenizer.eot:
        return "special"
    text = tokenizer.decode([token])
    if text.startswith(" "):
        return "word start"
    if text and not text[0].isalnum():
        return "punctuation"
    return "continuation"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", default="base-eagle")
    parser.add_argument("--real", type=Path, default=ROOT / "data" / "real" / "real.csv")
    parser.add_argument("--clips", type=int, default=30)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--out", type=Path, default=None, help="also write the counts as JSON here")
    args = parser.parse_args()
    from tools.bench.run import _real_records

    torch.set_num_threads(args.threads)
    model = medusa_whisper.load_model(args.model, device="cpu")
    head, decoder = model.draft_head, model.decoder
    if head is None or head.kind != "eagle":
        raise SystemExit(f"{args.model}: not a model with an EAGLE head")
    tokenizer = whisper.tokenizer.get_tokenizer(model.is_multilingual, num_languages=model.num_languages,
                                                language="en", task="transcribe")
    in_shortlist = torch.zeros(model.dims.n_vocab, dtype=torch.bool)
    in_shortlist[head.token_ids] = True
    counts: collections.Counter = collections.Counter()
    by_kind = collections.defaultdict(collections.Counter)
    prompt = list(tokenizer.sot_sequence_including_notimestamps)
    for record in tqdm(_real_records(args.real, args.clips), desc="clips", unit="clip"):
        mel = whisper.log_mel_spectrogram(whisper.pad_or_trim(torch.from_numpy(load_audio(record["audio"]))),
                                          model.dims.n_mels)
        with torch.no_grad():
            features = model.embed_audio(mel[None])
            result = whisper.decode(model, features[0], whisper.DecodingOptions(language="en", fp16=False,
                                                                               without_timestamps=True))
            tokens = prompt + result.tokens + [tokenizer.eot]
            states = teacher_forced_states(model, features, torch.tensor([tokens]))[1][0]
            n = len(tokens) - 1
            fused = head.fused(states[None, :n], torch.tensor([tokens[1 : n + 1]]), torch.arange(1, n + 1), decoder)
            predicted = head.ln(head.block(fused, features, mask=decoder.mask[:n, :n]))[0]
            top5 = head.token_ids[head.shortlist_logits(predicted, decoder).topk(5, dim=-1).indices]
            whole = (predicted @ decoder.token_embedding.weight.T).argmax(dim=-1)
        for t in range(len(prompt) - 1, n - 1):  # rows whose target t+2 is a sampled token
            target = tokens[t + 2]
            kind = kind_of(target, tokenizer)
            hit = int(top5[t, 0] == target)
            for c in (counts, by_kind[kind]):
                c["targets"] += 1
                c["top1"] += hit
                c["top5"] += int(target in top5[t].tolist())
                c["in_shortlist"] += int(in_shortlist[target])
                c["whole_vocabulary_top1"] += int(whole[t] == target)
    rows = {"all": counts, **dict(sorted(by_kind.items(), key=lambda kv: -kv[1]["targets"]))}
    where = args.real.resolve()
    where = where.relative_to(ROOT) if where.is_relative_to(ROOT) else where
    lines = [f"`{args.model}`, {args.clips} recordings of `{where}` (held out from training), teacher-forced "
             "first drafted token", "",
             "| target tokens | count | right (top 1) | in top 5 | in the shortlist | right over the whole vocabulary |",
             "|---|---|---|---|---|---|"]
    for name, c in rows.items():
        n = max(c["targets"], 1)
        lines.append(f"| {name} | {c['targets']} | {100 * c['top1'] / n:.1f} % | {100 * c['top5'] / n:.1f} % | "
                     f"{100 * c['in_shortlist'] / n:.1f} % | {100 * c['whole_vocabulary_top1'] / n:.1f} % |")
    text = "\n".join(lines)
    print(text)
    if args.out is not None:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        Path(f"{args.out}.json").write_text(json.dumps({k: dict(v) for k, v in rows.items()}, indent=1) + "\n")
        Path(f"{args.out}.md").write_text(text + "\n")


if __name__ == "__main__":
    main()
