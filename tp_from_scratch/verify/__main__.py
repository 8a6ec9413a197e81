"""Hold a tensor-parallel implementation against single-device PyTorch, check by check.

    .venv/bin/torchrun --standalone --nproc-per-node 2 -m tp_from_scratch.verify tp_from_scratch.verify.ours:ADAPTER
    .venv/bin/torchrun --standalone --nproc-per-node 4 -m tp_from_scratch.verify examples/megatron_core_adapter.py:ADAPTER --json out.json

Each argument names an Adapter (tp_from_scratch.verify.adapter) as module:NAME or file.py:NAME
(NAME may also be a function returning one). Every rank runs every check on the world group
with native collectives; rank 0 prints one table for all adapters (and writes --json). Exit
status 1 if any row is FAIL, 0 otherwise: SKIP and NOT PROVIDED are not failures.
"""
import argparse
import importlib
import importlib.util
import sys
from pathlib import Path

import torch
import torch.distributed as dist

from tp_from_scratch.comm.process_group import init_process_group
from tp_from_scratch.verify.adapter import Adapter
from tp_from_scratch.verify.report import exit_status, merge, table, write_json
from tp_from_scratch.verify.suite import run_suite


def load_adapter(spec):
    """The Adapter that ``module:NAME`` or ``path/to/file.py:NAME`` names."""
    where, _, name = spec.rpartition(":")
    if not where:
        raise ValueError(f"adapter {spec!r}: expected module:NAME or file.py:NAME")
    if where.endswith(".py"):
        loaded = importlib.util.spec_from_file_location(Path(where).stem, where)
        module = importlib.util.module_from_spec(loaded)
        loaded.loader.exec_module(module)
    else:
        module = importlib.import_module(where)
    adapter = getattr(module, name)
    adapter = adapter if isinstance(adapter, Adapter) else adapter()
    if not isinstance(adapter, Adapter):
        raise TypeError(f"{spec} is a {type(adapter).__name__}, not a tp_from_scratch.verify.Adapter")
    return adapter


def _broken(spec, error, t):
    """The row that says an adapter could not even be loaded or set up."""
    return [dict(adapter=spec, component="(all)", check="load / setup", dtype="-", t=t, status="FAIL",
                 error=None, bound=None, forward=None, backward=None,
                 detail=f"{type(error).__name__}: {error}")]


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("adapters", nargs="+", help="module:NAME or file.py:NAME of an Adapter")
    parser.add_argument("--json", help="also write every row to this JSON file")
    parser.add_argument("--dtypes", default="float64,float32", help="comma-separated torch dtypes")
    parser.add_argument("--timeout", type=float, default=60.0, help="seconds any collective may wait")
    args = parser.parse_args(argv)
    init_process_group("cpu", args.timeout)
    world, t = dist.group.WORLD, dist.get_world_size()
    dtypes = [getattr(torch, name) for name in args.dtypes.split(",")]
    rows = []
    for spec in args.adapters:
        try:
            adapter = load_adapter(spec)
            mine = run_suite(world, adapter, dtypes)
        except Exception as error:  # noqa: BLE001 - report it as a row and go on
            mine = _broken(spec, error, t)
        every_rank = [None] * t
        dist.all_gather_object(every_rank, mine)
        rows += merge(every_rank)
    if dist.get_rank() == 0:
        sys.stdout.write(table(rows) + "\n")
        sys.stdout.flush()
        if args.json:
            write_json(rows, args.json)
    dist.barrier()
    dist.destroy_process_group()
    return exit_status(rows)


if __name__ == "__main__":
    sys.exit(main())
