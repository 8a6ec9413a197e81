"""Ranks as threads in one Python process: run SPMD code on a laptop, and never hang.

``run_spmd(fn, world_size)`` calls ``fn(comm, ...)`` once per rank, each in its own thread,
with a SimulatedComm whose messages go through in-memory mailboxes (one FIFO queue per
(sender, receiver) pair). All ranks share one lock and one condition variable, which is what
lets the simulator see the whole world at once and diagnose it:

* deadlock: when every rank that has not returned waits in recv or barrier and none of the
  awaited messages exists, no rank can ever move again. The rank that notices raises
  DeadlockError naming who waits on whom, within milliseconds, not after a timeout;
* waiting for a message from a rank that has already returned is reported the same way;
* a timeout (TP_TIMEOUT, default 30 s, or run_spmd's ``timeout``) bounds every wait, as a
  backstop for ranks that compute forever while others wait;
* the k-th collective call on every rank must have the same fingerprint, or the late rank
  raises CollectiveMismatchError ("rank 2 is in all_reduce, rank 0 is in all_gather");
* the first exception on any rank stops every other rank at its next send/recv/barrier, and
  run_spmd raises SPMDError in the caller, naming the rank and carrying its traceback.
"""
import ctypes
import os
import threading
import time
import traceback
from collections import deque
from pathlib import Path

import numpy as np

from .base import Comm, mismatch_error, timeout_from_env
from .errors import CommError, CommTimeoutError, DeadlockError, RankStopped, SPMDError

_COMM_DIR = str(Path(__file__).resolve().parent)
_STDLIB_DIR = os.path.dirname(threading.__file__)
_GRACE = 1.0  # seconds the caller waits for the other ranks to stop after a failure

RUNNING, DONE = "running", "done"


class _World:
    """State shared by the ranks of one run_spmd call; every field is guarded by ``cond``."""

    def __init__(self, world_size, timeout):
        self.world_size = world_size
        self.timeout = timeout
        self.cond = threading.Condition()
        self.mailbox = {}                       # (src, dst, tag) -> deque of (array, header)
        self.state = [RUNNING] * world_size     # RUNNING | DONE | ("recv", src, tag) | ("barrier", gen)
        self.inside = [None] * world_size       # collective each rank is in, for messages
        self.barrier_count = 0
        self.barrier_gen = 0
        self.collective_log = {}                # call index -> (first rank, fingerprint, ranks seen)
        self.failure = None                     # (rank, exception, traceback text) of the first failure
        self.errors = {}                        # rank -> (exception, traceback text)

    # ---- diagnosis (caller holds cond) -------------------------------------------------
    def describe(self, rank):
        st = self.state[rank]
        where = f" (in {self.inside[rank]})" if self.inside[rank] else ""
        if st == DONE:
            return f"rank {rank} has returned"
        if st == RUNNING:
            return f"rank {rank} is running (not in send/recv/barrier){where}"
        if st[0] == "recv":
            return f"rank {rank} waits for a message from rank {st[1]}{where}"
        return f"rank {rank} waits in barrier{where}"

    def stuck(self, rank):
        """True if ``rank`` waits for something that is not there now."""
        st = self.state[rank]
        if st in (RUNNING, DONE):
            return False
        if st[0] == "recv":
            return not self.mailbox.get((st[1], rank, st[2]))
        return st[1] == self.barrier_gen

    def find_deadlock(self, rank):
        """A message if the world can never move again (or ``rank`` waits on a returned rank)."""
        st = self.state[rank]
        if st[0] == "recv" and self.state[st[1]] == DONE and not self.mailbox.get((st[1], rank, st[2])):
            return f"deadlock: {self.describe(rank)}, which has already returned"
        if st[0] == "barrier" and DONE in self.state:
            gone = [r for r, s in enumerate(self.state) if s == DONE]
            return (f"deadlock: {self.describe(rank)}, but rank(s) {gone} have already returned"
                    " without reaching it")
        live = [r for r in range(self.world_size) if self.state[r] != DONE]
        if all(self.stuck(r) for r in live):
            return "deadlock: " + "; ".join(self.describe(r) for r in range(self.world_size))
        return None

    def fail(self, rank, error, tb=""):
        """Record the first failure and wake every rank so it can stop."""
        if self.failure is None:
            self.failure = (rank, error, tb)
        elif self.failure[1] is error and tb:
            self.failure = (rank, error, tb)  # the detecting rank adds its traceback later
        self.cond.notify_all()


class SimulatedComm(Comm):
    """The communicator run_spmd hands to each rank: mailboxes in memory, shared with its peers."""

    checks_collectives = True  # always: the simulator sees every rank at no cost

    def __init__(self, world, rank):
        super().__init__(rank, world.world_size)
        self._world = world

    def _stop_if_failed(self):
        failure = self._world.failure
        if failure is None:
            return
        error = failure[1]
        if isinstance(error, (DeadlockError, CommTimeoutError)) and failure[0] != self.rank:
            # each waiting rank raises the same diagnosis, with its own traceback (where it waits)
            raise type(error)(str(error))
        raise RankStopped()

    def _wait(self, state):
        """Block in ``state`` until it is satisfied; raise on deadlock, failure or timeout."""
        w = self._world
        w.state[self.rank] = state
        w.inside[self.rank] = self.meter.current
        deadline = time.monotonic() + w.timeout
        try:
            while w.stuck(self.rank):
                self._stop_if_failed()
                message = w.find_deadlock(self.rank)
                if message:
                    error = DeadlockError(message)
                    w.fail(self.rank, error)
                    raise error
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    error = CommTimeoutError(
                        f"timeout: rank {self.rank} waited {w.timeout:g} s; "
                        + "; ".join(w.describe(r) for r in range(w.world_size)))
                    w.fail(self.rank, error)
                    raise error
                w.cond.wait(remaining)
        finally:
            w.state[self.rank] = RUNNING

    def _raw_send(self, array, dst, tag, header=True):
        w = self._world
        with w.cond:
            self._stop_if_failed()
            # a private copy: the sender may overwrite its array right after send returns
            w.mailbox.setdefault((self.rank, dst, tag), deque()).append((np.array(array, copy=True), header))
            w.cond.notify_all()

    def _raw_recv(self, src, tag, out=None, header=True):
        w = self._world
        with w.cond:
            self._stop_if_failed()
            self._wait(("recv", src, tag))
            message, sent_with_header = w.mailbox[(src, self.rank, tag)].popleft()
        if sent_with_header != header:
            # MPI or gloo would leave a header queued for a later recv (wrong shapes from then
            # on) or wait for one that never comes; nccl, which has no tags, would read it as data
            said = {True: "with a header", False: "without a header (header=False)"}
            raise CommError(
                f"rank {src} sent rank {self.rank} a message {said[sent_with_header]}, but rank "
                f"{self.rank} receives it {said[header]}: both sides must pass the same header=")
        if out is None:
            return message
        self._check_out(out, message.shape, message.dtype, src)
        np.copyto(out, message)
        return out

    def _raw_irecv(self, src, tag, out):
        # Cooperative progress: nothing moves in the background. A send already lands in the
        # mailbox; test() looks there, wait() is a plain recv (with the deadlock diagnosis).
        # A progress thread would make a rank two threads, and the diagnosis above assumes
        # that each rank is one thread, either running or waiting in one place.
        w = self._world

        def test():
            with w.cond:
                self._stop_if_failed()
                if not w.mailbox.get((src, self.rank, tag)):
                    return False
            self._raw_recv(src, tag, out, header=False)  # there now: returns at once
            return True

        return test, lambda: self._raw_recv(src, tag, out, header=False)

    def barrier(self):
        """Wait until every rank has reached the barrier (deadlock-checked like recv)."""
        w = self._world
        with w.cond:
            self._stop_if_failed()
            gen = w.barrier_gen
            w.barrier_count += 1
            if w.barrier_count == w.world_size:
                w.barrier_count, w.barrier_gen = 0, gen + 1
                w.cond.notify_all()
                return
            self._wait(("barrier", gen))

    def _check_collective(self, index, fingerprint):
        w = self._world
        with w.cond:
            self._stop_if_failed()
            first = w.collective_log.get(index)
            if first is None:
                w.collective_log[index] = [self.rank, fingerprint, 1]
                return
            first_rank, first_fp, seen = first
            if fingerprint != first_fp:
                raise mismatch_error(index, fingerprint, self.rank, first_fp, first_rank)
            first[2] = seen + 1
            if first[2] == w.world_size:
                del w.collective_log[index]  # everyone agreed; forget it


def _where(tb_exc):
    """'file:line in function: code' for the innermost frame outside this package."""
    frames = [f for f in tb_exc.stack
              if not f.filename.startswith((_COMM_DIR, _STDLIB_DIR))] or tb_exc.stack
    f = frames[-1]
    return f"{Path(f.filename).name}:{f.lineno} in {f.name}: {(f.line or '').strip()}"


def _run_rank(world, rank, fn, args, kwargs, results):
    comm = SimulatedComm(world, rank)
    try:
        results[rank] = fn(comm, *args, **kwargs)
    except RankStopped:
        pass
    except BaseException as error:  # noqa: BLE001 - any failure on a rank must reach the caller
        tb = traceback.format_exc()
        with world.cond:
            world.errors[rank] = (error, traceback.TracebackException.from_exception(error))
            world.fail(rank, error, tb)
    finally:
        with world.cond:
            world.state[rank] = DONE
            world.cond.notify_all()


def run_spmd(fn, world_size, *args, timeout=None, **kwargs):
    """Run ``fn(comm, *args, **kwargs)`` on ``world_size`` simulated ranks; return their results.

    Returns the list of per-rank return values, in rank order. Raises SPMDError if any rank
    fails (an exception, a deadlock, a collective mismatch, or a wait longer than
    ``timeout`` seconds; default TP_TIMEOUT or 30 s).
    """
    if not isinstance(world_size, int) or world_size < 1:
        raise ValueError(f"world_size must be a positive integer, got {world_size!r}")
    world = _World(world_size, timeout_from_env() if timeout is None else float(timeout))
    results = [None] * world_size
    threads = [threading.Thread(target=_run_rank, name=f"spmd-rank-{r}", daemon=True,
                                args=(world, r, fn, args, kwargs, results))
               for r in range(world_size)]
    for t in threads:
        t.start()
    failed_at = None
    while any(t.is_alive() for t in threads):
        with world.cond:
            if world.failure is not None and failed_at is None:
                failed_at = time.monotonic()
            world.cond.wait(0.05)
        if failed_at is not None and time.monotonic() - failed_at > _GRACE:
            # a rank busy computing never reaches the comm call that would stop it: stop it
            # from outside, so it does not keep burning a core behind the caller's back
            for t in threads:
                if t.is_alive():
                    _interrupt(t)
            break
    if world.failure is not None:
        raise _spmd_error(world, threads)
    return results


def _interrupt(thread):
    """Raise RankStopped inside ``thread`` at its next Python bytecode (CPython's
    PyThreadState_SetAsyncExc; a thread blocked inside a C call, e.g. time.sleep, sees it
    only when that call returns)."""
    ctypes.pythonapi.PyThreadState_SetAsyncExc(ctypes.c_ulong(thread.ident), ctypes.py_object(RankStopped))


def _spmd_error(world, threads):
    with world.cond:
        rank, error, tb = world.failure
        errors = dict(world.errors)
    if isinstance(error, CommError):
        lines = [str(error), "", "where each rank stopped:"]
        for r in range(world.world_size):
            if r in errors:
                lines.append(f"  rank {r}: {_where(errors[r][1])}")
            elif threads[r].is_alive():
                lines.append(f"  rank {r}: still running (it was not in send/recv/barrier)")
        lines += ["", f"traceback on rank {rank}:", tb.rstrip()]
    else:
        lines = [f"rank {rank} failed: {type(error).__name__}: {error}", "",
                 f"traceback on rank {rank}:", tb.rstrip()]
    spmd_error = SPMDError("\n".join(lines), rank=rank, error=error, traceback=tb)
    spmd_error.__cause__ = error
    return spmd_error
