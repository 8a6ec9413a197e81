"""Known-wrong: LayerNorm on a sequence shard returns each rank's own dweight and dbias, the
sums over ITS positions only (Partial): the Replicated weights would drift apart. Right at t=1."""
from tp_from_scratch.layers.reference import layernorm_backward
from tp_from_scratch.sequence_parallel.layernorm import (  # noqa: F401
    sequence_parallel_layernorm_backward, sequence_parallel_layernorm_forward)
from tp_from_scratch.sequence_parallel.mappings import (  # noqa: F401
    gather_from_sequence_parallel_region_backward, gather_from_sequence_parallel_region_forward,
    reduce_scatter_to_sequence_parallel_region_backward,
    reduce_scatter_to_sequence_parallel_region_forward)


def sequence_parallel_layernorm_backward(comm, dy_shard, cache):  # noqa: F811
    return layernorm_backward(dy_shard, cache)  # wrong: no all-reduce of dweight, dbias
