"""Launching the workers of one world, watching them, and starting fresh ones past a bad check.

    run_world(config, world, group_size)   every adapter's rows for one launch shape: t ranks
                                           (group_size == world) or a world cut into TP groups

The supervisor serves a TCPStore of its own (workers/worker.py's Fence writes each item's
records there), starts ``world`` worker processes with a fresh port, and polls (printing the
progress every PROGRESS seconds):
    - every worker FINISHED: done;
    - a worker left with RESTART (the ranks of a TP group came out of a check out of step) or
      GAVE_UP (a peer's record never came), or died: the rest are ended at once (a rank stuck in
      a collective cannot end itself), the check they were in becomes a row naming every
      rank's state, and fresh workers resume after it;
    - no record at all for ``stall`` seconds (every rank stuck outside a collective): the
      same, with the item each rank was in.
A deadlocking adapter thus costs about one check timeout plus one start of the workers. Each
adapter may cost ``restarts`` fresh starts (--restarts); past them its remaining checks are
given up (one row says so), so one misbehaving adapter cannot use up the launch and every
other adapter keeps its full results.

A start is cheap: the workers are forked from a server process that imported the worker's
module, torch with it, once (multiprocessing's "forkserver"; start_workers), instead of each
being a new Python that imports torch again: 4-5 s of CPU a worker on 2 cores, paid by every
rank of every fresh start. Each worker still gets its own environment, session and log.
"""
import importlib
import json
import multiprocessing
import os
import signal
import sys
import tempfile
import time
from dataclasses import dataclass
from datetime import timedelta
from pathlib import Path

import torch.distributed as dist

from tp_from_scratch.comm.launchers import free_port, subprocess_env
from tp_from_scratch.verify.report import _echo, busy, merge, rank_states
from tp_from_scratch.verify.suite import row
from tp_from_scratch.verify.worker import FINISHED, GAVE_UP, RESTART, out_of_step, parse_key

MAX_RESTARTS = 50     # fresh starts of one launch, whatever the adapters (a backstop)
RESTARTS = 5          # fresh starts one adapter may cost (--restarts)
PROGRESS = 10.0       # seconds between two progress lines


@dataclass
class Config:
    adapters: list
    dtypes: list
    seed: int = 0
    device: str = "cpu"
    check_timeout: float = 10.0
    stall: float = 120.0
    restarts: int = RESTARTS
    progress: object = None       # progress(line): where the progress lines go (None: stderr)


class CouldNotRun(RuntimeError):
    """The workers never got going (not a problem of an adapter): exit status 2."""


class Worker:
    """A forked worker, with the face of subprocess.Popen the supervisors use (pid, poll, wait)."""

    def __init__(self, process):
        self.process, self.pid = process, process.pid

    def poll(self):
        return self.process.exitcode   # None while it runs; -9 once SIGKILL ended it, as Popen's

    def wait(self):
        self.process.join()
        return self.process.exitcode


def _run_worker(module, argv, env, log):
    """In a forked worker: a session of its own (the supervisor ends its process group), the
    environment a launched rank gets, its log as stdout and stderr, then ``module``.main(argv)."""
    os.setsid()
    os.environ.clear()
    os.environ.update(env)
    fd = os.open(log, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
    for stream in (sys.stdout, sys.stderr):
        stream.flush()
    os.dup2(fd, 1)
    os.dup2(fd, 2)
    os.close(fd)
    sys.stdout.reconfigure(line_buffering=True)
    import torch
    torch.set_num_threads(int(env["OMP_NUM_THREADS"]))   # the fork server's torch read its own
    sys.exit(importlib.import_module(module).main(argv))


def start_workers(module, world, argv, logs, launch, **extra_env):
    """``world`` ranks of ``module``'s main(argv), forked from its fork server, each with the
    environment torchrun would give it (a fresh port) and its log in ``logs``."""
    port = free_port()
    # multiprocessing keeps one fork server per process, started with the first worker: the preload
    # is read then (a process runs verify or verify model, so one module; a later one is imported
    # by each worker itself)
    context = multiprocessing.get_context("forkserver")
    context.set_forkserver_preload([module])
    procs = []
    for rank in range(world):
        env = {k: v for k, v in subprocess_env(**extra_env).items() if not k.startswith("TORCHELASTIC_")}
        env.update(RANK=str(rank), WORLD_SIZE=str(world), LOCAL_RANK=str(rank),
                   LOCAL_WORLD_SIZE=str(world), MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
        log = str(logs / f"{launch.replace('/', '_')}_rank{rank}.log")
        process = context.Process(target=_run_worker, args=(module, list(map(str, argv)), env, log),
                                  name=f"{launch} rank {rank}", daemon=True)
        process.start()
        procs.append(Worker(process))
    return procs


def _spawn(config, world, group_size, store_port, launch, after, broken, logs):
    argv = [*config.adapters, "--store", f"127.0.0.1:{store_port}", "--launch", launch, "--after", after,
            "--broken", ",".join(map(str, sorted(broken))), "--group-size", group_size,
            "--dtypes", ",".join(config.dtypes), "--seed", config.seed,
            "--device", config.device, "--check-timeout", config.check_timeout]
    return start_workers("tp_from_scratch.verify.worker", world, argv, logs, launch)


def _end(procs):
    for p in procs:
        if p.poll() is None:
            os.killpg(p.pid, signal.SIGKILL)
    for p in procs:
        p.wait()


def _progress(store, launch):
    return store.add(f"{launch}/progress", 0)   # records published so far


def _watch(procs, store, launch, stall, tick=None):
    """Wait until every worker has exited, ending them all once one leaves abnormally or
    nothing moves for ``stall`` seconds; tick(records so far) now and then. Returns {rank:
    exit code or 'ended'}."""
    last, moved = -1, time.monotonic()
    while True:
        codes = [p.poll() for p in procs]
        if all(c is not None for c in codes):
            return dict(enumerate(codes))
        if any(c not in (None, FINISHED) for c in codes):
            time.sleep(0.5)          # a RESTART: the others leave by themselves at once
            codes = [p.poll() for p in procs]
            _end(procs)
            return {r: ("ended" if c is None else c) for r, c in enumerate(codes)}
        now = _progress(store, launch)
        if tick is not None:
            tick(now)
        if now != last:
            last, moved = now, time.monotonic()
        elif time.monotonic() - moved > stall:
            _end(procs)
            return {r: "ended" for r in range(len(procs))}
        time.sleep(0.1)


def _get(store, key):
    return store.get(key).decode() if store.check([key]) else None


def _records(store, launch, world):
    """{item: {rank: record}} of every item some rank finished in this launch."""
    out = {}
    for key in store.list_keys():
        if key.startswith(f"{launch}/done/"):
            item, rank = key[len(launch) + 6:].rsplit("/", 1)
            out.setdefault(item, {})[int(rank)] = json.loads(store.get(key))
    return out


def _tail(logs, launch, rank, lines=6):
    path = logs / f"{launch.replace('/', '_')}_rank{rank}.log"
    text = path.read_text(errors="replace").strip().splitlines() if path.exists() else []
    return " | ".join(text[-lines:])


def _state(code, at, log_tail, check_timeout=10.0):
    if code == "ended":
        return (f"did not finish: stuck in {at or 'start-up'} (ended by the supervisor; "
                f"{busy(check_timeout, '--check-timeout')})")
    if code == GAVE_UP:
        return f"finished {at}; gave up waiting for the other ranks"
    return f"process exited with code {code} in {at or 'start-up'}: {log_tail}"


def run_world(config, world, group_size, declared=None):
    """Every adapter's merged rows for one launch of ``world`` workers in TP groups of ``group_size``.
    declared: a dict to fill with {adapter name: {contract, patterns}} (its expected_failures, for XPASS)."""
    with tempfile.TemporaryDirectory(prefix="verify_") as logs:
        rows = _run_world(config, world, group_size, Path(logs), config.adapters,
                          {} if declared is None else declared)
    return [dict(r, world=world) for r in rows]   # t = group_size; world > t: a strict subgroup


class _Progress:
    """Prints 't = 3: 152 checks done; now <adapter> float64' every PROGRESS seconds."""

    def __init__(self, config, shape, world, names):
        self.config, self.shape, self.world, self.names = config, shape, world, names
        self.done_before, self.next = 0, time.monotonic() + PROGRESS
        self.say = config.progress or (lambda line: print(line, file=sys.stderr, flush=True))

    def tick(self, store, launch, published):
        if time.monotonic() < self.next:
            return
        self.next = time.monotonic() + PROGRESS
        at = _get(store, f"{launch}/at/0") or ""
        now = ""
        if at and at.split()[0].count(".") == 3:
            a, stage, d, _ = parse_key(at.split()[0])
            now = f"; now {self.names.get(a, self.config.adapters[a])}" + (
                f" {self.config.dtypes[d]}" if stage == 2 else f" ({('load', 'setup')[stage]})")
        self.say(f"verify: t = {self.shape}: {self.done_before + published // self.world} checks done{now}")


def _run_world(config, world, group_size, logs, specs, declared):
    store = dist.TCPStore("127.0.0.1", 0, is_master=True, wait_for_workers=False,
                          timeout=timedelta(seconds=30))
    t = group_size
    shape = f"{world}x{group_size}"
    launch_name = str(t) if world == t else f"{t}of{world}"
    names = {}                       # adapter index -> its name, once loaded
    progress = _Progress(config, launch_name, world, names)
    rows, after, broken, spent = [], "", set(), {}
    for attempt in range(MAX_RESTARTS):
        launch = f"{shape}/{attempt}"
        procs = _spawn(config, world, group_size, store.port, launch, after, broken, logs)
        codes = _watch(procs, store, launch, config.stall,
                       lambda published, launch=launch: progress.tick(store, launch, published))
        records = _records(store, launch, world)
        done = sorted(records, key=parse_key)
        complete = [i for i in done if len(records[i]) == world]
        progress.done_before += len(complete)
        for item in complete:
            first = records[item][0]
            if parse_key(item)[1] == 0 and "name" in first:
                names[parse_key(item)[0]] = first["name"]
                declared[first["name"]] = dict(contract=first["contract"], patterns=first["patterns"])
            per_rank = [records[item][r]["rows"] for r in range(world)]
            rows += merge(per_rank)
            if parse_key(item)[1] == 2 and out_of_step(list(records[item].values())):
                rows.append(_out_of_step_row(_what(store, launch, item, specs), records[item], t,
                                             config.check_timeout))
        if all(code == FINISHED for code in codes.values()):
            return rows
        ats = {r: _get(store, f"{launch}/at/{r}") for r in range(world)}   # "item [phase]"
        if not done and not any(ats.values()):
            tails = "; ".join(f"rank {r}: {_tail(logs, launch, r)}" for r in range(world))
            if attempt == 0:
                raise CouldNotRun(f"the {shape} workers never started a check: {tails}")
            rows.append(row("(verify)", "(all)", "(all)", "-", t, "ERROR",   # keep what ran
                            f"fresh {shape} workers never started after {after}: {tails}"))
            return rows
        stuck = [i for i in done if len(records[i]) < world]
        if stuck:
            item = stuck[0]
        elif any(code == RESTART for code in codes.values()) and complete:
            item = None
            after = complete[-1]   # out of step after it (slow leavers were ended, not stuck)
        else:
            item = min((a.split()[0] for a in ats.values() if a), key=parse_key)
        if item is not None:
            states = {}
            for r in range(world):
                if r in records.get(item, {}):
                    record = records[item][r]
                    states[r] = "finished: " + (record["message"] or "no exception")
                else:
                    states[r] = _state(codes[r], ats[r], _tail(logs, launch, r), config.check_timeout)
            rows.append(_stuck_row(_what(store, launch, item, specs), states, t))
            if parse_key(item)[1] < 2:
                broken.add(parse_key(item)[0])
            after = item
        culprit = parse_key(after)[0]
        spent[culprit] = spent.get(culprit, 0) + 1
        if spent[culprit] > config.restarts and culprit not in broken:
            broken.add(culprit)   # the fresh workers skip its remaining checks
            rows.append(row(names.get(culprit, specs[culprit]), "(all)", "(all)", "-", t, "ERROR",
                            f"gave up on this adapter after {spent[culprit]} fresh starts of the {launch_name} "
                            f"workers (--restarts {config.restarts}): its remaining checks did not run; "
                            "every other adapter keeps its rows", severity="error"))
    rows.append(row("(verify)", "(all)", "(all)", "-", t, "ERROR",
                    f"gave up after {MAX_RESTARTS} fresh starts of the {shape} workers", severity="error"))
    return rows


def _what(store, launch, item, names):
    """(adapter, component, check, dtype) of an item, as its workers announced it."""
    what = _get(store, f"{launch}/what/{item}")
    if what is None:
        a, stage = parse_key(item)[:2]
        return names[a], "(all)", ("load", "setup")[stage] if stage < 2 else "(all)", "-"
    what = json.loads(what)
    return what["adapter"], what["component"], what["check"], what["dtype"]


def _stuck_row(what, states, t):
    adapter, component, check, dtype = what
    return row(adapter, component, check, dtype, t, "ERROR",
               "the ranks did not finish this check together: " + rank_states(states),
               ranks={str(r): s for r, s in states.items()}, failed_ranks=sorted(states), severity="error")


def _out_of_step_row(what, records, t, check_timeout=10.0):
    adapter, component, check, dtype = what
    states = {r: (f"group {rec.get('group', 0)}: " if len({x.get("group", 0) for x in records.values()}) > 1
                  else "") + f"{rec['calls'][0]} forward / {rec['calls'][1]} backward collective(s)"
                 + (f", raised {rec['message']}" if rec["raised"] else "")
              for r, rec in sorted(records.items())}
    hint = (f"; a collective timed out: a rank skipped it, or {busy(check_timeout, '--check-timeout')}"
            if any(_echo(rec["message"]) for rec in records.values()) else "")
    return row(adapter, component, "ranks in step", dtype, t, "ERROR",
               f"after {check}: " + rank_states(states) + hint + "; fresh workers went on from the next check",
               ranks={str(r): s for r, s in states.items()}, failed_ranks=sorted(states), severity="error")
