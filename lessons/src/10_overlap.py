"""Generate lessons/10_overlap.ipynb (without outputs; `make lessons` executes it).

    .venv/bin/python lessons/src/10_overlap.py
    .venv/bin/jupyter nbconvert --to notebook --execute --inplace lessons/10_overlap.ipynb

The measured numbers come from two files in lessons/measurements/:
    allreduce_algorithms.json  written by the commands listed in it (bench algorithms --write-table,
                               mpiexec and torchrun, 2 and 4 ranks)
    overlap.json               torchrun --standalone --nproc-per-node 2 -m tp_from_scratch.bench overlap
                               --json lessons/measurements/overlap.json
"""
from pathlib import Path

from nbformat.v4 import new_code_cell, new_markdown_cell
from lesson_notebook import write_notebook

HERE = Path(__file__).resolve().parent

cells = [
    new_markdown_cell(r"""# Lesson 10: hiding and shrinking communication

Lessons 2 to 9 sent the bytes tensor parallelism needs, one collective after the other, with
one algorithm: the ring. Production TP does two more things:

1. it **picks the all-reduce algorithm by message size**: a ring is bandwidth-optimal but
   pays 2(p-1) message latencies; small messages prefer fewer, larger steps. MPICH and NCCL
   carry tuning tables for this choice; we measure ours;
2. it **hides** communication behind computation that does not depend on it: Megatron-LM
   starts the all-reduce of a column-parallel layer's input gradient and computes the weight
   gradient while it is in flight.

Everything here is in `tp_from_scratch/overlap/`: `algorithms.py` (four all-reduces and the
selector), `nonblocking.py` (an all-reduce you start and wait for), `linear.py` (the
overlapping layer). Exercise 9 (`exercises/ex09_recursive_halving_doubling.py`) asks you to
write one of the algorithms.

Legend: p ranks, N bytes of the array, alpha seconds per message, beta seconds per byte."""),
    new_code_cell("""import sys, json
from pathlib import Path
if not (Path.cwd() / "tp_from_scratch").is_dir():  # run from lessons/: make the package importable
    sys.path.insert(0, str(Path.cwd().parent))
REPO = Path.cwd() if (Path.cwd() / "tp_from_scratch").is_dir() else Path.cwd().parent

import numpy as np
import matplotlib.pyplot as plt

from tp_from_scratch.comm import run_spmd
from tp_from_scratch.overlap import algorithms as A
from tp_from_scratch.overlap.figures import algorithm_times, backward_timeline, fit_alpha_beta_gamma
from tp_from_scratch.overlap.linear import predicted_backward
from tp_from_scratch.testing import random_array, rank_rng"""),
    new_markdown_cell(r"""## 1. Four all-reduces

| algorithm | messages per rank | bytes sent per rank | idea |
|---|---|---|---|
| ring (Lesson 2) | 2(p-1) | 2(p-1)/p N | reduce-scatter then all-gather around a ring |
| recursive doubling | log2 p | N log2 p | partners 1, 2, 4... apart swap whole partial sums |
| Rabenseifner | 2 log2 p | 2(p-1)/p N | reduce-scatter by recursive **halving**, all-gather by doubling |
| segmented ring | 2(p-1) x segments | 2(p-1)/p N | the ring, each chunk cut into segments that flow as a pipeline |

(for p a power of two). When p is not, recursive doubling and Rabenseifner first **fold**:
with p2 the largest power of two below p, the first 2(p - p2) ranks pair up, the even one
hands its array to the odd one and sits out, and gets the result back at the end: one
whole-array message more each way.

Every algorithm has the same contract as `collectives.all_reduce`, and the meter shows
exactly what its formula (`algorithms.traffic`) says. Here on 6 simulated ranks:"""),
    new_code_cell("""p, count = 6, 1000  # 1000 float32: 4000 bytes, not divisible by 6
xs = [random_array(rank_rng(0, r), (count,), np.float32, integer=True) for r in range(p)]

def messages_and_bytes(comm, name):
    comm.meter.reset()
    y = A.ALGORITHMS[name](comm, xs[comm.rank])
    assert np.array_equal(y, np.sum(xs, axis=0))  # the same sum on every rank
    return comm.meter.messages_sent, comm.meter.bytes_sent

print(f"{'algorithm':<20} {'rank':>4} {'messages':>9} {'bytes':>7}   formula")
for name in A.ALGORITHMS:
    for rank, got in enumerate(run_spmd(messages_and_bytes, p, name)):
        formula = A.traffic(name, p, rank, count, 4)[:2]
        if rank in (0, 1, 5):
            print(f"{name:<20} {rank:>4} {got[0]:>9} {got[1]:>7}   {formula}")"""),
    new_markdown_cell(r"""Rank 0 sits out of the fold (one array out, one back), rank 1 absorbs it, rank 5 plays an
ordinary rank of the 4-rank power of two. Recursive doubling sends the least messages,
Rabenseifner and the ring the least bytes; the segmented ring (default segments of 256 KiB)
is the ring itself on arrays this small.

## 2. The latency-bandwidth crossover, measured

`python -m tp_from_scratch.bench algorithms` times every algorithm and the backend's native
all-reduce from 8 B to 64 MiB, taking turns call by call (the machine is shared; each time is
the fastest of its calls). Solid lines: measured; dashed: the alpha-beta-gamma prediction
(`algorithms.predicted_seconds`: alpha per message, beta per byte sent, gamma per byte
added) with alpha, beta and gamma **fitted** to these measurements (`figures.fit_alpha_beta_gamma`)."""),
    new_code_cell("""table = json.loads((REPO / "lessons/measurements/allreduce_algorithms.json").read_text())
runs = [(backend, int(p)) for backend in table["measured"] for p in sorted(table["measured"][backend], key=int)]
fig, axes = plt.subplots(1, len(runs), figsize=(4.2 * len(runs), 3.6), sharey=True)
fits = {}
for ax, (backend, p) in zip(np.atleast_1d(axes), runs):
    rows = table["measured"][backend][str(p)]
    fits[backend, p] = fit_alpha_beta_gamma(rows, p)
    algorithm_times(ax, rows, p, *fits[backend, p], title=f"{backend}, p={p}")
fig.tight_layout()
for (backend, p), (alpha, beta, gamma) in fits.items():
    print(f"{backend:<10} p={p}: fitted alpha = {alpha * 1e6:7.1f} us per message, "
          f"1/beta = {1 / beta / 1e9:5.2f} GB/s sent, 1/gamma = "
          + (f"{1 / gamma / 1e9:5.2f} GB/s added" if gamma else "inf (no cost per byte added)"))"""),
    new_markdown_cell(r"""What the curves say:

* **small messages** cost alpha per round: recursive doubling (log2 p rounds) beats the ring
  (2(p-1) rounds) by the ratio of their rounds; at p = 2 it sends one message instead of two.
* **large messages** cost beta per byte sent and gamma per byte added: recursive doubling
  sends and adds N log2 p bytes per rank, the ring and Rabenseifner send 2(p-1)/p N and add
  (p-1)/p N, so beyond the crossover the ring wins. At p = 2 both send N bytes: only the
  additions (N against N/2) make the ring win for large arrays, which an alpha-beta model
  without gamma cannot predict. Rabenseifner sends
  the ring's bytes in fewer rounds (2 log2 p instead of 2(p-1)): at p = 2 it *is* the ring,
  at p = 4 it can win at a few MiB, where rounds and bytes both count.
* the **segmented ring** pays a Python round trip per segment: on a CPU, where the "link" is a
  memcpy and no engine reduces one segment while the next is in flight, its pipeline buys
  nothing. NCCL's ring is segmented because on a GPU the slices of a pipeline really run at once.
* ranks **oversubscribe** 2 cores at p = 4: a message waits for the peer's time slice, and
  alpha grows from tens of microseconds to milliseconds.

The predicted crossover (where the fitted lines of recursive doubling and the ring cross)
against the one the selector uses (measured winners, each size judged with its neighbours):"""),
    new_code_cell("""def predicted_crossover(p, alpha, beta, gamma):
    sizes = 2.0 ** np.arange(3, 27, 0.25)
    faster = [A.predicted_seconds("ring", p, n, alpha, beta, gamma)
              < A.predicted_seconds("recursive_doubling", p, n, alpha, beta, gamma) for n in sizes]
    return int(sizes[faster.index(True)]) if True in faster else None

print(f"{'backend':<10} {'p':>2} {'predicted ring > rec.doubling':>30}   measured rules (bytes, algorithm)")
for (backend, p), fit in fits.items():
    print(f"{backend:<10} {p:>2} {str(predicted_crossover(p, *fit)):>30}   {table['rules'][backend][str(p)]}")
print()
print("the commands that measured them:", *table["command"], sep="\\n  ")"""),
    new_markdown_cell(r"""`algorithms.all_reduce(comm, x)` is the selector: it looks up the measured rules for the
communicator's backend (the simulator uses MPI's) and the nearest measured p, and calls the
winner. Every rank makes the same choice because it depends only on N, p and the backend."""),
    new_code_cell("""for nbytes in (8, 4096, 2 ** 20, 64 * 2 ** 20):
    print(f"{nbytes:>9} B:", {f"{backend} p={p}": A.select_algorithm(table, backend, p, nbytes)[0]
                               for backend, p in fits})"""),
    new_markdown_cell(r"""## 3. Hiding the all-reduce behind the weight gradient

A column-parallel layer Y_i = X W_i^T (X replicated) needs in backward

* dX_i = dY_i W_i, a **Partial** sum: f's backward all-reduces it;
* dW_i = dY_i^T X, this rank's own: no communication, and it does not need dX.

So backward can **start** the all-reduce of dX, compute dW while it is in flight, and **wait**
only then (Megatron-LM's `LinearWithGradAccumulationAndAsyncCommunication`).
`AsyncColumnParallelLinear` does this with either kind of group: a torch ProcessGroup
(`dist.all_reduce(dx, async_op=True)`, gloo's threads run the whole ring) or a `Comm`
(`all_reduce_async`: Lesson 2's ring as a generator of isend/irecv steps, advanced
**cooperatively**, i.e. only inside `start`, `test` and `wait`; on the simulator a progress
thread would make one rank two threads, which its deadlock diagnosis cannot follow).

The arithmetic does not change, so the gradients are **bit-identical** to `ColumnParallelLinear`'s:"""),
    new_code_cell("""from tp_from_scratch.overlap.check_layer import check_async_layer
run_spmd(check_async_layer, 3)  # raises if any output or gradient differs in a single bit
print("AsyncColumnParallelLinear == ColumnParallelLinear, bit for bit, on 3 simulated ranks")"""),
    new_markdown_cell(r"""### Before and after, measured (torchrun, 2 ranks, 2 cores)

`python -m tp_from_scratch.bench overlap` runs one layer (X of 1024 x 2048 float32, a
dX all-reduce of 8 MiB) forward and backward, blocking and overlapped, taking turns. The
timeline is rank 0's last backward of each; "exposed" is the time backward spends in the
all-reduce (blocking) or in starting and waiting for it (overlap)."""),
    new_code_cell("""bench = json.loads((REPO / "lessons/measurements/overlap.json").read_text())
print(f"{'group':>22} {'variant':>9} {'step ms':>8} {'dW ms':>7} {'exposed ms':>10}")
for row in bench["rows"]:
    print(f"{row['group']:>22} {row['variant']:>9} {row['step_ms']:>8.2f} {row['dw_ms']:>7.2f} {row['exposed_ms']:>10.2f}"
          + (f"   hidden {row['hidden']:.0%}" if "hidden" in row else ""))
fig, ax = plt.subplots(figsize=(11, 2.8))
backward_timeline(ax, {f"{r['group']}, {r['variant']}": r["backward_timeline_ms"] for r in bench["rows"]},
                  title="one backward, rank 0")
fig.tight_layout()"""),
    new_markdown_cell(r"""### What overlap can and cannot buy on a 2-core CPU

Each rank owns one core. Moving 8 MiB between two processes on a CPU is a memcpy (through
the kernel's TCP loopback for gloo): **the communication itself needs a core**, the same core
the dW matmul runs on. Overlap can then only hide the time the all-reduce spends *waiting*
(for the peer to arrive, for the scheduler); the copying is merely interleaved with the
matmul, not run beside it; gloo's threads copying the 8 MiB compete with the dW matmul
for the rank's core, so dW itself can get slower when overlapped. The from-scratch handle
progresses cooperatively: only its first message moves during dW, the rest waits for
`wait()`, so it hides next to nothing. What the native path gains depends on whether the
copying lands in moments the core would otherwise idle: on this shared machine repeated
runs disagree even in sign (the README lists them), which is the honest answer: on a CPU,
overlap buys at most the waiting, and the noise is of the same size.

On a GPU node the interconnect has engines of its own (NVLink, copy engines; NCCL borrows a
few SMs, ignored here): the all-reduce and the dW matmul really run at the same time, and
the exposed time drops to max(0, all-reduce - dW). The alpha-beta-gamma model
(`linear.predicted_backward`), for the same layer with the planner's H100 NVLink profile,
against the same model with the CPU numbers fitted above and one core doing both:"""),
    new_code_cell("""from tp_from_scratch.gpt import plan
h100 = plan.load_profile("h100-nvlink")
gpu_link = h100["all_reduce"]["native"]
alpha_cpu, beta_cpu, _ = fits.get(("TorchComm", 2), next(iter(fits.values())))
cases = {
    "CPU core, 2 ranks (fitted), 1 core does both": dict(flops=20e9, alpha=alpha_cpu, beta=beta_cpu, own_engine=False),
    "H100 NVLink, 8 GPUs, bf16, engine of its own": dict(flops=h100["matmul_flops"]["1"], alpha=gpu_link["alpha_s"],
                                                         beta=gpu_link["beta_s_per_byte"], own_engine=True),
}
for label, case in cases.items():
    t = 2 if case["own_engine"] is False else 8
    tokens, hidden, out = (1024, 2048, 128) if t == 2 else (8 * 4096, 8192, 28672 // 8)
    itemsize = 4 if t == 2 else 2
    m = predicted_backward(tokens, hidden, out, t, case["flops"], case["alpha"], case["beta"], itemsize,
                           own_engine=case["own_engine"])
    print(f"{label}: all-reduce {m['all_reduce'] * 1e3:.3f} ms, dW {m['dW'] * 1e3:.3f} ms; "
          f"backward {m['blocking'] * 1e3:.3f} -> {m['overlap'] * 1e3:.3f} ms "
          f"({1 - m['overlap'] / m['blocking']:.0%} faster), exposed {m['exposed_blocking'] * 1e3:.3f} -> "
          f"{m['exposed_overlap'] * 1e3:.3f} ms")"""),
    new_markdown_cell(r"""The CPU line assumes 20 GFLOP/s for one core's matmul (measure yours with
`python -m tp_from_scratch.gpt.plan --calibrate`); the GPU line is Llama-3-70B-like (H = 8192,
F = 28672, t = 8, 4096-token sequences, batch 8) with vendor peak numbers: a prediction, not a
measurement. Megatron-LM and PyTorch's async TP report gains of a few percent end to end
from overlaps like this one: large when the all-reduce and the matmul it hides behind take
similar times, nothing when either dominates.

## Exercise 9

Write `all_reduce_rabenseifner(comm, x, op)` in `exercises/ex09_recursive_halving_doubling.py`
on `comm.send` and `comm.recv` only; `pytest exercises -m ex09` grades it: the sum on every
rank for p = 1..8, the same bits everywhere, the input untouched, and the meter and the
partners of recursive halving-doubling (not a ring, not recursive doubling)."""),
]

write_notebook(cells, HERE.parent / "10_overlap.ipynb")
