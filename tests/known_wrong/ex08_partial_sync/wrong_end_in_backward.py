"""Known-wrong: the backward syncs the LAST k channels of the gradient instead of the first k."""
import math

import torch

from tp_from_scratch.nn.mappings import all_reduce, tp_world_size
from tp_from_scratch.partial_sync.autograd import all_reduce_replicated_grads, is_replicated_parameter  # noqa: F401
from tp_from_scratch.partial_sync.mappings import synced_channels


class PartialReduceFromTensorParallelRegion(torch.autograd.Function):
    @staticmethod
    def forward(ctx, group, x, p):
        ctx.group, ctx.k = group, synced_channels(x.shape[-1], p)
        out = torch.empty_like(x)
        if ctx.k > 0:
            out[..., :ctx.k] = all_reduce(group, x[..., :ctx.k].contiguous())
        out[..., ctx.k:] = x[..., ctx.k:] * math.sqrt(tp_world_size(group))
        return out

    @staticmethod
    def backward(ctx, grad):
        H, k = grad.shape[-1], ctx.k
        out = torch.empty_like(grad)
        if k > 0:
            out[..., H - k:] = all_reduce(ctx.group, grad[..., H - k:].contiguous())
        out[..., :H - k] = grad[..., :H - k] * math.sqrt(tp_world_size(ctx.group))
        return None, out, None
