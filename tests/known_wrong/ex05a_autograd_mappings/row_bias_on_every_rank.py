"""Known-wrong: RowParallelLinear adds the bias before the all-reduce, so it is counted t times."""
from torch.nn import functional as F

from tp_from_scratch.nn.linear import ColumnParallelLinear  # noqa: F401
from tp_from_scratch.nn.linear import RowParallelLinear as _Row
from tp_from_scratch.nn.mappings import (CopyToTensorParallelRegion,  # noqa: F401
                                         GatherFromTensorParallelRegion,
                                         ReduceFromTensorParallelRegion,
                                         ScatterToTensorParallelRegion, reduce_from_tp_region,
                                         scatter_to_tp_region)


class RowParallelLinear(_Row):
    def forward(self, x):
        if not self.input_is_parallel:
            x = scatter_to_tp_region(self.group, x)
        return reduce_from_tp_region(self.group, F.linear(x, self.weight, self.bias))
