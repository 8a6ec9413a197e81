"""Run every from-scratch collective under mpiexec or torchrun and check it in-process against
(a) the single-device numpy result and (b) the backend's native collective.

    mpiexec -n 4 python -m tests.spmd_scripts.check_collectives
    torchrun --nproc-per-node 4 -m tests.spmd_scripts.check_collectives

Any mismatch raises on its rank; spmd_main then ends the job with a non-zero status.
Prints "rank R: N checks passed" on success.
"""
import numpy as np

from tp_from_scratch import collectives as C
from tp_from_scratch.comm import MPIComm, spmd_main
from tp_from_scratch.compare import assert_matches_reference
from tp_from_scratch.testing import random_array, rank_rng

NP_OP = {"sum": np.sum, "max": np.max}


class Native:
    """The backend's own collectives, with the same signatures as tp_from_scratch.collectives."""

    def __init__(self, comm):
        self.comm, self.p, self.r = comm, comm.world_size, comm.rank
        self.mpi = isinstance(comm, MPIComm)
        if self.mpi:
            from mpi4py import MPI
            self.MPI, self.ops = MPI, {"sum": MPI.SUM, "max": MPI.MAX}
        else:
            import torch
            import torch.distributed as dist
            self.torch, self.dist = torch, dist
            self.ops = {"sum": dist.ReduceOp.SUM, "max": dist.ReduceOp.MAX}

    def all_reduce(self, x, op):
        if self.mpi:
            out = np.empty_like(x)
            self.comm.mpi.Allreduce(x, out, op=self.ops[op])
            return out
        t = self.torch.from_numpy(x.copy())
        self.dist.all_reduce(t, op=self.ops[op])
        return t.numpy()

    def reduce_scatter(self, x, op):  # along axis 0, array_split chunks
        chunks = np.array_split(x, self.p)
        if self.mpi:
            out = np.empty_like(chunks[self.r])
            self.comm.mpi.Reduce_scatter(x, out, [c.size for c in chunks], op=self.ops[op])
            return out
        out = self.torch.from_numpy(np.empty_like(chunks[self.r]))
        self.dist.reduce_scatter(out, [self.torch.from_numpy(c.copy()) for c in chunks], op=self.ops[op])
        return out.numpy()

    def all_gather(self, x):  # shards of unequal length along axis 0
        if self.mpi:
            return np.concatenate(self.comm.mpi.allgather(x))
        shards = [None] * self.p
        self.dist.all_gather_object(shards, x)  # gloo all_gather needs equal shapes
        return np.concatenate(shards)

    def broadcast(self, x, root):
        if self.mpi:
            buf = x.copy()
            self.comm.mpi.Bcast(buf, root=root)
            return buf
        t = self.torch.from_numpy(x.copy())
        self.dist.broadcast(t, src=root)
        return t.numpy()

    def reduce(self, x, root, op):
        if self.mpi:
            out = np.empty_like(x)
            self.comm.mpi.Reduce(x, out, op=self.ops[op], root=root)
            return out
        t = self.torch.from_numpy(x.copy())
        self.dist.reduce(t, dst=root, op=self.ops[op])
        return t.numpy()

    def scatter(self, x, root):
        chunks = np.array_split(x, self.p)
        if self.mpi:
            return self.comm.mpi.scatter(chunks if self.r == root else None, root=root)
        out = [None]
        self.dist.scatter_object_list(out, chunks if self.r == root else None, src=root)
        return out[0]

    def gather(self, x, root):
        if self.mpi:
            parts = self.comm.mpi.gather(x, root=root)
        else:
            parts = [None] * self.p if self.r == root else None
            self.dist.gather_object(x, parts, dst=root)
        return np.concatenate(parts) if self.r == root else None

    def all_to_all(self, x):  # split axis 0, concatenate axis 1
        chunks = np.array_split(x, self.p)
        if self.mpi:
            return np.concatenate(self.comm.mpi.alltoall(chunks), axis=1)
        out = [self.torch.empty_like(self.torch.from_numpy(chunks[self.r])) for _ in range(self.p)]
        self.dist.all_to_all(out, [self.torch.from_numpy(c.copy()) for c in chunks])
        return np.concatenate([o.numpy() for o in out], axis=1)

    def all_to_all_v(self, x, send_counts, recv_counts):  # uneven blocks of rows
        out = np.empty((sum(recv_counts), *x.shape[1:]), x.dtype)
        if self.mpi:
            row = int(np.prod(x.shape[1:]))
            def spec(counts):
                return ([c * row for c in counts], list(np.cumsum([0, *counts[:-1]]) * row))
            self.comm.mpi.Alltoallv([np.ascontiguousarray(x), spec(send_counts), self.MPI.DOUBLE],
                                    [out, spec(recv_counts), self.MPI.DOUBLE])
            return out
        t = self.torch.from_numpy(out)
        self.dist.all_to_all_single(t, self.torch.from_numpy(x.copy()), [int(c) for c in recv_counts],
                                    [int(c) for c in send_counts])
        return t.numpy()


def main(comm):
    p, r = comm.world_size, comm.rank
    native = Native(comm)
    checks = 0

    def check(got, reference, native_result, name, exact):
        nonlocal checks
        assert_matches_reference(got, reference, name=f"{name} vs numpy", rank=r, exact=exact)
        assert_matches_reference(got, native_result, name=f"{name} vs native", rank=r, exact=exact)
        checks += 1

    for integer in (True, False):  # integer data: bit-exact sums; gaussian: the tolerance policy
        # every rank can rebuild every rank's input: rank_rng(seed, q) is deterministic
        xs = [random_array(rank_rng(7, q), (2 * p + 1, 3), integer=integer) for q in range(p)]
        x = xs[r]
        for op in ("sum", "max"):
            exact = integer or op == "max"
            full = NP_OP[op](np.stack(xs), axis=0)
            check(C.all_reduce(comm, x, op=op), full, native.all_reduce(x, op), f"all_reduce {op}", exact)
            check(C.reduce_scatter(comm, x, op=op), np.array_split(full, p)[r],
                  native.reduce_scatter(x, op), f"reduce_scatter {op}", exact)
            root = p - 1
            got, nat = C.reduce(comm, x, root=root, op=op), native.reduce(x, root, op)
            if r == root:
                check(got, full, nat, f"reduce {op}", exact)
            else:
                assert got is None, f"reduce returned {got!r} on rank {r}"
        shard = xs[r][: r + 1]  # unequal shards: rank q holds q + 1 rows
        check(C.all_gather(comm, shard), np.concatenate([xq[: q + 1] for q, xq in enumerate(xs)]),
              native.all_gather(shard), "all_gather", True)
        check(C.broadcast(comm, x if r == 1 else None, root=1), xs[1], native.broadcast(x, 1),
              "broadcast", True)
        check(C.scatter(comm, x if r == 0 else None, root=0), np.array_split(xs[0], p)[r],
              native.scatter(x, 0), "scatter", True)
        got, nat = C.gather(comm, shard, root=0), native.gather(shard, 0)
        if r == 0:
            check(got, np.concatenate([xq[: q + 1] for q, xq in enumerate(xs)]), nat, "gather", True)
        even = x[: 2 * p]  # gloo's all_to_all needs equal chunks (uneven ones: simulator tests)
        check(C.all_to_all(comm, even, 0, 1),
              np.concatenate([np.array_split(xq[: 2 * p], p)[r] for xq in xs], axis=1),
              native.all_to_all(even), "all_to_all", True)
        # token dispatch: rank q sends (q + d) % 3 rows to rank d (some blocks empty)
        counts = [[(q + d) % 3 for d in range(p)] for q in range(p)]
        rows = xs[r][: sum(counts[r])]
        recv_counts = C.exchange_counts(comm, counts[r])
        assert list(recv_counts) == [counts[q][r] for q in range(p)], f"rank {r}: exchanged counts"
        blocks = [np.split(xq[: sum(counts[q])], np.cumsum(counts[q])[:-1])[r] for q, xq in enumerate(xs)]
        check(C.all_to_all_v(comm, rows, counts[r], recv_counts), np.concatenate(blocks),
              native.all_to_all_v(rows, counts[r], recv_counts), "all_to_all_v", True)
    # point to point around the ring: messages with and without a header, interleaved, one
    # of them empty and one received into a non-contiguous view, must arrive intact and in order
    right, left = (r + 1) % p, (r - 1) % p
    def messages(q):
        rng = rank_rng(9, q)
        return [random_array(rng, (3, 4)), random_array(rng, (5,), np.float32),
                np.zeros((0, 2)), random_array(rng, (2, 3), integer=True).astype(np.int64),
                random_array(rng, (3, 2)), np.array(rng.standard_normal())]
    mine = messages(r)
    for message, header in zip(mine, (True, False, False, True, False, True)):
        comm.send(message, right, header=header)
        message[...] = -1  # a plain send copied it: overwriting now must not change what arrives
    expected = messages(left)
    got = [comm.recv(left),
           comm.recv(left, out=np.empty(5, np.float32), header=False),
           comm.recv(left, out=np.empty((0, 2)), header=False),
           None]
    strided = np.zeros((2, 6), np.int64)
    comm.recv(left, out=strided[:, ::2])
    got[3] = strided[:, ::2]
    columns = np.zeros((2, 3))  # a non-contiguous buffer for a message without a header
    got.append(comm.recv(left, out=columns.T, header=False))
    got.append(comm.recv(left))  # a 0-d array arrives 0-d
    for k, (g, e) in enumerate(zip(got, expected)):
        assert_matches_reference(g, e, name=f"point-to-point message {k}", rank=r, exact=True)
    checks += 1
    if p >= 4 and p % 2 == 0:
        # a communicator over half of the ranks, as tensor parallelism inside data parallelism
        # uses: the collectives must address peers by their rank in the subgroup
        half = p // 2
        members = list(range(half)) if r < half else list(range(half, p))
        sub = subgroup(comm, half)
        assert (sub.rank, sub.world_size) == (members.index(r), half)
        xs = [random_array(rank_rng(8, q), (5, 2), integer=True) for q in range(p)]
        check(C.all_reduce(sub, xs[r]), np.sum([xs[q] for q in members], axis=0),
              np.sum([xs[q] for q in members], axis=0), "all_reduce on a subgroup", True)
    comm.barrier()
    print(f"rank {r}: {checks} checks passed on {type(comm).__name__}", flush=True)


def subgroup(comm, half):
    """The communicator of this rank's half of the world: ranks [0, half) or [half, p)."""
    if isinstance(comm, MPIComm):
        return MPIComm(comm.mpi.Split(color=comm.rank // half, key=comm.rank))
    import torch.distributed as dist
    from tp_from_scratch.comm import TorchComm
    # every rank must take part in creating every group
    groups = [dist.new_group(list(range(half))), dist.new_group(list(range(half, comm.world_size)))]
    return TorchComm(group=groups[comm.rank // half])


if __name__ == "__main__":
    spmd_main(main)
