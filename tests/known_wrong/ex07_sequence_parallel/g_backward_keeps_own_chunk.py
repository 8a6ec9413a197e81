"""Known-wrong: g's backward treats the gradient as Replicated, like Lesson 5's gather, and
keeps this rank's positions without summing the other ranks' contributions."""
import numpy as np
from tp_from_scratch.sequence_parallel.layernorm import (  # noqa: F401
    sequence_parallel_layernorm_backward, sequence_parallel_layernorm_forward)
from tp_from_scratch.sequence_parallel.mappings import (  # noqa: F401
    gather_from_sequence_parallel_region_backward, gather_from_sequence_parallel_region_forward,
    reduce_scatter_to_sequence_parallel_region_backward,
    reduce_scatter_to_sequence_parallel_region_forward)


def gather_from_sequence_parallel_region_backward(comm, grad):  # noqa: F811
    return np.array_split(grad, comm.world_size, axis=1)[comm.rank].copy()  # wrong: no sum
