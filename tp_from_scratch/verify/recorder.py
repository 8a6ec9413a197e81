"""What one check measured on one rank: every quantity, the collectives of each phase, the
exception and where in the library it was raised.

    Recorder     the judge verify hands nn.check: records instead of raising
    CollectiveMeter   counts the collectives torch dispatches and the bytes they carry
    raised_at    "file.py:line" of the library frame an exception came from
"""
import contextlib
import math
import os
import sys
import traceback
from dataclasses import dataclass

import torch
from torch.distributed.tensor import DTensor
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_leaves

from tp_from_scratch.comm import Comm
from tp_from_scratch.compare import allowed_error, assert_matches_reference, max_error

_TORCH = os.path.dirname(torch.__file__)
_OURS = tuple(os.path.join(os.path.dirname(os.path.dirname(__file__)), part)
              for part in ("verify", os.path.join("nn", "check.py"), "compare.py"))
_NOT_A_COLLECTIVE = ("wait", "_wrap", "barrier", "monitored_barrier")


def _local(x):
    return x.to_local() if hasattr(x, "to_local") else x


def _short(path):
    """A path as the reader knows it: inside site-packages from the package, else from the cwd."""
    for root in sorted((p for p in sys.path if p and "site-packages" in p), key=len, reverse=True):
        if path.startswith(root + os.sep):
            return os.path.relpath(path, root)
    relative = os.path.relpath(path)
    return path if relative.startswith("..") else relative


def raised_at(error):
    """'file.py:line' of the innermost frame that is neither torch's nor the suite's, or ''."""
    frames = [f for f in traceback.extract_tb(error.__traceback__)
              if not f.filename.startswith(_TORCH) and not f.filename.startswith(_OURS)]
    return f"{_short(frames[-1].filename)}:{frames[-1].lineno}" if frames else ""


def describe(error):
    """The exception's type, full message and where the library raised it, on one line."""
    where = raised_at(error)
    message = " ".join(str(error).split())
    return f"{type(error).__name__}: {message}" + (f" (at {where})" if where else "")


def holds_block(whole, block, exact=False):
    """Whether ``whole`` holds ``block`` as a slice along the one dim where their sizes differ
    (a tensor replicated where this rank's block of it was expected)."""
    if whole.dim() != block.dim():
        return False
    dims = [d for d in range(whole.dim()) if whole.shape[d] != block.shape[d]]
    if len(dims) != 1 or whole.shape[dims[0]] < block.shape[dims[0]]:
        return False
    d, n = dims[0], block.shape[dims[0]]
    for start in range(whole.shape[d] - n + 1):
        try:
            assert_matches_reference(whole.narrow(d, start, n), block, name="block", exact=exact)
            return True
        except AssertionError:
            continue
    return False


@dataclass
class Entry:
    """One measured quantity of a check ("dW", "X untouched", ...)."""
    name: str
    ok: bool
    error: float = 0.0
    bound: float = 0.0
    why: str = ""
    raised: bool = False
    severity: str = None    # set where the name does not tell it (a placement)


class CollectiveMeter(TorchDispatchMode):
    """Counts the collectives torch dispatches while active, and their bytes.

    It sees torch.distributed's calls (c10d) and the functional collectives DTensor uses
    alike (DTensor ops are let through first, as CommDebugMode does, so they desugar into
    collectives). A collective's bytes are those of the largest tensor it touches: the whole
    buffer of an all-reduce, the gathered output of an all-gather, the input of a
    reduce-scatter.
    """

    def __init__(self):
        super().__init__()
        self.calls = self.bytes = 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if isinstance(func, torch._ops.HigherOrderOperator):
            return func(*args, **kwargs)
        if any(issubclass(t, DTensor) for t in types):
            return NotImplemented
        out = func(*args, **kwargs)
        if func.namespace in ("c10d", "_c10d_functional", "c10d_functional") and \
                not func._opname.startswith(_NOT_A_COLLECTIVE):
            self.calls += 1
            self.bytes += max((x.numel() * x.element_size() for x in tree_leaves((args, kwargs, out))
                               if isinstance(x, torch.Tensor)), default=0)
        return out


@contextlib.contextmanager
def _comm_meter(comm, tally):
    """Count a Comm's outermost collectives and the bytes of their whole buffers (its meter
    books bytes sent per message, not the buffer: the input x, t times for a gather)."""
    meter, original = comm.meter, comm.meter.collective

    @contextlib.contextmanager
    def collective(name, x=None):
        if meter.current is None:
            tally[0] += 1
            if x is not None:
                tally[1] += x.nbytes * (comm.world_size if "gather" in name else 1)
        with original(name, x):
            yield
    meter.collective = collective
    try:
        yield
    finally:
        meter.collective = original


class Recorder:
    """The judge verify hands nn.check: records instead of raising, counts collectives per phase.

    phase_seen(name) is called as each phase starts (the worker publishes it, so a rank stuck
    in a collective is reported with the phase it was in).
    """

    def __init__(self, group, exclusive=None, phase_seen=None):
        self.group, self._exclusive, self._phase_seen = group, exclusive, phase_seen
        self.entries = []
        self.counts = {"forward": [0, 0], "backward": [0, 0]}   # [calls, bytes]

    def match(self, got, expected, *, name, rank, exact=False):
        placements = tuple(got.placements) if hasattr(got, "placements") else None
        placed = f" (a DTensor placed {placements})" if placements else ""
        got, expected = _local(got), _local(expected)
        try:
            assert_matches_reference(got, expected, name=name, rank=rank, exact=exact)
            why = ""
        except AssertionError as error:
            why = " ".join(str(error).split()) + placed
        same_shape = tuple(got.shape) == tuple(expected.shape)
        error = max_error(got, expected) if same_shape else math.inf
        kind = None
        if why and placements and not same_shape and holds_block(got, expected, exact):
            kind = "placement"   # the values are right, the placement (and memory) is not
            why += (f"; its values are right: rank {rank} holds the whole {tuple(got.shape)} where its "
                    f"block {tuple(expected.shape)} was expected (t times the memory)")
        self.entries.append(Entry(name, not why, error, allowed_error(expected, exact=exact), why,
                                  severity=kind))

    def holds(self, ok, *, name, rank, why):
        self.entries.append(Entry(name, bool(ok), why="" if ok else f"{why} (rank {rank})"))

    def failed(self, name, why, raised=True):
        self.entries.append(Entry(name, False, math.inf, why=why, raised=raised))

    @contextlib.contextmanager
    def phase(self, name):
        if self._phase_seen is not None:
            self._phase_seen(name)
        tally = self.counts[name]
        if isinstance(self.group, Comm):
            counted = [0, 0]
            try:
                with _comm_meter(self.group, counted):
                    yield
            finally:  # counted even when the phase raises: the ranks' counts are compared
                tally[0], tally[1] = tally[0] + counted[0], tally[1] + counted[1]
        else:
            meter = CollectiveMeter()
            try:
                with meter:
                    yield
            finally:
                tally[0], tally[1] = tally[0] + meter.calls, tally[1] + meter.bytes

    def exclusive(self):
        return self._exclusive or contextlib.nullcontext()
