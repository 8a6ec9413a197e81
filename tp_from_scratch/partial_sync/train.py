"""Train the CAAT GPT (partially synchronized activations) with tensor parallelism.

    # tp=2, half the channels synced, each step's loss next to the single-device t-stream model
    .venv/bin/torchrun --standalone --nproc-per-node 2 -m tp_from_scratch.partial_sync.train --tp 2 --sync-fraction 0.5 --compare-single
    # the from-scratch ring collectives, whose meter counts every byte sent
    .venv/bin/torchrun --standalone --nproc-per-node 4 -m tp_from_scratch.partial_sync.train --tp 4 --sync-fraction 0.25 --collectives scratch
    # no launcher: t simulated ranks in one process (threads), the meter counts every byte
    .venv/bin/python -m tp_from_scratch.partial_sync.train --tp 2 --sync-fraction 0.5

This is Lesson 6's trainer (tp_from_scratch.gpt.train: its step, loop, data, checkpoints,
metrics and report, so every one of its options works the same) with its hooks
(gpt.hooks.Hooks): the model is caat_from_gpt's; between backward and the DP average the gradients
of the parameters the streams share are summed over the TP group (all_reduce_replicated_grads);
the single-device reference is the t-stream model; checkpoints and metrics record p (and
each step's TP bytes). --clip-grad-norm clips after that sum, by the GPT's placement: the
shared parameters' summed gradients are then the same on every rank and count once, the
shards once each (tests/test_numerics_clip.py proves the norm against the t-stream model's
clip_grad_norm_). Plus --sync-fraction p (default 1.0: ordinary TP). Without a launcher
(simulated ranks) --save, --load, --compare-single, --plot, --equal-steps and --eval-every
are refused: they need torchrun.

A CAAT checkpoint belongs to its t and p: the ranks' streams are different models'
activations, and no resharding maps t streams onto t' streams. Every loader checks the
model description a checkpoint carries (gpt/checkpoint.py): this trainer loads only its own
t and p (p = 1 is the ordinary GPT, which reshards), and no other loader takes p < 1.
"""
import json
import os
import sys
import time
from dataclasses import dataclass
from functools import partial
from pathlib import Path

import torch

from tp_from_scratch.comm.launch import torch_main
from tp_from_scratch.gpt import checkpoint as ckpt
from tp_from_scratch.gpt import train as gpt_train
from tp_from_scratch.gpt.hooks import Hooks, ModelKind
from tp_from_scratch.gpt.model import init_gpt
from tp_from_scratch.gpt.options import train_flag_problem
from tp_from_scratch.gpt.step import make_optimizer, single_device_run, steps_on_comm, train_step
from tp_from_scratch.partial_sync.autograd import all_reduce_replicated_grads
from tp_from_scratch.partial_sync.mappings import synced_channels
from tp_from_scratch.partial_sync.model import CAAT_EVEN, caat_from_gpt, t_stream_forward


@dataclass(frozen=True)
class CaatTrainConfig(gpt_train.TrainConfig):
    """Lesson 6's settings plus the fraction p of the hidden channels synced."""
    sync_fraction: float = 1.0


def build_parser():
    parser = gpt_train.build_parser()
    parser.prog = "python -m tp_from_scratch.partial_sync.train"
    parser.description = __doc__
    parser.add_argument("--sync-fraction", type=float, default=CaatTrainConfig.sync_fraction, metavar="P",
                        help="fraction p of the hidden channels all-reduced at each row-parallel "
                             "output (the leading floor(p*H)); 1.0 is ordinary TP")
    return parser


def validate(opts, world_size):
    """The first problem with the settings, as a sentence; None if fine."""
    if not 0.0 <= opts.sync_fraction <= 1.0:
        return f"--sync-fraction must be in [0, 1], got {opts.sync_fraction}"
    if opts.impl != "scratch":
        return "--impl dtensor has no partial reduce: use --impl scratch"
    problem = train_flag_problem(opts)
    if problem:
        return problem
    problem = gpt_train.validate(opts, world_size, description(opts.model, opts.tp, opts.sync_fraction))
    if problem is None:
        try:
            opts.model.check_even(opts.tp, CAAT_EVEN)
        except ValueError as e:
            problem = str(e)
    return problem


def validate_simulated(opts, world_size):
    """Without torchrun the ranks are simulated threads: what needs real processes is refused."""
    needs = [flag for flag, given in (("--save", opts.save), ("--load", opts.load),
                                      ("--compare-single", opts.compare_single), ("--plot", opts.plot),
                                      ("--equal-steps", opts.equal_steps), ("--eval-every", opts.eval_every))
             if given]
    if needs:
        return f"{', '.join(needs)}: only under torchrun (simulated ranks only train and meter the bytes)"
    return validate(opts, opts.tp)


def description(config, tp, sync_fraction):
    """The model a checkpoint of this run holds: at p < 1 a function of t that only this trainer
    loads (gpt/checkpoint.py); at p = 1 the ordinary GPT."""
    command = "python -m tp_from_scratch.partial_sync.train" if sync_fraction < 1.0 else None
    return ckpt.model_description(config, tp, sync_fraction, command=command)


def t_stream_loss(tp, sync_fraction):
    """The single-device reference's loss: the t-stream model on the whole batch."""
    return lambda gpt, x, y: t_stream_forward(gpt, x, y, tp, sync_fraction)[1]


def t_stream_run(config, opts, tp, start=None):
    """The single-device reference: the t-stream model trained on every step's global batch."""
    return single_device_run(config, opts, start, loss_fn=t_stream_loss(tp, opts.sync_fraction))


def parse(argv=()):
    return CaatTrainConfig.from_args(build_parser().parse_args([str(a) for a in argv]))


def t_stream_losses(argv):
    """[loss per step] of the single-device t-stream model for the command line ``argv``."""
    opts = parse(argv)
    return [loss.item() for _, loss in t_stream_run(opts.model, opts, opts.tp)]


def activation_bytes_per_step(config, batch, tp, sync_fraction, itemsize):
    """Payload bytes of the partial reduces in one step: 2 per block forward, 2 backward, (B, T, k)."""
    if tp == 1:
        return 0
    k = synced_channels(config.hidden, sync_fraction)
    return 4 * config.n_layers * batch * config.seq_len * k * itemsize


def sum_shared_gradients(model):
    """Lesson 8's addition to the step: the replicated parameters' gradients summed over TP."""
    all_reduce_replicated_grads(model.group, model)


def train_on_comm(comm, argv=()):
    """One TP rank's run on a tp_from_scratch Comm (run_spmd's simulated ranks), dp = 1.

    Returns {"losses": [...], "bytes_sent": [per step], "time_s": [per step]} for this rank.
    """
    opts = parse(argv)
    config = opts.model
    model = caat_from_gpt(comm, init_gpt(config, opts.seed, opts.torch_dtype), opts.sync_fraction)
    optimizer = make_optimizer(model.parameters(), opts)
    out = {"losses": [], "bytes_sent": [], "time_s": []}
    before, t0 = comm.meter.bytes_sent, time.perf_counter()
    shape = (config.seq_len, config.vocab_size)
    clip = gpt_train.clipper_on_comm(opts, comm, ModelKind())
    for _, loss in steps_on_comm(opts, model, optimizer, shape, after_backward=sum_shared_gradients, clip=clip):
        out["losses"].append(loss.item())
        out["time_s"].append(time.perf_counter() - t0)
        out["bytes_sent"].append(comm.meter.bytes_sent - before)
        before, t0 = comm.meter.bytes_sent, time.perf_counter()   # the next step runs at the loop's next
    return out


def tp_bytes(opts, group, counter):
    """TP bytes so far: the TorchComm's meter (scratch) or the payloads handed to torch (native)."""
    if opts.collectives == "scratch":
        return group.meter.bytes_sent
    return sum(b for (_, label), b in counter.bytes.items() if label == "tp")


def hooks(opts, mesh):
    """What Lesson 8 changes in Lesson 6's run (gpt.hooks.Hooks): its model (caat_from_gpt's, whose
    checkpoints belong to t and p), the shared gradients summed after backward, the t-stream
    reference, each step's TP bytes, and a summary of what p saved."""
    p, config = opts.sync_fraction, opts.model

    def step_metrics(group, counter):
        before = tp_bytes(opts, group, counter)
        return lambda: {"sync_fraction": p, "tp_bytes": tp_bytes(opts, group, counter) - before}

    def summary(mesh, group, counter, n_steps):
        if mesh.rank != 0:
            return
        n = max(n_steps, 1)
        itemsize = torch.finfo(opts.torch_dtype).bits // 8
        batch = opts.batch_size // mesh.dp
        print(f"sync fraction p = {p}: {synced_channels(config.hidden, p)} of {config.hidden} channels synced")
        print(f"TP bytes per step on rank 0: {tp_bytes(opts, group, counter) / n:,.0f} "
              f"({'ring messages sent' if opts.collectives == 'scratch' else 'payloads handed to torch.distributed'});"
              f" the partial reduces' payload {activation_bytes_per_step(config, batch, mesh.tp, p, itemsize):,} "
              f"(at p = 1: {activation_bytes_per_step(config, batch, mesh.tp, 1.0, itemsize):,})")

    return Hooks(model=ModelKind(description=description(config, mesh.tp, p), meta={"sync_fraction": p}),
                 parallelize=lambda full, group: caat_from_gpt(group, full, p),
                 step=partial(train_step, after_backward=sum_shared_gradients),
                 reference=("t-stream single-device", t_stream_loss(mesh.tp, p)),
                 metrics=step_metrics, finish=summary)


def run(opts, mesh):
    """Lesson 6's run with Lesson 8's hooks, on torchrun; returns the exit status."""
    return gpt_train.run(opts, mesh, hooks(opts, mesh))


def simulated_main(opts, argv):
    """No launcher: t simulated ranks in this process; print the losses and the metered bytes."""
    from tp_from_scratch.comm import run_spmd
    results = run_spmd(train_on_comm, opts.tp, list(argv))
    r0 = results[0]
    for step, (loss, sent) in enumerate(zip(r0["losses"], r0["bytes_sent"])):
        print(f"step {step:4d}  loss {loss:.6f}  TP bytes sent by rank 0 {sent:,}")
    n = max(len(r0["losses"]), 1)
    print(f"sync fraction p = {opts.sync_fraction}: TP bytes per step on rank 0 {sum(r0['bytes_sent']) / n:,.0f}")
    if opts.metrics:
        Path(opts.metrics).parent.mkdir(parents=True, exist_ok=True)
        with open(opts.metrics, "w") as f:
            for step, (loss, sent, dt) in enumerate(zip(r0["losses"], r0["bytes_sent"], r0["time_s"])):
                f.write(json.dumps({"step": step, "loss": loss, "time_s": dt, "sync_fraction": opts.sync_fraction,
                                    "tp_bytes": sent}) + "\n")
    return 0


def main(argv=None):
    argv = sys.argv[1:] if argv is None else list(argv)
    launched = "WORLD_SIZE" in os.environ
    # without a launcher the ranks are simulated: the world is --tp's
    opts = gpt_train.parse_config(build_parser(), validate if launched else validate_simulated, argv,
                                  CaatTrainConfig)
    if not launched:
        sys.exit(simulated_main(opts, argv))
    from tp_from_scratch.gpt.mesh import setup_mesh
    torch_main(lambda: run(opts, setup_mesh(opts.tp, opts.device, opts.timeout)), opts.device, opts.timeout,
               errors=(ckpt.CheckpointError,))


if __name__ == "__main__":
    main()
