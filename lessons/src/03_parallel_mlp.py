"""Generate lessons/03_parallel_mlp.ipynb (without outputs; `make lessons` executes it).

    .venv/bin/python lessons/src/03_parallel_mlp.py
    .venv/bin/jupyter nbconvert --to notebook --execute --inplace lessons/03_parallel_mlp.ipynb
"""
from pathlib import Path

from nbformat.v4 import new_code_cell, new_markdown_cell
from lesson_notebook import write_notebook

HERE = Path(__file__).resolve().parent

cells = [
    new_markdown_cell(r"""# Lesson 3 (ex03): a tensor-parallel MLP, forward and backward

Lesson 1 split one matmul by columns and by rows; Lesson 2 built `all_reduce` from `send` and
`recv`. Here the two meet: Megatron-LM's tensor-parallel MLP, written in numpy with an explicit
backward pass, so that every collective is visible.

What you will see:
1. why **column-parallel, then GeLU, then row-parallel** needs only **one all-reduce** each way;
2. Megatron's conjugate pair **f** and **g**, and the derivation of their backward passes;
3. the parallel MLP on t simulated ranks, checked against the single-device MLP for the output
   **and every gradient**;
4. the communication table from the meter, next to the formula.

Notation (the JAX scaling book's, in words). A tensor in a TP region is
* **Replicated**: every rank holds all of it;
* **Sharded(dim)**: rank i holds the i-th contiguous block along `dim`;
* **Partial**: every rank holds a full-shape addend; the tensor is the sum over ranks.

Shapes: B batch, T sequence, H hidden, F ffn (often 4H), t the TP degree. The code is in
`tp_from_scratch/layers/` (`mappings.py`, `linear.py`, `mlp.py`); this notebook only calls it."""),
    new_code_cell("""import sys
import time
from pathlib import Path
LESSON_START = time.perf_counter()
if not (Path.cwd() / "tp_from_scratch").is_dir():  # run from lessons/: make the package importable
    sys.path.insert(0, str(Path.cwd().parent))

import numpy as np
import matplotlib.pyplot as plt

from tp_from_scratch.comm import run_spmd
from tp_from_scratch.compare import assert_all_match, assert_matches_reference, max_error
from tp_from_scratch.layers import reference
from tp_from_scratch.layers.linear import (column_parallel_linear_forward, row_parallel_linear_forward,
                                          shard_column_parallel_linear, shard_row_parallel_linear)
from tp_from_scratch.layers.mlp import (gather_mlp_params, parallel_mlp_backward, parallel_mlp_forward,
                                       shard_mlp_params)
from tp_from_scratch.sharding import shard, unshard
from tp_from_scratch.testing import random_array, rank_rng

B, T, H, F = 2, 6, 12, 48   # F = 4H; B*T*H = 144 and F = 48 split evenly for t in 1, 2, 3, 4, 6, 8
rng = rank_rng(3)
x = random_array(rng, (B, T, H))           # (B, T, H)
params = reference.init_mlp_params(rng, H, F)
y_ref, cache_ref = reference.mlp_forward(x, params)
print({k: v.shape for k, v in params.items()}, "->", y_ref.shape)"""),
    new_markdown_cell(r"""## 1. The single-device MLP, and where to cut it

$$ y = \mathrm{gelu}(x W_1 + b_1)\, W_2 + b_2, \qquad W_1: (H, F),\quad W_2: (F, H). $$

In the code the parameters carry the names of the torch GPT of Lessons 5 and 6: $W_1$ is
`fc.weight`, $b_1$ `fc.bias`, $W_2$ `proj.weight`, $b_2$ `proj.bias`. numpy keeps the math layout
$W$ (in, out) and computes `x @ W + b`; torch's `nn.Linear` stores the transpose, (out, in)
(`reference.params_to_torch` / `params_from_torch` convert). The GeLU is GPT-2's tanh approximation
("gelu_new", `F.gelu(x, approximate="tanh")`), while the torch GPT of Lesson 6 uses torch's default,
the exact erf form $\tfrac12 x\,(1 + \mathrm{erf}(x/\sqrt2))$. The two differ by up to 4.7e-4, so
compare a numpy block with a torch block only when both use the same form.

Cut $W_1$ by **columns**, $W_1 = [W_1^{(0)} \dots W_1^{(t-1)}]$ (written `W1[H, F_t]`): rank $i$
computes $h^{(i)} = x W_1^{(i)} + b_1^{(i)}$, column block $i$ of $h$, from a Replicated $x$ and
without talking to anyone. The next step is GeLU, and GeLU is **element-wise**: the GeLU of a column
block *is* the column block of the GeLU. So rank $i$ keeps going, still alone:
$a^{(i)} = \mathrm{gelu}(h^{(i)})$, `Sharded(F)`.

Now $W_2$ is cut by **rows** (`W2[F_t, H]`), which is exactly what a column-sharded input needs:
$$ a W_2 = \sum_i a^{(i)} W_2^{(i)} . $$
Each rank holds one term, a **Partial** sum of shape (B, T, H). One all-reduce adds them up, then
$b_2$ is added **once** (added on every rank before the sum, it would count $t$ times).

Two other cuts would cost more:
* column-parallel twice: the second layer needs all of $a$, so an all-gather sits in between;
* row-parallel first: $h$ would be Partial, and GeLU does not distribute over a sum,
  $\mathrm{gelu}(u + v) \neq \mathrm{gelu}(u) + \mathrm{gelu}(v)$, so an all-reduce is needed
  *before* the GeLU. After it $h$ is Replicated, and the second layer faces the first choice
  again: column-parallel, whose Sharded output then needs an all-gather to become $y$, or a
  plain replicated matmul that splits nothing. Either way it costs more than one all-reduce.

The next cell checks both facts numerically."""),
    new_code_cell("""h = x @ params["fc.weight"] + params["fc.bias"]      # (B, T, F)
gelu_h, _ = reference.gelu_forward(h)
t = 4
for i, h_i in enumerate(shard(h, t, axis=-1)):       # (B, T, F/t) each
    # element-wise on a shard = the shard of the element-wise result: bit for bit
    assert_matches_reference(reference.gelu_forward(h_i)[0], shard(gelu_h, t, -1)[i], name="gelu of a shard", rank=i, exact=True)
print("gelu(column block) == column block of gelu(h), exactly, on all", t, "ranks")

partials = [x_i @ w_i for x_i, w_i in zip(shard(x, t, -1), shard(params["fc.weight"], t, 0))]  # row-parallel first
gelu_of_sum = reference.gelu_forward(sum(partials))[0]
sum_of_gelus = sum(reference.gelu_forward(p)[0] for p in partials)
print(f"but gelu(sum of partials) vs sum of gelu(partials): largest difference {max_error(sum_of_gelus, gelu_of_sum):.3f}")"""),
    new_markdown_cell(r"""## 2. Where each tensor lives

The forward pass on t = 4 ranks. Each rank is drawn in its device colour (as in every
lesson). Replicated: the rank holds the whole tensor; Sharded: only its coloured block of columns;
Partial (hatched): a full-shape addend of the tensor. The red labels are the operations between the steps; only
**g** communicates."""),
    new_code_cell("""from tp_from_scratch.plots import draw_layouts

H_, F_ = (3, 4), (3, 8)  # drawn sizes: rows B*T, columns H or F
draw_layouts([
    ("x  (B, T, H)", "Replicated", "f, @ W1_i", H_),
    ("h_i  (B, T, F/t)", "Sharded", "gelu", F_),
    ("a_i  (B, T, F/t)", "Sharded", "@ W2_i", F_),
    ("z_i  (B, T, H)", "Partial", "g:\\nall-reduce", H_),
    ("y = sum z_i + b2", "Replicated", "", H_),
], t=4, title="MLP forward: one all-reduce (g)")"""),
    new_markdown_cell(r"""And the weights, which never move: $W_1$ (`mlp.fc.weight`) is cut into column blocks, rank $i$
keeping $W_1^{(i)}$ of shape (H, F/t) and the matching $b_1^{(i)}$; $W_2$ (`mlp.proj.weight`) into
the matching row blocks (F/t, H); $b_2$ is whole on every rank. Rank $i$'s columns of $W_1$ and rows
of $W_2$ are the same F/t hidden units, which is why $h_i$ and $a_i$ never leave the rank."""),
    new_code_cell("""import matplotlib.pyplot as plt
from tp_from_scratch.plots import draw_matrix

fig, axes = plt.subplots(1, 3, figsize=(11, 2.6), gridspec_kw={"width_ratios": [12, 4, 4]})
draw_matrix(axes[0], (4, 12), 1, 4, title="W1 (H, F): rank i holds columns (H, F/t)", dims=("H", "F"))
draw_matrix(axes[1], (12, 4), 0, 4, title="W2 (F, H): rows (F/t, H)", dims=("F", "H"))
draw_matrix(axes[2], (1, 4), None, 4, title="b2 (H,): whole on every rank")
plt.tight_layout(); plt.show()"""),
    new_markdown_cell(r"""## 3. f and g, and their backward passes

Megatron names the two places where the MLP meets the rest of the model.

**f** enters the parallel region: forward, the **identity** (x is Replicated and every rank uses
all of it). Backward: rank $i$ uses $x$ only through its own column block, so the loss is
$L = \ell\big(x W_1^{(0)}, \dots, x W_1^{(t-1)}\big)$ and by the chain rule
$$ \frac{\partial L}{\partial x} = \sum_i \frac{\partial L}{\partial h^{(i)}}\, W_1^{(i)\top} . $$
Rank $i$ can only compute term $i$: the input gradient is **Partial**, and f's backward is an
**all-reduce**.

**g** leaves the parallel region: forward, an **all-reduce** $y = \sum_i z^{(i)}$. Backward:
$\partial y / \partial z^{(i)}$ is the identity for every $i$, so
$\partial L / \partial z^{(i)} = \partial L / \partial y$, which every rank already holds
(Replicated): g's backward is the **identity**.

That last step rests on the **SPMD convention** the whole course uses: every rank runs the same
program and computes the *same* loss $L$ from the same Replicated $y$ (it is one logical loss,
not t of them to be added). So $\partial L / \partial y$ is the same on every rank and nothing
has to be summed. If each rank's loss counted as a separate term, g's backward would have to
add t copies, and every gradient would come out t times too large.

At t = 1 both collectives are sums over one rank: an implementation may skip them (Megatron-LM
does) or call them; the exercise graders accept both and count collectives only for t > 1.

f and g are each other's transpose: what one does forward, the other does backward. So the MLP
costs exactly one all-reduce forward (g) and one backward (f). The remaining gradients need no
communication:

| gradient | formula on rank i | layout |
|---|---|---|
| $dW_2^{(i)}$ | $a^{(i)\top} dy$ | Sharded, like $W_2$ |
| $db_2$ | $\sum_{B,T} dy$ | Replicated: every rank computes the same full value |
| $da^{(i)}$ | $dy\, W_2^{(i)\top}$ | Sharded(F) |
| $dh^{(i)}$ | $\mathrm{gelu}'(h^{(i)}) \odot da^{(i)}$ | Sharded(F), element-wise again |
| $dW_1^{(i)}, db_1^{(i)}$ | $x^\top dh^{(i)}$, $\sum_{B,T} dh^{(i)}$ | Sharded, like $W_1$ |
| $dx$ | $\sum_i dh^{(i)} W_1^{(i)\top}$ | Partial, then **f backward: all-reduce** |"""),
    new_code_cell("""draw_layouts([
    ("dy  (B, T, H)", "Replicated", "g backward:\\nidentity;\\n@ W2_i^T", H_),
    ("da_i  (B, T, F/t)", "Sharded", "gelu'", F_),
    ("dh_i  (B, T, F/t)", "Sharded", "@ W1_i^T", F_),
    ("dx_i  (B, T, H)", "Partial", "f backward:\\nall-reduce", H_),
    ("dx", "Replicated", "", H_),
], t=4, title="MLP backward: one all-reduce (f)")"""),
    new_markdown_cell(r"""## 4. The parallel MLP on simulated ranks

`run_spmd(fn, t)` runs `fn(comm)` on t threads, one per rank, each with its own communicator.
Each rank takes its shard of the full parameters (`shard_mlp_params`), runs `parallel_mlp_forward`
and `parallel_mlp_backward` (the single-device ones are `reference.mlp_forward` / `mlp_backward`),
and returns its output, its input gradient and the gradients of its shards.
We then compare with the single-device MLP: the output and $dx$ on **every** rank, and the weight
gradients after gluing the shards back (`gather_mlp_params`; the copies of `proj.bias` must agree bit
for bit).
The tolerance is the course's one policy (`tp_from_scratch.compare`): a changed summation order
only."""),
    new_code_cell("""dy = random_array(rng, (B, T, H))
dx_ref, grads_ref = reference.mlp_backward(dy, cache_ref)

def mlp_step(comm):
    local = shard_mlp_params(params, comm.world_size, comm.rank)   # fc.weight (H, F/t), proj.weight (F/t, H), ...
    y, cache = parallel_mlp_forward(comm, x, local)
    dx, grads = parallel_mlp_backward(comm, dy, cache)
    return y, dx, grads

for t in [1, 2, 3, 4]:
    results = run_spmd(mlp_step, t)
    for rank, (y, dx, _) in enumerate(results):
        assert_matches_reference(y, y_ref, name="y", rank=rank)
        assert_matches_reference(dx, dx_ref, name="dx", rank=rank)
    assert_all_match(gather_mlp_params([grads for _, _, grads in results]), grads_ref)
    print(f"t={t}: y, dx on every rank and the gradients of {', '.join(grads_ref)} match the single-device MLP")"""),
    new_markdown_cell(r"""With integer-valued data every sum is exact in any order, so the parallel result must match
**bit for bit**: a good way to see that the only difference above is rounding. Here the row-parallel
layer on its own (the GeLU would leave the integers):"""),
    new_code_cell("""xi, wi, bi = (random_array(rng, s, integer=True) for s in [(B, T, F), (F, H), (H,)])

def row_layer(comm):
    w_shard, b = shard_row_parallel_linear(wi, bi, comm.world_size, comm.rank)
    return row_parallel_linear_forward(comm, shard(xi, comm.world_size, -1)[comm.rank], w_shard, b)[0]

for rank, y in enumerate(run_spmd(row_layer, 4)):
    assert_matches_reference(y, xi @ wi + bi, name="row-parallel y (integer data)", rank=rank, exact=True)
print("row-parallel linear on integer data: bit-exact on all 4 ranks")"""),
    new_markdown_cell(r"""## 5. What it costs: the meter against the formula

Every communicator has a `meter` that counts messages and bytes, booked under the outermost
collective in progress. The ring all-reduce (Lesson 2) of an array of N elements sends, per rank,
$$ 2\,\frac{t-1}{t}\, N \ \text{elements} $$
(exactly, when t divides N: the ring passes $t-1$ chunks in its reduce-scatter and $t-1$ in its
all-gather). The MLP all-reduces one (B, T, H) activation forward and one backward, so per rank and
per step:
$$ \text{bytes sent} = 2 \times 2\,\frac{t-1}{t}\, B T H \times \text{itemsize}. $$
Note what is *not* in the formula: F. The wide (B, T, F) hidden activation never travels."""),
    new_code_cell("""def metered_mlp_step(comm):
    local = shard_mlp_params(params, comm.world_size, comm.rank)
    comm.meter.reset()
    y, cache = parallel_mlp_forward(comm, x, local)
    forward = comm.meter.snapshot()["by_collective"]
    comm.meter.reset()
    parallel_mlp_backward(comm, dy, cache)
    return forward, comm.meter.snapshot()["by_collective"]

N, itemsize = B * T * H, x.itemsize
print(f"{'t':>2} {'direction':>9} {'all-reduces':>12} {'bytes sent (meter)':>19} {'2(t-1)/t*B*T*H*8':>17}")
measured = {}
for t in [1, 2, 3, 4, 6, 8]:
    per_rank = run_spmd(metered_mlp_step, t)
    for direction, index in (("forward", 0), ("backward", 1)):
        for rank, traffic in enumerate(r[index] for r in per_rank):
            assert set(traffic) == {"all_reduce"}, traffic          # nothing but all-reduces...
            assert traffic["all_reduce"]["calls"] == 1             # ...and exactly one
            assert traffic["all_reduce"]["bytes_sent"] == 2 * (t - 1) * N * itemsize // t, (rank, traffic)
        sent = per_rank[0][index]["all_reduce"]["bytes_sent"]
        measured[t] = measured.get(t, 0) + sent
        print(f"{t:>2} {direction:>9} {1:>12} {sent:>19} {2 * (t - 1) * N * itemsize // t:>17}")"""),
    new_code_cell("""ts = sorted(measured)
fig, ax = plt.subplots(figsize=(6, 3.2))
ax.plot(ts, [measured[t] for t in ts], "o", ms=8, label="meter (rank 0, forward + backward)")
tt = np.linspace(1, max(ts), 100)
ax.plot(tt, 2 * 2 * (tt - 1) / tt * N * itemsize, "-", label="formula 2 x 2(t-1)/t x BTH x 8")
ax.axhline(4 * N * itemsize, ls=":", c="grey", label="limit 4 x BTH x 8 bytes")
ax.set_xlabel("TP degree t"); ax.set_ylabel("bytes sent per rank per step"); ax.legend(fontsize=8)
ax.set_title("MLP communication per rank: grows towards a constant, independent of F")
plt.show()"""),
    new_markdown_cell(r"""The full table of one rank, as the meter prints it (t = 4, forward and backward):"""),
    new_code_cell("""def mlp_table(comm):
    local = shard_mlp_params(params, comm.world_size, comm.rank)
    comm.meter.reset()
    y, cache = parallel_mlp_forward(comm, x, local)
    parallel_mlp_backward(comm, dy, cache)
    return comm.meter.table()

print(run_spmd(mlp_table, 4)[0])"""),
    new_markdown_cell(r"""## 6. What it saves: memory

Each rank stores $1/t$ of $W_1$, $b_1$ and $W_2$, plus the whole (small) $b_2$, and its hidden
activations are (B, T, F/t) instead of (B, T, F)."""),
    new_code_cell("""full_bytes = sum(p.nbytes for p in params.values())
for t in [1, 2, 4, 8]:
    local = shard_mlp_params(params, t, 0)
    print(f"t={t}: rank 0 holds {sum(p.nbytes for p in local.values()):6d} of {full_bytes} parameter bytes"
          f" ({sum(p.nbytes for p in local.values()) / full_bytes:.3f}; 1/t = {1 / t:.3f})")
try:
    shard_mlp_params(params, 5, 0)
except ValueError as error:
    print("t=5:", error)"""),
    new_markdown_cell(r"""## Your turn: exercise 3

Open `exercises/ex03_parallel_mlp.py` and write `f_forward`, `f_backward`, `g_forward`,
`g_backward`, the column- and row-parallel linear layers (forward and backward) and the MLP
(`parallel_mlp_forward`, `parallel_mlp_backward`), using `all_reduce` from Lesson 2. Then

    make grade EX=ex03            # or: .venv/bin/python -m pytest exercises -m ex03 -x

The graders run your code on 1, 2, 3 and 4 simulated ranks, compare outputs and every gradient
with the single-device reference, and count your all-reduces: one too many fails even when the
numbers are right. Next: Lesson 4 splits attention by heads and assembles a transformer block.

**Summary.** x Replicated → f → column-parallel $W_1$ → `Sharded(F)` → GeLU (element-wise,
stays `Sharded(F)`) → row-parallel $W_2$ → Partial → g (all-reduce) → Replicated, $+ b_2$ once.
Backward mirrors it: g backward is the identity, f backward the all-reduce. One all-reduce of
(B, T, H) each way, $2\frac{t-1}{t}BTH$ elements sent per rank each, whatever F is."""),
    new_code_cell("""print(f"lesson executed in {time.perf_counter() - LESSON_START:.1f} s")"""),
]

write_notebook(cells, HERE.parent / "03_parallel_mlp.ipynb")
