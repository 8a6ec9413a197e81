"""MPIComm: the communicator over mpi4py, for scripts launched with ``.venv/bin/mpiexec -n N``.

A message is two MPI messages: a small pickled header (shape, dtype) and the payload as raw
bytes (skipped when empty); with header=False, the payload alone. Sends are non-blocking
(Isend of a private copy) so that a ring step ``send(right); recv(left)`` cannot deadlock on
large arrays. Every wait polls with a
deadline (TP_TIMEOUT, default 30 s) instead of blocking in MPI: a peer that exited early
turns into a CommTimeoutError naming it, never a hang. ``abort`` calls MPI Abort, which makes
mpiexec kill every rank.
"""
import os
import sys
import time

import numpy as np

from .base import TAG_DATA, Comm, debug_from_env, timeout_from_env
from .errors import CommTimeoutError

SPIN = 0.05  # seconds of busy polling before a wait starts to sleep

try:
    from mpi4py import MPI
except ImportError as error:  # pragma: no cover - depends on the installation
    raise ImportError(
        "MPI is not available: install it with `pip install mpi4py mpich` (or your system's MPI"
        " and `pip install mpi4py`); `make doctor` checks it") from error


ABORT_GRACE = 0.5  # seconds for mpiexec to forward the last messages before an abort

# give the core to another process; sleep(0) where the OS has no sched_yield
_yield_core = getattr(os, "sched_yield", lambda: time.sleep(0))


def _wait_until(done, deadline, on_timeout):
    """Poll ``done()`` until True, raising CommTimeoutError after ``deadline``.

    It spins for the first SPIN seconds: MPI moves a large message only while both sides
    call into it, so a sleeping receiver would starve the transfer. While spinning it yields
    the core between polls: with more ranks than cores (4 ranks on a 2-core laptop) a pure
    spin takes the core from the very rank it waits for. After SPIN it sleeps up to 1 ms
    between polls, so a rank waiting long for a slow peer leaves the core to it.
    """
    start = time.monotonic()
    delay = 1e-5
    while not done():
        now = time.monotonic()
        if now > deadline:
            raise CommTimeoutError(on_timeout())
        if now - start > SPIN:
            time.sleep(delay)
            delay = min(delay * 2, 1e-3)
        else:
            _yield_core()


class MPIComm(Comm):
    """Communicator over an mpi4py communicator (default MPI.COMM_WORLD)."""

    def __init__(self, mpi_comm=None, timeout=None, debug=None):
        self.mpi = MPI.COMM_WORLD if mpi_comm is None else mpi_comm
        super().__init__(self.mpi.Get_rank(), self.mpi.Get_size())
        self.timeout = timeout_from_env() if timeout is None else float(timeout)
        self.debug = debug_from_env() if debug is None else bool(debug)
        self._pending = []  # (requests, buffers) of sends that may still be in flight

    def _raw_send(self, array, dst, tag, header=True):
        # MPI reads the buffer after we return, so a plain send copies it: the caller may
        # overwrite its array at once. Inside a collective the buffers are the collective's
        # own, left untouched until _collective_done waits for the sends: no copy needed.
        inside = self.meter.current is not None and tag == TAG_DATA
        # np.asarray, not np.ascontiguousarray: that one turns a 0-d array into shape (1,)
        data = np.asarray(array, order="C") if inside else np.array(array, copy=True, order="C")
        requests = [self.mpi.isend((data.shape, data.dtype.str), dst, 2 * tag)] if header else []
        if data.nbytes:
            requests.append(self.mpi.Isend([data.reshape(-1).view(np.uint8), MPI.BYTE], dst, 2 * tag + 1))
        self._pending.append((requests, data))
        self._pending = [(reqs, buf) for reqs, buf in self._pending
                         if not all(req.Test() for req in reqs)]

    def _raw_recv(self, src, tag, out=None, header=True):
        deadline = time.monotonic() + self.timeout
        what = f"a message from rank {src}"
        if header:
            _wait_until(lambda: self.mpi.Iprobe(source=src, tag=2 * tag), deadline,
                        lambda: self._timeout_message(what, src))
            shape, dtype = self.mpi.recv(source=src, tag=2 * tag)
            shape, dtype = tuple(shape), np.dtype(dtype)
            self._check_out(out, shape, dtype, src)
        else:  # the caller's buffer says what arrives
            shape, dtype = out.shape, out.dtype
        direct = out is not None and out.flags.c_contiguous  # MPI can write straight into it
        data = out if direct else np.empty(shape, dtype=dtype)
        if data.nbytes:
            status = MPI.Status()
            request = self.mpi.Irecv([data.reshape(-1).view(np.uint8), MPI.BYTE], src, 2 * tag + 1)
            _wait_until(lambda: request.Test(status), deadline,
                        lambda: self._timeout_message(what, src))
            received = status.Get_count(MPI.BYTE)
            if received != data.nbytes:  # MPI accepts a shorter message than the buffer
                raise ValueError(
                    f"rank {self.rank}: recv from rank {src} into a buffer of shape {tuple(shape)} "
                    f"and dtype {dtype} ({data.nbytes} bytes) got a message of {received} bytes; "
                    "with header=False both sides must agree on the shape")
        if out is not None and not direct:
            np.copyto(out, data)
            return out
        return data

    def _raw_irecv(self, src, tag, out):
        # the receive is posted now, so MPI can match the message whenever it is in an MPI
        # call (MPICH moves data only inside MPI calls: no background progress by default)
        data = out if out.flags.c_contiguous else np.empty(out.shape, out.dtype)
        if not data.nbytes:  # an empty payload is never sent (see _raw_send)
            return (lambda: True), (lambda: None)
        status = MPI.Status()
        request = self.mpi.Irecv([data.reshape(-1).view(np.uint8), MPI.BYTE], src, 2 * tag + 1)

        def finish():
            if status.Get_count(MPI.BYTE) != data.nbytes:
                raise ValueError(f"rank {self.rank}: irecv from rank {src} into {data.nbytes} bytes "
                                 f"got a message of {status.Get_count(MPI.BYTE)} bytes")
            if data is not out:
                np.copyto(out, data)

        def test():
            if not request.Test(status):
                return False
            finish()
            return True

        def wait():
            _wait_until(lambda: request.Test(status), time.monotonic() + self.timeout,
                        lambda: self._timeout_message(f"a message from rank {src}", src))
            finish()

        return test, wait

    def barrier(self):
        """Wait until every rank reaches the barrier (at most TP_TIMEOUT seconds)."""
        request = self.mpi.Ibarrier()
        _wait_until(request.Test, time.monotonic() + self.timeout,
                    lambda: self._timeout_message("every rank to reach the barrier"))

    def _collective_done(self):
        self.close()  # the collective's buffers may be handed back to the caller now

    def close(self):
        """Wait (bounded) until every send was delivered, so MPI can finalize cleanly."""
        deadline = time.monotonic() + self.timeout
        for requests, _ in self._pending:
            for req in requests:
                _wait_until(req.Test, deadline,
                            lambda: self._timeout_message("its sent messages to be received"))
        self._pending = []

    def abort(self, code=1):
        """End the whole job now: mpiexec kills every rank.

        First a short pause: mpiexec forwards each rank's output through its own proxy, and
        an abort that follows a message at once can kill the job before the message is
        forwarded (seen: a job that ended with exit 1 and no output at all, 1 run in 25).
        """
        sys.stdout.flush()
        sys.stderr.flush()
        time.sleep(ABORT_GRACE)
        self.mpi.Abort(code)
