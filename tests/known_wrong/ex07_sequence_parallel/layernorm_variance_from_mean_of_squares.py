"""Known-wrong: LayerNorm's variance as E[x^2] - E[x]^2. Mathematically the same, but at
activations around 1e4 in float32 the two terms agree in every digit float32 keeps, so
their difference is rounding noise (or negative: NaN). The graders try such inputs."""
import numpy as np

from tp_from_scratch.sequence_parallel.layernorm import sequence_parallel_layernorm_backward  # noqa: F401
from tp_from_scratch.sequence_parallel.mappings import *  # noqa: F401,F403


def sequence_parallel_layernorm_forward(comm, x_shard, weight, bias, eps=1e-5):
    mean = x_shard.mean(axis=-1, keepdims=True)
    var = (x_shard * x_shard).mean(axis=-1, keepdims=True) - mean * mean
    rstd = 1.0 / np.sqrt(var + eps)
    xhat = (x_shard - mean) * rstd
    return xhat * weight + bias, (xhat, rstd, weight)
