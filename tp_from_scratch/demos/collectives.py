"""Lesson 2 demo: every from-scratch collective, checked against the backend's native one.

    .venv/bin/mpiexec -n 4 .venv/bin/python -m tp_from_scratch.demos.collectives
    .venv/bin/torchrun --standalone --nproc-per-node 4 -m tp_from_scratch.demos.collectives [--rows 256]

Each rank draws its own integer-valued float32 data (rank_rng(seed, rank)), so every sum
is exact and every comparison is bit for bit. Each collective is compared with the native
MPI / torch.distributed collective and with the single-device numpy result (every rank
can redraw every other rank's input from its seed). Then rank 0 prints its meter: the
traffic of the from-scratch collectives only (native calls do not pass through comm).
"""
import argparse

import numpy as np

from tp_from_scratch import collectives
from tp_from_scratch.comm.native import native_for
from tp_from_scratch.comm import spmd_main
from tp_from_scratch.compare import assert_matches_reference
from tp_from_scratch.testing import random_array, rank_rng


def inputs(seed, p, shape):
    """Every rank's input (rank r's from rank_rng(seed, r)); a rank keeps inputs[comm.rank]."""
    return [random_array(rank_rng(seed, r), shape(r) if callable(shape) else shape, np.float32, integer=True)
            for r in range(p)]


def cases(comm, native, rows):
    """(name, from-scratch result, native result or None, numpy reference), one per collective.

    rows: rows per rank (k); shapes are (p*k, 4) for the full arrays and (k, 4) for shards.
    Results that exist only on the root are None elsewhere and skipped there.
    """
    p, r = comm.world_size, comm.rank
    full = inputs(1, p, (p * rows, 4))          # (p*k, 4) on every rank
    shard = inputs(2, p, (rows, 4))             # (k, 4)
    uneven = inputs(3, p, lambda q: (1 + q % 3, 4))   # shards of 1, 2, 3, 1, ... rows
    odd = inputs(4, p, (2 * p + 1, 4))          # a length p does not divide
    x, root = full[r], p - 1                    # a root other than 0 checks the tree's renumbering
    total = np.sum(full, axis=0)

    def at_root(value):
        return value if r == root else None

    yield "all_reduce(sum)", collectives.all_reduce(comm, x), native.all_reduce(x), total
    yield "all_reduce(max)", collectives.all_reduce(comm, x, op="max"), native.all_reduce(x, "max"), \
        np.max(full, axis=0)
    yield "reduce_scatter", collectives.reduce_scatter(comm, x), native.reduce_scatter(x), \
        np.array_split(total, p)[r]
    yield "reduce_scatter (uneven)", collectives.reduce_scatter(comm, odd[r]), None, \
        np.array_split(np.sum(odd, axis=0), p)[r]
    yield "all_gather", collectives.all_gather(comm, shard[r]), native.all_gather(shard[r]), \
        np.concatenate(shard)
    yield "all_gather (uneven)", collectives.all_gather(comm, uneven[r]), None, np.concatenate(uneven)
    yield "broadcast", collectives.broadcast(comm, at_root(x), root=root), native.broadcast(x, root), full[root]
    yield "reduce", collectives.reduce(comm, x, root=root), native.reduce(x, root), at_root(total)
    yield "scatter", collectives.scatter(comm, at_root(x), root=root), native.scatter(full[root], root), \
        np.array_split(full[root], p)[r]
    yield "gather", collectives.gather(comm, shard[r], root=root), native.gather(shard[r], root), \
        at_root(np.concatenate(shard))
    # rank r receives block r of every rank's array, stacked in rank order
    yield "all_to_all", collectives.all_to_all(comm, x, 0, 0), native.all_to_all(x), \
        np.concatenate([np.array_split(full[q], p)[r] for q in range(p)])


def run(comm, rows):
    native = native_for(comm)
    p = comm.world_size
    say = print if comm.rank == 0 else (lambda *a, **k: None)
    say(f"{p} ranks, {type(comm).__name__}; native: {native.name}; float32, integer-valued (exact)\n")
    say(f"{'collective':<24} {'result on rank 0':>18} {'vs native':>10} {'vs numpy':>10}")
    for name, got, from_native, expected in cases(comm, native, rows):
        if expected is None:  # a rooted result: nothing to check off the root
            verdict_native = verdict_numpy = f"on rank {p - 1}"  # the root checks it
        else:
            assert_matches_reference(got, expected, name=f"{name} vs numpy", rank=comm.rank, exact=True)
            verdict_numpy = "equal"
            verdict_native = "-"
            if from_native is not None:
                assert_matches_reference(got, from_native, name=f"{name} vs {native.name}", rank=comm.rank,
                                         exact=True)
                verdict_native = "equal"
        shape = "None" if got is None else str(got.shape)
        say(f"{name:<24} {shape:>18} {verdict_native:>10} {verdict_numpy:>10}")
    comm.barrier()
    say(f"\nEvery rank checked every result bit for bit (a mismatch would have stopped the job).")
    say(f"\nTraffic of the from-scratch collectives on rank 0 (payload bytes; native calls not counted):\n")
    say(comm.meter.table())
    n = p * rows * 4 * 4  # bytes of one (p*k, 4) float32 array
    ar = comm.meter.by_collective["all_reduce"].bytes_sent
    say(f"\nall_reduce, 2 calls on {n} bytes: rank 0 sent {ar} bytes; the ring's 2(p-1)/p x N x 2 = "
        f"{round(2 * (p - 1) / p * n * 2)}")


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rows", type=int, default=256, help="rows per rank: arrays are (p*rows, 4)")
    args = parser.parse_args(argv)
    if args.rows < 1:
        parser.error(f"--rows must be at least 1, got {args.rows}")
    spmd_main(lambda comm: run(comm, args.rows))


if __name__ == "__main__":
    main()
