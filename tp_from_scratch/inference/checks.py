"""Lesson 14's checks on real processes: the same code on torch.distributed's own collectives.

    .venv/bin/torchrun --standalone --nproc-per-node 2 -m tp_from_scratch.inference.checks

The tests run everything on simulated ranks (Lesson 2's ring collectives on a Comm); here the
group is gloo's ProcessGroup, so the native paths of nn.collectives carry the messages: the
all-gather of the sampling candidates, the uint8 all-to-all and the uneven all-gather of the
quantized all-reduces. Each rank checks against the single-device references and exits 1,
naming the check, if one differs.
"""
import sys

import torch
import torch.distributed as dist

from tp_from_scratch.compare import assert_matches_reference, tolerance
from tp_from_scratch.gpt.model import GPTConfig, init_gpt
from tp_from_scratch.inference.emulation import partitioned_forward
from tp_from_scratch.inference.models import inference_gpt
from tp_from_scratch.inference.quantized import quantized_all_reduce, reference_reduce
from tp_from_scratch.inference.sampling import greedy_from_shards, sample_from_shards, sample_gathered
from tp_from_scratch.nn.collectives import all_gather
from tp_from_scratch.sharding import shard_sizes
from tp_from_scratch.testing import random_array, rank_rng


def check_sampling(group, t, rank):
    logits = torch.tensor(rank_rng(150).standard_normal((5, 23)), dtype=torch.float32)
    logits[0, 0] = logits[0, -1] = logits[0].max() + 1          # a tie across the ranks
    sizes = shard_sizes(23, t)
    start = sum(sizes[:rank])
    local = logits[:, start:start + sizes[rank]]
    assert torch.equal(greedy_from_shards(group, local, start), logits.argmax(-1)), "greedy"
    for temperature, top_k in [(1.0, 0), (0.7, 3)]:
        got = sample_from_shards(group, local, start, 4, 9, temperature, top_k)
        assert torch.equal(got, sample_gathered(logits, 4, 9, temperature, top_k)), f"sample T={temperature} k={top_k}"


def check_quantized(group, t, rank):
    # (1, 1, 7) in groups of 16: one group, so every rank but rank 0 holds an empty chunk
    for shape, group_size, bits in [((2, 3, 10), 4, 4), ((1, 1, 7), 16, 6), ((3, 40), 8, 8)]:
        for scheme in ("two_step", "all_gather"):
            x = torch.tensor(random_array(rank_rng(151, rank), shape))
            every = list(all_gather(group, x[None], dim=0))
            want = reference_reduce(bits, group_size, scheme)(every)
            got = quantized_all_reduce(group, x, bits, group_size, scheme)
            assert_matches_reference(got, want, name=f"{scheme} {bits} bits {shape}", rank=rank, exact=True)


def check_model(group, t, rank):
    config = GPTConfig(arch="llama", vocab_size=29, seq_len=8, n_layers=3, hidden=48, n_heads=12, n_kv_heads=2, ffn=96)
    gpt = init_gpt(config, 152, torch.float64).eval()
    idx = torch.randint(0, 29, (2, 8), generator=torch.Generator().manual_seed(153))
    for spd, bits in [((0, 2), 16), ((1,), 4)]:
        with torch.no_grad():
            local, _ = inference_gpt(group, gpt, spd, bits, 16)(idx)
        got = all_gather(group, local.contiguous(), dim=-1, sizes=shard_sizes(29, t))
        want = partitioned_forward(gpt, idx, t, spd, reference_reduce(bits, 16))
        assert_matches_reference(got, want, name=f"SPD {spd}, {bits} bits", rank=rank, tol=tolerance("float64", layers=3))


def main():
    from tp_from_scratch.comm.process_group import init_process_group
    init_process_group("cpu", timeout=120)
    group, t, rank = dist.group.WORLD, dist.get_world_size(), dist.get_rank()
    status = 0
    try:
        for check in (check_sampling, check_quantized, check_model):
            try:
                check(group, t, rank)
                if rank == 0:
                    print(f"{check.__name__}: ok at t={t} (gloo)", flush=True)
            except AssertionError as e:
                print(f"rank {rank}: {check.__name__} FAILED: {e}", file=sys.stderr, flush=True)
                status = 1
    finally:
        dist.destroy_process_group()
    sys.exit(status)


if __name__ == "__main__":
    main()
