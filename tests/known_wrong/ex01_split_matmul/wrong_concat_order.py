"""Known-wrong: unshard glues the shards back in reverse rank order."""
import numpy as np

from tp_from_scratch.matmul import column_parallel_matmul, row_parallel_matmul, sum_partials  # noqa: F401
from tp_from_scratch.sharding import shard  # noqa: F401


def unshard(shards, axis):
    return np.concatenate(shards[::-1], axis=axis)
