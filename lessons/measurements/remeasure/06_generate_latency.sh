#!/usr/bin/env bash
# Lesson 6, on a QUIET machine: the wall time of `make demo`, and TP inference latency: prefill time and per-token decode latency of a
# random Llama-style model (4 layers, H=512, 8 heads, 4 KV heads, V=4096, B=1, a 64-token prompt,
# 32 new tokens, float32, one BLAS thread per rank) at t = 1, 2 and 4 (t = 4 oversubscribes 2 cores).
# Run it from anywhere; about 1.5 minutes. Writes lessons/measurements/generate_latency.json (commit it)
# and prints the demo's time and the table.
set -euo pipefail
cd "$(dirname "$0")/../../.."   # lessons/measurements/remeasure -> the repository root
out=lessons/measurements/generate_latency.json
tmp=$(mktemp)
bench="-m tp_from_scratch.gpt.generate bench --new-tokens 32 --repeats 5 --json $tmp"
export OMP_NUM_THREADS=1
start=$(date +%s.%N)
timeout 300 make demo > /tmp/demo13.log 2>&1 || { tail -20 /tmp/demo13.log; exit 1; }
demo_s=$(.venv/bin/python -c "print($(date +%s.%N) - $start)")
timeout 120 .venv/bin/python $bench
for t in 2 4; do
  timeout 120 .venv/bin/torchrun --standalone --nproc-per-node $t $bench 2>/dev/null
done
.venv/bin/python - "$tmp" "$out" "$demo_s" <<'PY'
import json, os, sys, time
rows = [json.loads(line) for line in open(sys.argv[1])]
demo_s = float(sys.argv[3])
load = open("/proc/loadavg").read().split()[:3]
record = {"command": "bash lessons/measurements/remeasure/06_generate_latency.sh (python -m tp_from_scratch.gpt.generate bench at t=1, "
                     "torchrun --nproc-per-node 2 and 4)",
          "date": time.strftime("%Y-%m-%dT%H:%MZ", time.gmtime()), "cores": os.cpu_count(), "load": load,
          "make_demo_s": round(demo_s, 1), "rows": rows}
json.dump(record, open(sys.argv[2], "w"), indent=1)
base = rows[0]
print(f"# {record['date']}, {record['cores']} cores, load {' '.join(load)}; {base['arch']}, {base['layers']} layers, "
      f"H={base['hidden']}, B={base['batch']}, {base['prompt']}-token prompt, {base['dtype']}")
print(f"make demo: {demo_s:.1f} s wall (500 text steps at tp=2 with the single-device reference, then 4 generated lines)")
print("| t | prefill (ms) | decode (ms/token) | decode vs t=1 |")
print("|---|---|---|---|")
for r in rows:
    print(f"| {r['tp']} | {r['prefill_ms']:.1f} | {r['decode_ms_per_token']:.2f} | "
          f"{r['decode_ms_per_token'] / base['decode_ms_per_token']:.2f}x |")
PY
rm -f "$tmp"
