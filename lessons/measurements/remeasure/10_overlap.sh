#!/bin/bash
# Lesson 10: the measurements that need a quiet machine. Run it from anywhere:
#     bash lessons/measurements/remeasure/10_overlap.sh
# Writes (commit both afterwards):
#     lessons/measurements/allreduce_algorithms.json  p=2 rules and times of MPI and gloo re-measured
#                                                     (p=3 and p=4 kept from the loaded runs)
#     lessons/measurements/overlap.json               the backward overlap and the collective matmul
# and prints the figures README needs. Then regenerate the notebook's outputs:
#     .venv/bin/jupyter nbconvert --to notebook --execute --inplace lessons/10_overlap.ipynb
# About 1-2 minutes on two quiet cores (one core per rank, BLAS on one thread).
set -euo pipefail
cd "$(dirname "$0")/../../.."   # lessons/measurements/remeasure -> the repository root
export OMP_NUM_THREADS=1
TABLE=lessons/measurements/allreduce_algorithms.json
OUT=$(mktemp -d)
start=$(date +%s)
echo "== all-reduce algorithms vs native, 2 ranks, 8 B - 64 MiB (each size: fastest of its calls)"
.venv/bin/mpiexec -n 2 .venv/bin/python -m tp_from_scratch.bench algorithms --iters 10 --large-iters 3 \
    --json "$OUT/mpi2.json" --write-table "$TABLE" | grep "^#"
.venv/bin/torchrun --standalone --nproc-per-node 2 -m tp_from_scratch.bench algorithms --iters 10 --large-iters 3 \
    --json "$OUT/torch2.json" --write-table "$TABLE" 2>/dev/null | grep "^#"
echo "== overlap: backward (dX all-reduce behind dW) and the collective matmul, torchrun 2 ranks"
.venv/bin/torchrun --standalone --nproc-per-node 2 -m tp_from_scratch.bench overlap --warmup 2 --iters 10 \
    --json lessons/measurements/overlap.json 2>/dev/null
echo "== the README's figures"
.venv/bin/python - "$OUT" <<'PY'
import json, sys
from pathlib import Path
from tp_from_scratch.overlap.algorithms import select_algorithm
out = Path(sys.argv[1])
table = json.loads(Path("lessons/measurements/allreduce_algorithms.json").read_text())
for name, backend in (("mpi2", "MPIComm"), ("torch2", "TorchComm")):
    report = json.loads((out / f"{name}.json").read_text())
    rows = report["rows"]
    fine = [r["size"] for r in rows
            if r[f"{select_algorithm(table, backend, 2, r['size'])[0]}_min_time_us"] <= r["native_min_time_us"]]
    text = (f"smallest {min(fine)} B, largest {max(fine)} B ({len(fine)} of {len(rows)} sizes)" if fine
            else f"at none of the {len(rows)} sizes")
    print(f"selected all-reduce >= native ({report['backend']}, p=2): {text}")
bench = json.loads(Path("lessons/measurements/overlap.json").read_text())
for row in bench["rows"]:
    total = row.get("step_ms", row.get("op_ms"))
    what = row.get("op", "backward step")
    print(f"exposed communication {row['group']:>20} {what:>22} {row['variant']:>9}: "
          f"{row['exposed_ms']:7.2f} of {total:7.2f} ms = {row['exposed_ms'] / total:4.0%}")
PY
echo "== took $(( $(date +%s) - start )) s"
