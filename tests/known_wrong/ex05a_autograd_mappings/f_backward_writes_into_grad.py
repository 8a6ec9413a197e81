"""Known-wrong: f's backward stores the all-reduced gradient in the incoming gradient tensor and returns it."""
import torch

from tp_from_scratch.nn.linear import ColumnParallelLinear, RowParallelLinear  # noqa: F401
from tp_from_scratch.nn.mappings import (GatherFromTensorParallelRegion,  # noqa: F401
                                         ReduceFromTensorParallelRegion,
                                         ScatterToTensorParallelRegion, all_reduce)


class CopyToTensorParallelRegion(torch.autograd.Function):
    @staticmethod
    def forward(ctx, group, x):
        ctx.group = group
        return x.view_as(x)

    @staticmethod
    def backward(ctx, grad):
        grad.copy_(all_reduce(ctx.group, grad))  # wrong: the caller's gradient tensor now holds the sum
        return None, grad
