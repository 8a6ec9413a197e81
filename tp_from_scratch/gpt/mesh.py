"""The dp x tp process mesh: one tensor-parallel group and one data-parallel group per rank.

    rank = dp_index * tp + tp_index         e.g. world 4, tp 2:   TP groups {0, 1} {2, 3}
                                                                  DP groups {0, 2} {1, 3}

The ranks of one TP group are neighbours, so with torchrun's numbering they share a node,
where the bandwidth is: TP talks every layer, DP once per step. Every process group is
created with a timeout, so a collective never waits forever.
"""
import os
from dataclasses import dataclass

import torch
import torch.distributed as dist

from tp_from_scratch.comm.process_group import init_process_group, new_group


@dataclass
class Mesh:
    """This process's place in the dp x tp mesh and the groups it talks to."""
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


def setup_mesh(tp, device="cpu", timeout=120.0, dtensor=False):
    """init_process_group (with a timeout) and this rank's TP and DP groups, as a Mesh.

    device: "cpu" (gloo) or "cuda" (nccl, one GPU per process, LOCAL_RANK's).
    dtensor: build a torch DeviceMesh ("dp", "tp") instead, for PyTorch's own TP.
    Every rank creates every group, in the same order: new_group is collective.
    Without torchrun's environment (no RANK), a world of one process is set up.
    """
    init_process_group(device, timeout)  # a world of one under plain `python -m ...`
    rank, world = dist.get_rank(), dist.get_world_size()
    dp = world // tp
    torch_device = torch.device("cpu")
    if device == "cuda":
        torch_device = torch.device("cuda", int(os.environ.get("LOCAL_RANK", 0)))
    if dtensor:
        from torch.distributed.device_mesh import init_device_mesh
        mesh = init_device_mesh(device, (dp, tp), mesh_dim_names=("dp", "tp"))
        return Mesh(rank, world, tp, dp, rank % tp, rank // tp, mesh["tp"].get_group(),
                    mesh["dp"].get_group(), torch_device, mesh)
    tp_group = dp_group = None
    for d in range(dp):     # TP groups: consecutive ranks
        g = new_group([d * tp + i for i in range(tp)], timeout)
        if d == rank // tp:
            tp_group = g
    for i in range(tp):     # DP groups: the ranks holding the same shard
        g = new_group([d * tp + i for d in range(dp)], timeout)
        if i == rank % tp:
            dp_group = g
    return Mesh(rank, world, tp, dp, rank % tp, rank // tp, tp_group, dp_group, torch_device)
