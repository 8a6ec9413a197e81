"""Exercise 3: Megatron's f and g, column- and row-parallel linear layers, and the parallel MLP
(lessons/03_parallel_mlp.ipynb).

Replace each `raise NotImplementedError(...)` with your code, then run
    make grade            (or: .venv/bin/python -m pytest exercises -m ex03 -x)

Every function runs on ONE rank and takes that rank's communicator `comm`
(comm.rank, comm.world_size); t = comm.world_size is the TP degree.
The one collective you need is `all_reduce(comm, x)` (imported below): it returns the
sum of x over all ranks, on every rank. The graders count your all-reduces with the
meter: one too many or one too few fails, even when the numbers come out right. At t = 1
you may skip the all-reduce (a sum over one rank is its input; Megatron-LM skips it) or
call it: both pass, and the graders count collectives only for t > 1.

Never modify an array you are given (inputs, weights, incoming gradients): the graders
check them afterwards. f's forward and g's backward are identities and may return their
input itself; f's backward and g's forward return new arrays (at t = 1 too, where they may
skip the all-reduce: return a copy), and so does every layer.

Shapes: x (B, T, H); a linear layer computes y = x @ w + b with w of shape (in, out)
(torch's nn.Linear stores the transpose, (out, in); the parameter names are the torch GPT's).
A "cache" is whatever your forward needs to keep for its backward (a tuple is fine);
the graders only pass it from your forward to your backward.
"""
import numpy as np  # noqa: F401

from tp_from_scratch.collectives import all_reduce  # noqa: F401
from tp_from_scratch.layers.reference import gelu_backward, gelu_forward  # noqa: F401


# -- f and g: the conjugate pair ---------------------------------------------------------

def f_forward(comm, x):
    """f, forward: the identity (x is replicated: every rank already holds all of it)."""
    raise NotImplementedError("Exercise 3 (f_forward): see lessons/03_parallel_mlp.ipynb")


def f_backward(comm, grad):
    """f, backward: each rank holds only its part of dL/dx; return their sum (an all-reduce)."""
    raise NotImplementedError("Exercise 3 (f_backward): see lessons/03_parallel_mlp.ipynb")


def g_forward(comm, x):
    """g, forward: each rank holds a partial sum; return the full sum (an all-reduce)."""
    raise NotImplementedError("Exercise 3 (g_forward): see lessons/03_parallel_mlp.ipynb")


def g_backward(comm, grad):
    """g, backward: the identity (the gradient of a sum reaches every term unchanged)."""
    raise NotImplementedError("Exercise 3 (g_backward): see lessons/03_parallel_mlp.ipynb")


# -- the two parallel linear layers -------------------------------------------------------

def column_parallel_linear_forward(comm, x, w_shard, b_shard):
    """y_local = f(x) @ w_shard + b_shard: this rank's column block of y. Return (y_local, cache).

    x: (B, T, H) replicated; w_shard: (H, F/t); b_shard: (F/t,); y_local: (B, T, F/t).
    Collectives: none forward, one all-reduce backward (through f).
    """
    raise NotImplementedError("Exercise 3 (column_parallel_linear_forward): see lessons/03_parallel_mlp.ipynb")


def column_parallel_linear_backward(comm, dy_local, cache):
    """Given dL/dy_local (B, T, F/t), return (dx, dw_shard, db_shard).

    dx: (B, T, H), the FULL gradient of the replicated input, the same on every rank.
    dw_shard: (H, F/t) and db_shard: (F/t,), the gradients of this rank's shards.
    """
    raise NotImplementedError("Exercise 3 (column_parallel_linear_backward): see lessons/03_parallel_mlp.ipynb")


def row_parallel_linear_forward(comm, x_local, w_shard, b):
    """y = g(x_local @ w_shard) + b, the full output on every rank. Return (y, cache).

    x_local: (B, T, F/t) sharded on its last axis; w_shard: (F/t, H); b: (H,) replicated;
    y: (B, T, H). Collectives: one all-reduce forward (through g), none backward.
    The bias must be added exactly once.
    """
    raise NotImplementedError("Exercise 3 (row_parallel_linear_forward): see lessons/03_parallel_mlp.ipynb")


def row_parallel_linear_backward(comm, dy, cache):
    """Given dL/dy (B, T, H) (replicated), return (dx_local, dw_shard, db).

    dx_local: (B, T, F/t), dw_shard: (F/t, H), db: (H,) (the full bias gradient).
    """
    raise NotImplementedError("Exercise 3 (row_parallel_linear_backward): see lessons/03_parallel_mlp.ipynb")


# -- the MLP: column-parallel, GeLU, row-parallel -------------------------------------------

def parallel_mlp_forward(comm, x, params_local):
    """y = row(gelu(column(x))), with exactly one all-reduce. Return (y, cache).

    x: (B, T, H) replicated. params_local: {"fc.weight" (H, F/t), "fc.bias" (F/t,),
    "proj.weight" (F/t, H), "proj.bias" (H,)}.
    Use your two linear layers above and gelu_forward / gelu_backward (imported above).
    """
    raise NotImplementedError("Exercise 3 (parallel_mlp_forward): see lessons/03_parallel_mlp.ipynb")


def parallel_mlp_backward(comm, dy, cache):
    """Given dL/dy (B, T, H), return (dx, grads_local) with exactly one all-reduce.

    grads_local has the keys of params_local ("fc.weight", "fc.bias", "proj.weight",
    "proj.bias"): the gradients of this rank's shards.
    """
    raise NotImplementedError("Exercise 3 (parallel_mlp_backward): see lessons/03_parallel_mlp.ipynb")
