"""One rank of a ``verify`` launch: every check in turn, each one fenced off from the next.

The supervisor (verify/__main__.py) starts t processes of this module (more when the TP
group is a strict subgroup of the world) and hands them a key-value store of its own (a
TCPStore it serves, apart from the process group). Each check is one *item*, keyed
"adapter.stage.dtype.case" (stage 0 load, 1 setup, 2 the checks); for each item a rank

    1. publishes where it is ("at/<rank>": the item and, within a check, its phase),
    2. runs it, catching everything (an exception becomes an ERROR row with the library's file:line),
    3. publishes its rows, its collective counts and whether it raised ("done/<item>/<rank>"),
    4. waits, with a timeout, for every rank's record of the same item, then reads them all.

All ranks read the same records, so they take the same decision without talking over the
process group (which a misbehaving adapter may have left mid-collective):
    - load or setup failed on some rank: the adapter's checks are skipped everywhere (F24:
      the failing rank's own error is the row, at once);
    - the ranks of a TP group are out of step (different collective counts within the group,
      or a collective timed out): every rank leaves with RESTART, and the supervisor starts
      fresh processes from the next item (two TP groups on different data may make different
      numbers of calls: that is no desynchronisation);
    - a rank's record never comes (it is stuck in a collective its peers skipped): the
      others leave with GAVE_UP after the wait; the supervisor ends the stuck ones.
The process group's own timeout is the check timeout, so a rank stuck in a collective
raises after it instead of waiting forever.
"""
import argparse
import json
import os
import sys
import traceback
from datetime import timedelta

import torch
import torch.distributed as dist

from tp_from_scratch.comm.process_group import exit_now, init_process_group, new_group
from tp_from_scratch.verify.loading import load_adapter
from tp_from_scratch.verify.recorder import describe
from tp_from_scratch.verify.suite import all_cases, row, run_case

FINISHED, GAVE_UP, RESTART = 0, 3, 4        # worker exit codes the supervisor reads
STARTUP = 120.0   # seconds the ranks may take to start, or to import an adapter, apart
_OUT_OF_STEP = ("timed out", "timeout", "connection", "gloo", "nccl", "closed by peer")


def _arguments(argv):
    parser = argparse.ArgumentParser()
    parser.add_argument("adapters", nargs="+")
    parser.add_argument("--store", required=True, help="host:port of the supervisor's TCPStore")
    parser.add_argument("--launch", required=True, help="this launch's prefix in the store")
    parser.add_argument("--after", default="", help="resume after this item")
    parser.add_argument("--broken", default="", help="adapter indices already known broken")
    parser.add_argument("--group-size", type=int, required=True)
    parser.add_argument("--dtypes", required=True)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--check-timeout", type=float, default=10.0)
    return parser.parse_args(argv)


def item_key(adapter, stage, dtype=0, case=0):
    return f"{adapter}.{stage}.{dtype}.{case}"


def parse_key(key):
    return tuple(int(part) for part in key.split("."))


class Fence:
    """The per-item protocol of the module docstring, over the supervisor's store."""

    def __init__(self, store, launch, rank, world, timeout):
        self.store, self.launch, self.rank, self.world, self.timeout = store, launch, rank, world, timeout

    def key(self, *parts):
        return "/".join([self.launch, *map(str, parts)])

    def at(self, item, phase=""):
        self.store.set(self.key("at", self.rank), f"{item} {phase}".strip())

    def announce(self, item, adapter, component, check, dtype):
        """What ``item`` is, for the supervisor's row should no rank finish it."""
        self.at(item)
        self.store.set(self.key("what", item), json.dumps(dict(adapter=adapter, component=component,
                                                               check=check, dtype=dtype)))

    def publish(self, item, record):
        self.store.set(self.key("done", item, self.rank), json.dumps(record))
        self.store.add(self.key("progress"), 1)

    def everyone(self, item, timeout):
        """Every rank's record of ``item``; leaves with GAVE_UP if one has not come in time."""
        keys = [self.key("done", item, r) for r in range(self.world)]
        try:
            self.store.wait(keys, timedelta(seconds=timeout))
        except Exception:  # noqa: BLE001 - a peer is stuck: the supervisor names it
            self.store.set(self.key("gave_up", self.rank), item)
            exit_now(GAVE_UP)
        return [json.loads(self.store.get(k)) for k in keys]


def out_of_step(records):
    """Whether the ranks of some TP group may have left it mid-collective: they made different
    numbers of collective calls, or one failed in the transport (timed out, peer gone). Judged
    per TP group (a record's "group"): two groups run on different data, and a library may make
    another number of calls in each. (Ranks raising after the same collectives as the others
    leave the group sound.)"""
    calls = {}
    for r in records:
        calls.setdefault(r.get("group", 0), set()).add(tuple(r["calls"]))
    timed_out = any(word in r["message"].lower() for r in records for word in _OUT_OF_STEP)
    return any(len(c) > 1 for c in calls.values()) or timed_out


def _groups(group_size, device, timeout):
    """This rank's TP group (the world, or its block of group_size consecutive ranks) and a
    group holding this rank alone (the t = 1 build of the default-init check)."""
    rank, world = dist.get_rank(), dist.get_world_size()
    blocks = [new_group(range(lo, lo + group_size), timeout) for lo in range(0, world, group_size)]
    tp = dist.group.WORLD if group_size == world else blocks[rank // group_size]
    solo = [new_group([r], timeout) for r in range(world)][rank]
    return tp, rank // group_size, solo


def main(argv=None):
    args = _arguments(argv)
    host, port = args.store.rsplit(":", 1)
    store = dist.TCPStore(host, int(port), is_master=False, timeout=timedelta(seconds=60))
    # start together (imports take seconds under load), then a group whose collectives time
    # out after the check timeout: a rank stuck in one raises instead of waiting forever
    rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    store.set(f"{args.launch}/ready/{rank}", "1")
    store.wait([f"{args.launch}/ready/{r}" for r in range(world)], timedelta(seconds=STARTUP))
    init_process_group(args.device, args.check_timeout)
    tp, group_index, solo_group = _groups(args.group_size, args.device, args.check_timeout)
    t = dist.get_world_size(tp)
    fence = Fence(store, args.launch, rank, world, args.check_timeout + 5)
    dtypes = [getattr(torch, name) for name in args.dtypes.split(",")]
    device = (torch.device("cuda", int(os.environ.get("LOCAL_RANK", 0))) if args.device == "cuda"
              else "cpu")
    if args.device == "cuda":
        torch.set_default_device(device)  # what default_init builds lands on this rank's GPU
    values_seed = args.seed + group_index  # a strict subgroup: different data in every group
    after = parse_key(args.after) if args.after else (-1,)
    broken = {int(a) for a in args.broken.split(",") if a}
    solo = lambda fn: fn(solo_group)  # noqa: E731

    for a, spec in enumerate(args.adapters):
        if a in broken or a < after[0]:
            continue
        adapter = None
        for stage, name in ((0, "load"), (1, "setup")):
            item = item_key(a, stage)
            quiet = parse_key(item) <= after       # already reported by an earlier launch
            fence.announce(item, spec, "(all)", name, "-")
            if stage == 0:
                record = _load(spec)
                adapter = record.pop("adapter", None)
                if adapter is not None:   # for the summary: the contract, and what XPASS is judged on
                    record.update(name=adapter.name, contract=adapter.contract, patterns={
                        k: str(v) for k, v in adapter.expected_failures.items()})
            else:
                record = _setup(adapter, tp)
            if quiet:
                if record["raised"]:
                    exit_now(RESTART)   # it worked before: let the supervisor retry past it
                continue
            fence.publish(item, _strip(record, spec, name, t))
            records = fence.everyone(item, STARTUP)
            if any(r["raised"] for r in records):
                adapter = None
                break
        if adapter is None:
            continue
        for d, dtype in enumerate(dtypes):
            for c, case in enumerate(all_cases(t, args.seed, adapter.supports)):
                item = item_key(a, 2, d, c)
                if parse_key(item) <= after:
                    continue
                if not case.runs_for(adapter):  # a NOT PROVIDED or SKIP row: nothing to fence
                    fence.publish(item, dict(rows=run_case(case, tp, dtype, adapter), calls=[0, 0],
                                             raised=False, message="", group=group_index))
                    continue
                fence.announce(item, adapter.name, case.component, case.check or "(all)",
                               str(dtype).replace("torch.", ""))
                phase_seen = lambda phase, item=item: fence.at(item, phase)  # noqa: E731
                rows = run_case(case, tp, dtype, adapter, seed=values_seed, device=device, solo=solo,
                                phase_seen=phase_seen)
                raised = [r["detail"] for r in rows if r["status"] == "ERROR"]
                calls = _calls(rows)
                fence.publish(item, dict(rows=rows, calls=calls, raised=bool(raised),
                                         message="; ".join(raised), group=group_index))
                if out_of_step(fence.everyone(item, fence.timeout)):
                    exit_now(RESTART)
    store.set(fence.key("finished", rank), "1")
    dist.destroy_process_group()
    exit_now(FINISHED)


def _calls(rows):
    measured = [r for r in rows if r["forward"] is not None]
    return (measured[0]["forward"], measured[0]["backward"]) if measured else (0, 0)


def _load(spec):
    try:
        return dict(adapter=load_adapter(spec), raised=False, message="", calls=[0, 0], trace="")
    except BaseException as error:  # noqa: BLE001 - SystemExit from an adapter module too
        return dict(raised=True, message=describe(error), calls=[0, 0], trace=traceback.format_exc())


def _setup(adapter, group):
    try:
        if adapter.setup is not None:
            adapter.setup(group)
        return dict(raised=False, message="", calls=[0, 0], trace="")
    except BaseException as error:  # noqa: BLE001
        return dict(raised=True, message=describe(error), calls=[0, 0], trace=traceback.format_exc())


def _strip(record, spec, name, t):
    """The record of a load or setup item, with its row (ERROR if it raised)."""
    trace = record.pop("trace")
    rows = [row(spec, "(all)", name, "-", t, "ERROR", record["message"], traceback=trace)]
    return dict(record, rows=rows if record["raised"] else [])


if __name__ == "__main__":
    sys.exit(main())
