"""Known-wrong: shard finds the block size with a shift, which is only a division for t = 1, 2, 4."""
from tp_from_scratch.matmul import column_parallel_matmul, row_parallel_matmul, sum_partials  # noqa: F401
from tp_from_scratch.sharding import unshard  # noqa: F401


def shard(array, world_size, axis):
    n = array.shape[axis]
    if n % world_size:
        raise ValueError(f"dimension {axis} of size {n} is not divisible by tp={world_size}")
    block = n >> (world_size.bit_length() - 1)  # n / t for powers of two only
    return [array.take(range(r * block, (r + 1) * block), axis=axis) for r in range(world_size)]
