#!/bin/bash
# Lesson 11, the pipeline: the measured bubble and activations in flight on real processes
# (2 stages, torchrun/gloo; 2 processes because the test machine has 2 cores: one core per
# stage, or the measured bubble is contention). Run it from anywhere on a quiet machine
# (~30 s); writes lessons/measurements/pipeline_bubble.json (commit it) and prints the table.
set -euo pipefail
cd "$(dirname "$0")/../../.."   # lessons/measurements/remeasure -> the repository root
export OMP_NUM_THREADS=1
timeout 300 .venv/bin/torchrun --standalone --nproc-per-node 2 \
    -m tp_from_scratch.parallelisms.measure_pipeline --steps 3 \
    --out lessons/measurements/pipeline_bubble.json 2>&1 | grep -v "^W\|^\[W\|OMP_NUM_THREADS\|^\*\*\*"
