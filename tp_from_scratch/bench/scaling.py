"""Strong scaling on this machine: one process against two TP ranks, and the planner's prediction.

    .venv/bin/python -m tp_from_scratch.cost.plan --calibrate        # once: runs/profile.json
    .venv/bin/torchrun --standalone --nproc-per-node 2 -m tp_from_scratch.bench scaling \\
        --json lessons/measurements/scaling.json
    .venv/bin/mpiexec -n 2 .venv/bin/python -m tp_from_scratch.bench scaling  # tp=2 on our ring over MPI instead

For each model size, three ways to run the same training step (forward, backward, AdamW)
on the same global batch, in turn, round after round, so that whatever else the machine
does falls on all three alike:

    tp=1, 1 thread     rank 0 alone, one BLAS thread (rank 1 waits in a barrier, idle)
    tp=1, 2 threads    rank 0 alone, two BLAS threads: what a user compares TP against
    tp=2               both ranks, one thread each: native gloo all-reduces under torchrun, our
                       ring all-reduce over MPI point-to-point (shared memory) under mpiexec

With 4 processes the last run is tp=4 (four ranks sharing two cores: oversubscribed).

It prints the best step time of each (the step least disturbed by other programs; the
medians go to --json), the speedup of tp=2 over both tp=1 runs, the
strong-scaling efficiency (speedup / the cores the ranks can use), and predicted / measured from
tp_from_scratch.cost.model.predict_step on the --profile (when it exists).
"""
import argparse
import json
import os
import statistics
import time
from dataclasses import dataclass
from pathlib import Path

import torch
import torch.distributed as dist

from tp_from_scratch.cost.model import load_profile, predict_step
from tp_from_scratch.gpt.data import global_batch
from tp_from_scratch.gpt.inventory import parameter_count
from tp_from_scratch.gpt.model import GPTConfig, init_gpt
from tp_from_scratch.gpt.parallelize import gpt_to_tp

@dataclass(frozen=True)
class Launch:
    """The processes the bench runs on: this rank, how many, a barrier, and the TP group the model
    all-reduces over. torchrun: the default gloo group (native all-reduce, over TCP even between
    processes of one machine). mpiexec: an MPIComm, our ring all-reduce (Lesson 2) over MPI's
    point-to-point messages, which MPICH passes through shared memory on one machine.
    ``collectives``: the key of the planner profile's all-reduce that matches the group."""
    rank: int
    size: int
    group: object
    barrier: object
    collectives: str
    command: str


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
    p.add_argument("--profile", default="runs/profile.json", help="from cost.plan --calibrate; skipped if absent")
    p.add_argument("--json", help="write every row here (rank 0)")
    p.add_argument("--trace", metavar="DIR",
                   help="instead of the table: profile tp=1 (1 thread) and tp=world steps with torch.profiler, "
                        "write Chrome/Perfetto traces to DIR and print where each step's time goes")
    p.add_argument("--summary", help="with --trace: write the breakdown and one step's timeline here (JSON)")
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


def timed(model, optimizer, batches, threads, solo, barrier):
    """Seconds of each step on this rank; ``solo``: only rank 0 runs, the other waits."""
    times = []
    if model is not None:
        torch.set_num_threads(threads)
        for x, y in batches:
            if not solo:
                barrier()
            start = time.perf_counter()
            step(model, optimizer, x, y)
            times.append(time.perf_counter() - start)
        torch.set_num_threads(1)
    barrier()  # a solo run's idle rank waits here
    return times


def measure(config, args, launch):
    """{run name: [seconds per step]} for the three runs, alternating round by round."""
    def adamw(model):
        return torch.optim.AdamW(model.parameters(), lr=1e-4, foreach=False)

    rank = launch.rank
    single = init_gpt(config, 0) if rank == 0 else None
    models = {"tp1-1thread": (single, 1, True), "tp1-2threads": (single, 2, True),
              f"tp{launch.size}": (gpt_to_tp(launch.group, init_gpt(config, 0)), 1, False)}
    opts = {name: adamw(m) if m is not None else None for name, (m, _, _) in models.items()}
    batches = [global_batch(s, args.batch_size, config.seq_len, config.vocab_size, 0)
               for s in range(args.steps_per_round)]
    for name, (model, threads, solo) in models.items():
        timed(model if rank == 0 or not solo else None, opts[name], batches[:args.warmup], threads, solo,
              launch.barrier)
    times = {name: [] for name in models}
    for _ in range(args.rounds):
        for name, (model, threads, solo) in models.items():
            times[name] += timed(model if rank == 0 or not solo else None, opts[name], batches, threads, solo,
                                 launch.barrier)
    return times


def predictions(config, args, profile, world, collectives="native"):
    """The planner's step time for each run, or None without a profile (for the TP run: without
    a fit of the launch's all-reduce in it)."""
    if profile is None:
        return {name: None for name in run_names(world)}
    B = args.batch_size
    tp = (predict_step(config, profile, world, B, threads=1, collectives=collectives)["step_s"]
          if collectives in profile["all_reduce"] else None)
    return {"tp1-1thread": predict_step(config, profile, 1, B, threads=1)["step_s"],
            "tp1-2threads": predict_step(config, profile, 1, B, threads=2)["step_s"],
            f"tp{world}": tp}


def main(argv=None):
    args = parse(argv)
    from tp_from_scratch.comm.launch import launcher_from_env
    if launcher_from_env() == "mpi":
        if args.trace:
            raise SystemExit("--trace sorts gloo's profiler events: run it under torchrun")
        from tp_from_scratch.comm.mpi import MPIComm
        comm = MPIComm(timeout=600)
        try:
            if comm.world_size < 2:
                raise SystemExit("bench scaling runs on 2 (or more) processes: mpiexec -n 2 ...")
            return run(args, Launch(comm.rank, comm.world_size, comm, comm.barrier, "mpi",
                                    f".venv/bin/mpiexec -n {comm.world_size} .venv/bin/python"))
        finally:
            comm.close()
    from tp_from_scratch.comm.process_group import init_process_group
    init_process_group("cpu", timeout=600)
    try:
        if dist.get_world_size() < 2:
            raise SystemExit("bench scaling runs on 2 (or more) processes: torchrun --standalone --nproc-per-node 2 ...")
        world = dist.get_world_size()
        launch = Launch(dist.get_rank(), world, dist.group.WORLD, dist.barrier, "native",
                        f".venv/bin/torchrun --standalone --nproc-per-node {world}")
        return trace(args) if args.trace else run(args, launch)
    finally:
        dist.destroy_process_group()


def run(args, launch):
    rank, world = launch.rank, launch.size
    runs, tp = run_names(world), f"tp{world}"
    usable = min(world, os.cpu_count())  # cores the TP ranks can use: the ideal speedup
    torch.set_num_threads(1)
    profile = load_profile(args.profile) if Path(args.profile).exists() else None
    rows = []
    say = print if rank == 0 else (lambda *a, **k: None)
    say(f"load average {os.getloadavg()[0]:.1f} on {os.cpu_count()} cores at the start (other "
        f"programs' work slows every run; the runs alternate so that it falls on all alike)")
    say(f"GPT layers={args.layers} T={args.seq_len} V={args.vocab_size} B={args.batch_size}, "
        f"{args.rounds} rounds x {args.steps_per_round} steps, best ms per step (medians in --json); "
        f"profile: {profile['name'] if profile else 'none (run cost.plan --calibrate)'}; tp{world}'s all-reduce: "
        f"{'our ring over MPI (mpiexec)' if launch.collectives == 'mpi' else 'native gloo (torchrun)'}")
    say(f"{'H':>5} {'params':>10} {'tp1 1thr':>9} {'tp1 2thr':>9} {tp:>9} {'vs 1thr':>8} {'eff.':>6} "
        f"{'vs 2thr':>8}   predicted/measured: {'tp1 1thr':>8} {'tp1 2thr':>8} {tp:>6}")
    for hidden in [int(h) for h in args.sizes.split(",")]:
        config = config_for(hidden, args)
        times = measure(config, args, launch)
        if rank != 0:
            continue
        med = {name: statistics.median(times[name]) for name in runs}
        best = {name: min(times[name]) for name in runs}
        pred = predictions(config, args, profile, world, launch.collectives)
        ratio = {name: pred[name] / best[name] if pred[name] else None for name in runs}
        speedup = best["tp1-1thread"] / best[tp]
        row = {"hidden": hidden, "config": config.to_dict(), "batch_size": args.batch_size,
               "parameters": parameter_count(config), "median_s": med, "min_s": best,
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
        report = {"command": f"{launch.command} -m tp_from_scratch.bench scaling "
                             + " ".join(f"--{k.replace('_', '-')} {v}" for k, v in vars(args).items()
                                        if k not in ("json",) and v is not None),
                  "all_reduce": launch.collectives, "profile": profile, "rows": rows}
        Path(args.json).parent.mkdir(parents=True, exist_ok=True)
        Path(args.json).write_text(json.dumps(report, indent=1))
        say(f"# wrote {args.json}")
    return 0


# ---------------------------------------------------------------------------------------
# --trace: where one step's time goes (torch.profiler)
# ---------------------------------------------------------------------------------------

# what each kind of time is, by the profiler's event names, in the order a moment is claimed:
# a moment inside a gloo collective counts as communication even though an op encloses it
KINDS = ("communication", "matmul", "copy", "other ops")
MATMULS = ("aten::mm", "aten::addmm", "aten::bmm")
COPIES = ("aten::copy_", "aten::clone", "aten::contiguous", "aten::cat", "aten::repeat_interleave",
          "aten::zeros_like", "aten::new_zeros")


def kind_of(name):
    """The kind (KINDS) of a profiler event, or None for events that are not work (ranges, views)."""
    if name.startswith(("gloo:", "c10d::")):  # the transfer (gloo's threads) and the call that starts it
        return "communication"
    if name in MATMULS:
        return "matmul"
    if name in COPIES:
        return "copy"
    return "other ops" if name.startswith("aten::") else None


def paint(intervals, start, stop):
    """[(t0, t1, kind)] covering [start, stop): each moment the first KIND of the intervals that
    cover it, "python" where none does (the interpreter, autograd's bookkeeping, the optimizer's loop)."""
    edges = []
    for t0, t1, kind in intervals:
        t0, t1 = max(t0, start), min(t1, stop)
        if t1 > t0:
            edges += [(t0, 1, kind), (t1, -1, kind)]
    edges.sort(key=lambda e: (e[0], e[1]))
    depth = dict.fromkeys(KINDS, 0)
    segments, now = [], start
    for t, change, kind in edges + [(stop, 0, None)]:
        if t > now:
            current = next((k for k in KINDS if depth[k] > 0), "python")
            if segments and segments[-1][2] == current and segments[-1][1] == now:
                segments[-1] = (segments[-1][0], t, current)
            else:
                segments.append((now, t, current))
            now = t
        if kind:
            depth[kind] += change
    return segments


def step_windows(events):
    """(start, end) in microseconds of every range named "step", in order, and its thread."""
    steps = sorted((e.time_range.start, e.time_range.end, e.thread) for e in events if e.name == "step")
    return [(a, b) for a, b, _ in steps], (steps[0][2] if steps else None)


def breakdown(events):
    """Per profiled step: seconds of each kind, the step's wall time, the collectives' durations
    (in call order, for matching with the other ranks) and the painted timeline (ms from the step's start).

    Communication is the gloo worker threads' collectives (the main thread waits for them: our
    collectives block); the other kinds are the main thread's ops."""
    windows, main = step_windows(events)
    out = []
    for start, stop in windows:
        inside = [(e.time_range.start, e.time_range.end, kind_of(e.name)) for e in events
                  if e.time_range.start < stop and e.time_range.end > start and kind_of(e.name)
                  and (e.thread == main or e.name.startswith("gloo:"))]
        segments = paint(inside, start, stop)
        seconds = dict.fromkeys(KINDS + ("python",), 0.0)
        for t0, t1, kind in segments:
            seconds[kind] += (t1 - t0) * 1e-6
        collectives = [(e.time_range.end - e.time_range.start) * 1e-6 for e in sorted(
            (e for e in events if e.name.startswith("gloo:") and start <= e.time_range.start < stop),
            key=lambda e: e.time_range.start)]
        out.append({"step_s": (stop - start) * 1e-6, "seconds": seconds, "collectives_s": collectives,
                    "timeline_ms": coarse([((a - start) / 1e3, (b - start) / 1e3, k) for a, b, k in segments])})
    return out


def coarse(segments, shortest_ms=0.05):
    """The timeline for a picture: a segment shorter than ``shortest_ms`` joins the one before it
    (the seconds of each kind are counted before this, exactly)."""
    out = []
    for a, b, k in segments:
        if out and (b - a < shortest_ms or out[-1][2] == k):
            out[-1][1] = round(b, 2)
        else:
            out.append([round(a, 2), round(b, 2), k])
    return out


def profiled_steps(model, optimizer, batches, solo, rank):
    """torch.profiler over ``batches`` (each step a "step" range). Returns (profiler, events) or
    (None, []) on a rank that sits a solo run out."""
    from torch.profiler import ProfilerActivity, profile, record_function
    if model is None:
        dist.barrier()
        return None, []
    with profile(activities=[ProfilerActivity.CPU]) as prof:
        for x, y in batches:
            if not solo:
                dist.barrier()
            with record_function("step"):
                step(model, optimizer, x, y)
    if solo:
        dist.barrier()
    return prof, prof.events()


def trace(args):
    """Profile tp=1 (rank 0, one thread) and tp=world steps, alternating ``--rounds`` times; keep
    each setup's fastest step; write the traces of the last round and print the breakdown."""
    rank, world = dist.get_rank(), dist.get_world_size()
    tp = f"tp{world}"
    torch.set_num_threads(1)
    out_dir = Path(args.trace)
    out_dir.mkdir(parents=True, exist_ok=True)
    say = print if rank == 0 else (lambda *a, **k: None)
    profile = load_profile(args.profile) if Path(args.profile).exists() else None
    say(f"load average {os.getloadavg()[0]:.1f} on {os.cpu_count()} cores; GPT layers={args.layers} "
        f"T={args.seq_len} V={args.vocab_size} B={args.batch_size}; fastest of {args.rounds} rounds x "
        f"{args.steps_per_round} profiled steps; ms per step on rank 0")
    sizes, report = [int(h) for h in args.sizes.split(",")], []
    for hidden in sizes:
        config = config_for(hidden, args)
        single = init_gpt(config, 0) if rank == 0 else None
        models = {"tp1": (single, True), tp: (gpt_to_tp(dist.group.WORLD, init_gpt(config, 0)), False)}
        opts = {k: torch.optim.AdamW(m.parameters(), lr=1e-4, foreach=False) if m is not None else None
                for k, (m, _) in models.items()}
        batches = [global_batch(s, args.batch_size, config.seq_len, config.vocab_size, 0)
                   for s in range(args.steps_per_round)]
        for name, (model, solo) in models.items():
            timed(model, opts[name], batches[:args.warmup], 1, solo, dist.barrier)
        best = {}
        for r in range(args.rounds):
            for name, (model, solo) in models.items():
                prof, events = profiled_steps(model, opts[name], batches, solo, rank)
                steps = breakdown(events)
                if solo or name == "tp1":
                    mine = steps
                else:  # the collectives' durations on every rank, to split transfer from waiting
                    everyone = [None] * world
                    dist.all_gather_object(everyone, [s["collectives_s"] for s in steps])
                    mine = [dict(s, collectives_all_ranks_s=[e[i] for e in everyone]) for i, s in enumerate(steps)]
                for s in mine:
                    if name not in best or s["step_s"] < best[name]["step_s"]:
                        best[name] = s
                if prof is not None and r == args.rounds - 1:
                    prof.export_chrome_trace(str(out_dir / f"step_H{hidden}_{name}_rank{rank}.json"))
        if tp in best:
            split_waiting(best[tp])
        everyone = [None] * world
        dist.all_gather_object(everyone, best)
        if rank == 0:
            row = {"hidden": hidden, "config": config.to_dict(), "batch_size": args.batch_size,
                   "ranks": everyone, "load_average": os.getloadavg()}
            if profile:
                row["predicted"] = {"tp1": predict_step(config, profile, 1, args.batch_size, threads=1),
                                    tp: predict_step(config, profile, world, args.batch_size, threads=1)}
            report.append(row)
            print_breakdown(row, tp)
    if rank == 0:
        say(f"# Chrome/Perfetto traces: {out_dir}/step_H<H>_<setup>_rank<r>.json "
            f"(open in https://ui.perfetto.dev or chrome://tracing)")
        if args.summary:
            summary = {"command": ".venv/bin/torchrun --standalone --nproc-per-node "
                                  f"{world} -m tp_from_scratch.bench scaling --trace {args.trace} --sizes {args.sizes} "
                                  f"--rounds {args.rounds} --steps-per-round {args.steps_per_round}",
                       "kinds": list(KINDS) + ["python"], "rows": report}
            Path(args.summary).parent.mkdir(parents=True, exist_ok=True)
            Path(args.summary).write_text(json.dumps(summary))
            say(f"# wrote {args.summary}")
    return 0


def split_waiting(step):
    """Split the step's communication into transfer and waiting for a later rank.

    A blocking all-reduce on two ranks lasts, on the rank that arrives first, the time it waits
    for the other plus the transfer; on the last to arrive, the transfer alone. So per call the
    shortest duration over the ranks is the transfer and the rest of this rank's is waiting."""
    per_rank = step.pop("collectives_all_ranks_s", None)
    if not per_rank or len({len(c) for c in per_rank}) != 1:
        return
    transfer = sum(min(call) for call in zip(*per_rank))
    mine = sum(step["collectives_s"])
    step["seconds"]["communication: transfer"] = transfer
    step["seconds"]["communication: waiting for the other rank"] = max(mine - transfer, 0.0)
    # the rest: the c10d call on the main thread before gloo's thread takes over
    step["seconds"]["communication: starting the call"] = max(step["seconds"]["communication"] - mine, 0.0)


def print_breakdown(row, tp):
    """One line per setup: step ms and each kind's ms and share, rank 0; plus the prediction."""
    best = row["ranks"][0]
    print(f"H={row['hidden']}:")
    for name, s in best.items():
        parts = "  ".join(f"{k} {v * 1e3:.1f} ({v / s['step_s']:.0%})" for k, v in s["seconds"].items() if v)
        print(f"  {name:<4} step {s['step_s'] * 1e3:8.1f}   {parts}")
    if "predicted" in row:
        p = row["predicted"]
        print("  predicted: " + "   ".join(f"{k} matmul {v['compute_s'] * 1e3:.1f} + element-wise "
                                          f"{v['elementwise_s'] * 1e3:.1f} + comm {v['communication_s'] * 1e3:.1f}"
                                          f" + overhead {v['overhead_s'] * 1e3:.1f}" for k, v in p.items()))
