"""The CAAT block stack under TP against its single-device t-stream reference, on one rank.

``check_stack`` runs on every rank (simulated, mpiexec or torchrun) and:
  1. builds the same full parameters, input x and per-stream output gradients dys (t, B, T, H)
     on every rank (rank_rng(seed): Replicated data must be equal everywhere; the streams'
     gradients differ, as they do in a real model);
  2. runs the reference (reference.py) for all t streams;
  3. runs the TP stack (block.py) on this rank's shards and stream, metering the forward;
  4. compares through compare.assert_matches_reference: this rank's output against stream
     `rank` of the reference, dx, and every parameter gradient gathered from all ranks;
  5. checks that the forward sent exactly the bytes of ring all-reduces of the (B, T, k)
     slices: k/H of what ordinary TP sends.

Launched directly:
    .venv/bin/mpiexec -n 4 .venv/bin/python -m tp_from_scratch.partial_sync.check
    .venv/bin/python -m tp_from_scratch.partial_sync.check          # simulated ranks, t = 1, 2, 3, 4
"""
import numpy as np

from tp_from_scratch.layers.block import gather_block_grads, shard_block_params
from tp_from_scratch.layers.check import all_ranks, compare, raise_mismatches
from tp_from_scratch.layers.reference import BlockConfig
from tp_from_scratch.partial_sync import block, reference
from tp_from_scratch.partial_sync.mappings import partial_reduce_bytes, synced_channels
from tp_from_scratch.partial_sync.params import init_stack_params
from tp_from_scratch.testing import random_array, rank_rng

SYNC_FRACTIONS = (1.0, 0.5, 0.25, 0.0)


def check_config(t):
    """Sizes every t in 1..4 divides: 12 query heads, t KV heads (one per rank: GQA), H = 24."""
    return BlockConfig(hidden=24, n_heads=12, n_kv_heads=t, ffn=24)


def check_stack(comm, config, p, n_blocks=2, batch=2, seq=3, seed=0, dtype=np.float64):
    """Compare the TP CAAT stack with its reference on this rank; returns the Verdicts."""
    t, rank = comm.world_size, comm.rank
    rng = rank_rng(seed)
    params = init_stack_params(rng, config, n_blocks, dtype)
    shape = (batch, seq, config.hidden)
    x = random_array(rng, shape, dtype)
    dys = random_array(rng, (t, *shape), dtype)
    ys_ref, cache = reference.streams_stack_forward(x, params, config, t, p)
    dx_ref, grads_ref = reference.streams_stack_backward(dys, cache)

    locals_ = [shard_block_params(prm, config, t, rank) for prm in params]
    before = comm.meter.snapshot()
    y, caches = block.parallel_stack_forward(comm, x, locals_, config, p)
    after = comm.meter.snapshot()
    dx, grads = block.parallel_stack_backward(comm, dys[rank], caches)

    verdicts = []
    compare(verdicts, y, ys_ref[rank], f"stream {rank} output", rank)
    compare(verdicts, dx, dx_ref, "grad of x", rank)
    for i, (g_local, g_ref) in enumerate(zip(grads, grads_ref)):
        full = gather_block_grads(all_ranks(comm, g_local), config)
        for key in g_ref:
            compare(verdicts, full[key], g_ref[key], f"grad of block {i} {key}", rank)
    raise_mismatches(verdicts)

    sent = after["bytes_sent"] - before["bytes_sent"]
    expected = 2 * n_blocks * partial_reduce_bytes(shape, p, t, np.dtype(dtype).itemsize, rank)
    if sent != expected:
        k = synced_channels(config.hidden, p)
        raise AssertionError(f"rank {rank}: the forward sent {sent} bytes; {2 * n_blocks} ring "
                             f"all-reduces of (B, T, k={k}) send {expected}")
    return verdicts


def check_everything(comm, seed=0):
    """check_stack for every p in SYNC_FRACTIONS, float64 and float32; returns tensors compared."""
    compared = 0
    for dtype in (np.float64, np.float32):
        for p in SYNC_FRACTIONS:
            compared += len(check_stack(comm, check_config(comm.world_size), p, seed=seed, dtype=dtype))
    return compared


def report(comm):
    """Check everything on this rank and print one line."""
    compared = check_everything(comm)
    print(f"rank {comm.rank} of {comm.world_size}: all {compared} CAAT tensors match the t-stream "
          f"reference ({type(comm).__name__})", flush=True)


def main():
    from tp_from_scratch.comm.launch import check_main
    check_main(report)


if __name__ == "__main__":
    main()
