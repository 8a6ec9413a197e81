"""The rows of every rank merged into one table (and JSON), the summary and the exit status.

Exit status of ``.venv/bin/python -m tp_from_scratch.verify``:
    0  every check ran passed (or failed as the adapter declared: XFAIL)
    1  some check FAILed or raised (ERROR)
    2  the suite itself could not run (bad arguments, processes that never started)
    3  nothing was checked: t = 1, or no adapter provides a checked component
"""
import fnmatch
import json
import os

from tp_from_scratch.verify.adapter import CHECKS
from tp_from_scratch.verify.suite import SEVERITIES

STATUSES = ("ERROR", "FAIL", "XFAIL", "PASS", "SKIP", "NOT PROVIDED")
FAILING = ("ERROR", "FAIL")
SCHEMA = "tp_from_scratch.verify/3"
ALL_PASS, SOME_FAIL, COULD_NOT_RUN, NOTHING_CHECKED = 0, 1, 2, 3
# words of a rank that only saw a peer go: a collective timed out, the connection closed
_ECHO = ("timed out", "timeout", "gloo", "connection", "closed by peer", "gave up waiting", "nccl")


def busy(seconds, flag):
    """What a timeout may mean, with the machine's load: a hang, or a machine too busy to finish."""
    try:
        load = f"load average {os.getloadavg()[0]:.1f} on {os.cpu_count()} cores"
    except OSError:
        load = f"{os.cpu_count()} cores"
    return (f"nothing came for {seconds:g} s ({flag} {seconds:g}): a hang, or a machine too busy to finish in "
            f"time ({load} now); if the machine is busy, rerun with a larger {flag}")


def _echo(state):
    """Whether a rank's state only reports a peer's failure (its collective timed out, ...)."""
    return any(word in state.lower() for word in _ECHO)


def _ratio(row):
    error, bound = row["error"], row["bound"]
    if error is None:
        return -1.0
    return error / bound if bound else (0.0 if error == 0 else float("inf"))


def _ranks(ranks):
    return f"rank {ranks[0]}" if len(ranks) == 1 else f"ranks {', '.join(map(str, ranks))}"


def rank_states(states):
    """'rank 1: ValueError ...; ranks 0, 2: gloo timed out ...', one entry per distinct state:
    the causes first (a rank that raised or hung), then the ranks that only saw a peer go (a
    collective timed out, a connection closed), each in rank order."""
    by_state = {}
    for rank, state in sorted(states.items()):
        by_state.setdefault(state, []).append(rank)
    order = sorted(by_state.items(), key=lambda item: (_echo(item[0]), item[1][0]))
    return "; ".join(f"{_ranks(ranks)}: {state}" for state, ranks in order)


def merge(per_rank):
    """One row per (adapter, component, check, dtype, t) from every rank's rows.

    ERROR if any rank raised, else FAIL if any rank failed; the detail gives every failing
    rank's own message, the raising rank's before the others' timeouts (and, where the ranks
    disagree, the others' state); the largest error over the ranks; the collective counts of
    the rank that counted most (equal on every rank of a correct implementation). A row whose
    every failing check, on every rank, the adapter declared in expected_failures reads XFAIL,
    the reasons first in the detail; a failing check nobody declared keeps it FAIL.
    """
    merged, states, expected = {}, {}, {}
    for rank, rows in enumerate(per_rank):
        for row in rows:
            key = (row["adapter"], row["component"], row["check"], row["dtype"], row["t"])
            if key not in merged:
                merged[key] = dict(row, failed_ranks=[], matched=[])
            into = merged[key]
            state = row["status"] + (f": {row['detail']}" if row["detail"] else "")
            states.setdefault(key, {})[rank] = state
            into["matched"] = sorted(set(into["matched"]) | set(row.get("matched") or []))
            if row["status"] in FAILING:
                if not into["failed_ranks"] or (SEVERITIES.index(row["severity"])
                                                < SEVERITIES.index(into["severity"])):
                    into["severity"] = row["severity"]
                into["failed_ranks"].append(rank)
                if into["status"] != "ERROR":
                    into["status"] = row["status"]
                into["traceback"] = into.get("traceback") or row.get("traceback", "")
                expected.setdefault(key, []).append(row.get("expected"))
            if _ratio(row) > _ratio(into):
                into["error"], into["bound"] = row["error"], row["bound"]
            for field in ("forward", "backward", "fwd_bytes", "bwd_bytes"):
                if row.get(field) is not None and (into.get(field) is None or row[field] > into[field]):
                    into[field] = row[field]
    out = []
    for key, into in merged.items():
        mine = states[key]
        if into["failed_ranks"]:
            shown = mine if len(set(mine.values())) > 1 else {r: s for r, s in mine.items()
                                                              if r in into["failed_ranks"]}
            into["detail"] = rank_states(shown)
        into["ranks"] = {str(r): s for r, s in sorted(mine.items())}
        reasons = expected.get(key, [])
        if reasons and all(reasons):
            into["expected"] = "; ".join(dict.fromkeys(reasons))
            into["detail"] = f"expected ({into['status']}): {into['expected']} | {into['detail']}"
            into["status"] = "XFAIL"
        else:
            into["expected"] = None
        out.append(into)
    return out


def xpasses(rows, declared):
    """The expected failures that matched no failing check in this run although the checks
    they name ran: [{adapter, pattern, reason}] (pytest's XPASS: the library no longer fails
    there). declared: {adapter name: {"contract": n, "patterns": {pattern: reason}}}. A contract-3
    pattern naming a row rather than a check is not one: see row_patterns."""
    out = []
    for adapter, what in declared.items():
        mine = [r for r in rows if r["adapter"] == adapter and r["status"] not in ("SKIP", "NOT PROVIDED")]
        used = {p for r in mine for p in r.get("matched") or []}
        for pattern, reason in what["patterns"].items():
            parts = pattern.split("/")
            if what["contract"] >= 3 and _names_a_row(pattern):
                continue
            by_row = what["contract"] < 3 or len(parts) >= 3   # its second part names a row
            ran = [r for r in mine if fnmatch.fnmatchcase(r["component"], parts[0]) and
                   (not by_row or fnmatch.fnmatchcase(r["check"], parts[1]))]
            if ran and pattern not in used:
                out.append(dict(adapter=adapter, pattern=pattern, reason=reason))
    return out


def _names_a_row(pattern):
    """A "component/X" pattern whose X is no check a row measures (it meant a row)."""
    parts = pattern.split("/")
    return len(parts) == 2 and not any(fnmatch.fnmatchcase(c, parts[1]) for c in CHECKS)


def row_patterns(declared):
    """[(adapter, pattern)]: the contract-3 patterns that name a row, not a check (they match
    nothing since contract 3; adapter.CHANGES[3])."""
    return [(a, p) for a, what in declared.items() if what["contract"] >= 3
            for p in what["patterns"] if _names_a_row(p)]


def launch(row):
    """The row's launch as --t spells it: "3", or "2of4" for TP groups of 2 on 4 processes."""
    world = row.get("world") or row["t"]
    return str(row["t"]) if world == row["t"] else f"{row['t']}of{world}"


def _number(x):
    return "-" if x is None else ("inf" if x == float("inf") else f"{x:.1e}")


def _collapsed(rows):
    """The rows, each run of NOT PROVIDED rows of one adapter, component, dtype and launch made one."""
    out = []
    for r in rows:
        last = out[-1] if out else None
        if r["status"] == "NOT PROVIDED" and last is not None and last["status"] == "NOT PROVIDED" and \
                all(last[k] == r[k] for k in ("adapter", "component", "dtype", "t")) and \
                launch(last) == launch(r):
            last["_count"] = last.get("_count", 1) + 1
            last["check"] = f"({last['_count']} checks)"
            continue
        out.append(dict(r))
    return out


def table(rows, verbose=False, failures_only=False):
    """A text table, one line per row (the NOT PROVIDED rows of a component in one line); a row
    that did not pass says why, for every rank. failures_only: the ERROR and FAIL rows alone."""
    rows = [r for r in rows if r["status"] in FAILING] if failures_only else _collapsed(rows)
    width = lambda field, least: max([least] + [len(str(r[field])) for r in rows])  # noqa: E731
    wa, wc, wk = width("adapter", 7), width("component", 9), width("check", 5)
    head = (f"{'adapter':<{wa}} {'component':<{wc}} {'check':<{wk}} {'dtype':<8} {'t':>4} "
            f"{'status':<12} {'max error':>9} {'bound':>8} {'fwd':>3} {'bwd':>3}  detail")
    lines = [head, "-" * len(head)]
    for r in rows:
        detail = r["detail"] if r["status"] != "PASS" else ""
        if r["status"] != "PASS" and r.get("inputs"):
            detail = f"[{r['inputs']}] {detail}"
        lines.append(f"{r['adapter']:<{wa}} {r['component']:<{wc}} {r['check']:<{wk}} "
                     f"{r['dtype']:<8} {launch(r):>4} {r['status']:<12} {_number(r['error']):>9} "
                     f"{_number(r['bound']):>8} {'-' if r['forward'] is None else r['forward']:>3} "
                     f"{'-' if r['backward'] is None else r['backward']:>3}  {detail}")
        if verbose and r.get("traceback"):
            lines += ["    " + line for line in r["traceback"].rstrip().splitlines()]
    if failures_only and not rows:
        lines.append("(no ERROR or FAIL row)")
    return "\n".join(lines)


def counts(rows):
    return {s: sum(r["status"] == s for r in rows) for s in STATUSES}


def summary(rows, metadata=None, declared=None):
    """One screen, failures first: what failed, by severity (gravest first), adapter and
    component; the expected failures that passed (XPASS); then the counts per adapter.
    declared: {adapter name: {"contract", "patterns"}}, the adapters' expected_failures."""
    lines = []
    if metadata:
        lines.append(f"verify: t = {metadata['launches']}; dtypes {', '.join(metadata['dtypes'])}; "
                     f"seed {metadata['seed']} (--seed {metadata['seed']} reproduces); "
                     f"device {metadata['device']}")
    for severity in SEVERITIES:
        bad = [r for r in rows if r["status"] in FAILING and r["severity"] == severity]
        if not bad:
            continue
        lines.append(f"{severity} failures ({len(bad)} rows): {_MEANING[severity]}")
        grouped = {}
        for r in bad:
            checks, where = grouped.setdefault((r["adapter"], r["component"]), ({}, set()))
            checks[r["check"]] = checks.get(r["check"], r["status"])
            where.update({f"t={launch(r)}", r["dtype"]} - {"-"})
        for (adapter, component), (checks, where) in grouped.items():
            listed = ", ".join(f"{check}{'' if status == 'FAIL' else ' (' + status + ')'}"
                               for check, status in checks.items())
            lines.append(f"  {adapter}: {component}: {listed}  [{' '.join(sorted(where))}]")
    for x in xpasses(rows, declared or {}):
        lines.append(f"XPASS {x['adapter']}: expected_failures[{x['pattern']!r}] ({x['reason']}) matched no "
                     "failure, though its checks ran: the library passes there now (remove the entry)")
    for adapter, pattern in row_patterns(declared or {}):
        lines.append(f"NOTE {adapter}: expected_failures[{pattern!r}] names a row, not a check: since contract 3 "
                     "a pattern names the check that fails ('component/check' or 'component/row/check'; the rows "
                     "it meant say which), or declare contract=2 for the old meaning")
    xfails = sum(r["status"] == "XFAIL" for r in rows)
    if xfails:
        lines.append(f"{xfails} expected failures (XFAIL), each with the adapter's reason in the table")
    adapters = list(dict.fromkeys(r["adapter"] for r in rows))
    wa = max([7] + [len(a) for a in adapters])
    lines.append(f"{'adapter':<{wa}} " + " ".join(f"{s:>5}" if len(s) < 6 else s for s in STATUSES))
    for adapter in adapters:
        mine = counts([r for r in rows if r["adapter"] == adapter])
        nothing = "  <- nothing checked" if not (mine["PASS"] or mine["XFAIL"] or mine["FAIL"]
                                                 or mine["ERROR"]) else ""
        lines.append(f"{adapter:<{wa}} " + " ".join(f"{mine[s]:>{max(5, len(s))}}" for s in STATUSES)
                     + nothing)
    total = counts(rows)
    lines.append(", ".join(f"{n} {s}" for s, n in total.items()))
    return "\n".join(lines)


_MEANING = {"value": "silently wrong values or gradients",
            "aliasing": "an input changed, or an output sharing memory with one",
            "error": "the library raised, hung or fell out of step (loud: a precondition or a crash)",
            "placement": "right values, placed otherwise than the block (t times the memory)",
            "convention": "collectives or default init"}


def write_json(rows, path, metadata=None, declared=None):
    """The schema version, the run's metadata, every row (nothing shortened, inf as null) and
    the expected failures that passed (XPASS)."""
    clean = [{k: (None if v == float("inf") else v) for k, v in row.items()} for row in rows]
    document = dict(schema=SCHEMA, run=metadata or {}, counts=counts(rows), rows=clean,
                    xpass=xpasses(rows, declared or {}))
    with open(path, "w") as out:
        json.dump(document, out, indent=1)


def exit_status(rows):
    """0 all checked rows pass, 1 some FAIL or ERROR, 3 nothing was checked (see the module)."""
    if any(r["status"] in ("FAIL", "ERROR") for r in rows):
        return SOME_FAIL
    if not any(r["status"] in ("PASS", "XFAIL") for r in rows):
        return NOTHING_CHECKED
    return ALL_PASS
