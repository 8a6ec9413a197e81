"""The all-reduce whose backward doubles: torch's differentiable all-reduce where Megatron's g belongs.

    .venv/bin/torchrun --standalone --nproc-per-node 2 -m tp_from_scratch.numerics.doubling

A row-parallel linear ends in g: Y = sum_r X_r W_r^T, summed over the ranks (forward
all-reduce), and every rank then computes the same loss L(Y) from the same Y. Megatron's g has
the identity as backward: dL/d(X_r W_r^T) = dL/dY, once. torch.distributed.nn.functional.all_reduce
(deprecated in favour of torch.distributed._functional_collectives.all_reduce, whose autograd
rule is the same) has an all-reduce as backward: each rank's dL/dY is summed over the ranks,
so every rank receives t dL/dY and its weight gradient is t times the single-device one:
exactly 2 at t = 2 in float64 (dL/dY + dL/dY is exact).

Why: torch's rule is the adjoint of "y_q = sum_r x_r on every rank q" read as t *different*
outputs, each with its own loss. With identical losses on the t ranks it differentiates
L_total = sum_q L(y_q) = t L(Y): every rank's identical loss is counted once per rank.

When it is the right backward: when the ranks' outputs do go on to different losses that are
added, e.g. each rank computes the loss of its own data after the sum, and the objective is the
sum over ranks (divide by t for their mean). In tensor parallelism everything after g is
replicated, one loss counted once: Megatron's g (nn.mappings.reduce_from_tp_region).
"""
import sys
import warnings

import torch
import torch.distributed as dist

from tp_from_scratch.nn.mappings import reduce_from_tp_region, tp_rank, tp_world_size
from tp_from_scratch.sharding import shard_range


def _torch_distributed_nn(group, x):
    from torch.distributed.nn.functional import all_reduce
    with warnings.catch_warnings():  # deprecated, pointing at _functional_collectives: said in the docstring
        warnings.simplefilter("ignore", FutureWarning)
        return all_reduce(x, group=group)


def _functional_collectives(group, x):
    from torch.distributed._functional_collectives import all_reduce
    return all_reduce(x, "sum", group)


# what may stand where g belongs: a name -> fn(group, partial) -> the sum over the ranks
REDUCTIONS = {
    "Megatron g (reduce_from_tp_region)": reduce_from_tp_region,
    "torch.distributed.nn.functional.all_reduce": _torch_distributed_nn,
    "_functional_collectives.all_reduce": _functional_collectives,
}


def weight_gradient_ratios(group, batch=4, in_features=8, out_features=3, seed=0):
    """{reduction: (min, max) of dW_r / the single-device dW over this rank's block}, float64.

    A row-parallel linear Y = sum_r X_r W_r^T with each reduction of REDUCTIONS as its g, the
    same loss L = sum(Y * C) on every rank (C fixed); the single-device dW = dL/dW of X W^T.
    ``group``: a ProcessGroup (torch's differentiable all-reduces need one).
    """
    gen = torch.Generator().manual_seed(seed)
    x, w, c = (torch.randn(shape, generator=gen, dtype=torch.float64)
               for shape in [(batch, in_features), (out_features, in_features), (batch, out_features)])
    full = w.clone().requires_grad_()
    (x @ full.t() * c).sum().backward()                       # single device: dL/dW (out, in)
    start, stop = shard_range(in_features, tp_rank(group), tp_world_size(group))
    ratios = {}
    for name, reduce in REDUCTIONS.items():
        w_r = w[:, start:stop].clone().requires_grad_()       # W[out, in_t]
        y = reduce(group, x[:, start:stop] @ w_r.t())         # (batch, out): the sum over the ranks
        (y * c).sum().backward()                              # the same loss on every rank
        ratio = w_r.grad / full.grad[:, start:stop]
        ratios[name] = (ratio.min().item(), ratio.max().item())
    return ratios


def main():
    from tp_from_scratch.comm.process_group import exit_now, init_process_group
    init_process_group()
    group = dist.group.WORLD
    ratios = weight_gradient_ratios(group)
    if dist.get_rank() == 0:
        print(f"t = {dist.get_world_size()}, the same loss on every rank: dW_r / single-device dW (min, max)")
        for name, (low, high) in ratios.items():
            print(f"  {name:<44} {low:.6f} {high:.6f}")
    sys.stdout.flush()
    dist.destroy_process_group()
    exit_now(0)


if __name__ == "__main__":
    main()
