"""Training-step time: tp_from_scratch's TP GPT against PyTorch's own TP (DTensor), same model.

    .venv/bin/torchrun --standalone --nproc-per-node 2 -m tp_from_scratch.bench train --hidden 128

Three versions start from the same single-device weights and train on the same batches:

    scratch        tp_from_scratch's TP GPT (gpt.parallelize): blocks, embedding and LM head sharded
                   (vocabulary-parallel embedding and cross-entropy)
    dtensor        PyTorch's parallelize_module on the blocks only (gpt.dtensor_plan.tp_plan):
                   embedding and LM head replicated, every rank computes all V logits
    dtensor-vocab  the same sharding as ours (gpt.dtensor_plan.vocab_plan): embedding
                   RowwiseParallel(input_layouts=Replicate()), Shard(0) head weight,
                   loss_parallel's cross-entropy on Shard(-1) logits: the fair race

Rounds alternate, scratch, dtensor, dtensor-vocab, so that whatever else the machine is
doing falls on all alike; each round times ``--steps-per-round`` full steps (forward,
backward, AdamW) after ``--warmup`` untimed ones. Prints the median step time of each and
both ratios scratch / dtensor (below 1.0: ours is faster). Here world size = tp (no data
parallelism). ``--losses FILE`` writes every step's loss of each version, in order (a test
compares them with single-device training).
"""
import argparse
import contextlib
import json
import statistics
from pathlib import Path

import torch
import torch.distributed as dist

from tp_from_scratch.bench.common import timed_steps
from tp_from_scratch.comm.launch import torch_main
from tp_from_scratch.gpt.data import global_batch
from tp_from_scratch.gpt.dtensor_plan import check_plannable
from tp_from_scratch.gpt.model import init_gpt
from tp_from_scratch.gpt.options import (add_model_flags, at_least, first_problem, greater_than_zero, model_config,
                                         parse_valid_args, positive)
from tp_from_scratch.gpt.parallelize import gpt_to_tp


def parse(argv):
    p = argparse.ArgumentParser(prog="python -m tp_from_scratch.bench train", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    add_model_flags(p, only=("hidden", "n_layers", "n_heads", "n_kv_heads", "seq_len", "vocab_size"),
                    defaults=dict(hidden=128, n_layers=2, n_heads=8, n_kv_heads=4, seq_len=64, vocab_size=512))
    p.add_argument("--batch-size", type=int, default=8)
    p.add_argument("--rounds", type=int, default=5)
    p.add_argument("--steps-per-round", type=int, default=10)
    p.add_argument("--warmup", type=int, default=3)
    p.add_argument("--collectives", choices=["native", "scratch"], default="native",
                   help="collectives under tp_from_scratch's layers")
    p.add_argument("--timeout", type=float, default=120.0)
    p.add_argument("--sequence-parallel", action="store_true",
                   help="Lesson 7 instead: ours with and without selective recomputation against "
                        "DTensor's SequenceParallel plan (bench/sequence_parallel.py)")
    p.add_argument("--losses", help="write {version: [loss of every step, in order]} here (rank 0)")
    return parse_valid_args(p, validate, argv)


def validate(args, world):
    """The first problem with the command line for ``world`` processes (= tp); None if fine."""
    problem = first_problem(positive("--rounds", args.rounds), positive("--steps-per-round", args.steps_per_round),
                            at_least("--warmup", args.warmup, 0), positive("--batch-size", args.batch_size),
                            greater_than_zero("--timeout", args.timeout))
    if problem is None and args.warmup > args.steps_per_round:
        problem = f"--warmup {args.warmup} is more than --steps-per-round {args.steps_per_round} (its batches)"
    try:
        return problem or check_plannable(model_config(args), world)   # DTensor runs the same model
    except ValueError as e:
        return str(e)


def main(argv=None):
    args = parse(argv)
    torch_main(lambda: run(args), timeout=args.timeout)


def run(args):
    from torch.distributed.device_mesh import init_device_mesh

    from tp_from_scratch.comm.torch_comm import TorchComm
    from tp_from_scratch.gpt.dtensor_plan import loss_context, parallelize_gpt, parallelize_gpt_vocab

    tp, rank = dist.get_world_size(), dist.get_rank()
    config = model_config(args)   # checked for this tp by validate
    world = dist.group.WORLD
    group = world if args.collectives == "native" else TorchComm(world, timeout=args.timeout)
    if args.sequence_parallel:
        from tp_from_scratch.bench.sequence_parallel import race
        race(args, config, group, init_device_mesh("cpu", (tp,)))
        return 0
    mesh = init_device_mesh("cpu", (tp,))
    models = {"scratch": gpt_to_tp(group, init_gpt(config, 0)),
              "dtensor": parallelize_gpt(init_gpt(config, 0), mesh),
              "dtensor-vocab": parallelize_gpt_vocab(init_gpt(config, 0), mesh)}
    contexts = {"scratch": contextlib.nullcontext, "dtensor": contextlib.nullcontext,
                "dtensor-vocab": lambda: loss_context(True)}
    opts = {k: torch.optim.AdamW(m.parameters(), lr=1e-3, foreach=False) for k, m in models.items()}
    batches = [global_batch(s, args.batch_size, config.seq_len, config.vocab_size, 0)
               for s in range(args.steps_per_round)]
    times = {k: [] for k in models}
    losses = {k: [] for k in models}
    for name in models:
        timed_steps(models[name], opts[name], batches[:args.warmup], contexts[name], losses[name])
    for _ in range(args.rounds):
        for name in models:  # alternate: scratch, dtensor, dtensor-vocab, scratch, ...
            times[name].append(timed_steps(models[name], opts[name], batches, contexts[name], losses[name]))
    if rank == 0:
        med = {k: statistics.median(v) for k, v in times.items()}
        print(f"GPT H={config.hidden} layers={config.n_layers} nh={config.n_heads} "
              f"nkv={config.n_kv_heads} T={config.seq_len} V={config.vocab_size} B={args.batch_size}, "
              f"tp={tp}, CPU/gloo, {args.rounds} rounds x {args.steps_per_round} steps")
        labels = {"scratch": f"scratch ({args.collectives} collectives)",
                  "dtensor": "dtensor, vocab replicated", "dtensor-vocab": "dtensor-vocab, vocab sharded"}
        for k, v in med.items():
            spread = f"{min(times[k]) * 1e3:.1f}..{max(times[k]) * 1e3:.1f}"
            print(f"  {labels[k]:<30} median {v * 1e3:8.2f} ms/step  (rounds {spread} ms)")
        print(f"  ratio scratch / dtensor (DTensor's embedding and LM head replicated): "
              f"{med['scratch'] / med['dtensor']:.2f}x")
        print(f"  ratio scratch / dtensor-vocab (the same vocabulary sharding, the fair race): "
              f"{med['scratch'] / med['dtensor-vocab']:.2f}x   (below 1.0: ours is faster)")
        if args.losses:
            Path(args.losses).write_text(json.dumps({"batches": len(batches), "warmup": args.warmup,
                                                     "rounds": args.rounds, "losses": losses}))
    return 0
