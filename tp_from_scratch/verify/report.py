"""The suite's rows from every rank merged into one table (and JSON), and the exit status."""
import json

STATUS_ORDER = ("FAIL", "PASS", "SKIP", "NOT PROVIDED")


def _ratio(row):
    error, bound = row["error"], row["bound"]
    return error / bound if bound else (0.0 if error == 0 else float("inf"))


def merge(per_rank):
    """One row per (adapter, component, check, dtype, t) from every rank's rows.

    FAIL if any rank failed; the largest error over the ranks; the collective counts of the
    rank that counted most (they are equal on every rank of a correct implementation).
    """
    merged = {}
    for rank, rows in enumerate(per_rank):
        for row in rows:
            key = (row["adapter"], row["component"], row["check"], row["dtype"], row["t"])
            if key not in merged:
                merged[key] = dict(row, detail=row["detail"], failed_ranks=[])
            into = merged[key]
            if row["status"] == "FAIL":
                into["status"] = "FAIL"
                into["failed_ranks"].append(rank)
                if not into["detail"]:
                    into["detail"] = row["detail"]
            if row["error"] is not None and (into["error"] is None
                                             or _ratio(row) > _ratio(into)):
                into["error"], into["bound"] = row["error"], row["bound"]
            for field in ("forward", "backward"):
                if row[field] is not None and (into[field] is None or row[field] > into[field]):
                    into[field] = row[field]
    return list(merged.values())


def _number(x):
    return "-" if x is None else ("inf" if x == float("inf") else f"{x:.1e}")


def table(rows):
    """A text table, one line per row; failures name the quantity, the ranks and the numbers."""
    head = (f"{'adapter':<22} {'component':<13} {'check':<24} {'dtype':<8} {'t':>2} {'status':<12} "
            f"{'max error':>9} {'bound':>8} {'fwd':>3} {'bwd':>3}  detail")
    lines = [head, "-" * len(head)]
    for r in rows:
        detail = r["detail"]
        if r.get("failed_ranks"):
            detail = f"ranks {r['failed_ranks']}: {detail}"
        lines.append(f"{r['adapter'][:22]:<22} {r['component']:<13} {r['check'][:24]:<24} "
                     f"{r['dtype']:<8} {r['t']:>2} {r['status']:<12} {_number(r['error']):>9} "
                     f"{_number(r['bound']):>8} {'-' if r['forward'] is None else r['forward']:>3} "
                     f"{'-' if r['backward'] is None else r['backward']:>3}  {detail[:200]}")
    counts = {s: sum(r["status"] == s for r in rows) for s in STATUS_ORDER}
    lines.append(", ".join(f"{n} {s}" for s, n in counts.items()))
    return "\n".join(lines)


def write_json(rows, path):
    """The rows as a JSON list (inf errors written as null)."""
    clean = [{k: (None if v == float("inf") else v) for k, v in row.items()} for row in rows]
    with open(path, "w") as out:
        json.dump(clean, out, indent=1)


def exit_status(rows):
    """1 if any row failed, else 0."""
    return int(any(r["status"] == "FAIL" for r in rows))
