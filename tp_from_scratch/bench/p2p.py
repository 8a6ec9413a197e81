"""Benchmark one ring step: the communicator's send/recv against the backend's bare calls.

    .venv/bin/mpiexec -n 2 .venv/bin/python -m tp_from_scratch.bench p2p
    .venv/bin/torchrun --standalone --nproc-per-node 2 -m tp_from_scratch.bench p2p --json runs/p2p.json

Each rank sends a float32 array of ``size`` bytes to rank + 1 and receives one from
rank - 1, as in one step of a ring collective, three ways, taking turns call by call:

    bare        the backend's own calls: mpi4py Isend/Irecv, or dist.isend/irecv
    no header   comm.send(x, right, header=False), comm.recv(left, out=buffer, header=False):
                what the library's reduce_scatter and all_reduce send
    header      comm.send(x, right), comm.recv(left, out=buffer): a header (shape, dtype)
                goes first

Every call makes --steps ring steps (inside one ``comm.collective`` for the communicator,
as in a real collective) and the table shows microseconds per step, the median over calls
of the slowest rank. ``overhead`` = no header - bare: what the communicator's Python adds
to each step; ``header cost`` = header - no header: what the header message adds. Before
timing, each way's received array is compared bit for bit with the left neighbour's.
This is a benchmark, not a test: nothing here asserts a speed.
"""
import argparse

import numpy as np

from tp_from_scratch.bench.common import add_size_options, check_size_options, sizes, time_calls, write_report
from tp_from_scratch.comm.native import native_for
from tp_from_scratch.comm import spmd_main
from tp_from_scratch.compare import assert_matches_reference
from tp_from_scratch.testing import random_array, rank_rng

WAYS = ("bare", "no header", "header")


def make_calls(comm, count, steps):
    """(received arrays, {way: call}) for this rank; each call makes ``steps`` ring steps."""
    native = native_for(comm)
    p, r = comm.world_size, comm.rank
    right, left = (r + 1) % p, (r - 1) % p
    x = random_array(rank_rng(11, r), (count,), np.float32, integer=True)
    received = {way: np.zeros(count, np.float32) for way in WAYS}

    def bare():
        for _ in range(steps):
            native.ring_step(x, received["bare"])

    def no_header():
        with comm.collective("ring_step"):
            for _ in range(steps):
                comm.send(x, right, header=False)
                comm.recv(left, out=received["no header"], header=False)

    def header():
        with comm.collective("ring_step"):
            for _ in range(steps):
                comm.send(x, right)
                comm.recv(left, out=received["header"])  # the header is checked against out

    return received, {"bare": bare, "no header": no_header, "header": header}


def measure(comm, size, steps, warmup, iters):
    """One row: microseconds per ring step for each way, at one message size."""
    count = max(1, size // 4)
    received, calls = make_calls(comm, count, steps)
    left = (comm.rank - 1) % comm.world_size
    expected = random_array(rank_rng(11, left), (count,), np.float32, integer=True)
    for way, call in calls.items():  # a way that delivers the wrong bytes has no speed
        call()
        assert_matches_reference(received[way], expected, name=f"ring step ({way})", rank=comm.rank, exact=True)
    median, _ = time_calls(comm, list(calls.values()), warmup, iters)
    row = {"size": count * 4, "ranks": comm.world_size, "steps": steps}
    row.update({f"{way}_us": seconds / steps * 1e6 for way, seconds in zip(WAYS, median)})
    row["overhead_us"] = row["no header_us"] - row["bare_us"]
    row["header_cost_us"] = row["header_us"] - row["no header_us"]
    return row


HEADER = (f"{'size':>10} {'bare':>9} {'no header':>10} {'header':>9} {'overhead':>9} {'header cost':>12}\n"
          f"{'(B)':>10} {'(us)':>9} {'(us)':>10} {'(us)':>9} {'(us)':>9} {'(us)':>12}")


def format_row(row):
    return (f"{row['size']:>10} {row['bare_us']:>9.1f} {row['no header_us']:>10.1f} {row['header_us']:>9.1f}"
            f" {row['overhead_us']:>9.1f} {row['header_cost_us']:>12.1f}")


def run(comm, args):
    native = native_for(comm)
    say = print if comm.rank == 0 else (lambda *a, **k: None)
    say(f"# tp_from_scratch ring-step benchmark: {type(comm).__name__} vs bare {native.name}, "
        f"{comm.world_size} ranks, {args.steps} steps per call, warmup {args.warmup}, iters {args.iters}")
    say(HEADER)
    rows = []
    for size in sizes(args.min_bytes, args.max_bytes, args.factor):
        row = measure(comm, size, args.steps, args.warmup, args.iters)
        row["backend"] = native.name
        rows.append(row)
        say(format_row(row), flush=True)
    write_report(comm, args, native.name, rows, say)
    return rows


def parse_args(argv=None):
    parser = argparse.ArgumentParser(prog="python -m tp_from_scratch.bench p2p", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    add_size_options(parser, max_bytes="1M", factor=8, warmup=3)
    parser.add_argument("--steps", type=int, default=8, help="ring steps per timed call")
    args = parser.parse_args(argv)
    check_size_options(parser, args)
    if args.steps < 1:
        parser.error("need --steps >= 1")
    return args


def main(argv=None):
    args = parse_args(argv)
    spmd_main(lambda comm: run(comm, args))


if __name__ == "__main__":
    main()
