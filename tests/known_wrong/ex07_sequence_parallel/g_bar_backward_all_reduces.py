"""Known-wrong: g-bar reduce-scatters forward but all-reduces backward: each rank puts its
gradient shard into a zero (B, T, H) array at its positions and all-reduces it. The numbers
are right (the shards do not overlap), but it sends twice the bytes of an all-gather."""
import numpy as np

from tp_from_scratch.collectives import all_reduce
from tp_from_scratch.sharding import shard_range
from tp_from_scratch.sequence_parallel.layernorm import (  # noqa: F401
    sequence_parallel_layernorm_backward, sequence_parallel_layernorm_forward)
from tp_from_scratch.sequence_parallel.mappings import (  # noqa: F401
    gather_from_sequence_parallel_region_backward, gather_from_sequence_parallel_region_forward,
    reduce_scatter_to_sequence_parallel_region_backward,
    reduce_scatter_to_sequence_parallel_region_forward)


def reduce_scatter_to_sequence_parallel_region_backward(comm, grad_shard):  # noqa: F811
    T = all_reduce(comm, np.array([grad_shard.shape[1]]))[0]  # the full length, summed
    start, stop = shard_range(int(T), comm.rank, comm.world_size)
    padded = np.zeros(grad_shard.shape[:1] + (int(T),) + grad_shard.shape[2:], grad_shard.dtype)
    padded[:, start:stop] = grad_shard
    return all_reduce(comm, padded)  # wrong: an all-reduce where an all-gather is enough
