"""Known-wrong: shard ignores `axis` and always splits the rows."""
import numpy as np

from tp_from_scratch.matmul import column_parallel_matmul, row_parallel_matmul, sum_partials  # noqa: F401
from tp_from_scratch.sharding import unshard  # noqa: F401


def shard(array, world_size, axis):
    return np.split(array, world_size, axis=0)
