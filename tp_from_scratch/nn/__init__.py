"""Tensor-parallel layers for PyTorch, built on Megatron's autograd region mappings.

    mappings.py       f, g, scatter, gather as autograd Functions; the native/scratch switch
    linear.py         ColumnParallelLinear, RowParallelLinear
    embedding.py      VocabParallelEmbedding
    cross_entropy.py  vocab_parallel_cross_entropy (never gathers the logits)
    random.py         TP-aware dropout RNG
    checks.py         every layer against its single-device twin (in-process or under torchrun)

Every layer takes ``group``: None (the default process group), a torch ProcessGroup, or a
tp_from_scratch Comm (e.g. run_spmd's simulated ranks, using the from-scratch collectives).
"""
from tp_from_scratch.nn.cross_entropy import vocab_parallel_cross_entropy
from tp_from_scratch.nn.embedding import VocabParallelEmbedding
from tp_from_scratch.nn.linear import ColumnParallelLinear, RowParallelLinear, shard_range
from tp_from_scratch.nn.mappings import (
    CopyToTensorParallelRegion,
    GatherFromTensorParallelRegion,
    ReduceFromTensorParallelRegion,
    ScatterToTensorParallelRegion,
    collective_impl,
    copy_to_tp_region,
    gather_from_tp_region,
    get_collective_impl,
    reduce_from_tp_region,
    scatter_to_tp_region,
    set_collective_impl,
    tp_rank,
    tp_world_size,
)

__all__ = [
    "ColumnParallelLinear", "RowParallelLinear", "VocabParallelEmbedding",
    "vocab_parallel_cross_entropy", "shard_range",
    "CopyToTensorParallelRegion", "ReduceFromTensorParallelRegion",
    "ScatterToTensorParallelRegion", "GatherFromTensorParallelRegion",
    "copy_to_tp_region", "reduce_from_tp_region", "scatter_to_tp_region", "gather_from_tp_region",
    "set_collective_impl", "get_collective_impl", "collective_impl", "tp_rank", "tp_world_size",
]
