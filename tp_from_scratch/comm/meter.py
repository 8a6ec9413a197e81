"""Counting what a rank sends and receives, so tests can check the cost model of each collective.

Every communicator owns one Meter (``comm.meter``). Each ``send`` adds one message and the
payload's ``nbytes`` (headers are not counted); each ``recv`` likewise. Traffic that happens
inside a collective is also booked under that collective's name. Collectives are built from
other collectives (all_reduce = reduce_scatter + all_gather), so traffic is booked under the
OUTERMOST collective in progress only: an all_reduce shows up as all_reduce, never as its parts.
"""
from contextlib import contextmanager
from dataclasses import asdict, dataclass

_FIELDS = ("messages_sent", "bytes_sent", "messages_received", "bytes_received")


@dataclass
class Traffic:
    """Counts for one collective on one rank: how often it was called and what it moved."""
    calls: int = 0
    messages_sent: int = 0
    bytes_sent: int = 0
    messages_received: int = 0
    bytes_received: int = 0


class Meter:
    """Per-rank message and byte counters, in total and per (outermost) collective."""

    def __init__(self):
        self._stack = []  # names of the collectives in progress, outermost first
        self.reset()

    def reset(self):
        """Zero every counter (a collective in progress stays in progress)."""
        self.messages_sent = self.bytes_sent = 0
        self.messages_received = self.bytes_received = 0
        self.by_collective = {}

    @property
    def current(self):
        """Name of the outermost collective in progress, or None outside any collective."""
        return self._stack[0] if self._stack else None

    @contextmanager
    def collective(self, name, x=None):
        """Book the traffic inside this block under ``name``, unless an outer collective runs.

        ``x`` (the input array) is accepted for symmetry with Comm.collective and not used.
        """
        if not self._stack:
            self.by_collective.setdefault(name, Traffic()).calls += 1
        self._stack.append(name)
        try:
            yield
        finally:
            self._stack.pop()

    @contextmanager
    def resumed(self, name):
        """Book the traffic inside this block under ``name`` without counting a new call.

        For a non-blocking collective: it is called (and counted) once, then makes progress
        in several slices (start, test, wait), each booked under its name.
        """
        self.by_collective.setdefault(name, Traffic())
        self._stack.append(name)
        try:
            yield
        finally:
            self._stack.pop()

    # record_send and record_recv run once per message: plain increments, no shared helper,
    # because under 4 ranks on 2 cores each microsecond here slows the whole ring
    def record_send(self, nbytes):
        """Count one sent message of ``nbytes`` payload bytes."""
        self.messages_sent += 1
        self.bytes_sent += nbytes
        if self._stack:
            traffic = self.by_collective[self._stack[0]]
            traffic.messages_sent += 1
            traffic.bytes_sent += nbytes

    def record_recv(self, nbytes):
        """Count one received message of ``nbytes`` payload bytes."""
        self.messages_received += 1
        self.bytes_received += nbytes
        if self._stack:
            traffic = self.by_collective[self._stack[0]]
            traffic.messages_received += 1
            traffic.bytes_received += nbytes

    def snapshot(self):
        """A plain dict of every counter (safe to keep: later traffic does not change it)."""
        return {
            **{f: getattr(self, f) for f in _FIELDS},
            "by_collective": {name: asdict(t) for name, t in self.by_collective.items()},
        }

    def table(self):
        """The counters as a text table: one row per collective, point-to-point, and the total."""
        rows = [(name, t.calls, *(getattr(t, f) for f in _FIELDS))
                for name, t in sorted(self.by_collective.items())]
        inside = [sum(row[i] for row in rows) for i in range(2, 6)]
        outside = [getattr(self, f) - n for f, n in zip(_FIELDS, inside)]
        if any(outside):
            rows.append(("(point-to-point)", "-", *outside))
        rows.append(("total", sum(t.calls for t in self.by_collective.values()),
                     *(getattr(self, f) for f in _FIELDS)))
        header = ("collective", "calls", "msgs sent", "bytes sent", "msgs recv", "bytes recv")
        widths = [max(len(str(r[i])) for r in [header, *rows]) for i in range(6)]
        lines = ["  ".join(str(c).ljust(w) if i == 0 else str(c).rjust(w)
                           for i, (c, w) in enumerate(zip(r, widths))) for r in [header, *rows]]
        lines.insert(1, "-" * len(lines[0]))
        return "\n".join(lines)
