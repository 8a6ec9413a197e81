"""The process mesh: where each rank sits, and the groups it talks to.

    rank = (pp_index * dp + dp_index) * tp + tp_index       Lesson 6: pp = 1, rank = dp_index * tp + tp_index

TP is the innermost (fastest-varying) coordinate, then DP, then PP: Megatron-LM's default
order ("tp-dp-pp", parallel_state.initialize_model_parallel), read from the inside out.
With torchrun numbering ranks node by node, that puts

* a TP group on consecutive ranks: one node, where NVLink is. TP talks in every layer, in
  the forward and in the backward, with activation-sized messages: it needs the bandwidth;
* a DP group on ranks tp apart, inside one pipeline stage: one gradient all-reduce (or
  reduce-scatter + all-gather for ZeRO) per step, which overlaps with backward;
* a PP group on ranks dp * tp apart (pipeline stages): the farthest apart, across nodes. Pipeline
  stages send one activation per micro-batch to their neighbour, point to point.

World 4, tp 2 (Lesson 6):         TP groups {0, 1} {2, 3}      DP groups {0, 2} {1, 3}
World 8, dp 2, pp 2, tp 2:

    pp stage 0:  dp 0: ranks 0 1    dp 1: ranks 2 3      TP groups {0,1} {2,3} {4,5} {6,7}
    pp stage 1:  dp 0: ranks 4 5    dp 1: ranks 6 7      DP groups {0,2} {1,3} {4,6} {5,7}
                                                         PP groups {0,4} {1,5} {2,6} {3,7}

setup_mesh builds every group, each with a timeout, in the same order on every rank
(new_group is collective), on the default process group comm.launch.torch_main started.
"""
import itertools
from dataclasses import dataclass

import torch
import torch.distributed as dist

from tp_from_scratch.comm.process_group import local_device, new_group


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
class Mesh:
    """This process's place in the dp x pp x tp mesh and the groups it talks to."""
    rank: int
    world: int
    tp: int
    dp: int
    tp_rank: int
    dp_rank: int
    tp_group: object
    dp_group: object
    device: torch.device
    device_mesh: object = None  # only for --impl dtensor
    pp: int = 1
    pp_rank: int = 0
    pp_group: object = None
    pp_ranks: tuple = ()    # global ranks of this rank's pipeline, stage 0 first


def setup_mesh(tp, device="cpu", timeout=120.0, dtensor=False, pp=1):
    """This rank's TP, DP (and PP) groups, each with a timeout, as a Mesh; dp = world / (pp * tp).

    device: "cpu" (gloo) or "cuda" (nccl, one GPU per process, LOCAL_RANK's).
    dtensor: build a torch DeviceMesh ("dp", "tp") instead (pp = 1), for PyTorch's own TP.
    Needs the default process group (comm.launch.torch_main starts it).
    """
    if not dist.is_initialized():
        raise RuntimeError("setup_mesh needs the default process group: run it inside comm.launch.torch_main")
    rank, world = dist.get_rank(), dist.get_world_size()
    dp = world // (pp * tp)
    if dp * pp * tp != world:
        raise ValueError(f"rank {rank}: pp={pp} x tp={tp} does not divide the world of {world} ranks")
    d, s, i = coordinates(rank, dp, pp, tp)
    if dtensor:
        from torch.distributed.device_mesh import init_device_mesh
        mesh = init_device_mesh(device, (dp, tp), mesh_dim_names=("dp", "tp"))
        return Mesh(rank, world, tp, dp, i, d, mesh["tp"].get_group(), mesh["dp"].get_group(),
                    local_device(device), mesh)
    mine = {}
    for kind, members in groups(dp, pp, tp).items():
        if kind == "pp" and pp == 1:
            continue   # no pipeline: no PP groups
        for ranks in members:
            g = new_group(ranks, timeout)   # every rank creates every group, same order
            if rank in ranks:
                mine[kind] = (g, ranks)
    pp_group, pp_ranks = mine.get("pp", (None, (rank,)))
    return Mesh(rank, world, tp, dp, i, d, mine["tp"][0], mine["dp"][0], local_device(device),
                pp=pp, pp_rank=s, pp_group=pp_group, pp_ranks=tuple(pp_ranks))
