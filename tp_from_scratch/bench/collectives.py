"""Benchmark the from-scratch collectives against the backend's native ones, nccl-tests style.

    .venv/bin/mpiexec -n 4 .venv/bin/python -m tp_from_scratch.bench collectives
    .venv/bin/torchrun --standalone --nproc-per-node 4 -m tp_from_scratch.bench collectives --json runs/bench.json
    ... collectives --ops all_reduce --min-bytes 1M --max-bytes 16M --iters 20 --warmup 5

Both implementations run in the same job, on the same float32 data, taking turns call by
call at each size. Columns, as in nccl-tests:
    size    bytes of the whole array (all_reduce: the input; all_gather: the output;
            reduce_scatter: the input), count its elements
    time    median microseconds per call on the slowest rank; the two implementations take
            turns call by call, each call starting after a barrier
    algbw   size / time
    busbw   algbw x the ring's factor, 2(p-1)/p for all_reduce and (p-1)/p for all_gather
            and reduce_scatter: what each link carried, comparable across world sizes
    ratio   from-scratch busbw / native busbw
Before timing a size, the two results are compared (integer-valued data, so bit for bit).
This is a benchmark, not a test: nothing here asserts a speed.
"""
import argparse

import numpy as np

from tp_from_scratch import collectives
from tp_from_scratch.bench.common import add_size_options, check_size_options, sizes, time_calls, write_report
from tp_from_scratch.comm.native import native_for
from tp_from_scratch.comm import spmd_main
from tp_from_scratch.compare import assert_matches_reference
from tp_from_scratch.testing import random_array, rank_rng

OPS = ["all_reduce", "all_gather", "reduce_scatter"]
MIB = 2 ** 20


def bus_factor(op, p):
    """busbw / algbw: the fraction of the array each rank's link carries in a ring."""
    return 2 * (p - 1) / p if op == "all_reduce" else (p - 1) / p


def element_count(op, size, p, itemsize):
    """Elements of the whole array for ``size`` bytes; a multiple of p where shards must be even."""
    count = max(1, size // itemsize)
    return count if op == "all_reduce" else max(p, count // p * p)


def make_case(op, comm, count):
    """(from-scratch call, native call) on this rank's integer-valued float32 data."""
    native = native_for(comm)
    p = comm.world_size
    if op == "all_gather":
        x = random_array(rank_rng(7, comm.rank), (count // p,), np.float32, integer=True)
        return (lambda: collectives.all_gather(comm, x)), (lambda: native.all_gather(x))
    x = random_array(rank_rng(7, comm.rank), (count,), np.float32, integer=True)
    if op == "all_reduce":
        return (lambda: collectives.all_reduce(comm, x)), (lambda: native.all_reduce(x))
    return (lambda: collectives.reduce_scatter(comm, x)), (lambda: native.reduce_scatter(x))


def measure(comm, op, size, warmup, iters):
    """One row of the table: both implementations at one size."""
    p, itemsize = comm.world_size, 4
    count = element_count(op, size, p, itemsize)
    scratch, native = make_case(op, comm, count)
    # the two must agree before their speed means anything (integer data: bit for bit)
    assert_matches_reference(scratch(), native(), name=f"from-scratch {op} vs native", rank=comm.rank, exact=True)
    row = {"op": op, "size": count * itemsize, "count": count, "type": "float32", "ranks": p}
    median, fastest = time_calls(comm, [scratch, native], warmup, iters)
    for who, seconds, best in zip(["scratch", "native"], median, fastest):
        algbw = row["size"] / seconds / 1e9
        row.update({f"{who}_time_us": seconds * 1e6, f"{who}_algbw": algbw,
                    f"{who}_busbw": algbw * bus_factor(op, p), f"{who}_min_time_us": best * 1e6})
    row["ratio"] = row["scratch_busbw"] / row["native_busbw"] if row["native_busbw"] > 0 else float("nan")
    return row


HEADER = (
    f"{'':>37}{'from scratch (ring)':^27}  {'native':^27}\n"
    f"{'size':>10} {'count':>10} {'type':>7} {'op':>15}"
    f" {'time':>9} {'algbw':>8} {'busbw':>8}  {'time':>9} {'algbw':>8} {'busbw':>8} {'ratio':>6}\n"
    f"{'(B)':>10} {'(elements)':>10} {'':>7} {'':>15}"
    f" {'(us)':>9} {'(GB/s)':>8} {'(GB/s)':>8}  {'(us)':>9} {'(GB/s)':>8} {'(GB/s)':>8} {'':>6}"
)


def format_row(row):
    return (f"{row['size']:>10} {row['count']:>10} {row['type']:>7} {row['op']:>15}"
            f" {row['scratch_time_us']:>9.1f} {row['scratch_algbw']:>8.3f} {row['scratch_busbw']:>8.3f}"
            f"  {row['native_time_us']:>9.1f} {row['native_algbw']:>8.3f} {row['native_busbw']:>8.3f}"
            f" {row['ratio']:>6.2f}")


def summary(rows, threshold=MIB):
    """Per op: the busbw ratio over sizes >= threshold (the issue's target: >= 0.8 for all_reduce)."""
    lines = []
    for op in OPS:
        big = [r for r in rows if r["op"] == op and r["size"] >= threshold]
        if big:
            ratio = [r["ratio"] for r in big]
            # the fastest of the iterations: closest to an idle machine when others share the cores
            best = [r["native_min_time_us"] / r["scratch_min_time_us"] for r in big]
            lines.append(f"{op}: from-scratch / native busbw for sizes >= {threshold // MIB} MiB: "
                         f"median {np.median(ratio):.2f}, min {np.min(ratio):.2f}, max {np.max(ratio):.2f} "
                         f"over {len(big)} sizes (from the fastest calls instead: median {np.median(best):.2f})")
    return lines


def run(comm, args):
    native = native_for(comm)
    p = comm.world_size
    say = print if comm.rank == 0 else (lambda *a, **k: None)
    say(f"# tp_from_scratch collectives benchmark: {type(comm).__name__} vs {native.name}, {p} ranks, "
        f"warmup {args.warmup}, iters {args.iters}")
    say(HEADER)
    rows = []
    for op in args.ops:
        for size in sizes(args.min_bytes, args.max_bytes, args.factor):
            row = measure(comm, op, size, args.warmup, args.iters)
            row["backend"] = native.name
            rows.append(row)
            say(format_row(row), flush=True)
    for line in summary(rows):
        say("# " + line)
    write_report(comm, args, native.name, rows, say)
    return rows


def parse_args(argv=None):
    parser = argparse.ArgumentParser(prog="python -m tp_from_scratch.bench collectives", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--ops", nargs="+", choices=OPS, default=OPS)
    add_size_options(parser, max_bytes="16M", factor=4, warmup=5)
    args = parser.parse_args(argv)
    check_size_options(parser, args)
    return args


def main(argv=None):
    args = parse_args(argv)
    spmd_main(lambda comm: run(comm, args))


if __name__ == "__main__":
    main()
