#!/usr/bin/env bash
# Lesson 7: the step-time cost of selective recomputation, and ours against DTensor's
# sequence parallelism, on a QUIET machine. Run it from anywhere; about 1 minute on 2 quiet cores.
# Writes lessons/measurements/sp_step_time.txt (commit it) and prints it.
set -euo pipefail
cd "$(dirname "$0")/../../.."   # lessons/measurements/remeasure -> the repository root
out=lessons/measurements/sp_step_time.txt
{
  echo "# command: torchrun --standalone --nproc-per-node 2 -m tp_from_scratch.bench train --sequence-parallel"
  echo "# date: $(date -u +%Y-%m-%dT%H:%MZ)  host: $(nproc) cores, load $(cut -d' ' -f1-3 /proc/loadavg)"
  OMP_NUM_THREADS=1 timeout 110 .venv/bin/torchrun --standalone --nproc-per-node 2 \
      -m tp_from_scratch.bench train --sequence-parallel 2>/dev/null
} > "$out.tmp"
mv "$out.tmp" "$out"
cat "$out"
