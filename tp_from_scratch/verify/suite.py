"""The conformance suite: every check of an Adapter, on one rank, reported row by row.

``run_suite(group, adapter)`` runs on every rank of the group (a ProcessGroup in a worker the
``verify`` command launched, or a Comm on run_spmd's simulated ranks) and returns this rank's
rows. A check never stops the run: a mismatch becomes a FAIL row, an exception an ERROR row
(with the file:line of the library that raised it). Each row:

    component   column / row / embedding / f / g / scatter / gather / cross-entropy /
                sp gather / sp scatter / sp layernorm / sp block
    check       forward, grad input, grad weight, grad bias, SGD step, AdamW step,
                inputs untouched, fresh output, collectives, 2-D / 4-D input, bias=False,
                non-contiguous input, two passes (accumulate), uneven sizes, random shapes, ...
    status      PASS, FAIL, ERROR, SKIP (a feature the adapter does not declare), NOT PROVIDED
                (XFAIL once merged: every failing check declared in expected_failures)
    severity    value (a wrong value or gradient) > aliasing (an input changed, an output
                sharing memory) > error (raised, hung) > placement (a DTensor placed otherwise
                than its block, values right) > convention (collectives, default init)
    error, bound   the largest error measured and what the tolerance policy allows
                   (tp_from_scratch.compare), for the worst quantity of the check
    forward, backward   collectives counted in each direction; fwd_bytes, bwd_bytes their bytes

The checks are tp_from_scratch.nn.check's (handed a recording judge and the adapter's
modules), plus the mapping, default-init and sequence-parallel checks here and in sp.py, and
modes.py's (two forwards before the backwards, forwards without autograd).
Sizes: 12 splits evenly at t = 2, 3, 4 and 13 unevenly at each; "random shapes" draws
leading dims and sizes from the run's seed (the same on every rank).
"""
import inspect
import traceback
import zlib
from dataclasses import dataclass

import numpy as np
import torch
from torch import nn

from tp_from_scratch.comm import Comm
from tp_from_scratch.nn import check as checks
from tp_from_scratch.nn.mappings import all_gather, tp_rank, tp_world_size
from tp_from_scratch.testing import random_array, rank_rng
from tp_from_scratch.verify import modes, sp
from tp_from_scratch.verify.recorder import Entry, Recorder, describe

EVEN, UNEVEN = 12, 13      # 12 divides by 2, 3 and 4; 13 by none of them
# how much a failure matters, gravest first: a silently wrong value or gradient; an input changed
# or an output sharing memory (silent, and wrong later); the library raised, hung or fell out of
# step (loud: nothing silently wrong); a DTensor placed otherwise than its block (right values, t
# times the memory); a convention (collectives, default init)
SEVERITIES = ("value", "aliasing", "error", "placement", "convention")


def severity(name):
    """How much a failure of this check (or measured quantity) matters (see SEVERITIES)."""
    if name.startswith(("collectives", "default init")):
        return "convention"
    if "untouched" in name or name.startswith(("fresh output", "output fresh")):
        return "aliasing"
    if name in ("exception", "ranks in step"):
        return "error"
    return "value"


def check_of(name):
    """The check a measured quantity belongs to (adapter.CHECKS: the last part of an
    expected_failures pattern, and the row of a case that reports each check apart)."""
    first = name.split()[0]
    if name.startswith("default init"):
        return "default init"
    if name.startswith("no-grad"):
        return "no-grad forward"
    if "untouched" in name:
        return "inputs untouched"
    if name.startswith("output fresh"):
        return "fresh output"
    if first in ("W", "b", "E") and " after " in name:
        return "AdamW step" if name.endswith("adamw") else "SGD step"
    return {"Y": "forward", "embedding": "forward", "loss": "forward", "dX": "grad input",
            "d": "grad input", "dW": "grad weight", "dE": "grad weight", "db": "grad bias",
            "bias": "grad bias", "collectives": "collectives"}.get(first, "exception")


def non_contiguous(x):
    """x's values laid out transposed in memory (so x.view(-1, n) fails); gradients flow to x."""
    return x.transpose(-1, -2).contiguous().transpose(-1, -2) if x.dim() >= 2 else x


class _FedNonContiguous(nn.Module):
    """An adapter's module whose input arrives non-contiguous; weight and bias are its own."""

    def __init__(self, inner):
        super().__init__()
        self.inner = inner

    weight = property(lambda self: self.inner.weight)
    bias = property(lambda self: getattr(self.inner, "bias", None))

    def forward(self, x):
        return self.inner(non_contiguous(x))


class _Factory:
    """Gives an adapter's factory the from_linear / from_embedding face nn.check expects."""

    def __init__(self, make, fed_non_contiguous=False):
        self.make, self.wrap = make, (_FedNonContiguous if fed_non_contiguous else lambda m: m)
        self.built = []

    def from_linear(self, linear, *, group, **options):
        self.built.append(self.make(group, linear, **options))
        return self.wrap(self.built[-1])

    def from_embedding(self, embedding, *, group):
        return self.wrap(self.make(group, embedding))


@dataclass
class Run:
    """What a case runs with on this rank."""
    group: object
    dtype: torch.dtype
    judge: Recorder
    adapter: object
    seed: int = 0
    device: str = "cpu"
    solo: object = None     # solo(fn): fn(a group holding this rank alone), for the t = 1 build


@dataclass
class Case:
    """One run of a check function; with check None, each quantity gets its own row."""
    component: str
    check: str                  # the row's name, or None: "forward", "grad weight", ... by quantity
    run: object                 # run(Run)
    provider: str               # the adapter field the case needs
    budget: tuple = None        # ((calls, elements) forward, (calls, elements) backward), or None
    needs: tuple = ()           # features the adapter must declare
    inputs: str = ""            # what the case feeds in, when it is not the default
    since: int = None           # the contract version that added the check (None: before 3)
    contract: int = 1           # the contract an adapter must be written for to take the check
    note: str = ""              # what an adapter written before `since` must know

    def runs_for(self, adapter):
        """Whether the adapter gives what this case needs (else its row is NOT PROVIDED or SKIP)."""
        return getattr(adapter, self.provider) is not None and set(self.needs) <= adapter.supports \
            and adapter.contract >= self.contract


def check_mapping(group, dtype=torch.float64, seed=0, *, kind, fn, batch=(2, 3), features=12,
                  layout=None, judge=None, device="cpu", fed_non_contiguous=False):
    """One region mapping (f, g, scatter or gather) against its definition, forward and backward.

    Every rank draws its own x_r and dY_r (rank_rng(seed, r)) and also knows the others', so
    the reference needs no communication (the mappings act on the last dim). On an uneven
    split, fn gets sizes=[n_0, ..., n_{t-1}] too if it has a ``sizes`` parameter:
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
    sizes = {}
    if features % t and "sizes" in inspect.signature(fn).parameters:  # uneven: say every rank's size
        sizes = {"sizes": [b.stop - b.start for b in blocks]}
    with judge.phase("forward"):
        y = fn(group, non_contiguous(x_tp) if fed_non_contiguous else x_tp, **sizes)
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


def check_init_same_at_every_t(run, component, n, vocab):
    """default_init at t, gathered, equals default_init at t = 1 (same seed): the library
    builds the same full weight whatever t is. Not demanded: equality with nn.Linear's draw."""
    rank, t = tp_rank(run.group), tp_world_size(run.group)
    shape = {"column": (6, n), "row": (n, 6), "embedding": (vocab, 4)}[component]

    def build(group):
        torch.manual_seed(run.seed)
        return run.adapter.default_init(group, component, *shape, run.dtype)
    with run.judge.exclusive():
        mine, whole = build(run.group), run.solo(build)
    split = {"column": [(shape[1], 0, "W"), (shape[1], 0, "b")], "row": [(shape[0], 1, "W")],
             "embedding": [(shape[0], 0, "W")]}[component]
    for size, dim, name in split:
        local = _local_param(mine, name).detach()
        sizes = [hi - lo for lo, hi in (run.adapter.layout(size, r, t) for r in range(t))]
        gathered = all_gather(run.group, local.contiguous(), dim, sizes)
        run.judge.match(gathered, _local_param(whole, name).detach(), rank=rank, exact=True,
                        name=f"default init, {component} {name} gathered at t={t} vs built at t=1")
    if component == "row" and getattr(mine, "bias", None) is not None:
        run.judge.match(_local_param(mine, "b").detach(), _local_param(whole, "b").detach(),
                        rank=rank, exact=True, name="default init, row b at t vs at t=1")


def _local_param(module, name):
    p = module.weight if name == "W" else module.bias
    return p.to_local() if hasattr(p, "to_local") else p


def _solo_simulated(fn):
    """fn(a simulated world of one rank): the t = 1 build on simulated ranks."""
    from tp_from_scratch.comm import run_spmd
    return run_spmd(fn, 1)[0]


# --- the cases ---------------------------------------------------------------------------

def _linear_case(component, check, budget=None, needs=(), fed_non_contiguous=False, inputs="",
                 **options):
    def run(r):
        check_fn = (checks.check_column_parallel_linear if component == "column"
                    else checks.check_row_parallel_linear)
        factory = _Factory(getattr(r.adapter, component), fed_non_contiguous)
        check_fn(r.group, r.dtype, r.seed, device=r.device, judge=r.judge, layout=r.adapter.layout,
                 layer_cls=factory, **options)
        if options.get("bias") is False:   # a zero bias would be a parameter: it gets a gradient and moves
            r.judge.holds(all(getattr(m, "bias", None) is None for m in factory.built), rank=tp_rank(r.group),
                          name="bias absent (the nn.Linear has none)",
                          why="the layer has a bias parameter where the nn.Linear it was built from has none")
    return Case(component, check, run, component, budget, needs, inputs)


def _embedding_case(check, budget=None, needs=(), fed_non_contiguous=False, inputs="", **options):
    def run(r):
        checks.check_vocab_parallel_embedding(
            r.group, r.dtype, r.seed, device=r.device, judge=r.judge, layout=r.adapter.layout,
            layer_cls=_Factory(r.adapter.embedding, fed_non_contiguous), **{"vocab": EVEN, **options})
    return Case("embedding", check, run, "embedding", budget, needs, inputs)


def _cross_entropy_case(check, budget=None, needs=(), fed_non_contiguous=False, inputs="", **options):
    def run(r):
        loss = r.adapter.cross_entropy
        if fed_non_contiguous:
            loss = lambda group, z, *rest: r.adapter.cross_entropy(group, non_contiguous(z), *rest)  # noqa: E731
        checks.check_vocab_parallel_cross_entropy(
            r.group, r.dtype, r.seed, device=r.device, judge=r.judge, layout=r.adapter.layout,
            loss_fn=loss, **{"vocab": EVEN, "ignored": 0.0, **options})
    return Case("cross-entropy", check, run, "cross_entropy", budget, needs, inputs)


def _mapping_case(kind, check, budget=None, needs=(), inputs="", **options):
    def run(r):
        check_mapping(r.group, r.dtype, r.seed, kind=kind, fn=getattr(r.adapter, kind),
                      layout=r.adapter.layout, judge=r.judge, device=r.device, **options)
    return Case(kind, check, run, kind, budget, needs, inputs)


def _init_case(component):
    def run(r):
        size = UNEVEN if "uneven" in r.adapter.supports else EVEN
        check_init_same_at_every_t(r, component, size, size)
    return Case(component, "default init", run, "default_init")


def _rows(n):
    return int(np.prod(n))


def _random_sizes(seed, component, t, uneven):
    """Leading dims (1 to 3 of them, each 1..4) and a size (>= t; a multiple of t unless
    uneven) drawn from the seed, the same on every rank."""
    rng = np.random.default_rng([seed, zlib.crc32(component.encode())])
    batch = tuple(int(d) for d in rng.integers(1, 5, size=int(rng.integers(1, 4))))
    size = lambda: int(rng.integers(t, 4 * t + 2) if uneven else t * rng.integers(1, 5))  # noqa: E731
    return batch, size(), size()


def all_cases(t=2, seed=0, supports=frozenset()):
    """Every case of the suite, in the order of the table."""
    B, n = (2, 3), EVEN
    N = _rows(B)
    cases = []
    for component in ("column", "row"):
        budget = {"column": ((0, 0), (1, N * n)), "row": ((1, N * n), (0, 0))}[component]
        size = (lambda m: {"out_features": m}) if component == "column" else (lambda m: {"in_features": m})
        cases += [
            _linear_case(component, None, budget),
            _linear_case(component, "AdamW step", optimizer="adamw"),
            _linear_case(component, "2-D input", batch=(6,)),
            _linear_case(component, "4-D input", batch=(2, 2, 3)),
            _linear_case(component, "bias=False", bias=False),
            _linear_case(component, "non-contiguous input", fed_non_contiguous=True),
            _linear_case(component, "two passes (accumulate)", passes=2),
            _linear_case(component, f"uneven sizes ({UNEVEN})", needs=("uneven",), **size(UNEVEN)),
        ]
        if component == "column":
            cases += [
                _linear_case(component, "gather_output=True", ((1, N * n), (1, N * n)),
                             needs=("gather_output",), gather_output=True),
                _linear_case(component, f"gather_output, uneven ({UNEVEN})",
                             needs=("gather_output", "uneven"), gather_output=True, **size(UNEVEN)),
            ]
        else:
            cases += [
                _linear_case(component, "input_is_parallel=False", ((1, N * n), (1, N * n)),
                             needs=("scatter_input",), input_is_parallel=False),
                _linear_case(component, f"input_is_parallel=False, uneven ({UNEVEN})",
                             needs=("scatter_input", "uneven"), input_is_parallel=False,
                             **size(UNEVEN)),
            ]
        uneven = "uneven" in supports
        batch, n_in, n_out = _random_sizes(seed, component, t, uneven)
        cases.append(_linear_case(component, "random shapes", batch=batch, in_features=n_in,
                                  out_features=n_out, inputs=f"x {(*batch, n_in)}, out {n_out}, seed {seed}"))
        cases.append(_init_case(component))
        cases += modes.cases(Case, component)
    ids = (3, 5)
    batch, vocab, _ = _random_sizes(seed, "embedding", t, "uneven" in supports)
    cases += [
        _embedding_case(None, ((1, _rows(ids) * 6), (0, 0))),
        _embedding_case("AdamW step", optimizer="adamw"),
        _embedding_case("1-D ids", ids_shape=(7,)),
        _embedding_case("3-D ids", ids_shape=(2, 3, 4)),
        _embedding_case("non-contiguous ids", fed_non_contiguous=True),
        _embedding_case("two passes (accumulate)", passes=2),
        _embedding_case("padding_idx", needs=("padding_idx",), padding_idx=1),
        _embedding_case(f"uneven sizes (V={UNEVEN})", needs=("uneven",), vocab=UNEVEN),
        _embedding_case("random shapes", ids_shape=batch, vocab=vocab,
                        inputs=f"ids {batch}, V {vocab}, seed {seed}"),
        _init_case("embedding"),
        *modes.cases(Case, "embedding"),
    ]
    for kind in ("f", "g", "scatter", "gather"):
        budget = {"f": ((0, 0), (1, N * n)), "g": ((1, N * n), (0, 0)),
                  "scatter": ((0, 0), (1, N * n)), "gather": ((1, N * n), (0, 0))}[kind]
        batch, features, _ = _random_sizes(seed, kind, t, "uneven" in supports and kind in ("scatter", "gather"))
        cases += [_mapping_case(kind, None, budget),
                  _mapping_case(kind, "2-D input", batch=(6,)),
                  _mapping_case(kind, "4-D input", batch=(2, 2, 3)),
                  _mapping_case(kind, "non-contiguous input", fed_non_contiguous=True)]
        if kind in ("scatter", "gather"):
            cases.append(_mapping_case(kind, f"uneven sizes ({UNEVEN})", needs=("uneven",),
                                       features=UNEVEN))
        cases.append(_mapping_case(kind, "random shapes", batch=batch, features=features,
                                   inputs=f"x {(*batch, features)}, seed {seed}"))
        cases += modes.cases(Case, kind)
    batch, vocab, _ = _random_sizes(seed, "cross-entropy", t, "uneven" in supports)
    cases += [
        # the max, the sum of exponentials and the target's logit: 3 numbers per token, at
        # most, in as few all-reduces as the library likes (Megatron: 3; fused: 2)
        _cross_entropy_case(None, ((1, 3 * 15), (0, 0))),
        _cross_entropy_case("2-D logits", batch=(15,)),
        _cross_entropy_case("4-D logits", batch=(2, 3, 4)),
        _cross_entropy_case("non-contiguous logits", fed_non_contiguous=True),
        _cross_entropy_case("ignore_index", needs=("ignore_index",), ignored=0.3),
        _cross_entropy_case("large logits (x1000)", scale=1e3),
        _cross_entropy_case(f"uneven sizes (V={UNEVEN})", needs=("uneven",), vocab=UNEVEN),
        _cross_entropy_case("random shapes", batch=batch, vocab=vocab, scale=30.0,
                            inputs=f"logits {(*batch, vocab)} x30, seed {seed}"),
        *modes.cases(Case, "cross-entropy"),
    ]
    for component_cases in sp.cases(Case, t=t, seed=seed, supports=supports, non_contiguous=non_contiguous,
                                    random_sizes=_random_sizes, uneven=UNEVEN):
        cases += component_cases + modes.cases(Case, component_cases[0].component)
    return cases


# --- running a case ----------------------------------------------------------------------

def row(adapter, component, check, dtype, t, status, detail="", **measured):
    """One row of the report, every field present (None where nothing was measured)."""
    blank = dict(error=None, bound=None, forward=None, backward=None, fwd_bytes=None,
                 bwd_bytes=None, inputs="", expected=None, matched=[], since=None, traceback="")
    measured.setdefault("severity", severity(check))
    return dict(blank, adapter=adapter, component=component, check=check, dtype=dtype, t=t,
                status=status, detail=detail, **measured)


def _label(name, check):
    """The row a quantity of a case belongs to: the case's, or its own check (a split case)."""
    return check if check is not None else check_of(name)


def _severity(entry):
    """A failing quantity's severity: the exception's, its own (a placement), or its name's."""
    return "error" if entry.raised else (entry.severity or severity(entry.name))


def _collectives(counts, budget, itemsize):
    """The collectives entry: a direction the design does without must make no call; one
    that needs communication must make at least one and move no more bytes than the design
    (Megatron-LM's; how many calls carry them is the library's choice)."""
    problems = []
    for phase, (needed, elements) in zip(("forward", "backward"), budget):
        calls, nbytes = counts[phase]
        allowed = elements * itemsize
        if needed == 0 and calls:
            problems.append(f"{phase}: {calls} collective(s), {nbytes} bytes, where the design needs none")
        elif needed and calls < needed:
            problems.append(f"{phase}: {calls} collective(s), the design needs at least {needed}")
        elif nbytes > allowed:
            problems.append(f"{phase}: {calls} collective(s) moved {nbytes} bytes; the design moves {allowed}")
    return Entry("collectives", not problems, why="; ".join(problems))


def _expectations(adapter, component, check, failed):
    """(reason, patterns, uncovered checks) of a row's failing quantities under the adapter's
    expected_failures: reason when every failing check is expected (the row reads XFAIL once
    merged), the patterns that covered something, the checks nobody expected."""
    reasons, patterns, uncovered = [], [], []
    for e in failed:
        found = adapter.expected_failure(component, check, check_of(e.name))
        if found is None:
            uncovered.append(check_of(e.name))
        else:
            reasons.append(found[0])
            patterns.append(found[1])
    reason = "; ".join(dict.fromkeys(reasons)) if failed and not uncovered else None
    return reason, sorted(set(patterns)), sorted(set(uncovered))


def run_case(case, group, dtype, adapter, exclusive=None, seed=0, device="cpu", solo=None,
             phase_seen=None):
    """Run one case; return its rows as dicts (this rank's view)."""
    t = tp_world_size(group)
    where = (adapter.name, case.component)
    dtype_name = str(dtype).replace("torch.", "")
    label = case.check or "(all)"
    if getattr(adapter, case.provider) is None:
        return [row(*where, label, dtype_name, t, "NOT PROVIDED", f"adapter.{case.provider} is None")]
    missing = [need for need in case.needs if need not in adapter.supports]
    if missing:
        return [row(*where, label, dtype_name, t, "SKIP", f"not in supports: {', '.join(missing)}")]
    if adapter.contract < case.contract:
        return [row(*where, label, dtype_name, t, "SKIP", f"a contract {case.contract} check ({case.note}); "
                    f"the adapter declares contract {adapter.contract}")]
    judge = Recorder(group, exclusive, phase_seen)
    solo = solo or (_solo_simulated if isinstance(group, Comm) else None)
    trace = ""
    try:
        case.run(Run(group, dtype, judge, adapter, seed, device, solo))
    except Exception as error:  # noqa: BLE001 - a crashing implementation is an ERROR, not a stop
        judge.failed("exception", describe(error))
        trace = traceback.format_exc()
    counts = judge.counts
    if case.budget is not None and not any(e.raised for e in judge.entries):
        judge.entries.append(_collectives(counts, case.budget, torch.empty(0, dtype=dtype).element_size()))
    rows = {}
    for entry in judge.entries:
        rows.setdefault(_label(entry.name, case.check), []).append(entry)
    out = []
    for check, entries in rows.items():
        worst = max(entries, key=lambda e: e.error / e.bound if e.bound > 0 else (0 if e.error == 0 else float("inf")))
        failed = [e for e in entries if not e.ok]
        status = "ERROR" if any(e.raised for e in failed) else "FAIL" if failed else "PASS"
        worst_kind = min((SEVERITIES.index(_severity(e)) for e in failed), default=None)
        reason, patterns, uncovered = _expectations(adapter, case.component, check, failed)
        detail = "; ".join(e.why for e in failed)
        stale = adapter.row_pattern(case.component, check) if uncovered else None
        if stale:
            detail += (f" | expected_failures[{stale!r}] names this row, not a check: since contract 3 a pattern "
                       f"names the check that fails ({', '.join(uncovered)}): write "
                       f"'{case.component}/{check}/{uncovered[0]}', or declare contract=2 for the old meaning")
        if failed and case.since and case.since > 2:
            detail = f"(a check new in contract {case.since}{': ' + case.note if case.note else ''}) {detail}"
        out.append(row(*where, check, dtype_name, t, status, detail,
                       severity=severity(check) if worst_kind is None else SEVERITIES[worst_kind],
                       error=worst.error, bound=worst.bound, forward=counts["forward"][0],
                       backward=counts["backward"][0], fwd_bytes=counts["forward"][1],
                       bwd_bytes=counts["backward"][1], inputs=case.inputs,
                       expected=reason, matched=patterns, since=case.since,
                       traceback=trace if status == "ERROR" else ""))
    return out


def run_suite(group, adapter, dtypes=(torch.float64, torch.float32), exclusive=None, seed=0,
              device="cpu"):
    """Every case of the suite for ``adapter`` on this rank, in every dtype: a list of row dicts.

    In-process, without the worker's isolation (a rank that desynchronises stalls the others
    until the group's timeout): for simulated ranks (run_spmd) and tests; the ``verify``
    command runs the same cases one by one in isolated workers (verify/worker.py).
    exclusive: a lock the simulated ranks share, so default-init checks draw from torch's
    global RNG one rank at a time (None in separate processes: each has its own RNG).
    """
    if isinstance(group, Comm) and "comm" not in adapter.supports:
        return [row(adapter.name, "(all)", "(all)", "-", tp_world_size(group), "SKIP",
                    "needs a torch ProcessGroup ('comm' not in supports)")]
    if adapter.setup is not None:
        adapter.setup(group)
    rows = []
    for dtype in dtypes:
        for case in all_cases(tp_world_size(group), seed, adapter.supports):
            rows += run_case(case, group, dtype, adapter, exclusive, seed, device)
    return rows
