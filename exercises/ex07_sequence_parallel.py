"""Exercise 7: the sequence-parallel mappings g and g-bar, and LayerNorm on a sequence shard
(lessons/07_sequence_parallelism.ipynb).

Replace each `raise NotImplementedError(...)` with your code, then run
    make grade            (or: .venv/bin/python -m pytest exercises -m ex07 -x)

Every function runs on ONE rank and takes that rank's communicator `comm` first
(comm.rank, comm.world_size; t = comm.world_size). Activations are (B, T, H) and the
sequence is axis 1. A sequence shard is this rank's contiguous block of positions,
(B, T_r, H), split by the numpy.array_split rule: with T = 7 and t = 3 the shards hold
3, 2 and 2 positions, in rank order. The collectives you need (imported below) return new
arrays and never modify their input:

    all_gather(comm, x, axis)       every rank's x concatenated along axis, in rank order
    reduce_scatter(comm, x, axis)   the sum of x over the ranks, then this rank's
                                    np.array_split chunk along axis
    all_reduce(comm, x)             the sum of x over the ranks, on every rank

The graders count your collectives with the meter: g and g-bar each make exactly one
collective in each direction, and a right answer reached with a costlier collective fails.
At t = 1 you may skip them (Megatron-LM does): the graders count collectives only for t > 1,
but every result is still a new array (a copy), never the input itself. LayerNorm is also
graded at activations around 1e4 in float32, where only a variance computed as the mean of
(x - mean)^2 keeps its digits.

Naming (Korthikanti et al. 2022, Figs. 5-6): the paper's g is all-gather forward and
reduce-scatter backward; its g-bar is reduce-scatter forward and all-gather backward.
We use Megatron-LM's code names for them, since Lesson 3's f and g already mean something else.
"""
import numpy as np  # noqa: F401

from tp_from_scratch.collectives import all_gather, all_reduce, reduce_scatter  # noqa: F401
from tp_from_scratch.layers.reference import layernorm_backward, layernorm_forward  # noqa: F401
from tp_from_scratch.sharding import shard_sizes  # noqa: F401


# -- g: from a sequence shard into the tensor-parallel region ------------------------------

def gather_from_sequence_parallel_region_forward(comm, x_shard):
    """The paper's g, forward: (B, T_r, H) Sharded(1) -> (B, T, H), every position, rank order.

    Raise a ValueError naming the rank if this rank's shard length is not the one the
    array_split rule gives it for the gathered T (its backward would misplace gradients).
    """
    raise NotImplementedError("Exercise 7 (gather_from_sequence_parallel_region_forward): "
                              "see lessons/07_sequence_parallelism.ipynb")


def gather_from_sequence_parallel_region_backward(comm, grad):
    """The paper's g, backward: grad (B, T, H) is Partial (each rank's own contribution);
    return this rank's positions of the sum, (B, T_r, H)."""
    raise NotImplementedError("Exercise 7 (gather_from_sequence_parallel_region_backward): "
                              "see lessons/07_sequence_parallelism.ipynb")


# -- g-bar: out of the tensor-parallel region, onto a sequence shard -----------------------

def reduce_scatter_to_sequence_parallel_region_forward(comm, x_partial):
    """The paper's g-bar, forward: x_partial (B, T, H) Partial -> this rank's positions of
    the sum, (B, T_r, H)."""
    raise NotImplementedError("Exercise 7 (reduce_scatter_to_sequence_parallel_region_forward): "
                              "see lessons/07_sequence_parallelism.ipynb")


def reduce_scatter_to_sequence_parallel_region_backward(comm, grad_shard):
    """The paper's g-bar, backward: grad_shard (B, T_r, H) -> the whole gradient (B, T, H).

    Raise a ValueError naming the rank if the shard length breaks the array_split rule.
    """
    raise NotImplementedError("Exercise 7 (reduce_scatter_to_sequence_parallel_region_backward): "
                              "see lessons/07_sequence_parallelism.ipynb")


# -- LayerNorm on a sequence shard ---------------------------------------------------------

def sequence_parallel_layernorm_forward(comm, x_shard, weight, bias, eps=1e-5):
    """LayerNorm over H of this rank's positions, (B, T_r, H) -> (B, T_r, H); no communication.

    weight, bias (H,) are Replicated. Return (y_shard, cache); layernorm_forward (imported
    above) does the arithmetic.
    """
    raise NotImplementedError("Exercise 7 (sequence_parallel_layernorm_forward): "
                              "see lessons/07_sequence_parallelism.ipynb")


def sequence_parallel_layernorm_backward(comm, dy_shard, cache):
    """Given dL/dy on this rank's positions, return (dx_shard (B, T_r, H), dweight (H,), dbias (H,)).

    dweight and dbias must be the FULL gradients (a sum over every position of every rank),
    the same on every rank. Collectives: exactly one all-reduce, for the pair together
    (concatenate them into one (2H,) array), and nothing else.
    """
    raise NotImplementedError("Exercise 7 (sequence_parallel_layernorm_backward): "
                              "see lessons/07_sequence_parallelism.ipynb")
