"""Train the CAAT GPT (partially synchronized activations) with tensor parallelism.

    # tp=2, half the channels synced, each step's loss next to the single-device t-stream model
    .venv/bin/torchrun --standalone --nproc-per-node 2 -m tp_from_scratch.partial_sync.train --tp 2 --sync-fraction 0.5 --compare-single
    # the from-scratch ring collectives, whose meter counts every byte sent
    .venv/bin/torchrun --standalone --nproc-per-node 4 -m tp_from_scratch.partial_sync.train --tp 4 --sync-fraction 0.25 --collectives scratch
    # no launcher: t simulated ranks in one process (threads), the meter counts every byte
    .venv/bin/python -m tp_from_scratch.partial_sync.train --tp 2 --sync-fraction 0.5

Every option of tp_from_scratch.gpt.train works the same (model size, optimizer, batch, seed,
--metrics, --save / --load), plus --sync-fraction p (default 1.0: ordinary TP). A training
step is Lesson 6's, with one addition between backward and the optimizer: the gradients of
the parameters the streams share are summed over the TP group (all_reduce_replicated_grads).
The summary prints the TP bytes per step; the metrics file records p and those bytes.

A CAAT checkpoint belongs to its t: the ranks' streams are different models' activations, and
no resharding maps t streams onto t' streams. Loading it at another t is refused, unless p = 1.
"""
import json
import os
import sys
import time
from pathlib import Path

import torch
import torch.distributed as dist

from tp_from_scratch.gpt import checkpoint as ckpt
from tp_from_scratch.gpt import train as gpt_train
from tp_from_scratch.gpt.data import global_batch, local_batch
from tp_from_scratch.gpt.model import init_gpt
from tp_from_scratch.gpt.traffic import CollectiveCounter
from tp_from_scratch.partial_sync.autograd import all_reduce_replicated_grads
from tp_from_scratch.partial_sync.mappings import synced_channels
from tp_from_scratch.partial_sync.model import caat_from_gpt, t_stream_forward


def build_parser():
    parser = gpt_train.build_parser()
    parser.prog = "python -m tp_from_scratch.partial_sync.train"
    parser.description = __doc__
    parser.add_argument("--sync-fraction", type=float, default=1.0, metavar="P",
                        help="fraction p of the hidden channels all-reduced at each row-parallel "
                             "output (the leading floor(p*H)); 1.0 is ordinary TP")
    return parser


def validate(args, world_size):
    """The first problem with the arguments, as a sentence; None if fine."""
    if not 0.0 <= args.sync_fraction <= 1.0:
        return f"--sync-fraction must be in [0, 1], got {args.sync_fraction}"
    if args.impl != "scratch":
        return "--impl dtensor has no partial reduce: use --impl scratch"
    return gpt_train.validate(args, world_size)


def check_checkpoint_fits(meta, tp, sync_fraction):
    """Raise CheckpointError unless a checkpoint saved with ``meta`` can be loaded at (tp, p).

    A plain GPT checkpoint counts as p = 1. With p < 1 the model is a function of t (each
    rank's private channels are its own stream's), so only the same t and p will do.
    """
    saved_p = float(meta.get("sync_fraction", 1.0))
    saved_tp = int(meta.get("tp", 1))
    if saved_p != sync_fraction:
        raise ckpt.CheckpointError(
            f"the checkpoint was trained with --sync-fraction {saved_p}, this run asks for "
            f"{sync_fraction}: a different p is a different model")
    if sync_fraction < 1.0 and saved_tp != tp:
        raise ckpt.CheckpointError(
            f"the checkpoint was trained at tp={saved_tp} with --sync-fraction {saved_p} < 1; "
            f"its ranks' private channels belong to {saved_tp} streams, and no resharding turns them "
            f"into {tp}: resume at --tp {saved_tp} (only p = 1 checkpoints reshard)")


def caat_train_step(model, optimizer, x, y, dp_group=None, dp=1):
    """Forward, backward, the replicated gradients summed over TP, DP average, step; the loss."""
    optimizer.zero_grad(set_to_none=True)
    _, loss = model(x, y)
    loss.backward()
    all_reduce_replicated_grads(model.group, model)
    if dp > 1:
        gpt_train.average_gradients([p for p in model.parameters() if p.grad is not None], dp_group, dp)
    optimizer.step()
    loss = loss.detach().clone()
    if dp > 1:
        dist.all_reduce(loss, group=dp_group)
        loss /= dp
    return loss


def t_stream_run(config, args, tp, start=None):
    """The single-device reference: the t-stream model trained on every step's global batch.

    A generator of (step, loss tensor), like gpt.train.single_device_run.
    """
    gpt = init_gpt(config, args.seed, getattr(torch, args.dtype))
    optimizer = gpt_train.make_optimizer(gpt.parameters(), args)
    first = 0
    if start is not None:
        gpt.load_state_dict(start["model"])
        ckpt.load_optimizer_state_by_name(gpt, optimizer, start["optimizer"])
        first = start["step"]
    for step in range(first, args.steps):
        x, y = global_batch(step, args.batch_size, config.seq_len, config.vocab_size, args.seed)
        optimizer.zero_grad(set_to_none=True)
        _, loss = t_stream_forward(gpt, x, y, tp, args.sync_fraction)
        loss.backward()
        optimizer.step()
        yield step, loss.detach()


def t_stream_losses(argv):
    """[loss per step] of the single-device t-stream model for the command line ``argv``."""
    args = build_parser().parse_args(list(argv))
    return [loss.item() for _, loss in t_stream_run(gpt_train.config_from_args(args), args, args.tp)]


def activation_bytes_per_step(config, batch, tp, sync_fraction, itemsize):
    """Payload bytes of the partial reduces in one step: 2 per block forward, 2 backward, (B, T, k)."""
    if tp == 1:
        return 0
    k = synced_channels(config.hidden, sync_fraction)
    return 4 * config.n_layers * batch * config.seq_len * k * itemsize


def train_on_comm(comm, argv=()):
    """One TP rank's run on a tp_from_scratch Comm (run_spmd's simulated ranks), dp = 1.

    Returns {"losses": [...], "bytes_sent": [per step], "time_s": [per step]} for this rank.
    """
    args = build_parser().parse_args(list(argv))
    config = gpt_train.config_from_args(args)
    model = caat_from_gpt(comm, init_gpt(config, args.seed, getattr(torch, args.dtype)), args.sync_fraction)
    optimizer = gpt_train.make_optimizer(model.parameters(), args)
    out = {"losses": [], "bytes_sent": [], "time_s": []}
    for step in range(args.steps):
        x, y = global_batch(step, args.batch_size, config.seq_len, config.vocab_size, args.seed)
        before, t0 = comm.meter.bytes_sent, time.perf_counter()
        out["losses"].append(caat_train_step(model, optimizer, x, y).item())
        out["time_s"].append(time.perf_counter() - t0)
        out["bytes_sent"].append(comm.meter.bytes_sent - before)
    return out


def _tp_bytes(counter, group, args):
    """TP bytes so far: the TorchComm's meter (scratch) or the payloads handed to torch (native)."""
    if args.collectives == "scratch":
        return group.meter.bytes_sent
    return sum(b for (_, label), b in counter.bytes.items() if label == "tp")


def run(args, config, mesh):
    """Set up, train, report on torchrun; returns the exit status."""
    start = None
    if args.load:
        start = ckpt.load_full(args.load, config)
        check_checkpoint_fits(start["meta"] if "meta" in start else {}, mesh.tp, args.sync_fraction)
    group = gpt_train.tp_group_for(args, mesh)
    full = init_gpt(config, args.seed, getattr(torch, args.dtype))
    if start is not None:
        full.load_state_dict(start["model"])
    model = caat_from_gpt(group, full, args.sync_fraction).to(mesh.device)
    optimizer = gpt_train.make_optimizer(model.parameters(), args)
    first = 0
    if start is not None:
        local = ckpt.shard_optimizer_state(start["optimizer"], mesh.tp, mesh.tp_rank, config)
        ckpt.load_optimizer_state_by_name(model, optimizer, local)
        first = start["step"]
    is_main = mesh.rank == 0
    reference = t_stream_run(config, args, mesh.tp, start) if args.compare_single and is_main else None
    counter = CollectiveCounter({mesh.tp_group: "tp", mesh.dp_group: "dp"})
    metrics = open(args.metrics, "w") if args.metrics and is_main else None
    losses, bad, t_start = [], 0, time.perf_counter()
    try:
        for step in range(first, args.steps):
            x, y = local_batch(step, args.batch_size, config.seq_len, config.vocab_size, args.seed,
                               mesh.dp_rank, mesh.dp)
            before, t0 = _tp_bytes(counter, group, args), time.perf_counter()
            with counter.counting():
                loss = caat_train_step(model, optimizer, x.to(mesh.device), y.to(mesh.device),
                                       mesh.dp_group, mesh.dp)
            record = {"step": step, "loss": loss.item(), "time_s": time.perf_counter() - t0,
                      "sync_fraction": args.sync_fraction, "tp_bytes": _tp_bytes(counter, group, args) - before}
            if reference is not None:
                _, ref = next(reference)
                ok, text = gpt_train.verdict(loss.cpu(), ref, step)
                bad += not ok
                record.update(single_loss=ref.item(), equal=ok)
                print(f"step {step:4d}  loss {loss.item():.6f}  t-stream single-device {ref.item():.6f}  {text}",
                      flush=True)
            losses.append(record["loss"])
            if metrics:
                metrics.write(json.dumps(record) + "\n")
                metrics.flush()
    finally:
        if metrics:
            metrics.close()
    elapsed = time.perf_counter() - t_start
    if args.save:
        # p goes into the metadata: check_checkpoint_fits reads it back
        gpt_train.save(args, config, mesh, model, optimizer, args.steps,
                       extra={"sync_fraction": args.sync_fraction})
    if is_main:
        n = max(args.steps - first, 1)
        itemsize = torch.finfo(getattr(torch, args.dtype)).bits // 8
        print(f"\n{args.steps - first} steps in {elapsed:.1f} s; final loss {losses[-1] if losses else float('nan'):.6f}")
        print(f"sync fraction p = {args.sync_fraction}: {synced_channels(config.hidden, args.sync_fraction)} "
              f"of {config.hidden} channels synced")
        print(f"TP bytes per step on rank 0: {_tp_bytes(counter, group, args) / n:,.0f} "
              f"({'ring messages sent' if args.collectives == 'scratch' else 'payloads handed to torch.distributed'});"
              f" the partial reduces' payload {activation_bytes_per_step(config, args.batch_size // mesh.dp, mesh.tp, args.sync_fraction, itemsize):,} "
              f"(at p = 1: {activation_bytes_per_step(config, args.batch_size // mesh.dp, mesh.tp, 1.0, itemsize):,})")
        print(counter.table(n))
        if reference is not None:
            print(f"t-stream single-device comparison: {n - bad} of {n} steps equal")
    return 1 if bad else 0


def simulated_main(args, argv):
    """No launcher: t simulated ranks in this process; print the losses and the metered bytes."""
    from tp_from_scratch.comm import run_spmd
    results = run_spmd(train_on_comm, args.tp, list(argv))
    r0 = results[0]
    for step, (loss, sent) in enumerate(zip(r0["losses"], r0["bytes_sent"])):
        print(f"step {step:4d}  loss {loss:.6f}  TP bytes sent by rank 0 {sent:,}")
    n = max(len(r0["losses"]), 1)
    print(f"sync fraction p = {args.sync_fraction}: TP bytes per step on rank 0 {sum(r0['bytes_sent']) / n:,.0f}")
    if args.metrics:
        Path(args.metrics).parent.mkdir(parents=True, exist_ok=True)
        with open(args.metrics, "w") as f:
            for step, (loss, sent, dt) in enumerate(zip(r0["losses"], r0["bytes_sent"], r0["time_s"])):
                f.write(json.dumps({"step": step, "loss": loss, "time_s": dt, "sync_fraction": args.sync_fraction,
                                    "tp_bytes": sent}) + "\n")
    return 0


def main(argv=None):
    argv = sys.argv[1:] if argv is None else list(argv)
    parser = build_parser()
    launched = "WORLD_SIZE" in os.environ
    # without a launcher the ranks are simulated: the world is --tp's
    args = gpt_train.parse_valid_args(
        parser, lambda a, world: validate(a, world if launched else a.tp), argv)
    if not launched:
        if args.save or args.load or args.compare_single:
            parser.error("--save, --load and --compare-single need torchrun")
        sys.exit(simulated_main(args, argv))
    from tp_from_scratch.gpt.mesh import setup_mesh
    config = gpt_train.config_from_args(args)
    mesh = setup_mesh(args.tp, args.device, args.timeout)
    gpt_train.run_and_exit(run, args, config, mesh)


if __name__ == "__main__":
    main()
