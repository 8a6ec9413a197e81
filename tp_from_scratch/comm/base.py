"""The communicator interface every backend implements: rank, world_size, send, recv, barrier.

Backends (simulated threads, MPI, torch.distributed) implement ``_raw_send``,
``_raw_recv`` (a message on a tag, with or without its header) and ``barrier``; this base
class validates arguments and feeds the meter, so the three backends count traffic
identically. Collectives announce themselves with ``comm.collective(name, x, **params)``,
which is where ranks are checked to agree (always on the simulator, under TP_DEBUG=1
elsewhere).

Two settings come from the environment, read when a communicator is created:

    TP_TIMEOUT  seconds any blocking wait may last before it fails (default 30)
    TP_DEBUG=1  MPI/torch: exchange a fingerprint (name, shape, dtype, root, op) before each
                collective so that ranks in different collectives fail by name instead of
                hanging (the simulator always checks)
"""
import os
from contextlib import contextmanager

import numpy as np

from .errors import CollectiveMismatchError
from .meter import Meter

DEFAULT_TIMEOUT = 30.0
TAG_DATA, TAG_FINGERPRINT = 0, 1  # separate channels: a fingerprint never meets a payload
TAG_NONBLOCKING = 2  # isend/irecv: a collective in flight never takes a blocking one's messages


def timeout_from_env(default=DEFAULT_TIMEOUT):
    """Seconds a blocking wait may last: TP_TIMEOUT if set, else ``default``."""
    value = os.environ.get("TP_TIMEOUT")
    if not value:
        return float(default)
    try:
        seconds = float(value)
    except ValueError:
        raise ValueError(f"TP_TIMEOUT must be a number of seconds, got {value!r}") from None
    if seconds <= 0:
        raise ValueError(f"TP_TIMEOUT must be positive, got {seconds}")
    return seconds


def debug_from_env():
    """True when TP_DEBUG is set to something other than '', '0' or 'false'."""
    return os.environ.get("TP_DEBUG", "").strip().lower() not in ("", "0", "false", "no")


def _plain(value):
    """Python ints and tuples instead of numpy scalars and lists: comparable and printable."""
    if isinstance(value, (list, tuple)):
        return tuple(_plain(v) for v in value)
    if isinstance(value, np.integer):
        return int(value)
    if isinstance(value, np.dtype):
        return value.name
    return value


class Fingerprint:
    """What a rank says it is doing at a collective call: a name and its parameters.

    Two ranks agree when name and parameters are equal; ``difference`` words the disagreement.
    """

    def __init__(self, name, **params):
        self.name = name
        self.params = {k: _plain(v) for k, v in params.items()}

    def __eq__(self, other):
        return (self.name, self.params) == (other.name, other.params)

    def __repr__(self):
        args = ", ".join(f"{k}={v!r}" for k, v in self.params.items())
        return f"{self.name}({args})"

    def as_text(self):
        """A string that survives a trip between processes (parsed by ``from_text``)."""
        return repr((self.name, sorted(self.params.items())))

    @staticmethod
    def from_text(text):
        import ast
        name, params = ast.literal_eval(text)
        return Fingerprint(name, **dict(params))

    def difference(self, rank, other, other_rank):
        """'rank 2 is in all_reduce, rank 0 is in all_gather', or the differing parameters."""
        if self.name != other.name:
            return f"rank {rank} is in {self.name}, rank {other_rank} is in {other.name}"
        keys = [k for k in {**self.params, **other.params}
                if self.params.get(k) != other.params.get(k)]
        mine = ", ".join(f"{k}={self.params.get(k)!r}" for k in keys)
        theirs = ", ".join(f"{k}={other.params.get(k)!r}" for k in keys)
        return (f"rank {rank} is in {self.name} with {mine}, "
                f"rank {other_rank} is in {other.name} with {theirs}")


def mismatch_error(call_index, fp, rank, other_fp, other_rank):
    """The CollectiveMismatchError for two ranks that disagree at the same collective call."""
    return CollectiveMismatchError(
        f"collective mismatch at collective call #{call_index}: "
        f"{fp.difference(rank, other_fp, other_rank)}")


class Request:
    """A receive in progress (``comm.irecv``): test() without waiting, wait() until it arrives."""

    def __init__(self, comm, out, test, wait):
        self.comm, self.out = comm, out
        self._test, self._wait = test, wait
        self.done = False

    def test(self):
        """True once the message is in ``out`` (never waits)."""
        if not self.done and self._test():
            self._arrived()
        return self.done

    def wait(self):
        """Wait until the message is in ``out`` and return ``out``."""
        if not self.done:
            self._wait()
            self._arrived()
        return self.out

    def _arrived(self):
        self.done = True
        self.comm.meter.record_recv(self.out.nbytes)


class Comm:
    """A group of ``world_size`` ranks that exchange numpy arrays point to point.

    send is buffered: it returns without waiting for the matching recv, so a ring step
    ``send(x, right); recv(left)`` on every rank at once cannot deadlock.
    """

    rank: int
    world_size: int

    def __init__(self, rank, world_size):
        self.rank = rank
        self.world_size = world_size
        self.meter = Meter()
        self._collective_calls = 0  # outermost collectives entered: the k-th must agree across ranks
        self.nonblocking_in_flight = None  # the non-blocking collective started and not finished

    # ---- point to point --------------------------------------------------------------
    def _check_peer(self, peer, what):
        if not isinstance(peer, (int, np.integer)) or not 0 <= peer < self.world_size:
            raise ValueError(
                f"rank {self.rank}: {what} rank {peer!r} does not exist (world_size is {self.world_size})")

    def send(self, array, dst, header=True):
        """Send a copy of ``array`` to rank ``dst``; returns at once (buffered).

        By default the message carries its shape and dtype (a header), so ``recv(src)`` can
        allocate the result. ``header=False`` sends the payload alone, for a receiver that
        already knows shape and dtype and calls ``recv(src, out=buffer, header=False)``: on
        MPI and torch.distributed that is one message instead of two, as in their own
        collectives. Both sides must agree, and the buffer must match the message: the
        simulator checks both, MPI only the byte count, gloo only that the message is not
        longer, nccl nothing. On process backends TP_DEBUG=1 is the guard: the collectives'
        fingerprints include shape and dtype, so ranks that disagree fail by name.
        """
        self._check_peer(dst, "send to")
        if array is None:
            raise TypeError(f"rank {self.rank}: send to rank {dst} needs an array, got None")
        array = np.asarray(array, order="C")  # contiguous, and a 0-d array stays 0-d
        if array.dtype.hasobject:
            raise TypeError(f"rank {self.rank}: send to rank {dst} needs a numeric array, got dtype object")
        self._send(array, int(dst), bool(header))
        self.meter.record_send(array.nbytes)

    def recv(self, src, out=None, header=True):
        """Wait (at most TP_TIMEOUT seconds) for the next array sent by rank ``src`` and return it.

        ``out``: an array of the message's shape and dtype to receive into (saves allocating
        and copying a result buffer); it is returned. ``header=False`` receives a message sent
        with ``send(..., header=False)``: its shape and dtype are taken from ``out``.
        """
        self._check_peer(src, "recv from")
        if not header and out is None:
            raise ValueError(f"rank {self.rank}: recv from rank {src} with header=False needs "
                             "out=: without a header, the buffer gives the message's shape and dtype")
        array = self._recv(int(src), out, bool(header))
        self.meter.record_recv(array.nbytes)
        return array

    def isend(self, array, dst):
        """Send a copy of ``array`` to ``dst`` on the non-blocking channel, without a header.

        Like send, it returns at once; the receiver takes it with ``irecv(src, out)``. The
        non-blocking channel is separate from send/recv's, so blocking messages exchanged
        while a non-blocking collective is in flight never get mixed up with its own.
        """
        self._check_peer(dst, "isend to")
        array = np.asarray(array, order="C")
        self._raw_send(array, int(dst), TAG_NONBLOCKING, False)
        self.meter.record_send(array.nbytes)

    def irecv(self, src, out):
        """Start receiving the next isend from ``src`` into ``out``; returns a Request at once.

        ``request.test()`` says whether the message is in ``out`` yet, without waiting;
        ``request.wait()`` waits (at most TP_TIMEOUT seconds) and returns ``out``. The meter
        counts the message when it has arrived.
        """
        self._check_peer(src, "irecv from")
        if not isinstance(out, np.ndarray):
            raise TypeError(f"rank {self.rank}: irecv from rank {src} needs out=, a numpy array "
                            f"of the message's shape and dtype, got {type(out).__name__}")
        return Request(self, out, *self._raw_irecv(int(src), TAG_NONBLOCKING, out))

    def _raw_irecv(self, src, tag, out):
        """(test, wait) for a headerless message from ``src`` into ``out``: test() -> bool
        without waiting, wait() blocks; both are called until the first says it arrived."""
        raise NotImplementedError

    def barrier(self):
        """Wait until every rank has reached the barrier."""
        raise NotImplementedError

    def _check_out(self, out, shape, dtype, src):
        """Raise a ValueError if a message of ``shape``/``dtype`` from ``src`` cannot land in ``out``."""
        if out is not None and (tuple(out.shape) != tuple(shape) or out.dtype != dtype):
            raise ValueError(
                f"rank {self.rank}: recv from rank {src} into an array of shape {tuple(out.shape)} "
                f"and dtype {out.dtype}, but the message has shape {tuple(shape)} and dtype {dtype}")

    # ---- collectives -----------------------------------------------------------------
    @contextmanager
    def collective(self, name, x=None, **params):
        """Mark a collective call: checks that all ranks agree (outermost call only) and meters it.

        ``params`` (shape, dtype, root, op, ...) form the fingerprint that must be equal on all
        ranks. Collectives nested inside another one are neither checked nor metered separately.
        """
        outermost = self.meter.current is None
        if outermost:
            index = self._collective_calls
            self._collective_calls += 1
            if self.checks_collectives:  # built only when checked: it costs microseconds a call
                self._check_collective(index, Fingerprint(name, **params))
        with self.meter.collective(name, x):
            yield
        if outermost:
            self._collective_done()

    @property
    def checks_collectives(self):
        """True if collective calls are checked for agreement: under TP_DEBUG=1 (the simulator: always)."""
        return getattr(self, "debug", False)

    def _collective_done(self):
        """Called after each outermost collective; process backends wait for their sends here."""

    def _check_collective(self, index, fingerprint):
        """Raise CollectiveMismatchError if ranks disagree about this collective call.

        Called only when ``checks_collectives`` (on process backends: under TP_DEBUG=1). Each
        rank sends its fingerprint to every other rank (p-1 small messages, on their own tag
        and not metered) and compares what it receives. The simulator overrides this.
        """
        mine = Fingerprint(fingerprint.name, call=index, **fingerprint.params)
        text = np.frombuffer(mine.as_text().encode(), dtype=np.uint8)
        others = [r for r in range(self.world_size) if r != self.rank]
        for dst in others:
            self._raw_send(text, dst, TAG_FINGERPRINT)
        for src in others:
            theirs = Fingerprint.from_text(self._raw_recv(src, TAG_FINGERPRINT).tobytes().decode())
            if theirs != mine:
                raise mismatch_error(index, mine, self.rank, theirs, src)

    # a backend moves one message on a tag: a header (shape, dtype) then the payload, or,
    # with header=False, the payload alone into the receiver's ``out``
    def _send(self, array, dst, header=True):
        self._raw_send(array, dst, TAG_DATA, header)

    def _recv(self, src, out=None, header=True):
        return self._raw_recv(src, TAG_DATA, out, header)

    def _raw_send(self, array, dst, tag, header=True):
        raise NotImplementedError

    def _raw_recv(self, src, tag, out=None, header=True):
        raise NotImplementedError

    def _timeout_message(self, what, peer=None):
        inside = f" (in {self.meter.current})" if self.meter.current else ""
        hint = ""
        if peer is not None:
            hint = (f"; rank {peer} may have failed, exited, or be in another collective"
                    " (TP_DEBUG=1 checks that ranks agree)")
        return f"timeout: rank {self.rank} waited {self.timeout:g} s for {what}{inside}{hint}"

    def __repr__(self):
        return f"{type(self).__name__}(rank={self.rank}, world_size={self.world_size})"
