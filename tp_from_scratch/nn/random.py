"""Tensor-parallel-aware dropout: which random numbers each rank must draw.

Two kinds of activation need two kinds of random stream:

* Replicated activations (after g: the residual stream, the embedding output) are the same
  tensor on every TP rank. Their dropout masks must be identical too, or the replicas drift
  apart and the ranks silently stop computing the same model.
* Sharded activations (between f and g: attention probabilities of this rank's heads, the
  MLP's hidden block) are different data on each rank. Their masks must be independent,
  or every shard would drop the same positions, which a single device would not do.

Megatron-LM keeps a second CUDA RNG state and swaps it in with a context manager. Here the
two streams are explicit torch.Generators, owned by a TensorParallelRNG object passed to
whoever needs it (no global RNG state is touched):

    rng = TensorParallelRNG(seed, group=group)
    h = rng.dropout(h, p, sharded=True)    # (B, T, F/t) inside the TP region
    x = rng.dropout(x, p, sharded=False)   # (B, T, H) replicated
"""
import numpy as np
import torch

from tp_from_scratch.nn.mappings import tp_rank


def _stream_seed(*key):
    """A 63-bit torch seed derived from the key: distinct keys give unrelated streams."""
    return int(np.random.SeedSequence(list(key)).generate_state(1, dtype=np.uint64)[0] >> 1)


class TensorParallelRNG:
    """The two random streams of one TP rank.

    replicated: seeded by (seed) only: the same numbers on every rank of the TP group.
    sharded:    seeded by (seed, TP rank): different numbers on every rank.
    """

    def __init__(self, seed, *, group, device="cpu"):
        self.seed, self.rank = seed, tp_rank(group)
        self.replicated = torch.Generator(device).manual_seed(_stream_seed(seed, 0))
        self.sharded = torch.Generator(device).manual_seed(_stream_seed(seed, 1, self.rank))

    def generator(self, sharded):
        """The stream for a sharded (True) or replicated (False) activation."""
        return self.sharded if sharded else self.replicated

    def dropout(self, x, p, *, sharded, training=True):
        """dropout(x, p) with the mask drawn from the stream that matches x's layout."""
        return dropout(x, p, self.generator(sharded), training)


def dropout(x, p, generator, training=True):
    """Zero each element with probability p and scale the rest by 1/(1-p), using ``generator``.

    No communication. Identity when not training or p == 0. The mask is drawn with
    torch.rand on x's shape, so the same generator state gives the same mask on any rank.
    """
    if not 0.0 <= p < 1.0:
        raise ValueError(f"dropout probability {p} is not in [0, 1)")
    if not training or p == 0.0:
        return x
    keep = torch.rand(x.shape, generator=generator, device=x.device) >= p
    return x * keep.to(x.dtype) / (1.0 - p)
