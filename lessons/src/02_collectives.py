"""Generate lessons/02_collectives.ipynb (without outputs; `make lessons` executes it).

    .venv/bin/python lessons/src/02_collectives.py
    .venv/bin/jupyter nbconvert --to notebook --execute --inplace lessons/02_collectives.ipynb
"""
from pathlib import Path

from nbformat.v4 import new_code_cell, new_markdown_cell
from lesson_notebook import write_notebook

HERE = Path(__file__).resolve().parent
OUT = HERE.parent / "02_collectives.ipynb"

cells = [
    new_markdown_cell(r"""# Lesson 2 (ex02): collectives from point-to-point messages

Lesson 1 ended with partial sums that had to be added up across devices, and column blocks that
had to be glued together. On real hardware those are **collectives**: operations that every
device calls at the same time, such as `all_reduce` (every device gets the sum) and `all_gather`
(every device gets the concatenation). Tensor parallelism is matmuls plus collectives.

Here we build the collectives ourselves, out of nothing but `send` and `recv`, and measure
what they cost.

What you will see:
1. point-to-point messages, and what a simulated world does when ranks wait on each other;
2. every collective drawn: who holds what, before and after;
3. the **ring all-reduce**, step by step, one picture per step, decoded from the real messages;
4. the **α–β cost model**, the bandwidth-optimal factor $2(p-1)/p$, and the meter's byte
   counts matching the formula;
5. exercise 2, where you write the ring yourself.

The code is in `tp_from_scratch/comm/` (communicators, the simulator, the meter) and
`tp_from_scratch/collectives.py` (the algorithms); this notebook only calls it. Everything runs on
**simulated ranks**: `run_spmd(fn, p)` runs `fn(comm)` on p threads, one per rank. The very same
functions run under `mpiexec` and `torchrun` (see the demo at the end)."""),
    new_code_cell("""import sys
from pathlib import Path
if not (Path.cwd() / "tp_from_scratch").is_dir():  # run from lessons/: make the package importable
    sys.path.insert(0, str(Path.cwd().parent))

import numpy as np
import matplotlib.pyplot as plt

from tp_from_scratch import collectives
from tp_from_scratch.comm import SPMDError, run_spmd
from tp_from_scratch.compare import assert_matches_reference
from tp_from_scratch.sharding import shard_sizes
from tp_from_scratch.testing import random_array, rank_rng"""),

    # ------------------------------------------------------------------ point to point
    new_markdown_cell(r"""## 1. Point to point: `send` and `recv`

A communicator `comm` knows its `rank` (0 ... p-1) and the `world_size` p, and can
* `comm.send(array, dst)`: hand a copy of a numpy array to rank `dst`. It is **buffered**: it
  returns at once, without waiting for `dst` to receive;
* `comm.recv(src)`: wait for the next array from rank `src`.

Every rank runs the same function (SPMD); `comm.rank` is how it knows its part. Each
communicator has a `meter` that counts the messages and payload bytes this rank sends and
receives: the numbers we will hold against the cost model."""),
    new_code_cell("""def ping(comm):
    if comm.rank == 0:
        comm.send(np.arange(4.0), dst=1)       # 4 float64 = 32 bytes
        return comm.recv(src=1)
    x = comm.recv(src=0)
    comm.send(x * 10, dst=0)
    return x

results = run_spmd(ping, 2)
print("rank 0 got back", results[0], "; rank 1 received", results[1])"""),
    new_markdown_cell(r"""What if both ranks wait for the other first? On real hardware the job hangs. The simulator
sees every rank at once: when all live ranks wait and no awaited message exists, nothing can ever
move again, and it says so, naming who waits on whom and the line where each rank stopped. The
same holds when ranks disagree about which collective they are in."""),
    new_code_cell("""def both_wait_first(comm):
    other = 1 - comm.rank
    x = comm.recv(src=other)        # nobody has sent anything yet
    comm.send(x, dst=other)

try:
    run_spmd(both_wait_first, 2, timeout=10)
except SPMDError as error:
    print(str(error).split("traceback on")[0])

def disagree(comm):
    x = np.ones(4)
    return collectives.all_reduce(comm, x) if comm.rank == 0 else collectives.all_gather(comm, x)

try:
    run_spmd(disagree, 2, timeout=10)
except SPMDError as error:
    print(str(error).splitlines()[0])"""),


    # ------------------------------------------------------------------ gallery
    new_markdown_cell(r"""## 2. The collectives, drawn

A collective is a call that **every rank makes**; the messages inside are the algorithm. The
picture of each one shows p = 4 ranks (rows) and their blocks of data. Block `b2` is rank 1's
block 2 (each rank has its own colour); `Σ2` is block 2 summed over all ranks; a grey block like
`ab1` is a partial sum (ranks 0 and 1 so far).

These are the real results of `tp_from_scratch.collectives`: each block's value encodes which
block it is and which ranks were added into it (the code in the next cell decodes it), so the
pictures cannot show what the library did not do.

| collective | before | after | in tensor parallelism |
|---|---|---|---|
| `broadcast(x, root)` | x on the root | x everywhere | send the same input to every rank |
| `reduce(x, root)` | x_r everywhere | Σ x_r on the root | |
| `scatter(x, root)` | x on the root | block r on rank r | |
| `gather(x, root)` | x_r on rank r | concatenation on the root | collect results for printing |
| `all_gather(x)` | x_r on rank r | concatenation everywhere | Sharded → Replicated (column-parallel output) |
| `reduce_scatter(x)` | x_r everywhere | block r of Σ x_r on rank r | Partial → Sharded (sequence parallelism) |
| `all_reduce(x)` | x_r everywhere | Σ x_r everywhere | Partial → Replicated (row-parallel output, Megatron's g) |
| `all_to_all(x)` | block j of x_r on rank r | block r of every x_q on rank r | Sharded(heads) ↔ Sharded(sequence) |
| `all_to_all_v(x, counts)` | c_d rows of x_r for each rank d | every rank's rows for r, in source order | tokens to their experts and back (Lesson 12) |
"""),
    new_code_cell("""# the picture helpers live in the library: tp_from_scratch/plots.py
from tp_from_scratch.plots import decode, draw_before_after, draw_ring_steps, tagged_blocks"""),
    new_code_cell("""P = 4
tagged = [tagged_blocks(r, P) for r in range(P)]      # rank r: blocks a0..a3 (rank 0), b0..b3 (rank 1), ...
own = [tagged_blocks(r, P)[r:r + 1] for r in range(P)]  # rank r: only its block r (a0, b1, c2, d3)
root_only = lambda x, r: x if r == 0 else None

gallery = [
    ("broadcast (root 0): a binomial tree", [root_only(x, r) for r, x in enumerate(tagged)],
     lambda comm: collectives.broadcast(comm, root_only(tagged[comm.rank], comm.rank), root=0)),
    ("reduce (root 0): a binomial tree", tagged,
     lambda comm: collectives.reduce(comm, tagged[comm.rank], root=0)),
    ("scatter (root 0)", [root_only(x, r) for r, x in enumerate(tagged)],
     lambda comm: collectives.scatter(comm, root_only(tagged[comm.rank], comm.rank), root=0)),
    ("gather (root 0)", own, lambda comm: collectives.gather(comm, own[comm.rank], root=0)),
    ("all_gather: a ring", own, lambda comm: collectives.all_gather(comm, own[comm.rank])),
    ("reduce_scatter: a ring", tagged, lambda comm: collectives.reduce_scatter(comm, tagged[comm.rank])),
    ("all_reduce: reduce_scatter + all_gather", tagged,
     lambda comm: collectives.all_reduce(comm, tagged[comm.rank])),
    ("all_to_all: pairwise exchange", tagged,
     lambda comm: collectives.all_to_all(comm, tagged[comm.rank], 0, 0)),
]
for name, before, fn in gallery:
    draw_before_after(name, before, run_spmd(fn, P), P)"""),
    new_markdown_cell(r"""The pictures are decoded from the values, so let us also check the values the way every test
of the course does: against the single-device answer, with `assert_matches_reference`. Random,
rank-distinct, integer-valued data adds up exactly in any order, so the check is bit for bit."""),
    new_code_cell("""p = 5                                                  # not a power of two
xs = [random_array(rank_rng(2, r), (7, 3), integer=True) for r in range(p)]  # 7 rows: uneven chunks

got = run_spmd(lambda comm: (collectives.all_reduce(comm, xs[comm.rank]),
                             collectives.reduce_scatter(comm, xs[comm.rank]),
                             collectives.all_gather(comm, xs[comm.rank])), p)
total = np.sum(xs, axis=0)                             # the single-device reference
for r, (ar, rs, ag) in enumerate(got):
    assert_matches_reference(ar, total, name="all_reduce", rank=r, exact=True)
    assert_matches_reference(rs, np.array_split(total, p)[r], name="reduce_scatter", rank=r, exact=True)
    assert_matches_reference(ag, np.concatenate(xs), name="all_gather", rank=r, exact=True)
print(f"{p} ranks: all_reduce, reduce_scatter (chunk sizes {shard_sizes(7, p)} rows) and all_gather "
      "equal numpy, bit for bit, on every rank")"""),
    new_markdown_cell(r"""**All-to-all with uneven counts.** A mixture-of-experts layer (Lesson 12) sends each token
to the rank that holds its expert, and no two ranks send the same number of rows: rank r sends
$c_d$ rows to rank d. The receiver must size its buffer before the rows arrive, so the counts
travel first (`exchange_counts`, itself an all-to-all of p integers); then `all_to_all_v` runs
the same pairwise exchange as `all_to_all` (step s: send to r+s, receive from r−s), each block
received straight into its place. Cost per rank: $(p-1)\alpha + (\sum_d c_d - c_r)\,\text{row}\,\beta$:
only the rows that leave the rank travel."""),
    new_code_cell("""counts = [rank_rng(3, q).integers(0, 4, size=p) for q in range(p)]   # counts[q][d]: rows q sends d
rows = [random_array(rank_rng(4, q), (int(counts[q].sum()), 3), integer=True) for q in range(p)]

def dispatch(comm):
    recv_counts = collectives.exchange_counts(comm, counts[comm.rank])   # the counts go first
    comm.meter.reset()
    return collectives.all_to_all_v(comm, rows[comm.rank], counts[comm.rank], recv_counts), comm.meter.bytes_sent

for r, (y, sent) in enumerate(run_spmd(dispatch, p)):
    blocks = [np.split(rows[q], np.cumsum(counts[q])[:-1])[r] for q in range(p)]  # what q addressed to r
    assert_matches_reference(y, np.concatenate(blocks), name="all_to_all_v", rank=r, exact=True)
    assert sent == (counts[r].sum() - counts[r][r]) * 3 * 8      # bytes = the formula
print(f"{p} ranks, rows sent per destination: {[c.tolist() for c in counts]}; every rank received its rows "
      "in source order, and sent exactly its off-rank rows")"""),

    # ------------------------------------------------------------------ ring
    new_markdown_cell(r"""## 3. The ring all-reduce, step by step

The obvious all-reduce sends everything to one rank, adds it up there and sends the sum back.
That rank then moves $(p-1)$ whole arrays in and $(p-1)$ out, while the others idle.

The **ring** keeps every link busy. Arrange the ranks in a circle; rank r only ever sends to
r+1 and receives from r-1. Cut the array into p chunks.

* **Reduce-scatter, p-1 steps.** In each step every rank sends one chunk to its right neighbour
  and adds the chunk arriving from its left into its own copy. A chunk travels around the ring
  picking up one rank's contribution per hop; after p-1 hops rank r holds chunk r summed over
  all ranks.
* **All-gather, p-1 steps.** The same circle again, but now the receiver *stores* the arriving
  chunk instead of adding it, and passes it on in the next step. After p-1 steps everyone has
  every summed chunk.

To watch it, we wrap each rank's communicator so that it writes down every message the real
`collectives.all_reduce` sends (the wrapper passes everything else through untouched). Each
panel shows what the ranks hold before a step; the red blocks are the ones they send in it."""),
    new_code_cell("""class MessageLog:
    \"\"\"A rank's communicator, unchanged, except that it keeps a copy of every array it sends.\"\"\"

    def __init__(self, comm):
        self.comm, self.sent = comm, []

    def send(self, array, dst, **options):  # options: header=False, see the end of section 4
        self.sent.append((dst, np.array(array, copy=True)))
        self.comm.send(array, dst, **options)

    def __getattr__(self, name):           # rank, world_size, recv, meter, ...: the real ones
        return getattr(self.comm, name)

def all_reduce_logged(comm):
    log = MessageLog(comm)
    result = collectives.all_reduce(log, tagged[comm.rank])
    return result, log.sent

runs = run_spmd(all_reduce_logged, P)
results = [result for result, _ in runs]
sent = [messages for _, messages in runs]              # sent[r][k] = (dst, array) of rank r in step k
steps = len(sent[0])
assert steps == 2 * (P - 1) and all(dst == (r + 1) % P for r in range(P) for dst, _ in sent[r])
print(f"each rank sent {steps} messages, all to its right neighbour; sizes:",
      sorted({a.size for r in range(P) for _, a in sent[r]}), "block(s) each")"""),
    new_code_cell("""# Replay the messages: in reduce-scatter the receiver adds the chunk to its own, in all-gather it stores it.
state = [list(tagged[r]) for r in range(P)]
states, sends, titles = [], [], []
for k in range(steps):
    phase = "reduce-scatter" if k < P - 1 else "all-gather"
    states.append([list(s) for s in state])
    sends.append([(r, decode(sent[r][k][1][0], P)[0]) for r in range(P)])
    titles.append(f"step {k + 1}: {phase}")
    for r in range(P):
        dst, (value,) = sent[r][k]
        block = decode(value, P)[0]
        state[dst][block] = state[dst][block] + value if phase == "reduce-scatter" else value
states.append(state)
titles.append("done: Σ everywhere")

# The replay must agree with what the library really returned on every rank.
for r in range(P):
    assert_matches_reference(np.array(state[r]), results[r], name="replayed ring", rank=r, exact=True)
draw_ring_steps(states, sends, titles, P)"""),
    new_markdown_cell(r"""Read the panels row by row. In step 1 rank 0 sends its `a3` to rank 1, which adds it to `b3`
(the grey `ab3` in step 2), and so on around the circle. After step 3 every rank owns one full
sum (`Σ0` on rank 0, `Σ1` on rank 1, ...), which is exactly `reduce_scatter`'s result. Steps 4-6
circulate those sums, which is `all_gather`. Each message is **one chunk, 1/p of the array**."""),

    # ------------------------------------------------------------------ cost
    new_markdown_cell(r"""## 4. What it costs: the α–β model

Model a message of n bytes as costing $\alpha + n\beta$: a fixed latency α (microseconds: software,
synchronisation, the link's start-up) plus β seconds per byte (1/bandwidth). For an array of N bytes
on p ranks:

| all-reduce algorithm | steps (latency) | bytes sent by the busiest rank | time |
|---|---|---|---|
| to a root and back (direct) | $2(p-1)$ | $(p-1)N$ | $2(p-1)\alpha + (p-1)N\beta$ |
| binomial tree reduce + broadcast | $2\lceil\log_2 p\rceil$ | $\lceil\log_2 p\rceil N$ | $2\lceil\log_2 p\rceil(\alpha + N\beta)$ |
| recursive doubling (p a power of 2: exchange whole arrays with rank $r \oplus 2^k$) | $\log_2 p$ | $N \log_2 p$ | $\log_2 p\,(\alpha + N\beta)$ |
| recursive halving + doubling (Rabenseifner; p a power of 2) | $2\log_2 p$ | $2\frac{p-1}{p}N$ | $2\log_2 p\,\alpha + 2\frac{p-1}{p}N\beta$ |
| **ring** (reduce-scatter + all-gather) | $2(p-1)$ | $2\frac{p-1}{p}N$ | $2(p-1)\alpha + 2\frac{p-1}{p}N\beta$ |

Recursive halving + doubling halves the array at each of $\log_2 p$ reduce-scatter steps
(partner $r \oplus 2^k$) and doubles it back in the all-gather: the ring's bytes with only
$2\log_2 p$ latencies, but it needs p to be a power of two (other p pay extra steps), and its
partners are far apart on a physical ring. Recursive doubling alone is latency-optimal and
bandwidth-poor. NCCL picks between rings and (double binary) trees by message size.

**Why $2(p-1)/p$ is the best possible: a cut argument.** Take one element of the array and let
rank a be the first rank that holds its full sum. Cut the ranks into {a} and the rest: before
a can finish, every other rank's contribution must cross into a, and since a message carries
one value per element (however many ranks' contributions are added into it), at least one
value per other rank must be *sent* for this element while its sum is still incomplete. After
a finishes, each of the p − 1 other ranks still lacks the full sum and must *receive* at least
one more value for this element. So every element costs at least (p − 1) + (p − 1) transfers,
the whole array $2(p-1)N$ bytes over all ranks, and the busiest rank sends at least the
average, $2\frac{p-1}{p}N$. Patarasuk & Yuan (*Bandwidth optimal all-reduce algorithms for
clusters of workstations*, J. Parallel Distrib. Comput., 2009) make this rigorous and show the
ring reaches it. The bound is **almost independent of p** (it tends to 2N): adding ranks does not
make the ring's bandwidth term grow, which is why NCCL uses rings for large messages. The
price is $2(p-1)$ latency steps: for tiny messages the tree wins.

The same reasoning gives $(p-1)/p$ of the result for `all_gather` and `reduce_scatter` alone.
nccl-tests calls $\text{algbw} = N/t$ and $\text{busbw} = \text{algbw}\cdot 2(p-1)/p$: the busbw
of a good all-reduce is the link bandwidth, whatever p (see `.venv/bin/python -m tp_from_scratch.bench
collectives`).

Now the meter. For each p we run the real collectives on an array of N = 1000 float64 and read
each rank's bytes sent from `comm.meter.by_collective`. With uneven chunks the exact count is
$2N - \text{chunk}_r - \text{chunk}_{r+1}$ for all-reduce (a rank sends every chunk except one in
each phase)."""),
    new_code_cell("""N_ELEMENTS = 1000
N = N_ELEMENTS * 8                                     # bytes of the float64 array

def traffic(comm):
    x = random_array(rank_rng(4, comm.rank), (N_ELEMENTS,))
    collectives.all_reduce(comm, x)
    collectives.reduce_scatter(comm, x)
    collectives.all_gather(comm, np.array_split(x, comm.world_size)[comm.rank])  # gathers N bytes
    return {name: t.bytes_sent for name, t in comm.meter.by_collective.items()}

print(f"bytes sent per rank for an array of N = {N} bytes (max over ranks; formula; exact count)")
print(f"{'p':>3} {'all_reduce':>11} {'2(p-1)/p N':>11} {'reduce_scatter':>15} {'(p-1)/p N':>10} "
      f"{'all_gather':>11} {'(p-1)/p N':>10}")
table = []
for p in range(1, 9):
    per_rank = run_spmd(traffic, p)
    chunk = [n * 8 for n in shard_sizes(N_ELEMENTS, p)]  # bytes of chunk r
    # what each rank must send, counting chunk sizes exactly (they differ by 8 bytes when p does not divide N)
    exact = {"all_reduce": [2 * N - chunk[r] - chunk[(r + 1) % p] if p > 1 else 0 for r in range(p)],
             "reduce_scatter": [N - chunk[r] if p > 1 else 0 for r in range(p)],
             "all_gather": [N - chunk[(r + 1) % p] if p > 1 else 0 for r in range(p)]}
    for name, expected in exact.items():
        measured = np.array([per_rank[r][name] for r in range(p)])
        assert_matches_reference(measured, np.array(expected), name=f"{name} bytes sent, p={p}", exact=True)
    row = {name: max(per_rank[r][name] for r in range(p)) for name in exact}
    table.append((p, row))
    print(f"{p:>3} {row['all_reduce']:>11} {2 * (p - 1) / p * N:>11.0f} {row['reduce_scatter']:>15} "
          f"{(p - 1) / p * N:>10.0f} {row['all_gather']:>11} {(p - 1) / p * N:>10.0f}")
print("\\nevery rank's measured bytes equal the exact count (assert_matches_reference, exact)")"""),
    new_code_cell("""ps = np.arange(1, 9)
fig, (left, right) = plt.subplots(1, 2, figsize=(11, 3.8))
left.plot(ps, [row["all_reduce"] / N for _, row in table], "o", color="C0", label="ring, measured (max over ranks)")
left.plot(ps, 2 * (ps - 1) / ps, "-", color="C0", alpha=0.5, label="ring, 2(p-1)/p")
left.plot(ps, ps - 1, "--", color="C3", label="to a root and back, (p-1) (the root)")
left.plot(ps, np.ceil(np.log2(ps)), ":", color="C2", label="binomial tree, ceil(log2 p) (the root)")
left.axhline(2, color="grey", lw=0.5)
left.set(xlabel="ranks p", ylabel="bytes sent / N", title="all-reduce: bytes sent by the busiest rank")
left.legend(fontsize=8, loc="upper left")

# Predicted time with an illustrative link: alpha = 5 us latency, 25 GB/s.
alpha, beta, p = 5e-6, 1 / 25e9, 8
sizes = np.logspace(2, 9, 200)                          # 100 B .. 1 GB
ring = 2 * (p - 1) * alpha + 2 * (p - 1) / p * sizes * beta
tree = 2 * np.ceil(np.log2(p)) * (alpha + sizes * beta)
right.loglog(sizes, ring * 1e6, label="ring")
right.loglog(sizes, tree * 1e6, label="binomial tree")
right.set(xlabel="message size N (bytes)", ylabel="time (us)",
          title=f"α-β model, p={p}, α=5 us, 25 GB/s: latency vs bandwidth")
cross = sizes[np.argmax(ring < tree)]
right.axvline(cross, color="grey", lw=0.5)
right.text(cross * 1.5, 3 * ring.min() * 1e6, f"ring wins above ~{cross / 1e3:.0f} kB", fontsize=8)
right.legend(fontsize=8)
fig.tight_layout()
plt.show()"""),
    new_markdown_cell(r"""**A performance detail: headers.** So that `recv(src)` can allocate the result, each message here carries a small
header with the array's shape and dtype. MPI and torch.distributed work the other way round: the
receiver passes a buffer of the right size (`MPI_Recv(buf, count, ...)`, `dist.recv(tensor)`). On
a real link the header is a second message, one more latency α (section 4). When the receiver
already knows what arrives, as in a reduce-scatter where every rank can compute every chunk's
shape, both sides can leave it out: `comm.send(x, dst, header=False)` and
`comm.recv(src, out=buffer, header=False)`. The library's `reduce_scatter`, `all_reduce` and
`reduce` do so. Both sides must agree. The simulator checks that they do; MPI and gloo do not,
and would hang or hand back the wrong bytes instead, which is one more reason to run new code
on the simulator first."""),
    new_code_cell("""def no_header(comm, header_on_recv):
    if comm.rank == 0:
        comm.send(np.arange(4.0), dst=1, header=False)   # payload only: rank 1 knows the shape
        return None
    buffer = np.empty(4)
    return comm.recv(src=0, out=buffer, header=header_on_recv)

print("received:", run_spmd(no_header, 2, header_on_recv=False)[1])
try:
    run_spmd(no_header, 2, header_on_recv=True)            # the two sides disagree
except SPMDError as error:
    print(str(error).splitlines()[0])"""),
    new_markdown_cell(r"""On real machines the picture holds: our ring all-reduce, run under `mpiexec` or `torchrun`
against MPI's and gloo's own, is compared by the benchmark, and every collective against the
native one by the demo:

```
.venv/bin/mpiexec -n 4 .venv/bin/python -m tp_from_scratch.demos.collectives
.venv/bin/torchrun --standalone --nproc-per-node 4 -m tp_from_scratch.demos.collectives
.venv/bin/mpiexec -n 4 .venv/bin/python -m tp_from_scratch.bench collectives --json runs/bench_mpi.json
```

## 5. Exercise 2 (ex02): write the ring yourself

Open `exercises/ex02_ring_collectives.py` and write `reduce_scatter`, `all_gather` and
`all_reduce` using only `comm.send`, `comm.recv`, `comm.rank`, `comm.world_size` and numpy. Then

```
make grade            # or: .venv/bin/python -m pytest exercises -m ex02 -x
```

The graders run your code on the simulator with p = 1, 2, 3, 4, 7 (and 8), arrays whose length p
does not divide, sums and maxima, and compare every rank's result with numpy. They also read the
meter: your all-reduce must send $2(p-1)/p$ of the array per rank, and every rank may talk only
to its two ring neighbours. A deadlock is reported in seconds, with the line each rank waits on.

Hints: `np.array_split` gives the chunks (some may be empty); the chunk rank r sends in step s of
the reduce-scatter is $(r - s - 1) \bmod p$; never modify the caller's array in place
(`np.array_split` returns views); keep the input's dtype."""),
]

write_notebook(cells, OUT)
