"""Dispatch ``.venv/bin/python -m tp_from_scratch.bench <name> [args]`` to tp_from_scratch.bench.<name>.main(args).

The submodule is imported by name only when asked for, so one benchmark's imports
(mpi4py, torch) are never needed to run another.
"""
import importlib
import sys

BENCHMARKS = {
    "collectives": "from-scratch ring collectives against MPI / torch.distributed (mpiexec or torchrun)",
    "p2p": "one ring step: the communicator's send/recv against the backend's bare calls",
    "algorithms": "all-reduce by size: ring, recursive doubling, Rabenseifner, segmented ring vs native",
    "overlap": "exposed all-reduce time and step time of a column-parallel layer, with and without overlap",
    "train": "tensor-parallel GPT training throughput (torchrun)",
    "scaling": "strong scaling: tp=1 (1 and 2 threads) against tp=2, and the planner's prediction (torchrun)",
    "parallelisms": "DP, DDP, ZeRO-1/2, PP (GPipe, 1F1B), TP, TP+SP and hybrids at 4 ranks: memory, bytes, time, bubble",
}


def usage():
    lines = ["usage: python -m tp_from_scratch.bench <benchmark> [options]", "", "benchmarks:"]
    lines += [f"  {name:<12} {what}" for name, what in BENCHMARKS.items()]
    lines += ["", "Each accepts --help."]
    return "\n".join(lines)


def main(argv=None):
    argv = sys.argv[1:] if argv is None else argv
    if not argv or argv[0] in ("-h", "--help"):
        print(usage())
        return 0
    name, rest = argv[0], argv[1:]
    if name not in BENCHMARKS:
        print(f"unknown benchmark {name!r}\n\n{usage()}", file=sys.stderr)
        return 2
    module = importlib.import_module(f"tp_from_scratch.bench.{name}")
    return module.main(rest) or 0


if __name__ == "__main__":
    sys.exit(main())
