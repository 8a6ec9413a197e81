"""Megatron's conjugate pair f and g: the only places where the parallel layers communicate.

Notation: Replicated (every rank holds the whole tensor), Sharded(dim) (rank i holds the
i-th block along dim), Partial (every rank holds a full-shape addend; the tensor is their sum).

f  enters a tensor-parallel region. Forward: the identity (x is Replicated and every rank
   uses all of it). Backward: each rank's dL/dx covers only the part of the computation it
   did, so dL/dx is Partial and must be summed: an all-reduce.
g  leaves a tensor-parallel region. Forward: each rank holds a Partial result; an all-reduce
   makes it Replicated. Backward: y = sum_i y_i gives dL/dy_i = dL/dy, so the identity.

f and g are each other's transpose: what one does forward, the other does backward.
"""
from tp_from_scratch.collectives import all_reduce


def f_forward(comm, x):
    """f forward: the identity (Replicated -> Replicated); no communication."""
    return x


def f_backward(comm, grad):
    """f backward: all-reduce (sum) of the Partial input gradients -> Replicated."""
    return all_reduce(comm, grad)


def g_forward(comm, x):
    """g forward: all-reduce (sum) of the Partial outputs -> Replicated."""
    return all_reduce(comm, x)


def g_backward(comm, grad):
    """g backward: the identity; the gradient of a sum reaches each addend unchanged."""
    return grad
