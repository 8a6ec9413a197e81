"""Known-wrong: g forgets the all-reduce; each rank keeps only its own partial sum."""
import torch

from tp_from_scratch.nn.linear import ColumnParallelLinear, RowParallelLinear  # noqa: F401
from tp_from_scratch.nn.mappings import (CopyToTensorParallelRegion,  # noqa: F401
                                         GatherFromTensorParallelRegion,
                                         ScatterToTensorParallelRegion)


class ReduceFromTensorParallelRegion(torch.autograd.Function):
    @staticmethod
    def forward(ctx, group, x):
        return x.clone()

    @staticmethod
    def backward(ctx, grad):
        return None, grad
