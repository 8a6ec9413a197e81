"""Known-wrong: shard accepts sizes the world size does not divide (np.array_split)."""
import numpy as np

from tp_from_scratch.matmul import column_parallel_matmul, row_parallel_matmul, sum_partials  # noqa: F401
from tp_from_scratch.sharding import unshard  # noqa: F401


def shard(array, world_size, axis):
    return np.array_split(array, world_size, axis=axis)
