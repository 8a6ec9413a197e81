"""Measure the pipeline bubble and the activations in flight on real processes.

    .venv/bin/torchrun --standalone --nproc-per-node 2 -m tp_from_scratch.parallelisms.measure_pipeline --out pipeline_bubble.json
    .venv/bin/mpiexec -n 4 .venv/bin/python -m tp_from_scratch.parallelisms.measure_pipeline --out pipeline_p4.json

One process per stage (pp = world size, no TP), a GPT large enough that compute outweighs the
messages, float32. For GPipe and 1F1B and each m: one warm-up step, then ``--steps`` timed
ones; per step every action is timed with perf_counter (one clock for the processes of a
machine), and stage 0 gathers the timelines. Reported per (schedule, m), medians over the
steps: the bubble fraction (idle share between the first start and the last end) next to
(p-1)/(m+p-1), the idle time per stage, the step time, and per stage the most micro-batches
with live saved activations and their bytes. Lesson 11 reads the 2-stage run from
lessons/measurements/pipeline_bubble.json. Needs a quiet machine: a busy core makes a stage
slow, and the others then wait for it (more bubble than the schedule's).
"""
import argparse
import json
import statistics
import time

import numpy as np
import torch

from tp_from_scratch.gpt.model import GPTConfig, init_gpt
from tp_from_scratch.testing import rank_rng

from .pipeline import PipelineStage, forward_backward, gather_timelines
from .schedules import bubble, bubble_formula

MODEL = dict(vocab_size=256, seq_len=64, n_layers=8, hidden=256, n_heads=8, n_kv_heads=8)


def measure(comm, micro=(1, 4, 8), steps=3, batch=16, model=None):
    """A list of dicts (stage 0) or None (other stages): one per schedule and m."""
    config = GPTConfig(**(model or MODEL))
    stage = PipelineStage(comm, init_gpt(config, seed=0))
    rng = rank_rng(0, 0)  # the same batch on every stage
    idx, targets = (torch.from_numpy(rng.integers(0, config.vocab_size, (batch, config.seq_len)))
                    for _ in range(2))
    rows = []
    for schedule in ("gpipe", "1f1b"):
        for m in micro:
            runs = []
            for step in range(steps + 1):
                stage.zero_grad(set_to_none=True)
                comm.barrier()
                start = time.perf_counter()
                result = forward_backward(stage, idx, targets, m, schedule)
                seconds = time.perf_counter() - start
                timelines = gather_timelines(comm, result.timeline)
                peaks = _gather(comm, [result.peak_in_flight, result.peak_activation_bytes])
                if step > 0 and comm.rank == 0:  # step 0 warms up
                    runs.append((bubble(timelines), seconds, peaks, timelines))
            if comm.rank == 0:
                rows.append(_row(comm.world_size, schedule, m, runs))
    return rows if comm.rank == 0 else None


def _gather(comm, values):
    """Every stage's ``values`` on stage 0 (a list per stage), None elsewhere."""
    if comm.rank != 0:
        comm.send(np.array(values, dtype=np.int64), 0)
        return None
    return [list(values)] + [comm.recv(s).tolist() for s in range(1, comm.world_size)]


def _row(p, schedule, m, runs):
    fractions = [b["fraction"] for b, _, _, _ in runs]
    k = fractions.index(statistics.median_low(fractions))  # the median step, shown whole
    b, _, peaks, timelines = runs[k]
    return {"p": p, "schedule": schedule, "m": m,
            "bubble_measured": statistics.median(fractions), "bubble_formula": bubble_formula(p, m),
            "idle_s_per_stage": b["idle"], "span_s": b["span"],
            "step_s": statistics.median(s for _, s, _, _ in runs),
            "in_flight_per_stage": [q[0] for q in peaks],
            "activation_bytes_per_stage": [q[1] for q in peaks],
            "timelines": [[list(t) for t in tl] for tl in timelines]}


def report(rows):
    print(f"{'schedule':8} {'m':>3} {'bubble':>7} {'(p-1)/(m+p-1)':>14} {'step ms':>8}  in flight per stage  "
          "activations per stage (MiB)")
    for r in rows:
        mib = " ".join(f"{b / 2**20:.1f}" for b in r["activation_bytes_per_stage"])
        print(f"{r['schedule']:8} {r['m']:3} {r['bubble_measured']:7.2f} {r['bubble_formula']:14.2f} "
              f"{1e3 * r['step_s']:8.1f}  {str(r['in_flight_per_stage']):19}  {mib}")


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--micro", type=int, nargs="+", default=[1, 4, 8])
    parser.add_argument("--steps", type=int, default=3)
    parser.add_argument("--out", help="write the rows (with the median step's timelines) as JSON")
    args = parser.parse_args(argv)
    from tp_from_scratch.comm import spmd_main

    def run(comm):
        rows = measure(comm, tuple(args.micro), args.steps)
        if rows is not None:
            print(f"pipeline over p={comm.world_size} stages ({type(comm).__name__}), "
                  f"batch 16 x 64 tokens, {MODEL['n_layers']} blocks of hidden {MODEL['hidden']}, float32")
            report(rows)
            if args.out:
                with open(args.out, "w") as f:
                    json.dump(rows, f, indent=1)
                print(f"wrote {args.out}")
    spmd_main(run)


if __name__ == "__main__":
    main()
