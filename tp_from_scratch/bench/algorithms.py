"""Benchmark the four from-scratch all-reduce algorithms against the native one, by message size.

    .venv/bin/mpiexec -n 2 .venv/bin/python -m tp_from_scratch.bench algorithms
    .venv/bin/torchrun --standalone --nproc-per-node 4 -m tp_from_scratch.bench algorithms --json runs/algorithms_torch4.json
    ... algorithms --write-table lessons/measurements/allreduce_algorithms.json

Every algorithm and the native all-reduce run in the same job on the same integer-valued
float32 data (each result is first checked bit for bit against the native one), taking
turns call by call at each size (bench.common.time_calls). Columns: the median microseconds
of the fastest call (on the slowest rank; the machine is shared, and the fastest of the
calls is the closest to an idle one) for each algorithm and the native all-reduce, the
fastest from-scratch algorithm, and native time / its time (>= 1: ours at least as fast).
The JSON keeps the medians too.

--write-table merges this run's winners into the selection table that
tp_from_scratch.overlap.algorithms.all_reduce reads: for this backend and p, the fastest
algorithm at each measured size, with a bound halfway (geometrically) between two sizes
where the winner changes. This is a benchmark, not a test: nothing here asserts a speed.
"""
import argparse
import json
import sys
from pathlib import Path

import numpy as np

from tp_from_scratch.bench.common import add_size_options, check_size_options, sizes, time_calls, write_report
from tp_from_scratch.comm import spmd_main
from tp_from_scratch.comm.native import native_for
from tp_from_scratch.compare import assert_matches_reference
from tp_from_scratch.overlap import algorithms as A
from tp_from_scratch.testing import random_array, rank_rng

NAMES = ["ring", "recursive_doubling", "rabenseifner", "segmented_ring"]
SHORT = {"ring": "ring", "recursive_doubling": "rec.doubl", "rabenseifner": "rabenseif",
         "segmented_ring": "seg.ring", "native": "native"}
LARGE = 2 ** 22  # bytes from which a size runs at most --large-iters timed calls


def measure(comm, native, size, args):
    """One row: every algorithm and the native all-reduce at ``size`` bytes of float32."""
    count = max(1, size // 4)
    x = random_array(rank_rng(11, comm.rank), (count,), np.float32, integer=True)
    calls = {name: (lambda name=name: A.ALGORITHMS[name](comm, x, **_kwargs(name, args))) for name in NAMES}
    calls["native"] = lambda: native.all_reduce(x)
    reference = calls["native"]()
    for name in NAMES:  # the same numbers first, then the speed means something
        assert_matches_reference(calls[name](), reference, name=f"{name} vs native", rank=comm.rank, exact=True)
    iters = args.iters if count * 4 < LARGE else min(args.iters, args.large_iters)
    median, fastest = time_calls(comm, list(calls.values()), args.warmup, iters)
    row = {"size": count * 4, "count": count, "ranks": comm.world_size, "iters": iters}
    for name, seconds, best in zip(calls, median, fastest):
        row[f"{name}_time_us"], row[f"{name}_min_time_us"] = seconds * 1e6, best * 1e6
    # the machine is shared: the fastest of the calls is the closest to an idle machine, so
    # the winner and the comparison with native come from it (the medians are kept too)
    row["best"] = min(NAMES, key=lambda name: row[f"{name}_min_time_us"])
    row["native_over_best"] = row["native_min_time_us"] / row[f"{row['best']}_min_time_us"]
    return row


def _kwargs(name, args):
    return {"segment_bytes": args.segment_bytes} if name == "segmented_ring" else {}


def smoothed_winners(rows):
    """The fastest algorithm at each size, judged over the size and its two neighbours.

    On a shared machine one size's timings can be off by a scheduler time slice, which
    would make the winner flip back and forth from size to size. Each algorithm's score at
    a size is the sum of log(fastest time) over that size and the sizes next to it (a
    geometric mean over three neighbouring sizes); the lowest score wins.
    """
    logs = np.log([[row[f"{name}_min_time_us"] for name in NAMES] for row in rows])  # (sizes, algorithms)
    winners = []
    for i in range(len(rows)):
        window = logs[max(0, i - 1):i + 2].sum(axis=0)
        winners.append(NAMES[int(np.argmin(window))])
    return winners


def rules_from_rows(rows):
    """[[bound, algorithm], ..., [None, algorithm]]: the measured winners as size intervals.

    Winners are smoothed over neighbouring sizes (smoothed_winners); consecutive sizes with
    the same winner merge; where the winner changes between sizes a and b, the bound is
    sqrt(a*b) (sizes are measured on a geometric grid).
    """
    rows = sorted(rows, key=lambda r: r["size"])
    winners = smoothed_winners(rows)
    rules = []
    for i in range(1, len(rows)):
        if winners[i] != winners[i - 1]:
            rules.append([int(np.sqrt(rows[i - 1]["size"] * rows[i]["size"])), winners[i - 1]])
    rules.append([None, winners[-1]])
    return rules


def crossover_lines(rows):
    """The winner by size, and where ours is at least as fast as the native all-reduce."""
    lines = []
    for bound, name in rules_from_rows(rows):
        lines.append(f"  {name:<19} up to {bound} B" if bound else f"  {name:<19} beyond")
    fine = [r["size"] for r in rows if r["native_over_best"] >= 1]
    if fine:
        lines.append(f"fastest from-scratch >= native at {len(fine)} of {len(rows)} sizes, "
                     f"smallest {min(fine)} B, largest {max(fine)} B")
    else:
        lines.append(f"fastest from-scratch slower than native at every one of {len(rows)} sizes")
    # what the selector would call with these rules, against native, size by size
    rules = rules_from_rows(rows)
    picked = {r["size"]: next(name for bound, name in rules if bound is None or r["size"] <= bound) for r in rows}
    fine = [r["size"] for r in rows if r[f"{picked[r['size']]}_min_time_us"] <= r["native_min_time_us"]]
    if fine:
        lines.append(f"selected (these rules) >= native at {len(fine)} of {len(rows)} sizes, "
                     f"smallest {min(fine)} B, largest {max(fine)} B")
    else:
        lines.append(f"selected (these rules) slower than native at every one of {len(rows)} sizes")
    return lines


def write_table(comm, args, rows):
    """Rank 0 merges this run's rules (backend, p) into the selection table at --write-table."""
    if comm.rank != 0:
        return
    path = Path(args.write_table)
    table = json.loads(path.read_text()) if path.exists() else {
        "about": "all-reduce algorithm by size, measured by the commands below on this machine; "
                 "read by tp_from_scratch.overlap.algorithms.all_reduce",
        "default_backend": "MPIComm", "segment_bytes": args.segment_bytes, "command": [],
        "rules": {}, "measured": {}}
    if table["segment_bytes"] != args.segment_bytes:
        raise ValueError(f"--segment-bytes {args.segment_bytes} differs from the table's "
                         f"{table['segment_bytes']}: measure every backend with the same segments")
    backend, p = type(comm).__name__, str(comm.world_size)
    table["rules"].setdefault(backend, {})[p] = rules_from_rows(rows)
    keep = ["size", *[f"{n}_{kind}time_us" for n in [*NAMES, "native"] for kind in ("", "min_")]]
    table["measured"].setdefault(backend, {})[p] = [{k: round(r[k], 2) for k in keep} for r in rows]
    # the command as a learner runs it from the repository root
    launcher = (f".venv/bin/torchrun --standalone --nproc-per-node {p}" if backend == "TorchComm"
                else f".venv/bin/mpiexec -n {p} .venv/bin/python")
    command = f"{launcher} -m tp_from_scratch.bench algorithms {' '.join(sys.argv[2:])}"
    table["command"] = [c for c in table["command"] if not c.startswith(f"{launcher} ")] + [command]
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(table, indent=1) + "\n")
    print(f"# wrote {backend} p={p} into {path}")


def format_header():
    cols = "".join(f" {SHORT[n]:>10}" for n in [*NAMES, "native"])
    unit = f" {'(us)':>10}"
    return (f"{'size':>10}{cols} {'fastest':>19} {'native/':>8}\n"
            f"{'(B)':>10}{unit * 5} "
            f"{'(ours)':>19} {'fastest':>8}")


def format_row(row):
    cols = "".join(f" {row[f'{n}_min_time_us']:>10.1f}" for n in [*NAMES, "native"])
    return f"{row['size']:>10}{cols} {row['best']:>19} {row['native_over_best']:>8.2f}"


def run(comm, args):
    native = native_for(comm)
    say = print if comm.rank == 0 else (lambda *a, **k: None)
    say(f"# all-reduce algorithms: {type(comm).__name__} vs {native.name}, {comm.world_size} ranks, "
        f"float32, warmup {args.warmup}, iters {args.iters} ({args.large_iters} from {LARGE >> 20} MiB), "
        f"segments of {args.segment_bytes} B")
    say(format_header())
    rows = []
    for size in sizes(args.min_bytes, args.max_bytes, args.factor):
        row = measure(comm, native, size, args)
        row["backend"] = native.name
        rows.append(row)
        say(format_row(row), flush=True)
    say("# fastest from-scratch algorithm by size (each size judged with its neighbours), the selector's rules:")
    for line in crossover_lines(rows):
        say("# " + line)
    write_report(comm, args, native.name, rows, say)
    if args.write_table:
        write_table(comm, args, rows)
    return rows


def parse_args(argv=None):
    parser = argparse.ArgumentParser(prog="python -m tp_from_scratch.bench algorithms", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    add_size_options(parser, max_bytes="64M", factor=4, warmup=2)
    parser.set_defaults(iters=20)
    parser.add_argument("--large-iters", type=int, default=5, help=f"timed calls per size from {LARGE >> 20} MiB")
    parser.add_argument("--segment-bytes", type=int, default=A.DEFAULT_SEGMENT_BYTES)
    parser.add_argument("--write-table", help="merge the measured winners into this selection table (rank 0)")
    args = parser.parse_args(argv)
    check_size_options(parser, args)
    return args


def main(argv=None):
    args = parse_args(argv)
    spmd_main(lambda comm: run(comm, args))


if __name__ == "__main__":
    main()
