"""A non-blocking all-reduce: start it, compute something else, then wait for it.

    handle = all_reduce_async(comm, x)   # the first messages leave now
    ...                                  # compute that does not need the sum
    total = handle.wait()                # the same bits as collectives.all_reduce(comm, x)

It is Lesson 2's ring (reduce-scatter ring, then all-gather ring, the same additions in
the same order), written as a generator that stops at every message it needs: each step
sends with ``comm.isend``, posts ``comm.irecv`` and yields the request. The handle resumes
the generator when the request has arrived.

Progress is cooperative: the ring advances only inside ``start``, ``test`` and ``wait``.
What moves while the caller computes is what the backend moves on its own: gloo's threads
carry a posted isend/irecv to completion (torchrun); MPICH moves bytes only inside MPI
calls, so under mpiexec little more than the first small messages travel. The simulator has
nothing to move (a send lands in the mailbox at once). A progress thread per rank would
advance every step, but on a CPU it needs a core of its own, and in the simulator it would
make a rank two threads, which its deadlock diagnosis does not allow. The native
``dist.all_reduce(x, async_op=True)`` runs the whole collective on gloo's threads.

Rules: at most one non-blocking all-reduce in flight per communicator (its messages use the
separate non-blocking channel; a second one would share it), started in the same order on
every rank. Blocking collectives in between are allowed.
Cost per rank: the ring's, 2(p-1) messages and 2(p-1)/p of the array's bytes.
"""
import numpy as np

from tp_from_scratch.collectives import _combine


class AllReduceHandle:
    """A non-blocking all-reduce in flight: ``test()`` advances it without waiting, ``wait()``
    finishes it and returns the result (a new array, the same bits on every rank)."""

    name = "all_reduce_async"

    def __init__(self, comm, steps, result):
        self.comm, self.result = comm, result
        self._steps, self._request, self.done = steps, None, False

    def test(self):
        """Advance as far as the arrived messages allow; True when the all-reduce is complete."""
        return self._advance(block=False)

    def wait(self):
        """Advance to the end, waiting for each message (at most TP_TIMEOUT seconds each)."""
        self._advance(block=True)
        return self.result

    def _advance(self, block):
        if self.done:
            return True
        with self.comm.meter.resumed(self.name):  # book the traffic under all_reduce_async
            while True:
                if self._request is not None:
                    if block:
                        self._request.wait()
                    elif not self._request.test():
                        return False
                try:
                    self._request = next(self._steps)
                except StopIteration:
                    self.done, self._request = True, None
                    self.comm.nonblocking_in_flight = None
                    return True


def all_reduce_async(comm, x, op="sum"):
    """Start an all-reduce of ``x`` (sum, max, min, prod) and return its AllReduceHandle.

    ``handle.wait()`` returns what ``collectives.all_reduce(comm, x, op)`` returns, bit for
    bit. ``x`` is copied at once: the caller may overwrite it after this call returns.
    """
    x = np.asarray(x)
    combine = _combine(op)
    if getattr(comm, "nonblocking_in_flight", None) is not None:
        raise RuntimeError(f"rank {comm.rank}: an all_reduce_async is already in flight on this "
                           "communicator; wait() for it before starting another")
    with comm.collective(AllReduceHandle.name, x, shape=x.shape, dtype=x.dtype, op=op):
        pass  # counted and (on the simulator, or under TP_DEBUG=1) checked across ranks here
    flat = np.array(x, copy=True).reshape(-1)  # (N,): the caller may reuse x at once
    out = np.empty_like(flat)
    handle = AllReduceHandle(comm, _ring_steps(comm, flat, out, combine), out.reshape(x.shape))
    comm.nonblocking_in_flight = handle
    handle.test()  # the first step: send the first partial, post the first receive
    return handle


def _ring_steps(comm, flat, out, combine):
    """collectives.all_reduce's ring, yielding each posted receive until it has arrived."""
    p, r = comm.world_size, comm.rank
    right, left = (r + 1) % p, (r - 1) % p
    chunks = np.array_split(flat, p)  # views into this rank's copy of x
    pieces = np.array_split(out, p)   # views: chunk c of the result
    partial = chunks[left]
    for step in range(p - 1):  # reduce-scatter: chunk r's sum ends in pieces[r]
        comm.isend(partial, right)
        mine = chunks[(r - step - 2) % p]
        buffer = pieces[r] if step == p - 2 else np.empty(mine.shape, mine.dtype)
        yield comm.irecv(left, buffer)
        partial = combine(buffer, mine, out=buffer)
    if p == 1:
        pieces[0][...] = chunks[0]
    for step in range(p - 1):  # all-gather: forward the chunk received last
        comm.isend(pieces[(r - step) % p], right)
        yield comm.irecv(left, pieces[(r - step - 1) % p])
