"""Lesson 10's claims, checked on one rank's communicator: simulated, under mpiexec or torchrun.

    mpiexec -n 3 python -m tp_from_scratch.overlap.check
    torchrun --nproc-per-node 2 -m tp_from_scratch.overlap.check

* every all-reduce algorithm (and the selector) equals the single-device sum, holds the same
  bits on every rank, and sends exactly what its formula says (algorithms.traffic);
* all_reduce_async equals collectives.all_reduce bit for bit, with the same meter counts;
* AsyncColumnParallelLinear's outputs and gradients equal ColumnParallelLinear's bit for bit
  (and the single-device nn.Linear's within the tolerance policy), with the group being the
  communicator (from-scratch collectives) and, under torchrun, the process group (native).
Each rank prints one line; a failure brings the job down (spmd_main).
"""
import sys

import numpy as np
import torch
from torch import nn

from tp_from_scratch import collectives
from tp_from_scratch.comm import spmd_main
from tp_from_scratch.compare import assert_matches_reference
from tp_from_scratch.nn.linear import ColumnParallelLinear
from tp_from_scratch.nn.mappings import tp_rank, tp_world_size
from tp_from_scratch.overlap import algorithms as A
from tp_from_scratch.overlap.linear import AsyncColumnParallelLinear
from tp_from_scratch.overlap.nonblocking import all_reduce_async
from tp_from_scratch.sharding import shard_range, shard_sizes
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


def check_async_layer(group, dtype=torch.float64, gather_output=False, seed=700):
    """AsyncColumnParallelLinear vs ColumnParallelLinear: equal bits; vs nn.Linear: the policy.

    Every rank builds the same nn.Linear (8 -> 12) and input X (3, 5, 8); rank r's upstream
    gradient dY_r is its own (rank-distinct) block of the full dY.
    """
    t, rank = tp_world_size(group), tp_rank(group)
    # not torch's RNG: simulated ranks are threads that would share (and race for) it
    linear = nn.utils.skip_init(nn.Linear, 8, 12, dtype=dtype)
    with torch.no_grad():
        linear.weight.copy_(torch.tensor(random_array(rank_rng(seed + 2), (12, 8))))
        linear.bias.copy_(torch.tensor(random_array(rank_rng(seed + 3), (12,))))
    x0 = torch.tensor(random_array(rank_rng(seed, 0), (3, 5, 8)), dtype=dtype)
    blocks = [torch.tensor(random_array(rank_rng(seed + 1, r), (3, 5, n)), dtype=dtype)
              for r, n in enumerate(shard_sizes(12, t))]  # dY's column blocks, one per rank
    full_dy = torch.cat(blocks, dim=-1)  # (3, 5, 12)
    results = []
    for cls in (ColumnParallelLinear, AsyncColumnParallelLinear):
        layer = cls.from_linear(linear, group=group, gather_output=gather_output)
        x = x0.clone().requires_grad_(True)
        y = layer(x)
        y.backward(full_dy if gather_output else blocks[rank])
        results.append({"output": y.detach(), "grad of x": x.grad, "grad of weight": layer.weight.grad,
                        "grad of bias": layer.bias.grad})
    for name, got in results[1].items():
        assert_matches_reference(got, results[0][name], name=f"async vs blocking layer: {name}", rank=rank, exact=True)
    # the single-device layer: X's gradient sums every rank's block
    x = x0.clone().requires_grad_(True)
    full = linear(x)
    full.backward(full_dy)
    start, stop = shard_range(12, rank, t)
    reference = {"output": full.detach() if gather_output else full.detach()[..., start:stop],
                 "grad of x": x.grad, "grad of weight": linear.weight.grad[start:stop],
                 "grad of bias": linear.bias.grad[start:stop]}
    for name, got in results[1].items():
        assert_matches_reference(got, reference[name], name=f"async layer vs nn.Linear: {name}", rank=rank)
    return 8


def run_checks(comm, group=None):
    """Every check on ``comm`` (and the layer with ``group``, a ProcessGroup, if given)."""
    n = check_algorithms(comm) + check_async(comm)
    n += check_async_layer(comm)
    if group is not None:
        n += check_async_layer(group)
        n += check_async_layer(group, dtype=torch.float32, gather_output=True)
    return n


def main(comm):
    group = None
    if type(comm).__name__ == "TorchComm":
        import torch.distributed as dist
        group = dist.group.WORLD
    n = run_checks(comm, group)
    sys.stdout.write(f"rank {comm.rank}: all {n} overlap checks passed ({type(comm).__name__}"
                     + (", and the native process group" if group is not None else "") + ")\n")
    sys.stdout.flush()


if __name__ == "__main__":
    spmd_main(main)
