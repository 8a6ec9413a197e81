"""MPIComm: the communicator over mpi4py, for scripts launched with ``mpiexec -n N``.

A message is two MPI messages: a small pickled header (shape, dtype) and the payload as raw
bytes (skipped when empty). Sends are non-blocking (Isend of a private copy) so that a ring
step ``send(right); recv(left)`` cannot deadlock on large arrays. Every wait polls with a
deadline (TP_TIMEOUT, default 30 s) instead of blocking in MPI: a peer that exited early
turns into a CommTimeoutError naming it, never a hang. ``abort`` calls MPI Abort, which makes
mpiexec kill every rank.
"""
import time

import numpy as np

from .base import Comm, debug_from_env, timeout_from_env
from .errors import CommTimeoutError

try:
    from mpi4py import MPI
except ImportError as error:  # pragma: no cover - depends on the installation
    raise ImportError(
        "MPI is not available: install it with `pip install mpi4py mpich` (or your system's MPI"
        " and `pip install mpi4py`); `make doctor` checks it") from error


def _wait_until(done, deadline, on_timeout):
    """Poll ``done()`` until True; spin briefly, then sleep up to 1 ms between polls."""
    polls, delay = 0, 1e-5
    while not done():
        if time.monotonic() > deadline:
            raise CommTimeoutError(on_timeout())
        polls += 1
        if polls > 50:  # spinning longer only steals the core from a peer on a busy laptop
            time.sleep(delay)
            delay = min(delay * 2, 1e-3)


class MPIComm(Comm):
    """Communicator over an mpi4py communicator (default MPI.COMM_WORLD)."""

    def __init__(self, mpi_comm=None, timeout=None, debug=None):
        self.mpi = MPI.COMM_WORLD if mpi_comm is None else mpi_comm
        super().__init__(self.mpi.Get_rank(), self.mpi.Get_size())
        self.timeout = timeout_from_env() if timeout is None else float(timeout)
        self.debug = debug_from_env() if debug is None else bool(debug)
        self._pending = []  # (requests, buffers) of sends that may still be in flight

    def _raw_send(self, array, dst, tag):
        data = np.array(array, copy=True, order="C")  # MPI reads it after we return
        requests = [self.mpi.isend((data.shape, data.dtype.str), dst, 2 * tag)]
        if data.nbytes:
            requests.append(self.mpi.Isend([data.reshape(-1).view(np.uint8), MPI.BYTE], dst, 2 * tag + 1))
        self._pending.append((requests, data))
        self._pending = [(reqs, buf) for reqs, buf in self._pending
                         if not all(req.Test() for req in reqs)]

    def _raw_recv(self, src, tag):
        deadline = time.monotonic() + self.timeout
        what = f"a message from rank {src}"
        _wait_until(lambda: self.mpi.Iprobe(source=src, tag=2 * tag), deadline,
                    lambda: self._timeout_message(what, src))
        shape, dtype = self.mpi.recv(source=src, tag=2 * tag)
        data = np.empty(shape, dtype=np.dtype(dtype))
        if data.nbytes:
            request = self.mpi.Irecv([data.reshape(-1).view(np.uint8), MPI.BYTE], src, 2 * tag + 1)
            _wait_until(request.Test, deadline, lambda: self._timeout_message(what, src))
        return data

    def barrier(self):
        """Wait until every rank reaches the barrier (at most TP_TIMEOUT seconds)."""
        request = self.mpi.Ibarrier()
        _wait_until(request.Test, time.monotonic() + self.timeout,
                    lambda: self._timeout_message("every rank to reach the barrier"))

    def close(self):
        """Wait (bounded) until every send was delivered, so MPI can finalize cleanly."""
        deadline = time.monotonic() + self.timeout
        for requests, _ in self._pending:
            for req in requests:
                _wait_until(req.Test, deadline,
                            lambda: self._timeout_message("its sent messages to be received"))
        self._pending = []

    def abort(self, code=1):
        """End the whole job now: mpiexec kills every rank."""
        self.mpi.Abort(code)
