"""Generate lessons/01_split_matmul.ipynb (without outputs; `make lessons` executes it).

    .venv/bin/python lessons/src/01_split_matmul.py
    .venv/bin/jupyter nbconvert --to notebook --execute --inplace lessons/01_split_matmul.ipynb
"""
from pathlib import Path

from nbformat.v4 import new_code_cell, new_markdown_cell
from lesson_notebook import write_notebook

OUT = Path(__file__).resolve().parent.parent / "01_split_matmul.ipynb"

cells = [
    new_markdown_cell(r"""# Lesson 1 (ex01): splitting a matmul by columns and by rows

Tensor parallelism (TP) cuts the weight matrices *inside one layer* across devices. Every device
runs the same program on its own piece (SPMD: single program, multiple data), and the pieces are
stitched back together by collectives over fast links such as NVLink.

At its heart a neural network is matrix multiplications, so TP starts with one question: how do
you split $Y = XW$ so that two devices each do half the work and hold half the weight? There are
exactly two natural answers, **by columns** and **by rows**, and this lesson does both.

What you will see:
1. why a single layer can outgrow one device, and where TP sits beside data, pipeline and
   general model parallelism;
2. the column split and the row split, drawn (each shard in the colour of the device holding it)
   and run, with the memory each device holds;
3. how we decide that a parallel result *equals* the single-device one: the tolerance policy,
   with the rounding differences **measured**;
4. PyTorch's own `DTensor` sharding a tensor with `Shard(0)`, running next to our `shard(..., axis=0)`;
5. exercise 1, where you write these functions yourself.

Shapes: X (B, H), W (H, F), Y (B, F), with B rows of input, H hidden, F ffn, and t devices.
The code is in `tp_from_scratch/` (`sharding.py`, `matmul.py`, `compare.py`, `plots.py`);
this notebook only calls it."""),
    new_code_cell("""import sys
from pathlib import Path
if not (Path.cwd() / "tp_from_scratch").is_dir():  # run from lessons/: make the package importable
    sys.path.insert(0, str(Path.cwd().parent))

import time
import numpy as np
import matplotlib.pyplot as plt

from tp_from_scratch.compare import TOLERANCE, assert_matches_reference, max_error
from tp_from_scratch.matmul import (column_parallel_matmul, matmul_reference, row_parallel_matmul,
                                    shard_memory, sum_partials)
from tp_from_scratch.plots import draw_matrix, draw_split_matmul, memory_bars
from tp_from_scratch.sharding import shard, unshard
from tp_from_scratch.testing import random_array, rank_rng
from tp_from_scratch.comm.launchers import run_command, torchrun_command

LESSON_START = time.perf_counter()"""),
    new_markdown_cell(r"""## 1. Why one layer can outgrow one device

Take the feed-forward block of GPT-3 (175B): hidden size H = 12288 and F = 4H = 49152. Its first
weight alone, W1 of shape (12288, 49152), holds 604 million numbers.

Training needs more than the weights. With the Adam optimizer in mixed precision, each parameter
costs **16 bytes**: the bf16 weight (2) and its bf16 gradient (2), an fp32 master copy of the
weight (4), and Adam's two fp32 moments m and v (4 + 4). (Training fully in fp32 costs the same
16 bytes: weight, gradient, m, v at 4 each.) Activations kept for the backward pass come on top.

The next cell does the arithmetic for one weight matrix, one transformer layer (12 H² parameters:
4 H² in attention, 8 H² in the MLP) and the whole model, against an 80 GB GPU."""),
    new_code_cell("""GB = 1e9
GPU = 80 * GB
BYTES = {"bf16 weights": 2, "bf16 grads": 2, "fp32 master weights": 4, "Adam m and v (fp32)": 8}

def training_bytes(n_params):
    \"\"\"{part: bytes} to train n_params with Adam in mixed precision (16 bytes per parameter).\"\"\"
    return {part: n_params * b for part, b in BYTES.items()}

H = 12288
w1 = H * 4 * H
print(f"W1 ({H}, {4 * H}): {w1 / 1e6:.0f} M parameters = {w1 * 2 / GB:.2f} GB in bf16, {w1 * 4 / GB:.2f} GB in fp32")
print(f"  ... to train it (16 B/param):            {sum(training_bytes(w1).values()) / GB:6.1f} GB")
print(f"one GPT-3 layer (12 H^2 = {12 * H * H / 1e9:.2f} B params): {sum(training_bytes(12 * H * H).values()) / GB:6.1f} GB")
print(f"GPT-3, 96 layers:                          {sum(training_bytes(96 * 12 * H * H).values()) / GB:6.0f} GB"
      f" = {sum(training_bytes(96 * 12 * H * H).values()) / GPU:.0f} GPUs of 80 GB, before any activation")

H_big = 25600  # the hidden size of the trillion-parameter GPT in the Megatron-LM scaling study
layer_big = 12 * H_big * H_big
print(f"\\none layer at H = {H_big} ({layer_big / 1e9:.2f} B params): {sum(training_bytes(layer_big).values()) / GB:6.1f} GB"
      f" > {GPU / GB:.0f} GB: this single layer does not fit on one GPU")
print(f"the same layer with TP = 8, per GPU:         {sum(training_bytes(layer_big / 8).values()) / GB:6.1f} GB")"""),
    new_code_cell("""setups = {
    "GPT-3 layer\\n(H=12288)": 12 * H * H,
    "layer at\\nH=25600": layer_big,
    "same layer,\\nTP=8, per GPU": layer_big / 8,
}
parts = {part: [training_bytes(n)[part] for n in setups.values()] for part in BYTES}
fig, ax = plt.subplots(figsize=(7, 3.6))
memory_bars(ax, parts, list(setups), capacity=GPU, capacity_label="one 80 GB GPU", unit="GB",
            title="Training state of ONE transformer layer (Adam, mixed precision), activations not included")
plt.show()"""),
    new_markdown_cell(r"""A model that does not fit can be split in several ways. Most of those 16 bytes per parameter
are gradients and optimizer state, and those can be sharded *without splitting any matmul*
(ZeRO/FSDP, last row below): even this big layer trains on 80 GB devices that way, each gathering
the layer's weights just before it runs. What such sharding does not cut is a layer's activations
and the time of its matmuls; cutting the layer's tensors themselves does.

| strategy | what is split | each device holds | talks | reach for it when |
|---|---|---|---|---|
| **data parallelism** | the *data*: each device gets different examples | the whole model (replicated) | one all-reduce of the gradients per step | the model fits on one device: the default (PyTorch `DistributedDataParallel`) |
| **model parallelism** (general) | the *model*, in any way | a part of the model | depends on the cut | the umbrella term: pipeline and tensor parallelism are two kinds of it |
| **pipeline parallelism** | the network *by depth*: layers 0-11 on GPU 0, 12-23 on GPU 1, ... | whole layers | activations between neighbouring stages | the model does not fit but each layer does; stages wait on each other (*pipeline bubbles*) |
| **tensor parallelism** | *individual tensors inside a layer* | a slice of every weight | collectives inside every layer, forward and backward | one layer's activations or matmuls are too big or too slow for a device; fast links (NVLink in a node); latency |
| **ZeRO / FSDP** (sharded data parallelism) | the *training state*: weights, gradients, optimizer moments, 1/t each | 1/t of the 16 B/parameter; whole layers gathered just in time | an all-gather of each layer's weights (forward and backward) and a reduce-scatter of its gradients | the model's state does not fit, but one layer's does; no matmul is split |

Tensor parallelism is a specific kind of model parallelism: it fragments the tensors of a single
layer. Its devices work on the *same* layer at the *same* time, so there is no bubble, and the
time for one token through the network drops (inference latency) — pipeline parallelism cannot do
that, because the stages run one after another. The price is bandwidth: TP exchanges activations
in every layer, twice per layer forward and twice backward for a transformer. That is why it lives
inside a node, over NVLink (hundreds of GB/s), and across nodes one uses data or pipeline
parallelism. Llama 3, for example, was trained with TP = 8 inside each 8-GPU server, combined with
pipeline, context and data parallelism across servers; frameworks such as NVIDIA Megatron-LM
implement the same scheme, which this course builds from scratch.

So when the model's training state is the only thing that does not fit, data parallelism with
ZeRO/FSDP is simpler and communicates less than TP. TP is used anyway, alongside it, for three
reasons: **activation memory** (between f and g every device holds 1/t of each activation, which
state sharding never reduces), the **batch-size limit** of pure data parallelism (every device
needs examples of its own, and the global batch cannot grow without hurting convergence), and
**inference latency** (one token's layers run on t devices at once)."""),
    new_markdown_cell(r"""## 2. Splitting Y = X W by columns

Cut W into t **column blocks**, $W = [W_0\ W_1\ \dots\ W_{t-1}]$, each (H, F/t). Then
$$ X W = [X W_0\ \ X W_1\ \dots\ X W_{t-1}] . $$
Device i holds all of X (Replicated) and $W_i$, computes $Y_i = X W_i$, a column block of Y, and
needs nobody else: W is (H, F/t) and Y is (B, F/t) on each device, both Sharded along their
last axis (the course writes every shard's shape this way, with /t on the cut axis). Putting Y together again is a concatenation (the collective
*all-gather*, Lesson 2). Below: what each device holds and computes; every colour is one device."""),
    new_code_cell("""fig = draw_split_matmul("column", world_size=2, shape=(4, 8, 12))
plt.show()"""),
    new_markdown_cell(r"""Now with numbers: t = 4 simulated devices, one Python list entry per device. Each block and the
whole product are checked against the single-device `X @ W` with `assert_matches_reference`, the
one comparison helper of the course (its policy is section 4)."""),
    new_code_cell("""B, H, F, t = 8, 256, 512, 4
rng = rank_rng(seed=1)
x = random_array(rng, (B, H))               # (B, H), float64
w = random_array(rng, (H, F))               # (H, F)
y = matmul_reference(x, w)                  # (B, F): the single-device reference

w_blocks = shard(w, t, axis=1)              # t blocks (H, F/t): device i holds w_blocks[i]
y_blocks = column_parallel_matmul(x, w_blocks)   # t blocks (B, F/t): X @ W_i on device i
for i, (got, want) in enumerate(zip(y_blocks, shard(y, t, axis=1))):
    assert_matches_reference(got, want, name="column block of Y", rank=i)
y_col = unshard(y_blocks, axis=1)           # concatenate the blocks: (B, F)
assert_matches_reference(y_col, y, name="column-parallel Y")
print("W block shapes:", [b.shape for b in w_blocks], " Y block shapes:", [b.shape for b in y_blocks])
print(f"column-parallel Y matches the reference; largest error {max_error(y_col, y):.1e}")"""),
    new_markdown_cell(r"""## 3. Splitting Y = X W by rows

Cut W into t **row blocks** $W_i$ of shape (H/t, F), and X into the matching **column blocks**
$X_i$ of shape (B, H/t). Block matrix multiplication gives
$$ X W = X_0 W_0 + X_1 W_1 + \dots + X_{t-1} W_{t-1} . $$
Device i computes $X_i W_i$: a matrix of the *full* shape (B, F), but only a **partial sum** of Y
(X is (B, H/t), W is (H/t, F), Y is **Partial**). Adding the t partial sums gives Y: on real devices that
is the collective *all-reduce*, which leaves the sum on every device."""),
    new_code_cell("""fig = draw_split_matmul("row", world_size=2, shape=(4, 8, 12))
plt.show()"""),
    new_code_cell("""x_blocks = shard(x, t, axis=1)              # t blocks (B, H/t)
w_rows = shard(w, t, axis=0)                # t blocks (H/t, F)
partials = row_parallel_matmul(x_blocks, w_rows)   # t partial sums, each (B, F)
y_row = sum_partials(partials)              # what an all-reduce (sum) gives every device
assert_matches_reference(y_row, y, name="row-parallel Y")
print("partial sum shapes:", [p.shape for p in partials])
print(f"row-parallel Y matches the reference; largest error {max_error(y_row, y):.1e}")

# A partial sum on its own is NOT Y: forgetting the all-reduce is caught, with a message that
# names the tensor, the device, the error and the tolerance.
try:
    assert_matches_reference(partials[0], y, name="Y without the all-reduce", rank=0)
except AssertionError as error:
    print("caught:", error)"""),
    new_markdown_cell(r"""### Memory per device

Which tensors does each device hold? Take float32, H = 1024, F = 4096, t = 4, and B = 2048 rows
of input (in a transformer the rows are all the tokens of a batch, e.g. 2 sequences of 1024):
* column split: all of X (Replicated), a quarter of W, a quarter of Y (until it is gathered);
* row split: a quarter of X, a quarter of W, but a **full-size** partial Y.

Either way the weight is divided by t: that is what TP is for. The activations are another story:
the column split needs the whole input on every device, the row split produces a whole-size
output on every device. Lesson 3 puts a column split *before* a row split: the first one's
column blocks are exactly the second one's input blocks, so nothing is gathered in between and one
all-reduce finishes the pair."""),
    new_code_cell("""B_m, H_m, F_m, t_m = 2048, 1024, 4096, 4
itemsize = np.dtype(np.float32).itemsize
held = {  # tensor -> shape on one device, for each layout
    "single device": {"X": (B_m, H_m), "W": (H_m, F_m), "Y": (B_m, F_m)},
    "column split":  {"X": (B_m, H_m), "W": (H_m, F_m // t_m), "Y": (B_m, F_m // t_m)},
    "row split":     {"X": (B_m, H_m // t_m), "W": (H_m // t_m, F_m), "Y (partial)": (B_m, F_m)},
}
print(f"{'layout':<14} {'X':>20} {'W':>20} {'Y':>20} {'total per device':>18}")
for layout, shapes in held.items():
    cells = [f"{str(s):>12} {shard_memory([s], itemsize) / 2**20:5.1f} MiB" for s in shapes.values()]
    total = shard_memory(list(shapes.values()), itemsize) / 2**20
    print(f"{layout:<14} {cells[0]:>20} {cells[1]:>20} {cells[2]:>20} {total:>14.1f} MiB")

parts = {name: [shard_memory([list(shapes.values())[k]], itemsize) for shapes in held.values()]
         for k, name in enumerate(["X", "W", "Y"])}
fig, ax = plt.subplots(figsize=(6, 3.2))
memory_bars(ax, parts, list(held), unit="MiB", title=f"float32 memory on one device (t = {t_m})")
plt.show()"""),
    new_markdown_cell(r"""## 4. When is a parallel result "equal"? The tolerance policy

Floating-point addition is not associative: $(a + b) + c$ and $a + (b + c)$ can differ in the last
bit. A parallel computation that adds the same numbers in another order is *correct* and still not
bit-identical. So `tp_from_scratch.compare.assert_matches_reference` applies one documented policy:

* **bit-exact** (`exact=True`) where the arithmetic is the same: moving data (shard, unshard,
  gather, broadcast), element-wise functions applied to a shard, maxima — and any computation on
  **integer-valued** data, because small integers add exactly in every order;
* otherwise a **tight bound that only allows a different summation order**:
  $\max |got - expected| \le \mathrm{tol}[dtype] \cdot \max(1, \max |expected|)$, with
  tol = **1e-12 for float64** and **1e-5 for float32** (1e-2 float16, 5e-2 bfloat16).
  The bound is relative to the *largest* reference value, not element by element: an element
  that cancels to almost 0 still carries the rounding error of its large terms. The bounds are
  about 4500 units of roundoff for float64 (eps ≈ 2.2e-16) and about 80 for float32
  (eps ≈ 1.2e-7): enough for reordered sums of thousands of terms, and orders of magnitude below
  a real bug (a forgotten all-reduce is off by O(1), as section 3 showed).
* **depth and training steps** make the roundoff grow, by a stated rule
  (`compare.tolerance(dtype, layers=L, steps=n)`): the bound times L (each layer adds its own
  reordered sums) times (1 + n) (each optimizer step feeds the weights' error into the next
  gradient). Weights after **AdamW** steps also get a factor lr/eps: AdamW divides by the
  gradient's own size, so a roundoff error on a gradient entry near 0 becomes a weight error up
  to lr/eps times larger (`compare.py`'s docstring derives it, with the case that showed it).

Shapes and dtypes are compared exactly first, with no broadcasting and no casting.

The row split changes the summation order by design. Even the **column split** is not promised
to be bit-exact on float data: numpy hands a narrower matrix to its BLAS library, which may pick
another kernel with another blocking of each dot product (the appendix at the end measures it on
this machine). So float results are compared under the bound, and **integer-valued** data, exact
in every order and with every kernel, is where the graders demand every bit (`exact=True`)."""),
    new_markdown_cell(r"""## 5. The same idea in PyTorch: `DTensor` and `Shard(0)`

PyTorch ships tensor sharding natively as **DTensor** (distributed tensor). This is the example
PyTorch's own DTensor documentation starts from; it cuts a 1024 x 1024 tensor into two row
blocks of (512, 1024), one per GPU:

```python
mesh = init_device_mesh("cuda", (2,))             # a 1-D device mesh across 2 GPUs
local_tensor = torch.randn(1024, 1024)
distributed_tensor = distribute_tensor(local_tensor, mesh, [Shard(0)])   # row-wise: (512, 1024) each
print(f"Global shape: {distributed_tensor.shape}, Local shape: {distributed_tensor.to_local().shape}")
```

DTensor's vocabulary is ours: `Shard(d)` is `shard(x, t, axis=d)`, `Replicate()` is a full copy on
every device (X in the column split), and `Partial()` is a full-shape partial sum awaiting an
all-reduce (Y in the row split).

`tp_from_scratch/demos/dtensor_shard.py` runs exactly this under `torchrun` with 2 processes, on a
`"cpu"` mesh (the gloo backend) instead of `"cuda"`, and each rank checks **bit-exactly** that its
local shard equals our `shard(x, 2, axis=0)[rank]`. One detail: each rank makes its *own* random
tensor, yet all shards come from rank 0's: `distribute_tensor` scatters the data of
`src_data_rank=0`. The cell launches it through `tp_from_scratch.comm.launchers` (a free port, and a
timeout that kills the whole job rather than hang)."""),
    new_code_cell("""cmd = torchrun_command(2, "tp_from_scratch.demos.dtensor_shard")
print("$ .venv/bin/torchrun", " ".join(cmd[1:]), "\\n")
proc = run_command(cmd, timeout=120)
print(proc.stdout)
assert proc.returncode == 0 and proc.stdout.count("bit-exactly") == 2, "the DTensor demo failed"

fig, axes = plt.subplots(1, 2, figsize=(6, 2.6))
draw_matrix(axes[0], (1024, 1024), 0, 2, "Shard(0) = shard(x, 2, axis=0)", dims=("rows", "cols"))
draw_matrix(axes[1], (1024, 1024), 1, 2, "Shard(1) = shard(x, 2, axis=1)", dims=("rows", "cols"))
plt.show()"""),
    new_markdown_cell(r"""One convention to keep in mind for later lessons: when t does **not** divide the size, there is
more than one way to cut. DTensor's `Shard` splits like `torch.chunk` (its source,
`torch/distributed/tensor/placement_types.py`, says so): blocks of ceil(size / t), so the last
ranks get less, or nothing (`Shard.local_shard_size_and_offset` below is DTensor's own answer).
Our `shard(..., even=False)` splits like `numpy.array_split`: sizes
differ by at most one. Both are fine; two programs exchanging shards must simply agree."""),
    new_code_cell("""import torch
from torch.distributed.tensor import Shard

for size, t_ in [(5, 4), (10, 4), (1024, 2)]:
    # DTensor's own answer: (local size, offset) of each rank's block
    dtensor = [Shard.local_shard_size_and_offset(size, t_, rank)[0] for rank in range(t_)]
    chunk = [len(c) for c in torch.chunk(torch.arange(size), t_)]   # may return fewer than t blocks
    assert dtensor == chunk + [0] * (t_ - len(chunk))
    ours = [len(s) for s in shard(np.arange(size), t_, axis=0, even=False)]
    print(f"{size:>5} over {t_}:  DTensor Shard(0) {str(dtensor):<14} shard(..., even=False) {ours}")"""),
    new_markdown_cell(r"""## 6. Your turn: exercise 1

Open `exercises/ex01_split_matmul.py`. It holds stubs of the five functions this lesson used:
`shard`, `unshard`, `column_parallel_matmul`, `row_parallel_matmul` and `sum_partials`; each raises
`NotImplementedError("Exercise 1 (...): see lessons/01_split_matmul.ipynb")` until you write it.
Then grade your work:

```bash
make grade                                    # a per-exercise summary: passed / not yet / failing
.venv/bin/python -m pytest exercises -m ex01  # exercise 1 only, with full pytest output
```

The graders compare your functions against the single-device reference on fresh random data,
with `assert_matches_reference`: exact where the arithmetic allows it, under the bound otherwise.
Watch out for the classic mistakes: the wrong split axis, blocks concatenated in the wrong order,
partial sums never added.

**Summary.** Column split: X Replicated, W `Sharded(1)`, Y `Sharded(1)` → gather. Row split:
X `Sharded(1)`, W `Sharded(0)`, Y Partial → all-reduce. In both, each device holds 1/t of W.
Lesson 2 builds the two collectives this needs, all-gather and all-reduce, from `send` and `recv`."""),
    new_markdown_cell(r"""## Appendix: is the column split bit-exact on this machine?

The row split changes the summation order by design. But is the **column split** bit-exact? Each
element of $Y_i$ is the same dot product as in the full product... yet numpy hands a narrower
matrix to its BLAS library, which may pick a different kernel with a different blocking of the
sum. Let us *measure* it over a few shapes, on gaussian data and on integer-valued data."""),
    new_code_cell("""try:
    blas = np.show_config(mode="dicts")["Build Dependencies"]["blas"]
    blas = f"{blas['name']} {blas.get('version', '')}"
except Exception:  # older numpy: the report is only informative
    blas = "unknown BLAS"
print("tolerance per dtype:", TOLERANCE, "| BLAS:", blas)

shapes = [(8, 64, 96, 4), (3, 100, 10, 2), (16, 256, 256, 2), (8, 1024, 4096, 4), (32, 512, 512, 4)]
print(f"\\n{'dtype':<8} {'(B, H, F, t)':<20} {'column split':<36} {'row split: error / bound':<26}")
measured = []
for dtype in (np.float64, np.float32):
    for (b_, h_, f_, t_) in shapes:
        r = rank_rng(seed=7)
        xg, wg = random_array(r, (b_, h_), dtype), random_array(r, (h_, f_), dtype)
        yg = matmul_reference(xg, wg)
        col = unshard(column_parallel_matmul(xg, shard(wg, t_, axis=1)), axis=1)
        row = sum_partials(row_parallel_matmul(shard(xg, t_, axis=1), shard(wg, t_, axis=0)))
        assert_matches_reference(col, yg, name="column-parallel Y (gaussian)")   # under the bound
        assert_matches_reference(row, yg, name="row-parallel Y (gaussian)")
        scale = max(1.0, float(np.abs(yg).max()))
        differ = np.count_nonzero(col != yg)
        col_text = "bit-exact" if differ == 0 else f"{differ}/{yg.size} elements differ, {max_error(col, yg):.1e}"
        bound = TOLERANCE[np.dtype(dtype).name] * scale
        measured.append((np.dtype(dtype).name, (b_, h_, f_, t_), max_error(col, yg) / scale,
                         max_error(row, yg) / scale))
        print(f"{np.dtype(dtype).name:<8} {str((b_, h_, f_, t_)):<20} {col_text:<36} "
              f"{max_error(row, yg):.1e} / {bound:.1e}")
n_col_differ = sum(1 for m in measured if m[2] > 0)
print(f"\\non this machine, {n_col_differ} of {len(measured)} column splits of gaussian data were NOT bit-exact")"""),
    new_markdown_cell(r"""Where the table says "elements differ" for the column split, the very same dot products came out
with different last bits, only because the BLAS library chose another kernel for a narrower
matrix. Which shapes do this depends on the BLAS and the CPU, so on your machine the list may
differ (or be empty): the policy cannot promise bit-exactness for a float matmul, and so **even the
column split is compared under the bound** on gaussian data.

Integer-valued data removes the question: products and sums of small integers are exact in
floating point, in any order, with any kernel. On such data both splits must be **bit-exact**, and
the graders use this to check with `exact=True`:"""),
    new_code_cell("""for dtype in (np.float64, np.float32):
    for (b_, h_, f_, t_) in shapes:
        r = rank_rng(seed=7)
        xi = random_array(r, (b_, h_), dtype, integer=True)   # small integers -4..4, stored as floats
        wi = random_array(r, (h_, f_), dtype, integer=True)
        yi = matmul_reference(xi, wi)
        col = unshard(column_parallel_matmul(xi, shard(wi, t_, axis=1)), axis=1)
        row = sum_partials(row_parallel_matmul(shard(xi, t_, axis=1), shard(wi, t_, axis=0)))
        assert_matches_reference(col, yi, name="column-parallel Y (integer data)", exact=True)
        assert_matches_reference(row, yi, name="row-parallel Y (integer data)", exact=True)
print("integer-valued data: both splits bit-exact for every shape and dtype above")"""),
    new_code_cell("""fig, ax = plt.subplots(figsize=(8, 3.6))
labels = [f"{d.replace('float', 'f')} {s[1]}x{s[2]}" for d, s, _, _ in measured]  # dtype H x F
pos = np.arange(len(measured))
floor = 1e-18  # a bit-exact result (error 0) drawn at the floor of the log scale
ax.bar(pos - 0.2, [max(m[2], floor) for m in measured], 0.4, label="column split", color="#0072b2")
ax.bar(pos + 0.2, [max(m[3], floor) for m in measured], 0.4, label="row split", color="#e69f00")
for dtype_name, style in (("float64", "-"), ("float32", "--")):
    ax.axhline(TOLERANCE[dtype_name], color="red", linestyle=style, linewidth=1, label=f"bound {dtype_name}")
ax.set_yscale("log"); ax.set_ylim(floor / 2, 1e-3)
ax.set_xticks(pos, labels, fontsize=7, rotation=30, ha="right")
ax.set_ylabel("largest error / scale")
ax.set_title("Measured error relative to the largest |Y|, against the per-dtype bound (bars at 1e-18: bit-exact)",
             fontsize=9)
ax.legend(fontsize=7, ncol=2)
plt.show()"""),
    new_code_cell("""print(f"lesson executed in {time.perf_counter() - LESSON_START:.1f} s")"""),
]

write_notebook(cells, OUT)
