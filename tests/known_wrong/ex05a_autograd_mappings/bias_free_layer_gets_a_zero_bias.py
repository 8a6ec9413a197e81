"""Known-wrong: from_linear always makes a bias, zero when the nn.Linear has none. The first
forward is right, but the zero bias is a parameter: it gets a gradient, an optimizer moves it,
and the layer is no longer the bias-free one (the course's Llama has no biases).
"""
import torch

from tp_from_scratch.nn.linear import ColumnParallelLinear as _Column
from tp_from_scratch.nn.linear import RowParallelLinear as _Row
from tp_from_scratch.nn.mappings import (CopyToTensorParallelRegion,  # noqa: F401
                                         GatherFromTensorParallelRegion,
                                         ReduceFromTensorParallelRegion,
                                         ScatterToTensorParallelRegion)


def _with_bias(linear):
    if linear.bias is not None:
        return linear
    full = torch.nn.Linear(linear.in_features, linear.out_features, dtype=linear.weight.dtype)
    with torch.no_grad():
        full.weight.copy_(linear.weight)
        full.bias.zero_()
    return full


class ColumnParallelLinear(_Column):
    @classmethod
    def from_linear(cls, linear, *, group, gather_output=False):
        return super().from_linear(_with_bias(linear), group=group, gather_output=gather_output)


class RowParallelLinear(_Row):
    @classmethod
    def from_linear(cls, linear, *, group, input_is_parallel=True):
        return super().from_linear(_with_bias(linear), group=group, input_is_parallel=input_is_parallel)
