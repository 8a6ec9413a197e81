"""Megatron's region mappings (f, g, scatter, gather) as autograd Functions, on in-process ranks.

Data are rank-distinct and integer-valued, so every sum is exact in any order and every
result is compared bit for bit. The meter then checks the communication: f and g cost one
all-reduce each, the Megatron MLP one all-reduce forward and one backward, and the
vocab-parallel cross-entropy three all-reduces of N numbers (never the N x V logits).
"""
import pytest
import torch

from tp_from_scratch.compare import assert_matches_reference
from tp_from_scratch.comm import run_spmd
from tp_from_scratch import nn as tp_nn
from tp_from_scratch.nn import (ColumnParallelLinear, RowParallelLinear, VocabParallelEmbedding,
                                copy_to_tp_region, gather_from_tp_region, reduce_from_tp_region,
                                scatter_to_tp_region, vocab_parallel_cross_entropy)
from tp_from_scratch.nn.collectives import all_reduce
from tp_from_scratch.nn.mappings import sum_over_replicas
from tp_from_scratch.sharding import shard_sizes
from tp_from_scratch.testing import random_array, rank_rng

WORLD_SIZES = [1, 2, 3, 4]


def _data(seed, rank, shape):
    """Rank-distinct integer-valued float64 data, reproducible by any rank for any rank."""
    return torch.tensor(random_array(rank_rng(seed, rank), shape, integer=True), requires_grad=True)


def _f(comm, seed):
    # f: x is replicated (rank 0's data on all); the gradients differ per rank and must be summed
    x = _data(seed, 0, (3, 5))
    y = copy_to_tp_region(comm, x)
    assert_matches_reference(y, x, name="f forward (identity)", rank=comm.rank, exact=True)
    y.backward(_data(seed + 1, comm.rank, (3, 5)).detach())
    total = sum(_data(seed + 1, r, (3, 5)).detach() for r in range(comm.world_size))
    assert_matches_reference(x.grad, total, name="f backward (all-reduce)", rank=comm.rank, exact=True)


def _g(comm, seed):
    # g: each rank holds a partial; forward sums them; the replicated gradient passes unchanged
    x = _data(seed, comm.rank, (3, 5))
    y = reduce_from_tp_region(comm, x)
    total = sum(_data(seed, r, (3, 5)).detach() for r in range(comm.world_size))
    assert_matches_reference(y, total, name="g forward (all-reduce)", rank=comm.rank, exact=True)
    dy = _data(seed + 1, 0, (3, 5)).detach()
    y.backward(dy)
    assert_matches_reference(x.grad, dy, name="g backward (identity)", rank=comm.rank, exact=True)
    assert_matches_reference(x, _data(seed, comm.rank, (3, 5)), name="g input (unchanged)",
                             rank=comm.rank, exact=True)


def _scatter(comm, seed, n):
    t, r = comm.world_size, comm.rank
    sizes = shard_sizes(n, t)
    lo, hi = sum(sizes[:r]), sum(sizes[:r + 1])
    x = _data(seed, 0, (2, n))
    y = scatter_to_tp_region(comm, x)
    assert_matches_reference(y, x[:, lo:hi], name="scatter forward (own chunk)", rank=r, exact=True)
    y.backward(_data(seed + 1, r, (2, hi - lo)).detach())
    # backward: every rank's gradient chunk, gathered in rank order
    chunks = [_data(seed + 1, q, (2, sizes[q])).detach() for q in range(t)]
    assert_matches_reference(x.grad, torch.cat(chunks, -1), name="scatter backward (all-gather)",
                             rank=r, exact=True)


def _gather(comm, seed, n):
    t, r = comm.world_size, comm.rank
    sizes = shard_sizes(n, t)
    lo, hi = sum(sizes[:r]), sum(sizes[:r + 1])
    x = _data(seed, r, (2, sizes[r]))
    y = gather_from_tp_region(comm, x, sizes)
    expected = torch.cat([_data(seed, q, (2, sizes[q])).detach() for q in range(t)], -1)
    assert_matches_reference(y, expected, name="gather forward (all-gather)", rank=r, exact=True)
    dy = _data(seed + 1, 0, (2, n)).detach()
    y.backward(dy)
    assert_matches_reference(x.grad, dy[:, lo:hi], name="gather backward (own chunk)", rank=r, exact=True)


@pytest.mark.parametrize("t", WORLD_SIZES)
def test_copy_to_region_f_is_identity_forward_all_reduce_backward(t):
    run_spmd(_f, t, 10)


@pytest.mark.parametrize("t", WORLD_SIZES)
def test_reduce_from_region_g_is_all_reduce_forward_identity_backward(t):
    run_spmd(_g, t, 20)


@pytest.mark.parametrize("t", WORLD_SIZES)
def test_a_scalar_keeps_its_shape_through_g_and_the_all_reduce(t):
    # a loss (0-d) summed over the ranks on a Comm: the numpy bridge must not make it (1,)
    def rank(comm):
        x = torch.tensor(float(comm.rank + 1), dtype=torch.float64, requires_grad=True)
        y = tp_nn.reduce_from_tp_region(comm, x)
        y.backward()
        return y.shape, all_reduce(comm, x.detach()).shape, x.grad.shape, y.item()
    for shape, reduced, grad, value in run_spmd(rank, t):
        assert shape == reduced == grad == torch.Size([]) and value == t * (t + 1) / 2


@pytest.mark.parametrize("n", [8, 7])
@pytest.mark.parametrize("t", WORLD_SIZES)
def test_scatter_and_gather_are_each_others_adjoint(t, n):
    run_spmd(_scatter, t, 30, n)
    run_spmd(_gather, t, 40, n)


def _mlp_traffic(comm, hidden=8, ffn=16):
    rng = rank_rng(50, 0)
    fc = torch.nn.Linear(hidden, ffn, dtype=torch.float64)
    proj = torch.nn.Linear(ffn, hidden, dtype=torch.float64)
    fc_tp, proj_tp = ColumnParallelLinear.from_linear(fc, group=comm), RowParallelLinear.from_linear(proj, group=comm)
    x = torch.tensor(random_array(rng, (2, 3, hidden)), requires_grad=True)
    comm.meter.reset()
    y = proj_tp(torch.nn.functional.gelu(fc_tp(x)))
    forward = comm.meter.snapshot()["by_collective"]
    comm.meter.reset()
    y.sum().backward()
    return forward, comm.meter.snapshot()["by_collective"]


@pytest.mark.parametrize("t", [2, 3])
def test_megatron_mlp_costs_one_all_reduce_forward_and_one_backward(t):
    for rank, (forward, backward) in enumerate(run_spmd(_mlp_traffic, t)):
        # forward: only g (after the row layer); backward: only f (before the column layer)
        assert {k: v["calls"] for k, v in forward.items()} == {"all_reduce": 1}, f"rank {rank}: {forward}"
        assert {k: v["calls"] for k, v in backward.items()} == {"all_reduce": 1}, f"rank {rank}: {backward}"


def _cross_entropy_traffic(comm, tokens=(4, 8), vocab=64):
    sizes = shard_sizes(vocab, comm.world_size)
    lo = sum(sizes[:comm.rank])
    rng = rank_rng(60, 0)
    z = torch.tensor(random_array(rng, (*tokens, vocab))[..., lo:lo + sizes[comm.rank]], requires_grad=True)
    target = torch.tensor(rng.integers(0, vocab, size=tokens))
    comm.meter.reset()
    vocab_parallel_cross_entropy(comm, z, target, vocab_start=lo).backward()
    return comm.meter.snapshot(), z.detach().numpy().nbytes


@pytest.mark.parametrize("t", [2, 4])
def test_vocab_parallel_cross_entropy_never_moves_the_logits(t):
    for rank, (traffic, local_logit_bytes) in enumerate(run_spmd(_cross_entropy_traffic, t)):
        calls = {k: v["calls"] for k, v in traffic["by_collective"].items()}
        assert calls == {"all_reduce": 3}, f"rank {rank}: expected max, target and sum-exp all-reduces: {calls}"
        # 3 ring all-reduces of N = 32 float64 numbers: < 3 * 2 * 32 * 8 bytes, far below the logits
        assert traffic["bytes_sent"] <= 3 * 2 * 32 * 8 < local_logit_bytes, f"rank {rank}: {traffic}"


def test_the_short_names_are_the_paper_operators():
    assert tp_nn.f is copy_to_tp_region and tp_nn.g is reduce_from_tp_region


@pytest.mark.parametrize("build", [
    lambda: ColumnParallelLinear(4, 6),
    lambda: RowParallelLinear(6, 4),
    lambda: VocabParallelEmbedding(10, 4),
], ids=["column", "row", "embedding"])
def test_a_layer_built_without_a_group_names_the_missing_argument(build):
    # there is no default group: the object passed decides which collectives run
    with pytest.raises(TypeError, match="missing 1 required keyword-only argument: 'group'"):
        build()


@pytest.mark.parametrize("call", [
    lambda: copy_to_tp_region(None, torch.zeros(2)),
    lambda: reduce_from_tp_region(None, torch.zeros(2)),
    lambda: vocab_parallel_cross_entropy(None, torch.zeros(2, 3), torch.zeros(2, dtype=torch.long)),
    lambda: ColumnParallelLinear(4, 6, group=None),
], ids=["f", "g", "cross-entropy", "column"])
def test_none_is_not_a_group(call):
    with pytest.raises(TypeError, match="group must be a torch.distributed.ProcessGroup .* or a "
                                        "tp_from_scratch.comm.Comm"):
        call()


def _replicas(comm, seed, replicas):
    # every rank holds a copy of its block's weight; backward sums the copies' gradients
    r = comm.rank
    w = _data(seed, r // replicas, (3, 2))
    y = sum_over_replicas(comm, w, replicas)
    assert_matches_reference(y, w, name="forward (identity)", rank=r, exact=True)
    y.backward(_data(seed + 1, r, (3, 2)).detach())
    block = r // replicas
    total = sum(_data(seed + 1, q, (3, 2)).detach() for q in range(block * replicas, (block + 1) * replicas))
    assert_matches_reference(w.grad, total, name="backward (sum over the copies)", rank=r, exact=True)
    return comm.meter.snapshot()["by_collective"]


@pytest.mark.parametrize("t,replicas", [(2, 2), (4, 2), (4, 4), (3, 1)])
def test_sum_over_replicas_sums_gradients_among_the_ranks_holding_a_copy(t, replicas):
    calls = run_spmd(_replicas, t, 70, replicas)
    expected = {"all_reduce": 1} if replicas > 1 else {}
    assert all({k: v["calls"] for k, v in c.items()} == expected for c in calls), calls


def test_cross_entropy_names_a_target_shape_mismatch():
    def bad(comm):
        vocab_parallel_cross_entropy(comm, torch.zeros(2, 3, 4), torch.zeros(2, 4, dtype=torch.long))
    with pytest.raises(Exception, match=r"target shape \(2, 4\) does not match .* \(2, 3\) on rank \d"):
        run_spmd(bad, 2)


@pytest.mark.parametrize("sizes,message", [([2, 2], r"size 5 does not match the shard sizes \[2, 2\]"),
                                           ([2, 2, 1], r"3 shard sizes \[2, 2, 1\] for tp=2")],
                         ids=["sum", "count"])
def test_scatter_names_shard_sizes_that_do_not_fit(sizes, message):
    with pytest.raises(Exception, match=r"rank \d: .*" + message):
        run_spmd(lambda comm: scatter_to_tp_region(comm, torch.zeros(2, 5), sizes), 2)
