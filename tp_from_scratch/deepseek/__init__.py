"""Lesson 12: DeepSeek-V3, where tensor parallelism meets mixture-of-experts.

    config.py           MoEConfig: what the course reads from a DeepseekV3 config, and what it refuses
    router.py           the router (sigmoid, selection bias, group-limited top-k) and its margin
    moe.py              DeepSeekMoE on one device: shared experts + routed experts
    expert_parallel.py  the same layer on t ranks, three ways: expert parallel (all-to-all),
                        an all-reduce layout (own experts on all tokens, one all-reduce),
                        expert tensor parallel (every expert split), and their traffic
    dispatch.py         expert parallelism's dispatch and combine in numpy (Exercise 12's reference)
    autograd.py         the all-to-all with uneven counts as an autograd Function (AllToAll)
    mla.py              multi-head latent attention on one device (f at its copy_in point, its heads
                        split by the plan), and the latent cache
    single_device.py    DeepSeek-V3 on one device (DeepseekV3): the reference, no parallel layer
    model.py            parallelize: the layout's plan (arch.py) applied to it, equal to transformers'
                        DeepseekV3ForCausalLM; state dicts and save_pretrained files in and out;
                        greedy generation
    planner.py          the planner: exact parameters, memory per rank under TP and EP, and TP's
                        bytes per token against EP's: .venv/bin/python -m tp_from_scratch.deepseek.planner
    check.py            every layout and the model against one device, on any group:
                        .venv/bin/torchrun --standalone --nproc-per-node 4 -m tp_from_scratch.deepseek.check
    train.py            Lesson 6's trainer on this model (--layout tp or ep), every step against one device
    checkpoint.py       Lesson 6's checkpoints with this model's cut: saved in one layout at t ranks,
                        loaded in any other
    convert.py          save_pretrained directories in and out of those checkpoints (import / export)
    generate.py         greedy generation with the latent cache from a save_pretrained directory
                        or a checkpoint

Torch autograd, not numpy by hand: the router's top-k, the gathers and index_adds of dispatch
and combine already have gradients torch knows, so every layout is written as its forward
alone; the hand-written backwards are the collectives' (f, g, the all-to-all's).
"""
from .config import MoEConfig
from .router import route, routing_margin, check_routing_margin
from .moe import DeepSeekMoE, expert_rows, pairs
from .expert_parallel import (ExpertParallelMoE, ExpertsOnAllTokensMoE, ExpertTensorParallelMoE,
                              LAYOUTS, dispatch_counts, ep_bytes_sent, all_reduce_bytes_sent,
                              tokens_per_rank)

__all__ = ["MoEConfig", "route", "routing_margin", "check_routing_margin", "DeepSeekMoE",
           "expert_rows", "pairs", "ExpertParallelMoE", "ExpertsOnAllTokensMoE",
           "ExpertTensorParallelMoE", "LAYOUTS", "dispatch_counts", "ep_bytes_sent",
           "all_reduce_bytes_sent", "tokens_per_rank"]
