"""The meter confirms the theory: what each parallel layer communicates, to the byte.

Theory (Megatron): the MLP and the attention each make one all-reduce of a (B, T, H)
activation forward (g) and one backward (f); a pre-LN block makes two each way. A ring
all-reduce of N elements (reduce-scatter, then all-gather, chunks from numpy.array_split)
sends from rank r every chunk but chunk r, then every chunk but chunk r+1:
    bytes sent by rank r = (2N - c_r - c_{r+1}) x itemsize,   c = shard_sizes(N, t)
which is exactly 2(t-1)/t x N x itemsize when t divides N. Summed over the ranks it is
2(t-1) x N x itemsize whatever N is. So per block per step, per rank:
    4 all-reduces x 2(t-1)/t x B*T*H x itemsize.
For the block there is in fact no chunk rounding: t divides the number of heads, and the
heads divide H, so t divides N = B*T*H and the formula holds to the byte on every rank.
"""
import numpy as np
import pytest

from tp_from_scratch.comm import run_spmd
from tp_from_scratch.layers import attention, block, mlp
from tp_from_scratch.layers import reference as ref
from tp_from_scratch.sharding import shard_sizes
from tp_from_scratch.testing import random_array, rank_rng


def ring_all_reduce_bytes(n, t, rank, itemsize):
    """Bytes rank ``rank`` sends in one ring all-reduce of n elements (see the module docstring)."""
    c = shard_sizes(n, t)
    return 0 if t == 1 else (2 * n - c[rank] - c[(rank + 1) % t]) * itemsize


def traffic_of_one_step(comm, layer, x, dy):
    """Run forward then backward; return (calls forward, calls backward, final by_collective)."""
    comm.meter.reset()
    y, cache = layer.forward(comm, x)
    forward_calls = comm.meter.by_collective["all_reduce"].calls
    layer.backward(comm, dy, cache)
    traffic = comm.meter.by_collective
    return forward_calls, traffic["all_reduce"].calls - forward_calls, traffic


class Block:
    """The pre-LN block as a pair of functions of (comm, x), for traffic_of_one_step."""

    def __init__(self, config, dtype):
        self.config = config
        self.params = ref.init_block_params(rank_rng(0), config, dtype)

    def forward(self, comm, x):
        self.local = block.shard_block_params(self.params, self.config, comm.world_size, comm.rank)
        return block.parallel_block_forward(comm, x, self.local, self.config)

    def backward(self, comm, dy, cache):
        return block.parallel_block_backward(comm, dy, cache)


@pytest.mark.parametrize("dtype", [np.float64, np.float32])
@pytest.mark.parametrize("t,batch,seq", [
    (2, 2, 3),   # t divides B*T*H: exactly 4 x 2(t-1)/t x B*T*H x itemsize
    (4, 2, 3),
    (3, 1, 5),
    (1, 2, 3),   # one rank: the all-reduces happen, but move nothing
])
def test_block_makes_two_all_reduces_each_way_and_sends_the_predicted_bytes(t, batch, seq, dtype):
    heads = 6 if t == 3 else 4
    config = ref.BlockConfig(hidden=2 * heads, n_heads=heads, n_kv_heads=heads // 2, ffn=12)
    H = config.hidden
    n = batch * seq * H
    itemsize = np.dtype(dtype).itemsize
    layer = Block(config, dtype)
    x = random_array(rank_rng(1), (batch, seq, H), dtype)
    dy = random_array(rank_rng(2), (batch, seq, H), dtype)

    results = run_spmd(lambda comm: traffic_of_one_step(comm, layer, x, dy), t)

    for rank, (forward_calls, backward_calls, traffic) in enumerate(results):
        # two all-reduces forward (after attention, after the MLP), two backward (their f's)
        assert (forward_calls, backward_calls) == (2, 2), f"rank {rank}"
        # and nothing else: no broadcast, no all-gather, no point-to-point on the side
        assert set(traffic) == {"all_reduce"}, f"rank {rank}: {sorted(traffic)}"
        sent = traffic["all_reduce"].bytes_sent
        assert sent == 4 * ring_all_reduce_bytes(n, t, rank, itemsize), f"rank {rank}"
        assert traffic["all_reduce"].messages_sent == 4 * 2 * (t - 1)
        if n % t == 0:  # the formula of the issue, to the byte
            assert sent * t == 4 * 2 * (t - 1) * n * itemsize
    total = sum(traffic["all_reduce"].bytes_sent for _, _, traffic in results)
    assert total == 4 * 2 * (t - 1) * n * itemsize  # summed over ranks: no rounding at all
    assert total == sum(traffic["all_reduce"].bytes_received for _, _, traffic in results)


class Sublayer:
    """The parallel MLP or attention as a pair of functions of (comm, x)."""

    def __init__(self, kind, dtype):
        self.kind = kind
        rng = rank_rng(3)
        self.params = (ref.init_mlp_params(rng, 8, 16, dtype) if kind == "mlp"
                       else ref.init_attention_params(rng, 8, 4, 2, dtype=dtype))

    def forward(self, comm, x):
        t, r = comm.world_size, comm.rank
        if self.kind == "mlp":
            return mlp.parallel_mlp_forward(comm, x, mlp.shard_mlp_params(self.params, t, r))
        local = attention.shard_attention_params(self.params, 4, 2, t, r)
        return attention.parallel_attention_forward(comm, x, local, 4, 2)

    def backward(self, comm, dy, cache):
        if self.kind == "mlp":
            return mlp.parallel_mlp_backward(comm, dy, cache)
        return attention.parallel_attention_backward(comm, dy, cache)


@pytest.mark.parametrize("kind", ["mlp", "attention"])
@pytest.mark.parametrize("t", [2, 4])
def test_mlp_and_attention_make_one_all_reduce_each_way(kind, t):
    # column-then-row needs nothing between the two layers: one all-reduce (g) forward, one (f) back
    x = random_array(rank_rng(4), (2, 3, 8))
    dy = random_array(rank_rng(5), (2, 3, 8))
    layer = Sublayer(kind, np.float64)
    for rank, (fwd, bwd, traffic) in enumerate(run_spmd(
            lambda comm: traffic_of_one_step(comm, layer, x, dy), t)):
        assert (fwd, bwd) == (1, 1), f"{kind} on rank {rank}"
        assert set(traffic) == {"all_reduce"}
        assert traffic["all_reduce"].bytes_sent * t == 2 * 2 * (t - 1) * x.size * x.itemsize
