"""Known-wrong: with one partial, sum_partials hands back that very array (an alias, not a sum)."""
from tp_from_scratch.matmul import column_parallel_matmul, row_parallel_matmul  # noqa: F401
from tp_from_scratch.sharding import shard, unshard  # noqa: F401


def sum_partials(partials):
    if len(partials) == 1:
        return partials[0]
    total = partials[0].copy()
    for p in partials[1:]:
        total = total + p
    return total
