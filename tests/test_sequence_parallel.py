"""Lesson 7, numpy: the sequence-parallel mappings, LayerNorm and block against the reference.

The story: sequence parallelism must change WHERE activations live (Sharded along T between
the tensor-parallel regions) and nothing else: every output and gradient equals the
single-device block's, and the bytes on the wire equal the tensor-parallel block's exactly,
because a ring reduce-scatter plus a ring all-gather is a ring all-reduce.
"""
import numpy as np
import pytest

from tp_from_scratch.comm import SPMDError, run_spmd
from tp_from_scratch.comm.launchers import mpiexec_command, run_command
from tp_from_scratch.compare import assert_matches_reference
from tp_from_scratch.layers import block
from tp_from_scratch.layers import reference as ref
from tp_from_scratch.sequence_parallel import check
from tp_from_scratch.sequence_parallel.block import (
    sequence_parallel_block_backward, sequence_parallel_block_forward)
from tp_from_scratch.sequence_parallel.layernorm import (
    sequence_parallel_layernorm_backward, sequence_parallel_layernorm_forward)
from tp_from_scratch.sequence_parallel.mappings import (
    gather_from_sequence_parallel_region_backward, gather_from_sequence_parallel_region_forward,
    reduce_scatter_to_sequence_parallel_region_backward,
    reduce_scatter_to_sequence_parallel_region_forward, sequence_shard)
from tp_from_scratch.sharding import shard_sizes
from tp_from_scratch.testing import random_array, rank_rng


@pytest.mark.parametrize("t", [1, 2, 3, 4])
def test_block_matches_reference_on_simulated_ranks(t):
    # float64 and float32; T = 2t (even shards) and 2t + 1 (uneven); MHA, GQA and MQA;
    # outputs, dx and every gradient, plus the collective counts in each direction
    compared = run_spmd(check.check_everything, t)
    assert compared == [compared[0]] * t and compared[0] > 0


@pytest.mark.slow
@pytest.mark.timeout(150)
def test_block_matches_reference_under_mpiexec():
    result = run_command(mpiexec_command(4, "tp_from_scratch.sequence_parallel.check"), timeout=120)
    assert result.returncode == 0, result.stdout[-3000:]
    for rank in range(4):
        assert f"rank {rank} of 4: all " in result.stdout, result.stdout[-3000:]
    assert "sequence-parallel tensors match the reference (MPIComm)" in result.stdout


@pytest.mark.parametrize("t,seq", [(2, 4), (3, 7), (4, 3)])
def test_the_two_mappings_are_each_others_transpose(t, seq):
    # g: all-gather forward must be exact (it only moves data); its backward reduce-scatter
    # sums every rank's Partial gradient; g-bar is the same pair the other way round.
    shape = (2, seq, 3)

    def run(comm):
        x_shard = random_array(rank_rng(1, comm.rank), (2, shard_sizes(seq, t)[comm.rank], 3))
        gathered = gather_from_sequence_parallel_region_forward(comm, x_shard)
        partial = random_array(rank_rng(2, comm.rank), shape, integer=True)  # exact sums
        return (x_shard, gathered, partial,
                gather_from_sequence_parallel_region_backward(comm, partial),
                reduce_scatter_to_sequence_parallel_region_forward(comm, partial),
                reduce_scatter_to_sequence_parallel_region_backward(comm, x_shard))

    results = run_spmd(run, t)
    x_full = np.concatenate([r[0] for r in results], axis=1)
    total = sum(r[2] for r in results)
    for rank, (_, gathered, _, g_back, gbar_fwd, gbar_back) in enumerate(results):
        assert_matches_reference(gathered, x_full, name="g forward", rank=rank, exact=True)
        assert_matches_reference(gbar_back, x_full, name="g-bar backward", rank=rank, exact=True)
        expected = np.array_split(total, t, axis=1)[rank]
        assert_matches_reference(g_back, expected, name="g backward", rank=rank, exact=True)
        assert_matches_reference(gbar_fwd, expected, name="g-bar forward", rank=rank, exact=True)


def test_a_shard_that_breaks_the_array_split_rule_is_refused():
    # rank 0 with 1 position, rank 1 with 3: T = 4 gives each rank 2, and the backward
    # reduce-scatter would hand the gradients to the wrong positions
    def run(comm):
        return gather_from_sequence_parallel_region_forward(comm, np.zeros((1, 1 + 2 * comm.rank, 2)))

    with pytest.raises(SPMDError, match=r"rank \d: sequence shard of length \d, but splitting T=4"):
        run_spmd(run, 2)


def test_layernorm_weight_gradient_is_all_reduced_and_equals_the_reference():
    t, seq, H = 3, 7, 5
    rng = rank_rng(3)
    x, dy = random_array(rng, (2, seq, H)), random_array(rng, (2, seq, H))
    w, b = random_array(rng, (H,)), random_array(rng, (H,))
    y_ref, cache = ref.layernorm_forward(x, w, b)
    dx_ref, dw_ref, db_ref = ref.layernorm_backward(dy, cache)

    def run(comm):
        y, c = sequence_parallel_layernorm_forward(comm, sequence_shard(comm, x), w, b)
        dx, dw, db = sequence_parallel_layernorm_backward(comm, sequence_shard(comm, dy), c)
        assert_matches_reference(y, sequence_shard(comm, y_ref), name="LayerNorm output", rank=comm.rank)
        assert_matches_reference(dx, sequence_shard(comm, dx_ref), name="LayerNorm dx", rank=comm.rank)
        return dw, db, comm.meter.by_collective["all_reduce"].calls

    for rank, (dw, db, reduces) in enumerate(run_spmd(run, t)):
        assert reduces == 1, f"rank {rank}: weight and bias travel together, in one all-reduce"
        # a rank's own positions give only a third of dweight: far off, so the all-reduce matters
        assert_matches_reference(dw, dw_ref, name="LayerNorm dweight", rank=rank)
        assert_matches_reference(db, db_ref, name="LayerNorm dbias", rank=rank)


def ring_all_reduce_bytes(n, t, rank, itemsize):
    """Bytes rank ``rank`` sends in one ring all-reduce of n elements (collectives.all_reduce)."""
    c = shard_sizes(n, t)
    return 0 if t == 1 else (2 * n - c[rank] - c[(rank + 1) % t]) * itemsize


def sent(traffic, *names):
    return sum(traffic[name]["bytes_sent"] for name in names if name in traffic)


@pytest.mark.parametrize("dtype", [np.float64, np.float32])
@pytest.mark.parametrize("t,batch,seq", [(2, 2, 4), (4, 1, 8), (3, 2, 6), (2, 1, 5), (4, 2, 7), (1, 2, 3)])
def test_meter_sequence_parallel_sends_the_bytes_of_tensor_parallel(t, batch, seq, dtype):
    heads = 6 if t == 3 else 4
    config = ref.BlockConfig(hidden=2 * heads, n_heads=heads, n_kv_heads=heads // 2, ffn=12)
    H, itemsize = config.hidden, np.dtype(dtype).itemsize
    params = ref.init_block_params(rank_rng(0), config, dtype)
    x = random_array(rank_rng(1), (batch, seq, H), dtype)
    dy = random_array(rank_rng(2), (batch, seq, H), dtype)

    sp = run_spmd(lambda comm: check.block_traffic(comm, params, config, x, dy, True), t)
    tp = run_spmd(lambda comm: check.block_traffic(comm, params, config, x, dy, False), t)

    for rank, ((fwd, bwd), (tp_fwd, tp_bwd)) in enumerate(zip(sp, tp)):
        # forward: g twice (before q/k/v and before fc), g-bar twice (after o and proj); nothing else
        assert {k: v["calls"] for k, v in fwd.items()} == {"all_gather": 2, "reduce_scatter": 2}, rank
        # backward: the same pair reversed, plus one all-reduce per LayerNorm, of (2H,)
        assert {k: v["calls"] for k, v in bwd.items()} == {"all_gather": 2, "reduce_scatter": 2,
                                                          "all_reduce": 2}, rank
        assert bwd["all_reduce"]["bytes_sent"] == 2 * ring_all_reduce_bytes(2 * H, t, rank, itemsize)
        if seq % t == 0:
            # even sequence shards are even all-reduce chunks: the same bytes on every rank
            assert sent(fwd, "all_gather", "reduce_scatter") == tp_fwd["all_reduce"]["bytes_sent"], rank
            assert sent(bwd, "all_gather", "reduce_scatter") == tp_bwd["all_reduce"]["bytes_sent"], rank
    # summed over the ranks the bytes agree whatever T is: 2(t-1) x B*T*H per all-reduce
    for direction in (0, 1):
        sp_total = sum(sent(r[direction], "all_gather", "reduce_scatter") for r in sp)
        tp_total = sum(r[direction]["all_reduce"]["bytes_sent"] for r in tp)
        assert sp_total == tp_total == 2 * 2 * (t - 1) * batch * seq * H * itemsize


def test_without_the_layernorm_all_reduce_the_replicated_weights_would_drift(monkeypatch):
    # break it on purpose: LayerNorm gradients left Partial differ from rank to rank and from
    # the reference, and the block's check says so
    import tp_from_scratch.sequence_parallel.block as sp_block

    def partial_only(comm, dy, cache):
        return ref.layernorm_backward(dy, cache)

    monkeypatch.setattr(sp_block, "sequence_parallel_layernorm_backward", partial_only)
    config = ref.BlockConfig(hidden=8, n_heads=4, n_kv_heads=2, ffn=12)
    params = ref.init_block_params(rank_rng(0), config)
    x, dy = random_array(rank_rng(1), (2, 5, 8)), random_array(rank_rng(2), (2, 5, 8))
    _, cache = ref.block_forward(x, params, config)
    _, grads_ref = ref.block_backward(dy, cache)

    def run(comm):
        local = block.shard_block_params(params, config, comm.world_size, comm.rank)
        _, c = sequence_parallel_block_forward(comm, sequence_shard(comm, x), local, config)
        return sequence_parallel_block_backward(comm, sequence_shard(comm, dy), c)[1]["ln1.weight"]

    per_rank = run_spmd(run, 2)
    assert not np.allclose(per_rank[0], per_rank[1])
    with pytest.raises(AssertionError, match="grad of ln1.weight on rank 0"):
        assert_matches_reference(per_rank[0], grads_ref["ln1.weight"], name="grad of ln1.weight", rank=0)
    with pytest.raises(SPMDError, match="all_reduce"):  # the full check also notices the count
        run_spmd(lambda comm: check.check_sequence_parallel_block(comm, config, seq=5), 2)
