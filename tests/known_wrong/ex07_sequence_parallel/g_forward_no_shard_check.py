"""Known-wrong: g's forward gathers correctly but never checks the shard lengths, so a shard
that breaks the array_split rule slips through and backward misplaces its gradients."""
from tp_from_scratch.collectives import all_gather
from tp_from_scratch.sequence_parallel.layernorm import (  # noqa: F401
    sequence_parallel_layernorm_backward, sequence_parallel_layernorm_forward)
from tp_from_scratch.sequence_parallel.mappings import (  # noqa: F401
    gather_from_sequence_parallel_region_backward, gather_from_sequence_parallel_region_forward,
    reduce_scatter_to_sequence_parallel_region_backward,
    reduce_scatter_to_sequence_parallel_region_forward)


def gather_from_sequence_parallel_region_forward(comm, x_shard):  # noqa: F811
    return all_gather(comm, x_shard, axis=1)  # wrong: the promised ValueError never comes
