"""Lesson 10's claims, checked on one rank's communicator: simulated, under mpiexec or torchrun.

    .venv/bin/mpiexec -n 3 .venv/bin/python -m tp_from_scratch.overlap.check
    .venv/bin/torchrun --standalone --nproc-per-node 2 -m tp_from_scratch.overlap.check

* every all-reduce algorithm (and the selector) equals the single-device sum, holds the same
  bits on every rank, and sends exactly what its formula says (algorithms.traffic);
* all_reduce_async equals collectives.all_reduce bit for bit, with the same meter counts;
* the collective matmul (check_collective_matmul): fused column and row layers equal the
  un-fused sequence-parallel ones and move the same messages and bytes;
* under torchrun also check_layer.check_async_layer: AsyncColumnParallelLinear equals
  ColumnParallelLinear bit for bit, with the communicator and with the process group as group,
  and the torch collective matmul equals sequence_parallel.nn's layers on the process group.
Each rank prints one line; a failure brings the job down (spmd_main).
"""
import sys

import numpy as np

from tp_from_scratch import collectives
from tp_from_scratch.comm import spmd_main
from tp_from_scratch.compare import assert_matches_reference
from tp_from_scratch.overlap import algorithms as A
from tp_from_scratch.overlap.check_collective_matmul import check_collective_matmul, check_collective_matmul_torch
from tp_from_scratch.overlap.nonblocking import all_reduce_async
from tp_from_scratch.testing import random_array, rank_rng

SHAPES = [(), (7, 5), (1001,)]


def _everyone(comm, seed, shape, dtype, integer):
    """Every rank's input (each rank can draw all of them: the data depend on seed and rank)."""
    return [random_array(rank_rng(seed, r), shape, dtype, integer=integer) for r in range(comm.world_size)]


def _counts(meter):
    return meter.messages_sent, meter.bytes_sent, meter.messages_received, meter.bytes_received


def check_algorithms(comm, segment_bytes=64):
    """Each algorithm: equal to numpy's sum, the same bits everywhere, traffic as its formula."""
    p, r = comm.world_size, comm.rank
    for shape in SHAPES:
        for dtype, integer in ((np.float32, True), (np.float64, False)):
            xs = _everyone(comm, 500, shape, dtype, integer)
            expected = np.sum(np.stack(xs), axis=0, dtype=dtype)
            for name, algorithm in A.ALGORITHMS.items():
                kwargs = {"segment_bytes": segment_bytes} if name == "segmented_ring" else {}
                what = f"{name} p={p} shape={shape} {np.dtype(dtype).name}"
                comm.meter.reset()
                y = algorithm(comm, xs[r], **kwargs)
                got = _counts(comm.meter)
                formula = A.traffic(name, p, r, int(np.prod(shape)), np.dtype(dtype).itemsize, **kwargs)
                assert got == formula, f"rank {r}: {what} sent/received {got}, its formula says {formula}"
                assert_matches_reference(y, expected, name=what, rank=r, exact=integer)
                # rank 0's bits, sent to all: every rank must hold exactly these
                first = collectives.broadcast(comm, y if r == 0 else None)
                assert_matches_reference(y, first, name=f"{what} vs rank 0", rank=r, exact=True)
    xs = _everyone(comm, 501, (300,), np.float32, True)
    assert_matches_reference(A.all_reduce(comm, xs[r]), np.sum(np.stack(xs), axis=0), name="selected all_reduce",
                             rank=r, exact=True)
    return len(SHAPES) * 2 * len(A.ALGORITHMS) + 1


def check_async(comm):
    """all_reduce_async: collectives.all_reduce's bits and meter counts, on gaussian data."""
    r = comm.rank
    for shape in SHAPES:
        x = random_array(rank_rng(600, r), shape, np.float32)
        comm.meter.reset()
        blocking = collectives.all_reduce(comm, x)
        expected = _counts(comm.meter)
        comm.meter.reset()
        handle = all_reduce_async(comm, x)
        # a blocking all-reduce while it is in flight: separate channels, so neither takes
        # the other's messages
        again = collectives.all_reduce(comm, x)
        handle.test()
        y = handle.wait()
        assert_matches_reference(y, blocking, name=f"all_reduce_async {shape}", rank=r, exact=True)
        assert_matches_reference(again, blocking, name=f"all_reduce while async in flight {shape}", rank=r, exact=True)
        booked = comm.meter.snapshot()["by_collective"]["all_reduce_async"]
        got = (booked["messages_sent"], booked["bytes_sent"], booked["messages_received"], booked["bytes_received"])
        assert got == expected, f"rank {r}: all_reduce_async {shape} moved {got}, all_reduce {expected}"
        assert _counts(comm.meter) == tuple(2 * n for n in expected), f"rank {r}: the two together moved more"
    return len(SHAPES)


def run_checks(comm, with_torch=False):
    """Every numpy check on ``comm``; with_torch: also the layer, with ``comm`` as its group and,
    under torchrun, with the world process group (native collectives)."""
    n = check_algorithms(comm) + check_async(comm) + check_collective_matmul(comm)
    if with_torch:
        # imported only here: under mpiexec, torch's import alone costs each rank seconds
        import torch
        import torch.distributed as dist

        from tp_from_scratch.overlap.check_layer import check_async_layer
        n += check_async_layer(comm)
        n += check_async_layer(dist.group.WORLD)
        n += check_async_layer(dist.group.WORLD, dtype=torch.float32, gather_output=True)
        # the torch loops on a Comm run on simulated ranks in the tests; the numpy check above
        # already moved the same chunks over this TorchComm: here the process group's link
        n += check_collective_matmul_torch(dist.group.WORLD)
    return n


def main(comm):
    torchrun = type(comm).__name__ == "TorchComm"
    n = run_checks(comm, with_torch=torchrun)
    also = ", with the layer on it and on the native process group" if torchrun else \
        "; the torch layer is checked under torchrun"
    sys.stdout.write(f"rank {comm.rank}: all {n} overlap checks passed ({type(comm).__name__}{also})\n")
    sys.stdout.flush()


if __name__ == "__main__":
    spmd_main(main)
