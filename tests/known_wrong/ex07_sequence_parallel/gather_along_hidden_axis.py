"""Known-wrong: g gathers along the hidden axis (the last one, as Lesson 5's gather does)
instead of the sequence: (B, T_r, H) -> (B, T_r, t*H). Right only at t=1."""
from tp_from_scratch.collectives import all_gather, reduce_scatter
from tp_from_scratch.sequence_parallel.layernorm import (  # noqa: F401
    sequence_parallel_layernorm_backward, sequence_parallel_layernorm_forward)
from tp_from_scratch.sequence_parallel.mappings import (  # noqa: F401
    gather_from_sequence_parallel_region_backward, gather_from_sequence_parallel_region_forward,
    reduce_scatter_to_sequence_parallel_region_backward,
    reduce_scatter_to_sequence_parallel_region_forward)


def gather_from_sequence_parallel_region_forward(comm, x_shard):  # noqa: F811
    return all_gather(comm, x_shard, axis=-1)  # wrong axis


def gather_from_sequence_parallel_region_backward(comm, grad):  # noqa: F811
    return reduce_scatter(comm, grad, axis=-1)  # wrong axis
