"""The partial reduce as a torch autograd Function, and the gradient rule for shared parameters.

    PartialReduceFromTensorParallelRegion   forward: all-reduce x[..., :k], sqrt(t) * x[..., k:]
                                            backward: the same on the gradient (its own transpose)
    all_reduce_replicated_grads             after backward: sum the gradients of the parameters
                                            that every rank applies to its own stream

The numpy twins are mappings.partial_reduce_forward / _backward and sum_replicated_grads;
k = synced_channels(H, p) rounds the same way. ``group`` is a ProcessGroup (native
collectives) or a tp_from_scratch.comm.Comm (the from-scratch ring), as everywhere in torch.

The authors' Megatron code scales the private channels in place (input[..., k:] *= sqrt(t)).
Here forward and backward build new tensors: autograd may still need the input, and a
caller's tensor is never changed behind its back.
"""
import math

import torch

from tp_from_scratch.gpt.arch import shard_axis
from tp_from_scratch.nn.mappings import all_reduce, tp_world_size
from tp_from_scratch.partial_sync.mappings import synced_channels

# Every parameter the sharding plan keeps whole (LayerNorms, row-parallel biases) is applied by
# each rank to its OWN stream, except those used before the stack's entry, where all streams
# are still one: the position embedding needs no sum.
_BEFORE_THE_STREAMS = ("wpe.",)


def _split_reduce(group, x, k):
    """A new tensor: all-reduce of x[..., :k] (none when k = 0), sqrt(t) * x[..., k:]."""
    out = torch.empty_like(x)
    if k > 0:
        out[..., :k] = all_reduce(group, x[..., :k].contiguous())
    out[..., k:] = x[..., k:] * math.sqrt(tp_world_size(group))
    return out


class PartialReduceFromTensorParallelRegion(torch.autograd.Function):
    """CAAT's replacement for g. forward: all-reduce of the leading k = floor(p*H) channels,
    the private rest times sqrt(t); backward: all-reduce of the same slice of the gradient,
    the rest times sqrt(t)."""

    @staticmethod
    def forward(ctx, group, x, p):
        ctx.group, ctx.k = group, synced_channels(x.shape[-1], p)
        return _split_reduce(group, x, ctx.k)

    @staticmethod
    def backward(ctx, grad):
        # synced: z_s[:k] = sum_r x_r[:k] feeds every stream, so dx_r[:k] = sum_s dz_s[:k];
        # private: z_s[k:] = sqrt(t) x_s[k:] feeds stream s only, so dx_s[k:] = sqrt(t) dz_s[k:]
        return None, _split_reduce(ctx.group, grad, ctx.k), None


def partial_reduce_from_tp_region(group, x, p):
    """x (..., H) Partial -> (..., H): channels [:k] Replicated, [k:] Private (see the Function)."""
    return PartialReduceFromTensorParallelRegion.apply(group, x, p)


def is_replicated_parameter(name):
    """True for a parameter applied to every rank's own stream: its gradient must be summed.

    LayerNorm weights and biases (ln1, ln2, ln_f) and the row-parallel biases (attn.o.bias,
    mlp.proj.bias), by their names in tp_from_scratch.gpt.model (e.g. "blocks.0.ln1.weight"):
    what the sharding plan (gpt.arch.PLANS) replicates, the position embedding excepted.
    """
    return shard_axis(name) is None and not name.startswith(_BEFORE_THE_STREAMS)


def all_reduce_replicated_grads(group, model):
    """Sum over the ranks of ``group`` the .grad of every replicated parameter of ``model``.

    One all-reduce of all of them in one flat buffer (as Megatron coalesces its LayerNorm
    gradients); the sum replaces each .grad. Parameters without a gradient are skipped.
    Call it after backward, before the optimizer step.
    """
    params = [p for name, p in model.named_parameters()
              if is_replicated_parameter(name) and p.grad is not None]
    if not params:
        return
    flat = torch.cat([p.grad.reshape(-1) for p in params])
    summed = all_reduce(group, flat)
    start = 0
    for p in params:
        n = p.grad.numel()
        p.grad = summed[start:start + n].view_as(p.grad).clone()
        start += n
