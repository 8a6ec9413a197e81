"""PyTorch DCP checkpoints on 4 processes, everything tests/test_dcp_launched.py needs in ONE launch.

    .venv/bin/torchrun --standalone --nproc-per-node 4 -m tests.spmd_scripts.dcp_interop DIR

1. The trainer (gpt.train.run), float64: 6 steps at dp=2 x tp=2 saving in DCP's format at step 3
   (--save-every 3 --save-format dcp), then resumed from that step at tp=4 and at tp=1 (dp=4);
   DeepSeek-V3's (Lesson 12's hooks on the same run): 4 steps under expert parallelism at t = 2
   saving at step 2, resumed at t = 4 in the tensor-parallel layout; losses in DIR/<name>.jsonl.
2. The uneven trap: the embedding of a GPT with V = 10 cut by the course's plan at t = 4 (3, 3,
   2, 2 rows), saved once through DTensor.from_local(..., shape, stride) (DIR/trap-from-local)
   and once through the course's writer, gpt/dcp.py (DIR/trap-course).
3. DTensor interop: a GPT parallelized by PyTorch's parallelize_module with the course's DTensor
   plan (gpt/dtensor_plan.py) at t = 4 saves its state_dict() with dcp.save (DIR/dtensor); the same
   model loads DIR/course (a course DCP checkpoint the test wrote at t = 2) with dcp.load, and
   rank 0 writes its weights, gathered, to DIR/dtensor-loaded.pt.
The checks are the test's, in the test process.
"""
import sys
from pathlib import Path

import torch
import torch.distributed as dist
import torch.distributed.checkpoint as torch_dcp
from torch.distributed.tensor import DTensor, Shard

from tp_from_scratch.comm.process_group import init_process_group
from tp_from_scratch.gpt import dcp, train
from tp_from_scratch.gpt.checkpoint import GPT_SHARDING, read_metadata
from tp_from_scratch.gpt.dtensor_plan import parallelize_gpt
from tp_from_scratch.gpt.mesh import setup_mesh
from tp_from_scratch.gpt.model import GPTConfig, init_gpt
from tp_from_scratch.gpt.parallelize import shard_tensor

STEPS, SAVED_AT = 6, 3
# V = 13: uneven vocabulary rows at t = 2 and 4; 2 KV heads: held by 2 ranks each at t = 4
TRAIN = ["--vocab-size", "13", "--seq-len", "8", "--layers", "1", "--hidden", "16", "--heads", "4",
         "--kv-heads", "2", "--ffn", "32", "--batch-size", "4", "--dtype", "float64", "--no-progress",
         "--timeout", "60", "--steps", str(STEPS)]
RUNS = [("uninterrupted-tp2", 2, ["--save", "{dir}/ck", "--save-every", str(SAVED_AT), "--save-format", "dcp"]),
        ("resumed-tp4", 4, ["--load", "{at}"]),
        ("resumed-tp1", 1, ["--load", "{at}"])]
DEEPSEEK = ["--dtype", "float64", "--no-progress", "--timeout", "60", "--steps", "4", "--batch-size", "4",
            "--experts", "4", "--seq-len", "8"]
DEEPSEEK_RUNS = [("ds-uninterrupted-ep2", 2, ["--layout", "ep", "--save", "{dir}/ds", "--save-every", "2",
                                               "--save-format", "dcp"]),
                 ("ds-resumed-tp4", 4, ["--layout", "tp", "--load", "{at}"])]
TRAP = GPTConfig(vocab_size=10, seq_len=8, n_layers=1, hidden=8, n_heads=2, n_kv_heads=2, ffn=16)
DTENSOR = GPTConfig(vocab_size=16, seq_len=8, n_layers=1, hidden=16, n_heads=4, n_kv_heads=4, ffn=32)
SEED = 5


def trainer_runs(out, meshes):
    status = 0
    for name, tp, flags in RUNS:
        at = next((d for d in sorted((out / "ck").glob("step_*")) if read_metadata(d)[1]["step"] == SAVED_AT), None)
        opts = train.parse([*TRAIN, *[f.format(dir=out, at=at) for f in flags], "--tp", str(tp),
                            "--metrics", str(out / f"{name}.jsonl")])
        status |= train.run(opts, meshes[tp])
    from tp_from_scratch.deepseek import train as ds_train
    for name, tp, flags in DEEPSEEK_RUNS:
        at = next((d for d in sorted((out / "ds").glob("step_*")) if read_metadata(d)[1]["step"] == 2), None)
        argv = [*DEEPSEEK, *[f.format(dir=out, at=at) for f in flags], "--tp", str(tp),
                "--metrics", str(out / f"{name}.jsonl")]
        opts = ds_train.DeepSeekTrainConfig.from_args(ds_train.build_parser().parse_args(argv))
        status |= train.run(opts, meshes[tp], ds_train.hooks_for(opts))
    return status


def uneven_trap(out, mesh):
    full = init_gpt(TRAP, SEED).state_dict()["wte.weight"]            # (10, 8): rows 3, 3, 2, 2 at t = 4
    rank = dist.get_rank()
    local = shard_tensor("wte.weight", full, 4, rank, TRAP)
    plain = DTensor.from_local(local, mesh, [Shard(0)], shape=full.shape, stride=full.stride())
    torch_dcp.save({"wte.weight": plain}, checkpoint_id=out / "trap-from-local")
    placed = dcp.pieces_of("wte.weight", local, full.shape, 4, rank, TRAP, GPT_SHARDING)
    torch_dcp.save({"wte.weight": placed}, checkpoint_id=out / "trap-course")


def dtensor_interop(out, mesh):
    model = parallelize_gpt(init_gpt(DTENSOR, SEED, torch.float64), mesh)
    torch_dcp.save(model.state_dict(), checkpoint_id=out / "dtensor")
    # and back: the course's checkpoint (written at t = 2) into the DTensor model's shards
    state = model.state_dict()
    torch_dcp.load(state, checkpoint_id=read_metadata(out / "course")[0])
    full = {k: v.full_tensor() if isinstance(v, DTensor) else v for k, v in model.state_dict().items()}
    if dist.get_rank() == 0:
        torch.save(full, out / "dtensor-loaded.pt")


def main():
    out = Path(sys.argv[1])
    status = 0
    try:
        init_process_group("cpu", 60)
        meshes = {tp: setup_mesh(tp, timeout=60, dtensor=True) for tp in (4, 2, 1)}
        status |= trainer_runs(out, meshes)
        uneven_trap(out, meshes[4].device_mesh["tp"])
        dtensor_interop(out, meshes[4].device_mesh["tp"])
        dist.barrier()
        if dist.get_rank() == 0:
            print("dcp_interop done", flush=True)
    finally:
        dist.destroy_process_group()
    sys.exit(status)


if __name__ == "__main__":
    main()
