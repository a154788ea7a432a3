"""Where a fallback-heavy transcription's time goes (issue 46, item 2): greedy attempts, sampled
attempts and, inside them, the candidates' decoder passes, and the encoder; base int8, 2 threads.

    python tools/bench/fallback_profile.py [AUDIO]   (default: make's data/long/real_repeated_3min.flac)
"""
import collections
import sys
import time

import torch

import medusa_whisper
from medusa_whisper.decoding import candidates
from medusa_whisper.transcription import longform

AUDIO = sys.argv[1] if len(sys.argv) > 1 else "data/long/real_repeated_3min.flac"
torch.set_num_threads(2)
model = medusa_whisper.load_model("base", device="cpu", compute_type="int8")
spent = collections.defaultdict(float); count = collections.Counter()

def timed(key, fn):
    def wrapper(*a, **k):
        t = time.perf_counter()
        try:
            return fn(*a, **k)
        finally:
            spent[key] += time.perf_counter() - t; count[key] += 1
    return wrapper

real_decode = longform.decode
def decode(model_, mel, options, **kw):
    key = "greedy attempts (T=0)" if options.temperature == 0 else f"sampled attempts (T>0, best_of {options.best_of})"
    return timed(key, real_decode)(model_, mel, options, **kw)
longform.decode = decode
model.encoder.forward = timed("encoder", model.encoder.forward)
candidates.CandidatesInference.next_logits = timed("candidates' decoder passes", candidates.CandidatesInference.next_logits)
medusa_whisper.transcribe(model, "data/real/alsa_front_center.flac", language="en", verbose=None, best_of=5)  # warm-up
spent.clear(); count.clear()
t = time.perf_counter()
out = medusa_whisper.transcribe(model, AUDIO, language="en", verbose=None, best_of=5)
total = time.perf_counter() - t
print(f"total {total:.2f} s, {len(out['segments'])} segments")
for key in sorted(spent, key=spent.get, reverse=True):
    print(f"  {key}: {spent[key]:.2f} s in {count[key]} calls")
