"""Lesson 12: DeepSeek-V3, where tensor parallelism meets mixture-of-experts.

    config.py           MoEConfig: what the course reads from a DeepseekV3 config, and what it refuses
    router.py           the router (sigmoid, selection bias, group-limited top-k) and its margin
    moe.py              DeepSeekMoE on one device: shared experts + routed experts
    expert_parallel.py  the same layer on t ranks, three ways: expert parallel (all-to-all),
                        the inference layout (own experts on all tokens, one all-reduce),
                        expert tensor parallel (every expert split), and their traffic
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
