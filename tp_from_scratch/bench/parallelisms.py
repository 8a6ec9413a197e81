"""DP, ZeRO, PP, TP, TP+SP and hybrids on one GPT and one global batch, at 4 ranks, side by side.

    .venv/bin/python -m tp_from_scratch.bench parallelisms                       # every strategy, prints the table
    .venv/bin/python -m tp_from_scratch.bench parallelisms --json lessons/measurements/parallelisms.json
    .venv/bin/python -m tp_from_scratch.bench parallelisms --only "pp4 1f1b m8" --only tp4
    .venv/bin/python -m tp_from_scratch.bench parallelisms --markdown lessons/measurements/parallelisms.json  # docs/measured.md's table

One torchrun launch of 4 CPU processes (gloo) trains every strategy in turn with Lesson 11's
trainer (tp_from_scratch.parallelisms.train.run with a MeshRun), each on its own dp x pp x tp groups
(--worker: what each process runs). Per strategy, the rank holding the most:

* memory per rank (KiB): weights, gradients and optimizer state after a step (counted tensor
  bytes; the cost model's prediction beside them), and activations: the most bytes autograd
  kept for backward at once (saved-tensor hooks), beside Korthikanti et al.'s formula
  (16-bit activations with dropout, so only its trend is comparable);
* bytes per step per rank: handed to collectives (TP group, DP group) and sent point to point
  (pipeline), measured by the trainer's counters; the cost model's total beside them;
* step time (median over ranks of the median step after a warm-up step) and, for pipelines,
  the bubble: the idle share of the stages' time from their timestamps, and (p-1)/(m+p-1).

The machine matters for times and bubbles: 4 processes on fewer cores share them, so a
stage waiting in the bubble lends its core to another stage. Bytes and memory do not depend
on the machine.
"""
import argparse
import json
import os
import tempfile
import time
from pathlib import Path

from tp_from_scratch.comm.launchers import run_command, torchrun_command
from tp_from_scratch.parallelisms.compare import markdown, summarise, table

RANKS = 4
MODEL = ["--layers", "4", "--batch-size", "8"]   # defaults otherwise: V=67, T=32, H=64, nh=8, nkv=4
STRATEGIES = [  # (label, trainer flags)
    ("dp4", ["--dp", "4"]),
    ("dp4 ddp", ["--dp", "4", "--ddp"]),
    ("dp4 zero1", ["--dp", "4", "--zero", "1"]),
    ("dp4 zero2", ["--dp", "4", "--zero", "2"]),
    *[(f"pp4 {s} m{m}", ["--pp", "4", "--schedule", s, "--micro-batches", str(m)])
      for s in ("gpipe", "1f1b") for m in (1, 4, 8)],
    ("tp4", ["--tp", "4"]),
    ("tp4 sp", ["--tp", "4", "--sp"]),
    ("dp2xtp2 ddp", ["--dp", "2", "--tp", "2", "--ddp"]),
    ("pp2xtp2 1f1b m4", ["--pp", "2", "--tp", "2", "--schedule", "1f1b", "--micro-batches", "4"]),
]


def worker(outdir, steps, labels):
    """Under torchrun: train every strategy in ``labels`` on this world, rank 0 writing each record."""
    from tp_from_scratch.comm.launch import torch_main
    from tp_from_scratch.gpt.mesh import setup_mesh
    from tp_from_scratch.parallelisms import train

    def every_strategy():
        for label, flags in STRATEGIES:
            if label not in labels:
                continue
            args = train.parse(
                [*MODEL, *flags, "--steps", str(steps), "--no-progress", "--timeout", "300"])
            problem = train.validate(args, RANKS)
            if problem:
                raise ValueError(f"{label}: {problem}")
            mesh = setup_mesh(args.tp, args.device, args.timeout, pp=args.pp)
            measured = train.MeshRun(args, mesh)
            train.run(args, mesh, measured)
            if mesh.rank == 0:
                (Path(outdir) / (label.replace(" ", "_") + ".json")).write_text(json.dumps(measured.record))
                print(f"  measured {label}", flush=True)
    torch_main(every_strategy, timeout=300)


def measure_all(labels, steps, timeout, workdir):
    """One torchrun launch measuring every strategy; {label: --measure record}."""
    cmd = torchrun_command(RANKS, "tp_from_scratch.bench.parallelisms", "--worker", workdir, "--steps", steps,
                           *[f"--only={label}" for label in labels])
    out = run_command(cmd, timeout=timeout)
    if out.returncode != 0:
        raise RuntimeError(f"the measuring launch failed:\n{out.stdout[-3000:]}")
    return {label: json.loads((Path(workdir) / (label.replace(" ", "_") + ".json")).read_text())
            for label in labels}


def main(argv=None):
    p = argparse.ArgumentParser(prog="python -m tp_from_scratch.bench parallelisms", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--steps", type=int, default=5, help="per strategy; the first is a warm-up")
    p.add_argument("--only", action="append", default=[], help="a strategy label (repeatable)")
    p.add_argument("--json", metavar="PATH", help="write the rows (and the command) as JSON")
    p.add_argument("--timeout", type=float, default=600)
    p.add_argument("--worker", metavar="DIR", help=argparse.SUPPRESS)
    p.add_argument("--markdown", metavar="JSON", help="print a written --json file's rows as a Markdown table")
    args = p.parse_args(argv)
    if args.markdown:
        print(markdown(json.loads(Path(args.markdown).read_text())["rows"]))
        return 0
    labels = [l for l, _ in STRATEGIES if not args.only or l in args.only]
    if not labels:
        p.error(f"no strategy called {args.only}; the labels are {[l for l, _ in STRATEGIES]}")
    if args.worker:
        return worker(args.worker, args.steps, labels)
    start = time.perf_counter()
    with tempfile.TemporaryDirectory() as tmp:
        records = measure_all(labels, args.steps, args.timeout, tmp)
    rows = [summarise(label, records[label]) for label in labels]
    print(f"measured in {time.perf_counter() - start:.0f} s")
    print(f"\n{RANKS} ranks, trainer flags {' '.join(MODEL)} (global batch 8, float32, AdamW), "
          f"{args.steps} steps each\n")
    print(table(rows))
    if args.json:
        import torch
        Path(args.json).parent.mkdir(parents=True, exist_ok=True)
        Path(args.json).write_text(json.dumps({
            "command": ".venv/bin/python -m tp_from_scratch.bench parallelisms " + " ".join(argv or []),
            "ranks": RANKS, "model_flags": MODEL, "steps": args.steps, "cores": os.cpu_count(),
            "torch": torch.__version__, "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
            "rows": rows}, indent=1))
        print(f"wrote {args.json}")
    return 0


if __name__ == "__main__":
    import sys
    sys.exit(main())
