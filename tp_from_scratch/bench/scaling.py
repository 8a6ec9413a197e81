"""Strong scaling on this machine: one process against two TP ranks, and the planner's prediction.

    python -m tp_from_scratch.gpt.plan --calibrate        # once: runs/profile.json
    torchrun --standalone --nproc-per-node 2 -m tp_from_scratch.bench scaling \\
        --json lessons/measurements/scaling.json

For each model size, three ways to run the same training step (forward, backward, AdamW)
on the same global batch, in turn, round after round, so that whatever else the machine
does falls on all three alike:

    tp=1, 1 thread     rank 0 alone, one BLAS thread (rank 1 waits in a barrier, idle)
    tp=1, 2 threads    rank 0 alone, two BLAS threads: what a user compares TP against
    tp=2               both ranks, one thread each, native gloo all-reduces

Under ``--nproc-per-node 4`` the last run is tp=4 (four ranks sharing two cores: oversubscribed).

It prints the best step time of each (the step least disturbed by other programs; the
medians go to --json), the speedup of tp=2 over both tp=1 runs, the
strong-scaling efficiency (speedup / the cores the ranks can use), and predicted / measured from
tp_from_scratch.gpt.plan.predict_step on the --profile (when it exists).
"""
import argparse
import json
import os
import statistics
import time
from pathlib import Path

import torch
import torch.distributed as dist

from tp_from_scratch.gpt import plan
from tp_from_scratch.gpt.data import global_batch
from tp_from_scratch.gpt.model import GPTConfig, gpt_to_tp, init_gpt

def run_names(world):
    """The three runs compared, for ``world`` processes: tp1-1thread, tp1-2threads, tp<world>."""
    return ("tp1-1thread", "tp1-2threads", f"tp{world}")


def parse(argv):
    p = argparse.ArgumentParser(prog="python -m tp_from_scratch.bench scaling", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--sizes", default="128,256,384,512,768,1024", help="hidden sizes H, comma-separated")
    p.add_argument("--layers", type=int, default=2)
    p.add_argument("--seq-len", type=int, default=128)
    p.add_argument("--vocab-size", type=int, default=512)
    p.add_argument("--batch-size", type=int, default=8)
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--steps-per-round", type=int, default=3)
    p.add_argument("--warmup", type=int, default=1)
    p.add_argument("--profile", default="runs/profile.json", help="from plan --calibrate; skipped if absent")
    p.add_argument("--json", help="write every row here (rank 0)")
    return p.parse_args(argv)


def config_for(hidden, args):
    """A GPT of hidden size H with heads of about 64 (a multiple of 4 of them) and 4 KV heads,
    so that every size splits over t = 2 and t = 4."""
    heads = max(4, hidden // 64 // 4 * 4)
    return GPTConfig(vocab_size=args.vocab_size, seq_len=args.seq_len, n_layers=args.layers,
                     hidden=hidden, n_heads=heads, n_kv_heads=4)


def step(model, optimizer, x, y):
    optimizer.zero_grad(set_to_none=True)
    _, loss = model(x, y)
    loss.backward()
    optimizer.step()


def timed(model, optimizer, batches, threads, solo):
    """Seconds of each step on this rank; ``solo``: only rank 0 runs, the other waits."""
    times = []
    if model is not None:
        torch.set_num_threads(threads)
        for x, y in batches:
            if not solo:
                dist.barrier()
            start = time.perf_counter()
            step(model, optimizer, x, y)
            times.append(time.perf_counter() - start)
        torch.set_num_threads(1)
    dist.barrier()  # a solo run's idle rank waits here
    return times


def measure(config, args, rank):
    """{run name: [seconds per step]} for the three runs, alternating round by round."""
    def adamw(model):
        return torch.optim.AdamW(model.parameters(), lr=1e-4, foreach=False)

    single = init_gpt(config, 0) if rank == 0 else None
    models = {"tp1-1thread": (single, 1, True), "tp1-2threads": (single, 2, True),
              f"tp{dist.get_world_size()}": (gpt_to_tp(dist.group.WORLD, init_gpt(config, 0)), 1, False)}
    opts = {name: adamw(m) if m is not None else None for name, (m, _, _) in models.items()}
    batches = [global_batch(s, args.batch_size, config.seq_len, config.vocab_size, 0)
               for s in range(args.steps_per_round)]
    for name, (model, threads, solo) in models.items():
        timed(model if rank == 0 or not solo else None, opts[name], batches[:args.warmup], threads, solo)
    times = {name: [] for name in models}
    for _ in range(args.rounds):
        for name, (model, threads, solo) in models.items():
            times[name] += timed(model if rank == 0 or not solo else None, opts[name], batches, threads, solo)
    return times


def predictions(config, args, profile, world):
    """The planner's step time for each run, or None without a profile."""
    if profile is None:
        return {name: None for name in run_names(world)}
    B = args.batch_size
    return {"tp1-1thread": plan.predict_step(config, profile, 1, B, threads=1)["step_s"],
            "tp1-2threads": plan.predict_step(config, profile, 1, B, threads=2)["step_s"],
            f"tp{world}": plan.predict_step(config, profile, world, B, threads=1)["step_s"]}


def main(argv=None):
    args = parse(argv)
    from tp_from_scratch.comm.process_group import init_process_group
    init_process_group("cpu", timeout=600)
    try:
        if dist.get_world_size() < 2:
            raise SystemExit("bench scaling runs on 2 (or more) processes: torchrun --standalone --nproc-per-node 2 ...")
        return run(args)
    finally:
        dist.destroy_process_group()


def run(args):
    rank, world = dist.get_rank(), dist.get_world_size()
    runs, tp = run_names(world), f"tp{world}"
    usable = min(world, os.cpu_count())  # cores the TP ranks can use: the ideal speedup
    torch.set_num_threads(1)
    profile = plan.load_profile(args.profile) if Path(args.profile).exists() else None
    rows = []
    say = print if rank == 0 else (lambda *a, **k: None)
    say(f"load average {os.getloadavg()[0]:.1f} on {os.cpu_count()} cores at the start (other "
        f"programs' work slows every run; the runs alternate so that it falls on all alike)")
    say(f"GPT layers={args.layers} T={args.seq_len} V={args.vocab_size} B={args.batch_size}, "
        f"{args.rounds} rounds x {args.steps_per_round} steps, best ms per step (medians in --json); "
        f"profile: {profile['name'] if profile else 'none (run plan --calibrate)'}")
    say(f"{'H':>5} {'params':>10} {'tp1 1thr':>9} {'tp1 2thr':>9} {tp:>9} {'vs 1thr':>8} {'eff.':>6} "
        f"{'vs 2thr':>8}   predicted/measured: {'tp1 1thr':>8} {'tp1 2thr':>8} {tp:>6}")
    for hidden in [int(h) for h in args.sizes.split(",")]:
        config = config_for(hidden, args)
        times = measure(config, args, rank)
        if rank != 0:
            continue
        med = {name: statistics.median(times[name]) for name in runs}
        best = {name: min(times[name]) for name in runs}
        pred = predictions(config, args, profile, world)
        ratio = {name: pred[name] / best[name] if pred[name] else None for name in runs}
        speedup = best["tp1-1thread"] / best[tp]
        row = {"hidden": hidden, "config": config.to_dict(), "batch_size": args.batch_size,
               "parameters": plan.parameter_count(config), "median_s": med, "min_s": best,
               "times_s": times, "predicted_s": pred, "predicted_over_measured": ratio,
               "predicted_over_median": {k: pred[k] / med[k] if pred[k] else None for k in runs},
               "load_average": os.getloadavg(),
               "speedup_vs_1thread": speedup, "efficiency": speedup / usable,
               "speedup_vs_2threads": best["tp1-2threads"] / best[tp],
               "median_speedup_vs_1thread": med["tp1-1thread"] / med[tp],
               "median_speedup_vs_2threads": med["tp1-2threads"] / med[tp]}
        rows.append(row)
        ratios = " ".join(f"{r:>8.2f}" if r else f"{'-':>8}" for r in ratio.values())
        say(f"{hidden:>5} {row['parameters']:>10,} {best['tp1-1thread'] * 1e3:>9.1f} "
            f"{best['tp1-2threads'] * 1e3:>9.1f} {best[tp] * 1e3:>9.1f} {speedup:>7.2f}x "
            f"{speedup / usable:>6.0%} {row['speedup_vs_2threads']:>7.2f}x   {'':>19}{ratios}", flush=True)
    if rank == 0 and args.json:
        report = {"command": f"torchrun --standalone --nproc-per-node {world} -m tp_from_scratch.bench scaling "
                             + " ".join(f"--{k.replace('_', '-')} {v}" for k, v in vars(args).items()
                                        if k not in ("json",) and v is not None),
                  "profile": profile, "rows": rows}
        Path(args.json).parent.mkdir(parents=True, exist_ok=True)
        Path(args.json).write_text(json.dumps(report, indent=1))
        say(f"# wrote {args.json}")
    return 0
