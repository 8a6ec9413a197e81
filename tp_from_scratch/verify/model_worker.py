"""One rank of a ``verify model`` world: every configuration of this world in turn, fenced.

The supervisor (verify/model_main.py) writes the configurations of one world size W to a JSON
file and starts W processes of this module with a key-value store of its own (a TCPStore). For
each configuration ("item" i: a source, a TP group size g, a dtype) every rank

    1. publishes where it is ("at/<rank>": "i phase", the phase of verify.model_check),
    2. runs it in its TP group (the world, or its block of g consecutive ranks: the other blocks
       run the same configuration on their own data), catching everything,
    3. publishes its record ("done/i/<rank>") and waits, with a timeout, for every rank's;
    4. leaves with RESTART when the ranks of a group ended in different phases, or one's
       collective timed out (the group may be broken mid-collective): the supervisor starts
       fresh processes after item i. A rank whose peers never publish leaves with GAVE_UP.
"""
import argparse
import json
import os
import sys
import tempfile
from datetime import timedelta

import torch
import torch.distributed as dist

from tp_from_scratch.comm.process_group import exit_now, init_process_group, new_group
from tp_from_scratch.verify.model_check import check_configuration
from tp_from_scratch.verify.models import Context, builder
from tp_from_scratch.verify.worker import FINISHED, RESTART, STARTUP, Fence

_TRANSPORT = ("timed out", "timeout", "connection", "gloo", "closed by peer")


def _arguments(argv):
    parser = argparse.ArgumentParser()
    parser.add_argument("--store", required=True)
    parser.add_argument("--launch", required=True)
    parser.add_argument("--items", required=True, help="JSON file: [{source, group, dtype}]")
    parser.add_argument("--after", type=int, default=-1)
    parser.add_argument("--shared", required=True, help="a folder every rank sees")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--timeout", type=float, default=120.0)
    parser.add_argument("--collective-timeout", type=float, default=30.0)
    return parser.parse_args(argv)


def out_of_step(records):
    """Whether the ranks may have left a group mid-collective: different phases in one group,
    or a transport failure (a peer gone, a collective timed out)."""
    groups = {}
    for r in records:
        groups.setdefault(r["group_index"], set()).add((r["verdict"], r["phase"]))
    transport = any(w in r["message"].lower() for r in records for w in _TRANSPORT)
    return transport or any(len(states) > 1 for states in groups.values())


class Groups:
    """This rank's TP group for each group size, made once (new_group is collective over the world)."""

    def __init__(self, sizes, timeout):
        rank, world = dist.get_rank(), dist.get_world_size()
        self.by_size, self.meshes = {}, {}
        for g in sorted(sizes):
            blocks = [new_group(range(lo, lo + g), timeout) for lo in range(0, world - g + 1, g)]
            mine = rank // g
            self.by_size[g] = (dist.group.WORLD if g == world else
                               blocks[mine] if mine < len(blocks) else None, mine)

    def context(self, g, tmp, shared):
        group, index = self.by_size[g]
        if group is None:
            return None, index
        if g not in self.meshes:
            from torch.distributed.device_mesh import DeviceMesh
            self.meshes[g] = DeviceMesh.from_group(group, "cpu")
        shared = os.path.join(shared, str(index))
        os.makedirs(shared, exist_ok=True)
        return Context(group, self.meshes[g], g, dist.get_rank(group), tmp, shared), index


def main(argv=None):
    args = _arguments(argv)
    items = json.loads(open(args.items).read())
    host, port = args.store.rsplit(":", 1)
    store = dist.TCPStore(host, int(port), is_master=False, timeout=timedelta(seconds=60))
    rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    store.set(f"{args.launch}/ready/{rank}", "1")
    store.wait([f"{args.launch}/ready/{r}" for r in range(world)], timedelta(seconds=STARTUP))
    init_process_group("cpu", args.collective_timeout)
    groups = Groups({it["group"] for it in items}, args.collective_timeout)
    fence = Fence(store, args.launch, rank, world, args.timeout)
    for i, item in enumerate(items):
        if i <= args.after:
            continue
        fence.at(i, "start")
        with tempfile.TemporaryDirectory(prefix=f"verify_model_rank{rank}_") as tmp:
            ctx, index = groups.context(item["group"], tmp, os.path.join(args.shared, str(i)))
            if ctx is None:   # this rank is outside every group of this size
                rec = dict(verdict="idle", phase="", message="", where="", divergence="", checks=[])
            else:
                rec = check_configuration(builder(item["source"]), ctx, getattr(torch, item["dtype"]),
                                          args.seed + index, lambda phase, i=i: fence.at(i, phase))
        rec.update(rank=rank, group_index=index)
        fence.publish(i, rec)
        records = fence.everyone(i, args.timeout)
        if out_of_step([r for r in records if r["verdict"] != "idle"]):
            exit_now(RESTART)
    dist.destroy_process_group()
    exit_now(FINISHED)


if __name__ == "__main__":
    sys.exit(main())
