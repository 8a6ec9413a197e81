"""The sequence-parallel conjugate pair (Korthikanti et al. 2022, Figs. 5 and 6), in numpy.

Tensor parallelism (Lesson 3) leaves LayerNorm, the residual adds and the row-parallel bias
Replicated: every rank computes them on the whole (B, T, H) activation and keeps the whole
input for backward. Sequence parallelism shards those regions along the sequence instead,
(B, T, H) -> (B, T/t, H), which is legal because they act on each position on its own.

At the boundary between a sequence-parallel region, Sharded(1), and a tensor-parallel one,
where the column layer needs every position, the paper puts two operators:

    paper   Megatron-LM name                               forward          backward
    g       gather_from_sequence_parallel_region            all-gather(T)    reduce-scatter(T)
    g-bar   reduce_scatter_to_sequence_parallel_region      reduce-scatter(T) all-gather(T)

They replace Lesson 3's f and g: f's identity becomes an all-gather and g's all-reduce a
reduce-scatter. Ring reduce-scatter + ring all-gather is exactly a ring all-reduce, so the
bytes on the wire do not change; only the activations between the two shrink by t.

Names: the 2022 paper's g / g-bar are NOT Lesson 3's f / g (Megatron 2019, where g is the
forward all-reduce; the 2022 paper calls that one f-bar). To keep one vocabulary we use
Megatron-LM's code names, with ``_forward`` / ``_backward`` for the numpy halves and the
communicator first, as in ``layers.mappings``; the torch twins in ``sequence_parallel.nn``
take the same bare names with ``group`` first.

Uneven sequences: T need not be divisible by t. Shards follow numpy.array_split (the first
T % t ranks hold one more position), because that is the chunking ``collectives.reduce_scatter``
already uses, so the backward of each mapping lands on exactly the shard its forward came
from. A shard whose length does not fit that rule is refused with a ValueError naming the rank.
"""
from tp_from_scratch.collectives import all_gather, reduce_scatter
from tp_from_scratch.sharding import shard_range, shard_sizes

SEQUENCE_AXIS = 1  # activations are (B, T, H): the sequence is axis 1


def sequence_shard(comm, x):
    """This rank's positions of x (B, T, ...) -> (B, T_r, ...), a copy; array_split sizes, no communication."""
    start, stop = shard_range(x.shape[SEQUENCE_AXIS], comm.rank, comm.world_size)
    return x[:, start:stop].copy()


def _check_shard(comm, local_length, full_length):
    expected = shard_sizes(full_length, comm.world_size)[comm.rank]
    if local_length != expected:
        raise ValueError(
            f"rank {comm.rank}: sequence shard of length {local_length}, but splitting T={full_length} "
            f"over t={comm.world_size} ranks (array_split rule) gives this rank {expected} positions")


def gather_from_sequence_parallel_region_forward(comm, x_shard):
    """The paper's g, forward: all-gather along T. (B, T_r, H) Sharded(1) -> (B, T, H) Replicated."""
    x = all_gather(comm, x_shard, axis=SEQUENCE_AXIS)  # (B, T, H), a new array
    _check_shard(comm, x_shard.shape[SEQUENCE_AXIS], x.shape[SEQUENCE_AXIS])
    return x


def gather_from_sequence_parallel_region_backward(comm, grad):
    """The paper's g, backward: reduce-scatter along T. (B, T, H) Partial -> (B, T_r, H) Sharded(1).

    Every rank used all T positions in its own heads / ffn columns, so each holds a Partial
    gradient of the gathered x; this rank's positions need the sum, and only those.
    """
    return reduce_scatter(comm, grad, axis=SEQUENCE_AXIS)


def reduce_scatter_to_sequence_parallel_region_forward(comm, x_partial):
    """The paper's g-bar, forward: reduce-scatter along T. (B, T, H) Partial -> (B, T_r, H) Sharded(1)."""
    return reduce_scatter(comm, x_partial, axis=SEQUENCE_AXIS)


def reduce_scatter_to_sequence_parallel_region_backward(comm, grad_shard):
    """The paper's g-bar, backward: all-gather along T. (B, T_r, H) Sharded(1) -> (B, T, H) Replicated.

    y_r = sum over ranks of x restricted to rank r's positions, so every rank's addend gets
    the whole gradient: the shards of dL/dy, gathered.
    """
    grad = all_gather(comm, grad_shard, axis=SEQUENCE_AXIS)  # (B, T, H)
    _check_shard(comm, grad_shard.shape[SEQUENCE_AXIS], grad.shape[SEQUENCE_AXIS])
    return grad
