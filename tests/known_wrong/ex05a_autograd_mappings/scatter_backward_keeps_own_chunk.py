"""Known-wrong: scatter's backward pads its own gradient chunk with zeros instead of all-gathering."""
import torch

from tp_from_scratch.nn.linear import ColumnParallelLinear, RowParallelLinear  # noqa: F401
from tp_from_scratch.nn.mappings import (CopyToTensorParallelRegion,  # noqa: F401
                                         GatherFromTensorParallelRegion,
                                         ReduceFromTensorParallelRegion, split, tp_rank,
                                         tp_world_size)


class ScatterToTensorParallelRegion(torch.autograd.Function):
    @staticmethod
    def forward(ctx, group, x):
        ctx.group = group
        return split(group, x)

    @staticmethod
    def backward(ctx, grad):
        t, rank = tp_world_size(ctx.group), tp_rank(ctx.group)
        full = torch.zeros(*grad.shape[:-1], grad.shape[-1] * t, dtype=grad.dtype)
        n = grad.shape[-1]
        full[..., rank * n:(rank + 1) * n] = grad
        return None, full
