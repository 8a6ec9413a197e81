"""Counting what a training step sends: calls and bytes of each torch.distributed collective.

The parallel layers call torch.distributed directly (native collectives), which keeps no
statistics. ``CollectiveCounter.counting()`` wraps the collective functions of the
``torch.distributed`` module for the duration of a ``with`` block and tallies every call
by (collective, group), then puts the originals back. Nothing else changes: the wrapped
call is the original call.

Bytes are the payload a rank hands to the collective (the tensor it contributes); what a
ring algorithm actually moves is about 2 (t-1)/t times that for an all-reduce.
(When the layers' group is a TorchComm (``--collectives scratch``) the from-scratch ring
collectives run on point-to-point messages instead, which this counter does not see; the
TorchComm's own Meter counts them message by message; see tp_from_scratch.comm.)
"""
import contextlib
from collections import defaultdict

import torch.distributed as dist

COLLECTIVES = ("all_reduce", "all_gather", "all_gather_into_tensor", "reduce_scatter",
               "reduce_scatter_tensor", "reduce_scatter_single", "broadcast", "all_to_all",
               "all_to_all_single")


class CollectiveCounter:
    """Tallies torch.distributed collectives made inside ``counting()`` blocks.

    labels: {process group: "tp" / "dp" / ...}; calls on other groups count under "world".
    """

    def __init__(self, labels=None):
        self.labels = dict(labels or {})
        self.calls = defaultdict(int)   # (collective, group label) -> calls
        self.bytes = defaultdict(int)   # (collective, group label) -> payload bytes

    def _label(self, group):
        for g, label in self.labels.items():
            if g is group:
                return label
        return "world"

    def _wrap(self, name, original):
        def counted(*args, **kwargs):
            tensor = args[1] if name in ("all_gather", "reduce_scatter") else args[0] if args else None
            group = kwargs.get("group")
            key = (name, self._label(group))
            self.calls[key] += 1
            if hasattr(tensor, "numel"):
                self.bytes[key] += tensor.numel() * tensor.element_size()
            return original(*args, **kwargs)
        return counted

    @contextlib.contextmanager
    def counting(self):
        """Count the collectives called in this block (the originals are restored on exit)."""
        originals = {n: getattr(dist, n) for n in COLLECTIVES if hasattr(dist, n)}
        try:
            for n, f in originals.items():
                setattr(dist, n, self._wrap(n, f))
            yield self
        finally:
            for n, f in originals.items():
                setattr(dist, n, f)

    def table(self, steps=1):
        """A text table: calls and payload bytes per step for each (collective, group)."""
        steps = max(steps, 1)
        lines = [f"{'collective':<24} {'group':<6} {'calls/step':>10} {'bytes/step':>12}"]
        for key in sorted(self.calls):
            lines.append(f"{key[0]:<24} {key[1]:<6} {self.calls[key] / steps:>10.1f} "
                         f"{self.bytes[key] / steps:>12,.0f}")
        if len(lines) == 1:
            lines.append("(no collectives counted)")
        return "\n".join(lines)

    def per_step(self, steps=1):
        """{"all_reduce/tp": {"calls": c, "bytes": b}, ...} averaged per step, for metrics files."""
        steps = max(steps, 1)
        return {f"{k[0]}/{k[1]}": {"calls": self.calls[k] / steps, "bytes": self.bytes[k] / steps}
                for k in sorted(self.calls)}
