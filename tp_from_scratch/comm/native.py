"""The backend's own (native) collectives on numpy arrays: the yardstick for the from-scratch ones.

MPI: mpi4py's buffer interface (Allreduce, Reduce_scatter_block, ...), which sends the
array's memory directly. torch.distributed: all_reduce, reduce_scatter_tensor, ... on
tensors sharing memory with the numpy arrays (on the communicator's device for nccl).
Only even splits: shards along axis 0 must all have the same length, as MPI's and
gloo's fixed-size collectives demand.
"""
import time
from datetime import timedelta

import numpy as np

BENCH_TAG = 7  # apart from the communicators' own tags (0-3)


class MPINative:
    """Native MPI collectives for an MPIComm (mpi4py); every function returns a new array."""

    name = "MPI"

    def __init__(self, comm):
        from mpi4py import MPI
        self.MPI = MPI
        self.mpi = comm.mpi  # the mpi4py communicator the MPIComm wraps
        self.rank, self.world_size = self.mpi.Get_rank(), self.mpi.Get_size()

    def _op(self, op):
        return {"sum": self.MPI.SUM, "max": self.MPI.MAX}[op]

    def all_reduce(self, x, op="sum"):
        out = np.empty_like(x)
        self.mpi.Allreduce(np.ascontiguousarray(x), out, op=self._op(op))
        return out

    def reduce_scatter(self, x, op="sum"):
        out = np.empty((x.shape[0] // self.world_size, *x.shape[1:]), x.dtype)
        self.mpi.Reduce_scatter_block(np.ascontiguousarray(x), out, op=self._op(op))
        return out

    def all_gather(self, x):
        out = np.empty((x.shape[0] * self.world_size, *x.shape[1:]), x.dtype)
        self.mpi.Allgather(np.ascontiguousarray(x), out)
        return out

    def broadcast(self, x, root=0):
        out = np.ascontiguousarray(x).copy()
        self.mpi.Bcast(out, root=root)
        return out

    def reduce(self, x, root=0, op="sum"):
        out = np.empty_like(x)
        self.mpi.Reduce(np.ascontiguousarray(x), out if self.rank == root else None, op=self._op(op), root=root)
        return out if self.rank == root else None

    def scatter(self, x, root=0):
        # every rank knows the full shape here (the demo passes it); the root's x is split
        out = np.empty((x.shape[0] // self.world_size, *x.shape[1:]), x.dtype)
        self.mpi.Scatter(np.ascontiguousarray(x) if self.rank == root else None, out, root=root)
        return out

    def gather(self, x, root=0):
        out = np.empty((x.shape[0] * self.world_size, *x.shape[1:]), x.dtype) if self.rank == root else None
        self.mpi.Gather(np.ascontiguousarray(x), out, root=root)
        return out

    def all_to_all(self, x):
        out = np.empty_like(x)
        self.mpi.Alltoall(np.ascontiguousarray(x), out)
        return out

    def ring_step(self, x, out, timeout=30.0):
        """Send x to rank + 1 and receive ``out`` from rank - 1 with mpi4py's own Isend/Irecv.

        Waits the way MPIComm does (polling, yielding the core), so a comparison with it
        measures the communicator's Python, not a different way of waiting.
        """
        from tp_from_scratch.comm.mpi import _wait_until
        right, left = (self.rank + 1) % self.world_size, (self.rank - 1) % self.world_size
        deadline = time.monotonic() + timeout
        sent = self.mpi.Isend(x, right, tag=BENCH_TAG)
        received = self.mpi.Irecv(out, left, tag=BENCH_TAG)
        for request in (received, sent):
            _wait_until(request.Test, deadline, lambda: f"rank {self.rank}: ring step timed out")

    def barrier(self):
        self.mpi.Barrier()


class TorchNative:
    """Native torch.distributed collectives (gloo on CPU, nccl on CUDA) for a TorchComm."""

    name = "torch.distributed"

    def __init__(self, comm):
        import torch
        import torch.distributed as dist
        self.torch, self.dist = torch, dist
        self.group = getattr(comm, "group", None)
        self.device = getattr(comm, "device", None) or torch.device("cpu")
        self.rank, self.world_size = dist.get_rank(self.group), dist.get_world_size(self.group)
        # torch >= 2.13 renamed the *_tensor variants to *_single (the old names warn)
        self._reduce_scatter = getattr(dist, "reduce_scatter_single", None) or dist.reduce_scatter_tensor
        self._all_gather = getattr(dist, "all_gather_single", None) or dist.all_gather_into_tensor
        if self.device.type != "cpu":
            self.name = "torch.distributed (nccl)"
        else:
            self.name = "torch.distributed (gloo)"

    def _t(self, x):
        return self.torch.from_numpy(np.ascontiguousarray(x)).to(self.device)

    def _np(self, t):
        return t.cpu().numpy()

    def _global(self, rank):
        return rank if self.group is None else self.dist.get_global_rank(self.group, rank)

    def _op(self, op):
        return {"sum": self.dist.ReduceOp.SUM, "max": self.dist.ReduceOp.MAX}[op]

    def all_reduce(self, x, op="sum"):
        t = self._t(x).clone()
        self.dist.all_reduce(t, op=self._op(op), group=self.group)
        return self._np(t)

    def reduce_scatter(self, x, op="sum"):
        t = self._t(x)
        out = self.torch.empty((t.shape[0] // self.world_size, *t.shape[1:]), dtype=t.dtype, device=t.device)
        self._reduce_scatter(out, t, op=self._op(op), group=self.group)
        return self._np(out)

    def all_gather(self, x):
        t = self._t(x)
        out = self.torch.empty((t.shape[0] * self.world_size, *t.shape[1:]), dtype=t.dtype, device=t.device)
        self._all_gather(out, t, group=self.group)
        return self._np(out)

    def broadcast(self, x, root=0):
        t = self._t(x).clone()
        self.dist.broadcast(t, src=self._global(root), group=self.group)
        return self._np(t)

    def reduce(self, x, root=0, op="sum"):
        t = self._t(x).clone()
        self.dist.reduce(t, dst=self._global(root), op=self._op(op), group=self.group)
        return self._np(t) if self.rank == root else None

    def scatter(self, x, root=0):
        t = self._t(x)
        out = self.torch.empty((t.shape[0] // self.world_size, *t.shape[1:]), dtype=t.dtype, device=t.device)
        pieces = list(t.chunk(self.world_size)) if self.rank == root else None
        self.dist.scatter(out, pieces, src=self._global(root), group=self.group)
        return self._np(out)

    def gather(self, x, root=0):
        t = self._t(x)
        pieces = [self.torch.empty_like(t) for _ in range(self.world_size)] if self.rank == root else None
        self.dist.gather(t, pieces, dst=self._global(root), group=self.group)
        return self._np(self.torch.cat(pieces)) if self.rank == root else None

    def all_to_all(self, x):
        t = self._t(x)
        out = self.torch.empty_like(t)
        self.dist.all_to_all_single(out, t, group=self.group)
        return self._np(out)

    def ring_step(self, x, out, timeout=30.0):
        """Send x to rank + 1 and receive ``out`` from rank - 1 with dist.isend/irecv."""
        right, left = (self.rank + 1) % self.world_size, (self.rank - 1) % self.world_size
        limit = timedelta(seconds=timeout)
        sent = self.dist.isend(self._t(x), self._global(right), self.group, tag=BENCH_TAG)
        received = self.torch.from_numpy(out).to(self.device)  # on the CPU: out's own memory
        self.dist.irecv(received, self._global(left), self.group, tag=BENCH_TAG).wait(timeout=limit)
        sent.wait(timeout=limit)
        if self.device.type != "cpu":
            np.copyto(out, self._np(received))

    def barrier(self):
        self.dist.barrier(group=self.group)


def native_for(comm):
    """The native collectives matching comm's backend (MPIComm -> MPI, TorchComm -> torch.distributed)."""
    kind = type(comm).__name__
    if kind == "MPIComm":
        return MPINative(comm)
    if kind == "TorchComm":
        return TorchNative(comm)
    raise TypeError(f"no native collectives for {kind}: launch under mpiexec (MPIComm) or torchrun (TorchComm)")
