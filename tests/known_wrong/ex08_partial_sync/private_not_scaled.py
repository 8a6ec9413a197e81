"""Known-wrong: the private channels keep the bare partial sum, without the sqrt(t) factor."""
import torch

from tp_from_scratch.nn.mappings import all_reduce
from tp_from_scratch.partial_sync.autograd import all_reduce_replicated_grads, is_replicated_parameter  # noqa: F401
from tp_from_scratch.partial_sync.mappings import synced_channels


def _split(group, x, k):
    out = x.clone()
    if k > 0:
        out[..., :k] = all_reduce(group, x[..., :k].contiguous())
    return out


class PartialReduceFromTensorParallelRegion(torch.autograd.Function):
    @staticmethod
    def forward(ctx, group, x, p):
        ctx.group, ctx.k = group, synced_channels(x.shape[-1], p)
        return _split(group, x, ctx.k)

    @staticmethod
    def backward(ctx, grad):
        return None, _split(ctx.group, grad, ctx.k), None
