"""Known-wrong: LayerNorm on a sequence shard calls layernorm_forward without the eps it was
given, so every caller gets the default 1e-5, whatever its model says (GPT-2's 1e-5 hides it)."""
from tp_from_scratch.layers.reference import layernorm_forward
from tp_from_scratch.sequence_parallel.layernorm import sequence_parallel_layernorm_backward  # noqa: F401
from tp_from_scratch.sequence_parallel.mappings import (  # noqa: F401
    gather_from_sequence_parallel_region_backward, gather_from_sequence_parallel_region_forward,
    reduce_scatter_to_sequence_parallel_region_backward,
    reduce_scatter_to_sequence_parallel_region_forward)


def sequence_parallel_layernorm_forward(comm, x_shard, weight, bias, eps=1e-5):
    return layernorm_forward(x_shard, weight, bias)  # wrong: eps dropped
