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
    # one node with 8 GPUs: tp=8 (NCCL)
    .venv/bin/torchrun --standalone --nproc-per-node 8 -m tp_from_scratch.gpt.train --tp 8 --device cuda
    # two nodes with 8 GPUs each: tp=8 inside a node, dp=2 across nodes; run on each node
    .venv/bin/torchrun --nnodes 2 --node-rank 0|1 --nproc-per-node 8 --master-addr NODE0 --master-port 29500 \\
        -m tp_from_scratch.gpt.train --tp 8 --device cuda

The world of ranks is a dp x tp mesh (tp_from_scratch/gpt/mesh.py): rank = dp_index * tp + tp_index,
so the ranks of one TP group are neighbours (on one node, where the bandwidth is). Gradients
are averaged over each DP group (the ranks holding the same shard) after backward.

Batches are a function of (seed, step) (tp_from_scratch.gpt.data); DP rank d takes rows
d*B/dp .. (d+1)*B/dp of the global batch, so the global loss is the same at every dp and
tp, and equals the single-device loss on the whole batch up to summation order.
"""
import argparse
import json
import os
import sys
import time
from pathlib import Path

import torch
import torch.distributed as dist

from tp_from_scratch.gpt import checkpoint as ckpt
from tp_from_scratch.compare import TOLERANCE, assert_matches_reference
from tp_from_scratch.gpt.data import global_batch, local_batch
from tp_from_scratch.gpt.mesh import setup_mesh
from tp_from_scratch.gpt.options import parse_valid_args
from tp_from_scratch.gpt.model import GPTConfig, count_parameters, gpt_to_tp, init_gpt
from tp_from_scratch.gpt.traffic import CollectiveCounter


# ---------------------------------------------------------------------------------------
# Command line
# ---------------------------------------------------------------------------------------

def build_parser():
    p = argparse.ArgumentParser(prog="python -m tp_from_scratch.gpt.train", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--tp", type=int, default=1, help="tensor-parallel degree t (divides the world size)")
    p.add_argument("--steps", type=int, default=50, help="train until this step (a resumed run continues)")
    p.add_argument("--seed", type=int, default=0, help="weights and data")
    p.add_argument("--dtype", choices=["float32", "float64"], default="float32")
    p.add_argument("--impl", choices=["scratch", "dtensor"], default="scratch",
                   help="scratch: tp_from_scratch.nn layers; dtensor: PyTorch's parallelize_module")
    p.add_argument("--collectives", choices=["native", "scratch"], default="native",
                   help="what the scratch layers' TP group is: the torch ProcessGroup (native "
                        "collectives) or a TorchComm over it (the ring collectives from scratch)")
    p.add_argument("--device", choices=["cpu", "cuda"], default="cpu")
    p.add_argument("--metrics", metavar="PATH", help="JSON Lines, one object per step (rank 0 writes)")
    p.add_argument("--save", metavar="DIR", help="write a sharded checkpoint at the end (and every --save-every)")
    p.add_argument("--save-every", type=int, default=0, metavar="N")
    p.add_argument("--load", metavar="DIR_OR_FILE",
                   help="resume from a checkpoint (any tp), or start from an exported single-device .pt")
    p.add_argument("--compare-single", action="store_true",
                   help="rank 0 also trains the single-device GPT and prints each loss next to it")
    p.add_argument("--equal-steps", type=int, default=None, metavar="N",
                   help="with --compare-single: exit 1 only if one of the first N steps differs (default: "
                        "any step); two long runs part once training has amplified their roundoff")
    p.add_argument("--plot", metavar="PNG", help="loss curves, TP against single-device (implies --compare-single)")
    p.add_argument("--timeout", type=float, default=120.0, help="seconds any collective may wait")
    p.add_argument("--no-progress", action="store_true", help="no progress bar")
    g = p.add_argument_group("optimizer and batch")
    g.add_argument("--optimizer", choices=["adamw", "sgd"], default="adamw")
    g.add_argument("--lr", type=float, default=None, help="default 3e-3 (adamw) or 0.3 (sgd)")
    g.add_argument("--batch-size", type=int, default=8, help="global batch B (split over dp)")
    g.add_argument("--data", choices=["markov", "text"], default="markov",
                   help="markov: a seeded Markov chain (known entropy rate); text: bytes of the Python "
                        "standard library's source, V=256 (gpt/text.py)")
    g.add_argument("--eval-every", type=int, default=0, metavar="N",
                   help="every N steps, the loss on a fixed held-out batch (text: the validation split)")
    g = p.add_argument_group("model size")
    d = GPTConfig()
    g.add_argument("--vocab-size", type=int, default=d.vocab_size)
    g.add_argument("--seq-len", type=int, default=d.seq_len)
    g.add_argument("--layers", type=int, default=d.n_layers)
    g.add_argument("--hidden", type=int, default=d.hidden)
    g.add_argument("--heads", type=int, default=d.n_heads)
    g.add_argument("--kv-heads", type=int, default=d.n_kv_heads)
    g.add_argument("--ffn", type=int, default=0, help="0: 4 x hidden")
    g.add_argument("--untied", action="store_true", help="an LM head of its own instead of the embedding")
    g.add_argument("--gelu", choices=["erf", "tanh"], default=None,
                   help="exact GeLU (erf) or GPT-2's tanh approximation (the numpy lessons' form); "
                        "default: the architecture's (gpt erf, gpt2 tanh)")
    g.add_argument("--arch", choices=["gpt", "gpt2", "llama"], default="gpt",
                   help="gpt: this course's model; gpt2: LayerNorm, learned positions, all biases, tanh "
                        "GeLU; llama: RMSNorm, RoPE, SwiGLU, no biases, untied head (gpt/model.py)")
    return p


def config_from_args(args):
    vocab = 256 if getattr(args, "data", "markov") == "text" else args.vocab_size  # text: bytes
    return GPTConfig(vocab_size=vocab, seq_len=args.seq_len, n_layers=args.layers,
                     hidden=args.hidden, n_heads=args.heads, n_kv_heads=args.kv_heads,
                     ffn=args.ffn, tie_embeddings=False if args.untied else None, gelu=args.gelu,
                     arch=getattr(args, "arch", "gpt"))


def validate(args, world_size):
    """The first problem with the arguments for this world size, as a sentence; None if fine."""
    if args.steps < 0:
        return f"--steps must be 0 or more, got {args.steps}"
    if args.tp < 1:
        return f"--tp must be at least 1, got {args.tp}"
    if world_size % args.tp != 0:
        return (f"world size {world_size} is not divisible by tp={args.tp} "
                f"(launch a multiple of {args.tp} processes: torchrun --nproc-per-node ...)")
    dp = world_size // args.tp
    if args.batch_size < 1 or args.batch_size % dp != 0:
        return f"batch size {args.batch_size} is not divisible by dp={dp}"
    if args.timeout <= 0:
        return f"--timeout must be positive, got {args.timeout}"
    if args.save_every < 0:
        return f"--save-every must be 0 or more, got {args.save_every}"
    if args.impl == "dtensor" and (args.save or args.load):
        return "--save and --load work with --impl scratch only"
    if args.impl == "dtensor" and args.kv_heads is not None and args.kv_heads % args.tp != 0:
        return (f"--impl dtensor needs --kv-heads divisible by --tp (got {args.kv_heads} and "
                f"{args.tp}): ColwiseParallel would cut a key/value head across ranks, where "
                f"--impl scratch replicates each KV head on the ranks that share it")
    if args.device == "cuda" and not torch.cuda.is_available():
        return "--device cuda was asked for, but torch sees no CUDA device"
    try:
        config_from_args(args).validate(args.tp)
    except ValueError as e:
        return str(e)
    return None


def default_lr(args):
    return args.lr if args.lr is not None else (3e-3 if args.optimizer == "adamw" else 0.3)


def make_optimizer(params, args):
    """AdamW (betas 0.9, 0.95, no weight decay) or SGD with momentum; element-wise, so TP-safe."""
    lr = default_lr(args)
    if args.optimizer == "sgd":
        return torch.optim.SGD(params, lr=lr, momentum=0.9)
    return torch.optim.AdamW(params, lr=lr, betas=(0.9, 0.95), weight_decay=0.0, foreach=False)


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


def train_step(model, optimizer, x, y, dp_group=None, dp=1):
    """Forward, backward, DP gradient average, optimizer step; returns the global mean loss.

    With dp=1 it touches no process group, so it also runs on in-process simulated ranks.
    """
    optimizer.zero_grad(set_to_none=True)
    _, loss = model(x, y)
    loss.backward()
    if dp > 1:
        average_gradients([p for p in model.parameters() if p.grad is not None], dp_group, dp)
    optimizer.step()
    loss = loss.detach().clone()
    if dp > 1:
        dist.all_reduce(loss, group=dp_group)
        loss /= dp
    return loss


def single_device_run(config, args, start=None, model=None):
    """The reference: the single-device GPT trained on the whole global batch of every step.

    A generator of (step, loss tensor). ``start``: a checkpoint.load_full() result to resume
    from (weights, optimizer state, step); otherwise fresh weights from ``args.seed``.
    ``model``: a GPT to train in place (to read its weights afterwards); default a new one.
    """
    dtype = getattr(torch, args.dtype)
    model = init_gpt(config, args.seed, dtype) if model is None else model
    optimizer = make_optimizer(model.parameters(), args)
    step = 0
    if start is not None:
        model.load_state_dict(start["model"])
        ckpt.load_optimizer_state_by_name(model, optimizer, start["optimizer"])
        step = start["step"]
    for step in range(step, args.steps):
        x, y = global_batch(step, args.batch_size, config.seq_len, config.vocab_size, args.seed, args.data)
        optimizer.zero_grad(set_to_none=True)
        _, loss = model(x, y)
        loss.backward()
        optimizer.step()
        yield step, loss.detach()


def train_on_comm(comm, argv=()):
    """One TP rank's run on a tp_from_scratch Comm (e.g. run_spmd's simulated ranks), dp=1.

    The same model, data and optimizer as the torchrun script for the command line ``argv``,
    with the from-scratch collectives underneath. Returns the list of per-step losses.
    """
    args = build_parser().parse_args(list(argv))
    config = config_from_args(args)
    model = gpt_to_tp(comm, init_gpt(config, args.seed, getattr(torch, args.dtype)))
    optimizer = make_optimizer(model.parameters(), args)
    losses = []
    for step in range(args.steps):
        x, y = global_batch(step, args.batch_size, config.seq_len, config.vocab_size, args.seed, args.data)
        losses.append(train_step(model, optimizer, x, y).item())
    return losses


# ---------------------------------------------------------------------------------------
# Building the model on this rank
# ---------------------------------------------------------------------------------------

def tp_group_for(args, mesh):
    """The object the parallel layers communicate through: it alone decides the collectives.

    --collectives native: the mesh's torch ProcessGroup; scratch: a TorchComm over that same
    group, whose ring collectives are built from send/recv and counted by its meter.
    """
    if args.collectives == "native":
        return mesh.tp_group
    from tp_from_scratch.comm.torch_comm import TorchComm
    return TorchComm(mesh.tp_group, device=mesh.device if mesh.device.type == "cuda" else None,
                     timeout=args.timeout)


def build(args, config, mesh, start, group, parallelize=None):
    """(model, optimizer, first step): fresh from the seed, or resumed from ``start``.

    parallelize(full, group): a later lesson's way to shard the single-device GPT ``full``
    (already on this rank's device), e.g. Lesson 7's sequence parallelism; by default
    gpt_to_tp, or the DTensor plan for --impl dtensor.
    """
    dtype = getattr(torch, args.dtype)
    full = init_gpt(config, args.seed, dtype)   # the same weights on every rank
    if start is not None:
        full.load_state_dict(start["model"])
    if parallelize is not None:
        model = parallelize(full.to(mesh.device), group)
    elif args.impl == "dtensor":
        from tp_from_scratch.gpt.dtensor_plan import parallelize_gpt
        model = parallelize_gpt(full.to(mesh.device), mesh.device_mesh["tp"])
    else:
        model = gpt_to_tp(group, full).to(mesh.device)
    optimizer = make_optimizer(model.parameters(), args)
    step = 0
    if start is not None:
        local = ckpt.shard_optimizer_state(start["optimizer"], mesh.tp, mesh.tp_rank, config)
        ckpt.load_optimizer_state_by_name(model, optimizer, local)
        if len(start["rng"]) == mesh.tp and start["rng"][mesh.tp_rank] is not None:
            torch.set_rng_state(start["rng"][mesh.tp_rank])
        step = start["step"]
    return model, optimizer, step


def save(args, config, mesh, model, optimizer, step, extra=None):
    """A sharded checkpoint: the TP ranks of DP replica 0 write, rank 0 commits (collective).

    extra: more entries for the metadata (a later lesson's trainer records its own settings).
    """
    names = [ckpt.new_checkpoint_name(step) if mesh.rank == 0 else None]
    dist.broadcast_object_list(names, src=0)
    record = None
    if mesh.dp_rank == 0:
        record = ckpt.write_shard(args.save, names[0], mesh.tp_rank, mesh.tp, model.state_dict(),
                                  ckpt.optimizer_state_by_name(model, optimizer), torch.get_rng_state())
    records = [None] * mesh.world
    dist.all_gather_object(records, record)
    if mesh.rank == 0:
        meta = {"dtype": args.dtype, "optimizer": args.optimizer, "lr": default_lr(args),
                "seed": args.seed, "batch_size": args.batch_size, **(extra or {})}
        ckpt.commit(args.save, names[0], config, mesh.tp, step, [r for r in records if r], meta)
    dist.barrier()


# ---------------------------------------------------------------------------------------
# The run
# ---------------------------------------------------------------------------------------

def report_memory(args, model, config, mesh):
    n_local, bytes_local = count_parameters(model)
    per_rank = [None] * mesh.world
    dist.all_gather_object(per_rank, bytes_local)
    if mesh.rank == 0:
        n_full, bytes_full = count_parameters(init_gpt(config, 0, getattr(torch, "float32")))
        print(f"GPT: {n_full:,} parameters ({config.n_layers} layers, H={config.hidden}, "
              f"nh={config.n_heads}, nkv={config.n_kv_heads}, F={config.ffn}, V={config.vocab_size}, "
              f"T={config.seq_len}); global batch B={args.batch_size}; mesh dp={mesh.dp} x tp={mesh.tp}",
              flush=True)
        if args.data == "text":
            from tp_from_scratch.gpt.text import FILES, corpus
            data, digest = corpus()
            print(f"data: {len(FILES)} files of this Python's standard library, {len(data):,} bytes "
                  f"(sha256 {digest[:16]}), last 10% held out", flush=True)
        for r, b in enumerate(per_rank):
            print(f"  rank {r} (dp {r // mesh.tp}, tp {r % mesh.tp}): parameters {b / 2**10:,.1f} KiB",
                  flush=True)


def verdict(loss, ref, step):
    try:
        assert_matches_reference(loss, ref, name=f"loss at step {step}")
        return True, "equal"
    except AssertionError as e:
        return False, f"DIFFERS: {e}"


def run(args, config, mesh, parallelize=None):
    """Set up, train, report; returns the exit status (1 if a step differs from one device).

    parallelize: see build (a later lesson's trainer passes its own)."""
    start = ckpt.load_full(args.load, config) if args.load else None
    saved_with = start and start["meta"].get("optimizer")
    if saved_with and saved_with != args.optimizer:
        raise ckpt.CheckpointError(f"checkpoint {args.load} holds {saved_with} state, "
                                   f"but this run uses --optimizer {args.optimizer}")
    group = tp_group_for(args, mesh)
    model, optimizer, first = build(args, config, mesh, start, group, parallelize)
    report_memory(args, model, config, mesh)
    compare = (args.compare_single or args.plot) and mesh.rank == 0
    reference = single_device_run(config, args, start) if compare else None
    counter = CollectiveCounter({mesh.tp_group: "tp", mesh.dp_group: "dp"})
    t_start = time.perf_counter()
    losses, ref_losses, bad = train_loop(args, config, mesh, model, optimizer, first, reference, counter)
    elapsed = time.perf_counter() - t_start
    if args.save:
        save(args, config, mesh, model, optimizer, args.steps)
    if mesh.rank == 0:
        report(args, mesh, group, counter, first, losses, ref_losses, bad, elapsed)
    return 1 if bad and differs_too_early(args, first, losses, ref_losses) else 0


def differs_too_early(args, first, losses, ref_losses):
    """Rank 0: print the first step whose loss differs from one device's; True if it is one of
    the steps that must be equal (every step, or the first --equal-steps)."""
    dtype = getattr(torch, args.dtype)
    step = next(first + i for i, (a, b) in enumerate(zip(losses, ref_losses))
                if not verdict(torch.tensor(a, dtype=dtype), torch.tensor(b, dtype=dtype), first + i)[0])
    limit = getattr(args, "equal_steps", None) or args.steps
    print(f"steps {first}..{step - 1} equal to one device; step {step} differs: training amplifies the "
          f"roundoff of the two summation orders step after step until the runs part"
          f"{f' (allowed by --equal-steps {limit})' if step >= limit else ''}")
    return step < limit


def train_loop(args, config, mesh, model, optimizer, first, reference, counter, step_fn=None):
    """Steps first .. args.steps-1; returns (losses, single-device losses, steps that differ).

    step_fn: a later lesson's step with train_step's signature (Lesson 11: DDP, ZeRO, pipeline)."""
    is_main = mesh.rank == 0
    metrics = None
    if args.metrics and is_main:
        Path(args.metrics).parent.mkdir(parents=True, exist_ok=True)
        metrics = open(args.metrics, "w")
    from tqdm import tqdm
    # no progress bar when stdout is not a terminal (| tee, CI logs): its carriage returns
    # would interleave with the step lines
    quiet = args.no_progress or not sys.stdout.isatty()
    bar = tqdm(total=args.steps - first, disable=not is_main or quiet, desc="training",
               unit="step", file=sys.stdout, dynamic_ncols=False, ncols=80)
    losses, ref_losses, bad = [], [], 0
    parted = False  # past --equal-steps, once a step differs the two runs are apart for good
    try:
        for step in range(first, args.steps):
            x, y = local_batch(step, args.batch_size, config.seq_len, config.vocab_size, args.seed,
                               mesh.dp_rank, mesh.dp, args.data)
            t0 = time.perf_counter()
            with counter.counting():
                loss = (step_fn or train_step)(model, optimizer, x.to(mesh.device), y.to(mesh.device),
                                               mesh.dp_group, mesh.dp)
            record = {"step": step, "loss": loss.item(), "time_s": time.perf_counter() - t0}
            if reference is not None:
                _, ref = next(reference)
                ok, text = verdict(loss.cpu(), ref, step)
                if parted or (not ok and step >= (getattr(args, "equal_steps", None) or args.steps)):
                    parted = True  # a later step that happens to fall within tolerance is not "equal"
                    text = "apart: roundoff amplified by training (past --equal-steps)"
                bad += not ok
                record.update(single_loss=ref.item(), abs_diff=abs(loss.item() - ref.item()), equal=ok)
                ref_losses.append(ref.item())
                bar.write(f"step {step:4d}  loss {loss.item():.6f}  single-device {ref.item():.6f}  "
                          f"|diff| {record['abs_diff']:.1e}  {text}")
            losses.append(record["loss"])
            if metrics:
                metrics.write(json.dumps(record) + "\n")
                metrics.flush()
            bar.set_postfix(loss=f"{loss.item():.4f}")
            bar.update(1)
            if args.eval_every and (step + 1) % args.eval_every == 0:
                val = validation_loss(model, args, config, mesh.device)  # the same on every rank
                if is_main:
                    bar.write(f"step {step:4d}  validation loss {val:.4f} ({args.data})")
                if metrics:
                    metrics.write(json.dumps({"step": step, "val_loss": val}) + "\n")
            if args.save and args.save_every and (step + 1) % args.save_every == 0 and step + 1 < args.steps:
                save(args, config, mesh, model, optimizer, step + 1)
    finally:
        bar.close()
        if metrics:
            metrics.close()
    return losses, ref_losses, bad


def validation_loss(model, args, config, device):
    """The loss on a fixed held-out batch (every rank evaluates the whole batch; no DP split).

    text: the validation split; markov: a batch no training step draws (step 2**40)."""
    if args.data == "text":
        x, y = global_batch(0, args.batch_size, config.seq_len, config.vocab_size, args.seed, "text", "val")
    else:
        x, y = global_batch(2 ** 40, args.batch_size, config.seq_len, config.vocab_size, args.seed)
    with torch.no_grad():
        return model(x.to(device), y.to(device))[1].item()


def report(args, mesh, group, counter, first, losses, ref_losses, bad, elapsed):
    """Rank 0's summary: time, final loss, communication per step, the single-device verdict."""
    n = args.steps - first
    print(f"\n{n} steps in {elapsed:.1f} s; final loss {losses[-1] if losses else float('nan'):.6f}")
    print(f"communication per step on rank 0 ({args.impl}; the bytes of the tensors handed to "
          f"torch.distributed's collectives, before any algorithm multiplies them):")
    if args.impl == "dtensor":
        print("  (DTensor calls functional collectives, which this counter does not see)")
    print(counter.table(n))
    if args.impl == "scratch" and args.collectives == "scratch":
        print(f"TP traffic from scratch over the {n} steps (the TorchComm's meter: every ring "
              f"message this rank sent):")
        print(group.meter.table())
    if ref_losses:
        tol = TOLERANCE[args.dtype]
        if bad and getattr(args, "equal_steps", None):  # the line after the report says where they part
            print(f"single-device comparison (tolerance {tol:.0e} x max(1, |loss|), {args.dtype}):")
        else:
            print(f"single-device comparison: {n - bad} of {n} steps equal "
                  f"(tolerance {tol:.0e} x max(1, |loss|), {args.dtype})")
    if args.plot:
        from tp_from_scratch.plots import plot_loss_comparison
        label = f"dp={mesh.dp} x tp={mesh.tp} ({args.impl})"
        plot_loss_comparison(args.plot, range(first, args.steps), losses, ref_losses, label,
                             TOLERANCE[args.dtype], args.dtype)
        print(f"loss curves: {args.plot}")
    if args.save:
        print(f"checkpoint: {args.save} (step {args.steps}, tp={mesh.tp})")


def main(argv=None):
    args = parse_valid_args(build_parser(), validate, argv)
    config = config_from_args(args)
    mesh = setup_mesh(args.tp, args.device, args.timeout, dtensor=args.impl == "dtensor")
    run_and_exit(run, args, config, mesh)


def run_and_exit(run_fn, args, config, mesh):
    """Exit with ``run_fn(args, config, mesh)``'s status; a checkpoint error is printed with the
    rank and exits 1; the process group is torn down either way. Later lessons' trainers use it."""
    try:
        status = run_fn(args, config, mesh)
    except ckpt.CheckpointError as e:
        print(f"rank {mesh.rank}: error: {e}", file=sys.stderr, flush=True)
        status = 1
    finally:
        dist.destroy_process_group()
    sys.exit(status)


if __name__ == "__main__":
    main()
