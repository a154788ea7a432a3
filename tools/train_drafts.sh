#!/usr/bin/env bash
# A draft head trained on the hours of `make speech` within a time budget (make drafts).
# Usage: tools/train_drafts.sh BASE TYPE HOURS MINUTES   e.g.  tools/train_drafts.sh base eagle 10 60
# TYPE: eagle, ctc or linear (Medusa-Linear). The base model's encoder output, greedy labels and
# decoder states are cached once per hour block under data/cache/BASE-speech/ (another head type or
# a run on more hours reuses them); the run resumes from its checkpoint when started again, and the
# learning rate decays over MINUTES. One thread: training shares the machine.
# Outputs: data/runs/BASE-TYPE-hHOURS.pt and its .work/ (history.json, record.json, training.png);
# a learning curve over runs: python -m tools.learning_curve data/runs/BASE-TYPE-h*.work --out PNG.
set -euo pipefail
cd "$(dirname "$0")/.."
BASE=${1:?base model}; TYPE=${2:?eagle, ctc or linear}; HOURS=${3:?hours of speech}; MINUTES=${4:?minutes of training}
PY=${PY:-.venv/bin/python}
RUN=data/runs/$BASE-$TYPE-h$HOURS
case "$TYPE" in
  eagle) EXTRA="--batch-windows 4 --eval-every 250 --checkpoint-every 50" ;;
  ctc) EXTRA="--batch-windows 8 --eval-every 100 --checkpoint-every 50" ;;
  linear) EXTRA="--num-heads 5 --proposal-vocab 16384 --lr 3e-3 --eval-every 100 --checkpoint-every 50" ;;
  *) echo "train_drafts.sh: TYPE must be eagle, ctc or linear, not $TYPE" >&2; exit 2 ;;
esac
# --epochs is only a ceiling here: the minutes end the run first
$PY -m medusa_whisper.cli train --base "$BASE" --heads-type "$TYPE" \
  --data data/speech/train.csv --heldout data/speech/heldout.csv --cache-dir "data/cache/$BASE-speech" \
  --hours "$HOURS" --minutes "$MINUTES" --epochs "${EPOCHS:-1000}" --threads "${THREADS:-1}" \
  --out "$RUN.pt" --work-dir "$RUN.work" $EXTRA ${TRAIN_ARGS:-}
