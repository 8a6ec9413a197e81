"""Exercise 1: split a matmul by columns and by rows (lessons/01_split_matmul.ipynb).

Replace each `raise NotImplementedError(...)` with your code, then run
    make grade            (or: .venv/bin/python -m pytest exercises -m ex01 -x)
Shapes: X (B, H), W (H, F), t devices. Use numpy only; no communication yet.
Every function returns NEW arrays (not views of its inputs, not an input returned as is
when t = 1) and never modifies its inputs: the graders check both, and try t = 1, 2, 3, 4.
"""
import numpy as np  # noqa: F401 (yours to use)


def shard(array, world_size, axis):
    """Split `array` into `world_size` equal, contiguous pieces along `axis` (rank 0 first).

    The pieces are copies (np.split gives views): each device may then write into its own.

    Raise a ValueError that names the dimension, its size and the world size when the
    size is not divisible, e.g. "dimension 1 of size 10 is not divisible by tp=4".
    """
    raise NotImplementedError("Exercise 1 (shard): see lessons/01_split_matmul.ipynb")


def unshard(shards, axis):
    """Glue the pieces back together along `axis`, in rank order: the inverse of `shard`."""
    raise NotImplementedError("Exercise 1 (unshard): see lessons/01_split_matmul.ipynb")


def column_parallel_matmul(x, w_shards):
    """Device i computes X @ W_i. x: (B, H); w_shards: t blocks (H, F/t). Return the t blocks (B, F/t)."""
    raise NotImplementedError("Exercise 1 (column_parallel_matmul): see lessons/01_split_matmul.ipynb")


def row_parallel_matmul(x_shards, w_shards):
    """Device i computes X_i @ W_i. x_shards: t blocks (B, H/t); w_shards: t blocks (H/t, F).

    Return the t partial sums, each of shape (B, F).
    """
    raise NotImplementedError("Exercise 1 (row_parallel_matmul): see lessons/01_split_matmul.ipynb")


def sum_partials(partials):
    """Add the partial sums (rank 0 first): the value an all-reduce would give every device."""
    raise NotImplementedError("Exercise 1 (sum_partials): see lessons/01_split_matmul.ipynb")
