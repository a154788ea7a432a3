#!/usr/bin/env bash
# On the CUDA machine, in the repository's root, after the calls of .gpu/PLAN.md copied every part of
# the payload to $GPU_DIR (python -m tools.gpu pack made them): join and check the payload, install
# the wheels the machine lacks, run the CUDA tests, then every measurement of issue 34 in one run.
# Results under $OUT. A rehearsal on a CPU: GPU_DIR=... OUT=... DEVICE=cpu BENCH_ARGS="--limit 3" bash tools/gpu/run.sh
set -uo pipefail
GPU_DIR=${GPU_DIR:-/tmp/gpu}
DEVICE=${DEVICE:-cuda}
PYTHON=${PYTHON:-python3}
MODEL=${MODEL:-base}
BENCH_ARGS=${BENCH_ARGS:-}
AB_ARGS=${AB_ARGS:-}
OUT=${OUT:?OUT must name the folder for the results}
mkdir -p "$OUT"
cd "$GPU_DIR" || exit 1
if ! (cat payload.tar.part* | sha256sum | cut -d' ' -f1 | diff - payload.sha256 >/dev/null); then
  echo "run.sh: the payload's parts in $GPU_DIR do not add up (missing or damaged part): $(ls)"; exit 1
fi
cat payload.tar.part* | tar -x -C "$GPU_DIR" || exit 1
"$PYTHON" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target "$GPU_DIR/site" \
  "$GPU_DIR"/wheels/*.whl || exit 1
cd - >/dev/null || exit 1
export PYTHONPATH="$GPU_DIR/site:$PWD" PYTHONUNBUFFERED=1
export MEDUSA_WHISPER_CACHE="$GPU_DIR/cache" MEDUSA_WHISPER_CUDA_TEST_MODEL="$MODEL" MEDUSA_WHISPER_HEADS_DIR="$PWD/weights"
{ nvidia-smi -L 2>/dev/null; "$PYTHON" -c "import torch, medusa_whisper; print('torch', torch.__version__, 'cuda', torch.cuda.is_available())"; } | tee "$OUT/env.log"
# the tests may not eat the measurements' time: at most TEST_SECONDS
timeout "${TEST_SECONDS:-150}" "$PYTHON" -m pytest -q -p no:cacheprovider --durations=8 tests/test_fixed_decoding.py tests/test_fixed_batched.py tests/test_fixed_candidates.py \
  tests/test_device_proposers.py tests/test_encoder_graph.py -k "captured or synchronisation or on_cuda" 2>&1 \
  | tee "$OUT/tests.log" | tail -40
# a before and after on this machine (tools/gpu/ab.py): AB_BEFORE names a folder holding the earlier
# version's medusa_whisper; each version runs twice, alternately, one process each
if [ -n "${AB_BEFORE:-}" ]; then
  for round in 1 2; do
    (cd "$AB_BEFORE" && PYTHONPATH="$GPU_DIR/site:$OLDPWD" "$PYTHON" -m tools.gpu.ab --device "$DEVICE" --model "$MODEL" \
      --clips "$GPU_DIR/clips/clips.csv" --label "before$round" --out "$OUT" $AB_ARGS)
    "$PYTHON" -m tools.gpu.ab --device "$DEVICE" --model "$MODEL" --clips "$GPU_DIR/clips/clips.csv" \
      --label "after$round" --out "$OUT" $AB_ARGS
  done 2>&1 | grep -v "^\s*$" | tee "$OUT/ab.log" | grep -E "^(before|after)[12] "
fi
LONG=()
[ -f "$GPU_DIR/clips/long.flac" ] && LONG=(--long "$GPU_DIR/clips/long.flac")
"$PYTHON" -m tools.bench gpu --device "$DEVICE" --model "$MODEL" --clips "$GPU_DIR/clips/clips.csv" "${LONG[@]}" \
  --out "$OUT" $BENCH_ARGS 2>&1 | tee "$OUT/bench.log" | grep -v "^\s*$" | tail -60
