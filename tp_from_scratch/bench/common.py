"""What the benchmarks share: message sizes, timing calls in turn, timing training steps, the size
options, the JSON report."""
import contextlib
import json
import time
from pathlib import Path

import numpy as np

from tp_from_scratch import collectives


def parse_bytes(text):
    """'8', '64K', '16M', '1G' -> bytes."""
    units = {"K": 2 ** 10, "M": 2 ** 20, "G": 2 ** 30}
    text = text.strip().upper().removesuffix("B")
    return int(float(text[:-1]) * units[text[-1]]) if text[-1] in units else int(text)


def sizes(min_bytes, max_bytes, factor):
    """min_bytes, min_bytes*factor, ..., and max_bytes itself (so 8 B .. 16 MiB ends at 16 MiB)."""
    out, size = [], min_bytes
    while size < max_bytes:
        out.append(size)
        size *= factor
    return out + [max_bytes]


def time_calls(comm, calls, warmup, iters):
    """Median seconds per call of each of ``calls``, on the slowest rank.

    The calls take turns, iteration by iteration, so both implementations see the same
    machine: on a shared laptop other processes come and go, and timing one implementation
    after the other would compare two different machines. Each call starts after a barrier;
    a call's time is that of the slowest rank. The median, not the mean: one call in twenty
    can stall for a scheduler time slice (milliseconds), which would swamp the mean.
    """
    for _ in range(warmup):
        for call in calls:
            call()
    seconds = np.zeros((iters, len(calls)))
    for i in range(iters):
        for j, call in enumerate(calls):
            comm.barrier()
            start = time.perf_counter()
            call()
            seconds[i, j] = time.perf_counter() - start
    slowest = collectives.all_reduce(comm, seconds, op="max")  # (iters, calls): the slowest rank per call
    return np.median(slowest, axis=0), slowest.min(axis=0)


def add_size_options(parser, max_bytes, factor, warmup):
    """--min-bytes, --max-bytes, --factor, --warmup, --iters and --json, with these defaults."""
    parser.add_argument("--min-bytes", type=parse_bytes, default=parse_bytes("8"))
    parser.add_argument("--max-bytes", type=parse_bytes, default=parse_bytes(max_bytes))
    parser.add_argument("--factor", type=int, default=factor, help="size multiplier between rows (nccl-tests -f)")
    parser.add_argument("--warmup", type=int, default=warmup)
    parser.add_argument("--iters", type=int, default=20)
    parser.add_argument("--json", help="also write every row to this JSON file (rank 0)")


def check_size_options(parser, args):
    """Stop with a usage error unless 1 <= --min-bytes <= --max-bytes and --factor >= 2."""
    if args.min_bytes < 1 or args.max_bytes < args.min_bytes or args.factor < 2:
        parser.error("need 1 <= --min-bytes <= --max-bytes and --factor >= 2")


def write_report(comm, args, backend, rows, say):
    """Rank 0 writes the run's settings and rows to --json, if given."""
    if not args.json or comm.rank != 0:
        return
    report = {"ranks": comm.world_size, "backend": backend, "comm": type(comm).__name__,
              "warmup": args.warmup, "iters": args.iters, "rows": rows}
    Path(args.json).parent.mkdir(parents=True, exist_ok=True)
    Path(args.json).write_text(json.dumps(report, indent=1))
    say(f"# wrote {args.json}")


def timed_steps(model, optimizer, batches, context=contextlib.nullcontext, losses=None):
    """Seconds per step over ``batches`` (a barrier before and after, so all ranks agree).

    Each step is Lesson 6's (gpt.step.train_step). context: what forward and backward run
    inside (loss_parallel for the vocab-sharded DTensor plan); losses: a list the step losses
    are appended to (read after the timing stops).
    """
    # here: the message benchmarks that share this file need neither torch nor the trainer
    import torch.distributed as dist

    from tp_from_scratch.gpt.step import train_step
    dist.barrier()
    t0 = time.perf_counter()
    kept = [train_step(model, optimizer, x, y, context=context) for x, y in batches]
    dist.barrier()
    seconds = (time.perf_counter() - t0) / len(batches)
    if losses is not None:
        losses += [float(getattr(k, "full_tensor", lambda k=k: k)()) for k in kept]
    return seconds
