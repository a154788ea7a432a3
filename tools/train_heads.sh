#!/usr/bin/env bash
# The recipe of the shipped heads under weights/: corpus, caches, training, held-out measurement.
# Usage: tools/train_heads.sh BASE TYPE HEADS EPOCHS   e.g.  tools/train_heads.sh tiny.en linear 20 4
# Heads propose among the first 16384 token ids plus the special tokens (94 % of the targets in the
# corpus; a third of the cost of the whole vocabulary, in training and in decoding).
# Each stage resumes where it stopped; outputs go to data/ (git-ignored) until python -m tools.ship_heads.
set -euo pipefail
cd "$(dirname "$0")/.."
BASE=${1:?base model}; TYPE=${2:?linear or block}; HEADS=${3:?number of heads}; EPOCHS=${4:-4}
THREADS=${THREADS:-2}
PY=${PY:-.venv/bin/python}

[ -f data/corpus/train.csv ] || $PY -m tools.data corpus --out data/corpus

# The cache (encoder output, self-supervised labels, decoder states) is shared by both head types.
$PY -m medusa_whisper.cli train --base "$BASE" --heads-type "$TYPE" --num-heads "$HEADS" --epochs "$EPOCHS" \
  --data data/corpus/train.csv --heldout data/corpus/heldout.csv --cache-dir "data/cache/$BASE" \
  --proposal-vocab "${PROPOSAL_VOCAB:-16384}" --out "data/train/$BASE-$TYPE$HEADS.pt" --threads "$THREADS" --eval-every 25 --checkpoint-every 25 ${TRAIN_ARGS:-}
