#!/usr/bin/env bash
# Lesson 9: calibrate, then predicted vs measured for tp=1,2,4 over 6 sizes, the
# strong-scaling table, and the profiled step breakdown. Run it from anywhere on a QUIET machine
# (~4 minutes); it rewrites the committed files Lesson 9 reads:
#   runs/scaling/profile.json (calibration, not committed), lessons/measurements/scaling.json,
#   lessons/measurements/scaling_mpi.json, lessons/measurements/scaling_tp4.json,
#   lessons/measurements/step_profile.json
# then: .venv/bin/jupyter nbconvert --to notebook --execute --inplace lessons/09_when_tp_pays.ipynb
# and commit those four measurement files and the notebook.
set -euo pipefail
cd "$(dirname "$0")/../../.."   # lessons/measurements/remeasure -> the repository root
export OMP_NUM_THREADS=1
PY=.venv/bin/python
TR=.venv/bin/torchrun
SIZES=128,192,256,384,512,768,1024
COMMON="--sizes $SIZES --layers 2 --seq-len 128 --vocab-size 512 --batch-size 4 --rounds 3 --steps-per-round 2 --warmup 1 --profile runs/scaling/profile.json"
start=$(date +%s)
echo "== load average: $(cut -d' ' -f1-3 /proc/loadavg) on $(getconf _NPROCESSORS_ONLN) cores"
echo "== 1. calibrate (matmul FLOP/s at 1 and 2 threads, element-wise ops, step overhead, gloo all-reduce alpha/beta on 2 and 4 processes)"
$PY -m tp_from_scratch.cost.planner --calibrate --profile runs/scaling/profile.json | sed -n 1,14p
echo "== 2. strong scaling, tp=1 (1 and 2 threads) vs tp=2, predicted/measured"
$TR --standalone --nproc-per-node 2 -m tp_from_scratch.bench scaling $COMMON --json lessons/measurements/scaling.json 2>&1 | grep -v "^W1\|USDT\|^\*\*\*"
echo "== 2b. the same with tp=2's all-reduce our ring over MPI point-to-point (shared memory) instead of gloo"
.venv/bin/mpiexec -n 2 $PY -m tp_from_scratch.bench scaling $COMMON --json lessons/measurements/scaling_mpi.json
echo "== 3. tp=4 (4 processes on 2 cores: oversubscribed), predicted/measured"
$TR --standalone --nproc-per-node 4 -m tp_from_scratch.bench scaling $COMMON --json lessons/measurements/scaling_tp4.json 2>&1 | grep -v "^W1\|USDT\|^\*\*\*"
echo "== 4. where a tp=2 step's time goes (torch.profiler), H=512 and 1024, B=8"
$TR --standalone --nproc-per-node 2 -m tp_from_scratch.bench scaling --trace runs/scaling/trace --sizes 512,1024 \
    --layers 2 --seq-len 128 --vocab-size 512 --batch-size 8 --rounds 1 --steps-per-round 2 --warmup 1 \
    --profile runs/scaling/profile.json --summary lessons/measurements/step_profile.json 2>&1 | grep -v "^W1\|USDT\|^\*\*\*"
echo "== predicted/measured within +-25%:"
$PY - <<'PYEOF'
import json
n = ok = 0
for f in ("lessons/measurements/scaling.json", "lessons/measurements/scaling_mpi.json",
          "lessons/measurements/scaling_tp4.json"):
    for row in json.load(open(f))["rows"]:
        for k, r in row["predicted_over_measured"].items():
            n += 1; ok += r is not None and 0.75 <= r <= 1.25
            print(f"  {f.split('/')[-1]:<18} H={row['hidden']:>5} {k:<13} {r:.2f}")
print(f"  {ok} of {n} ratios within +-25%")
PYEOF
echo "== took $(( $(date +%s) - start )) s; load average now $(cut -d' ' -f1-3 /proc/loadavg)"
