"""Lesson 7's trainer under torchrun, everything 4 processes need checked in ONE launch.

    .venv/bin/torchrun --standalone --nproc-per-node 4 -m tests.spmd_scripts.sp_training --checkpoint DIR [--steps S]

On a tp=4 mesh, a one-block GPT (half the collectives of two; the DTensor plan's first block is
then also its last): ours (recomputing the attention core) S float32 steps (default 50), then PyTorch's
DTensor plan 5 float64 steps, each step against one device by the trainer itself
(--compare-single). On a dp=2 x tp=2 mesh of the same processes: ours S float64 steps, saved
WITH sequence parallelism; then, on the tp=4 mesh, Lesson 6's trainer loads it WITHOUT sequence
parallelism, trains 5 steps and saves; then ours loads that at tp=2 and trains 5 more. Rank 0
compares every step of the three runs with one uninterrupted single-device run (float64:
near-bitwise). Then the DTensor plan 5 float32 steps at dp=2 x tp=2. Prints "check <name>: ok"
per run; exits 1 if any differs.
"""
import argparse
import json
import sys
from pathlib import Path

import torch
import torch.distributed as dist

from tp_from_scratch.compare import assert_matches_reference, tolerance
from tp_from_scratch.gpt import train as lesson6
from tp_from_scratch.comm.process_group import init_process_group
from tp_from_scratch.gpt.mesh import setup_mesh
from tp_from_scratch.sequence_parallel import train as lesson7

TINY = ["--hidden", "32", "--heads", "8", "--kv-heads", "4", "--seq-len", "16",
        "--vocab-size", "64", "--batch-size", "4", "--no-progress", "--timeout", "60"]


def trainer_args(trainer, *extra, layers=2):
    return trainer.parse(TINY + ["--layers", str(layers)] + [str(a) for a in extra])


def checked(name, status, mesh, failures):
    """Record a run's verdict (rank 0 holds the single-device comparison)."""
    if mesh.rank == 0:
        print(f"check {name}: {'ok' if status == 0 else 'DIFFERS'}", flush=True)
        if status:
            failures.append(name)


def losses_from(path):
    return {r["step"]: r["loss"] for r in map(json.loads, Path(path).read_text().splitlines()) if "loss" in r}


def checkpoint_round_trip(root, meshes, failures, steps):
    """SP at tp=2 saves -> no SP at tp=4 loads, trains, saves -> SP at tp=2 loads, trains;
    every step equal to one uninterrupted single-device run."""
    root = Path(root)
    runs = [  # (name, trainer, tp, arguments)
        ("sp tp=2 saves", lesson7, 2, ["--steps", steps, "--save", root / "sp", "--dtype", "float64",
                                        "--compare-single"]),
        ("no sp tp=4 loads", lesson6, 4, ["--steps", steps + 5, "--load", root / "sp", "--save", root / "tp",
                                           "--dtype", "float64"]),
        ("sp tp=2 loads", lesson7, 2, ["--steps", steps + 10, "--load", root / "tp", "--dtype", "float64"]),
    ]
    for i, (name, trainer, tp, extra) in enumerate(runs):
        args = trainer_args(trainer, "--tp", tp, "--metrics", root / f"metrics{i}.jsonl", *extra)
        status = trainer.run(args, meshes[tp])
        checked(f"float64 {name}", status, meshes[tp], failures)
    if meshes[2].rank != 0:
        return
    args = trainer_args(lesson6, "--steps", steps + 10, "--dtype", "float64")
    expected = {step: loss.item() for step, loss in
                lesson6.single_device_run(args.model, args)}
    got = {}
    for i in range(len(runs)):
        got.update(losses_from(root / f"metrics{i}.jsonl"))
    try:
        assert sorted(got) == list(range(steps + 10)), sorted(got)
        for step, loss in got.items():
            assert_matches_reference(torch.tensor(loss, dtype=torch.float64),
                                     torch.tensor(expected[step], dtype=torch.float64),
                                     name=f"loss at step {step} of the save/load chain",
                                     tol=tolerance("float64", layers=args.model.n_layers,
                                                   steps=step))
        print("check checkpoint chain against one uninterrupted single-device run: ok", flush=True)
    except AssertionError as e:
        print(f"check checkpoint chain: DIFFERS: {e}", flush=True)
        failures.append("checkpoint chain")


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--checkpoint", required=True, help="a directory for the save/load chain")
    p.add_argument("--steps", type=int, default=50, help="steps of ours on each mesh (make test: 20)")
    opts = p.parse_args()
    failures = []
    try:
        init_process_group("cpu", 60)   # torch_main's start, without its exit: this script exits itself
        meshes = {tp: setup_mesh(tp, timeout=60, dtensor=True) for tp in (4, 2)}
        args = trainer_args(lesson7, "--tp", 4, "--steps", opts.steps, "--dtype", "float32",
                            "--recompute-attention", "--compare-single", layers=1)
        checked(f"float32 ours (recomputed attention), {opts.steps} steps",
                lesson7.run(args, meshes[4]), meshes[4], failures)
        args = trainer_args(lesson7, "--tp", 4, "--steps", 5, "--dtype", "float64", "--impl", "dtensor",
                            "--compare-single", layers=1)
        checked("float64 dtensor, 5 steps", lesson7.run(args, meshes[4]),
                meshes[4], failures)
        checkpoint_round_trip(opts.checkpoint, meshes, failures, opts.steps)
        args = trainer_args(lesson7, "--tp", 2, "--steps", 5, "--dtype", "float32", "--impl", "dtensor",
                            "--compare-single", layers=2)
        checked("float32 dtensor dp=2 x tp=2, 5 steps", lesson7.run(args, meshes[2]),
                meshes[2], failures)
    finally:
        dist.destroy_process_group()
    if failures:
        print(f"failed: {failures}", flush=True)
        sys.exit(1)


if __name__ == "__main__":
    main()
