"""What a token costs at each EAGLE chain length on this machine, and the length the CPU's decoding
chooses (``drafting.pass_costs.chosen_chain_depth``): per length d, the decoder's pass over 1 + d
rows and the head's drafting of the chain (both measured here, in one-row passes), over the tokens
a pass gives (1 + the head's held-out acceptance at depths 1..d, from its heads file's record);
length 0 is plain decoding (one one-row pass a token), chosen where no chain beats it.

    python -m tools.bench eagle-chain --model base-eagle --compute-types int8,float32

Writes a table (markdown) and a plot of the predicted one-row passes a token.
"""

from __future__ import annotations

import argparse
from pathlib import Path

import torch

import medusa_whisper
from medusa_whisper.drafting.device.eagle import chain_depth
from medusa_whisper.drafting.draft_head import head_part
from medusa_whisper.drafting.pass_costs import CHAIN_DEPTHS, measure_chains
from tools import ROOT


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", default="base-eagle")
    parser.add_argument("--compute-types", default="int8,float32")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--out", type=Path, default=ROOT / "bench_out" / "eagle_chain")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    args.out.mkdir(parents=True, exist_ok=True)
    lines = ["| compute type | chain length | pass over 1 + d rows | drafting | tokens a pass (held out) | "
             "one-row passes a token | chosen |", "|---|---|---|---|---|---|---|"]
    curves = {}
    for compute_type in args.compute_types.split(","):
        model = medusa_whisper.load_model(args.model, device="cpu", compute_type=compute_type)
        head = head_part(model.draft_head, "eagle")
        accepted = tuple(head.config.accepted_at_depth)
        if not accepted:
            raise SystemExit(f"{args.model}: its heads file's record has no held-out acceptance by depth")
        depths = CHAIN_DEPTHS[:len(accepted)]
        passes, chains = measure_chains(model, head, depths)
        chosen = chain_depth(accepted, passes, chains)
        curves[compute_type] = []
        lines.append(f"| {compute_type} | 0 (plain decoding) | 1.000 | 0.000 | 1.000 | 1.000 | "
                     f"{'yes' if chosen == 0 else ''} |")
        for d in depths:
            tokens = 1 + sum(accepted[:d])
            per_token = (passes[d - 1] + chains[d - 1]) / tokens
            curves[compute_type].append(per_token)
            lines.append(f"| {compute_type} | {d} | {passes[d - 1]:.3f} | {chains[d - 1]:.3f} | {tokens:.3f} | "
                         f"{per_token:.3f} | {'yes' if d == chosen else ''} |")
    table = "\n".join(lines)
    (args.out / "eagle_chain.md").write_text(table + "\n")
    print(table)
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6, 3.6))
    for compute_type, per_token in curves.items():
        ax.plot(range(1, len(per_token) + 1), per_token, marker="o", label=f"{args.model} {compute_type}")
    ax.axhline(1.0, color="grey", linestyle="--", label="plain decoding (a pass a token)")
    ax.set_xticks(range(1, max(len(c) for c in curves.values()) + 1))
    ax.set_xlabel("EAGLE chain length (draft tokens a pass)")
    ax.set_ylabel("one-row passes a token (predicted)")
    ax.set_title(f"{args.threads} threads: costs measured here, acceptance held out", fontsize=9)
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(args.out / "eagle_chain.png", dpi=110)
    print(f"wrote {args.out / 'eagle_chain.md'} and eagle_chain.png")


if __name__ == "__main__":
    main()
