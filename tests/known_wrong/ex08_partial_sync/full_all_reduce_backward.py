"""Known-wrong: the forward syncs only the slice, but the backward all-reduces every channel."""
import math

import torch

from tp_from_scratch.nn.mappings import all_reduce, tp_world_size
from tp_from_scratch.partial_sync.autograd import all_reduce_replicated_grads, is_replicated_parameter  # noqa: F401
from tp_from_scratch.partial_sync.mappings import synced_channels


class PartialReduceFromTensorParallelRegion(torch.autograd.Function):
    @staticmethod
    def forward(ctx, group, x, p):
        ctx.group = group
        k = synced_channels(x.shape[-1], p)
        out = torch.empty_like(x)
        if k > 0:
            out[..., :k] = all_reduce(group, x[..., :k].contiguous())
        out[..., k:] = x[..., k:] * math.sqrt(tp_world_size(group))
        return out

    @staticmethod
    def backward(ctx, grad):
        return None, all_reduce(ctx.group, grad), None
