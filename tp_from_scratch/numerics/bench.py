"""What invariance costs: the invariant path's time beside the default path's, on simulated ranks.

    .venv/bin/python -m tp_from_scratch.numerics.bench
    .venv/bin/python -m tp_from_scratch.numerics.bench --tokens 256 --hidden 256 --tp 4

Times a TP MLP (fc column-parallel, GeLU, proj row-parallel) forward and backward, float32: Lesson
5's layers (BLAS matmuls, the ring all-reduce) against Lesson 13's (invariant_linear where t slices
an output, one BLAS call per leaf, the fixed tree), and the two all-reduces alone with the bytes
the meter counts. Each time is the fastest of ``--repeats`` runs (the machine is shared), every
rank a thread of one process: compare the two columns, not the absolute numbers. A benchmark,
not a test: it prints, it asserts nothing about time.
"""
import argparse
import time

import numpy as np
import torch

from tp_from_scratch import collectives
from tp_from_scratch.comm import run_spmd
from tp_from_scratch.nn import ColumnParallelLinear, RowParallelLinear
from tp_from_scratch.numerics import tree
from tp_from_scratch.numerics.layers import InvariantColumnParallelLinear, InvariantRowParallelLinear


def _fastest(fn, repeats):
    best = float("inf")
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        best = min(best, time.perf_counter() - start)
    return best


def mlp_seconds(comm, invariant, tokens, hidden, ffn, repeats):
    """Fastest forward + backward of the TP MLP on this rank, in seconds."""
    gen = torch.Generator().manual_seed(0)
    fc, proj = torch.nn.Linear(hidden, ffn), torch.nn.Linear(ffn, hidden)
    column, row = (InvariantColumnParallelLinear, InvariantRowParallelLinear) if invariant else \
        (ColumnParallelLinear, RowParallelLinear)
    fc, proj = column.from_linear(fc, group=comm), row.from_linear(proj, group=comm)
    x = torch.randn(tokens, hidden, generator=gen).requires_grad_()

    def step():
        proj(torch.nn.functional.gelu(fc(x))).sum().backward()
    step()  # warm-up
    comm.barrier()
    return _fastest(step, repeats)


def all_reduce_cost(comm, tree_path, numbers, repeats):
    """(fastest seconds, bytes this rank sent) of one all-reduce of ``numbers`` float32."""
    here = tree.DEFAULT_LEAVES // comm.world_size
    leaves = np.ones((here, numbers), np.float32)
    summed = leaves.sum(0)

    def once():
        if tree_path:
            tree.tree_all_reduce(comm, leaves)
        else:
            collectives.all_reduce(comm, summed)
    comm.barrier()
    seconds = _fastest(once, repeats)
    comm.meter.reset()
    once()
    return seconds, comm.meter.bytes_sent


def compare(tp=2, tokens=128, hidden=128, ffn=512, numbers=1 << 16, repeats=3):
    """Rows of (what, default seconds, invariant seconds, invariant / default), slowest rank's time."""
    rows = []
    seconds = [max(run_spmd(mlp_seconds, tp, invariant, tokens, hidden, ffn, repeats, timeout=300))
               for invariant in (False, True)]
    rows.append((f"TP MLP forward+backward (tokens {tokens}, H {hidden}, F {ffn}, t={tp})", *seconds))
    costs = [run_spmd(all_reduce_cost, tp, tree_path, numbers, repeats, timeout=300) for tree_path in (False, True)]
    rows.append((f"all-reduce of {numbers:,} float32 (ring vs fixed tree, t={tp})",
                 max(c[0] for c in costs[0]), max(c[0] for c in costs[1])))
    rows.append(("  bytes sent by rank 0 (ring vs fixed tree)", costs[0][0][1], costs[1][0][1]))
    return [(what, a, b, b / a if a else float("nan")) for what, a, b in rows]


def table(rows):
    """The rows as text: seconds in ms, bytes as they are."""
    lines = [f"{'':<62} {'default':>12} {'invariant':>12} {'ratio':>7}"]
    for what, a, b, ratio in rows:
        fmt = (lambda v: f"{v:>12,}") if "bytes" in what else (lambda v: f"{v * 1e3:>9.2f} ms")
        lines.append(f"{what:<62} {fmt(a)} {fmt(b)} {ratio:>6.2f}x")
    return "\n".join(lines)


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tp", type=int, default=2)
    parser.add_argument("--tokens", type=int, default=128)
    parser.add_argument("--hidden", type=int, default=128)
    parser.add_argument("--ffn", type=int, default=512)
    parser.add_argument("--numbers", type=int, default=1 << 16)
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args(argv)
    try:
        tree.check_leaves(tree.DEFAULT_LEAVES, args.tp)
        for name in ("tokens", "hidden", "ffn", "numbers", "repeats"):
            if getattr(args, name) < 1:
                raise ValueError(f"--{name} must be at least 1, got {getattr(args, name)}")
        for name in ("hidden", "ffn"):
            if getattr(args, name) % tree.DEFAULT_LEAVES:
                raise ValueError(f"--{name} {getattr(args, name)} is not divisible by the "
                                 f"{tree.DEFAULT_LEAVES} leaves of the fixed reduction tree")
    except ValueError as error:
        raise SystemExit(f"numerics.bench: {error}") from None  # one line, exit status 1, before any work
    print(table(compare(args.tp, args.tokens, args.hidden, args.ffn, args.numbers, args.repeats)))


if __name__ == "__main__":
    main()
