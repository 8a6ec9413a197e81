"""AsyncColumnParallelLinear against ColumnParallelLinear and nn.Linear, on one rank's group.

Used by tests/test_overlap.py (simulated ranks), the Lesson 10 notebook, and
``.venv/bin/python -m tp_from_scratch.overlap.check`` under torchrun.
"""
import torch
from torch import nn

from tp_from_scratch.compare import assert_matches_reference
from tp_from_scratch.nn.linear import ColumnParallelLinear
from tp_from_scratch.nn.mappings import tp_rank, tp_world_size
from tp_from_scratch.overlap.linear import AsyncColumnParallelLinear
from tp_from_scratch.sharding import shard_range, shard_sizes
from tp_from_scratch.testing import random_array, rank_rng


def check_async_layer(group, dtype=torch.float64, gather_output=False, seed=700):
    """AsyncColumnParallelLinear vs ColumnParallelLinear: equal bits; vs nn.Linear: the policy.

    Every rank builds the same nn.Linear (8 -> 12) and input X (3, 5, 8); rank r's upstream
    gradient dY_r is its own (rank-distinct) block of the full dY.
    """
    t, rank = tp_world_size(group), tp_rank(group)
    # not torch's RNG: simulated ranks are threads that would share (and race for) it
    linear = nn.utils.skip_init(nn.Linear, 8, 12, dtype=dtype)
    with torch.no_grad():
        linear.weight.copy_(torch.tensor(random_array(rank_rng(seed + 2), (12, 8))))
        linear.bias.copy_(torch.tensor(random_array(rank_rng(seed + 3), (12,))))
    x0 = torch.tensor(random_array(rank_rng(seed, 0), (3, 5, 8)), dtype=dtype)
    blocks = [torch.tensor(random_array(rank_rng(seed + 1, r), (3, 5, n)), dtype=dtype)
              for r, n in enumerate(shard_sizes(12, t))]  # dY's column blocks, one per rank
    full_dy = torch.cat(blocks, dim=-1)  # (3, 5, 12)
    results = []
    for cls in (ColumnParallelLinear, AsyncColumnParallelLinear):
        layer = cls.from_linear(linear, group=group, gather_output=gather_output)
        x = x0.clone().requires_grad_(True)
        y = layer(x)
        y.backward(full_dy if gather_output else blocks[rank])
        results.append({"output": y.detach(), "grad of x": x.grad, "grad of weight": layer.weight.grad,
                        "grad of bias": layer.bias.grad})
    for name, got in results[1].items():
        assert_matches_reference(got, results[0][name], name=f"async vs blocking layer: {name}", rank=rank, exact=True)
    # the single-device layer: X's gradient sums every rank's block
    x = x0.clone().requires_grad_(True)
    full = linear(x)
    full.backward(full_dy)
    start, stop = shard_range(12, rank, t)
    reference = {"output": full.detach() if gather_output else full.detach()[..., start:stop],
                 "grad of x": x.grad, "grad of weight": linear.weight.grad[start:stop],
                 "grad of bias": linear.bias.grad[start:stop]}
    for name, got in results[1].items():
        assert_matches_reference(got, reference[name], name=f"async layer vs nn.Linear: {name}", rank=rank)
    return 8
