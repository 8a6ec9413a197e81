"""Known-wrong: scatter's forward returns a view of x (x[..., chunk], no copy).

The numbers are right, but this rank's chunk shares memory with the replicated x: a caller
who writes into the chunk (an in-place activation, an optimizer on a buffer) changes x too.
"""
import torch

from tp_from_scratch.nn.linear import ColumnParallelLinear, RowParallelLinear  # noqa: F401
from tp_from_scratch.nn.mappings import (CopyToTensorParallelRegion,  # noqa: F401
                                         GatherFromTensorParallelRegion,
                                         ReduceFromTensorParallelRegion, all_gather, tp_rank,
                                         tp_world_size)


class ScatterToTensorParallelRegion(torch.autograd.Function):
    @staticmethod
    def forward(ctx, group, x):
        ctx.group = group
        n = x.shape[-1] // tp_world_size(group)
        start = tp_rank(group) * n
        return x[..., start:start + n]  # wrong: a view of x, not a new tensor

    @staticmethod
    def backward(ctx, grad):
        return None, all_gather(ctx.group, grad)
