#!/usr/bin/env bash
# Lesson 14, section 6: perplexity on real text against bytes per token and modelled decode latency,
# for plain TP, Sync-Point Drop, quantized all-reduce and CAAT-Net (three small GPTs trained on one
# process). A few minutes on 2 quiet cores. Writes lessons/measurements/tp_inference_text.json (commit it).
# The CPU latencies price this machine with the profile in decode_latency.json: remeasure that first.
set -euo pipefail
cd "$(dirname "$0")/../../.."   # lessons/measurements/remeasure -> the repository root
export OMP_NUM_THREADS=1
timeout 1800 .venv/bin/python -m tp_from_scratch.inference.experiment --out lessons/measurements/tp_inference_text.json
