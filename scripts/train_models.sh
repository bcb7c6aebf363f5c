#!/bin/bash
# Train the shipped family in sequence (one process at a time, one BLAS thread), then write the model
# cards. About 95 minutes on the 2-core machine this project was built on. Logs go to runs/*.log.
set -eo pipefail
cd "$(dirname "$0")/.."
export OPENBLAS_NUM_THREADS=1
PY=${PYTHON:-.venv/bin/python}
mkdir -p runs
for preset in target-mha target-gqa target-mqa draft draft-distilled; do
    echo "=== $preset $(date -u +%H:%M:%S)"
    $PY -u -m engine.training.cli --preset "$preset" ${RESUME:+--resume} 2>&1 | tee "runs/$preset.log"
done
echo "=== model cards $(date -u +%H:%M:%S)"
$PY -u -m engine.training.model_cards 2>&1 | tee runs/model_cards.log
echo "=== done $(date -u +%H:%M:%S)"
