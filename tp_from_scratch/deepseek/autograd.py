"""The all-to-all of expert parallelism as an autograd Function: token dispatch and combine.

    all_to_all(group, x, send_counts, recv_counts)   rows [c_<d, c_<=d) of x go to rank d
                                                     (Lesson 5's tier 1: nn.collectives.all_to_all_v);
                                                     backward runs it backwards (AllToAll), so each
                                                     row's gradient goes home to the rank it came from

Megatron-LM keeps its ``_AllToAll`` in tensor_parallel/mappings.py; here each lesson's autograd
Functions live with their lesson (Lesson 7's in sequence_parallel/nn.py, Lesson 8's in
partial_sync/autograd.py), on Lesson 5's tier 1 (nn/collectives.py: the group, the bridge, the
collectives). ``group`` is a ProcessGroup or a Comm; ``x`` is never modified.
"""
import torch

from tp_from_scratch.nn.collectives import all_to_all_v, check_group


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
