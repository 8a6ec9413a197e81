"""Lesson 13 on real processes, in one launch (tests/test_numerics_launch.py, tests/test_slow_tp8.py):

    .venv/bin/mpiexec -n 4 .venv/bin/python -m tests.spmd_scripts.numerics
    .venv/bin/torchrun --standalone --nproc-per-node 4 -m tests.spmd_scripts.numerics

numerics.check's tree and layer checks and the invariant GPT's logits, loss and every gradient,
bit for bit equal to t = 1 computed in this process: under mpiexec on MPIComm at t = the world
size and at t = 2 (sub-communicators of neighbouring pairs); under torchrun on TorchComm at t =
the world size, and on the native process groups at t = the world size and t = 2 (the TP groups
of the dp x tp mesh). Under torchrun also the doubling backward (exactly 2 at t = 2) and
clip_grad_norm on that mesh, equal in float64 to torch's clip_grad_norm_ on one device.
"""
import copy
import sys

import torch

from tests.invariant_gpt import check_gpt
from tp_from_scratch.comm import Comm, spmd_main
from tp_from_scratch.compare import TOLERANCE, assert_matches_reference
from tp_from_scratch.gpt.model import GPTConfig, init_gpt
from tp_from_scratch.gpt.parallelize import gpt_to_tp, shard_tensor
from tp_from_scratch.nn.mappings import all_reduce
from tp_from_scratch.numerics import check
from tp_from_scratch.numerics.clip import clip_grad_norm, gpt_placement
from tp_from_scratch.numerics.doubling import weight_gradient_ratios

def check_everything(group):
    """numerics.check's checks (the numpy tree on a Comm only) and check_gpt, on ``group``."""
    numpy_tree = check.check_tree(group) if isinstance(group, Comm) else 0
    return numpy_tree + check.check_tree_torch(group) + check.check_layers(group) + check_gpt(group)


def check_clip_on_the_mesh(mesh):
    """clip_grad_norm with {"tp", "dp"} groups == torch's clip_grad_norm_ on one device (float64)."""
    config = GPTConfig(vocab_size=67, seq_len=16, n_layers=1, hidden=32, n_heads=4, n_kv_heads=1, arch="llama")
    gpt = init_gpt(config, 0, torch.float64)
    gen = torch.Generator().manual_seed(2)
    idx, targets = (torch.randint(0, config.vocab_size, (2 * mesh.dp, 16), generator=gen) for _ in range(2))
    reference = copy.deepcopy(gpt)
    reference(idx, targets)[1].backward()
    want = torch.nn.utils.clip_grad_norm_(reference.parameters(), 0.05)
    model = gpt_to_tp(mesh.tp_group, gpt)
    mine = slice(2 * mesh.dp_rank, 2 * mesh.dp_rank + 2)       # this DP rank's sequences
    model(idx[mine], targets[mine])[1].backward()
    for p in model.parameters():                              # the DP average
        p.grad.copy_(all_reduce(mesh.dp_group, p.grad) / mesh.dp)
    got = clip_grad_norm(model, 0.05, placement=gpt_placement(config, mesh.tp),
                         groups={"tp": mesh.tp_group, "dp": mesh.dp_group})
    assert_matches_reference(got, want, name="grad norm on the dp x tp mesh", rank=mesh.rank)
    for name, p in model.named_parameters():
        assert_matches_reference(p.grad, shard_tensor(name, dict(reference.named_parameters())[name].grad,
                                                      mesh.tp, mesh.tp_rank, config),
                                 name=f"clipped grad of {name}", rank=mesh.rank, tol=TOLERANCE["float64"])
    return 1


def main(comm):
    n = check_everything(comm)
    lines = []
    if type(comm).__name__ == "MPIComm":
        from tp_from_scratch.comm import MPIComm
        n += check_everything(MPIComm(comm.mpi.Split(comm.rank // 2, comm.rank)))  # pairs 0-1, 2-3, ...
    else:
        import torch.distributed as dist

        from tp_from_scratch.gpt.mesh import setup_mesh
        mesh = setup_mesh(2)                                  # TP groups {0, 1}, {2, 3}, ...; DP the rest
        n += check_everything(dist.group.WORLD) + check_everything(mesh.tp_group) + check_clip_on_the_mesh(mesh)
        for label, group in (("t=2", mesh.tp_group), (f"t={comm.world_size}", dist.group.WORLD)):
            ratios = weight_gradient_ratios(group)
            lines.append(f"doubling {label}: " + "; ".join(f"{name} {low:.6f} {high:.6f}"
                                                          for name, (low, high) in ratios.items()))
    sys.stdout.write(f"rank {comm.rank}: all {n} numerics checks passed at t={comm.world_size} and t=2 "
                     f"({type(comm).__name__})\n" + "".join(f"rank {comm.rank}: {line}\n" for line in lines))
    sys.stdout.flush()


if __name__ == "__main__":
    spmd_main(main)
