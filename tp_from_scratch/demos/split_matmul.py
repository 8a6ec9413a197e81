"""Lesson 1 demo: one matmul split across t simulated devices, by columns and by rows.

    .venv/bin/python -m tp_from_scratch.demos.split_matmul [--tp 4] [--batch 8] [--hidden 1024] [--ffn 4096]

Prints each device's memory and the largest error against the single-device product.
"""
import argparse

import numpy as np

from tp_from_scratch.compare import TOLERANCE, assert_matches_reference, max_error
from tp_from_scratch.gpt.options import add_model_flags
from tp_from_scratch.matmul import column_parallel_matmul, matmul_reference, row_parallel_matmul, sum_partials
from tp_from_scratch.sharding import shard, unshard
from tp_from_scratch.testing import random_array, rank_rng


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--tp", type=int, default=4, help="number of simulated devices")
    parser.add_argument("--batch", type=int, default=8)
    add_model_flags(parser, title="sizes", only=("hidden", "ffn"), defaults=dict(hidden=1024, ffn=4096),
                    helps=dict(hidden="H: X is (B, H)", ffn="F: W is (H, F)"))
    args = parser.parse_args(argv)
    if args.tp < 1:
        parser.error(f"--tp must be at least 1, got {args.tp}")

    rng = rank_rng(0)
    x = random_array(rng, (args.batch, args.hidden), np.float32)  # (B, H)
    w = random_array(rng, (args.hidden, args.ffn), np.float32)    # (H, F)
    y = matmul_reference(x, w)
    t = args.tp
    print(f"Y = X @ W with X {x.shape}, W {w.shape} (float32), split over t={t} devices\n")

    y_col = unshard(column_parallel_matmul(x, shard(w, t, axis=1)), axis=1)
    y_row = sum_partials(row_parallel_matmul(shard(x, t, axis=1), shard(w, t, axis=0)))
    full_mib = w.nbytes / 2**20
    print(f"{'split':<8} {'W per device':>14} {'of full W':>10} {'max |error|':>12}  verdict")
    for name, got in [("column", y_col), ("row", y_row)]:
        assert_matches_reference(got, y, name=f"{name}-parallel Y")
        print(f"{name:<8} {full_mib / t:>10.2f} MiB {1 / t:>10.0%} {max_error(got, y):>12.2e}  "
              f"equal (tolerance {TOLERANCE['float32']:.0e} x scale)")
    print("\nBoth splits reproduce the single-device Y; each device holds 1/t of W.")


if __name__ == "__main__":
    main()
