"""How a tensor-parallel library plugs into the conformance suite: one small Adapter object.

    Adapter(
        name="mylib",
        column=lambda group, linear, gather_output=False: ...,   # module: this rank's shard of linear
        row=lambda group, linear, input_is_parallel=True: ...,
        embedding=lambda group, embedding: ...,                   # vocab-parallel nn.Embedding
        f=..., g=..., scatter=..., gather=...,                    # mapping(group, x) -> tensor
        cross_entropy=lambda group, local_logits, target, ignore_index, vocab_start: mean_loss,
        default_init=lambda group, kind, n_in, n_out, dtype: module,  # built by the library's own init
        setup=lambda group: ...,                                  # global state (parallel_state, ...)
        layout=shard_range,                                       # (n, rank, t) -> this rank's [lo, hi)
        supports={"uneven", "gather_output", "scatter_input", "padding_idx", "ignore_index"},
    )

A module the factories return computes the same function as the single-device module it was
built from, with ``weight`` and ``bias`` holding this rank's shard (tensors, or DTensors: the
suite reads ``to_local()``) and ``forward`` returning one tensor. Every field but ``name`` may
be left out: the checks that need it report NOT PROVIDED; a check needing a feature missing
from ``supports`` reports SKIP. "comm" in supports: the library takes one of our Comms as
``group``, so the suite can also run it on simulated ranks (run_spmd).
"""
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

    def __post_init__(self):
        unknown = set(self.supports) - set(FEATURES)
        if unknown:
            raise ValueError(f"adapter {self.name!r}: unknown features {sorted(unknown)} in supports; "
                             f"known: {list(FEATURES)}")
        self.supports = frozenset(self.supports)
