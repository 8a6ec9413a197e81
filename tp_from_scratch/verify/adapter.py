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
        expected_failures={"g/inputs untouched": "in place by design"},   # per check (contract 3)
        contract=3,                                               # the version it was written for
    )

The whole contract, with a complete adapter for a library written from scratch, is in
docs/verify.md. In short: a factory gets the full single-device module and returns this
rank's shard of it, ``weight`` in nn.Linear's (out, in) layout (a column layer holds rows
lo:hi of it, a row layer columns lo:hi, with [lo, hi) = layout(n, rank, t)); ``forward``
returns one tensor. Every field but ``name`` may be left out: the checks that need it report
NOT PROVIDED. A check needing a feature missing from ``supports`` reports SKIP (``supports``
is opt-out: leaving it out claims every feature but "comm"). ``expected_failures`` maps
patterns of the checks the library fails on purpose to the reason: "component/check" (fnmatch:
"scatter/*", "*/default init") names a check wherever it is measured ("g/inputs untouched":
g's inputs-untouched quantity in every g row), "component/row/check" the check inside one
row ("column/4-D input/exception"). A row whose every failing check is expected reads XFAIL;
one that passes although a pattern expected a failure reads XPASS. "comm" in supports: the
library takes one of our Comms as ``group``, so the suite can also run it on simulated ranks
(run_spmd).

The contract is versioned (CONTRACT, CHANGES below; docs/verify.md section 2 says what each
version changed). ``contract`` is the version an adapter was written for (default: the current
one). An adapter declaring an older one runs unchanged: its expected_failures keep their old
meaning (a "component/row" pattern covers the whole row) and every row of a check added since
says so in its detail.
"""
import fnmatch
import math
from dataclasses import dataclass, field
from typing import Callable, Optional

from tp_from_scratch.sharding import shard_range

FEATURES = ("uneven", "gather_output", "scatter_input", "padding_idx", "ignore_index", "comm")

CONTRACT = 3
# what each version of the contract changed (docs/verify.md section 2 has the same list)
CHANGES = {
    2: "default init compared across t (not with nn.Linear's draw); input variants (2-D, 4-D, bias=False, "
       "non-contiguous, two passes, uneven sizes on every path, random shapes); the SP fields sp_gather, "
       "sp_scatter, sp_layernorm, sp_block, whose T is split by layout and covered by 'uneven'; "
       "expected_failures by row",
    3: "expected_failures by check: 'component/check' names a check wherever it is measured, "
       "'component/row/check' one row's (a 'component/row' pattern covered the whole row); XPASS; new checks: "
       "two forwards before the backwards (column, row, embedding, sp layernorm, sp block), forward under "
       "torch.no_grad and torch.inference_mode (every component), the SP block's fc1 output over the whole "
       "sequence in order (token order); severities error (raised, hung) and placement (memory) apart from value",
}
# the checks a row may measure (the last part of an expected_failures pattern)
CHECKS = ("forward", "grad input", "grad weight", "grad bias", "SGD step", "AdamW step", "inputs untouched",
          "fresh output", "collectives", "default init", "no-grad forward", "exception")


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
    contract: Optional[int] = None

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
        if self.contract is not None and not 1 <= self.contract <= CONTRACT:
            raise ValueError(f"adapter {self.name!r}: contract {self.contract}: this suite knows 1 to {CONTRACT}")
        self.contract = CONTRACT if self.contract is None else self.contract

    def expected_failure(self, component, row, check=None):
        """(reason, pattern) of the expectation that ``check`` (a quantity's check, see CHECKS)
        of this row fails, or None. Contract 3: "component/check" matches the check,
        "component/row/check" the check in that row. An adapter of an older contract: a
        "component/row" pattern matches the whole row, whatever fails in it."""
        for pattern, reason in self.expected_failures.items():
            parts = pattern.split("/")
            if not fnmatch.fnmatchcase(component, parts[0]):
                continue
            if self.contract < 3:
                if fnmatch.fnmatchcase(row, "/".join(parts[1:])):
                    return reason, pattern
            elif len(parts) == 2 and check is not None and fnmatch.fnmatchcase(check, parts[1]):
                return reason, pattern
            elif len(parts) >= 3 and fnmatch.fnmatchcase(row, parts[1]) and check is not None \
                    and fnmatch.fnmatchcase(check, "/".join(parts[2:])):
                return reason, pattern
        return None

    def row_pattern(self, component, row):
        """A contract-3 pattern "component/X" that names this row but none of the checks a row
        measures (it meant the whole row, as before contract 3), or None."""
        if self.contract < 3:
            return None
        for pattern in self.expected_failures:
            parts = pattern.split("/")
            if len(parts) == 2 and fnmatch.fnmatchcase(component, parts[0]) and \
                    fnmatch.fnmatchcase(row, parts[1]) and not any(fnmatch.fnmatchcase(c, parts[1]) for c in CHECKS):
                return pattern
        return None
