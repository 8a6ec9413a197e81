"""Lesson 10's claims, checked on one rank's communicator: simulated, under mpiexec or torchrun.

    .venv/bin/mpiexec -n 3 .venv/bin/python -m tp_from_scratch.overlap.check
    .venv/bin/torchrun --standalone --nproc-per-node 2 -m tp_from_scratch.overlap.check

check_algorithms(comm)      every all-reduce algorithm (and the selector) equals the single-device
                            sum, holds the same bits on every rank, and sends exactly what its
                            formula says (algorithms.traffic)
check_async(comm)           all_reduce_async equals collectives.all_reduce bit for bit, with the
                            same meter counts
check_collective_matmul(comm)        numpy (collective_matmul) vs sequence_parallel.linear: outputs
                                     and the three gradients of the column and the row layer, and
                                     the meter: the same messages and bytes as the un-fused
                                     all-gather / reduce-scatter, direction by direction
check_collective_matmul_torch(group) torch (collective_matmul_nn) vs sequence_parallel.nn on a Comm
                                     or a ProcessGroup, and the single-device nn.Linear
check_async_layer(group)    AsyncColumnParallelLinear equals ColumnParallelLinear bit for bit and
                            nn.Linear within the policy, with a Comm or a process group as group

Collective-matmul sequence lengths: divisible by t, uneven (array_split), and shorter than t
(empty shards). Data: integer-valued (exact in any summation order: compared bit for bit) and
gaussian (the matmul by row blocks may differ in the last bits from one matmul, see
collective_matmul: the tolerance policy). The tests run each on simulated ranks; under torchrun
main also runs the torch checks on the native process group. Each rank prints one line; a
failure brings the job down (spmd_main).
"""
import sys

import numpy as np

from tp_from_scratch import collectives
from tp_from_scratch.comm import Comm, spmd_main
from tp_from_scratch.compare import assert_matches_reference
from tp_from_scratch.overlap import algorithms as A
from tp_from_scratch.overlap import collective_matmul as CM
from tp_from_scratch.overlap.nonblocking import all_reduce_async
from tp_from_scratch.sequence_parallel import linear as SP
from tp_from_scratch.sharding import shard_range, shard_sizes
from tp_from_scratch.testing import random_array, rank_rng

SHAPES = [(), (7, 5), (1001,)]
B, H, F = 2, 6, 10  # the collective matmul's batch, the column layer's input width, the full output width


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


def lengths(t):
    """Sequence lengths to check: a multiple of t, an uneven one, and (t > 1) one shorter than t."""
    return sorted({4 * t, 4 * t + 1 if t > 1 else 5, max(1, t - 1)})


def cases(t, rank):
    """(T, this rank's [start, stop) along T, every rank's length, integer-valued?, a label) to check."""
    for T in lengths(t):
        start, stop = shard_range(T, rank, t)
        for integer in (True, False):
            yield T, start, stop, shard_sizes(T, t), integer, \
                f"T={T} t={t} {'integer-valued' if integer else 'gaussian'}"


def _metered(comm, fn, *args):
    comm.meter.reset()
    result = fn(comm, *args)
    return result, _counts(comm.meter)


def check_collective_matmul(comm, seed=900):
    """Column (all-gather -> matmul) and row (matmul -> reduce-scatter) layers, fused vs un-fused."""
    t, r = comm.world_size, comm.rank
    n = 0
    for T, start, stop, sizes, integer, what in cases(t, r):
        draw = lambda key, shape, rank=0: random_array(  # noqa: E731 (rank=0: the same on every rank)
            rank_rng(seed + key, rank), shape, np.float64, integer=integer)
        x_shard = draw(0, (B, T, H))[:, start:stop].copy()  # every rank's slice of one x
        cols = shard_sizes(F, t)[r]  # this rank's column block: uneven widths for t = 3, 4
        w, b = draw(1, (H, cols), r + 1), draw(2, (cols,), r + 1)
        dy = draw(3, (B, T, cols), r + 1)
        (y0, c0), m0 = _metered(comm, SP.sequence_parallel_column_linear_forward, x_shard, w, b)
        (y1, c1), m1 = _metered(comm, CM.column_linear_forward, x_shard, w, b, sizes)
        g0, n0 = _metered(comm, SP.sequence_parallel_column_linear_backward, dy, c0)
        g1, n1 = _metered(comm, CM.column_linear_backward, dy, c1)
        _same(r, f"column {what}", [y1, *g1], [y0, *g0], ["output", "dx", "dw", "db"], integer)
        assert (m1, n1) == (m0, n0), (f"rank {r}: column {what}: fused moved {m1} forward, {n1} backward; "
                                      f"all-gather / reduce-scatter moved {m0}, {n0}")
        x_local = draw(4, (B, T, cols), r + 1)  # the row layer's input, Sharded(-1): rank-distinct
        w2, b2 = draw(5, (cols, F), r + 1), draw(6, (F,))
        dy2 = draw(7, (B, T, F))[:, start:stop].copy()
        (y0, c0), m0 = _metered(comm, SP.sequence_parallel_row_linear_forward, x_local, w2, b2)
        (y1, c1), m1 = _metered(comm, CM.row_linear_forward, x_local, w2, b2)
        g0, n0 = _metered(comm, SP.sequence_parallel_row_linear_backward, dy2, c0)
        g1, n1 = _metered(comm, CM.row_linear_backward, dy2, c1)
        _same(r, f"row {what}", [y1, *g1], [y0, *g0], ["output", "dx", "dw", "db"], integer)
        assert (m1, n1) == (m0, n0), (f"rank {r}: row {what}: fused moved {m1} forward, {n1} backward; "
                                      f"reduce-scatter / all-gather moved {m0}, {n0}")
        n += 16
    return n


def _same(rank, what, got, expected, names, exact):
    for g, e, name in zip(got, expected, names):
        assert_matches_reference(g, e, name=f"{what}: fused vs un-fused {name}", rank=rank, exact=exact)


def check_collective_matmul_torch(group, seed=950):
    """all_gather_linear and linear_reduce_scatter vs sequence_parallel.nn and nn.Linear."""
    import torch
    from torch import nn

    from tp_from_scratch.nn.linear import ColumnParallelLinear, RowParallelLinear
    from tp_from_scratch.nn.mappings import tp_rank, tp_world_size
    from tp_from_scratch.overlap.collective_matmul_nn import all_gather_linear, linear_reduce_scatter
    from tp_from_scratch.sequence_parallel.nn import column_linears_from_sequence, row_linear_to_sequence

    t, r = tp_world_size(group), tp_rank(group)
    n = 0
    for T, start, stop, sizes, integer, what in cases(t, r):
        tensor = lambda key, shape: torch.tensor(  # noqa: E731 (the same on every rank)
            random_array(rank_rng(seed + key), shape, np.float64, integer=integer))
        # not torch's RNG: simulated ranks are threads that would share it
        column = nn.utils.skip_init(nn.Linear, H, F, dtype=torch.float64)
        row = nn.utils.skip_init(nn.Linear, F, H, dtype=torch.float64)
        with torch.no_grad():
            for layer, key in ((column, 1), (row, 3)):
                layer.weight.copy_(tensor(key, layer.weight.shape))
                layer.bias.copy_(tensor(key + 1, layer.bias.shape))
        x_full, dy_full = tensor(5, (B, T, H)), tensor(6, (B, T, H))
        results, moved = [], []
        for fused in (False, True):
            if isinstance(group, Comm):
                group.meter.reset()
            c = ColumnParallelLinear.from_linear(column, group=group)
            w = RowParallelLinear.from_linear(row, group=group)
            x = x_full[:, start:stop].clone().requires_grad_(True)
            if fused:
                h = all_gather_linear(group, x, c.weight, c.bias, sizes)
                y = linear_reduce_scatter(group, h, w.weight, w.bias)
            else:
                (h,) = column_linears_from_sequence(group, x, [c], sizes, save_gathered=True)
                y = row_linear_to_sequence(group, h, w)
            h.retain_grad()
            y.backward(dy_full[:, start:stop])
            if isinstance(group, Comm):  # what moved, forward and backward together
                moved.append(_counts(group.meter))
            results.append({"output": y.detach(), "hidden": h.detach(), "grad of hidden": h.grad,
                            "grad of x": x.grad, "grad of column weight": c.weight.grad,
                            "grad of column bias": c.bias.grad, "grad of row weight": w.weight.grad,
                            "grad of row bias": w.bias.grad})
        for name, got in results[1].items():
            assert_matches_reference(got, results[0][name], name=f"{what}: fused vs un-fused {name}",
                                     rank=r, exact=integer)
        assert not moved or moved[0] == moved[1], (
            f"rank {r}: {what}: the fused torch layers moved {moved[1]}, the un-fused (gathered x kept, "
            f"as in the fused column) {moved[0]}")
        # the single device: the two layers on the whole sequence
        x = x_full.clone().requires_grad_(True)
        y = row(column(x))
        y.backward(dy_full)
        cols = slice(*shard_range(F, r, t))
        reference = {"output": y.detach()[:, start:stop], "grad of x": x.grad[:, start:stop],
                     "grad of column weight": column.weight.grad[cols],
                     "grad of row weight": row.weight.grad[:, cols], "grad of row bias": row.bias.grad}
        for name, expected in reference.items():
            assert_matches_reference(results[1][name], expected, name=f"{what}: fused vs nn.Linear {name}",
                                     rank=r)
        n += 13
    return n


def check_async_layer(group, dtype=None, gather_output=False, seed=700):
    """AsyncColumnParallelLinear vs ColumnParallelLinear: equal bits; vs nn.Linear: the policy.

    Every rank builds the same nn.Linear (8 -> 12) and input X (3, 5, 8); rank r's upstream
    gradient dY_r is its own (rank-distinct) block of the full dY. dtype: default float64.
    """
    import torch
    from torch import nn

    from tp_from_scratch.nn.linear import ColumnParallelLinear
    from tp_from_scratch.nn.mappings import tp_rank, tp_world_size
    from tp_from_scratch.overlap.linear import AsyncColumnParallelLinear
    dtype = dtype or torch.float64
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


def run_checks(comm, with_torch=False):
    """Every numpy check on ``comm``; with_torch: also the layer, with ``comm`` as its group and,
    under torchrun, with the world process group (native collectives)."""
    n = check_algorithms(comm) + check_async(comm) + check_collective_matmul(comm)
    if with_torch:
        # imported only here: under mpiexec, torch's import alone costs each rank seconds
        import torch
        import torch.distributed as dist

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
