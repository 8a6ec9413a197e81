"""The partial reduce: all-reduce only the leading p*H hidden channels, keep the rest private.

CAAT-Net (arXiv 2506.19645, 2025) replaces g, the all-reduce at the two row-parallel outputs
of every block, by this operator. With k = synced_channels(H, p):

    forward   z[..., :k] = sum over ranks of x[..., :k]     Partial -> Replicated (all-reduce)
              z[..., k:] = sqrt(t) * x[..., k:]              Partial -> Private (no communication)
    backward  dx[..., :k] = sum over ranks of dz[..., :k]   all-reduce of the same slice
              dx[..., k:] = sqrt(t) * dz[..., k:]            no communication

"Private" channels hold a value that belongs to this rank's own residual stream: no sum is
implied, and the ranks' streams differ there from the first block on. The backward follows
from the chain rule: z_s[..., :k] = sum_r x_r[..., :k] feeds every stream s, so
dL/dx_r[..., :k] = sum_s dL/dz_s[..., :k] (an all-reduce); z_s[..., k:] = sqrt(t) x_s[..., k:]
feeds only stream s, so dL/dx_s[..., k:] = sqrt(t) dL/dz_s[..., k:] (local).

Why sqrt(t): a row-parallel output is a sum of t partial products. If those are roughly
independent with equal variance, the synced channels carry t times one partial's variance,
a private channel only one. Multiplying the private channels by sqrt(t) gives them the
same variance, so the LayerNorm that reads the stream sees channels on one scale. (The
authors' code first scaled the private rows of the weights at initialisation and later
replaced that by this scaling of the activations, forward and backward; we follow the later
version: it holds for the whole of training, not only at step 0.)

How p*H is rounded: k = floor(p * H), as the authors' int(h * p), except that a product
within 1e-9 of an integer counts as that integer (0.29 * 100 = 28.999999999999996 -> 29),
so the split never depends on floating-point noise. p = 1 is ordinary Megatron TP (g);
p = 0 communicates nothing.

Every function takes the communicator first and returns new arrays (inputs are untouched).
"""
import math

import numpy as np

from tp_from_scratch.collectives import all_reduce, ring_all_reduce_bytes


def synced_channels(hidden, p):
    """k, the number of leading channels of H that the partial reduce all-reduces: floor(p*H).

    Raises ValueError naming p unless 0 <= p <= 1.
    """
    if not 0.0 <= p <= 1.0:
        raise ValueError(f"sync fraction p must be in [0, 1], got {p}")
    return int(math.floor(p * hidden + 1e-9))


def _split_reduce(comm, x, p):
    """All-reduce x[..., :k], scale x[..., k:] by sqrt(t); one all-reduce of (..., k), none when k = 0."""
    x = np.asarray(x)
    k = synced_channels(x.shape[-1], p)
    out = np.empty_like(x)
    if k > 0:
        out[..., :k] = all_reduce(comm, np.ascontiguousarray(x[..., :k]))  # (..., k) Replicated
    out[..., k:] = x[..., k:] * x.dtype.type(math.sqrt(comm.world_size))  # (..., H-k) Private
    return out


def partial_reduce_forward(comm, x, p):
    """Forward of the partial reduce of x (..., H) Partial.

    forward: all-reduce of the leading k = synced_channels(H, p) channels; the other H - k
    channels keep this rank's partial sum, times sqrt(t). Returns z (..., H).
    """
    return _split_reduce(comm, x, p)


def partial_reduce_backward(comm, grad, p):
    """Backward of the partial reduce for dz (..., H), this rank's stream's gradient.

    backward: all-reduce of dz[..., :k] (the same slice as forward); dz[..., k:] stays on
    this rank, times sqrt(t). Returns dx (..., H). The same formula as the forward: the
    operator is its own transpose.
    """
    return _split_reduce(comm, grad, p)


def sum_replicated_grads(comm, grads, keys):
    """All-reduce (sum) the gradients named by ``keys``, in one flat buffer; returns a new dict.

    Parameters copied on every rank but applied to different streams (LayerNorm weights and
    biases, row-parallel biases) collect a gradient from every stream: the true gradient is
    the sum over ranks. One all-reduce of all of them together (as Megatron coalesces its
    LayerNorm gradients); the other entries are returned unchanged.
    """
    keys = [k for k in keys if k in grads]
    out = dict(grads)
    if not keys:
        return out
    flat = np.concatenate([np.ravel(grads[k]) for k in keys])
    summed = all_reduce(comm, flat)
    start = 0
    for k in keys:
        n = grads[k].size
        out[k] = summed[start:start + n].reshape(grads[k].shape)
        start += n
    return out


def partial_reduce_bytes(shape, p, t, itemsize, rank=0):
    """Bytes rank ``rank`` sends in one partial reduce of an activation of ``shape`` (..., H).

    Exactly the bytes of a ring all-reduce of the (..., k) slice: k/H of the full all-reduce
    when t divides the element counts.
    """
    k = synced_channels(shape[-1], p)
    return ring_all_reduce_bytes(int(np.prod(shape[:-1])) * k, itemsize, t, rank)
