"""The collective matmul: all-gather -> matmul and matmul -> reduce-scatter as p-step ring loops
that move the next chunk while multiplying the current one (numpy, on a Comm).

With sequence parallelism (Lesson 7) a column-parallel layer all-gathers its input along T
and then multiplies; a row-parallel layer multiplies and then reduce-scatters along T. Done
one after the other, the matmul waits for the whole collective. But both collectives are
rings of p - 1 steps (Lesson 2), and each step carries one sequence chunk, which is all a
matmul of that chunk's rows needs. So interleave them (Wang et al. 2022, "Overlap
communication with dependent computation via decomposition"; PyTorch's async TP,
``fused_all_gather_matmul`` / ``fused_matmul_reduce_scatter``):

all_gather_matmul, step s = 0 .. p-1 on rank r (chunk c = (r - s) mod p, its own first):
    isend chunk c to r+1, irecv chunk c-1 from r-1     (not at the last step)
    Y[c] = X[c] @ W                                     while chunk c-1 is on the wire
    wait for chunk c-1

matmul_reduce_scatter (chunk r's sum must end on rank r, as in collectives.reduce_scatter):
    isend P = X[r-1] @ W to r+1
    step s = 0 .. p-2: irecv the partial of chunk c = r-s-2 from r-1
                       M = X[c] @ W                     while that partial is on the wire
                       wait; P = incoming + M; isend P to r+1 (the last P is this rank's result)

The messages are exactly the ring all-gather's / reduce-scatter's (the meter shows the same
messages and bytes as the un-fused collectives), and every addition is the ring's, in the
ring's order. What differs from the un-fused "all-gather, then one matmul" is only that
BLAS multiplies p blocks of rows instead of one: it picks its kernel and blocking by matrix
shape, so an element of X[c] @ W can differ from the same element of X @ W in the last bits
(measured here with OpenBLAS and torch: most shapes differ somewhere). With integer-valued
inputs (exact in any order) the two are bit-identical, which the tests check; with gaussian
inputs they agree within the tolerance policy.

Progress: the sends are isend (buffered, the same non-blocking channel as all_reduce_async),
the receive is posted before the matmul (gloo's threads move it meanwhile; MPICH only inside
MPI calls, so under mpiexec much of the transfer still happens in the wait). A non-blocking
all-reduce in flight on the same communicator would share that channel: refused.

Shards follow numpy.array_split along T (the first T % p ranks hold one more position), as
everywhere in Lesson 7. The all-gather side needs every rank's shard length before the first
receive (the messages carry no header): pass ``sizes`` (every rank's T_r), or None for equal
shards; a shard that does not fit the rule raises a ValueError naming the rank, and ranks
that assume different T disagree in the collective's fingerprint (always checked on the
simulator, under TP_DEBUG=1 on mpiexec and torchrun).

Layers (the numpy pair of ``sequence_parallel.linear``, same caches, same gradients):
    column_linear_forward / _backward   forward all_gather_matmul, backward dX by matmul_reduce_scatter
    row_linear_forward / _backward      forward matmul_reduce_scatter, backward dX by all_gather_matmul
"""
import time

import numpy as np

from tp_from_scratch.sharding import shard_sizes

SEQUENCE_AXIS = 1  # activations are (B, T, H)


# ---------------------------------------------------------------------------------------
# The link: who moves the chunks (a Comm here; a torch ProcessGroup in collective_matmul_nn)
# ---------------------------------------------------------------------------------------

class CommLink:
    """Chunks over a tp_from_scratch Comm: comm.isend / comm.irecv on numpy arrays.

    (collective_matmul_nn's TensorCommLink hands it torch tensors' own memory as numpy arrays.)
    """

    def __init__(self, comm):
        if getattr(comm, "nonblocking_in_flight", None) is not None:
            raise RuntimeError(f"rank {comm.rank}: an all_reduce_async is in flight on this communicator; "
                               "the collective matmul uses the same non-blocking channel: wait() for it first")
        self.comm, self.rank, self.world_size = comm, comm.rank, comm.world_size

    def send(self, chunk, dst):
        self.comm.isend(chunk, dst)

    def recv(self, src, out):
        return self.comm.irecv(src, out)

    def finish(self):
        """Nothing to wait for: Comm.isend copies (its sends are waited for with the collective's)."""


class Steps:
    """Optional wall-clock record of one loop: [(what, start, stop)], what in matmul/send/wait.

    ``exposed`` is the communication the matmuls did not hide: time in sends and waits.
    """

    def __init__(self):
        self.events = []

    def timed(self, what, fn, *args):
        start = time.perf_counter()
        result = fn(*args)
        self.events.append((what, start, time.perf_counter()))
        return result

    def total(self, what):
        return sum(stop - start for name, start, stop in self.events if name == what)

    @property
    def exposed(self):
        return self.total("send") + self.total("wait")


def _call(steps, what, fn, *args):
    return fn(*args) if steps is None else steps.timed(what, fn, *args)


def check_sizes(rank, world_size, local_length, sizes):
    """Every rank's shard length along T: ``sizes`` checked against the array_split rule, or,
    for sizes=None, equal shards of this rank's length. Raises a ValueError naming the rank."""
    sizes = [local_length] * world_size if sizes is None else [int(n) for n in sizes]
    total = sum(sizes)
    if len(sizes) != world_size or sizes != shard_sizes(total, world_size) or local_length != sizes[rank]:
        raise ValueError(f"rank {rank}: sequence shard of length {local_length} with shard sizes {sizes}; "
                         f"splitting T={total} over t={world_size} ranks gives {shard_sizes(total, world_size)} "
                         "(array_split rule; pass sizes= for an uneven split)")
    return sizes


# ---------------------------------------------------------------------------------------
# The two loops, written once for numpy arrays and torch tensors
# ---------------------------------------------------------------------------------------

def all_gather_matmul_loop(link, shard, empty, matmul, steps=None):
    """Ring all-gather of ``shard`` along axis 1 with ``matmul`` applied to each chunk as it
    is in hand. Returns (pieces, products): pieces[c] is rank c's shard (B, T_c, ...),
    products[c] = matmul(pieces[c]); the caller concatenates.

    empty(c): a new, contiguous buffer of rank c's shard shape (to receive into).
    Cost per rank: p - 1 messages, every shard but shard (r+1) mod p sent (the ring all-gather's).
    """
    p, r = link.world_size, link.rank
    right, left = (r + 1) % p, (r - 1) % p
    pieces, products = [None] * p, [None] * p
    pieces[r] = shard
    for step in range(p):
        c = (r - step) % p  # the chunk in hand
        request = None
        if step < p - 1:
            _call(steps, "send", link.send, pieces[c], right)
            pieces[(c - 1) % p] = empty((c - 1) % p)
            request = link.recv(left, pieces[(c - 1) % p])
        products[c] = _call(steps, "matmul", matmul, pieces[c])  # while chunk c-1 travels
        if request is not None:
            _call(steps, "wait", request.wait)
    link.finish()
    return pieces, products


def matmul_reduce_scatter_loop(link, chunks, matmul, steps=None):
    """Ring reduce-scatter of matmul(chunks[c]) over the ranks, the products computed one step
    ahead of the partial they are added to. Returns this rank's sum, matmul(chunks[r]) summed
    over ranks in collectives.reduce_scatter's order (incoming partial + own product).

    chunks: this rank's input cut along T (array_split), views are fine.
    Cost per rank: p - 1 messages, every chunk's product but chunk r's sent.
    """
    p, r = link.world_size, link.rank
    right, left = (r + 1) % p, (r - 1) % p
    partial = _call(steps, "matmul", matmul, chunks[(r - 1) % p])  # (B, T_{r-1}, out)
    for step in range(p - 1):
        _call(steps, "send", link.send, partial, right)
        c = (r - step - 2) % p
        mine = _call(steps, "matmul", matmul, chunks[c])  # while the partial of chunk c travels
        incoming = mine.new_empty(mine.shape) if hasattr(mine, "new_empty") else np.empty_like(mine)
        _call(steps, "wait", link.recv(left, incoming).wait)
        incoming += mine  # this rank's own buffer: add in place, incoming first as in the ring
        partial = incoming
    link.finish()
    return partial


# ---------------------------------------------------------------------------------------
# numpy on a Comm
# ---------------------------------------------------------------------------------------

def all_gather_matmul(comm, x_shard, w, sizes=None, steps=None):
    """(x, x @ w): the all-gather of x_shard along T and its product with w, overlapped.

    x_shard (B, T_r, in) Sharded(1); w (in, out). Returns x (B, T, in) Replicated (a new array)
    and y = x @ w (B, T, out). sizes: every rank's T_r (array_split of T), None for equal shards.
    Same messages as collectives.all_gather(comm, x_shard, axis=1), metered as all_gather_matmul.
    """
    x_shard = np.asarray(x_shard)
    sizes = check_sizes(comm.rank, comm.world_size, x_shard.shape[SEQUENCE_AXIS], sizes)
    with comm.collective("all_gather_matmul", x_shard, shape=(x_shard.shape[0], "*", *x_shard.shape[2:]),
                         dtype=x_shard.dtype, sizes=sizes):
        link = CommLink(comm)
        shape = lambda c: (x_shard.shape[0], sizes[c], *x_shard.shape[2:])  # noqa: E731
        pieces, products = all_gather_matmul_loop(link, x_shard, lambda c: np.empty(shape(c), x_shard.dtype),
                                                  lambda piece: piece @ w, steps)
        return np.concatenate(pieces, axis=SEQUENCE_AXIS), np.concatenate(products, axis=SEQUENCE_AXIS)


def matmul_reduce_scatter(comm, x, w, steps=None):
    """This rank's chunk along T of the sum over ranks of x @ w, the ring overlapped with the matmuls.

    x (B, T, in) on each rank (e.g. Sharded(-1) activations, a Partial product); w (in, out).
    Returns (B, T_r, out), T_r by array_split. Same messages as
    collectives.reduce_scatter(comm, x @ w, axis=1), metered as matmul_reduce_scatter.
    """
    x = np.asarray(x)
    # the contraction width may differ from rank to rank (in/t of an uneven split); the rest may not
    with comm.collective("matmul_reduce_scatter", x, shape=(*x.shape[:-1], "*"), dtype=x.dtype, out=w.shape[-1]):
        link = CommLink(comm)
        return matmul_reduce_scatter_loop(link, np.array_split(x, comm.world_size, axis=SEQUENCE_AXIS),
                                          lambda chunk: chunk @ w, steps)


def column_linear_forward(comm, x_shard, w_shard, b_shard, sizes=None):
    """Y_i = all_gather_T(x_r) @ W_i + b_i, with the all-gather overlapped. Returns (y (B, T, out/t), cache).

    x_shard (B, T_r, in) Sharded(1); w_shard (in, out/t); b_shard (out/t,) or None.
    The cache is linear_forward's (the gathered x is kept for dW), as in
    sequence_parallel.linear.sequence_parallel_column_linear_forward.
    forward: all-gather(T) fused with the matmul; backward: reduce-scatter(T) fused with dX's matmul.
    """
    x, y = all_gather_matmul(comm, x_shard, w_shard, sizes)
    if b_shard is not None:
        y = y + b_shard
    return y, (x, w_shard, b_shard is not None)


def column_linear_backward(comm, dy_local, cache):
    """dx_r = reduce_scatter_T(dy_i @ W_i^T), overlapped; dW_i = x^T dy_i, db_i = sum dy_i (no communication).

    Returns (dx_shard (B, T_r, in), dw_shard (in, out/t), db_shard or None).
    """
    x, w, has_bias = cache
    dx = matmul_reduce_scatter(comm, dy_local, w.T)
    x2, dy2 = x.reshape(-1, x.shape[-1]), dy_local.reshape(-1, dy_local.shape[-1])
    return dx, x2.T @ dy2, dy2.sum(axis=0) if has_bias else None


def row_linear_forward(comm, x_local, w_shard, b):
    """y_r = reduce_scatter_T(x_i @ W_i) + b, with the reduce-scatter overlapped. Returns (y (B, T_r, out), cache).

    x_local (B, T, in/t) Sharded(-1); w_shard (in/t, out); b (out,) Replicated or None.
    forward: matmul fused with reduce-scatter(T); backward: all-gather(T) of dy fused with dX's matmul.
    """
    y = matmul_reduce_scatter(comm, x_local, w_shard)
    if b is not None:
        y = y + b
    return y, (x_local, w_shard, b is not None, x_local.shape[SEQUENCE_AXIS])


def row_linear_backward(comm, dy_shard, cache):
    """dX_i = all_gather_T(dy_r) @ W_i^T, overlapped; dW_i = x_i^T dy, db = sum of the gathered dy.

    Returns (dx_local (B, T, in/t), dw_shard (in/t, out), db (out,) or None); db is the full
    bias gradient, the same on every rank (as in sequence_parallel.linear).
    """
    x, w, has_bias, length = cache
    dy, dx = all_gather_matmul(comm, dy_shard, w.T, shard_sizes(length, comm.world_size))
    x2, dy2 = x.reshape(-1, x.shape[-1]), dy.reshape(-1, dy.shape[-1])
    return dx, x2.T @ dy2, dy2.sum(axis=0) if has_bias else None


# ---------------------------------------------------------------------------------------
# What the overlap can buy: the alpha-beta-gamma model of one all-gather -> matmul
# ---------------------------------------------------------------------------------------

def predicted_all_gather_matmul(tokens, in_features, out_per_rank, t, flops, alpha, beta, itemsize=4,
                                own_engine=True):
    """{unfused, fused, exposed_unfused, exposed_fused, matmul, all_gather} seconds of
    x (tokens/t, in) --all-gather--> (tokens, in) @ W (in, out/t) on one rank.

    Each ring step moves one chunk of tokens/t rows (alpha + chunk bytes * beta) and the
    matmul of one chunk takes 2 (tokens/t) in out/t / flops. Un-fused: the p-1 ring steps, then
    the whole matmul. Fused: p steps, each as long as the longer of its chunk's matmul and its
    transfer when the interconnect has an engine of its own (own_engine=True: a GPU's NVLink
    and copy engines; NCCL still borrows a few SMs, ignored here), or the sum of the two when
    one core does both (own_engine=False: a CPU rank with one core, where the copy needs the
    core the matmul runs on). The last step has nothing left to receive. The same numbers
    hold for matmul -> reduce-scatter (the same chunks, the other direction, plus the additions).
    """
    chunk_matmul = 2 * tokens / t * in_features * out_per_rank / flops
    chunk_send = alpha + tokens / t * in_features * itemsize * beta
    all_gather = (t - 1) * chunk_send
    fused_step = max(chunk_matmul, chunk_send) if own_engine else chunk_matmul + chunk_send
    fused = (t - 1) * fused_step + chunk_matmul
    matmul = t * chunk_matmul
    return {"matmul": matmul, "all_gather": all_gather, "unfused": all_gather + matmul, "fused": fused,
            "exposed_unfused": all_gather, "exposed_fused": fused - matmul}
