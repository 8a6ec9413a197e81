"""Known-right: at t = 1 every collective is skipped (one rank: a gather or a sum over the
group is its input), as Megatron-LM does; the results are still new arrays. The graders
count collectives only for t > 1, so this must pass."""
import numpy as np

from tp_from_scratch.layers import reference
from tp_from_scratch.sequence_parallel import layernorm, mappings


def gather_from_sequence_parallel_region_forward(comm, x_shard):
    return x_shard.copy() if comm.world_size == 1 else mappings.gather_from_sequence_parallel_region_forward(comm, x_shard)


def gather_from_sequence_parallel_region_backward(comm, grad):
    return grad.copy() if comm.world_size == 1 else mappings.gather_from_sequence_parallel_region_backward(comm, grad)


def reduce_scatter_to_sequence_parallel_region_forward(comm, x_partial):
    if comm.world_size == 1:
        return x_partial.copy()
    return mappings.reduce_scatter_to_sequence_parallel_region_forward(comm, x_partial)


def reduce_scatter_to_sequence_parallel_region_backward(comm, grad_shard):
    if comm.world_size == 1:
        return np.array(grad_shard, copy=True)
    return mappings.reduce_scatter_to_sequence_parallel_region_backward(comm, grad_shard)


def sequence_parallel_layernorm_forward(comm, x_shard, weight, bias, eps=1e-5):
    return layernorm.sequence_parallel_layernorm_forward(comm, x_shard, weight, bias, eps)


def sequence_parallel_layernorm_backward(comm, dy_shard, cache):
    if comm.world_size == 1:  # the only rank's partial dweight, dbias are the whole ones
        return reference.layernorm_backward(dy_shard, cache)
    return layernorm.sequence_parallel_layernorm_backward(comm, dy_shard, cache)
