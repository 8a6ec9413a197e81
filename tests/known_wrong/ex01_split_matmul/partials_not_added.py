"""Known-wrong: the partial sums are never added; rank 0's partial is taken as Y."""
from tp_from_scratch.matmul import column_parallel_matmul, row_parallel_matmul  # noqa: F401
from tp_from_scratch.sharding import shard, unshard  # noqa: F401


def sum_partials(partials):
    return partials[0].copy()
