"""Generate lessons/05_autograd_tensor_parallel.ipynb (without outputs; `make lessons` executes it).

    .venv/bin/python lessons/src/05_autograd_tensor_parallel.py
    .venv/bin/jupyter nbconvert --to notebook --execute --inplace lessons/05_autograd_tensor_parallel.ipynb
"""
from pathlib import Path

from nbformat.v4 import new_code_cell, new_markdown_cell
from lesson_notebook import write_notebook

HERE = Path(__file__).resolve().parent
NAME = "05_autograd_tensor_parallel.ipynb"

cells = [
    new_markdown_cell(r"""# Lesson 5 (ex05a, ex05b): tensor parallelism with PyTorch autograd

In Lessons 3 and 4 every layer had a hand-written backward, and f and g were four little numpy
functions. PyTorch already differentiates everything else; all it needs from us is the
backward of the **communication**. That is Megatron-LM's whole trick: four
`torch.autograd.Function`s, and the parallel layers are ordinary modules built on them.

What you will see:
1. the four region mappings (f, g, scatter, gather), each a forward and a backward that are
   each other's transpose, checked bit for bit on simulated ranks;
2. `ColumnParallelLinear` and `RowParallelLinear` built from a `torch.nn.Linear`, equal to it in
   the output, every gradient, and the weights after an AdamW step, for t = 1, 2, 3, 4;
3. one SPMD function, three backends: simulated ranks, PyTorch's collectives, and ours;
4. the vocabulary-parallel embedding and cross-entropy, whose traffic does not grow with V;
5. dropout that knows whether an activation is replicated or sharded.

Notation as before: a tensor is **Replicated**, **Sharded(dim)** or **Partial** (a per-rank
addend of a sum). Shapes: B batch, T sequence, H hidden, F ffn, V vocabulary, t the TP degree.
The code is in `tp_from_scratch/nn/`; this notebook only calls it."""),
    new_code_cell("""import sys
import time
from pathlib import Path
LESSON_START = time.perf_counter()
if not (Path.cwd() / "tp_from_scratch").is_dir():  # run from lessons/: make the package importable
    sys.path.insert(0, str(Path.cwd().parent))

import matplotlib.pyplot as plt
import torch
import torch.nn.functional as F

from tp_from_scratch.comm import run_spmd
from tp_from_scratch.compare import TOLERANCE, assert_matches_reference, max_error
from tp_from_scratch.nn import (ColumnParallelLinear, RowParallelLinear, VocabParallelEmbedding,
                                copy_to_tp_region, gather_from_tp_region, reduce_from_tp_region,
                                vocab_parallel_cross_entropy)
from tp_from_scratch.nn.random import TensorParallelRNG
from tp_from_scratch.plots import device_color, draw_matrix
from tp_from_scratch.sharding import shard_range
from tp_from_scratch.testing import random_array, rank_rng

torch.set_num_threads(1)  # the simulated ranks are threads; one BLAS thread each"""),
    new_markdown_cell(r"""## 1. The region mappings are autograd Functions

A `torch.autograd.Function` has a `forward` and a `backward`; autograd calls our backward when
the gradient reaches that point of the graph. Megatron's pair, written out:

| mapping | forward | backward | where it sits |
|---|---|---|---|
| **f** `CopyToTensorParallelRegion` | identity | all-reduce | where a Replicated x enters a column-parallel layer |
| **g** `ReduceFromTensorParallelRegion` | all-reduce | identity | where a row-parallel layer's Partial result leaves |
| `ScatterToTensorParallelRegion` | keep own chunk of the last dim | all-gather | Replicated → Sharded(-1) |
| `GatherFromTensorParallelRegion` | all-gather | keep own chunk | Sharded(-1) → Replicated |

Each backward is the forward's transpose. If x is copied to t ranks and each uses it, the loss
depends on x through t paths, so its gradient is the **sum** of the t contributions: f's
backward all-reduces. If y is the sum of t partials, $\partial y/\partial x_r = 1$: g's backward
passes the gradient through unchanged. Exercise 5a asks you to write these four Functions; the
library's own are in `tp_from_scratch/nn/mappings.py` (read them after you have tried). Every
mapping takes the group first, as every collective of Lesson 2 takes the communicator first,
and the paper's short names are there too: `nn.f` is `copy_to_tp_region`, `nn.g` is
`reduce_from_tp_region`, the torch twins of the numpy `f_forward`/`f_backward` and
`g_forward`/`g_backward` of Lesson 3.

A note on adjoints: the literal transpose of "keep my chunk" (scatter) is "put my chunk back
and pad with zeros". It becomes an all-gather because the tensor before the scatter is
Replicated: the t ranks' copies are one logical tensor, so its gradient is the sum of the t
zero-padded chunks, which is every chunk side by side.

`run_spmd(fn, t)` runs `fn(comm)` on t threads, one simulated rank each. Every layer takes
its `group` explicitly, and a `Comm` is a valid group: the collectives then run on the
from-scratch ring of Lesson 2. On CPU, autograd runs `backward()` on the calling thread, so a
backward that all-reduces works inside a simulated rank.

The data are integer-valued, so every sum is exact in any order and we can demand every bit.
Each rank feeds f a **different** gradient; every rank must get back their sum. The meter
shows which direction communicated."""),
    new_code_cell("""def f_and_g(comm):
    x = torch.tensor(random_array(rank_rng(0, 0), (2, 3), integer=True), requires_grad=True)  # Replicated
    comm.meter.reset()
    y = copy_to_tp_region(comm, x)                       # f forward: nothing moves
    f_forward = comm.meter.messages_sent
    my_grad = torch.tensor(random_array(rank_rng(1, comm.rank), (2, 3), integer=True))  # rank-distinct
    y.backward(my_grad)                                  # f backward: all-reduce
    every_grad = sum(torch.tensor(random_array(rank_rng(1, r), (2, 3), integer=True)) for r in range(comm.world_size))
    assert_matches_reference(x.grad, every_grad, name="f backward", rank=comm.rank, exact=True)

    partial = torch.tensor(random_array(rank_rng(2, comm.rank), (2, 3), integer=True), requires_grad=True)
    z = reduce_from_tp_region(comm, partial)             # g forward: all-reduce
    every_partial = sum(torch.tensor(random_array(rank_rng(2, r), (2, 3), integer=True)) for r in range(comm.world_size))
    assert_matches_reference(z, every_partial, name="g forward", rank=comm.rank, exact=True)
    return f_forward, comm.meter.by_collective["all_reduce"].calls

for t in (1, 2, 3, 4):
    counts = run_spmd(f_and_g, t)
    print(f"t={t}: bit-exact on every rank; messages in f forward: {counts[0][0]}, "
          f"all-reduces (f backward + g forward): {counts[0][1]}")"""),
    new_markdown_cell(r"""## 2. The parallel linear layers, built from `torch.nn.Linear`

torch stores a Linear's weight as (out, in) and computes $Y = XW^\top + b$. So the layouts of
Lesson 1 appear transposed:

* `ColumnParallelLinear`: rank i holds **rows** i of W (a block of output features), shape
  (out/t, in), and the matching block of b. Output: Sharded(-1), or Replicated with
  `gather_output=True`.
* `RowParallelLinear`: rank i holds **columns** i of W (a block of input features), shape
  (out, in/t), and all of b, which it adds **once**, after g.

`from_linear(linear, group=group)` keeps this rank's shard of a single-device layer. Built with the
same seed, the default initialisation gives the same full matrix as `nn.Linear` (every rank
draws all of it and keeps its block)."""),
    new_code_cell("""t = 4
fig, axes = plt.subplots(1, 2, figsize=(9, 2.8))
draw_matrix(axes[0], (8, 6), split_axis=0, world_size=t, title="ColumnParallelLinear.weight", dims=("out", "in"))
draw_matrix(axes[1], (6, 8), split_axis=1, world_size=t, title="RowParallelLinear.weight", dims=("out", "in"))
plt.tight_layout()
plt.show()

torch.manual_seed(0)
full = torch.nn.Linear(6, 8)
torch.manual_seed(0)  # (one rank only: simulated ranks are threads sharing torch's default RNG)
one_rank = run_spmd(lambda comm: ColumnParallelLinear(6, 8, group=comm).weight.detach(), 1)[0]
print("with the same seed, a default ColumnParallelLinear at t=1 is nn.Linear:", torch.equal(one_rank, full.weight))"""),
    new_markdown_cell(r"""Now the Megatron MLP, column then GeLU then row, against the single-device one (this GeLU is
torch's default, the exact erf form `F.gelu(x)`, as in the torch GPT of Lesson 6; the numpy
layers of Lessons 3-4 use GPT-2's tanh approximation; both are element-wise, which is all the
split needs): the output,
the input gradient, every weight and bias gradient, and the weights after one AdamW step, in
float64 and float32, for t = 1..4 (t = 3 splits F = 12 evenly; sizes t does not divide are
split like `numpy.array_split` and are checked in the tests). Each rank compares its own
shard of the single-device result."""),
    new_code_cell("""H, FFN = 8, 12

def mlp_against_single_device(comm, dtype):
    rng = rank_rng(5, 0)  # the same model and data on every rank
    fc, proj = torch.nn.Linear(H, FFN, dtype=dtype), torch.nn.Linear(FFN, H, dtype=dtype)
    with torch.no_grad():
        for p in (*fc.parameters(), *proj.parameters()):
            p.copy_(torch.tensor(random_array(rng, p.shape)))
    fc_tp, proj_tp = ColumnParallelLinear.from_linear(fc, group=comm), RowParallelLinear.from_linear(proj, group=comm)
    x = torch.tensor(random_array(rng, (2, 3, H)), dtype=dtype)
    x_ref, x_tp = x.clone().requires_grad_(), x.clone().requires_grad_()
    y_ref, y_tp = proj(F.gelu(fc(x_ref))), proj_tp(F.gelu(fc_tp(x_tp)))
    y_ref.square().sum().backward()
    y_tp.square().sum().backward()
    lo, hi = shard_range(FFN, comm.rank, comm.world_size)
    pairs = {"Y": (y_tp, y_ref), "dX": (x_tp.grad, x_ref.grad),
             "dW1": (fc_tp.weight.grad, fc.weight.grad[lo:hi]), "db1": (fc_tp.bias.grad, fc.bias.grad[lo:hi]),
             "dW2": (proj_tp.weight.grad, proj.weight.grad[:, lo:hi]), "db2": (proj_tp.bias.grad, proj.bias.grad)}
    for model in ((fc, proj), (fc_tp, proj_tp)):
        torch.optim.AdamW([p for m in model for p in m.parameters()], lr=1e-2).step()
    pairs["W1 after AdamW"] = (fc_tp.weight, fc.weight[lo:hi])
    pairs["W2 after AdamW"] = (proj_tp.weight, proj.weight[:, lo:hi])
    for name, (got, expected) in pairs.items():
        assert_matches_reference(got, expected, name=name, rank=comm.rank)  # the tolerance policy
    # how much of the allowed error was used: error / (TOLERANCE[dtype] * max(1, max |expected|))
    return max(max_error(got, expected) / (TOLERANCE[str(dtype)[6:]] * max(1.0, expected.abs().max().item()))
               for got, expected in pairs.values())

errors = {dtype: [max(run_spmd(mlp_against_single_device, t, dtype)) for t in (1, 2, 3, 4)]
          for dtype in (torch.float64, torch.float32)}
for dtype, errs in errors.items():
    print(f"{str(dtype):14s} worst error over Y, dX, all grads and params after AdamW, as a fraction"
          f" of the tolerance, t=1..4:", "  ".join(f"{e:.1e}" for e in errs))"""),
    new_markdown_cell(r"""At t = 1 the error is exactly 0: the same operations in the same order. For t > 1 the
row-parallel layer adds t partial sums instead of one long sum, so the last bits differ,
inside the tolerance (1e-12 relative in float64, 1e-5 in float32; 1 would be the limit)
and orders of magnitude below any real bug: a missing all-reduce or a bias added t times is
off by O(1), about $10^5$ times the float32 tolerance.

## 3. One SPMD function, three backends

The `group` argument of every mapping and layer decides where the bytes go, and nothing else
does (it is required: a layer built without one raises a `TypeError` naming it):

* a `Comm` from `run_spmd` (above): simulated ranks, from-scratch collectives;
* a `torch.distributed.ProcessGroup` (e.g. `dist.group.WORLD`, or a mesh's TP group): real
  processes under `torchrun`, with PyTorch's native collectives (gloo on CPU, NCCL on GPUs);
* a `TorchComm(process_group)`: the same processes, with our own ring collectives of Lesson 2
  built from send/recv, each message counted by its meter.

`tp_from_scratch/nn/check.py` holds every layer check as a function of `group`; the tests run
them on simulated ranks and, through `torchrun`, on 2 real processes (`make test`) and on 4
(`make test-slow`), with both collective implementations, on the world group and, at 4, on
sub-groups of 2 (a dp × tp mesh):

    .venv/bin/torchrun --standalone --nproc-per-node 4 -m tp_from_scratch.nn.check          # CPU, gloo
    .venv/bin/torchrun --standalone --nproc-per-node 8 -m tp_from_scratch.nn.check --device cuda

Every rank prints `rank r: all checks passed: native equals scratch; ...`.

PyTorch has this built in as well: `parallelize_module(model, mesh, {"fc": ColwiseParallel(),
"proj": RowwiseParallel()})` turns `nn.Linear`s into DTensor-sharded ones with the same
layouts (Colwise shards the weight's dim 0, Rowwise its dim 1) and inserts the same two
all-reduces. Lesson 6 trains the GPT both ways and compares the losses. The layers here spell
out what DTensor hides: which tensor is Replicated, Sharded or Partial, and which collective
runs where."""),
    new_markdown_cell(r"""## 4. The vocabulary: embedding and cross-entropy

A vocabulary of 50k-250k tokens makes the embedding table and the LM head the largest
matrices of a small model, and the logits (B, T, V) the largest activation. Both are split by
vocabulary rows:

* `VocabParallelEmbedding`: rank i holds rows [start_i, stop_i) of the (V, H) table. It looks up
  the ids it owns, writes zeros for the others (a Partial), and g adds the t results: one real
  row plus t-1 zeros, so the result is bit-exact.
* `vocab_parallel_cross_entropy`: the loss $\log\sum_v e^{z_v} - z_y$ needs three all-reduces
  of **one number per token**: the max (so that `exp` cannot overflow), the target's logit
  (only its owner has it), and the sum of exponentials. The gradient, softmax minus one-hot,
  needs none. The full logits are never gathered.

The drawing: each row is one all-reduce, what every rank puts in (one number per token, in its
colour), what comes out on every rank, and why the loss cannot do without it. Each carries
N = B·T numbers whatever V is, so the three together cost 3·B·T floats per step against the
B·T·V of gathering the logits.

V = 13 does not divide by t = 3 or 4: the blocks are 5, 4, 4 and 4, 3, 3, 3."""),
    new_code_cell("""from tp_from_scratch.plots import draw_cross_entropy_all_reduces

draw_cross_entropy_all_reduces(t=3, tokens=4, vocab=13)
plt.show()"""),
    new_code_cell("""V, D = 13, 6

def vocabulary(comm, scale):
    rng = rank_rng(7, 0)
    table = torch.nn.Embedding.from_pretrained(torch.tensor(random_array(rng, (V, D))), freeze=False)
    ids = torch.tensor(rng.integers(0, V, size=(4, 5)))
    emb = VocabParallelEmbedding.from_embedding(table, group=comm)
    assert_matches_reference(emb(ids), table(ids), name="embedding", rank=comm.rank, exact=True)

    logits = scale * torch.tensor(random_array(rng, (4, 5, V)))           # (B, T, V)
    lo, hi = shard_range(V, comm.rank, comm.world_size)
    local = logits[..., lo:hi].clone().requires_grad_()                   # (B, T, V/t)
    full = logits.clone().requires_grad_()
    loss_ref = F.cross_entropy(full.reshape(-1, V), ids.reshape(-1))
    loss_ref.backward()
    loss = vocab_parallel_cross_entropy(comm, local, ids, vocab_start=lo)
    loss.backward()
    assert_matches_reference(loss, loss_ref, name="loss", rank=comm.rank)
    assert_matches_reference(local.grad, full.grad[..., lo:hi], name="dlogits", rank=comm.rank)
    return hi - lo, loss.item(), loss_ref.item()

for t in (1, 2, 3, 4):
    for scale in (1.0, 1000.0):
        results = run_spmd(vocabulary, t, scale)
        print(f"t={t} logits x{scale:<6g} blocks {[r[0] for r in results]}: loss {results[0][1]:.6f} "
              f"(F.cross_entropy {results[0][2]:.6f})")"""),
    new_markdown_cell(r"""With logits of size 1000, $e^{1000}$ is infinite in any floating-point type; subtracting the
global max first keeps every exponent $\le 0$. Now the price of gathering instead: the meter
counts the bytes each rank sends for one loss, ours against "all-gather the logits, then
`F.cross_entropy`", as the vocabulary grows."""),
    new_code_cell("""def bytes_sent(comm, vocab, gather):
    rng = rank_rng(8, 0)
    logits = torch.tensor(random_array(rng, (4, 8, vocab)))               # N = 32 tokens
    target = torch.tensor(rng.integers(0, vocab, size=(4, 8)))
    lo, hi = shard_range(vocab, comm.rank, comm.world_size)
    local = logits[..., lo:hi].clone().requires_grad_()
    comm.meter.reset()
    if gather:
        full = gather_from_tp_region(comm, local)                         # (B, T, V) on every rank
        loss = F.cross_entropy(full.reshape(-1, vocab), target.reshape(-1))
    else:
        loss = vocab_parallel_cross_entropy(comm, local, target, vocab_start=lo)
    loss.backward()
    return comm.meter.bytes_sent

t, vocabs = 4, [16, 64, 256, 1024, 4096]
ours = [run_spmd(bytes_sent, t, v, False)[0] for v in vocabs]
gathered = [run_spmd(bytes_sent, t, v, True)[0] for v in vocabs]
fig, ax = plt.subplots(figsize=(6, 3.2))
ax.loglog(vocabs, gathered, "o-", color=device_color(1), label="all-gather the logits")
ax.loglog(vocabs, ours, "o-", color=device_color(0), label="vocab_parallel_cross_entropy")
ax.set_xlabel("vocabulary size V"); ax.set_ylabel("bytes sent by rank 0")
ax.set_title(f"one loss, t={t}, N=32 tokens, float64", fontsize=10); ax.legend(fontsize=8)
plt.tight_layout(); plt.show()
for v, a, b in zip(vocabs, ours, gathered):
    print(f"V={v:5d}: ours {a:6d} B (3 all-reduces of N numbers)   gathered {b:8d} B")"""),
    new_markdown_cell(r"""## 5. Dropout that knows the layout

A **Replicated** activation (the residual stream after g) is the same tensor on every rank,
so its dropout mask must be the same too, or the replicas silently drift apart. A **Sharded**
activation (attention probabilities of this rank's heads, the MLP's hidden block) is different
data on each rank and needs independent masks. `TensorParallelRNG(seed, group=group)` holds two
explicit `torch.Generator`s, `replicated` (seeded by the seed) and `sharded` (seeded by the seed
and the rank), and nothing global is touched. (Megatron-LM swaps a second CUDA RNG state in
and out with a context manager instead.)"""),
    new_code_cell("""def masks(comm):
    rng = TensorParallelRNG(seed=1234, group=comm)
    ones = torch.ones(6, 16)
    return (rng.dropout(ones, 0.5, sharded=False) != 0, rng.dropout(ones, 0.5, sharded=True) != 0)

t = 4
per_rank = run_spmd(masks, t)
fig, axes = plt.subplots(2, t, figsize=(10, 3.2))
for rank, (replicated, sharded) in enumerate(per_rank):
    for row, (mask, kind) in enumerate(((replicated, "replicated"), (sharded, "sharded"))):
        axes[row][rank].imshow(mask, cmap=plt.matplotlib.colors.ListedColormap(["white", device_color(rank)]))
        axes[row][rank].set_xticks([]); axes[row][rank].set_yticks([])
        axes[row][rank].set_title(f"rank {rank}, {kind}", fontsize=9)
fig.suptitle("dropout masks (coloured = kept): identical when replicated, independent when sharded", fontsize=10)
plt.tight_layout(); plt.show()
print("replicated masks identical on all ranks:", all(torch.equal(r[0], per_rank[0][0]) for r in per_rank))
print("sharded masks all different:", len({tuple(r[1].flatten().tolist()) for r in per_rank}) == t)"""),
    new_markdown_cell(r"""## Your turn: exercises 5 and 6

* `exercises/ex05a_autograd_mappings.py`: write the four mappings' forward and backward, then
  `from_linear` and `forward` of both parallel linear layers, using your mappings.
* `exercises/ex05b_vocab_parallel_cross_entropy.py`: the loss from this rank's block of logits,
  with its gradient, and no gathering.

        make grade                    # or: .venv/bin/python -m pytest exercises -m ex05a -x (ex05b)

The graders run your code on 1-4 simulated ranks against `torch.nn.Linear` and
`F.cross_entropy` (outputs, every gradient, the weights after an SGD step) and read the meter:
an all-reduce in the wrong direction, logits of size 1000 without the max subtraction, or a
gather of the full logits fails even when the small cases come out right. They also check that
backward leaves the incoming gradient alone and that `from_linear` copies its shard (after an
SGD step on the parallel layer, the source `nn.Linear` must be unchanged). At t = 1 you may skip
a collective (Megatron-LM does: a sum over one rank is its input); collectives are counted only
for t > 1. Once your exercise 2 passes, `make grade COLLECTIVES=mine` runs these graders (and
those of exercises 3 and 4) on your own ring collectives.

**Summary.** f: Replicated in, identity forward, all-reduce backward. g: Partial in,
all-reduce forward, identity backward. Column-parallel: f, then $XW_i^\top$ → Sharded(-1).
Row-parallel: Sharded(-1) in, $X_iW_i^\top$ → Partial, g → Replicated, + b once. Vocabulary:
rows split, Partial lookups summed by g; the loss needs three all-reduces of N numbers.
Next, Lesson 6 puts these layers into a GPT and trains it under `torchrun`."""),
    new_code_cell("""print(f"lesson executed in {time.perf_counter() - LESSON_START:.1f} s")"""),
]

write_notebook(cells, HERE.parent / NAME)
