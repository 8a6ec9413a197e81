"""Every tensor-parallel layer against its single-device reference, on one rank of any backend.

Each ``check_*`` function runs on every rank (under run_spmd, mpiexec or torchrun) and:
  1. builds the same full parameters, input x and output gradient dy on every rank
     (seeded with rank_rng(seed): Replicated data must be equal everywhere);
  2. runs the single-device reference forward and backward;
  3. runs the parallel forward and backward on this rank's shards, counting all-reduces
     with the meter (one each way for a linear pair, MLP or attention; two for a block);
  4. compares, through compare.assert_matches_reference: the output and dx on this rank,
     then every parameter gradient after all-gathering the local gradients of all ranks
     and assembling them with the layer's gather helper.
It returns a list of Verdict rows and raises AssertionError listing every mismatch.

Launched directly it checks every layer for float64 and float32, e.g.
    .venv/bin/mpiexec -n 4 .venv/bin/python -m tp_from_scratch.layers.check
    .venv/bin/torchrun --standalone --nproc-per-node 4 -m tp_from_scratch.layers.check
    .venv/bin/python -m tp_from_scratch.layers.check        # simulated ranks, t = 1, 2, 3, 4
"""
from dataclasses import dataclass

import numpy as np

from tp_from_scratch.collectives import all_gather
from tp_from_scratch.compare import assert_matches_reference, max_error
from tp_from_scratch.layers import attention, block, linear, mlp
from tp_from_scratch.layers import reference as ref
from tp_from_scratch.testing import random_array, rank_rng


@dataclass
class Verdict:
    """One compared tensor: its name, the largest error against the reference, and the verdict."""
    name: str
    error: float
    message: str = ""  # empty when it matches

    @property
    def ok(self):
        return not self.message

    def __str__(self):
        return f"{self.name:<24} max error {self.error:.2e}  {'OK' if self.ok else 'MISMATCH ' + self.message}"


def compare(verdicts, got, expected, name, rank, exact=False):
    """assert_matches_reference, recorded as a Verdict instead of raised (see raise_mismatches)."""
    try:
        assert_matches_reference(got, expected, name=name, rank=rank, exact=exact)
        message = ""
    except AssertionError as error:
        message = str(error)
    error = max_error(got, expected) if np.shape(got) == np.shape(expected) else float("inf")
    verdicts.append(Verdict(name, error, message))


def raise_mismatches(verdicts):
    """Raise one AssertionError naming every tensor that does not match its reference."""
    bad = [v.message for v in verdicts if not v.ok]
    if bad:
        raise AssertionError("\n".join(bad))
    return verdicts


def all_ranks(comm, local):
    """The list, in rank order, of every rank's dict of local arrays (an all_gather per key)."""
    stacked = {k: all_gather(comm, np.asarray(v)[None], axis=0) for k, v in local.items()}
    return [{k: v[r] for k, v in stacked.items()} for r in range(comm.world_size)]


def all_reduce_calls(comm):
    """How many all-reduces this rank's meter has counted so far."""
    traffic = comm.meter.by_collective.get("all_reduce")
    return 0 if traffic is None else traffic.calls


def run_and_compare(comm, x, dy, forward, backward, expected, gather_grads, per_direction, exact=False):
    """Run a parallel forward/backward, check the all-reduce counts, compare y, dx and gathered grads.

    expected: (y, dx, full grads) from the reference; gather_grads: list of local grads -> full.
    per_direction: the all-reduces the layer must make forward, and again backward.
    exact: demand bit-for-bit equality (integer-valued data only).
    """
    verdicts = []
    y_ref, dx_ref, grads_ref = expected
    start = all_reduce_calls(comm)
    y, cache = forward(x)
    forward_calls = all_reduce_calls(comm) - start
    dx, grads = backward(dy, cache)
    backward_calls = all_reduce_calls(comm) - start - forward_calls
    if (forward_calls, backward_calls) != (per_direction, per_direction):
        raise AssertionError(
            f"rank {comm.rank}: {forward_calls} all-reduces forward and {backward_calls} backward,"
            f" expected {per_direction} each way")
    compare(verdicts, y, y_ref, "output", comm.rank, exact)
    compare(verdicts, dx, dx_ref, "grad of x", comm.rank, exact)
    full = gather_grads(all_ranks(comm, grads))
    for key in grads_ref:
        compare(verdicts, full[key], grads_ref[key], f"grad of {key}", comm.rank, exact)
    return raise_mismatches(verdicts)


def check_linear_pair(comm, batch=2, seq=3, hidden=4, ffn=8, seed=0, dtype=np.float64, integer=False,
                      bias=True):
    """Column-parallel Linear(H -> F) then row-parallel Linear(F -> H), no non-linearity between.

    With ``integer`` data every sum is exact, so the parallel result must be bit-exact.
    bias=False checks both layers without biases (b = None).
    """
    rng = rank_rng(seed)
    w1, b1 = random_array(rng, (hidden, ffn), dtype, integer), random_array(rng, (ffn,), dtype, integer)
    w2, b2 = random_array(rng, (ffn, hidden), dtype, integer), random_array(rng, (hidden,), dtype, integer)
    x = random_array(rng, (batch, seq, hidden), dtype, integer)
    dy = random_array(rng, (batch, seq, hidden), dtype, integer)
    if not bias:
        b1 = b2 = None
    # reference: y = (x @ w1 + b1) @ w2 + b2
    a, c1 = ref.linear_forward(x, w1, b1)
    y_ref, c2 = ref.linear_forward(a, w2, b2)
    da, dw2, db2 = ref.linear_backward(dy, c2)
    dx_ref, dw1, db1 = ref.linear_backward(da, c1)
    named = {"fc.weight": dw1, "fc.bias": db1, "proj.weight": dw2, "proj.bias": db2}  # the MLP's names
    grads_ref = {k: v for k, v in named.items() if v is not None}

    t, r = comm.world_size, comm.rank
    w1_i, b1_i = linear.shard_column_parallel_linear(w1, b1, t, r, "ffn size")
    w2_i, b2_i = linear.shard_row_parallel_linear(w2, b2, t, r, "ffn size")

    def forward(x):
        a_i, ca = linear.column_parallel_linear_forward(comm, x, w1_i, b1_i)  # (B, T, F/t)
        y, cy = linear.row_parallel_linear_forward(comm, a_i, w2_i, b2_i)     # (B, T, H)
        return y, (ca, cy)

    def backward(dy, cache):
        ca, cy = cache
        da_i, dw2_i, db2_ = linear.row_parallel_linear_backward(comm, dy, cy)
        dx, dw1_i, db1_i = linear.column_parallel_linear_backward(comm, da_i, ca)
        if not bias:  # no bias, no bias gradient
            assert db1_i is None and db2_ is None
            return dx, {"fc.weight": dw1_i, "proj.weight": dw2_i}
        return dx, {"fc.weight": dw1_i, "fc.bias": db1_i, "proj.weight": dw2_i, "proj.bias": db2_}

    def gather(grads):  # the pair's gradients are sharded exactly like the MLP's parameters
        if bias:
            return mlp.gather_mlp_params(grads)
        return {"fc.weight": np.concatenate([g["fc.weight"] for g in grads], axis=1),
                "proj.weight": np.concatenate([g["proj.weight"] for g in grads], axis=0)}

    return run_and_compare(comm, x, dy, forward, backward, (y_ref, dx_ref, grads_ref),
                           gather, per_direction=1, exact=integer)


def check_mlp(comm, batch=2, seq=3, hidden=4, ffn=8, seed=0, dtype=np.float64):
    """parallel_mlp_forward / _backward (mlp.py) against reference.mlp_forward / mlp_backward."""
    rng = rank_rng(seed)
    params = ref.init_mlp_params(rng, hidden, ffn, dtype)
    x, dy = random_array(rng, (batch, seq, hidden), dtype), random_array(rng, (batch, seq, hidden), dtype)
    y_ref, cache = ref.mlp_forward(x, params)
    dx_ref, grads_ref = ref.mlp_backward(dy, cache)
    local = mlp.shard_mlp_params(params, comm.world_size, comm.rank)
    return run_and_compare(
        comm, x, dy, lambda x: mlp.parallel_mlp_forward(comm, x, local),
        lambda dy, c: mlp.parallel_mlp_backward(comm, dy, c), (y_ref, dx_ref, grads_ref),
        mlp.gather_mlp_params, per_direction=1)


def check_attention(comm, batch=2, seq=4, hidden=8, n_heads=4, n_kv_heads=2, seed=0, dtype=np.float64):
    """The parallel causal GQA attention (attention.py) against the reference."""
    rng = rank_rng(seed)
    params = ref.init_attention_params(rng, hidden, n_heads, n_kv_heads, dtype=dtype)
    x, dy = random_array(rng, (batch, seq, hidden), dtype), random_array(rng, (batch, seq, hidden), dtype)
    y_ref, cache = ref.attention_forward(x, params, n_heads, n_kv_heads)
    dx_ref, grads_ref = ref.attention_backward(dy, cache)
    local = attention.shard_attention_params(params, n_heads, n_kv_heads, comm.world_size, comm.rank)
    return run_and_compare(
        comm, x, dy, lambda x: attention.parallel_attention_forward(comm, x, local, n_heads, n_kv_heads),
        lambda dy, c: attention.parallel_attention_backward(comm, dy, c), (y_ref, dx_ref, grads_ref),
        lambda g: attention.gather_attention_grads(g, n_heads, n_kv_heads), per_direction=1)


def check_block(comm, config, batch=2, seq=4, seed=0, dtype=np.float64):
    """The parallel pre-LN transformer block (block.py) against the reference."""
    rng = rank_rng(seed)
    params = ref.init_block_params(rng, config, dtype)
    shape = (batch, seq, config.hidden)
    x, dy = random_array(rng, shape, dtype), random_array(rng, shape, dtype)
    y_ref, cache = ref.block_forward(x, params, config)
    dx_ref, grads_ref = ref.block_backward(dy, cache)
    local = block.shard_block_params(params, config, comm.world_size, comm.rank)
    return run_and_compare(
        comm, x, dy, lambda x: block.parallel_block_forward(comm, x, local, config),
        lambda dy, c: block.parallel_block_backward(comm, dy, c), (y_ref, dx_ref, grads_ref),
        lambda g: block.gather_block_grads(g, config), per_direction=2)


def check_everything(comm, seed=0):
    """Every check above for float64 and float32, with sizes any tp in 1..4 divides.

    Returns the number of tensors compared on this rank.
    """
    t = comm.world_size
    heads = 12 if t == 3 else 4  # query heads divisible by t
    # KV heads: as many as query heads (plain multi-head), fewer (GQA), one (multi-query);
    # sharded where t divides them, replicated where they divide t
    kv_cases = [n for n in dict.fromkeys((heads, 2, 3, 1))
                if heads % n == 0 and (n % t == 0 or t % n == 0)]
    compared = 0
    for dtype in (np.float64, np.float32):
        compared += len(check_linear_pair(comm, ffn=12, seed=seed, dtype=dtype))
        compared += len(check_linear_pair(comm, ffn=12, seed=seed, dtype=dtype, integer=True))
        compared += len(check_mlp(comm, ffn=12, seed=seed, dtype=dtype))
        for n_kv in kv_cases:
            compared += len(check_attention(comm, hidden=2 * heads, n_heads=heads,
                                            n_kv_heads=n_kv, seed=seed, dtype=dtype))
        config = ref.BlockConfig(hidden=2 * heads, n_heads=heads, n_kv_heads=1, ffn=12)
        compared += len(check_block(comm, config, seed=seed, dtype=dtype))
    return compared


def report(comm):
    """Check everything on this rank and print one line."""
    compared = check_everything(comm)
    print(f"rank {comm.rank} of {comm.world_size}: all {compared} tensors match the reference "
          f"({type(comm).__name__})", flush=True)


def main():
    from tp_from_scratch.comm.launch import check_main
    check_main(report)  # plain python: every TP degree the checks' sizes allow, simulated


if __name__ == "__main__":
    main()
