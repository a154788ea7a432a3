"""Every measurement of medusa_whisper, one subcommand each; results go to bench_out/ unless --out
says otherwise. The Makefile's bench targets run these."""

from tools.commands import Command, dispatch

COMMANDS = {
    "run": Command("tools.bench.run", "make bench, bench-quick, bench-setup: every system a user could pick"),
    "long": Command("tools.bench.long", "make bench-long: long-form transcribe against whisper.transcribe"),
    "pass": Command("tools.bench.decoder_pass", "make bench-pass: one decoder pass, beside the floor its bytes set"),
    "pass-variants": Command("tools.bench.pass_variants", "the int8 pass with other attention, and as the fixed step"),
    "pass-kernels": Command("tools.bench.pass_kernels", "operators per in-pass drafting pass, by part (what a GPU graph replays)"),
    "long-profile": Command("tools.bench.long_profile", "where a long transcription's time goes, window by window"),
    "batch": Command("tools.bench.batch", "make bench-batch: archive throughput against --batch-size"),
    "speed": Command("tools.bench.decoder_speed", "make speed: our decoder against whisper.decode greedy"),
    "compute-speed": Command("tools.bench.compute_speed", "one pass and the encoder at each compute type"),
    "compute-decode": Command("tools.bench.compute_decode", "decoder time per compute type, and the exact mode"),
    "drafters": Command("tools.bench.drafters", "every proposer on the same real recordings"),
    "heads": Command("tools.bench.heads", "held-out figures of trained Medusa heads"),
    "ctc": Command("tools.bench.ctc", "a CTC draft head on recordings"),
    "typical": Command("tools.bench.typical", "lossless against typical acceptance: tokens per pass, time, WER"),
    "eagle": Command("tools.bench.eagle_first_token", "where an EAGLE head's first drafted token goes wrong"),
    "eagle-chain": Command("tools.bench.eagle_chain", "a token's cost at each EAGLE chain length here, and the one chosen"),
    "ray": Command("tools.bench.ray_workers", "transcribe --ray against one process"),
    "vocab-kernels": Command("tools.bench.vocab_kernels", "the int8 vocabulary's kernels here: ms, and held-out WER each"),
    "rows": Command("tools.bench.matmul_rows", "x @ W.T or W @ x.T for a decoder step's few rows on this CPU"),
    "row-products": Command("tools.bench.row_products", "issue 64: an int8 product over k rows against one, by kernel"),
    "attention-rows": Command("tools.bench.attention_rows", "issue 64: the decoder's invariant attention over k rows, by implementation"),
    "static-step": Command("tools.bench.static_step", "a static-shape decoder step, eager and compiled"),
    "gpu": Command("tools.bench.gpu", "issue 34 on a CUDA machine: every system, one pass profiled, capture times"),
    "kind-profile": Command("tools.bench.kind_profile", "this CPU kind's profile as data (medusa_whisper/kinds/), replayed by tests and by first runs"),
    "wer": Command("tools.bench.wer_compare", "paired bootstrap of WER between systems on the same recordings"),
}

if __name__ == "__main__":
    dispatch("python -m tools.bench", __doc__, COMMANDS)
