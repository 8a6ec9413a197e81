"""``bench train --sequence-parallel``: Lesson 7's step time, ours against PyTorch's, and what
selective recomputation costs.

    .venv/bin/torchrun --standalone --nproc-per-node 2 -m tp_from_scratch.bench train --sequence-parallel

Three versions of the same GPT, from the same single-device weights, on the same batches:

    scratch+SP              SequenceParallelGPT (sequence_parallel/model.py)
    scratch+SP, recompute   the same, the attention core recomputed in backward (Korthikanti's
                            "selective" recomputation: RecomputedAttention)
    dtensor+SP              PyTorch's SequenceParallel plan (sequence_parallel/dtensor_plan.py)

Rounds alternate between the three, as in ``bench train``; medians, and two ratios: the cost
of recomputation (recompute / scratch+SP; the extra work is one attention forward per block
in backward) and ours against DTensor's. A benchmark, not a test: nothing asserts a time.
"""
import statistics

import torch
import torch.distributed as dist

from tp_from_scratch.bench.common import timed_steps
from tp_from_scratch.gpt.data import global_batch
from tp_from_scratch.gpt.model import init_gpt
from tp_from_scratch.gpt.parallelize import gpt_to_tp
from tp_from_scratch.sequence_parallel.dtensor_plan import parallelize_gpt_sp
from tp_from_scratch.sequence_parallel.model import SequenceParallelGPT


def versions(config, group, tp_mesh):
    """{name: model} of the three contenders, all from init_gpt(config, 0)."""
    return {"scratch+SP": SequenceParallelGPT(gpt_to_tp(group, init_gpt(config, 0))),
            "scratch+SP, recompute": SequenceParallelGPT(gpt_to_tp(group, init_gpt(config, 0)),
                                                         recompute_attention=True),
            "dtensor+SP": parallelize_gpt_sp(init_gpt(config, 0), tp_mesh)}


def race(args, config, group, tp_mesh):
    """Time the three versions in alternating rounds; rank 0 prints the table; returns the medians."""
    models = versions(config, group, tp_mesh)
    opts = {k: torch.optim.AdamW(m.parameters(), lr=1e-3, foreach=False) for k, m in models.items()}
    batches = [global_batch(s, args.batch_size, config.seq_len, config.vocab_size, 0)
               for s in range(args.steps_per_round)]
    for name in models:
        timed_steps(models[name], opts[name], batches[:args.warmup])
    times = {k: [] for k in models}
    for _ in range(args.rounds):
        for name in models:
            times[name].append(timed_steps(models[name], opts[name], batches))
    med = {k: statistics.median(v) for k, v in times.items()}
    if dist.get_rank() == 0:
        print(f"sequence parallel: GPT H={config.hidden} layers={config.n_layers} nh={config.n_heads} "
              f"nkv={config.n_kv_heads} T={config.seq_len} V={config.vocab_size} B={args.batch_size}, "
              f"tp={dist.get_world_size()}, CPU/gloo, {args.rounds} rounds x {args.steps_per_round} steps, "
              f"{args.collectives} collectives under ours")
        for k, v in med.items():
            spread = f"{min(times[k]) * 1e3:.1f}..{max(times[k]) * 1e3:.1f}"
            print(f"  {k:<24} median {v * 1e3:8.2f} ms/step  (rounds {spread} ms)")
        cost = med["scratch+SP, recompute"] / med["scratch+SP"]
        print(f"  selective recomputation: {cost:.2f}x the step time ({(cost - 1) * 100:+.0f}%)")
        print(f"  ratio scratch+SP / dtensor+SP: {med['scratch+SP'] / med['dtensor+SP']:.2f}x "
              f"(below 1.0: ours is faster)")
    return med
