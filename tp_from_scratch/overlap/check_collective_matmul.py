"""The collective matmul against the un-fused sequence-parallel layers, on one rank's group.

check_collective_matmul(comm)        numpy (collective_matmul) vs sequence_parallel.linear: outputs
                                     and the three gradients of the column and the row layer, and
                                     the meter: the same messages and bytes as the un-fused
                                     all-gather / reduce-scatter, direction by direction
check_collective_matmul_torch(group) torch (collective_matmul_nn) vs sequence_parallel.nn on a Comm
                                     or a ProcessGroup, and the single-device nn.Linear

Sequence lengths: divisible by t, uneven (array_split), and shorter than t (empty shards).
Data: integer-valued (exact in any summation order: compared bit for bit) and gaussian
(the matmul by row blocks may differ in the last bits from one matmul, see collective_matmul:
the tolerance policy). Used by tests/test_collective_matmul.py on simulated ranks and by
``.venv/bin/python -m tp_from_scratch.overlap.check`` under mpiexec and torchrun.
"""
import numpy as np

from tp_from_scratch.comm import Comm
from tp_from_scratch.compare import assert_matches_reference
from tp_from_scratch.overlap import collective_matmul as CM
from tp_from_scratch.sequence_parallel import linear as SP
from tp_from_scratch.sharding import shard_range, shard_sizes
from tp_from_scratch.testing import random_array, rank_rng

B, H, F = 2, 6, 10  # batch, the column layer's input width, the full output width


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


def _counts(comm):
    m = comm.meter
    return m.messages_sent, m.bytes_sent, m.messages_received, m.bytes_received


def _metered(comm, fn, *args):
    comm.meter.reset()
    result = fn(comm, *args)
    return result, _counts(comm)


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
                moved.append(_counts(group))
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
