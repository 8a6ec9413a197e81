"""Known-wrong: g's forward puts this rank's own shard first, then the following ranks
(a rotation), instead of rank order: every position lands in the right place on rank 0 only."""
import numpy as np

from tp_from_scratch.collectives import all_gather
from tp_from_scratch.sequence_parallel.layernorm import (  # noqa: F401
    sequence_parallel_layernorm_backward, sequence_parallel_layernorm_forward)
from tp_from_scratch.sequence_parallel.mappings import (  # noqa: F401
    gather_from_sequence_parallel_region_backward, gather_from_sequence_parallel_region_forward,
    reduce_scatter_to_sequence_parallel_region_backward,
    reduce_scatter_to_sequence_parallel_region_forward)


def gather_from_sequence_parallel_region_forward(comm, x_shard):  # noqa: F811
    full = all_gather(comm, x_shard, axis=1)
    pieces = np.array_split(full, comm.world_size, axis=1)
    r = comm.rank
    return np.concatenate(pieces[r:] + pieces[:r], axis=1)  # wrong: own shard first
