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
    # one process, no launcher: the text corpus, a validation loss every 10 steps
    .venv/bin/python -m tp_from_scratch.gpt.train --data text --steps 30 --eval-every 10
    # one node with 8 GPUs: tp=8 (NCCL)
    .venv/bin/torchrun --standalone --nproc-per-node 8 -m tp_from_scratch.gpt.train --tp 8 --device cuda
    # two nodes with 8 GPUs each: tp=8 inside a node, dp=2 across nodes; run on each node
    .venv/bin/torchrun --nnodes 2 --node-rank 0|1 --nproc-per-node 8 --master-addr NODE0 --master-port 29500 \\
        -m tp_from_scratch.gpt.train --tp 8 --device cuda

This is THE trainer: Lessons 7, 8 and 11 (sequence_parallel/train.py, partial_sync/train.py,
parallelisms/train.py) and the benchmark (bench/train.py) run its training step (train_step:
zero_grad, forward and backward, the DP average, optimizer step, loss), its loop (train_loop:
data, metrics, --eval-every, --save-every, the single-device comparison) and its report, and
change only what their lesson changes, through Hooks (the model, a step hook after backward,
the single-device reference, checkpoint metadata, metrics fields). The command line becomes
a TrainConfig in one place (parse_config); the library reads that, never argparse's namespace.

The world of ranks is a dp x tp mesh (tp_from_scratch/gpt/mesh.py): rank = dp_index * tp + tp_index,
so the ranks of one TP group are neighbours (on one node, where the bandwidth is). Gradients
are averaged over each DP group (the ranks holding the same shard) after backward.

Batches are a function of (seed, step) (tp_from_scratch.gpt.data); DP rank d takes rows
d*B/dp .. (d+1)*B/dp of the global batch, so the global loss is the same at every dp and
tp, and equals the single-device loss on the whole batch up to summation order.
"""
import argparse
import contextlib
import json
import sys
import time
from dataclasses import dataclass, field, replace
from functools import partial
from pathlib import Path
from typing import Callable, Optional

import torch
import torch.distributed as dist

from tp_from_scratch.gpt import checkpoint as ckpt
from tp_from_scratch.compare import TOLERANCE, assert_matches_reference, tolerance
from tp_from_scratch.gpt.arch import ARCHS as PRESETS
from tp_from_scratch.gpt.data import global_batch, local_batch
from tp_from_scratch.gpt.mesh import setup_mesh
from tp_from_scratch.gpt.options import at_least, first_problem, greater_than_zero, parse_valid_args, positive
from tp_from_scratch.gpt.model import GPTConfig, count_parameters, init_gpt
from tp_from_scratch.gpt.parallelize import gpt_to_tp
from tp_from_scratch.gpt.traffic import CollectiveCounter


# ---------------------------------------------------------------------------------------
# What a run was asked for: the command line, parsed once into a TrainConfig
# ---------------------------------------------------------------------------------------

@dataclass(frozen=True)
class TrainConfig:
    """Every setting of a training run; the library reads these, never argparse's namespace.

    Built from the command line in one place (``from_args``); a later lesson's trainer
    subclasses it with its own settings (Lesson 8: sync_fraction). The model's own sizes
    become a GPTConfig through ``model_config``.
    """
    tp: int = 1
    steps: int = 50
    seed: int = 0
    dtype: str = "float32"
    impl: str = "scratch"
    collectives: str = "native"
    device: str = "cpu"
    metrics: Optional[str] = None
    save: Optional[str] = None
    save_every: int = 0
    load: Optional[str] = None
    compare_single: bool = False
    equal_steps: Optional[int] = None
    plot: Optional[str] = None
    timeout: float = 120.0
    no_progress: bool = False
    optimizer: str = "adamw"
    lr: Optional[float] = None
    batch_size: int = 8
    data: str = "markov"
    eval_every: int = 0
    vocab_size: int = GPTConfig.vocab_size
    seq_len: int = GPTConfig.seq_len
    layers: int = GPTConfig.n_layers
    hidden: int = GPTConfig.hidden
    heads: int = GPTConfig.n_heads
    kv_heads: Optional[int] = GPTConfig.n_kv_heads
    ffn: int = 0
    untied: bool = False
    gelu: Optional[str] = None
    arch: str = "gpt"
    ARCHS = tuple(PRESETS)   # the models this trainer builds (gpt/arch.py; not a setting)

    @classmethod
    def from_args(cls, args):
        """The one place an argparse namespace becomes settings (its flags are the fields)."""
        return cls(**vars(args))

    @property
    def torch_dtype(self):
        return getattr(torch, self.dtype)

    @property
    def learning_rate(self):
        return self.lr if self.lr is not None else (3e-3 if self.optimizer == "adamw" else 0.3)

    @property
    def compares(self):
        """Rank 0 trains the single-device reference too (--compare-single, or --plot's curves)."""
        return self.compare_single or self.plot is not None


def parse_config(parser, validate_fn, argv=None, config_class=TrainConfig, world=None):
    """Parse ``argv``, build the ``config_class`` settings and check them with
    ``validate_fn(settings, world)`` (options.parse_valid_args: rank 0 prints, all exit 2)."""
    args = parse_valid_args(parser, lambda a, w: validate_fn(config_class.from_args(a), w), argv, world)
    return config_class.from_args(args)


def parse(argv=()):
    """Lesson 6's settings for the command line ``argv`` (no validation: in-process use)."""
    return TrainConfig.from_args(build_parser().parse_args([str(a) for a in argv]))


# ---------------------------------------------------------------------------------------
# Command line
# ---------------------------------------------------------------------------------------

def build_parser():
    d = TrainConfig()
    p = argparse.ArgumentParser(prog="python -m tp_from_scratch.gpt.train", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--tp", type=int, default=d.tp, help="tensor-parallel degree t (divides the world size)")
    p.add_argument("--steps", type=int, default=d.steps, help="train until this step (a resumed run continues)")
    p.add_argument("--seed", type=int, default=d.seed, help="weights and data")
    p.add_argument("--dtype", choices=["float32", "float64"], default=d.dtype)
    p.add_argument("--impl", choices=["scratch", "dtensor"], default=d.impl,
                   help="scratch: tp_from_scratch.nn layers; dtensor: PyTorch's parallelize_module")
    p.add_argument("--collectives", choices=["native", "scratch"], default=d.collectives,
                   help="what the scratch layers' TP group is: the torch ProcessGroup (native "
                        "collectives) or a TorchComm over it (the ring collectives from scratch)")
    p.add_argument("--device", choices=["cpu", "cuda"], default=d.device)
    p.add_argument("--metrics", metavar="PATH", help="JSON Lines, one object per step (rank 0 writes)")
    p.add_argument("--save", metavar="DIR", help="write a sharded checkpoint at the end (and every --save-every)")
    p.add_argument("--save-every", type=int, default=d.save_every, metavar="N")
    p.add_argument("--load", metavar="DIR_OR_FILE",
                   help="resume from a checkpoint (any tp), or start from an exported single-device .pt")
    p.add_argument("--compare-single", action="store_true",
                   help="rank 0 also trains the single-device GPT and prints each loss next to it")
    p.add_argument("--equal-steps", type=int, default=d.equal_steps, metavar="N",
                   help="with --compare-single: exit 1 only if one of the first N steps differs (default: "
                        "any step); two long runs part once training has amplified their roundoff")
    p.add_argument("--plot", metavar="PNG", help="loss curves, TP against single-device (implies --compare-single)")
    p.add_argument("--timeout", type=float, default=d.timeout, help="seconds any collective may wait")
    p.add_argument("--no-progress", action="store_true", help="no progress bar")
    g = p.add_argument_group("optimizer and batch")
    g.add_argument("--optimizer", choices=["adamw", "sgd"], default=d.optimizer)
    g.add_argument("--lr", type=float, default=d.lr, help="default 3e-3 (adamw) or 0.3 (sgd)")
    g.add_argument("--batch-size", type=int, default=d.batch_size, help="global batch B (split over dp)")
    g.add_argument("--data", choices=["markov", "text"], default=d.data,
                   help="markov: a seeded Markov chain (known entropy rate); text: bytes of the Python "
                        "standard library's source, V=256 (gpt/text.py)")
    g.add_argument("--eval-every", type=int, default=d.eval_every, metavar="N",
                   help="every N steps, the loss on a fixed held-out batch (text: the validation split)")
    g = p.add_argument_group("model size")
    g.add_argument("--vocab-size", type=int, default=d.vocab_size)
    g.add_argument("--seq-len", type=int, default=d.seq_len)
    g.add_argument("--layers", type=int, default=d.layers)
    g.add_argument("--hidden", type=int, default=d.hidden)
    g.add_argument("--heads", type=int, default=d.heads)
    g.add_argument("--kv-heads", type=int, default=d.kv_heads)
    g.add_argument("--ffn", type=int, default=d.ffn, help="0: 4 x hidden")
    g.add_argument("--untied", action="store_true", help="an LM head of its own instead of the embedding")
    g.add_argument("--gelu", choices=["erf", "tanh"], default=d.gelu,
                   help="exact GeLU (erf) or GPT-2's tanh approximation (the numpy lessons' form); "
                        "default: the architecture's (gpt erf, gpt2 tanh)")
    g.add_argument("--arch", choices=[*PRESETS, "deepseek_v3"], default=d.arch,
                   help="gpt: this course's model; gpt2: LayerNorm, learned positions, all biases, tanh "
                        "GeLU; llama: RMSNorm, RoPE, SwiGLU, no biases, untied head (gpt/model.py); "
                        "deepseek_v3: Lesson 12's trainer (python -m tp_from_scratch.deepseek.train)")
    return p


def config_from_args(opts):
    """The GPTConfig of the settings ``opts`` (--data text: bytes, so V = 256)."""
    vocab = 256 if opts.data == "text" else opts.vocab_size
    return GPTConfig(vocab_size=vocab, seq_len=opts.seq_len, n_layers=opts.layers,
                     hidden=opts.hidden, n_heads=opts.heads, n_kv_heads=opts.kv_heads,
                     ffn=opts.ffn, tie_embeddings=False if opts.untied else None, gelu=opts.gelu,
                     arch=opts.arch)


def flag_problem(opts):
    """The first shared flag that is wrong on its own or without the flag it needs; None if fine.

    Every trainer checks these first, so a shared flag is refused with the same words by all."""
    problem = first_problem(
        at_least("--steps", opts.steps, 0), positive("--tp", opts.tp), positive("--batch-size", opts.batch_size),
        at_least("--save-every", opts.save_every, 0), at_least("--eval-every", opts.eval_every, 0),
        positive("--equal-steps", opts.equal_steps), greater_than_zero("--timeout", opts.timeout),
        greater_than_zero("--lr", opts.lr))
    if problem:
        return problem
    if opts.arch not in type(opts).ARCHS:   # Lesson 12's model, trained by Lesson 12's entry point
        return ("--arch deepseek_v3 is Lesson 12's model: run .venv/bin/torchrun --standalone "
                "--nproc-per-node 2 -m tp_from_scratch.deepseek.train --tp 2 --layout tp|ep")
    if opts.save_every and not opts.save:
        return "--save-every N saves into --save DIR: give --save too"
    if opts.equal_steps is not None and not opts.compares:
        return "--equal-steps N says how many steps must equal one device's: give --compare-single or --plot"
    return None


def validate(opts, world_size, description=None):
    """The first problem with the settings for this world size, as a sentence; None if fine.

    description: the model a --load checkpoint must hold (checkpoint.model_description; a
    later lesson's trainer passes its own), checked with the step and config before any work.
    """
    problem = flag_problem(opts)
    if problem:
        return problem
    if world_size % opts.tp != 0:
        return (f"world size {world_size} is not divisible by tp={opts.tp} "
                f"(launch a multiple of {opts.tp} processes: torchrun --nproc-per-node ...)")
    dp = world_size // opts.tp
    if opts.batch_size < 1 or opts.batch_size % dp != 0:
        return f"batch size {opts.batch_size} is not divisible by dp={dp}"
    if opts.impl == "dtensor" and (opts.save or opts.load):
        return "--save and --load work with --impl scratch only"
    if opts.device == "cuda" and not torch.cuda.is_available():
        return "--device cuda was asked for, but torch sees no CUDA device"
    try:
        config = config_from_args(opts)
        config.validate(opts.tp)
        if opts.impl == "dtensor":
            from tp_from_scratch.gpt.dtensor_plan import check_plannable
            check_plannable(config, opts.tp)
        if opts.load:
            ckpt.check_resumable(opts.load, config, description or ckpt.model_description(config),
                                 opts.steps, opts.optimizer)
    except (ValueError, ckpt.CheckpointError) as e:
        return str(e)
    return None


def make_optimizer(params, opts):
    """AdamW (betas 0.9, 0.95, no weight decay) or SGD with momentum; element-wise, so TP-safe."""
    if opts.optimizer == "sgd":
        return torch.optim.SGD(params, lr=opts.learning_rate, momentum=0.9)
    return torch.optim.AdamW(params, lr=opts.learning_rate, betas=(0.9, 0.95), weight_decay=0.0, foreach=False)


# ---------------------------------------------------------------------------------------
# What a later lesson changes in this trainer
# ---------------------------------------------------------------------------------------

@dataclass
class Hooks:
    """A later lesson's changes to Lesson 6's run; every field is optional.

    parallelize(full, group): the model to train from the single-device GPT ``full`` (on this
        rank's device); default gpt_to_tp, or the DTensor plan for --impl dtensor.
    after_backward(model): between backward and the DP average (Lesson 8: sum the gradients of
        the parameters the streams share over the TP group).
    reference_loss(gpt, x, y): the single-device reference's loss (Lesson 8: the t-stream model);
        default the GPT's own. reference_name: how the report calls that reference.
    description: the model checkpoints hold and loaders check (checkpoint.model_description).
    checkpoint_meta: more entries for a checkpoint's metadata.
    step_metrics(group, counter): called before a step; returns a function called after it that
        gives more fields for that step's metrics record (Lesson 8: the TP bytes of the step).
    summary(group, counter, n_steps): rank 0 prints more after the report.
    init_model(config, seed, dtype): the single-device model every rank starts from (and the
        reference trains); default init_gpt (Lesson 12: DeepSeek-V3, from its own config).
    sharding: how checkpoints cut and glue the model (checkpoint.GPTSharding's methods);
        default the GPT's.
    """
    parallelize: Optional[Callable] = None
    after_backward: Optional[Callable] = None
    reference_loss: Optional[Callable] = None
    reference_name: str = "single-device"
    description: Optional[dict] = None
    checkpoint_meta: dict = field(default_factory=dict)
    step_metrics: Optional[Callable] = None
    summary: Optional[Callable] = None
    init_model: Callable = init_gpt
    sharding: object = ckpt.GPT_SHARDING


# ---------------------------------------------------------------------------------------
# One training step, and the single-device reference
# ---------------------------------------------------------------------------------------

def average_gradients(params, group, dp):
    """Data parallelism: every gradient becomes its mean over the DP group (one all-reduce)."""
    grads = [p.grad.to_local() if hasattr(p.grad, "to_local") else p.grad for p in params]
    flat = torch.cat([g.reshape(-1) for g in grads])
    dist.all_reduce(flat, group=group)
    flat /= dp
    offset = 0
    for g in grads:
        g.copy_(flat[offset:offset + g.numel()].view_as(g))
        offset += g.numel()


def gpt_loss(model, x, y):
    """The GPT's mean cross-entropy on a batch."""
    return model(x, y)[1]


def forward_backward(model, x, y, loss_fn=gpt_loss):
    """The loss of one batch, its gradients accumulated into the parameters."""
    loss = loss_fn(model, x, y)
    loss.backward()
    return loss


def train_step(model, optimizer, x, y, dp_group=None, dp=1, *, after_backward=None,
               run_batch=forward_backward, average=True, context=contextlib.nullcontext):
    """THE training step: zero_grad, forward and backward, after_backward(model), the DP
    gradient average, optimizer step; returns the global mean loss (detached).

    Every trainer's step is this one. A later lesson changes a part: run_batch(model, x, y)
    (Lesson 11's pipeline), average=False (DDP and ZeRO average themselves), context (what
    forward and backward run inside: DTensor's loss_parallel). With dp=1 it touches no
    process group, so it also runs on in-process simulated ranks.
    """
    optimizer.zero_grad(set_to_none=True)
    with context():
        loss = run_batch(model, x, y)
    if after_backward is not None:
        after_backward(model)
    if average and dp > 1:
        average_gradients([p for p in model.parameters() if p.grad is not None], dp_group, dp)
    optimizer.step()
    loss = loss.detach().clone()
    if dp > 1:
        dist.all_reduce(loss, group=dp_group)
        loss /= dp
    return loss


def single_device_run(config, opts, start=None, model=None, loss_fn=gpt_loss, init_model=init_gpt):
    """The reference: the single-device GPT trained on the whole global batch of every step.

    A generator of (step, loss tensor). ``start``: a checkpoint.load_full() result to resume
    from (weights, optimizer state, step); otherwise fresh weights from ``opts.seed``.
    ``model``: a GPT to train in place (to read its weights afterwards); default a new one.
    ``loss_fn(gpt, x, y)``: the reference's loss (Hooks.reference_loss).
    """
    model = init_model(config, opts.seed, opts.torch_dtype) if model is None else model
    optimizer = make_optimizer(model.parameters(), opts)
    step = 0
    if start is not None:
        model.load_state_dict(start["model"])
        ckpt.load_optimizer_state_by_name(model, optimizer, start["optimizer"])
        step = start["step"]
    for step in range(step, opts.steps):
        x, y = global_batch(step, opts.batch_size, config.seq_len, config.vocab_size, opts.seed, opts.data)
        yield step, train_step(model, optimizer, x, y, run_batch=partial(forward_backward, loss_fn=loss_fn))


def steps_on_comm(opts, config, model, optimizer, after_backward=None):
    """Steps 0 .. opts.steps-1 on simulated ranks (dp = 1): a generator of (step, loss tensor)."""
    for step in range(opts.steps):
        x, y = global_batch(step, opts.batch_size, config.seq_len, config.vocab_size, opts.seed, opts.data)
        yield step, train_step(model, optimizer, x, y, after_backward=after_backward)


def train_on_comm(comm, argv=()):
    """One TP rank's run on a tp_from_scratch Comm (e.g. run_spmd's simulated ranks), dp=1.

    The same model, data and optimizer as the torchrun script for the command line ``argv``,
    with the from-scratch collectives underneath. Returns the list of per-step losses.
    """
    opts = parse(argv)
    config = config_from_args(opts)
    model = gpt_to_tp(comm, init_gpt(config, opts.seed, opts.torch_dtype))
    optimizer = make_optimizer(model.parameters(), opts)
    return [loss.item() for _, loss in steps_on_comm(opts, config, model, optimizer)]


# ---------------------------------------------------------------------------------------
# Building the model on this rank
# ---------------------------------------------------------------------------------------

def tp_group_for(opts, mesh):
    """The object the parallel layers communicate through: it alone decides the collectives.

    --collectives native: the mesh's torch ProcessGroup; scratch: a TorchComm over that same
    group, whose ring collectives are built from send/recv and counted by its meter.
    """
    if opts.collectives == "native":
        return mesh.tp_group
    from tp_from_scratch.comm.torch_comm import TorchComm
    return TorchComm(mesh.tp_group, device=mesh.device if mesh.device.type == "cuda" else None,
                     timeout=opts.timeout)


def build(opts, config, mesh, start, group, parallelize=None, init_model=init_gpt, sharding=ckpt.GPT_SHARDING):
    """(model, optimizer, first step): fresh from the seed, or resumed from ``start``.

    parallelize(full, group): a later lesson's way to shard the single-device GPT ``full``
    (Hooks.parallelize), e.g. Lesson 7's sequence parallelism; by default gpt_to_tp, or the
    DTensor plan for --impl dtensor.
    """
    full = init_model(config, opts.seed, opts.torch_dtype)   # the same weights on every rank
    if start is not None:
        full.load_state_dict(start["model"])
    if parallelize is not None:
        model = parallelize(full.to(mesh.device), group)
    elif opts.impl == "dtensor":
        from tp_from_scratch.gpt.dtensor_plan import parallelize_gpt
        model = parallelize_gpt(full.to(mesh.device), mesh.device_mesh["tp"])
    else:
        model = gpt_to_tp(group, full).to(mesh.device)
    optimizer = make_optimizer(model.parameters(), opts)
    step = 0
    if start is not None:
        local = ckpt.shard_optimizer_state(start["optimizer"], mesh.tp, mesh.tp_rank, config, sharding)
        ckpt.load_optimizer_state_by_name(model, optimizer, local)
        if len(start["rng"]) == mesh.tp and start["rng"][mesh.tp_rank] is not None:
            torch.set_rng_state(start["rng"][mesh.tp_rank])
        step = start["step"]
    return model, optimizer, step


def save(opts, config, mesh, model, optimizer, step, hooks):
    """A sharded checkpoint: the TP ranks of DP replica 0 write, rank 0 commits (collective).

    The metadata records the settings a resume must agree with, the model description
    (hooks.description) every loader checks, and hooks.checkpoint_meta.
    """
    names = [ckpt.new_checkpoint_name(step) if mesh.rank == 0 else None]
    dist.broadcast_object_list(names, src=0)
    record = None
    if mesh.dp_rank == 0:
        record = ckpt.write_shard(opts.save, names[0], mesh.tp_rank, mesh.tp, model.state_dict(),
                                  ckpt.optimizer_state_by_name(model, optimizer), torch.get_rng_state())
    records = [None] * mesh.world
    dist.all_gather_object(records, record)
    if mesh.rank == 0:
        meta = {"dtype": opts.dtype, "optimizer": opts.optimizer, "lr": opts.learning_rate,
                "seed": opts.seed, "batch_size": opts.batch_size, **hooks.checkpoint_meta}
        ckpt.commit(opts.save, names[0], config, mesh.tp, step, [r for r in records if r], meta,
                    description=hooks.description)
    dist.barrier()


# ---------------------------------------------------------------------------------------
# The run
# ---------------------------------------------------------------------------------------

def report_memory(opts, model, config, mesh, init_model=init_gpt):
    n_local, bytes_local = count_parameters(model)
    per_rank = [None] * mesh.world
    dist.all_gather_object(per_rank, bytes_local)
    if mesh.rank == 0:
        n_full, bytes_full = count_parameters(init_model(config, 0, torch.float32))
        sizes = (f"{config.n_layers} layers, H={config.hidden}, nh={config.n_heads}, nkv={config.n_kv_heads}, "
                 f"F={config.ffn}, V={config.vocab_size}, T={config.seq_len}") if isinstance(config, GPTConfig) \
            else config.summary()   # a later lesson's model names its own sizes
        print(f"{config.arch if not isinstance(config, GPTConfig) else 'GPT'}: {n_full:,} parameters ({sizes}); "
              f"global batch B={opts.batch_size}; mesh dp={mesh.dp} x tp={mesh.tp}", flush=True)
        if opts.data == "text":
            from tp_from_scratch.gpt.text import FILES, corpus
            data, digest = corpus()
            print(f"data: {len(FILES)} files of this Python's standard library, {len(data):,} bytes "
                  f"(sha256 {digest[:16]}), last 10% held out", flush=True)
        for r, b in enumerate(per_rank):
            print(f"  rank {r} (dp {r // mesh.tp}, tp {r % mesh.tp}): parameters {b / 2**10:,.1f} KiB",
                  flush=True)


def loss_tolerance(opts, config, step):
    """The policy's bound for the loss at ``step``: TOLERANCE[dtype] x layers x (1 + step)
    (compare.tolerance's growth rule: roundoff compounds through the layers and the steps)."""
    return tolerance(opts.dtype, layers=config.n_layers, steps=step)


def verdict(loss, ref, step, tol):
    try:
        assert_matches_reference(loss, ref, name=f"loss at step {step}", tol=tol)
        return True, "equal"
    except AssertionError as e:
        return False, f"DIFFERS: {e}"


def run(opts, config, mesh, hooks=None):
    """Set up, train, report; returns the exit status (1 if a step differs from one device).

    hooks: what a later lesson's trainer changes (Hooks); the step, loop, checkpoints,
    metrics and report stay this lesson's."""
    hooks = hooks or Hooks()
    if hooks.description is None:   # Lesson 6's own model: the ordinary GPT of this config
        hooks = replace(hooks, description=ckpt.model_description(config))
    start = None
    if opts.load:
        start = ckpt.load_full(opts.load, config, hooks.description, hooks.sharding)
        ckpt.check_resume(start["meta"], opts.load, opts.steps, opts.optimizer)
    group = tp_group_for(opts, mesh)
    model, optimizer, first = build(opts, config, mesh, start, group, hooks.parallelize, hooks.init_model,
                                    hooks.sharding)
    report_memory(opts, model, config, mesh, hooks.init_model)
    reference = None
    if opts.compares and mesh.rank == 0:
        reference = single_device_run(config, opts, start, loss_fn=hooks.reference_loss or gpt_loss,
                                      init_model=hooks.init_model)
    counter = CollectiveCounter({mesh.tp_group: "tp", mesh.dp_group: "dp"})
    step_fn = partial(train_step, after_backward=hooks.after_backward)
    t_start = time.perf_counter()
    losses, ref_losses, bad = train_loop(opts, config, mesh, model, optimizer, first, reference, counter,
                                         step_fn, hooks, group)
    elapsed = time.perf_counter() - t_start
    if opts.save:
        save(opts, config, mesh, model, optimizer, opts.steps, hooks)
    if mesh.rank == 0:
        report(opts, config, mesh, group, counter, first, losses, ref_losses, bad, elapsed, hooks.reference_name)
        if hooks.summary is not None:
            hooks.summary(group, counter, opts.steps - first)
    return 1 if bad and differs_too_early(opts, config, first, losses, ref_losses) else 0


def differs_too_early(opts, config, first, losses, ref_losses):
    """Rank 0: print the first step whose loss differs from one device's; True if it is one of
    the steps that must be equal (every step, or the first --equal-steps)."""
    step = next(first + i for i, (a, b) in enumerate(zip(losses, ref_losses))
                if not verdict(torch.tensor(a, dtype=opts.torch_dtype), torch.tensor(b, dtype=opts.torch_dtype),
                               first + i, loss_tolerance(opts, config, first + i))[0])
    limit = opts.equal_steps or opts.steps
    print(f"steps {first}..{step - 1} equal to one device; step {step} differs: training amplifies the "
          f"roundoff of the two summation orders step after step until the runs part"
          f"{f' (allowed by --equal-steps {limit})' if step >= limit else ''}")
    return step < limit


def progress_bar(opts, total, is_main):
    """tqdm over the steps on rank 0; none with --no-progress or when stdout is not a terminal
    (| tee, CI logs: its carriage returns would interleave with the step lines)."""
    from tqdm import tqdm
    quiet = opts.no_progress or not sys.stdout.isatty()
    return tqdm(total=total, disable=not is_main or quiet, desc="training",
                unit="step", file=sys.stdout, dynamic_ncols=False, ncols=80)


def train_loop(opts, config, mesh, model, optimizer, first, reference, counter, step_fn=train_step,
               hooks=None, group=None):
    """Steps first .. opts.steps-1; returns (losses, single-device losses, steps that differ).

    step_fn: the step, with train_step's signature (a later lesson's is train_step with some
    parts changed: Lesson 8's after_backward, Lesson 11's DDP, ZeRO, pipeline). Every
    --eval-every and --save-every happens here, for every trainer."""
    hooks = hooks or Hooks()
    is_main = mesh.rank == 0
    metrics = None
    if opts.metrics and is_main:
        Path(opts.metrics).parent.mkdir(parents=True, exist_ok=True)
        metrics = open(opts.metrics, "w")
    bar = progress_bar(opts, opts.steps - first, is_main)
    losses, ref_losses, bad = [], [], 0
    parted = False  # past --equal-steps, once a step differs the two runs are apart for good
    try:
        for step in range(first, opts.steps):
            x, y = local_batch(step, opts.batch_size, config.seq_len, config.vocab_size, opts.seed,
                               mesh.dp_rank, mesh.dp, opts.data)
            t0 = time.perf_counter()
            measured = hooks.step_metrics(group, counter) if hooks.step_metrics else None
            with counter.counting():
                loss = step_fn(model, optimizer, x.to(mesh.device), y.to(mesh.device), mesh.dp_group, mesh.dp)
            record = {"step": step, "loss": loss.item(), "time_s": time.perf_counter() - t0,
                      **(measured() if measured else {})}
            if reference is not None:
                _, ref = next(reference)
                ok, text = verdict(loss.cpu(), ref, step, loss_tolerance(opts, config, step))
                if parted or (not ok and step >= (opts.equal_steps or opts.steps)):
                    parted = True  # a later step that happens to fall within tolerance is not "equal"
                    text = "apart: roundoff amplified by training (past --equal-steps)"
                bad += not ok
                record.update(single_loss=ref.item(), abs_diff=abs(loss.item() - ref.item()), equal=ok)
                ref_losses.append(ref.item())
                bar.write(f"step {step:4d}  loss {loss.item():.6f}  {hooks.reference_name} {ref.item():.6f}  "
                          f"|diff| {record['abs_diff']:.1e}  {text}")
            losses.append(record["loss"])
            if metrics:
                metrics.write(json.dumps(record) + "\n")
                metrics.flush()
            bar.set_postfix(loss=f"{loss.item():.4f}")
            bar.update(1)
            if opts.eval_every and (step + 1) % opts.eval_every == 0:
                val = validation_loss(model, opts, config, mesh.device)  # the same on every rank
                if is_main:
                    bar.write(f"step {step:4d}  validation loss {val:.4f} ({opts.data})")
                if metrics:
                    metrics.write(json.dumps({"step": step, "val_loss": val}) + "\n")
            if opts.save and opts.save_every and (step + 1) % opts.save_every == 0 and step + 1 < opts.steps:
                save(opts, config, mesh, model, optimizer, step + 1, hooks)
    finally:
        bar.close()
        if metrics:
            metrics.close()
    return losses, ref_losses, bad


def validation_loss(model, opts, config, device):
    """The loss on a fixed held-out batch (every rank evaluates the whole batch; no DP split).

    text: the validation split; markov: a batch no training step draws (step 2**40)."""
    if opts.data == "text":
        x, y = global_batch(0, opts.batch_size, config.seq_len, config.vocab_size, opts.seed, "text", "val")
    else:
        x, y = global_batch(2 ** 40, opts.batch_size, config.seq_len, config.vocab_size, opts.seed)
    with torch.no_grad():
        return model(x.to(device), y.to(device))[1].item()


def report(opts, config, mesh, group, counter, first, losses, ref_losses, bad, elapsed, reference_name="single-device"):
    """Rank 0's summary: time, final loss, communication per step, the single-device verdict."""
    n = opts.steps - first
    print(f"\n{n} steps in {elapsed:.1f} s; final loss {losses[-1] if losses else float('nan'):.6f}")
    print(f"communication per step on rank 0 ({opts.impl}; the bytes of the tensors handed to "
          f"torch.distributed's collectives, before any algorithm multiplies them):")
    if opts.impl == "dtensor":
        print("  (DTensor calls functional collectives, which this counter does not see)")
    print(counter.table(n))
    if opts.impl == "scratch" and opts.collectives == "scratch":
        print(f"TP traffic from scratch over the {n} steps (the TorchComm's meter: every ring "
              f"message this rank sent):")
        print(group.meter.table())
    if ref_losses:
        tol = f"{TOLERANCE[opts.dtype]:.0e} x {config.n_layers} layers x (1 + step) x max(1, |loss|)"
        allowed = f"; only steps {first}..{opts.equal_steps - 1} must be (--equal-steps {opts.equal_steps})" \
            if opts.equal_steps else ""
        if bad and opts.equal_steps:  # the line after the report says where they part
            print(f"{reference_name} comparison (tolerance {tol}, {opts.dtype}):")
        else:
            print(f"{reference_name} comparison: {n - bad} of {n} steps equal "
                  f"(tolerance {tol}, {opts.dtype}){allowed}")
    if opts.plot:
        from tp_from_scratch.plots import plot_loss_comparison
        label = f"dp={mesh.dp} x tp={mesh.tp} ({opts.impl})"
        steps = range(first, opts.steps)
        plot_loss_comparison(opts.plot, steps, losses, ref_losses, label,
                             [loss_tolerance(opts, config, step) for step in steps], opts.dtype)
        print(f"loss curves: {opts.plot}")
    if opts.save:
        print(f"checkpoint: {opts.save} (step {opts.steps}, tp={mesh.tp})")


def main(argv=None):
    opts = parse_config(build_parser(), validate, argv)
    mesh = setup_mesh(opts.tp, opts.device, opts.timeout, dtensor=opts.impl == "dtensor")
    run_and_exit(run, opts, config_from_args(opts), mesh)


def run_and_exit(run_fn, opts, config, mesh):
    """Exit with ``run_fn(opts, config, mesh)``'s status; a checkpoint error is printed with the
    rank and exits 1; the process group is torn down either way. Later lessons' trainers use it."""
    try:
        status = run_fn(opts, config, mesh)
    except ckpt.CheckpointError as e:
        print(f"rank {mesh.rank}: error: {e}", file=sys.stderr, flush=True)
        status = 1
    finally:
        dist.destroy_process_group()
    sys.exit(status)


if __name__ == "__main__":
    main()
