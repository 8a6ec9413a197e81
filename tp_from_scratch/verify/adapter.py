"""How a tensor-parallel library plugs into the conformance suite: one small Adapter object.

    Adapter(
        name="mylib",
        column=lambda group, linear, gather_output=False: ...,   # module: this rank's shard of linear
        row=lambda group, linear, input_is_parallel=True: ...,
        embedding=lambda group, embedding: ...,                   # vocab-parallel nn.Embedding
        f=..., g=..., scatter=..., gather=...,                    # mapping(group, x) -> tensor, on dim -1
        cross_entropy=lambda group, local_logits, target, ignore_index, vocab_start: mean_loss,
        default_init=lambda group, kind, n_in, n_out, dtype: module,  # built by the library's own init
        setup=lambda group: ...,                                  # global state (parallel_state, ...)
        layout=shard_range,                                       # (n, rank, t) -> this rank's [lo, hi)
        supports={"uneven", "gather_output", "scatter_input", "padding_idx", "ignore_index"},
        # optional, new: sequence parallelism, and the failures the library expects
        sp_gather=..., sp_scatter=...,                            # mapping(group, x) on dim 1 (T)
        sp_layernorm=lambda group, norm: module,                  # LayerNorm on a sequence shard
        sp_block=lambda group, block: module,                     # a verify.sp.Block, sequence-parallel
        expected_failures={"g/inputs untouched": "in place by design"},
    )

The whole contract, with a complete adapter for a library written from scratch, is in
docs/verify.md. In short: a factory gets the full single-device module and returns this
rank's shard of it, ``weight`` in nn.Linear's (out, in) layout (a column layer holds rows
lo:hi of it, a row layer columns lo:hi, with [lo, hi) = layout(n, rank, t)); ``forward``
returns one tensor. Every field but ``name`` may be left out: the checks that need it report
NOT PROVIDED. A check needing a feature missing from ``supports`` reports SKIP (``supports``
is opt-out: leaving it out claims every feature but "comm"). ``expected_failures`` maps
"component/check" patterns (fnmatch: "scatter/*", "*/default init") to the reason; a FAIL
or ERROR row they match reads XFAIL with that reason. "comm" in supports: the library takes
one of our Comms as ``group``, so the suite can also run it on simulated ranks (run_spmd).
"""
import fnmatch
import math
from dataclasses import dataclass, field
from typing import Callable, Optional

from tp_from_scratch.sharding import shard_range

FEATURES = ("uneven", "gather_output", "scatter_input", "padding_idx", "ignore_index", "comm")


def chunk_range(n, rank, t):
    """torch.chunk's split (DTensor's Shard): blocks of ceil(n/t), the last ones short or empty."""
    size = math.ceil(n / t)
    lo = min(rank * size, n)
    return lo, min(lo + size, n)


@dataclass
class Adapter:
    """A TP implementation described for tp_from_scratch.verify (see the module docstring)."""
    name: str
    column: Optional[Callable] = None
    row: Optional[Callable] = None
    embedding: Optional[Callable] = None
    f: Optional[Callable] = None
    g: Optional[Callable] = None
    scatter: Optional[Callable] = None
    gather: Optional[Callable] = None
    cross_entropy: Optional[Callable] = None
    default_init: Optional[Callable] = None
    setup: Optional[Callable] = None
    layout: Callable = shard_range
    supports: frozenset = field(default_factory=lambda: frozenset(FEATURES) - {"comm"})
    sp_gather: Optional[Callable] = None
    sp_scatter: Optional[Callable] = None
    sp_layernorm: Optional[Callable] = None
    sp_block: Optional[Callable] = None
    expected_failures: dict = field(default_factory=dict)

    def __post_init__(self):
        unknown = set(self.supports) - set(FEATURES)
        if unknown:
            raise ValueError(f"adapter {self.name!r}: unknown features {sorted(unknown)} in supports; "
                             f"known: {list(FEATURES)}")
        self.supports = frozenset(self.supports)
        for pattern, reason in self.expected_failures.items():
            if "/" not in pattern or not str(reason).strip():
                raise ValueError(f"adapter {self.name!r}: expected_failures[{pattern!r}] needs a "
                                 f"'component/check' pattern and a reason, got {reason!r}")

    def expected_failure(self, component, check):
        """The reason the adapter gave for expecting this check to fail, or None."""
        for pattern, reason in self.expected_failures.items():
            if fnmatch.fnmatchcase(f"{component}/{check}", pattern):
                return reason
        return None
