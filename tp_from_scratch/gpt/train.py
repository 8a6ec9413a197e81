"""Train the small GPT with tensor parallelism (and data parallelism), checked against one device.

    # 2 CPU processes, tp=2, each step's loss next to the single-device loss, a loss plot
    .venv/bin/torchrun --standalone --nproc-per-node 2 -m tp_from_scratch.gpt.train --tp 2 --compare-single --plot runs/loss.png
    # dp=2 x tp=2 on 4 processes; float64, the mode to debug in
    .venv/bin/torchrun --standalone --nproc-per-node 4 -m tp_from_scratch.gpt.train --tp 2 --dtype float64
    # PyTorch's own TP (DTensor) on the same model and weights
    .venv/bin/torchrun --standalone --nproc-per-node 2 -m tp_from_scratch.gpt.train --tp 2 --impl dtensor
    # save at tp=2, resume at tp=4
    .venv/bin/torchrun --standalone --nproc-per-node 2 -m tp_from_scratch.gpt.train --tp 2 --steps 20 --save runs/ckpt
    .venv/bin/torchrun --standalone --nproc-per-node 4 -m tp_from_scratch.gpt.train --tp 4 --steps 50 --load runs/ckpt
    # the same in PyTorch Distributed Checkpoint's format (torchtitan's), resumed at tp=1
    .venv/bin/torchrun --standalone --nproc-per-node 2 -m tp_from_scratch.gpt.train --tp 2 --steps 20 --save runs/dcp --save-format dcp
    .venv/bin/python -m tp_from_scratch.gpt.train --steps 50 --load runs/dcp
    # one process, no launcher: the text corpus, a validation loss every 10 steps
    .venv/bin/python -m tp_from_scratch.gpt.train --data text --steps 30 --eval-every 10
    # one node with 8 GPUs: tp=8 (NCCL)
    .venv/bin/torchrun --standalone --nproc-per-node 8 -m tp_from_scratch.gpt.train --tp 8 --device cuda
    # two nodes with 8 GPUs each: tp=8 inside a node, dp=2 across nodes; run on each node
    .venv/bin/torchrun --nnodes 2 --node-rank 0|1 --nproc-per-node 8 --master-addr NODE0 --master-port 29500 \\
        -m tp_from_scratch.gpt.train --tp 8 --device cuda

THE trainer: every later lesson's runs this run (build, loop, report, verdict) and changes only
what it teaches (gpt/hooks.py). The step is gpt/step.py's; the flags gpt/options.py's, parsed
once into a TrainConfig. The ranks form a dp x tp mesh (gpt/mesh.py: a TP group's ranks are
neighbours, on one node); gradients are averaged over each DP group after backward. Batches are
a function of (seed, step) (gpt/data.py); DP rank d takes rows d*B/dp .. (d+1)*B/dp, so the
global loss is the same at every dp and tp: the single-device loss up to summation order.
"""
import argparse
import json
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import torch
import torch.distributed as dist

from tp_from_scratch.comm.launch import torch_main
from tp_from_scratch.compare import TOLERANCE, assert_matches_reference, tolerance
from tp_from_scratch.gpt import checkpoint as ckpt
from tp_from_scratch.gpt import options
from tp_from_scratch.gpt.clip import clip_grad_norm
from tp_from_scratch.gpt.hooks import Hooks, ModelKind
from tp_from_scratch.gpt.data import global_batch, local_batch
from tp_from_scratch.gpt.mesh import coordinates, setup_mesh
from tp_from_scratch.gpt.model import count_parameters, init_gpt
from tp_from_scratch.gpt.options import TrainConfig, parse_config
from tp_from_scratch.gpt.parallelize import gpt_to_tp
from tp_from_scratch.gpt.step import make_optimizer, single_device_run, steps_on_comm
from tp_from_scratch.gpt.traffic import CollectiveCounter


def build_parser():
    p = argparse.ArgumentParser(prog="python -m tp_from_scratch.gpt.train", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    options.add_train_flags(p, TrainConfig())
    options.add_model_flags(p)
    return p


def parse(argv=()):
    """Lesson 6's settings for the command line ``argv`` (no validation: in-process use)."""
    return TrainConfig.from_args(build_parser().parse_args([str(a) for a in argv]))


def validate(opts, world_size, description=None):
    """The first problem with the settings for this world size, as a sentence; None if fine.
    description: the model a --load checkpoint must hold (default the GPT of the settings)."""
    problem = options.train_flag_problem(opts)
    if problem:
        return problem
    if world_size % opts.tp != 0:
        return (f"world size {world_size} is not divisible by tp={opts.tp} "
                f"(launch a multiple of {opts.tp} processes: torchrun --nproc-per-node ...)")
    dp = world_size // opts.tp
    if opts.batch_size % dp != 0:
        return f"batch size {opts.batch_size} is not divisible by dp={dp}"
    if opts.impl == "dtensor" and (opts.save or opts.load):
        return "--save and --load work with --impl scratch only"
    if opts.impl == "dtensor" and opts.clip_grad_norm is not None:
        return ("--clip-grad-norm works with --impl scratch only (DTensor's gradients carry their placements: "
                "torch's clip_grad_norm_ on them is DTensor's own)")
    if opts.device == "cuda" and not torch.cuda.is_available():
        return "--device cuda was asked for, but torch sees no CUDA device"
    try:
        opts.model.validate(opts.tp)
        if opts.impl == "dtensor":
            from tp_from_scratch.gpt.dtensor_plan import check_plannable
            check_plannable(opts.model, opts.tp)
        if opts.load:
            ckpt.check_resumable(opts.load, opts.model, description or ckpt.model_description(opts.model),
                                 opts.steps, opts.optimizer)
    except ValueError as e:   # CheckpointError included
        return str(e)
    return None


@dataclass
class Run:
    """What every part of one run on this rank reads: the settings, the mesh, the hooks, the
    object the TP layers talk through (tp_group_for) and the collective counter."""
    opts: TrainConfig
    mesh: object
    hooks: Hooks
    group: object
    counter: CollectiveCounter


def tp_group_for(opts, mesh):
    """The object the parallel layers communicate through: it alone decides the collectives.

    --collectives native: the mesh's torch ProcessGroup; scratch: a TorchComm over that same
    group, whose ring collectives are built from send/recv and counted by its meter.
    """
    if opts.collectives == "native":
        return mesh.tp_group
    from tp_from_scratch.comm.torch_comm import TorchComm
    return TorchComm(mesh.tp_group, device=mesh.device, timeout=opts.timeout)


# ---------------------------------------------------------------------------------------
# Building the model on this rank, and saving it
# ---------------------------------------------------------------------------------------

def build(run, start):
    """(model, optimizer, first step): fresh from the seed, or resumed from ``start``."""
    opts, mesh, hooks, kind = run.opts, run.mesh, run.hooks, run.hooks.model
    if hooks.build is not None:
        return (*hooks.build(opts, mesh, run.group), 0)
    full = kind.init(opts.model, opts.seed, opts.torch_dtype)   # the same weights on every rank
    if start is not None:
        full.load_state_dict(start["model"])
    if hooks.parallelize is not None:
        model = hooks.parallelize(full.to(mesh.device), run.group)
    elif opts.impl == "dtensor":
        from tp_from_scratch.gpt.dtensor_plan import parallelize_gpt
        model = parallelize_gpt(full.to(mesh.device), mesh.device_mesh["tp"])
    else:
        model = gpt_to_tp(run.group, full).to(mesh.device)
    optimizer = make_optimizer(model.parameters(), opts)
    if start is None:
        return model, optimizer, 0
    local = ckpt.shard_optimizer_state(start["optimizer"], mesh.tp, mesh.tp_rank, opts.model, kind.sharding)
    ckpt.load_optimizer_state_by_name(model, optimizer, local)
    if len(start["rng"]) == mesh.tp and start["rng"][mesh.tp_rank] is not None:
        torch.set_rng_state(start["rng"][mesh.tp_rank])
    return model, optimizer, start["step"]


def save(run, model, optimizer, step):
    """A sharded checkpoint: the TP ranks of DP replica 0 write, rank 0 commits (collective).
    --save-format dcp: every rank hands its pieces to PyTorch's DCP (gpt/dcp.py), which keeps
    one copy of each.

    The metadata records the settings a resume must agree with, the model description every
    loader checks, and the model's own entries (ModelKind.meta)."""
    opts, mesh = run.opts, run.mesh
    meta = {"dtype": opts.dtype, "optimizer": opts.optimizer, "lr": opts.learning_rate,
            "seed": opts.seed, "batch_size": opts.batch_size, **run.hooks.model.meta}
    description = run.hooks.model.checkpoint_description(opts.model)
    if opts.save_format == "dcp":
        ckpt.save_dcp(mesh.tp_group, opts.save, step, model.state_dict(), ckpt.optimizer_state_by_name(model, optimizer),
                      opts.model, mesh.tp, mesh.tp_rank, meta, description, run.hooks.model.sharding)
        return
    names = [ckpt.new_checkpoint_name(step) if mesh.rank == 0 else None]
    dist.broadcast_object_list(names, src=0)
    record = None
    if mesh.dp_rank == 0:
        record = ckpt.write_shard(opts.save, names[0], mesh.tp_rank, mesh.tp, model.state_dict(),
                                  ckpt.optimizer_state_by_name(model, optimizer), torch.get_rng_state())
    records = [None] * mesh.world
    dist.all_gather_object(records, record)
    if mesh.rank == 0:
        ckpt.commit(opts.save, names[0], opts.model, mesh.tp, step, [r for r in records if r], meta,
                    description=description)
    dist.barrier()


# ---------------------------------------------------------------------------------------
# The single-device comparison: one verdict for the loop, the report and the exit status
# ---------------------------------------------------------------------------------------

def verdict(loss, ref, step, tol):
    """(True, "equal") if ``loss`` equals the reference's ``ref`` within ``tol``, else (False, why)."""
    try:
        assert_matches_reference(loss, ref, name=f"loss at step {step}", tol=tol)
        return True, "equal"
    except AssertionError as e:
        return False, f"DIFFERS: {e}"


class Comparison:
    """Rank 0: each step's loss beside the single-device reference's, and THE verdict of
    --equal-steps N, which the loop's lines, the report's and the exit status all read.

    Steps first .. N-1 (every step, without N) must equal the reference within the tolerance
    policy; once a later step differs, the two runs have parted for good: training amplifies
    the roundoff of the two summation orders step after step.
    """

    def __init__(self, reference, dtype, layers, steps, equal_steps=None, name="single-device", first=0):
        self.reference, self.dtype, self.layers, self.name, self.first = reference, dtype, layers, name, first
        self.equal_steps, self.limit = equal_steps, equal_steps or steps
        self.ref_losses, self.differing = [], []

    def tolerance(self, step):
        """TOLERANCE[dtype] x layers x (1 + step): roundoff compounds through layers and steps."""
        return tolerance(self.dtype, layers=self.layers, steps=step)

    def check(self, step, loss):
        """(reference loss, equal?, the step line's words) for this run's ``loss`` at ``step``."""
        _, ref = next(self.reference)
        ok, text = verdict(loss, ref, step, self.tolerance(step))
        if not ok:
            self.differing.append(step)
        if any(s >= self.limit for s in self.differing):   # a later step within tolerance is not "equal"
            text = "apart: roundoff amplified by training (past --equal-steps)"
        self.ref_losses.append(ref.item())
        return ref, ok, text

    @property
    def failed(self):
        """A step that must be equal differs: the run exits with status 1."""
        return bool(self.differing) and self.differing[0] < self.limit

    def lines(self):
        """The report's verdict: how many steps are equal, and where the runs part."""
        n, bad = len(self.ref_losses), len(self.differing)
        tol = f"{TOLERANCE[self.dtype]:.0e} x {self.layers} layers x (1 + step) x max(1, |loss|)"
        if bad and self.equal_steps:   # the next line says where they part
            out = [f"{self.name} comparison (tolerance {tol}, {self.dtype}):"]
        else:
            allowed = (f"; only steps {self.first}..{self.equal_steps - 1} must be (--equal-steps "
                       f"{self.equal_steps})" if self.equal_steps else "")
            out = [f"{self.name} comparison: {n - bad} of {n} steps equal (tolerance {tol}, {self.dtype}){allowed}"]
        if bad:
            step = self.differing[0]
            out.append(f"steps {self.first}..{step - 1} equal to one device; step {step} differs: training "
                       f"amplifies the roundoff of the two summation orders step after step until the runs part"
                       f"{f' (allowed by --equal-steps {self.limit})' if step >= self.limit else ''}")
        return out


# ---------------------------------------------------------------------------------------
# The run
# ---------------------------------------------------------------------------------------

def run(opts, mesh, hooks=None):
    """Set up, train, report; returns the exit status (1 if a step that must equal one device's
    differs). hooks: what a later lesson's trainer changes (Hooks)."""
    hooks = hooks or Hooks()
    groups = (("tp", mesh.tp_group), ("dp", mesh.dp_group), ("pp", mesh.pp_group))
    this = Run(opts, mesh, hooks, tp_group_for(opts, mesh),
               CollectiveCounter({g: name for name, g in groups if g is not None}))
    kind, start = hooks.model, None
    if opts.load:
        start = ckpt.load_full(opts.load, opts.model, kind.checkpoint_description(opts.model), kind.sharding)
        ckpt.check_resume(start["meta"], opts.load, opts.steps, opts.optimizer)
    model, optimizer, first = build(this, start)
    report_memory(this, model)
    if start is not None and mesh.rank == 0:   # what was loaded, as --save's line says what was written
        print(f"resumed: {opts.load} (step {start['step']}, saved at tp={start['meta'].get('tp', 1)}), "
              f"on to step {opts.steps}", flush=True)
    comparison = None
    if opts.compares and mesh.rank == 0:
        name, loss_fn = hooks.reference
        reference = single_device_run(opts.model, opts, start, loss_fn=loss_fn, init_model=kind.init,
                                      shape=kind.shape(opts.model))
        comparison = Comparison(reference, opts.dtype, kind.layers(opts.model), opts.steps, opts.equal_steps,
                                name, first)
    t_start = time.perf_counter()
    losses = train_loop(this, model, optimizer, first, comparison)
    elapsed = time.perf_counter() - t_start
    if opts.save:
        save(this, model, optimizer, opts.steps)
    if mesh.rank == 0:
        report(this, first, losses, comparison, elapsed)
    if hooks.finish is not None:
        hooks.finish(mesh, this.group, this.counter, opts.steps - first)
    return 1 if comparison is not None and comparison.failed else 0


def report_memory(run, model):
    opts, mesh, kind = run.opts, run.mesh, run.hooks.model
    per_rank = [None] * mesh.world
    dist.all_gather_object(per_rank, count_parameters(model)[1])
    if mesh.rank != 0:
        return
    n_full, _ = count_parameters(kind.init(opts.model, 0, torch.float32))
    axes = ("dp", "pp", "tp") if mesh.pp > 1 else ("dp", "tp")   # pp: only where there is a pipeline
    print(f"{kind.name}: {n_full:,} parameters ({kind.sizes(opts.model)}); global batch B={opts.batch_size}; "
          f"mesh {' x '.join(f'{a}={getattr(mesh, a)}' for a in axes)}", flush=True)
    if opts.data == "text":
        from tp_from_scratch.gpt.text import FILES, corpus
        data, digest = corpus()
        print(f"data: {len(FILES)} files of this Python's standard library, {len(data):,} bytes "
              f"(sha256 {digest[:16]}), last 10% held out", flush=True)
    for r, b in enumerate(per_rank):
        where = dict(zip(("dp", "pp", "tp"), coordinates(r, mesh.dp, mesh.pp, mesh.tp)))
        print(f"  rank {r} ({', '.join(f'{a} {where[a]}' for a in axes)}): parameters {b / 2**10:,.1f} KiB",
              flush=True)


def progress_bar(opts, total, is_main):
    """tqdm over the steps on rank 0; none with --no-progress or when stdout is not a terminal
    (| tee, CI logs: its carriage returns would interleave with the step lines)."""
    from tqdm import tqdm
    quiet = opts.no_progress or not sys.stdout.isatty()
    return tqdm(total=total, disable=not is_main or quiet, desc="training",
                unit="step", file=sys.stdout, dynamic_ncols=False, ncols=80)


def clipper(run):
    """--clip-grad-norm MAX: model -> its gradients clipped by the global norm, each distinct piece
    counted once over the TP group (and the DP group, whose averaged gradients are copies),
    placed by the model's plan (ModelKind.placement); None without the flag."""
    opts, mesh = run.opts, run.mesh
    if opts.clip_grad_norm is None:
        return None
    groups = {"tp": run.group} | ({"dp": mesh.dp_group} if mesh.dp > 1 else {})
    placement = run.hooks.model.placement(opts.model, mesh.tp)
    return lambda model: clip_grad_norm(model, opts.clip_grad_norm, placement=placement, groups=groups)


def train_loop(run, model, optimizer, first, comparison=None):
    """Steps first .. opts.steps-1 with the hooks' step; returns this rank's losses. Every
    --metrics record, --eval-every and --save-every happens here, for every trainer."""
    opts, mesh, hooks = run.opts, run.mesh, run.hooks
    shape = hooks.model.shape(opts.model)
    metrics = None
    if opts.metrics and mesh.rank == 0:
        Path(opts.metrics).parent.mkdir(parents=True, exist_ok=True)
        metrics = open(opts.metrics, "w")
    bar = progress_bar(opts, opts.steps - first, mesh.rank == 0)
    clip = clipper(run)
    extra = {} if clip is None else {"clip": clip}   # a trainer's own step need not know the flag
    losses = []
    try:
        for step in range(first, opts.steps):
            x, y = local_batch(step, opts.batch_size, *shape, opts.seed, mesh.dp_rank, mesh.dp, opts.data)
            t0 = time.perf_counter()
            measured = hooks.metrics(run.group, run.counter) if hooks.metrics else None
            with run.counter.counting():
                loss = hooks.step(model, optimizer, x.to(mesh.device), y.to(mesh.device), mesh.dp_group, mesh.dp,
                                  **extra)
            record = {"step": step, "loss": loss.item(), "time_s": time.perf_counter() - t0,
                      **(measured() if measured else {})}
            if comparison is not None:
                ref, ok, text = comparison.check(step, loss.cpu())
                record.update(single_loss=ref.item(), abs_diff=abs(loss.item() - ref.item()), equal=ok)
                bar.write(f"step {step:4d}  loss {loss.item():.6f}  {comparison.name} {ref.item():.6f}  "
                          f"|diff| {record['abs_diff']:.1e}  {text}")
            losses.append(record["loss"])
            if metrics:
                metrics.write(json.dumps(record) + "\n")
                metrics.flush()
            bar.set_postfix(loss=f"{loss.item():.4f}")
            bar.update(1)
            if opts.eval_every and (step + 1) % opts.eval_every == 0:
                val = validation_loss(model, opts, shape, mesh.device)  # the same on every rank
                if mesh.rank == 0:
                    bar.write(f"step {step:4d}  validation loss {val:.4f} ({opts.data})")
                if metrics:
                    metrics.write(json.dumps({"step": step, "val_loss": val}) + "\n")
            if opts.save and opts.save_every and (step + 1) % opts.save_every == 0 and step + 1 < opts.steps:
                save(run, model, optimizer, step + 1)
    finally:
        bar.close()
        if metrics:
            metrics.close()
    return losses


def validation_loss(model, opts, shape, device):
    """The loss on a fixed held-out batch of shape (T, V) (every rank evaluates the whole batch;
    no DP split). text: the validation split; markov: a batch no training step draws (step 2**40)."""
    if opts.data == "text":
        x, y = global_batch(0, opts.batch_size, *shape, opts.seed, "text", "val")
    else:
        x, y = global_batch(2 ** 40, opts.batch_size, *shape, opts.seed)
    with torch.no_grad():
        return model(x.to(device), y.to(device))[1].item()


def report(run, first, losses, comparison, elapsed):
    """Rank 0's summary: time, final loss, communication per step, the single-device verdict."""
    opts, mesh = run.opts, run.mesh
    n = opts.steps - first
    print(f"\n{n} steps in {elapsed:.1f} s; final loss {losses[-1] if losses else float('nan'):.6f}")
    print(f"communication per step on rank 0 ({opts.impl}; the bytes of the tensors handed to "
          f"torch.distributed's collectives, before any algorithm multiplies them):")
    if opts.impl == "dtensor":
        print("  (DTensor calls functional collectives, which this counter does not see)")
    print(run.counter.table(n))
    if opts.impl == "scratch" and opts.collectives == "scratch":
        print(f"TP traffic from scratch over the {n} steps (the TorchComm's meter: every ring "
              f"message this rank sent):")
        print(run.group.meter.table())
    if comparison is not None:
        print("\n".join(comparison.lines()))
    if opts.plot:
        from tp_from_scratch.plots import plot_loss_comparison
        steps = range(first, opts.steps)
        plot_loss_comparison(opts.plot, steps, losses, comparison.ref_losses,
                             f"dp={mesh.dp} x tp={mesh.tp} ({opts.impl})",
                             [comparison.tolerance(step) for step in steps], opts.dtype)
        print(f"loss curves: {opts.plot}")
    if opts.save:
        what = " in PyTorch DCP's format" if opts.save_format == "dcp" else ""
        print(f"checkpoint: {opts.save} (step {opts.steps}, tp={mesh.tp}){what}")


def train_on_comm(comm, argv=(), parallelize=None):
    """One TP rank's run on a tp_from_scratch Comm (e.g. run_spmd's simulated ranks, mpiexec's
    MPIComm), dp=1: the same model, data and optimizer as the torchrun script for ``argv``; the
    per-step losses. ``parallelize(full, group)``: a later lesson's model (Hooks.parallelize's
    signature), default gpt_to_tp's."""
    opts = parse(argv)
    full = init_gpt(opts.model, opts.seed, opts.torch_dtype)
    model = gpt_to_tp(comm, full) if parallelize is None else parallelize(full, comm)
    optimizer = make_optimizer(model.parameters(), opts)
    shape = ModelKind().shape(opts.model)
    return [loss.item() for _, loss in steps_on_comm(opts, model, optimizer, shape,
                                                     clip=clipper_on_comm(opts, comm, ModelKind()))]


def clipper_on_comm(opts, comm, kind):
    """clipper's twin on simulated ranks (dp = 1, the Comm the TP group): model -> its gradients
    clipped by the global norm placed by ``kind.placement``; None without --clip-grad-norm."""
    if opts.clip_grad_norm is None:
        return None
    placement = kind.placement(opts.model, comm.world_size)
    return lambda model: clip_grad_norm(model, opts.clip_grad_norm, placement=placement, groups={"tp": comm})


def main(argv=None):
    opts = parse_config(build_parser(), validate, argv)
    torch_main(lambda: run(opts, setup_mesh(opts.tp, opts.device, opts.timeout, dtensor=opts.impl == "dtensor")),
               opts.device, opts.timeout, errors=(ckpt.CheckpointError,))


if __name__ == "__main__":
    main()
