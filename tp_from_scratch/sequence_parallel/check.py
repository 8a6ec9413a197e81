"""The sequence-parallel block against the single-device reference, on one rank of any backend.

Each rank builds the same full parameters, input x and output gradient dy (rank_rng(seed):
Replicated data must be equal everywhere), runs the reference block on all T positions, and
the sequence-parallel block on its own positions (array_split rule, so T need not divide by
t). Then, through compare.assert_matches_reference:
  * the output and dx on this rank's positions against the reference's same positions;
  * every parameter gradient after gathering all ranks' local ones (layers.block's helper,
    which also demands that the Replicated LayerNorm and bias gradients agree bit for bit);
  * the collectives the meter counted: forward 2 all-gathers + 2 reduce-scatters and nothing
    else; backward the same plus one all-reduce per LayerNorm.
It returns a list of Verdict rows and raises AssertionError listing every mismatch.

Launched directly it checks float64 and float32, T divisible by t and not:
    .venv/bin/mpiexec -n 4 .venv/bin/python -m tp_from_scratch.sequence_parallel.check
    .venv/bin/python -m tp_from_scratch.sequence_parallel.check        # simulated ranks, t = 1, 2, 3, 4
"""
import numpy as np

from tp_from_scratch.layers import block
from tp_from_scratch.layers import reference as ref
from tp_from_scratch.layers.check import all_ranks, compare, raise_mismatches
from tp_from_scratch.sequence_parallel.block import (
    sequence_parallel_block_backward, sequence_parallel_block_forward)
from tp_from_scratch.sequence_parallel.mappings import sequence_shard
from tp_from_scratch.testing import random_array, rank_rng

# what one block must communicate, per direction: {collective: calls}
FORWARD_CALLS = {"all_gather": 2, "reduce_scatter": 2}
BACKWARD_CALLS = {"all_gather": 2, "reduce_scatter": 2, "all_reduce": 2}  # + one per LayerNorm


def calls(comm):
    """{collective: calls} this rank's meter has counted so far."""
    return {name: traffic.calls for name, traffic in comm.meter.by_collective.items()}


def difference(after, before):
    """The calls made between two ``calls`` snapshots, without the zero entries."""
    changed = {name: n - before.get(name, 0) for name, n in after.items()}
    return {name: n for name, n in changed.items() if n}


def block_traffic(comm, params, config, x, dy, sequence_parallel):
    """One forward and backward of the TP block (Lesson 3) or the SP block on full params, x, dy.

    Returns the meter's by_collective snapshots (forward, backward): {collective: counters}.
    """
    local = block.shard_block_params(params, config, comm.world_size, comm.rank)
    if sequence_parallel:
        forward, backward = sequence_parallel_block_forward, sequence_parallel_block_backward
        x, dy = sequence_shard(comm, x), sequence_shard(comm, dy)
    else:
        forward, backward = block.parallel_block_forward, block.parallel_block_backward
    comm.meter.reset()
    _, cache = forward(comm, x, local, config)
    before = comm.meter.snapshot()["by_collective"]
    comm.meter.reset()
    backward(comm, dy, cache)
    return before, comm.meter.snapshot()["by_collective"]


def check_sequence_parallel_block(comm, config, batch=2, seq=5, seed=0, dtype=np.float64):
    """The sequence-parallel block (block.py) against reference.block_forward / block_backward."""
    rng = rank_rng(seed)
    params = ref.init_block_params(rng, config, dtype)
    shape = (batch, seq, config.hidden)
    x, dy = random_array(rng, shape, dtype), random_array(rng, shape, dtype)
    y_ref, cache = ref.block_forward(x, params, config)
    dx_ref, grads_ref = ref.block_backward(dy, cache)
    # the same shards as the tensor-parallel block: SP changes activations, not weights
    local = block.shard_block_params(params, config, comm.world_size, comm.rank)

    start = calls(comm)
    y, cache = sequence_parallel_block_forward(comm, sequence_shard(comm, x), local, config)
    middle = calls(comm)
    dx, grads = sequence_parallel_block_backward(comm, sequence_shard(comm, dy), cache)
    end = calls(comm)
    forward, backward = difference(middle, start), difference(end, middle)
    if (forward, backward) != (FORWARD_CALLS, BACKWARD_CALLS):
        raise AssertionError(f"rank {comm.rank}: collectives forward {forward}, backward {backward}; "
                             f"expected {FORWARD_CALLS} and {BACKWARD_CALLS}")

    verdicts = []
    compare(verdicts, y, sequence_shard(comm, y_ref), "output shard", comm.rank)
    compare(verdicts, dx, sequence_shard(comm, dx_ref), "grad of x shard", comm.rank)
    full = block.gather_block_grads(all_ranks(comm, grads), config)
    for key in grads_ref:
        compare(verdicts, full[key], grads_ref[key], f"grad of {key}", comm.rank)
    return raise_mismatches(verdicts)


def check_everything(comm, seed=0):
    """The block for float64 and float32, T divisible by t and not, MHA and GQA.

    Returns the number of tensors compared on this rank.
    """
    t = comm.world_size
    heads = 6 if t == 3 else 4  # query heads divisible by t
    compared = 0
    for dtype in (np.float64, np.float32):
        for n_kv in (heads, 2 if t != 3 else 3, 1):
            config = ref.BlockConfig(hidden=2 * heads, n_heads=heads, n_kv_heads=n_kv, ffn=12)
            for seq in (2 * t, 2 * t + 1):  # even shards, then uneven ones (array_split rule)
                compared += len(check_sequence_parallel_block(comm, config, seq=seq, seed=seed, dtype=dtype))
    return compared


def report(comm):
    """Check everything on this rank and print one line."""
    compared = check_everything(comm)
    print(f"rank {comm.rank} of {comm.world_size}: all {compared} sequence-parallel tensors match "
          f"the reference ({type(comm).__name__})", flush=True)


def main():
    from tp_from_scratch.comm.launch import check_main
    check_main(report)


if __name__ == "__main__":
    main()
