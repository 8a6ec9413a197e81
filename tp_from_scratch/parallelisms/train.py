"""Train the GPT on a dp x pp x tp mesh, each step's loss checked against one device (Lesson 11).

    # dp=2 x tp=2 on 4 processes, gradients averaged by PyTorch's DistributedDataParallel
    .venv/bin/torchrun --standalone --nproc-per-node 4 -m tp_from_scratch.parallelisms.train --dp 2 --tp 2 --ddp --compare-single
    # dp=4 with the optimizer state sharded, gradients reduce-scattered (ZeRO-2)
    .venv/bin/torchrun --standalone --nproc-per-node 4 -m tp_from_scratch.parallelisms.train --dp 4 --zero 2 --compare-single
    # a 2-stage pipeline of tp=2 stages, 1F1B over 4 micro-batches
    .venv/bin/torchrun --standalone --nproc-per-node 4 -m tp_from_scratch.parallelisms.train --pp 2 --tp 2 \\
        --schedule 1f1b --micro-batches 4 --compare-single
    # all three: dp=2 x pp=2 x tp=2 on 8 processes
    .venv/bin/torchrun --standalone --nproc-per-node 8 -m tp_from_scratch.parallelisms.train --dp 2 --pp 2 --tp 2 --zero 1

The command line is Lesson 6's (``.venv/bin/python -m tp_from_scratch.gpt.train --help``: model size,
optimizer, batch, --compare-single, --metrics ...) plus the mesh and how DP synchronises:

    --dp D --pp P --tp T     D * P * T = the number of processes; rank layout in
                             tp_from_scratch/parallelisms/mesh.py (TP innermost)
    DP gradient sync         default: Lesson 6's hand-written average (one all-reduce of the
                             flattened gradients after backward); --ddp: PyTorch's
                             DistributedDataParallel (bucketed all-reduces, started during
                             backward as buckets fill); --zero 1|2: parallelisms/zero.py
    --schedule, --micro-batches  the pipeline's (parallelisms/pipeline.py): GPipe or 1F1B over m
    --sp                     sequence parallelism inside the TP group (Lesson 7), pp = 1
    --measure PATH           rank 0 writes every rank's memory, bytes and step times (JSON)

The training loop, data, optimizer and report are Lesson 6's (gpt/train.py): this script
only builds the model and optimizer for the mesh and supplies the step.
"""
import json
import os
import time
from pathlib import Path

import torch
import torch.distributed as dist

from tp_from_scratch.gpt import train
from tp_from_scratch.gpt.model import gpt_to_tp, init_gpt
from tp_from_scratch.gpt.traffic import CollectiveCounter
from tp_from_scratch.parallelisms.memory import SavedActivations, memory_snapshot
from tp_from_scratch.parallelisms.mesh import setup_mesh3d
from tp_from_scratch.parallelisms.zero import ZeroOptimizer


def build_parser():
    parser = train.build_parser()
    parser.prog, parser.description = "python -m tp_from_scratch.parallelisms.train", __doc__
    g = parser.add_argument_group("the dp x pp x tp mesh (Lesson 11)")
    g.add_argument("--dp", type=int, default=0, help="data-parallel degree (0: world / (pp * tp))")
    g.add_argument("--pp", type=int, default=1, help="pipeline stages")
    g.add_argument("--ddp", action="store_true", help="DP through torch's DistributedDataParallel (pp = 1)")
    g.add_argument("--zero", type=int, choices=[0, 1, 2], default=0,
                   help="1: optimizer state sharded over DP; 2: gradients too (reduce-scatter)")
    g.add_argument("--schedule", choices=["gpipe", "1f1b"], default="1f1b")
    g.add_argument("--micro-batches", type=int, default=1, metavar="M", help="per pipeline step")
    g.add_argument("--sp", action="store_true", help="sequence parallelism in the TP group (pp = 1)")
    g.add_argument("--measure", metavar="JSON", help="write every rank's memory, bytes and times")
    return parser


def degrees(args, world):
    """(dp, pp, tp) for this world; dp from --dp or the world."""
    dp = args.dp or world // max(1, args.pp * args.tp)
    return dp, args.pp, args.tp


def validate(args, world):
    """The first problem with the arguments, as a sentence; None if fine."""
    if args.pp < 1 or args.dp < 0:
        return f"--pp must be at least 1 and --dp at least 0, got pp={args.pp}, dp={args.dp}"
    dp, pp, tp = degrees(args, world)
    if dp * pp * tp != world:
        return (f"dp={dp} x pp={pp} x tp={tp} = {dp * pp * tp} ranks, but {world} processes were "
                f"launched (torchrun --nproc-per-node {dp * pp * tp})")
    if args.impl != "scratch" or args.save or args.load:
        return "parallelisms.train runs --impl scratch without --save / --load"
    if args.ddp and args.zero:
        return "--ddp and --zero are two ways of syncing DP: choose one"
    if pp > 1 and (args.ddp or args.sp):
        return "--ddp and --sp run with pp = 1 (the pipeline accumulates micro-batches itself)"
    if pp > args.layers:
        return f"pp={pp} stages for {args.layers} layers: every stage needs at least one block"
    if args.micro_batches < 1 or (args.batch_size // dp) < args.micro_batches:
        return (f"--micro-batches {args.micro_batches}: each DP rank has {args.batch_size // max(dp, 1)} "
                f"sequences to split")
    return train.validate(args, world // pp)   # Lesson 6's checks on the dp x tp part


# ---------------------------------------------------------------------------------------
# Building the model and optimizer on this rank
# ---------------------------------------------------------------------------------------

def ddp_hook_in_python(dp_group):
    """torch's own DDP bucket all-reduce (default_hooks.allreduce_hook), registered as a Python
    communication hook: it then calls torch.distributed.all_reduce, which Lesson 6's
    CollectiveCounter sees (DDP's built-in C++ path it would not)."""
    from torch.distributed.algorithms.ddp_comm_hooks.default_hooks import allreduce_hook
    return lambda state, bucket: allreduce_hook(dp_group, bucket)


def build(args, config, mesh, group):
    """(module to train, optimizer, pipeline comm or None) on this rank; ``group``: the TP layers'.

    tp = 1 trains the single-device GPT itself (no TP layers, so no TP collectives at all)."""
    dtype = getattr(torch, args.dtype)
    full = init_gpt(config, args.seed, dtype)  # the same weights on every rank
    model = full if mesh.tp == 1 else gpt_to_tp(group, full)
    if args.sp:
        from tp_from_scratch.sequence_parallel.model import SequenceParallelGPT
        model = SequenceParallelGPT(model)
    model = model.to(mesh.device)
    pp_comm = None
    if mesh.pp > 1:
        from tp_from_scratch.comm.torch_comm import TorchComm
        from tp_from_scratch.parallelisms.pipeline import PipelineStage
        pp_comm = TorchComm(mesh.pp_group, device=mesh.device if mesh.device.type == "cuda" else None,
                            timeout=args.timeout)
        model = PipelineStage(pp_comm, model)
    params = list(model.parameters())
    if args.ddp:
        from torch.nn.parallel import DistributedDataParallel
        model = DistributedDataParallel(model, process_group=mesh.dp_group, gradient_as_bucket_view=True)
        model.register_comm_hook(None, ddp_hook_in_python(mesh.dp_group))
    if args.zero:
        optimizer = ZeroOptimizer(mesh.dp_group, params, args.zero, lambda ps: train.make_optimizer(ps, args))
    else:
        optimizer = train.make_optimizer(params, args)
    return model, optimizer, pp_comm


class Step:
    """One training step on this rank, in the shape Lesson 6's train_loop calls it, recording
    what the comparison needs: step time, memory held, the pipeline's timeline."""

    def __init__(self, args, mesh, model, optimizer):
        self.args, self.mesh, self.model, self.optimizer = args, mesh, model, optimizer
        self.module = getattr(model, "module", model)   # inside DDP
        self.activations = SavedActivations(self.module.parameters())
        self.times, self.memory, self.timelines = [], None, []

    def __call__(self, model, optimizer, x, y, dp_group, dp):
        args, mesh = self.args, self.mesh
        start = time.perf_counter()
        optimizer.zero_grad(set_to_none=True)
        if mesh.pp > 1:
            from tp_from_scratch.parallelisms.pipeline import forward_backward
            result = forward_backward(model, x, y, args.micro_batches, args.schedule)
            loss = torch.tensor(result.loss, dtype=getattr(torch, args.dtype), device=mesh.device)
            peak = result.peak_activation_bytes
            self.timelines.append(result.timeline)
        else:
            self.activations.reset_peak()
            with self.activations.tracking():
                _, loss = model(x, y)
            loss.backward()
            peak = self.activations.peak
        if not (args.ddp or args.zero) and dp > 1:   # Lesson 6's hand-written average
            train.average_gradients([p for p in self.module.parameters() if p.grad is not None], dp_group, dp)
        optimizer.step()
        self.memory = memory_snapshot(self.module, optimizer, peak)   # what the step leaves held
        loss = loss.detach().clone()
        if dp > 1:
            dist.all_reduce(loss, group=dp_group)
            loss /= dp
        self.times.append(time.perf_counter() - start)
        return loss


def strategy_name(args, mesh):
    """A short label: "dp4 zero2", "pp2xtp2 1f1b m4", ..."""
    parts = [f"{k}{v}" for k, v in (("dp", mesh.dp), ("pp", mesh.pp), ("tp", mesh.tp)) if v > 1] or ["dp1"]
    label = "x".join(parts)
    if mesh.dp > 1:
        label += " ddp" if args.ddp else f" zero{args.zero}" if args.zero else " avg"
    if mesh.pp > 1:
        label += f" {args.schedule} m{args.micro_batches}"
    return label + (" sp" if args.sp else "")


def measurements(args, mesh, step, counter, pp_comm, n_steps, warmup=1):
    """This rank's figures: memory (bytes), payload bytes per step by (collective, group),
    point-to-point bytes per step, step times after ``warmup`` steps, the pipeline timelines."""
    p2p = pp_comm.meter.bytes_sent / max(n_steps, 1) if pp_comm is not None else 0
    return {"rank": mesh.rank, "dp_rank": mesh.dp_rank, "pp_rank": mesh.pp_rank, "tp_rank": mesh.tp_rank,
            "memory": step.memory, "collectives": counter.per_step(n_steps), "p2p_bytes_sent": p2p,
            "step_s": step.times[warmup:] or step.times, "timelines": step.timelines[warmup:]}


def train_once(args, config, mesh):
    """Build, train with Lesson 6's loop; a dict of what happened (the record on rank 0 only:
    every rank's measurements, gathered; collective over the world)."""
    counter = CollectiveCounter({mesh.tp_group: "tp", mesh.dp_group: "dp", mesh.pp_group: "pp"})
    group = train.tp_group_for(args, mesh)
    model, optimizer, pp_comm = build(args, config, mesh, group)
    step = Step(args, mesh, model, optimizer)
    compare = (args.compare_single or args.plot) and mesh.rank == 0
    reference = train.single_device_run(config, args) if compare else None
    start = time.perf_counter()
    losses, ref_losses, bad = train.train_loop(args, config, mesh, model, optimizer, 0, reference, counter,
                                               step_fn=step)
    elapsed = time.perf_counter() - start
    everyone = [None] * mesh.world
    dist.all_gather_object(everyone, measurements(args, mesh, step, counter, pp_comm, args.steps))
    if pp_comm is not None:
        pp_comm.close()   # waits for its last sends (a TorchComm over a subgroup must be closed)
    record = {"strategy": strategy_name(args, mesh), "dp": mesh.dp, "pp": mesh.pp, "tp": mesh.tp,
              "zero": args.zero, "ddp": args.ddp, "sp": args.sp, "schedule": args.schedule,
              "micro_batches": args.micro_batches, "config": config.to_dict(),
              "batch_size": args.batch_size, "dtype": args.dtype, "steps": args.steps,
              "losses": losses, "ranks": everyone}
    return {"losses": losses, "ref_losses": ref_losses, "bad": bad, "elapsed": elapsed, "group": group,
            "counter": counter, "pp_comm": pp_comm, "record": record}


def run(args, config, mesh):
    """Train and report; returns 1 if a step differs from one device."""
    if mesh.rank == 0:
        print(f"mesh dp={mesh.dp} x pp={mesh.pp} x tp={mesh.tp} ({strategy_name(args, mesh)}); "
              f"rank = (pp_index * dp + dp_index) * tp + tp_index", flush=True)
    out = train_once(args, config, mesh)
    if mesh.rank == 0:
        if args.measure:
            Path(args.measure).parent.mkdir(parents=True, exist_ok=True)
            Path(args.measure).write_text(json.dumps(out["record"]))
        train.report(args, mesh, out["group"], out["counter"], 0, out["losses"], out["ref_losses"],
                     out["bad"], out["elapsed"])
        if out["pp_comm"] is not None:
            print(f"pipeline point-to-point: {out['pp_comm'].meter.bytes_sent / max(args.steps, 1):,.0f} "
                  f"bytes sent per step by rank 0")
    return 1 if out["bad"] else 0


def main(argv=None):
    args = train.parse_valid_args(build_parser(), validate, argv)
    world = int(os.environ.get("WORLD_SIZE", "1"))
    dp, pp, tp = degrees(args, world)
    mesh = setup_mesh3d(dp, pp, tp, args.device, args.timeout)
    train.run_and_exit(run, args, train.config_from_args(args), mesh)


if __name__ == "__main__":
    main()
