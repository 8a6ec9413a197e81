"""The all-to-all of expert parallelism in torch: token dispatch and combine with uneven counts.

    exchange_counts(group, send_counts)      every receiver learns what each rank sends it (an
                                             all-to-all of t equal blocks)
    all_to_all_v(group, x, send_counts, recv_counts)   rows [c_<d, c_<=d) of x go to rank d
    all_to_all(group, x, send_counts, recv_counts)     the same as an autograd Function (AllToAll):
                                             backward runs it backwards, so each row's gradient
                                             goes home to the rank it came from

Megatron-LM keeps its ``_AllToAll`` in tensor_parallel/mappings.py; here each lesson's autograd
Functions live with their lesson (Lesson 7's in sequence_parallel/nn.py, Lesson 8's in
partial_sync/autograd.py), on Lesson 5's tier 1 (nn/collectives.py: the group, the bridge).
``group`` is a ProcessGroup (torch's all_to_all_single) or a Comm (collectives.all_to_all_v,
the from-scratch pairwise exchange); ``x`` is never modified.
"""
import numpy as np
import torch
import torch.distributed as dist

from tp_from_scratch import collectives
from tp_from_scratch.comm import Comm
from tp_from_scratch.nn.collectives import check_group, numpy_to_tensor, tensor_to_numpy


def exchange_counts(group, send_counts):
    """send_counts (t,) or (t, m) ints, row d for rank d -> an int64 tensor of the same shape
    whose row q is what rank q sends this rank: what every receiver must know before a
    dispatch with uneven counts (an all-to-all of t equal blocks)."""
    if isinstance(check_group(group), Comm):
        return torch.from_numpy(collectives.exchange_counts(group, np.asarray(send_counts)))
    sent = torch.as_tensor(np.asarray(send_counts), dtype=torch.int64).contiguous()
    received = torch.empty_like(sent)
    dist.all_to_all_single(received, sent, group=group)
    return received


def all_to_all_v(group, x, send_counts, recv_counts):
    """(sum send_counts, ...) -> (sum recv_counts, ...): rows [c_<d, c_<=d) of ``x`` go to rank
    d; what arrives is concatenated in source-rank order. A Comm runs the from-scratch
    pairwise exchange (collectives.all_to_all_v); a ProcessGroup runs torch's native
    all_to_all_single with the same split sizes. ``x`` is never modified."""
    if isinstance(check_group(group), Comm):
        return numpy_to_tensor(collectives.all_to_all_v(group, tensor_to_numpy(x), np.asarray(send_counts),
                                                          np.asarray(recv_counts)), x)
    out = x.new_empty((sum(recv_counts), *x.shape[1:]))
    dist.all_to_all_single(out, x.detach().contiguous(), [int(c) for c in recv_counts],
                           [int(c) for c in send_counts], group=group)
    return out


class AllToAll(torch.autograd.Function):
    """forward: all-to-all with counts (send_counts -> recv_counts);
    backward: the same all-to-all run backwards (recv_counts -> send_counts): each row's
    gradient goes home to the rank it came from, so dispatch and combine are each other's adjoint."""

    @staticmethod
    def forward(ctx, group, x, send_counts, recv_counts):
        ctx.group, ctx.counts = group, (send_counts, recv_counts)
        return all_to_all_v(group, x, send_counts, recv_counts)

    @staticmethod
    def backward(ctx, grad):
        send_counts, recv_counts = ctx.counts
        return None, all_to_all_v(ctx.group, grad, recv_counts, send_counts), None, None


def all_to_all(group, x, send_counts, recv_counts):
    """Differentiable all-to-all with uneven counts: see ``all_to_all_v`` and ``AllToAll``."""
    return AllToAll.apply(check_group(group), x, list(send_counts), list(recv_counts))
