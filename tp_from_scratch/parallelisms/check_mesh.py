"""Check several ways of training on one dp x pp x tp mesh in a single launch (the tests use it).

    .venv/bin/torchrun --standalone --nproc-per-node 4 -m tp_from_scratch.parallelisms.check_mesh \\
        --dp 2 --tp 2 --variant= --variant=--ddp --variant="--zero 1" --variant="--zero 2"

For every --variant (extra trainer flags, which may change the mesh too: --variant="--pp 2
--tp 2 --dp 1"), on the same processes, each on its own groups: train a few steps with
Lesson 11's trainer and check, on rank 0,

* every step's loss equals the single-device loss (tp_from_scratch.compare's tolerance);
* every variant's losses equal the first variant's (e.g. DDP's and ZeRO's equal the
  hand-written average's);
* every rank's weights, gradients and optimizer bytes and its bytes per step, by collective,
  group and point to point, equal the cost model's (parallelisms/cost.py), and ZeRO's
  optimizer state adds up over the DP group to the unsharded optimizer's.

Prints one line per variant and exits 1 if anything differs.
"""
import argparse
import os
import sys

import torch

from tp_from_scratch.compare import assert_matches_reference, tolerance
from tp_from_scratch.gpt import train as lesson6
from tp_from_scratch.gpt.model import GPTConfig
from tp_from_scratch.parallelisms import cost
from tp_from_scratch.parallelisms import train
from tp_from_scratch.parallelisms.mesh import setup_mesh3d


def zero_shards_add_up(record):
    """Sentences where a ZeRO record's optimizer bytes over a DP group differ from unsharded AdamW's."""
    if not record["zero"]:
        return []
    config, problems = GPTConfig(**record["config"]), []
    itemsize = {"float32": 4, "float64": 8}[record["dtype"]]
    for rank in record["ranks"]:
        if rank["dp_rank"] != 0:
            continue
        group = [r for r in record["ranks"] if (r["pp_rank"], r["tp_rank"]) == (rank["pp_rank"], rank["tp_rank"])]
        total = sum(r["memory"]["optimizer"] for r in group)
        whole = cost.memory(config, pp=record["pp"], t=record["tp"], itemsize=itemsize, stage=rank["pp_rank"],
                            tp_rank=rank["tp_rank"])["optimizer"]
        if total != whole:
            problems.append(f"ZeRO optimizer state over the DP group of rank {rank['rank']}: {total:,} bytes, "
                            f"unsharded AdamW holds {whole:,}")
    return problems


def main(argv=None):
    p = argparse.ArgumentParser(prog="python -m tp_from_scratch.parallelisms.check_mesh", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--dp", type=int, default=1)
    p.add_argument("--pp", type=int, default=1)
    p.add_argument("--tp", type=int, default=1)
    p.add_argument("--steps", type=int, default=3)
    p.add_argument("--variant", action="append", default=[], help="extra trainer flags, written --variant=\"--zero 2\" (with =)")
    p.add_argument("--common", default="", help="flags for every variant, e.g. '--dtype float64'")
    ours = p.parse_args(argv)
    world = int(os.environ.get("WORLD_SIZE", "1"))
    variants = ours.variant or [""]
    parsed = []
    for v in variants:
        args = train.parse(
            [*f"--dp {ours.dp} --pp {ours.pp} --tp {ours.tp} --steps {ours.steps} --compare-single "
               f"--no-progress {ours.common} {v}".split()])
        problem = train.validate(args, world)
        if problem:
            p.error(f"variant {v!r}: {problem}")
        parsed.append(args)
    meshes = [setup_mesh3d(*train.degrees(args, world), args.device, args.timeout) for args in parsed]
    lesson6.run_and_exit(check, list(zip(parsed, meshes)), lesson6.config_from_args(parsed[0]), meshes[0])


def check(variants, config, mesh):
    """Run every (args, mesh) variant; returns 1 if any check fails (decided on rank 0)."""
    failures, first_losses = 0, None
    for args, mesh in variants:
        out = train.train_once(args, config, mesh)
        if mesh.rank != 0:
            continue
        record = out["record"]
        problems = cost.differences(record) + zero_shards_add_up(record)
        if out["bad"]:
            problems.append(f"{out['bad']} of {args.steps} steps differ from the single-device loss")
        if first_losses is None:
            first_losses = out["losses"]
        else:
            try:
                dtype = getattr(torch, args.dtype)   # the run's precision sets the tolerance
                # every step's loss at once: the bound of the last step (the policy's growth rule)
                assert_matches_reference(torch.tensor(out["losses"], dtype=dtype),
                                         torch.tensor(first_losses, dtype=dtype),
                                         name="losses against the first variant",
                                         tol=tolerance(dtype, layers=config.n_layers, steps=args.steps - 1))
            except AssertionError as e:
                problems.append(str(e))
        verdict = (f"OK ({args.steps} steps equal to one device; memory and bytes as the cost model "
                   f"predicts)") if not problems else "FAILED: " + "; ".join(problems)
        print(f"variant {record['strategy']}: {verdict}", flush=True)
        failures += bool(problems)
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
