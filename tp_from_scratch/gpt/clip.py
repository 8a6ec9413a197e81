"""Gradient-norm clipping that tensor parallelism gets right: every distinct piece counted once.

    .venv/bin/torchrun --standalone --nproc-per-node 2 -m tp_from_scratch.gpt.train --tp 2 --clip-grad-norm 0.5 --dtype float64 --compare-single

torch.nn.utils.clip_grad_norm_ on one device scales every gradient by
min(1, max_norm / (||g|| + 1e-6)), ||g|| the p-norm of all gradients as one vector. Under TP
no rank holds that vector, and the two obvious shortcuts are wrong: summing every rank's local
squares over the TP group counts a replicated parameter t times; each rank's local norm alone
misses the other ranks' shards (and the ranks then clip by different factors).

The right norm (Megatron-LM does the same: MegatronOptimizer.get_main_grads_for_grad_norm in
megatron/core/optimizer/optimizer.py keeps the gradients that are not a tensor-parallel duplicate,
and get_grad_norm_fp32 in megatron/core/optimizer/clip_grads.py sums their p-th powers over the
model-parallel group): each rank adds the p-th powers of
the pieces it **owns**, then one all-reduce per group adds the ranks' sums. A rank owns its
piece of a parameter when, in every group of the mesh,

    the parameter is split over the group (a distinct piece per rank)  -> the first of the
        ``replicas`` neighbouring ranks holding the same piece owns it (every rank when 1);
    the parameter is replicated over the group (the same values)       -> rank 0 owns it.

A placement says which groups a parameter is split over: a dict {group name: replicas}, {} for
one replicated everywhere. ``gpt_placement(config, tp)`` reads it off the sharding plan
(gpt.arch.shard_axis, replicas_of): {"tp": 1} for a sharded weight, {"tp": t/nkv} for k and v
when nkv < t, {} for the rest. Data parallelism needs nothing more: after the DP average the
gradients are the same on every DP rank, so a "dp" group in ``groups`` counts them once; a
ZeRO-sharded gradient would be placed {"tp": 1, "dp": 1}, a piece split over any other group
G {"G": 1}.
Every rank ends with the same norm, so every rank scales by the same factor.
"""
import math

import torch

from tp_from_scratch.gpt.arch import replicas_of, shard_axis
from tp_from_scratch.nn.mappings import all_reduce, tp_rank

EPS = 1e-6  # torch's clip_grad_norm_ (and Megatron's) add it to the norm before dividing


def gpt_placement(config, tp):
    """name -> placement of a parameter of the TP GPT, from the sharding plan of config.arch."""
    def placement(name):
        if shard_axis(name, config.arch) is None:
            return {}
        return {"tp": replicas_of(name, config, tp)}
    return placement


def _named(parameters):
    """[(name, parameter)] from a module or from (name, parameter) pairs; those with a gradient."""
    pairs = parameters.named_parameters() if hasattr(parameters, "named_parameters") else parameters
    return [(name, p) for name, p in pairs if p.grad is not None]


def owns(placement, ranks):
    """True when the rank at ``ranks`` ({group name: its rank there}) owns its piece of a parameter
    placed at ``placement`` ({group name: replicas} of the groups it is split over)."""
    for name, rank in ranks.items():
        replicas = placement.get(name)
        first = rank == 0 if replicas is None else rank % replicas == 0
        if not first:
            return False
    return True


def _local_power_sum(grads, norm_type):
    """sum |g|^p (or max |g| for p = inf) over ``grads``, in float64, as a 0-d tensor."""
    total = torch.zeros((), dtype=torch.float64)
    for g in grads:
        g = g.detach().to(torch.float64)
        if g.numel() == 0:
            continue
        total = torch.maximum(total, g.abs().max()) if math.isinf(norm_type) else total + g.abs().pow(norm_type).sum()
    return total


def _reduce(groups, total, norm_type):
    op = "max" if math.isinf(norm_type) else "sum"
    for group in groups:
        total = all_reduce(group, total, op=op)
    return total if math.isinf(norm_type) else total.pow(1.0 / norm_type)


def grad_norm(parameters, *, placement, groups, norm_type=2.0):
    """||g||_p of the whole model's gradient, each distinct piece counted once; the same on every rank.

    parameters: a module or (name, parameter) pairs; placement: name -> {group name: replicas};
    groups: {group name: group (ProcessGroup or Comm)}, e.g. {"tp": tp_group, "dp": dp_group}.
    One all-reduce (sum, or max for p = inf) of one float64 number per group. Returns a 0-d
    float64 tensor.
    """
    pairs = _named(parameters)
    ranks = {name: tp_rank(group) for name, group in groups.items()}
    unknown = {g for name, _ in pairs for g in placement(name)} - set(groups)
    if unknown:
        raise ValueError(f"a placement names the groups {sorted(unknown)}, but groups= has only {sorted(groups)}")
    owned = [p.grad for name, p in pairs if owns(placement(name), ranks)]
    return _reduce(groups.values(), _local_power_sum(owned, norm_type), norm_type)


def clip_grad_norm(parameters, max_norm, *, placement, groups, norm_type=2.0):
    """torch.nn.utils.clip_grad_norm_ for a sharded model: scale every gradient in place by
    min(1, max_norm / (||g||_p + 1e-6)) with the global norm of ``grad_norm``; returns that norm.

    Collective over every group in ``groups`` (see grad_norm); every rank scales by the same factor.
    """
    pairs = _named(parameters)
    total = grad_norm(pairs, placement=placement, groups=groups, norm_type=norm_type)
    coefficient = torch.clamp(max_norm / (total + EPS), max=1.0)
    for _, p in pairs:
        p.grad.detach().mul_(coefficient.to(p.grad.dtype))
    return total


