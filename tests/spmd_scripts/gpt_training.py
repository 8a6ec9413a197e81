"""Lesson 6's trainer under torchrun: every mesh of 4 processes the tests need, in ONE launch.

    .venv/bin/torchrun --standalone --nproc-per-node 4 -m tests.spmd_scripts.gpt_training DIR [STEPS]

Each run is tp_from_scratch.gpt.train.run on one of two meshes of the same processes (tp=4,
and dp=2 x tp=2), STEPS steps (default 50) of the default tiny GPT, its losses written to
DIR/<name>.jsonl (--metrics); the checks against one device are tests/test_train.py's, in the
test process. One launch instead of eight: a launch costs more than the steps it runs.
tests/test_train.py launches it as two nodes of 2 processes (two torchrun launchers): each TP
group of the dp=2 x tp=2 mesh is one node, data parallelism runs across the nodes, and tp=4
spans both.
"""
import sys
from pathlib import Path

import torch.distributed as dist

from tp_from_scratch.gpt import train
from tp_from_scratch.comm.process_group import init_process_group
from tp_from_scratch.gpt.mesh import setup_mesh

# (name, tp, flags); {dir} is DIR, {half} the half-way checkpoint the "dp2tp2-f32" run saved (at STEPS / 2)
RUNS = [
    ("tp4-f32", 4, ["--dtype", "float32"]),
    # the TP groups on the from-scratch ring (a TorchComm over each TP process group)
    ("dp2tp2-scratch-f32", 2, ["--dtype", "float32", "--collectives", "scratch"]),
    ("tp4-f64", 4, ["--dtype", "float64", "--save", "{dir}/ckpt-tp4-f64"]),
    ("dp2tp2-f32", 2, ["--dtype", "float32", "--save", "{dir}/ckpt", "--save-every", "{half_steps}"]),
    ("dtensor-dp2tp2-f32", 2, ["--dtype", "float32", "--impl", "dtensor"]),
    # SGD, not AdamW: Adam's step ignores a gradient's scale, so only SGD sees a data-parallel
    # all-reduce that sums the gradients instead of averaging them
    ("dp2tp2-sgd-f64", 2, ["--dtype", "float64", "--optimizer", "sgd", "--save", "{dir}/ckpt-sgd"]),
    # resumed half-way: at the same tp, and resharded to tp=4
    ("resumed-tp2", 2, ["--load", "{half}"]),
    ("resumed-tp4", 4, ["--load", "{half}"]),
]


def main():
    out = Path(sys.argv[1])
    steps = int(sys.argv[2]) if len(sys.argv) > 2 else 50
    status = 0
    try:
        init_process_group("cpu", 60)   # torch_main's start, without its exit: this script exits itself
        meshes = {tp: setup_mesh(tp, timeout=60, dtensor=True) for tp in (4, 2)}
        for name, tp, flags in RUNS:
            half = next(iter(sorted((out / "ckpt").glob(f"step_{steps // 2:08d}-*"))), None)
            argv = [f.format(dir=out, half=half, half_steps=steps // 2) for f in flags]
            opts = train.parse([*argv, "--tp", str(tp), "--steps", str(steps), "--no-progress", "--timeout", "60",
                                "--metrics", str(out / f"{name}.jsonl")])
            status |= train.run(opts, meshes[tp])
            if meshes[tp].rank == 0:
                print(f"ran {name}", flush=True)
    finally:
        dist.destroy_process_group()
    sys.exit(status)


if __name__ == "__main__":
    main()
