"""Hold tensor-parallel implementations against single-device PyTorch, check by check.

    .venv/bin/python -m tp_from_scratch.verify tp_from_scratch.verify.ours:ADAPTER
    .venv/bin/python -m tp_from_scratch.verify examples/megatron_core_adapter.py:ADAPTER --t 2 --json out.json
    .venv/bin/python -m tp_from_scratch.verify model --hf DIR      # a whole model: verify/model_main.py

Each argument names an Adapter (tp_from_scratch.verify.adapter) as module:NAME or file.py:NAME
(NAME may also be a function returning one). The command starts the worker processes itself,
one launch per entry of --t: "3" is a world of 3 ranks in one TP group, "2of4" 4 processes cut
into two TP groups of 2 with different data. Default: 2,3,4,2of4. Each check runs fenced off from the
next (verify/worker.py, verify/supervisor.py): a rank that raises, skips a collective or
deadlocks is reported as that check's row, naming every rank's state, and the run goes on.
This process, the supervisor, prints the table and the summary and writes --json.

Under torchrun (the older way, still accepted) rank 0 supervises a launch of WORLD_SIZE
workers and the other ranks leave at once.

Exit status: 0 all checks pass (XFAIL counts as expected), 1 some FAIL or ERROR, 2 the suite
could not run (bad arguments, workers that never start), 3 nothing was checked (t = 1, no
component provided, or --device cuda without enough GPUs).
"""
import argparse
import importlib.metadata
import os
import platform
import sys

import torch

from tp_from_scratch.verify.report import (COULD_NOT_RUN, NOTHING_CHECKED, exit_status, summary,
                                           table, write_json)
from tp_from_scratch.verify.adapter import CONTRACT
from tp_from_scratch.verify.supervisor import RESTARTS, Config, CouldNotRun, run_world

VERSIONED = ("torch", "numpy", "megatron-core", "transformers")


def _parser():
    parser = argparse.ArgumentParser(prog="python -m tp_from_scratch.verify", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("adapters", nargs="+", help="module:NAME or file.py:NAME of an Adapter")
    parser.add_argument("--t", default=None, help="comma-separated launches: t (a world of t "
                        "ranks) or TofW (TP groups of T on W processes); default 2,3,4,2of4 "
                        "(under torchrun: its WORLD_SIZE)")
    parser.add_argument("--json", help="also write the schema, the run's metadata and every row here")
    parser.add_argument("--dtypes", default="float64,float32", help="comma-separated torch dtypes")
    parser.add_argument("--seed", type=int, default=0,
                        help="seed of the random shapes and values (default 0, always printed)")
    parser.add_argument("--device", default="cpu", choices=["cpu", "cuda"],
                        help="cpu (gloo) or cuda (nccl, one GPU per process)")
    parser.add_argument("--check-timeout", type=float, default=10.0,
                        help="seconds the ranks may fall apart within one check before it is "
                             "reported stuck and fresh workers take over")
    parser.add_argument("--restarts", type=int, default=RESTARTS,
                        help="fresh starts of the workers one adapter may cost (a deadlock, ranks out "
                             "of step) before its remaining checks are given up; default %(default)s")
    parser.add_argument("--timeout", type=float, default=None, help=argparse.SUPPRESS)  # old flag
    parser.add_argument("--verbose", action="store_true", help="print each exception's traceback")
    parser.add_argument("--failures-only", action="store_true",
                        help="the table shows the ERROR and FAIL rows alone (the summary is the same)")
    return parser


def _refuse(code, message):
    print(f"verify: {message}", file=sys.stderr)
    return code


def _launches(args):
    """[(world, group_size)] to run, or an exit code and message."""
    default = os.environ.get("WORLD_SIZE", "2") if "RANK" in os.environ else "2,3,4,2of4"
    if args.t is not None and not args.t.strip():
        return None, (COULD_NOT_RUN, f"--t {args.t!r}: no launch given (e.g. --t 3 or --t 2,2of4)")
    text = args.t or default
    launches = []
    for entry in text.split(","):
        group, _, world = entry.partition("of")
        try:
            group, world = int(group), int(world or group)
        except ValueError:
            return None, (COULD_NOT_RUN, f"--t {text!r}: expected entries such as 3 or 2of4")
        if group < 1 or world % group:
            return None, (COULD_NOT_RUN, f"--t {entry}: TP groups of {group} do not tile {world} processes")
        if group == 1:
            return None, (NOTHING_CHECKED, f"--t {text}: nothing checked at t = 1 (one rank has no "
                          "collective and no shard, so every TP bug vanishes); use t >= 2")
        launches.append((world, group))
    return launches, None


def _metadata(args, launches, dtypes):
    versions = {"python": platform.python_version()}
    for package in VERSIONED:
        try:
            versions[package] = importlib.metadata.version(package)
        except importlib.metadata.PackageNotFoundError:
            pass
    return dict(command=sys.argv, adapters=args.adapters, versions=versions,
                launches=",".join(f"{g}" if w == g else f"{g}of{w}" for w, g in launches),
                t=sorted({g for _, g in launches}), dtypes=dtypes, seed=args.seed,
                device=args.device, check_timeout=args.check_timeout, restarts=args.restarts,
                contract=CONTRACT)


def main(argv=None):
    argv = sys.argv[1:] if argv is None else list(argv)
    if argv[:1] == ["model"]:   # whole models: verify/model_main.py
        from tp_from_scratch.verify.model_main import main as model_main
        return model_main(argv[1:])
    args = _parser().parse_args(argv)
    if "RANK" in os.environ and os.environ["RANK"] != "0":
        return 0  # under torchrun: rank 0 supervises its own launch
    launches, refused = _launches(args)
    if refused:
        return _refuse(*refused)
    for spec in args.adapters:
        where, _, name = spec.rpartition(":")
        if not where or not name:
            return _refuse(COULD_NOT_RUN, f"adapter {spec!r}: expected module:NAME or file.py:NAME")
        if where.endswith(".py") and not os.path.isfile(where):
            return _refuse(COULD_NOT_RUN, f"adapter {spec!r}: no file {where}")
    dtypes = args.dtypes.split(",")
    bad = [d for d in dtypes if not isinstance(getattr(torch, d, None), torch.dtype)]
    if bad:
        return _refuse(COULD_NOT_RUN, f"--dtypes: {', '.join(bad)} is not a torch dtype (e.g. float64,float32)")
    if args.json and not os.path.isdir(os.path.dirname(os.path.abspath(args.json))):
        return _refuse(COULD_NOT_RUN, f"--json {args.json}: its folder does not exist")
    if args.check_timeout <= 0:
        return _refuse(COULD_NOT_RUN, f"--check-timeout {args.check_timeout}: must be positive")
    if args.restarts < 0:
        return _refuse(COULD_NOT_RUN, f"--restarts {args.restarts}: must be 0 or more")
    if args.device == "cuda":
        need, have = max(w for w, _ in launches), torch.cuda.device_count()
        if have < need:
            return _refuse(NOTHING_CHECKED, f"--device cuda: SKIP, the launches need {need} GPUs "
                           f"(one per process) and this machine has {have}")
    metadata = _metadata(args, launches, dtypes)
    print(f"verify: t = {metadata['launches']}; seed {args.seed} (--seed {args.seed} reproduces); "
          f"contract {CONTRACT}", flush=True)
    config = Config(args.adapters, dtypes, args.seed, args.device, args.check_timeout,
                    restarts=args.restarts)
    rows, declared = [], {}
    try:
        for world, group_size in launches:
            rows += run_world(config, world, group_size, declared)
    except CouldNotRun as error:
        return _refuse(COULD_NOT_RUN, str(error))
    print(table(rows, verbose=args.verbose, failures_only=args.failures_only))
    print(summary(rows, metadata, declared))
    if args.json:
        write_json(rows, args.json, metadata, declared)
    return exit_status(rows)


if __name__ == "__main__":
    sys.exit(main())
