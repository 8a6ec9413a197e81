"""The dp x pp x tp process mesh: where each rank sits, and the three groups it talks to.

    rank = (pp_index * dp + dp_index) * tp + tp_index

TP is the innermost (fastest-varying) coordinate, then DP, then PP: Megatron-LM's default
order ("tp-dp-pp", parallel_state.initialize_model_parallel), read from the inside out.
With torchrun numbering ranks node by node, that puts

* a TP group on consecutive ranks: one node, where NVLink is. TP talks in every layer, in
  the forward and in the backward, with activation-sized messages: it needs the bandwidth;
* a DP group on ranks tp apart, inside one pipeline stage: one gradient all-reduce (or
  reduce-scatter + all-gather for ZeRO) per step, which overlaps with backward;
* a PP group on ranks dp * tp apart: the farthest apart, across nodes. Pipeline stages send
  one activation per micro-batch to their neighbour, point to point, the smallest traffic.

World 8, dp 2, pp 2, tp 2:

    pp stage 0:  dp 0: ranks 0 1    dp 1: ranks 2 3      TP groups {0,1} {2,3} {4,5} {6,7}
    pp stage 1:  dp 0: ranks 4 5    dp 1: ranks 6 7      DP groups {0,2} {1,3} {4,6} {5,7}
                                                         PP groups {0,4} {1,5} {2,6} {3,7}

With pp = 1 this is Lesson 6's dp x tp mesh (tp_from_scratch.gpt.mesh): rank = dp_index * tp
+ tp_index, the same groups. Every group is created with a timeout, in the same order on
every rank (new_group is collective).
"""
import itertools
import os
from dataclasses import dataclass

import torch
import torch.distributed as dist

from tp_from_scratch.comm.process_group import init_process_group, new_group
from tp_from_scratch.gpt.mesh import Mesh


def rank_of(dp_index, pp_index, tp_index, dp, pp, tp):
    """The global rank at mesh coordinates (dp_index, pp_index, tp_index)."""
    for name, i, n in (("dp_index", dp_index, dp), ("pp_index", pp_index, pp), ("tp_index", tp_index, tp)):
        if not 0 <= i < n:
            raise ValueError(f"{name} {i} is outside 0..{n - 1}")
    return (pp_index * dp + dp_index) * tp + tp_index


def coordinates(rank, dp, pp, tp):
    """(dp_index, pp_index, tp_index) of global ``rank``: the inverse of rank_of."""
    if not 0 <= rank < dp * pp * tp:
        raise ValueError(f"rank {rank} is outside a world of dp*pp*tp = {dp * pp * tp}")
    return (rank // tp) % dp, rank // (tp * dp), rank % tp


def groups(dp, pp, tp):
    """{"tp": [...], "dp": [...], "pp": [...]}: every group of each kind as a list of ranks.

    A rank's pp group lists its stages in order: stage s is element s.
    """
    out = {"tp": [], "dp": [], "pp": []}
    for d, s in itertools.product(range(dp), range(pp)):
        out["tp"].append([rank_of(d, s, i, dp, pp, tp) for i in range(tp)])
    for s, i in itertools.product(range(pp), range(tp)):
        out["dp"].append([rank_of(d, s, i, dp, pp, tp) for d in range(dp)])
    for d, i in itertools.product(range(dp), range(tp)):
        out["pp"].append([rank_of(d, s, i, dp, pp, tp) for s in range(pp)])
    return out


@dataclass
class Mesh3D(Mesh):
    """Lesson 6's Mesh (rank, world, tp, dp, tp_rank, dp_rank, tp_group, dp_group, device) plus
    the pipeline coordinate: pp stages, this rank's stage and the group of its stages."""
    pp: int = 1
    pp_rank: int = 0
    pp_group: object = None
    pp_ranks: tuple = ()    # global ranks of this rank's pipeline, stage 0 first


def setup_mesh3d(dp, pp, tp, device="cpu", timeout=120.0):
    """init_process_group (with a timeout) and this rank's TP, DP and PP groups, as a Mesh3D.

    device: "cpu" (gloo) or "cuda" (nccl, LOCAL_RANK's GPU). dp * pp * tp must be the world.
    """
    init_process_group(device, timeout)
    rank, world = dist.get_rank(), dist.get_world_size()
    if dp * pp * tp != world:
        raise ValueError(f"rank {rank}: dp={dp} x pp={pp} x tp={tp} = {dp * pp * tp} ranks, "
                         f"but the world has {world}")
    torch_device = torch.device("cpu")
    if device == "cuda":
        torch_device = torch.device("cuda", int(os.environ.get("LOCAL_RANK", 0)))
    mine = {}
    for kind, members in groups(dp, pp, tp).items():
        for ranks in members:
            g = new_group(ranks, timeout)   # every rank creates every group, same order
            if rank in ranks:
                mine[kind] = (g, ranks)
    d, s, i = coordinates(rank, dp, pp, tp)
    return Mesh3D(rank, world, tp, dp, i, d, mine["tp"][0], mine["dp"][0], torch_device,
                  pp=pp, pp_rank=s, pp_group=mine["pp"][0], pp_ranks=tuple(mine["pp"][1]))
