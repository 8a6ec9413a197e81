"""Known-wrong: RowParallelLinear.from_linear wraps views of the source nn.Linear's tensors.

The numbers are right, but the parameters share storage with the single-device layer: an
optimizer step on the parallel layer changes the source module too.
"""
from torch import nn

from tp_from_scratch.nn.linear import ColumnParallelLinear  # noqa: F401
from tp_from_scratch.nn.linear import RowParallelLinear as _Row
from tp_from_scratch.nn.mappings import (CopyToTensorParallelRegion,  # noqa: F401
                                         GatherFromTensorParallelRegion,
                                         ReduceFromTensorParallelRegion,
                                         ScatterToTensorParallelRegion, tp_rank, tp_world_size)


class RowParallelLinear(_Row):
    @classmethod
    def from_linear(cls, linear, *, group, input_is_parallel=True):
        layer = super().from_linear(linear, group=group, input_is_parallel=input_is_parallel)
        n = linear.in_features // tp_world_size(group)
        start = tp_rank(group) * n
        layer.weight = nn.Parameter(linear.weight.data[:, start:start + n])  # wrong: a view
        layer.bias = nn.Parameter(linear.bias.data)                          # wrong: the same tensor
        return layer
