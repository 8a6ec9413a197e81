"""The collectives on torch tensors, on either kind of group: the torch twin of collectives.py.

Megatron-LM's tensor_parallel package has three tiers: helpers that talk to the group, autograd
Functions built on them (f, g, scatter, gather), and the wrappers layers call. This is the first
tier; nn/mappings.py holds the other two.

    check_group, tp_rank, tp_world_size     what the group is, this rank, the TP degree t
    tensor_to_numpy, numpy_to_tensor        the one bridge between torch and a Comm's numpy
    all_reduce(group, x, op)                sum (or max) over the ranks
    all_gather(group, x, dim, sizes)        every rank's piece along dim, in rank order
    reduce_scatter(group, x, dim)           the sum, then this rank's array_split chunk of dim
    split(group, x, dim, sizes)             this rank's chunk of dim; no communication
    exchange_counts, all_to_all_v           every rank's counts, then rows to their ranks

``group`` is a ``torch.distributed.ProcessGroup`` (PyTorch's native collectives) or a
``tp_from_scratch.comm.Comm`` (Lesson 2's ring collectives, on numpy arrays: tensor ->
numpy -> collective -> tensor). Nothing else chooses. Inputs are never modified; every
result is a new tensor.

bfloat16 has no numpy dtype. It crosses the bridge as float32, the one rule for every
message: a reduction must add numbers, which bit patterns (the other option, int16) cannot;
bfloat16 -> float32 is exact, so a message that is only moved (a pipeline's activations)
arrives bit for bit, and a sum is rounded once, back to bfloat16, at the end, like NCCL's.
The price: a bfloat16 message sends 4 bytes per element on a Comm, and its meter says so.
"""
import numpy as np
import torch
import torch.distributed as dist

from tp_from_scratch import collectives
from tp_from_scratch.comm import Comm
from tp_from_scratch.sharding import shard_sizes

# ---------------------------------------------------------------------------------------
# The group: rank, size, and which backend carries its collectives
# ---------------------------------------------------------------------------------------


def check_group(group):
    """Raise a TypeError unless ``group`` is a ProcessGroup or a Comm (None is not a group)."""
    if isinstance(group, (Comm, dist.ProcessGroup)):
        return group
    raise TypeError(
        f"group must be a torch.distributed.ProcessGroup (native collectives, e.g. "
        f"dist.group.WORLD) or a tp_from_scratch.comm.Comm (from-scratch collectives), "
        f"got {group!r}")


def tp_rank(group):
    """This rank's index inside the tensor-parallel group."""
    check_group(group)
    return group.rank if isinstance(group, Comm) else dist.get_rank(group)


def tp_world_size(group):
    """The tensor-parallel degree t: the number of ranks in the group."""
    check_group(group)
    return group.world_size if isinstance(group, Comm) else dist.get_world_size(group)


# ---------------------------------------------------------------------------------------
# The bridge: torch <-> numpy, for a Comm's collectives and messages
# ---------------------------------------------------------------------------------------

def tensor_to_numpy(x, shared=False):
    """``x`` as a numpy array for a Comm: bfloat16 as float32 (see the module's docstring).

    shared=True: the array must share x's memory (a receive lands in x itself), so x must be
    a CPU tensor of a dtype numpy has; a bfloat16 or GPU tensor is refused with a TypeError.
    """
    t = x.detach()
    if shared:
        if t.dtype == torch.bfloat16 or t.device.type != "cpu":
            raise TypeError(f"a {t.dtype} tensor on {t.device} cannot share its memory with numpy "
                            f"(bfloat16 has no numpy dtype): use float32 on the CPU, or a torch ProcessGroup")
        return t.numpy()
    return (t.float() if t.dtype == torch.bfloat16 else t).cpu().numpy()


def numpy_to_tensor(a, like):
    """The array ``a`` as a tensor of ``like``'s dtype and device (a float32 array back to bfloat16),
    of ``a``'s shape: a 0-d array stays 0-d (np.ascontiguousarray alone makes it (1,))."""
    return torch.from_numpy(np.ascontiguousarray(a).reshape(np.shape(a))).to(device=like.device, dtype=like.dtype)


# ---------------------------------------------------------------------------------------
# The collectives, on both kinds of group
# ---------------------------------------------------------------------------------------

def all_reduce(group, x, op="sum"):
    """A new tensor holding the element-wise sum (or max) of ``x`` over the ranks of ``group``."""
    if isinstance(check_group(group), Comm):
        return numpy_to_tensor(collectives.all_reduce(group, tensor_to_numpy(x), op=op), x)
    ops = {"sum": dist.ReduceOp.SUM, "max": dist.ReduceOp.MAX}
    if op not in ops:
        raise ValueError(f"all_reduce op {op!r} is not one of {sorted(ops)}")
    y = x.detach().clone().contiguous()  # torch reduces in place; the caller keeps x
    dist.all_reduce(y, op=ops[op], group=group)
    return y


def all_gather(group, x, dim=-1, sizes=None):
    """Concatenate every rank's ``x`` along ``dim``, in rank order: (..., n_r, ...) -> (..., sum n_r, ...).

    sizes: each rank's size along ``dim`` when they differ (an uneven split); None means equal.
    """
    if isinstance(check_group(group), Comm):
        return numpy_to_tensor(collectives.all_gather(group, tensor_to_numpy(x), axis=dim), x)
    t = dist.get_world_size(group)
    sizes = sizes or [x.shape[dim]] * t
    # native all_gather needs equal shapes: pad every shard to the largest, trim afterwards
    moved = x.detach().movedim(dim, -1)
    padded = torch.nn.functional.pad(moved, (0, max(sizes) - moved.shape[-1])).contiguous()
    pieces = [torch.empty_like(padded) for _ in range(t)]
    dist.all_gather(pieces, padded, group=group)
    return torch.cat([p[..., :n] for p, n in zip(pieces, sizes)], dim=-1).movedim(-1, dim)


def reduce_scatter(group, x, dim=0):
    """The sum of ``x`` over the ranks, then this rank's array_split chunk of ``dim``; a new tensor.

    On a Comm: the ring reduce-scatter of Lesson 2. On a ProcessGroup: reduce_scatter_single
    when t divides the length (gloo emulates it with an all-reduce, so its bytes are not the
    ring's; measure ours on a Comm), otherwise an all-reduce and this rank's chunk.
    """
    if isinstance(check_group(group), Comm):
        return numpy_to_tensor(collectives.reduce_scatter(group, tensor_to_numpy(x), axis=dim), x)
    t = dist.get_world_size(group)
    if x.shape[dim] % t:
        return split(group, all_reduce(group, x), dim)
    full = x.detach().movedim(dim, 0).contiguous()
    out = torch.empty((full.shape[0] // t, *full.shape[1:]), dtype=x.dtype, device=x.device)
    # reduce_scatter_single is the newer name of reduce_scatter_tensor (as in comm/native.py)
    (getattr(dist, "reduce_scatter_single", None) or dist.reduce_scatter_tensor)(out, full, group=group)
    return out.movedim(0, dim).contiguous()


def split(group, x, dim=-1, sizes=None):
    """This rank's contiguous chunk of ``dim``: (..., n, ...) -> (..., n_r, ...), no communication.

    sizes: the chunk sizes; None splits like numpy.array_split (the first n % t get one more).
    The chunk is a new tensor, never a view of ``x``.
    """
    t, rank = tp_world_size(group), tp_rank(group)
    n = x.shape[dim]
    sizes = sizes or shard_sizes(n, t)
    if len(sizes) != t:
        raise ValueError(f"rank {rank}: {len(sizes)} shard sizes {sizes} for tp={t} ranks")
    if sum(sizes) != n:
        raise ValueError(f"rank {rank}: dimension {dim} of size {n} does not match the shard "
                         f"sizes {sizes} (they add up to {sum(sizes)})")
    start = sum(sizes[:rank])
    # a copy even when the chunk is all of x (t = 1) or already contiguous: never a view of x
    return x.narrow(dim, start, sizes[rank]).clone(memory_format=torch.contiguous_format)


# the all-to-all with uneven counts (a dispatch of rows to their ranks, e.g. tokens to experts)

def exchange_counts(group, send_counts):
    """send_counts (t,) or (t, m) ints, row d for rank d -> an int64 tensor of the same shape
    whose row q is what rank q sends this rank: what every receiver must know before a
    dispatch with uneven counts (an all-to-all of t equal blocks)."""
    if isinstance(check_group(group), Comm):
        return torch.from_numpy(collectives.exchange_counts(group, np.asarray(send_counts)))
    sent = torch.as_tensor(np.asarray(send_counts), dtype=torch.int64).contiguous()
    received = torch.empty_like(sent)
    dist.all_to_all_single(received, sent, group=group)
    return received


def all_to_all_v(group, x, send_counts, recv_counts):
    """(sum send_counts, ...) -> (sum recv_counts, ...): rows [c_<d, c_<=d) of ``x`` go to rank
    d; what arrives is concatenated in source-rank order. A Comm runs the from-scratch
    pairwise exchange (collectives.all_to_all_v); a ProcessGroup runs torch's native
    all_to_all_single with the same split sizes. ``x`` is never modified."""
    if isinstance(check_group(group), Comm):
        return numpy_to_tensor(collectives.all_to_all_v(group, tensor_to_numpy(x), np.asarray(send_counts),
                                                          np.asarray(recv_counts)), x)
    out = x.new_empty((sum(recv_counts), *x.shape[1:]))
    dist.all_to_all_single(out, x.detach().contiguous(), [int(c) for c in recv_counts],
                           [int(c) for c in send_counts], group=group)
    return out
