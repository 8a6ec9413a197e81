#!/bin/bash
# Lesson 11: re-measure the parallelisms comparison on a quiet machine (~1-1.5 min).
# One torchrun launch of 4 processes trains all 14 strategies; writes the committed JSON that
# lessons/11_parallelisms.ipynb reads, and prints the table. Then re-execute the notebook:
#   .venv/bin/jupyter nbconvert --to notebook --execute --inplace lessons/11_parallelisms.ipynb
set -euo pipefail
cd "$(dirname "$0")/../../.."   # lessons/measurements/remeasure -> the repository root
OMP_NUM_THREADS=1 timeout 300 .venv/bin/python -m tp_from_scratch.bench parallelisms \
    --json lessons/measurements/parallelisms.json
