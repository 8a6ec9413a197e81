"""LayerNorm on a sequence shard, and why its weight and bias gradients need an all-reduce.

LayerNorm normalises each position over H on its own, so under sequence parallelism each
rank runs the ordinary LayerNorm on its positions, (B, T_r, H) -> (B, T_r, H), with the
whole weight and bias (Replicated, H each). Forward needs no communication at all.

Backward is where it differs from Lesson 3. The weight gradient is a sum over positions,

    dweight = sum over (b, s) of dy[b, s] * xhat[b, s]        (H,)

and each rank sees only its own positions: its dweight (and dbias = sum of dy) is one
addend of the true gradient, Partial over the TP ranks. Left as it is, the Replicated
weights would receive different updates on every rank and drift apart. One all-reduce of
the (2H,) pair [dweight, dbias] makes them whole and identical everywhere (Megatron-LM does
the same in finalize_model_grads, for every parameter marked sequence_parallel).
The input gradient dx needs no communication: it only involves this rank's positions.
"""
import numpy as np

from tp_from_scratch.collectives import all_reduce
from tp_from_scratch.layers.reference import layernorm_backward, layernorm_forward


def sequence_parallel_layernorm_forward(comm, x_shard, weight, bias, eps=1e-5):
    """LayerNorm of this rank's positions: (B, T_r, H) -> (B, T_r, H). No communication.

    weight, bias (H,) Replicated. Returns (y_shard, cache).
    """
    return layernorm_forward(x_shard, weight, bias, eps)


def sequence_parallel_layernorm_backward(comm, dy_shard, cache):
    """Backward on this rank's positions: one all-reduce, of the Partial (dweight, dbias).

    dy_shard (B, T_r, H). Returns (dx_shard (B, T_r, H), dweight (H,), dbias (H,)), the two
    parameter gradients summed over every rank's positions, identical on every rank.
    """
    dx_shard, dweight_partial, dbias_partial = layernorm_backward(dy_shard, cache)
    H = dweight_partial.shape[0]
    # one message instead of two: the pair travels as a single (2H,) array
    both = all_reduce(comm, np.concatenate([dweight_partial, dbias_partial]))
    return dx_shard, both[:H].copy(), both[H:].copy()  # two arrays of their own
