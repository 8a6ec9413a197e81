"""Lesson 10's collective matmul on simulated ranks, t = 1..4: fused == un-fused.

The column (all-gather -> matmul) and row (matmul -> reduce-scatter) layers, numpy and torch,
against the sequence-parallel layers of Lesson 7 that all-gather / reduce-scatter first: outputs
and every gradient (bit for bit on integer-valued data, within the tolerance policy on gaussian
data, where BLAS may multiply row blocks differently), the meter's messages and bytes, uneven
and empty sequence shards, and the errors promised. The same checks run under torchrun and
mpiexec inside the launches of tests/test_overlap.py (tp_from_scratch.overlap.check).
"""
import numpy as np
import pytest

from tp_from_scratch.comm import SPMDError, run_spmd
from tp_from_scratch.compare import assert_matches_reference
from tp_from_scratch.overlap import collective_matmul as CM
from tp_from_scratch.overlap.check import check_collective_matmul, check_collective_matmul_torch
from tp_from_scratch.overlap.nonblocking import all_reduce_async
from tp_from_scratch.testing import random_array, rank_rng


@pytest.mark.parametrize("t", [1, 2, 3, 4])
def test_numpy_layers_equal_the_unfused_ones_and_move_the_same_bytes(t):
    assert run_spmd(check_collective_matmul, t) == [96] * t


@pytest.mark.parametrize("t", [1, 2, 3, 4])
def test_torch_functions_equal_sequence_parallel_nn_on_a_comm(t):
    assert run_spmd(check_collective_matmul_torch, t) == [78] * t


def test_the_loop_multiplies_while_the_next_chunk_travels():
    # the order of the pieces: every receive is posted before the matmul of the chunk in hand
    def rank_fn(comm):
        steps = CM.Steps()
        x = np.ones((1, 2, 3))
        CM.all_gather_matmul(comm, x, np.ones((3, 4)), steps=steps)
        gather = [what for what, _, _ in steps.events]
        steps = CM.Steps()
        CM.matmul_reduce_scatter(comm, np.ones((1, 6, 3)), np.ones((3, 4)), steps=steps)
        return gather, [what for what, _, _ in steps.events]
    for gather, scatter in run_spmd(rank_fn, 3):
        assert gather == ["send", "matmul", "wait"] * 2 + ["matmul"], gather
        assert scatter == ["matmul"] + ["send", "matmul", "wait"] * 2, scatter


def test_a_shard_that_breaks_the_array_split_rule_is_refused():
    def rank_fn(comm):  # T = 5 over 2 ranks is [3, 2]; rank 0 holds 2 (rank 1 is right)
        CM.all_gather_matmul(comm, np.ones((1, 2, 4)), np.ones((4, 2)), sizes=[3, 2])
    with pytest.raises(SPMDError, match=r"rank 0: sequence shard of length 2 with shard sizes \[3, 2\]"):
        run_spmd(rank_fn, 2)


def test_uneven_shards_without_sizes_disagree_by_name():
    # without sizes= each rank assumes equal shards: rank 0 thinks T=6, rank 1 T=4
    def rank_fn(comm):
        CM.all_gather_matmul(comm, np.ones((1, 3 - comm.rank, 4)), np.ones((4, 2)))
    with pytest.raises(SPMDError, match="collective mismatch"):
        run_spmd(rank_fn, 2)


def test_refused_while_an_async_all_reduce_is_in_flight():
    def rank_fn(comm):
        all_reduce_async(comm, np.ones(3))
        CM.matmul_reduce_scatter(comm, np.ones((1, 2, 3)), np.ones((3, 3)))
    with pytest.raises(SPMDError, match="all_reduce_async is in flight"):
        run_spmd(rank_fn, 2)


def test_fused_equals_the_single_device_product():
    # the two loops alone: all-gather -> x @ w on every rank, and the reduce-scatter of a Partial
    xs = [random_array(rank_rng(990, r), (2, 7, 5)) for r in range(3)]
    w = random_array(rank_rng(991), (5, 4))

    def rank_fn(comm):
        x, y = CM.all_gather_matmul(comm, np.array_split(xs[0], 3, axis=1)[comm.rank], w, sizes=[3, 2, 2])
        return x, y, CM.matmul_reduce_scatter(comm, xs[comm.rank], w)
    total = sum(x @ w for x in xs)
    for r, (x, y, scattered) in enumerate(run_spmd(rank_fn, 3)):
        assert_matches_reference(x, xs[0], name="gathered x", rank=r, exact=True)
        assert_matches_reference(y, xs[0] @ w, name="all_gather_matmul", rank=r)
        assert_matches_reference(scattered, np.array_split(total, 3, axis=1)[r], name="matmul_reduce_scatter",
                                 rank=r)


def test_the_lesson_picture_is_drawn_from_the_real_loops():
    from tp_from_scratch.overlap.figures import trace_collective_matmul
    from tp_from_scratch.plots import decode
    for r, trace in enumerate(trace_collective_matmul(3)):
        multiplied, sent = trace["all-gather"]
        assert [decode(v, 3) for v in multiplied] == [((r - s) % 3, {(r - s) % 3}) for s in range(3)]
        assert sent == multiplied[:2]  # the chunk in hand is the one on its way to rank r+1
        _, partials = trace["reduce-scatter"]
        # after step s rank r holds chunk r-s-1 summed over ranks r-s-1 .. r
        assert [decode(v, 3) for v in partials] == [((r - s - 1) % 3, {(r - k) % 3 for k in range(s + 1)})
                                                    for s in range(3)]


@pytest.mark.parametrize("integer", [True, False])
def test_column_without_the_gathered_x_regathers_it_for_dw(integer):
    # save_gathered=False keeps the shard; backward gathers x again, fused with dW's shares
    import torch
    from torch import nn

    from tp_from_scratch.nn.linear import ColumnParallelLinear
    from tp_from_scratch.overlap.collective_matmul_nn import all_gather_linear
    from tp_from_scratch.sequence_parallel.nn import column_linears_from_sequence
    sizes, H, F = [3, 2, 2], 5, 7
    linear = nn.utils.skip_init(nn.Linear, H, F, dtype=torch.float64)
    with torch.no_grad():
        linear.weight.copy_(torch.tensor(random_array(rank_rng(970), (F, H), integer=integer)))
        linear.bias.copy_(torch.tensor(random_array(rank_rng(971), (F,), integer=integer)))
    x_full = torch.tensor(random_array(rank_rng(972), (2, 7, H), integer=integer))

    def rank_fn(comm):
        out = []
        for fused in (False, True):
            comm.meter.reset()
            layer = ColumnParallelLinear.from_linear(linear, group=comm)
            start = sum(sizes[:comm.rank])
            x = x_full[:, start:start + sizes[comm.rank]].clone().requires_grad_(True)
            if fused:
                y = all_gather_linear(comm, x, layer.weight, layer.bias, sizes, save_gathered=False)
            else:
                (y,) = column_linears_from_sequence(comm, x, [layer], sizes, save_gathered=False)
            y.backward(torch.tensor(random_array(rank_rng(973, comm.rank), tuple(y.shape), integer=integer)))
            out.append(([y.detach(), x.grad, layer.weight.grad, layer.bias.grad], comm.meter.bytes_sent))
        return out
    for r, ((unfused, sent0), (fused, sent1)) in enumerate(run_spmd(rank_fn, 3)):
        assert sent1 == sent0, f"rank {r}: fused sent {sent1} bytes, un-fused {sent0}"
        for name, got, expected in zip(["output", "grad of x", "grad of weight", "grad of bias"], fused, unfused):
            assert_matches_reference(got, expected, name=f"save_gathered=False {name}", rank=r, exact=integer)
