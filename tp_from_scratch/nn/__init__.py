"""Tensor-parallel layers for PyTorch, built on Megatron's autograd region mappings.

    collectives.py    all_reduce, all_gather, reduce_scatter, split on either kind of group, and
                      the one torch <-> numpy bridge (Megatron's tier 1)
    mappings.py       f, g, scatter, gather as autograd Functions and their wrappers (tiers 2, 3)
    linear.py         ColumnParallelLinear, RowParallelLinear
    embedding.py      VocabParallelEmbedding
    cross_entropy.py  vocab_parallel_cross_entropy (never gathers the logits)
    random.py         TP-aware dropout RNG
    check.py          every layer against its single-device twin (in-process or under torchrun)

Every layer and mapping takes ``group`` first, and it is required: a torch ProcessGroup
(native collectives) or a tp_from_scratch Comm (the from-scratch ring collectives: run_spmd's
simulated ranks, or TorchComm(process_group) over real processes). The object decides.
"""
from tp_from_scratch.nn.cross_entropy import vocab_parallel_cross_entropy
from tp_from_scratch.nn.embedding import VocabParallelEmbedding
from tp_from_scratch.nn.linear import ColumnParallelLinear, RowParallelLinear
from tp_from_scratch.nn.mappings import (
    CopyToTensorParallelRegion,
    GatherFromTensorParallelRegion,
    ReduceFromTensorParallelRegion,
    ScatterToTensorParallelRegion,
    copy_to_tp_region,
    f,
    g,
    gather_from_tp_region,
    reduce_from_tp_region,
    scatter_to_tp_region,
    tp_rank,
    tp_world_size,
)

__all__ = [
    "ColumnParallelLinear", "RowParallelLinear", "VocabParallelEmbedding",
    "vocab_parallel_cross_entropy",
    "CopyToTensorParallelRegion", "ReduceFromTensorParallelRegion",
    "ScatterToTensorParallelRegion", "GatherFromTensorParallelRegion",
    "copy_to_tp_region", "reduce_from_tp_region", "scatter_to_tp_region", "gather_from_tp_region",
    "f", "g", "tp_rank", "tp_world_size",
]
