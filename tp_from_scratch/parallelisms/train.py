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

The command line is Lesson 6's (``.venv/bin/python -m tp_from_scratch.gpt.train --help``: model
size, optimizer, batch, data, --compare-single, --metrics, --plot ...) plus the mesh and how DP
synchronises:

    --dp D --pp P --tp T     D * P * T = the number of processes; rank layout in
                             tp_from_scratch/gpt/mesh.py (TP innermost)
    DP gradient sync         default: Lesson 6's hand-written average (one all-reduce of the
                             flattened gradients after backward); --ddp: PyTorch's
                             DistributedDataParallel (bucketed all-reduces, started during
                             backward as buckets fill); --zero 1|2: parallelisms/zero.py
    --schedule, --micro-batches  the pipeline's (parallelisms/pipeline.py): GPipe or 1F1B over m
    --sp                     sequence parallelism inside the TP group (Lesson 7), pp = 1
    --measure PATH           rank 0 writes every rank's memory, bytes and step times (JSON)

This is Lesson 6's run (gpt/train.py: its loop, data, report, single-device verdict and exit
status) with Lesson 11's hooks (MeshRun): it builds the model and optimizer for the mesh and
changes parts of the one step (gpt.step.train_step: the pipeline's forward and backward, DDP's
and ZeRO's own averaging).
Refused, as this trainer cannot honour them: --save / --load, --impl dtensor, and
--eval-every with pp > 1 (each stage holds only its blocks).
"""
import json
import os
import time
from dataclasses import dataclass
from pathlib import Path

import torch
import torch.distributed as dist

from tp_from_scratch.comm.launch import torch_main
from tp_from_scratch.gpt import train
from tp_from_scratch.gpt.hooks import Hooks
from tp_from_scratch.gpt.mesh import setup_mesh
from tp_from_scratch.gpt.model import init_gpt
from tp_from_scratch.gpt.options import at_least, first_problem, positive, train_flag_problem
from tp_from_scratch.gpt.parallelize import gpt_to_tp
from tp_from_scratch.gpt.step import make_optimizer, train_step
from tp_from_scratch.parallelisms.memory import SavedActivations, memory_snapshot
from tp_from_scratch.parallelisms.zero import ZeroOptimizer


@dataclass(frozen=True)
class MeshTrainConfig(train.TrainConfig):
    """Lesson 6's settings plus the dp x pp x tp mesh and how DP synchronises."""
    dp: int = 0
    pp: int = 1
    ddp: bool = False
    zero: int = 0
    schedule: str = "1f1b"
    micro_batches: int = 1
    sp: bool = False
    measure: str = None


def build_parser():
    d = MeshTrainConfig()
    parser = train.build_parser()
    parser.prog, parser.description = "python -m tp_from_scratch.parallelisms.train", __doc__
    g = parser.add_argument_group("the dp x pp x tp mesh (Lesson 11)")
    g.add_argument("--dp", type=int, default=d.dp, help="data-parallel degree (0: world / (pp * tp))")
    g.add_argument("--pp", type=int, default=d.pp, help="pipeline stages")
    g.add_argument("--ddp", action="store_true", help="DP through torch's DistributedDataParallel (pp = 1)")
    g.add_argument("--zero", type=int, choices=[0, 1, 2], default=d.zero,
                   help="1: optimizer state sharded over DP; 2: gradients too (reduce-scatter)")
    g.add_argument("--schedule", choices=["gpipe", "1f1b"], default=d.schedule)
    g.add_argument("--micro-batches", type=int, default=d.micro_batches, metavar="M", help="per pipeline step")
    g.add_argument("--sp", action="store_true", help="sequence parallelism in the TP group (pp = 1)")
    g.add_argument("--measure", metavar="JSON", help="write every rank's memory, bytes and times")
    return parser


def parse(argv=()):
    return MeshTrainConfig.from_args(build_parser().parse_args([str(a) for a in argv]))


def degrees(opts, world):
    """(dp, pp, tp) for this world; dp from --dp or the world."""
    dp = opts.dp or world // max(1, opts.pp * opts.tp)
    return dp, opts.pp, opts.tp


def validate(opts, world):
    """The first problem with the arguments, as a sentence; None if fine."""
    problem = first_problem(train_flag_problem(opts), positive("--pp", opts.pp), at_least("--dp", opts.dp, 0),
                            positive("--micro-batches", opts.micro_batches))
    if problem:
        return problem
    if opts.clip_grad_norm is not None:
        return ("--clip-grad-norm is not offered by parallelisms.train yet: its DDP, ZeRO and pipeline steps "
                "place the gradients their own way (gpt/clip.py places the TP GPT's); use gpt.train")
    dp, pp, tp = degrees(opts, world)
    if dp * pp * tp != world:
        return (f"dp={dp} x pp={pp} x tp={tp} = {dp * pp * tp} ranks, but {world} processes were "
                f"launched (torchrun --nproc-per-node {dp * pp * tp})")
    if opts.impl != "scratch" or opts.save or opts.load:
        return "parallelisms.train runs --impl scratch without --save / --load"
    if opts.ddp and opts.zero:
        return "--ddp and --zero are two ways of syncing DP: choose one"
    if pp > 1 and (opts.ddp or opts.sp):
        return "--ddp and --sp run with pp = 1 (the pipeline accumulates micro-batches itself)"
    if pp > 1 and opts.eval_every:
        return ("--eval-every evaluates the whole model on every rank, but with --pp > 1 each rank "
                "holds only its stage's blocks: run it with pp = 1")
    if pp > opts.model.n_layers:
        return f"pp={pp} stages for {opts.model.n_layers} layers: every stage needs at least one block"
    if opts.micro_batches < 1 or (opts.batch_size // dp) < opts.micro_batches:
        return (f"--micro-batches {opts.micro_batches}: each DP rank has {opts.batch_size // max(dp, 1)} "
                f"sequences to split")
    return train.validate(opts, world // pp)   # Lesson 6's checks on the dp x tp part


# ---------------------------------------------------------------------------------------
# Building the model and optimizer on this rank
# ---------------------------------------------------------------------------------------

def ddp_hook_in_python(dp_group):
    """torch's own DDP bucket all-reduce (default_hooks.allreduce_hook), registered as a Python
    communication hook: it then calls torch.distributed.all_reduce, which Lesson 6's
    CollectiveCounter sees (DDP's built-in C++ path it would not)."""
    from torch.distributed.algorithms.ddp_comm_hooks.default_hooks import allreduce_hook
    return lambda state, bucket: allreduce_hook(dp_group, bucket)


class MeshRun:
    """Lesson 11's parts of Lesson 6's run (gpt.hooks.Hooks), for one dp x pp x tp mesh: the
    model and optimizer for the mesh (build), Lesson 6's one step with the mesh's parts (step),
    and every rank's measurements gathered at the end (finish): memory held, bytes per step,
    step times, the pipeline's timelines; rank 0 then holds them as ``record``."""

    def __init__(self, opts, mesh):
        self.opts, self.mesh = opts, mesh
        self.pp_comm, self.record, self.losses = None, None, []
        self.times, self.memory, self.timelines, self.peak = [], None, [], 0

    def hooks(self):
        return Hooks(build=self.build, step=self.step, finish=self.finish)

    def build(self, opts, mesh, group):
        """(module to train, optimizer) on this rank; ``group``: the TP layers'.

        tp = 1 trains the single-device GPT itself (no TP layers, so no TP collectives at all)."""
        full = init_gpt(opts.model, opts.seed, opts.torch_dtype)  # the same weights on every rank
        model = full if mesh.tp == 1 else gpt_to_tp(group, full)
        if opts.sp:
            from tp_from_scratch.sequence_parallel.model import SequenceParallelGPT
            model = SequenceParallelGPT(model)
        model = model.to(mesh.device)
        if mesh.pp > 1:
            from tp_from_scratch.comm.torch_comm import TorchComm
            from tp_from_scratch.parallelisms.pipeline import PipelineStage
            self.pp_comm = TorchComm(mesh.pp_group, device=mesh.device, timeout=opts.timeout)
            model = PipelineStage(self.pp_comm, model)
        params = list(model.parameters())
        self.module, self.activations = model, SavedActivations(params)
        if opts.ddp:
            from torch.nn.parallel import DistributedDataParallel
            model = DistributedDataParallel(model, process_group=mesh.dp_group, gradient_as_bucket_view=True)
            model.register_comm_hook(None, ddp_hook_in_python(mesh.dp_group))
        if opts.zero:
            return model, ZeroOptimizer(mesh.dp_group, params, opts.zero, lambda ps: make_optimizer(ps, opts))
        return model, make_optimizer(params, opts)

    def pipeline_batch(self, model, x, y):
        """The pipeline's forward and backward of every micro-batch (train_step's run_batch)."""
        from tp_from_scratch.parallelisms.pipeline import forward_backward
        result = forward_backward(model, x, y, self.opts.micro_batches, self.opts.schedule)
        self.peak = result.peak_activation_bytes
        self.timelines.append(result.timeline)
        return torch.tensor(result.loss, dtype=self.opts.torch_dtype, device=self.mesh.device)

    def tracked_batch(self, model, x, y):
        """Lesson 6's forward and backward, the activations saved for backward measured."""
        self.activations.reset_peak()
        with self.activations.tracking():
            _, loss = model(x, y)
        loss.backward()
        self.peak = self.activations.peak
        return loss

    def step(self, model, optimizer, x, y, dp_group, dp):
        """Lesson 6's one training step (gpt.step.train_step) with this mesh's parts, recording
        what the comparison needs: step time, memory held, the pipeline's timeline."""
        start = time.perf_counter()
        run_batch = self.pipeline_batch if self.mesh.pp > 1 else self.tracked_batch
        # DDP and ZeRO average the gradients themselves; otherwise Lesson 6's hand-written average
        loss = train_step(model, optimizer, x, y, dp_group, dp, run_batch=run_batch,
                          average=not (self.opts.ddp or self.opts.zero))
        self.memory = memory_snapshot(self.module, optimizer, self.peak)   # what the step leaves held
        self.times.append(time.perf_counter() - start)
        self.losses.append(loss.item())
        return loss

    def finish(self, mesh, group, counter, n_steps):
        """Gather every rank's measurements on rank 0 (collective over the world) as ``record``;
        write it to --measure; print the pipeline's point-to-point bytes."""
        everyone = [None] * mesh.world
        dist.all_gather_object(everyone, measurements(mesh, self, counter, self.pp_comm, n_steps))
        if self.pp_comm is not None:
            self.pp_comm.close()   # waits for its last sends (a TorchComm over a subgroup must be closed)
        if mesh.rank != 0:
            return
        opts = self.opts
        self.record = {"strategy": strategy_name(opts, mesh), "dp": mesh.dp, "pp": mesh.pp, "tp": mesh.tp,
                       "zero": opts.zero, "ddp": opts.ddp, "sp": opts.sp, "schedule": opts.schedule,
                       "micro_batches": opts.micro_batches, "config": opts.model.to_dict(),
                       "batch_size": opts.batch_size, "dtype": opts.dtype, "steps": opts.steps,
                       "losses": self.losses, "ranks": everyone}
        if opts.measure:
            Path(opts.measure).parent.mkdir(parents=True, exist_ok=True)
            Path(opts.measure).write_text(json.dumps(self.record))
        if self.pp_comm is not None:
            print(f"pipeline point-to-point: {self.pp_comm.meter.bytes_sent / max(opts.steps, 1):,.0f} "
                  f"bytes sent per step by rank 0")


def strategy_name(opts, mesh):
    """A short label: "dp4 zero2", "pp2xtp2 1f1b m4", ..."""
    parts = [f"{k}{v}" for k, v in (("dp", mesh.dp), ("pp", mesh.pp), ("tp", mesh.tp)) if v > 1] or ["dp1"]
    label = "x".join(parts)
    if mesh.dp > 1:
        label += " ddp" if opts.ddp else f" zero{opts.zero}" if opts.zero else " avg"
    if mesh.pp > 1:
        label += f" {opts.schedule} m{opts.micro_batches}"
    return label + (" sp" if opts.sp else "")


def measurements(mesh, step, counter, pp_comm, n_steps, warmup=1):
    """This rank's figures: memory (bytes), payload bytes per step by (collective, group),
    point-to-point bytes per step, step times after ``warmup`` steps, the pipeline timelines."""
    p2p = pp_comm.meter.bytes_sent / max(n_steps, 1) if pp_comm is not None else 0
    return {"rank": mesh.rank, "dp_rank": mesh.dp_rank, "pp_rank": mesh.pp_rank, "tp_rank": mesh.tp_rank,
            "memory": step.memory, "collectives": counter.per_step(n_steps), "p2p_bytes_sent": p2p,
            "step_s": step.times[warmup:] or step.times, "timelines": step.timelines[warmup:]}


def run(opts, mesh, mesh_run=None):
    """Lesson 6's run on this mesh with Lesson 11's hooks; returns its exit status (1 if a step
    differs from one device). ``mesh_run``: the MeshRun to fill (its record: rank 0's)."""
    if mesh.rank == 0:
        print(f"mesh dp={mesh.dp} x pp={mesh.pp} x tp={mesh.tp} ({strategy_name(opts, mesh)}); "
              f"rank = (pp_index * dp + dp_index) * tp + tp_index", flush=True)
    return train.run(opts, mesh, (mesh_run or MeshRun(opts, mesh)).hooks())


def main(argv=None):
    opts = train.parse_config(build_parser(), validate, argv, MeshTrainConfig)
    dp, pp, tp = degrees(opts, int(os.environ.get("WORLD_SIZE", "1")))
    torch_main(lambda: run(opts, setup_mesh(tp, opts.device, opts.timeout, pp=pp)), opts.device, opts.timeout)


if __name__ == "__main__":
    main()
