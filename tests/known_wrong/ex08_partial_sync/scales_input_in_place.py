"""Known-wrong: scales the private channels in place, as the authors' Megatron code does,
changing the caller's tensor (and the gradient it was handed in backward)."""
import math

import torch

from tp_from_scratch.nn.mappings import all_reduce, tp_world_size
from tp_from_scratch.partial_sync.autograd import all_reduce_replicated_grads, is_replicated_parameter  # noqa: F401
from tp_from_scratch.partial_sync.mappings import synced_channels


def _in_place(group, x, k):
    if k > 0:
        x[..., :k] = all_reduce(group, x[..., :k].contiguous())
    x[..., k:] *= math.sqrt(tp_world_size(group))
    return x


class PartialReduceFromTensorParallelRegion(torch.autograd.Function):
    @staticmethod
    def forward(ctx, group, x, p):
        ctx.group, ctx.k = group, synced_channels(x.shape[-1], p)
        ctx.mark_dirty(x)
        return _in_place(group, x, ctx.k)

    @staticmethod
    def backward(ctx, grad):
        return None, _in_place(ctx.group, grad, ctx.k), None
