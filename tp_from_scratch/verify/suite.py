"""The conformance suite: every check of an Adapter, on one rank, reported row by row.

``run_suite(group, adapter)`` runs on every rank of the group (a ProcessGroup under torchrun,
or a Comm on run_spmd's simulated ranks) and returns this rank's rows. A check never stops
the run: a mismatch, an exception or a wrong collective count becomes a FAIL row. Each row:

    component   column / row / embedding / f / g / scatter / gather / cross-entropy
    check       forward, grad input, grad weight, grad bias, SGD step, AdamW step,
                inputs untouched, fresh output, collectives, 2-D / 4-D input, ...
    status      PASS, FAIL, SKIP (a feature the adapter does not declare), NOT PROVIDED
    error, bound   the largest error measured and what the tolerance policy allows
                   (tp_from_scratch.compare), for the worst quantity of the check
    forward, backward   collectives counted in each direction

The checks are tp_from_scratch.nn.checks' (handed a recording judge and the adapter's
modules), plus the mapping checks below. Collectives are counted on a Comm by its meter, on
a ProcessGroup by torch's CommDebugMode (it sees torch.distributed's calls and the functional
collectives DTensor uses alike).
"""
import contextlib
import math
from dataclasses import dataclass

import torch
from torch.distributed.tensor.debug import CommDebugMode

from tp_from_scratch.comm import Comm
from tp_from_scratch.compare import allowed_error, assert_matches_reference, max_error
from tp_from_scratch.nn import checks
from tp_from_scratch.nn.mappings import tp_rank, tp_world_size
from tp_from_scratch.testing import random_array, rank_rng

# the collectives each direction needs (what Megatron-LM's design does), per case
EXPECTED = {
    "column": (0, 1), "column gather_output": (1, 1), "row": (1, 0), "row scatter input": (1, 1),
    "embedding": (1, 0), "f": (0, 1), "g": (1, 0), "scatter": (0, 1), "gather": (1, 0),
    "cross-entropy": (3, 0),
}


def _local(x):
    return x.to_local() if hasattr(x, "to_local") else x


def _ratio(error, bound):
    return error / bound if bound > 0 else (0.0 if error == 0 else math.inf)


@dataclass
class Entry:
    """One measured quantity of a check ("dW", "X untouched", ...)."""
    name: str
    ok: bool
    error: float = 0.0
    bound: float = 0.0
    why: str = ""


class Recorder:
    """The judge verify hands nn.checks: records instead of raising, counts collectives per phase."""

    def __init__(self, group, exclusive=None):
        self.group, self._exclusive = group, exclusive
        self.entries, self.counts = [], {"forward": 0, "backward": 0}

    def match(self, got, expected, *, name, rank, exact=False):
        placed = f" (a DTensor placed {tuple(got.placements)})" if hasattr(got, "placements") else ""
        got, expected = _local(got), _local(expected)
        try:
            assert_matches_reference(got, expected, name=name, rank=rank, exact=exact)
            why = ""
        except AssertionError as error:
            why = str(error) + placed
        same_shape = tuple(got.shape) == tuple(expected.shape)
        error = max_error(got, expected) if same_shape else math.inf
        self.entries.append(Entry(name, not why, error, allowed_error(expected, exact=exact), why))

    def holds(self, ok, *, name, rank, why):
        self.entries.append(Entry(name, bool(ok), why="" if ok else f"{why} (rank {rank})"))

    def failed(self, name, why):
        self.entries.append(Entry(name, False, math.inf, why=why))

    @contextlib.contextmanager
    def phase(self, name):
        if isinstance(self.group, Comm):
            meter = self.group.meter
            before = sum(t.calls for t in meter.by_collective.values())
            yield
            self.counts[name] += sum(t.calls for t in meter.by_collective.values()) - before
        else:
            with CommDebugMode() as mode:
                yield
            self.counts[name] += mode.get_total_counts()

    def exclusive(self):
        return self._exclusive or contextlib.nullcontext()


def check_mapping(group, dtype=torch.float64, seed=0, *, kind, fn, batch=(2, 3), features=12,
                  layout=None, judge=None, device="cpu"):
    """One region mapping (f, g, scatter or gather) against its definition, forward and backward.

    Every rank draws its own x_r and dY_r (rank_rng(seed, r)) and also knows the others', so
    the reference needs no communication:
        f:       Y = x (replicated x)             dX = sum_r dY_r
        g:       Y = sum_r x_r                    dX = dY (replicated dY)
        scatter: Y = x[..., lo:hi] (replicated)   dX = concat_r dY_r (each rank's block)
        gather:  Y = concat_r x_r (blocks)        dX = dY_r[..., lo:hi]
    """
    judge = judge or checks.Strict()
    layout = layout or checks.shard_range
    rank, t = tp_rank(group), tp_world_size(group)
    drawn = [rank_rng(seed, r) for r in range(t)]
    xs = [random_array(rng, (*batch, features)) for rng in drawn]     # (..., n) per rank
    dys = [random_array(rng, (*batch, features)) for rng in drawn]
    blocks = [slice(*layout(features, r, t)) for r in range(t)]
    mine = blocks[rank]
    cat = lambda parts: torch.cat([torch.as_tensor(p) for p in parts], dim=-1).numpy()  # noqa: E731
    x, dy, y_ref, dx_ref = {
        "f": (xs[0], dys[rank], xs[0], sum(dys)),
        "g": (xs[rank], dys[0], sum(xs), dys[0]),
        "scatter": (xs[0], dys[rank][..., mine], xs[0][..., mine],
                    cat([dys[r][..., blocks[r]] for r in range(t)])),
        "gather": (xs[rank][..., mine], dys[rank], cat([xs[r][..., blocks[r]] for r in range(t)]),
                   dys[rank][..., mine]),
    }[kind]
    tensor = lambda a, grad=False: torch.tensor(a, dtype=dtype, device=device, requires_grad=grad)  # noqa: E731
    x_tp, dy_tp = tensor(x, True), tensor(dy)
    with judge.phase("forward"):
        y = fn(group, x_tp)
    with judge.phase("backward"):
        y.backward(dy_tp)
    judge.match(y, tensor(y_ref), name="Y", rank=rank)
    judge.match(x_tp.grad, tensor(dx_ref), name="dX", rank=rank)
    inputs = {"X": (x_tp, tensor(x)), "dY": (dy_tp, tensor(dy))}
    if kind == "f":  # an identity may hand back its input (Megatron's does): check values only
        for name, (got, original) in inputs.items():
            judge.match(got.detach(), original, name=f"{name} untouched", rank=rank, exact=True)
    else:
        checks.check_untouched_and_fresh(judge, rank, y, **inputs)


class _Factory:
    """Gives an adapter's factory the from_linear / from_embedding face nn.checks expects."""

    def __init__(self, make):
        self.make = make

    def from_linear(self, linear, *, group, **options):
        return self.make(group, linear, **options)

    def from_embedding(self, embedding, *, group):
        return self.make(group, embedding)


@dataclass
class Case:
    """One run of a check function; with check None, each quantity gets its own row."""
    component: str
    check: str                  # the row's name, or None: "forward", "grad weight", ... by quantity
    run: object                 # run(group, dtype, judge, adapter)
    expected: str = None        # key of EXPECTED, when the collective count is checked
    needs: tuple = ()           # features the adapter must declare


def _linear_case(component, check, expected=None, needs=(), **options):
    def run(group, dtype, judge, adapter):
        check_fn = (checks.check_column_parallel_linear if component == "column"
                    else checks.check_row_parallel_linear)
        check_fn(group, dtype, layer_cls=_Factory(getattr(adapter, component)),
                 layout=adapter.layout, judge=judge, **options)
    return Case(component, check, run, expected, needs)


def _embedding_case(check, expected=None, needs=(), **options):
    def run(group, dtype, judge, adapter):
        checks.check_vocab_parallel_embedding(group, dtype, layer_cls=_Factory(adapter.embedding),
                                              layout=adapter.layout, judge=judge,
                                              **{"vocab": 12, **options})
    return Case("embedding", check, run, expected, needs)


def _cross_entropy_case(check, expected=None, needs=(), **options):
    def run(group, dtype, judge, adapter):
        checks.check_vocab_parallel_cross_entropy(group, dtype, loss_fn=adapter.cross_entropy,
                                                  layout=adapter.layout, judge=judge,
                                                  **{"vocab": 12, "ignored": 0.0, **options})
    return Case("cross-entropy", check, run, expected, needs)


def _mapping_case(kind, check, expected=None, **options):
    def run(group, dtype, judge, adapter):
        check_mapping(group, dtype, kind=kind, fn=getattr(adapter, kind), layout=adapter.layout,
                      judge=judge, **options)
    return Case(kind, check, run, expected)


def _init_case(component):
    def run(group, dtype, judge, adapter):
        n, vocab = (10, 13) if "uneven" in adapter.supports else (12, 12)
        shape = {"column": (6, n), "row": (n, 6), "embedding": (vocab, 4)}[component]
        make = lambda: adapter.default_init(group, component, *shape, dtype)  # noqa: E731
        checks.check_default_init(group, dtype, layers={component: make}, sizes=(n, vocab),
                                  layout=adapter.layout, judge=judge)
    return Case(component, "default init", run)


def all_cases():
    """Every case of the suite, in the order of the table."""
    cases = []
    for component, parallel_input in (("column", "gather_output"), ("row", "scatter_input")):
        cases += [
            _linear_case(component, None, component),
            _linear_case(component, "AdamW step", optimizer="adamw"),
            _linear_case(component, "2-D input", batch=(6,)),
            _linear_case(component, "4-D input", batch=(2, 2, 3)),
            _linear_case(component, "uneven sizes (9)", needs=("uneven",),
                         **({"out_features": 9} if component == "column" else {"in_features": 9})),
        ]
        if component == "column":
            cases.append(_linear_case(component, "gather_output=True", "column gather_output",
                                      needs=(parallel_input,), gather_output=True))
        else:
            cases.append(_linear_case(component, "input_is_parallel=False", "row scatter input",
                                      needs=(parallel_input,), input_is_parallel=False))
        cases.append(_init_case(component))
    cases += [
        _embedding_case(None, "embedding"),
        _embedding_case("AdamW step", optimizer="adamw"),
        _embedding_case("1-D ids", ids_shape=(7,)),
        _embedding_case("3-D ids", ids_shape=(2, 3, 4)),
        _embedding_case("padding_idx", needs=("padding_idx",), padding_idx=1),
        _embedding_case("uneven sizes (V=13)", needs=("uneven",), vocab=13),
        _init_case("embedding"),
    ]
    for kind in ("f", "g", "scatter", "gather"):
        cases += [_mapping_case(kind, None, kind),
                  _mapping_case(kind, "2-D input", batch=(6,)),
                  _mapping_case(kind, "4-D input", batch=(2, 2, 3))]
    cases += [
        _cross_entropy_case(None, "cross-entropy"),
        _cross_entropy_case("ignore_index", needs=("ignore_index",), ignored=0.3),
        _cross_entropy_case("large logits (x1000)", scale=1e3),
        _cross_entropy_case("uneven sizes (V=13)", needs=("uneven",), vocab=13),
    ]
    return cases


def _label(name, check):
    """The row a quantity of a split case belongs to."""
    if check is not None:
        return check
    first = name.split()[0]
    if "untouched" in name:
        return "inputs untouched"
    if name.startswith("output fresh"):
        return "fresh output"
    if first in ("W", "b", "E") and " after " in name:
        return "SGD step"
    return {"Y": "forward", "embedding": "forward", "loss": "forward", "dX": "grad input",
            "d": "grad input", "dW": "grad weight", "dE": "grad weight", "db": "grad bias",
            "collectives": "collectives"}.get(first, "exception")


def _provider(case):
    if case.check == "default init":
        return "default_init"
    return {"cross-entropy": "cross_entropy"}.get(case.component, case.component)


def run_case(case, group, dtype, adapter, exclusive=None):
    """Run one case; return its rows as dicts (this rank's view)."""
    t = tp_world_size(group)
    base = dict(adapter=adapter.name, component=case.component, dtype=str(dtype).replace("torch.", ""),
                t=t, error=None, bound=None, forward=None, backward=None, detail="")
    label = case.check or "(all)"
    if getattr(adapter, _provider(case)) is None:
        return [dict(base, check=label, status="NOT PROVIDED", detail=f"adapter.{_provider(case)} is None")]
    missing = [need for need in case.needs if need not in adapter.supports]
    if missing:
        return [dict(base, check=label, status="SKIP", detail=f"not in supports: {', '.join(missing)}")]
    judge = Recorder(group, exclusive)
    try:
        case.run(group, dtype, judge, adapter)
    except Exception as error:  # noqa: BLE001 - a crashing implementation is a FAIL, not a stop
        judge.failed("exception", f"{type(error).__name__}: {str(error).splitlines()[0] if str(error) else ''}")
    counts = judge.counts["forward"], judge.counts["backward"]
    if case.expected is not None:
        want = EXPECTED[case.expected]
        judge.entries.append(Entry("collectives", counts == want,
                                   why="" if counts == want else
                                   f"counted {counts[0]} forward, {counts[1]} backward; "
                                   f"expected {want[0]}, {want[1]}"))
    rows = {}
    for entry in judge.entries:
        rows.setdefault(_label(entry.name, case.check), []).append(entry)
    out = []
    for check, entries in rows.items():
        worst = max(entries, key=lambda e: _ratio(e.error, e.bound))
        failed = [e for e in entries if not e.ok]
        out.append(dict(base, check=check, status="FAIL" if failed else "PASS",
                        error=worst.error, bound=worst.bound, forward=counts[0], backward=counts[1],
                        detail="; ".join(e.why for e in failed)))
    return out


def run_suite(group, adapter, dtypes=(torch.float64, torch.float32), exclusive=None):
    """Every case of the suite for ``adapter`` on this rank, in every dtype: a list of row dicts.

    exclusive: a lock the simulated ranks share, so default-init checks draw from torch's
    global RNG one rank at a time (None under torchrun: every process has its own RNG).
    """
    if isinstance(group, Comm) and "comm" not in adapter.supports:
        return [dict(adapter=adapter.name, component="(all)", check="(all)", dtype="-",
                     t=tp_world_size(group), status="SKIP", error=None, bound=None, forward=None,
                     backward=None, detail="needs a torch ProcessGroup ('comm' not in supports)")]
    if adapter.setup is not None:
        adapter.setup(group)
    rows = []
    for dtype in dtypes:
        for case in all_cases():
            rows += run_case(case, group, dtype, adapter, exclusive)
    return rows
