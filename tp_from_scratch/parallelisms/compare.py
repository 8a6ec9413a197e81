"""The comparison's rows from the trainer's --measure records, and its table (Lesson 11).

``summarise(label, record)`` turns one record (tp_from_scratch.parallelisms.train --measure,
or the bench's single launch) into a row: the memory of the rank holding the most, next to
the cost model's; the bytes per step of the rank sending the most, by TP group, DP group and
point to point, next to the cost model's total; the step time; the pipeline bubble measured
from the stages' timestamps next to (p-1)/(m+p-1). ``table(rows)`` prints them. The bench
(``.venv/bin/python -m tp_from_scratch.bench parallelisms``) measures; the lesson reads its JSON.
"""
import statistics


def in_flight_sequences(record, stage):
    """Sequences whose activations a rank keeps at once: B/dp, or for 1F1B on stage s min(p-s, m) micro-batches."""
    per_rank = record["batch_size"] // record["dp"]
    if record["pp"] == 1 or record["schedule"] == "gpipe":
        return per_rank
    m = record["micro_batches"]
    return per_rank * min(record["pp"] - stage, m) / m


def ring_factor(collective, p):
    """Bytes a ring algorithm sends per byte of payload (Lesson 2): an all-reduce of N sends
    2(p-1)/p N; an all-gather sends the p-1 pieces of the others (payload: this rank's piece);
    a reduce-scatter p-1 chunks (payload: the chunk it receives)."""
    if p == 1:
        return 0.0
    return {"all_reduce": 2 * (p - 1) / p, "all_gather": p - 1, "reduce_scatter": p - 1}.get(collective, 1.0)


def summarise(label, record):
    """One row of the table from a trainer --measure record."""
    from tp_from_scratch.gpt.model import GPTConfig
    from tp_from_scratch.cost.model import activation_bytes
    from tp_from_scratch.parallelisms import cost
    from tp_from_scratch.parallelisms.schedules import bubble, bubble_formula
    config = GPTConfig(**record["config"])
    ranks = record["ranks"]
    predicted = {r["rank"]: cost.predicted(record, r) for r in ranks}
    memory = {k: max(r["memory"][k] for r in ranks) for k in ranks[0]["memory"]}
    memory_predicted = {k: max(predicted[r["rank"]]["memory"][k] for r in ranks)
                        for k in ("weights", "gradients", "optimizer")}
    formula = max(activation_bytes(GPTConfig(**{**record["config"], "n_layers": cost.stage_blocks(
        config.n_layers, r["pp_rank"], record["pp"])}), in_flight_sequences(record, r["pp_rank"]),
        record["tp"], sequence_parallel=record["sp"]) for r in ranks)
    sizes = {"tp": record["tp"], "dp": record["dp"]}
    by_kind, payloads = [], []
    for r in ranks:
        got = cost.measured_bytes(r)
        kinds = {"tp": 0.0, "dp": 0.0, "p2p": got.pop("p2p")["bytes"]}
        for key, row in got.items():
            name, group = key.split("/")
            kinds[group] += row["bytes"] * ring_factor(name, sizes[group])
        by_kind.append(kinds)
        payloads.append(sum(row["bytes"] for row in got.values()))
    totals = [sum(k.values()) for k in by_kind]
    agrees = None if record["sp"] else not cost.differences(record)
    busiest = max(range(len(ranks)), key=lambda i: totals[i])
    row = {"strategy": label, "memory": memory, "memory_predicted": memory_predicted,
           "activations_formula_16bit": formula,
           # which rank holds the most activations: (pp stage, tp rank), printed as "s1" or "s1t0"
           "activations_rank": max(((r["memory"]["activations"], r["pp_rank"], r["tp_rank"]) for r in ranks))[1:],
           "bytes": by_kind[busiest], "bytes_total": totals[busiest], "bytes_rank": ranks[busiest]["rank"],
           "payload_bytes": payloads[busiest], "cost_model_agrees": agrees,
           "step_ms": 1e3 * statistics.median(statistics.median(r["step_s"]) for r in ranks),
           "bubble": None, "bubble_formula": None}
    if record["pp"] > 1:
        pipe = sorted((r for r in ranks if r["dp_rank"] == 0 and r["tp_rank"] == 0), key=lambda r: r["pp_rank"])
        fractions = [bubble([r["timelines"][s] for r in pipe])["fraction"] for s in range(len(pipe[0]["timelines"]))]
        row["bubble"] = statistics.median(fractions)
        row["bubble_formula"] = bubble_formula(record["pp"], record["micro_batches"])
    return row


def table(rows):
    """The comparison as text: KiB of memory, KiB sent per step, ms, bubble %."""
    head = (f"{'strategy':<16} {'weights':>7} {'grads':>6} {'optim':>6} {'act':>6}{'@':<5} {'act*':>6} "
            f"{'TP KiB':>7} {'DP KiB':>7} {'p2p KiB':>7} {'model':>5} {'step ms':>7} {'bubble':>6} {'formula':>7}")
    lines = [head, "-" * len(head)]
    kib = 2 ** 10
    for r in rows:
        m, b = r["memory"], r["bytes"]
        agrees = {None: "-", True: "=", False: "DIFF"}[r["cost_model_agrees"]]
        bub = "" if r["bubble"] is None else f"{100 * r['bubble']:.0f}%"
        form = "" if r["bubble_formula"] is None else f"{100 * r['bubble_formula']:.0f}%"
        stage, tp_rank = r.get("activations_rank") or (0, 0)
        name = r["strategy"]
        where = (f"@s{stage}" if "pp" in name else "") + (f"t{tp_rank}" if "tp" in name else "")
        where = where if where.startswith("@") or not where else "@" + where
        lines.append(f"{r['strategy']:<16} {m['weights'] / kib:>7.0f} {m['gradients'] / kib:>6.0f} "
                     f"{m['optimizer'] / kib:>6.0f} {m['activations'] / kib:>6.0f}{where:<5} "
                     f"{r['activations_formula_16bit'] / kib:>6.0f} {b['tp'] / kib:>7.0f} {b['dp'] / kib:>7.0f} "
                     f"{b['p2p'] / kib:>7.0f} {agrees:>5} {r['step_ms']:>7.1f} {bub:>6} {form:>7}")
    lines += ["memory (KiB): the rank holding the most of each; weights include ZeRO's flat copy of its chunk;",
              "  grads: every parameter's .grad, plus ZeRO's gradient buffer of its chunk (ZeRO-2 keeps only that);",
              "  act: bytes autograd kept at the peak (measured), @ the rank holding them (s: pipeline stage,",
              "  t: TP rank); act*: Korthikanti et al.'s formula (16-bit, dropout);",
              "bytes (KiB per step): the rank sending the most; TP/DP: what a ring sends for the collectives",
              "  called (payload x 2(p-1)/p for all-reduce, x (p-1) for all-gather and reduce-scatter), not",
              "  what gloo moved (gloo emulates a reduce-scatter with an all-reduce, twice the bytes);",
              "  p2p: pipeline sends, metered: activations and their gradients, plus the tied embedding's",
              "  gradient between the first and the last stage; model '=': every rank's payload bytes and",
              "  weight, gradient and optimizer bytes equal the cost model's (parallelisms/cost.py), '-': not",
              "  modelled (SP); bubble: the stages' idle share, measured; formula: (p-1)/(m+p-1)"]
    return "\n".join(lines)


def markdown(rows):
    """The comparison as a Markdown table (KiB; bytes as a ring sends them; step time; bubble)."""
    kib = 2 ** 10
    lines = ["| strategy | weights | grads | AdamW | activations | TP KiB/step | DP KiB/step | p2p KiB/step "
             "| step ms | bubble: measured / (p-1)/(m+p-1) |",
             "|---|---:|---:|---:|---:|---:|---:|---:|---:|---|"]
    for r in rows:
        m, b = r["memory"], r["bytes"]
        bub = "" if r["bubble"] is None else f"{100 * r['bubble']:.0f}% / {100 * r['bubble_formula']:.0f}%"
        lines.append(f"| {r['strategy']} | {m['weights'] / kib:.0f} | {m['gradients'] / kib:.0f} | "
                     f"{m['optimizer'] / kib:.0f} | {m['activations'] / kib:.0f} | {b['tp'] / kib:.0f} | "
                     f"{b['dp'] / kib:.0f} | {b['p2p'] / kib:.0f} | {r['step_ms']:.0f} | {bub} |")
    return "\n".join(lines)
