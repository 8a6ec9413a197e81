#!/usr/bin/env bash
# Lesson 14, on a QUIET machine: the planner's inference profile of this machine (memory bandwidth,
# decode overhead, gloo's all-reduce at 2 and 4 processes), then decode latency of gpt.generate at
# t = 1, 2, 4 (Lesson 6's latency bench: a random Llama-style model, 4 layers, H=512, B=1) against
# its prediction. About 3 minutes on 2 cores. Writes lessons/measurements/decode_latency.json (commit it).
set -euo pipefail
cd "$(dirname "$0")/../../.."   # lessons/measurements/remeasure -> the repository root
export OMP_NUM_THREADS=1
timeout 900 .venv/bin/python -m tp_from_scratch.inference.benchmark --calibrate \
    --out lessons/measurements/decode_latency.json
