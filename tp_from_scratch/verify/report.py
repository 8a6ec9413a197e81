"""The rows of every rank merged into one table (and JSON), the summary and the exit status.

Exit status of ``.venv/bin/python -m tp_from_scratch.verify``:
    0  every check ran passed (or failed as the adapter declared: XFAIL)
    1  some check FAILed or raised (ERROR)
    2  the suite itself could not run (bad arguments, processes that never started)
    3  nothing was checked: t = 1, or no adapter provides a checked component
"""
import json

from tp_from_scratch.verify.suite import SEVERITIES

STATUSES = ("ERROR", "FAIL", "XFAIL", "PASS", "SKIP", "NOT PROVIDED")
SCHEMA = "tp_from_scratch.verify/2"
ALL_PASS, SOME_FAIL, COULD_NOT_RUN, NOTHING_CHECKED = 0, 1, 2, 3


def _ratio(row):
    error, bound = row["error"], row["bound"]
    if error is None:
        return -1.0
    return error / bound if bound else (0.0 if error == 0 else float("inf"))


def _ranks(ranks):
    return f"rank {ranks[0]}" if len(ranks) == 1 else f"ranks {', '.join(map(str, ranks))}"


def rank_states(states):
    """'rank 0: msg; ranks 1, 2: other msg', one entry per distinct state, in rank order."""
    by_state = {}
    for rank, state in sorted(states.items()):
        by_state.setdefault(state, []).append(rank)
    return "; ".join(f"{_ranks(ranks)}: {state}" for state, ranks in by_state.items())


def merge(per_rank):
    """One row per (adapter, component, check, dtype, t) from every rank's rows.

    ERROR if any rank raised, else FAIL if any rank failed; the detail gives every failing
    rank's own message (and, where the ranks disagree, the others' state); the largest
    error over the ranks; the collective counts of the rank that counted most (equal on
    every rank of a correct implementation). A FAIL or ERROR the adapter declared in
    expected_failures becomes XFAIL, its reason first in the detail.
    """
    merged, states = {}, {}
    for rank, rows in enumerate(per_rank):
        for row in rows:
            key = (row["adapter"], row["component"], row["check"], row["dtype"], row["t"])
            if key not in merged:
                merged[key] = dict(row, failed_ranks=[])
            into = merged[key]
            state = row["status"] + (f": {row['detail']}" if row["detail"] else "")
            states.setdefault(key, {})[rank] = state
            if row["status"] in ("ERROR", "FAIL"):
                if not into["failed_ranks"] or (SEVERITIES.index(row["severity"])
                                                < SEVERITIES.index(into["severity"])):
                    into["severity"] = row["severity"]
                into["failed_ranks"].append(rank)
                if into["status"] != "ERROR":
                    into["status"] = row["status"]
                into["traceback"] = into.get("traceback") or row.get("traceback", "")
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
        if into["status"] in ("ERROR", "FAIL") and into.get("expected"):
            into["detail"] = f"expected ({into['status']}): {into['expected']} | {into['detail']}"
            into["status"] = "XFAIL"
        out.append(into)
    return out


def launch(row):
    """The row's launch as --t spells it: "3", or "2of4" for TP groups of 2 on 4 processes."""
    world = row.get("world") or row["t"]
    return str(row["t"]) if world == row["t"] else f"{row['t']}of{world}"


def _number(x):
    return "-" if x is None else ("inf" if x == float("inf") else f"{x:.1e}")


def table(rows, verbose=False):
    """A text table, one line per row; a row that did not pass says why, for every rank."""
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
    return "\n".join(lines)


def counts(rows):
    return {s: sum(r["status"] == s for r in rows) for s in STATUSES}


def summary(rows, metadata=None):
    """One screen: the counts per adapter, then what failed, grouped by severity."""
    lines = []
    if metadata:
        lines.append(f"verify: t = {metadata['launches']}; dtypes {', '.join(metadata['dtypes'])}; "
                     f"seed {metadata['seed']} (--seed {metadata['seed']} reproduces); "
                     f"device {metadata['device']}")
    adapters = list(dict.fromkeys(r["adapter"] for r in rows))
    wa = max([7] + [len(a) for a in adapters])
    lines.append(f"{'adapter':<{wa}} " + " ".join(f"{s:>5}" if len(s) < 6 else s for s in STATUSES))
    for adapter in adapters:
        mine = counts([r for r in rows if r["adapter"] == adapter])
        nothing = "  <- nothing checked" if not (mine["PASS"] or mine["XFAIL"] or mine["FAIL"]
                                                 or mine["ERROR"]) else ""
        lines.append(f"{adapter:<{wa}} " + " ".join(f"{mine[s]:>{max(5, len(s))}}" for s in STATUSES)
                     + nothing)
    for severity in SEVERITIES:
        bad = [r for r in rows if r["status"] in ("ERROR", "FAIL") and r["severity"] == severity]
        if not bad:
            continue
        lines.append(f"{severity} failures ({len(bad)} rows):")
        grouped = {}
        for r in bad:
            checks, where = grouped.setdefault((r["adapter"], r["component"]), ({}, set()))
            checks[r["check"]] = checks.get(r["check"], r["status"])
            where.update({f"t={launch(r)}", r["dtype"]} - {"-"})
        for (adapter, component), (checks, where) in grouped.items():
            listed = ", ".join(f"{check}{'' if status == 'FAIL' else ' (' + status + ')'}"
                               for check, status in checks.items())
            lines.append(f"  {adapter}: {component}: {listed}  [{' '.join(sorted(where))}]")
    xfails = sum(r["status"] == "XFAIL" for r in rows)
    if xfails:
        lines.append(f"{xfails} expected failures (XFAIL), each with the adapter's reason in the table")
    total = counts(rows)
    lines.append(", ".join(f"{n} {s}" for s, n in total.items()))
    return "\n".join(lines)


def write_json(rows, path, metadata=None):
    """The schema version, the run's metadata and every row, nothing shortened (inf as null)."""
    clean = [{k: (None if v == float("inf") else v) for k, v in row.items()} for row in rows]
    document = dict(schema=SCHEMA, run=metadata or {}, counts=counts(rows), rows=clean)
    with open(path, "w") as out:
        json.dump(document, out, indent=1)


def exit_status(rows):
    """0 all checked rows pass, 1 some FAIL or ERROR, 3 nothing was checked (see the module)."""
    if any(r["status"] in ("FAIL", "ERROR") for r in rows):
        return SOME_FAIL
    if not any(r["status"] in ("PASS", "XFAIL") for r in rows):
        return NOTHING_CHECKED
    return ALL_PASS
