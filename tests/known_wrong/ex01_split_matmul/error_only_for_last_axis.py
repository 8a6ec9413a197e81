"""Known-wrong: shard checks divisibility only along the last axis; elsewhere numpy's own message (no sizes) escapes."""
import numpy as np

from tp_from_scratch.matmul import column_parallel_matmul, row_parallel_matmul, sum_partials  # noqa: F401
from tp_from_scratch.sharding import unshard  # noqa: F401


def shard(array, world_size, axis):
    if array.shape[-1] % world_size:
        raise ValueError(f"dimension {array.ndim - 1} of size {array.shape[-1]} is not divisible by tp={world_size}")
    return [s.copy() for s in np.split(array, world_size, axis=axis)]
