"""PyTorch DTensor's canonical sharding example, run for real on CPU, checked against our own shard().

    .venv/bin/python -m tp_from_scratch.demos.dtensor_shard                  # launches itself: torchrun, 2 ranks
    .venv/bin/torchrun --standalone --nproc-per-node 2 -m tp_from_scratch.demos.dtensor_shard [--rows 1024 --cols 1024 --axis 0]

The example builds a 1-D device mesh over 2 GPUs and calls
``distribute_tensor(tensor, mesh, [Shard(0)])``: each GPU then holds a (512, 1024) block of
rows. Here the mesh is "cpu" (gloo) instead of "cuda", so it runs on a laptop. Each rank
then checks, bit-exactly, that its DTensor local shard is exactly ``shard(x, t, axis=0)[rank]``
from tp_from_scratch.sharding: DTensor's Shard(d) is our split along axis d.

One detail worth seeing: every rank makes its *own* random tensor (rank-distinct, as
``torch.randn`` without a shared seed would), yet the shards agree with rank 0's tensor.
distribute_tensor takes the data from ``src_data_rank=0`` and scatters it; the other
ranks' copies are ignored. Each rank regenerates rank 0's tensor from its seed to check.
"""
import argparse
import os
import sys

import numpy as np

from tp_from_scratch.comm.launch import launcher_from_env
from tp_from_scratch.compare import assert_matches_reference
from tp_from_scratch.sharding import check_divisible, shard
from tp_from_scratch.testing import random_array, rank_rng
from tp_from_scratch.comm.launchers import LauncherNotFoundError, run_command, torchrun_command

MODULE = "tp_from_scratch.demos.dtensor_shard"


def run_rank(rows, cols, axis, seed):
    """One rank under torchrun: shard a (rows, cols) tensor with DTensor and compare with shard().

    Collectives: distribute_tensor scatters rank 0's tensor; full_tensor() all-gathers it back.
    Returns the line this rank reports.
    """
    import torch
    import torch.distributed as dist
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor import Shard, distribute_tensor

    rank, t = dist.get_rank(), dist.get_world_size()
    mesh = init_device_mesh("cpu", (t,))  # the example says "cuda"; "cpu" gives a gloo mesh

    # (rows, cols), different on every rank: only rank 0's will be used
    mine = torch.from_numpy(random_array(rank_rng(seed, rank), (rows, cols), np.float32))
    distributed = distribute_tensor(mine, mesh, [Shard(axis)])
    local = distributed.to_local()  # (rows/t, cols) for Shard(0), (rows, cols/t) for Shard(1)

    x = random_array(rank_rng(seed, 0), (rows, cols), np.float32)  # rank 0's tensor, regenerated
    ours = shard(x, t, axis=axis)[rank]
    # pure data movement: the same bits, so exact
    assert_matches_reference(local, ours, name=f"DTensor local shard vs shard(x, {t}, axis={axis})",
                             rank=rank, exact=True)
    assert_matches_reference(distributed.full_tensor(), x, name="DTensor.full_tensor()", rank=rank, exact=True)
    return (f"rank {rank}: Global shape: {distributed.shape}, Local shape: {local.shape}, "
            f"placements {distributed.placements}; equals shard(x, {t}, axis={axis})[{rank}] bit-exactly")


def worker(args):
    """Under torchrun: run this rank, then rank 0 prints every rank's line in rank order."""
    import torch.distributed as dist

    line = run_rank(args.rows, args.cols, args.axis, args.seed)
    lines = [None] * dist.get_world_size()
    dist.all_gather_object(lines, line)  # one clean report instead of interleaved prints
    if dist.get_rank() == 0:
        print(f"DTensor on a 1-D 'cpu' device mesh of {len(lines)} ranks (gloo), Shard({args.axis}):")
        print("\n".join(lines))
        print(f"DTensor's Shard({args.axis}) is our shard(x, t, axis={args.axis}); "
              "the data came from rank 0 (src_data_rank=0).")
    # leave together: a rank tearing gloo down while a peer still talks to it can abort
    # ("terminate called without an active exception"), seen once in a full test run
    dist.barrier()
    return 0


def launch(args, argv):
    """Not under torchrun yet: start ``args.nproc`` ranks of this module with torchrun and relay them."""
    try:
        cmd = torchrun_command(args.nproc, MODULE, *argv)
    except LauncherNotFoundError as e:
        print(f"cannot run the DTensor demo: {e}", file=sys.stderr)
        return 2
    proc = run_command(cmd, timeout=args.timeout + 60)  # start-up on a busy laptop, then the job itself
    print(proc.stdout, end="")
    return proc.returncode


def main(argv=None):
    argv = sys.argv[1:] if argv is None else list(argv)
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rows", type=int, default=1024)
    parser.add_argument("--cols", type=int, default=1024)
    parser.add_argument("--axis", type=int, choices=[0, 1], default=0, help="Shard(axis)")
    parser.add_argument("--nproc", type=int, default=2, help="ranks to launch (ignored under torchrun)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--timeout", type=float, default=60.0, help="seconds any rank may wait")
    args = parser.parse_args(argv)
    launcher = launcher_from_env()
    if launcher == "mpi":
        parser.error("DTensor runs on torch.distributed: launch with torchrun, not mpiexec "
                     "(or just `python -m tp_from_scratch.demos.dtensor_shard`, which starts torchrun)")
    under_torchrun = launcher == "torchrun"
    t = int(os.environ["WORLD_SIZE"]) if under_torchrun else args.nproc
    try:  # refuse bad sizes before launching anything
        check_divisible(args.rows if args.axis == 0 else args.cols, t, f"dimension {args.axis} ({'rows' if args.axis == 0 else 'cols'}) of size")
    except ValueError as e:
        parser.error(str(e))
    if under_torchrun:   # a failing rank: "rank r failed: ...", and torchrun stops the others
        from tp_from_scratch.comm.launch import torch_main
        torch_main(lambda: worker(args), timeout=args.timeout, quick_exit=True)
    return launch(args, argv)


if __name__ == "__main__":
    sys.exit(main())
