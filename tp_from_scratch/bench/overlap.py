"""Exposed communication and step time, with and without overlap: the column-parallel layer's
backward (dX all-reduce behind dW) and the collective matmul (all-gather / reduce-scatter along T
interleaved with the matmul).

    .venv/bin/torchrun --standalone --nproc-per-node 2 -m tp_from_scratch.bench overlap
    .venv/bin/mpiexec -n 2 .venv/bin/python -m tp_from_scratch.bench overlap          (from-scratch only)
    ... overlap --tokens 1024 --hidden 2048 --out 256 --iters 20 --json runs/overlap.json

One AsyncColumnParallelLinear (X (tokens, hidden) -> (tokens, out/t) per rank) runs forward
and backward, alternating, call by call:
    blocking  overlap=False: all-reduce dX, then the dW matmul (Megatron without overlap)
    overlap   overlap=True:  start the dX all-reduce, the dW matmul, then wait
for each group kind: the torch process group (native dist.all_reduce, async_op=True;
torchrun only) and the communicator (from-scratch ring, all_reduce_async). Columns (medians
over iterations; each iteration's value is that of the slowest rank):
    step      forward + backward, ms
    dW        the dW and db matmul, ms
    exposed   time backward spends in the all-reduce that is not hidden: the whole blocking
              all-reduce, or the final wait (plus the start) with overlap, ms
    hidden    1 - exposed(overlap) / exposed(blocking), on the overlap row
The JSON also keeps rank 0's last backward as a timeline (what, start ms, stop ms).
Outputs and gradients are checked bit for bit between the two before timing.

Then the collective matmul (sequence parallelism, Lesson 7), forward only, same sizes:
    all-gather->matmul   x (1, tokens/t, hidden) Sharded(1), the column layer (out/t, hidden):
                         un-fused = all-gather along T, then one matmul; fused = the ring loop
    matmul->reduce-scat. x (1, tokens, out/t) Sharded(-1), the row layer (hidden, out/t): one
                         matmul then reduce-scatter along T, or the fused loop
Columns: op (the whole forward), matmul (its matmuls), exposed (un-fused: the collective;
fused: the time in sends and waits, which the matmuls did not hide), hidden (as above).
Outputs are checked against the un-fused ones first (within the tolerance policy: the
fused loop multiplies row blocks). This is a benchmark, not a test: nothing here asserts a speed.
"""
import argparse
import time

import numpy as np
import torch

from tp_from_scratch import collectives
from tp_from_scratch.bench.common import write_report
from tp_from_scratch.comm import spmd_main
from tp_from_scratch.gpt.options import add_model_flags
from tp_from_scratch.compare import assert_matches_reference
from tp_from_scratch.overlap.collective_matmul import Steps
from tp_from_scratch.overlap.collective_matmul_nn import all_gather_linear, linear_reduce_scatter
from tp_from_scratch.overlap.linear import AsyncColumnParallelLinear, Timeline
from tp_from_scratch.sequence_parallel.nn import (gather_from_sequence_parallel_region,
                                                  reduce_scatter_to_sequence_parallel_region)
from tp_from_scratch.sharding import shard_range, shard_sizes
from tp_from_scratch.testing import random_array, rank_rng


def groups(comm):
    """[(label, group)]: the native process group under torchrun, and the communicator."""
    out = []
    if type(comm).__name__ == "TorchComm":
        import torch.distributed as dist
        out.append(("native (gloo)", dist.group.WORLD))
    out.append((f"scratch ({type(comm).__name__})", comm))
    return out


def make_step(group, rank, args, overlap):
    """A function running one forward + backward; returns (timeline, layer, x) for checking."""
    timeline = Timeline()
    torch.manual_seed(0)  # the same full weight on every rank (one process per rank here)
    layer = AsyncColumnParallelLinear(args.hidden, args.out, group=group, overlap=overlap, timeline=timeline)
    x = torch.tensor(random_array(rank_rng(1), (args.tokens, args.hidden), np.float32), requires_grad=True)
    dy = torch.tensor(random_array(rank_rng(2, rank), (args.tokens, layer.weight.shape[0]),
                                   np.float32))

    def step():
        timeline.clear()
        x.grad = None
        layer.zero_grad(set_to_none=True)
        layer(x).backward(dy)
    return step, timeline, layer, x


def exposed(timeline):
    """Seconds of backward not hidden: the blocking all-reduce, or start + final wait."""
    return (timeline.total("all-reduce (blocking)") + timeline.total("start all-reduce")
            + timeline.total("wait all-reduce"))


def measure(comm, label, group, args):
    variants = {name: make_step(group, comm.rank, args, overlap) for name, overlap in (("blocking", False), ("overlap", True))}
    for name, (step, _, layer, x) in variants.items():  # identical arithmetic: identical bits
        step()
    (_, _, a, xa), (_, _, b, xb) = variants["blocking"], variants["overlap"]
    for what, got, ref in (("grad of x", xb.grad, xa.grad), ("grad of weight", b.weight.grad, a.weight.grad)):
        assert_matches_reference(got, ref, name=f"{label}: overlap vs blocking {what}", rank=comm.rank, exact=True)
    for _ in range(args.warmup):
        for step, *_ in variants.values():
            step()
    samples = np.zeros((args.iters, 2, 3))  # (iteration, variant, [step, dW, exposed])
    for i in range(args.iters):
        for j, (step, timeline, _, _) in enumerate(variants.values()):
            comm.barrier()
            start = time.perf_counter()
            step()
            samples[i, j] = time.perf_counter() - start, timeline.total("dW, db matmul"), exposed(timeline)
    slowest = np.median(collectives.all_reduce(comm, samples, op="max"), axis=0) * 1e3  # (variant, metric) ms
    rows = []
    for j, (name, (_, timeline, _, _)) in enumerate(variants.items()):
        first = timeline.events[0][1]  # the last iteration's backward, in ms from its start
        events = [(what, (start - first) * 1e3, (stop - first) * 1e3) for what, start, stop in timeline.events]
        rows.append({"technique": "overlap in backward", "group": label, "variant": name, "step_ms": slowest[j, 0], "dw_ms": slowest[j, 1],
                     "exposed_ms": slowest[j, 2], "backward_timeline_ms": events})
    rows[1]["hidden"] = 1 - rows[1]["exposed_ms"] / rows[0]["exposed_ms"]
    return rows


def collective_matmul_ops(group, rank, t, args):
    """{(op, variant): function(steps) -> output}: the four forwards, on this rank's data."""
    tokens = shard_sizes(args.tokens, t)
    start, stop = shard_range(args.tokens, rank, t)
    x = torch.tensor(random_array(rank_rng(3), (1, args.tokens, args.hidden), np.float32))[:, start:stop].contiguous()
    w_column = torch.tensor(random_array(rank_rng(4, rank), (args.out // t, args.hidden), np.float32))
    h = torch.tensor(random_array(rank_rng(5, rank), (1, args.tokens, args.out // t), np.float32))
    w_row = torch.tensor(random_array(rank_rng(6, rank), (args.hidden, args.out // t), np.float32))

    def unfused_gather(steps):
        gathered = steps.timed("wait", gather_from_sequence_parallel_region, group, x, tokens)
        return steps.timed("matmul", torch.nn.functional.linear, gathered, w_column)

    def unfused_scatter(steps):
        product = steps.timed("matmul", torch.nn.functional.linear, h, w_row)
        return steps.timed("wait", reduce_scatter_to_sequence_parallel_region, group, product)
    return {("all-gather->matmul", "un-fused"): unfused_gather,
            ("all-gather->matmul", "fused"): lambda steps: all_gather_linear(group, x, w_column, sizes=tokens,
                                                                           steps=steps),
            ("matmul->reduce-scatter", "un-fused"): unfused_scatter,
            ("matmul->reduce-scatter", "fused"): lambda steps: linear_reduce_scatter(group, h, w_row, steps=steps)}


def measure_collective_matmul(comm, label, group, args):
    """Rows of op time, matmul time and exposed communication, fused and un-fused (slowest rank)."""
    ops = collective_matmul_ops(group, comm.rank, comm.world_size, args)
    with torch.no_grad():
        outputs = {key: fn(Steps()) for key, fn in ops.items()}
        for op in ("all-gather->matmul", "matmul->reduce-scatter"):
            assert_matches_reference(outputs[op, "fused"], outputs[op, "un-fused"], name=f"{label}: fused {op}",
                                     rank=comm.rank)
        for _ in range(args.warmup):
            for fn in ops.values():
                fn(Steps())
        samples = np.zeros((args.iters, len(ops), 3))  # (iteration, op and variant, [op, matmul, exposed])
        last = {}
        for i in range(args.iters):
            for j, (key, fn) in enumerate(ops.items()):
                steps = Steps()
                comm.barrier()
                start = time.perf_counter()
                fn(steps)
                samples[i, j] = time.perf_counter() - start, steps.total("matmul"), steps.exposed
                last[key] = [(what, (a - start) * 1e3, (b - start) * 1e3) for what, a, b in steps.events]
    slowest = np.median(collectives.all_reduce(comm, samples, op="max"), axis=0) * 1e3  # (op and variant, metric)
    rows = [{"technique": "collective matmul", "group": label, "op": op, "variant": variant,
             "op_ms": slowest[j, 0], "matmul_ms": slowest[j, 1], "exposed_ms": slowest[j, 2],
             "steps_ms": last[op, variant]} for j, (op, variant) in enumerate(ops)]
    for unfused, fused in zip(rows[0::2], rows[1::2]):
        fused["hidden"] = 1 - fused["exposed_ms"] / unfused["exposed_ms"]
    return rows


def table(say, comm, measure_rows, args, labels, times):
    """Measure and print one table: the label columns [(key, width)], the time columns
    [(key, title)] in ms, then the share hidden; returns the rows."""
    say(" ".join(f"{key:>{width}}" for key, width in labels) + "".join(f" {title:>8}" for _, title in times)
        + f" {'hidden':>7}")
    say(" ".join(f"{'':>{width}}" for _, width in labels) + f" {'(ms)':>8}" * len(times) + f" {'':>7}")
    rows = []
    for label, group in groups(comm):
        for row in measure_rows(comm, label, group, args):
            rows.append(row)
            hidden = f"{row['hidden']:>7.0%}" if "hidden" in row else f"{'':>7}"
            say(" ".join(f"{row[key]:>{width}}" for key, width in labels)
                + "".join(f" {row[key]:>8.2f}" for key, _ in times) + f" {hidden}", flush=True)
    return rows


def run(comm, args):
    say = print if comm.rank == 0 else (lambda *a, **k: None)
    mib = args.tokens * args.hidden * 4 / 2 ** 20
    say(f"# overlap: {comm.world_size} ranks, X ({args.tokens}, {args.hidden}) float32, out {args.out} "
        f"({args.out // comm.world_size} per rank); dX all-reduce of {mib:.1f} MiB; "
        f"warmup {args.warmup}, iters {args.iters}")
    rows = table(say, comm, measure, args, [("group", 22), ("variant", 9)],
                 [("step_ms", "step"), ("dw_ms", "dW"), ("exposed_ms", "exposed")])
    say(f"# collective matmul, forward: all-gather of X (1, {args.tokens}, {args.hidden}) along T into a "
        f"matmul with {args.out // comm.world_size} columns per rank; the row layer's product reduce-scattered")
    rows += table(say, comm, measure_collective_matmul, args, [("group", 22), ("op", 22), ("variant", 9)],
                  [("op_ms", "op"), ("matmul_ms", "matmul"), ("exposed_ms", "exposed")])
    write_report(comm, args, type(comm).__name__, rows, say)
    return rows


def parse_args(argv=None):
    parser = argparse.ArgumentParser(prog="python -m tp_from_scratch.bench overlap", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--tokens", type=int, default=1024, help="B*T rows of X")
    add_model_flags(parser, title="sizes", only=("hidden",), defaults=dict(hidden=2048),
                    helps=dict(hidden="input features H (the all-reduced dX's width)"))
    parser.add_argument("--out", type=int, default=256, help="output features over all ranks")
    parser.add_argument("--warmup", type=int, default=3)
    parser.add_argument("--iters", type=int, default=20)
    parser.add_argument("--json", help="also write every row to this JSON file (rank 0)")
    return parser.parse_args(argv)


def main(argv=None):
    torch.set_num_threads(1)  # one core per rank: the BLAS must not take the other rank's core
    args = parse_args(argv)
    spmd_main(lambda comm: run(comm, args))


if __name__ == "__main__":
    main()
