"""Collective operations built from point-to-point messages only: comm.send and comm.recv.

Every function takes the communicator explicitly and works on any backend (simulated,
MPI, torch.distributed) and any world size p >= 1, powers of two or not. The result keeps
the input's dtype and shape conventions, and the caller's input is never modified.

Cost model (alpha-beta): sending n bytes costs alpha + n * beta. Per rank, for an array of
N bytes (chunks from numpy.array_split, so "N/p" is exact only when p divides the length):

    collective       algorithm           messages per rank    bytes sent per rank
    reduce_scatter   ring                p - 1                N - chunk_r            ~ (p-1)/p N
    all_gather       ring                p - 1                p*n - shard_{r+1}       ~ (p-1)/p p*n
    all_reduce       ring RS + ring AG   2(p - 1)             2N - chunk_r - chunk_{r+1}  ~ 2(p-1)/p N
    broadcast        binomial tree       <= ceil(log2 p)      (root) ceil(log2 p) N
    reduce           binomial tree       <= ceil(log2 p)      <= N per message
    scatter/gather   direct to/from root p - 1 (root)         (root) N - chunk_root
    all_to_all       pairwise exchange   p - 1                N - chunk_r
    all_to_all_v     pairwise exchange   p - 1                (sum_d c_d - c_r) * row bytes
                     (uneven: c_d rows go to rank d; exchange_counts first, p - 1 small messages)

2(p-1)/p N is the least any all-reduce can send per rank (each rank must get (p-1)/p of
the data in and push its (p-1)/p out), which is why the ring is called bandwidth-optimal.
"""
import numpy as np

from .sharding import shard_sizes

# reduction op name -> element-wise numpy function that returns a new array
OPS = {"sum": np.add, "max": np.maximum, "min": np.minimum, "prod": np.multiply}


def _combine(op):
    try:
        return OPS[op]
    except (KeyError, TypeError):
        raise ValueError(f"unknown reduction op {op!r}; expected one of {sorted(OPS)}") from None


def _axis(x, axis, what):
    if x.ndim == 0:
        raise ValueError(f"{what} needs an array with at least one dimension, got a scalar")
    if not -x.ndim <= axis < x.ndim:
        raise ValueError(f"{what}: axis {axis} is out of range for an array of shape {x.shape}")
    return axis % x.ndim


def _check_root(comm, root):
    if not isinstance(root, (int, np.integer)) or not 0 <= root < comm.world_size:
        raise ValueError(f"rank {comm.rank}: root {root!r} does not exist (world_size is {comm.world_size})")


def _without(shape, axis):
    """The shape with ``axis`` replaced by '*': what must agree across ranks when that axis may differ."""
    return tuple("*" if i == axis else n for i, n in enumerate(shape))


def reduce_scatter(comm, x, axis=0, op="sum"):
    """Reduce ``x`` over all ranks and return this rank's chunk: chunk r of np.array_split(sum, p, axis).

    Algorithm, ring of p - 1 steps: rank r sends to r+1 and receives from r-1. At step s it
    sends its running partial of chunk (r-s-1) mod p and receives the partial of chunk
    (r-s-2) mod p, to which it adds its own piece. Each partial travels around the ring
    collecting one rank's contribution per hop; after p-1 hops chunk r is complete on rank r.
    Cost per rank: p-1 messages, N - nbytes(chunk r) bytes sent, ~ (p-1)/p N.
    """
    x = np.asarray(x)
    combine = _combine(op)
    ax = _axis(x, axis, "reduce_scatter")
    p, r = comm.world_size, comm.rank
    with comm.collective("reduce_scatter", x, shape=x.shape, dtype=x.dtype, axis=ax, op=op):
        chunks = np.array_split(x, p, axis=ax)  # views into the input, only ever read
        return _ring_reduce_scatter_into(comm, chunks, np.empty(chunks[r].shape, x.dtype), combine)


def _ring_reduce_scatter_into(comm, chunks, result, combine):
    """The reduce_scatter ring on ``chunks`` (this rank's input, split); chunk r's sum lands in ``result``.

    ``result``: a new array of chunk r's shape and dtype, not a view of the input (the last
    sum is received into it). Every rank knows every chunk's shape, so the messages go
    without a header (see Comm.send).
    """
    p, r = comm.world_size, comm.rank
    partial = chunks[(r - 1) % p]
    for step in range(p - 1):
        comm.send(partial, (r + 1) % p, header=False)  # partial of chunk (r - step - 1)
        mine = chunks[(r - step - 2) % p]
        # the last partial to arrive is chunk r's own: receive it straight into result
        buffer = result if step == p - 2 else np.empty(mine.shape, mine.dtype)
        incoming = comm.recv((r - 1) % p, out=buffer, header=False)
        partial = combine(incoming, mine, out=incoming)  # this rank's own buffer: add in place
    if p == 1:  # no step ran: the sum over one rank is its own chunk
        result[...] = chunks[0]
    return result


def all_gather(comm, x, axis=0):
    """Concatenate every rank's ``x`` along ``axis``, in rank order; shards may differ in length there.

    Algorithm, ring of p - 1 steps: at step s rank r forwards shard (r-s) mod p (its own at
    step 0, then the one it just received) to r+1 and receives shard (r-s-1) mod p from r-1.
    Cost per rank: p-1 messages, every shard but shard (r+1) mod p sent, ~ (p-1)/p of the result.
    """
    x = np.asarray(x)
    ax = _axis(x, axis, "all_gather")
    p, r = comm.world_size, comm.rank
    with comm.collective("all_gather", x, shape=_without(x.shape, ax), dtype=x.dtype, axis=ax):
        shards = [None] * p
        shards[r] = x
        for step in range(p - 1):
            comm.send(shards[(r - step) % p], (r + 1) % p)
            shards[(r - step - 1) % p] = comm.recv((r - 1) % p)
        return np.concatenate(shards, axis=ax)  # a new array: the input stays untouched


def _ring_all_gather_into(comm, pieces):
    """The all_gather ring on preallocated pieces: pieces[rank] is filled, the rest get received.

    Every rank knows every piece's shape, so the messages go without a header.
    """
    p, r = comm.world_size, comm.rank
    for step in range(p - 1):
        comm.send(pieces[(r - step) % p], (r + 1) % p, header=False)
        comm.recv((r - 1) % p, out=pieces[(r - step - 1) % p], header=False)


def all_reduce(comm, x, op="sum"):
    """Element-wise reduction (sum, max, min, prod) of ``x`` over all ranks, returned on every rank.

    Algorithm, the bandwidth-optimal ring: flatten x to N elements, reduce_scatter so that
    rank r owns the reduced chunk r (array_split of the N elements), then all-gather the
    chunks. Every chunk is received straight into its place in the output: reduce_scatter's
    last sum lands in chunk r, the all-gather fills the others (the chunk sizes are known,
    so no copy or concatenation is needed). Every rank ends with bit-identical results (the
    all-gather copies, it does not add).
    Cost per rank: 2(p-1) messages, 2 nbytes - nbytes(chunk r) - nbytes(chunk r+1) bytes
    sent, which is 2(p-1)/p of the array when p divides its size.
    """
    x = np.asarray(x)
    combine = _combine(op)
    with comm.collective("all_reduce", x, shape=x.shape, dtype=x.dtype, op=op):
        flat = x.reshape(-1)  # (N,): chunks balanced over all elements, whatever the shape
        out = np.empty_like(flat)
        pieces = np.array_split(out, comm.world_size)  # views: chunk r of the result
        _ring_reduce_scatter_into(comm, np.array_split(flat, comm.world_size), pieces[comm.rank], combine)
        _ring_all_gather_into(comm, pieces)
        return out.reshape(x.shape)


def ring_all_reduce_bytes(elements, itemsize, world_size, rank):
    """Bytes rank ``rank`` sends in all_reduce of ``elements`` numbers of ``itemsize`` bytes.

    The N elements are cut like numpy.array_split into p chunks; rank r sends every chunk
    but its own in the reduce-scatter and every chunk but chunk r+1 in the all-gather:
    2N - chunk_r - chunk_{r+1}, which is 2 (p-1)/p N when p divides N (0 when p = 1).
    """
    chunks = shard_sizes(int(elements), world_size)   # counted, never allocated: N may be 10^11
    return itemsize * (2 * int(elements) - chunks[rank] - chunks[(rank + 1) % world_size])


def ring_messages(world_size):
    """Messages each rank sends in all_reduce (the ring): p-1 in each half."""
    return 2 * (world_size - 1)


def broadcast(comm, x, root=0):
    """Return a copy of root's ``x`` on every rank (other ranks' ``x`` is ignored; pass None).

    Algorithm, binomial tree over ranks renumbered v = (rank - root) mod p: in round k the
    2^k ranks that already hold the data send it to v + 2^k. Rank v receives once, from
    v minus its lowest set bit, then forwards to v + 2^j for the lower bits j. Depth
    ceil(log2 p) rounds; the root sends ceil(log2 p) messages of the whole array.
    """
    _check_root(comm, root)
    p = comm.world_size
    v = (comm.rank - root) % p  # rank renumbered so that the root is 0
    with comm.collective("broadcast", x, root=root):
        if comm.rank == root:
            if x is None:
                raise ValueError(f"rank {root} is the broadcast root but passed no array")
            data = np.array(x, copy=True)
        mask = 1
        while mask < p:  # find the round in which v receives: its lowest set bit
            if v & mask:
                data = comm.recv((v - mask + root) % p)
                break
            mask <<= 1
        mask >>= 1
        while mask > 0:  # forward to the subtrees below
            if v + mask < p:
                comm.send(data, (v + mask + root) % p)
            mask >>= 1
        return data


def reduce(comm, x, root=0, op="sum"):
    """Reduce ``x`` over all ranks onto ``root``; returns the result on root and None elsewhere.

    Algorithm, binomial tree (broadcast run backwards): in round k, rank v with bit k set
    sends its partial to v - 2^k and drops out; the others add what v + 2^k sends them.
    Depth ceil(log2 p); every rank but the root sends exactly one message of the array.
    """
    x = np.asarray(x)
    combine = _combine(op)
    _check_root(comm, root)
    p = comm.world_size
    v = (comm.rank - root) % p
    with comm.collective("reduce", x, shape=x.shape, dtype=x.dtype, root=root, op=op):
        partial = np.array(x, copy=True)
        mask = 1
        while mask < p:
            if v & mask:
                comm.send(partial, (v - mask + root) % p, header=False)  # shapes agree: no header
                return None
            if v + mask < p:
                incoming = comm.recv((v + mask + root) % p, out=np.empty_like(partial), header=False)
                partial = combine(partial, incoming, out=partial)
            mask <<= 1
        return partial


def scatter(comm, x, root=0, axis=0):
    """Split root's ``x`` like np.array_split(x, p, axis) and return chunk r on rank r.

    Algorithm, direct: the root sends chunk d to each rank d (p-1 messages, N - chunk_root
    bytes); other ranks receive one message. Their ``x`` is ignored (pass None).
    """
    _check_root(comm, root)
    p = comm.world_size
    with comm.collective("scatter", x, root=root, axis=axis):
        if comm.rank != root:
            return comm.recv(root)
        if x is None:
            raise ValueError(f"rank {root} is the scatter root but passed no array")
        x = np.asarray(x)
        chunks = np.array_split(x, p, axis=_axis(x, axis, "scatter"))
        for dst in range(p):
            if dst != root:
                comm.send(chunks[dst], dst)
        return chunks[root].copy()


def gather(comm, x, root=0, axis=0):
    """Concatenate every rank's ``x`` along ``axis`` on ``root`` (rank order); None elsewhere.

    Algorithm, direct: every rank sends its shard to the root, which receives p-1 messages.
    """
    x = np.asarray(x)
    _check_root(comm, root)
    ax = _axis(x, axis, "gather")
    p = comm.world_size
    with comm.collective("gather", x, shape=_without(x.shape, ax), dtype=x.dtype,
                         root=root, axis=ax):
        if comm.rank != root:
            comm.send(x, root)
            return None
        shards = [x if src == root else comm.recv(src) for src in range(p)]
        return np.concatenate(shards, axis=ax)


def all_to_all(comm, x, split_axis, concat_axis):
    """Rank r sends chunk d of np.array_split(x, p, split_axis) to rank d, and concatenates
    the chunks it receives, in rank order, along ``concat_axis``.

    This re-shards an array: e.g. from Sharded(heads) to Sharded(sequence). Algorithm,
    pairwise exchange in p-1 steps: at step s send to r+s, receive from r-s.
    Cost per rank: p-1 messages, N - nbytes(chunk r) bytes sent.
    """
    x = np.asarray(x)
    sa = _axis(x, split_axis, "all_to_all")
    ca = _axis(x, concat_axis, "all_to_all")
    p, r = comm.world_size, comm.rank
    with comm.collective("all_to_all", x, shape=_without(x.shape, ca), dtype=x.dtype,
                         split_axis=sa, concat_axis=ca):
        chunks = np.array_split(x, p, axis=sa)
        received = [None] * p
        received[r] = chunks[r]
        for step in range(1, p):
            comm.send(chunks[(r + step) % p], (r + step) % p)
            received[(r - step) % p] = comm.recv((r - step) % p)
        return np.concatenate(received, axis=ca)


def exchange_counts(comm, send_counts):
    """Every rank learns how many rows each peer will send it: recv_counts[q] = send_counts_q[r].

    send_counts: (p,) or (p, m) non-negative integers, row d for rank d (m: e.g. one count per
    expert on rank d). This is the first half of a dispatch with uneven counts (MPI_Alltoallv,
    torch's all_to_all_single with split sizes): a receiver must know what arrives before it
    can allocate. It is itself an all_to_all of p equal blocks.
    Cost per rank: p-1 messages of 8 m bytes.
    """
    counts = np.asarray(send_counts)
    if (counts.ndim not in (1, 2) or counts.shape[0] != comm.world_size
            or counts.dtype.kind not in "iu" or (counts < 0).any()):
        raise ValueError(f"rank {comm.rank}: send_counts must be {comm.world_size} rows of "
                         f"non-negative integers, one per destination rank, got {send_counts!r}")
    return all_to_all(comm, counts.astype(np.int64), 0, 0)


def all_to_all_v(comm, x, send_counts, recv_counts):
    """Rank r sends rows [sum(c[:d]), sum(c[:d+1])) of ``x`` to rank d (c = send_counts) and
    returns the rows it receives, concatenated in source-rank order along axis 0.

    x: (n, ...) with n = sum(send_counts), its rows grouped by destination rank;
    recv_counts[q]: the rows rank q sends here (from ``exchange_counts``). Returns
    (sum(recv_counts), ...). Algorithm, pairwise exchange in p-1 steps: at step s send the
    block for r+s and receive the block from r-s straight into its place in the output (every
    size is known, so no header; an empty block is still one message, so the steps match).
    Cost per rank: p-1 messages, (n - send_counts[r]) * bytes per row sent.
    """
    x = np.asarray(x)
    _axis(x, 0, "all_to_all_v")
    p, r = comm.world_size, comm.rank
    send_counts, recv_counts = _counts(comm, send_counts, "send_counts"), _counts(comm, recv_counts, "recv_counts")
    if sum(send_counts) != x.shape[0]:
        raise ValueError(f"rank {r}: send_counts {send_counts} add up to {sum(send_counts)} rows, "
                         f"but x has {x.shape[0]}")
    with comm.collective("all_to_all_v", x, shape=x.shape[1:], dtype=x.dtype):
        starts = np.cumsum([0, *send_counts])
        out = np.empty((sum(recv_counts), *x.shape[1:]), x.dtype)
        out_starts = np.cumsum([0, *recv_counts])
        out[out_starts[r]:out_starts[r + 1]] = x[starts[r]:starts[r + 1]]  # this rank's own rows
        for step in range(1, p):
            dst, src = (r + step) % p, (r - step) % p
            comm.send(x[starts[dst]:starts[dst + 1]], dst, header=False)
            comm.recv(src, out=out[out_starts[src]:out_starts[src + 1]], header=False)
        return out


def _counts(comm, counts, what):
    """``counts`` as p plain ints, or a ValueError naming ``what`` (one row count per rank)."""
    array = np.asarray(counts)
    if array.shape != (comm.world_size,) or array.dtype.kind not in "iu" or (array < 0).any():
        raise ValueError(f"rank {comm.rank}: {what} must be {comm.world_size} non-negative "
                         f"integers, one per rank, got {counts!r}")
    return [int(c) for c in array]
