"""Generate lessons/04_parallel_attention.ipynb (without outputs; `make lessons` executes it).

    .venv/bin/python lessons/src/04_parallel_attention.py
    .venv/bin/jupyter nbconvert --to notebook --execute --inplace lessons/04_parallel_attention.ipynb
"""
from pathlib import Path

from nbformat.v4 import new_code_cell, new_markdown_cell
from lesson_notebook import write_notebook

HERE = Path(__file__).resolve().parent

cells = [
    new_markdown_cell(r"""# Lesson 4 (ex04): attention split by heads, and the transformer block

Lesson 3 cut the MLP so that it costs one all-reduce each way. Attention gets the same treatment,
and for a simple reason: **attention heads never talk to each other**. Give each rank a group of
heads and it can run them alone, from the projections to the softmax; only the output projection,
which mixes the heads, needs an all-reduce. Then a pre-LayerNorm transformer block is two such
regions in a row: **2 all-reduces forward, 2 backward**.

What you will see:
1. which rank holds which query head and which KV head, with grouped-query attention (GQA);
2. the parallel attention on simulated ranks, against the single-device attention, outputs and
   every gradient, including the gradients of KV heads that several ranks hold a copy of;
3. the transformer block, and its communication: the meter against
   $4 \times 2\frac{t-1}{t} \times B\,T\,H$ elements per block per step.

Shapes: B batch, T sequence, H hidden, nh query heads, nkv KV heads, hs head size, t TP degree.
Layouts: **Replicated**, **Sharded(dim)**, **Partial** (Lesson 3). The code is in
`tp_from_scratch/layers/attention.py` and `block.py`."""),
    new_code_cell("""import sys
import time
from pathlib import Path
LESSON_START = time.perf_counter()
if not (Path.cwd() / "tp_from_scratch").is_dir():  # run from lessons/: make the package importable
    sys.path.insert(0, str(Path.cwd().parent))

import numpy as np
import matplotlib.pyplot as plt
from matplotlib.patches import Rectangle

from tp_from_scratch.comm import run_spmd
from tp_from_scratch.compare import assert_all_match, assert_matches_reference
from tp_from_scratch.layers import BlockConfig, reference
from tp_from_scratch.layers.attention import (gather_attention_grads, kv_heads_of_rank, parallel_attention_backward,
                                             parallel_attention_forward, shard_attention_params)
from tp_from_scratch.layers.block import (gather_block_grads, parallel_block_backward, parallel_block_forward,
                                         shard_block_params)
from tp_from_scratch.plots import device_color
from tp_from_scratch.testing import random_array, rank_rng

rng = rank_rng(4)"""),
    new_markdown_cell(r"""## 1. Heads split across ranks

Single-device attention with nh query heads of size hs:
$q = x W_q + b_q$ (B, T, nh·hs), $k = x W_k$, $v = x W_v + b_v$ (B, T, nkv·hs); head $j$ computes
$\mathrm{softmax}(q_j k_{j'}^\top/\sqrt{hs} + \text{causal mask})\, v_{j'}$ with $j' = j \,/\!/\, (nh/nkv)$,
the heads are concatenated into $o$ (B, T, nh·hs), and $y = o W_o + b_o$. In the code these are
`q.weight`, `q.bias`, `k.weight`, `v.weight`, `v.bias`, `o.weight`, `o.bias`, the names of the torch
GPT's attention (weights kept as (in, out) here, stored transposed by torch).

There is no key bias, here or in the torch GPT: it would add $q_i \cdot b_k$ to every score of
query $i$, the same number along the whole row, and softmax does not change when a constant is
added to its row. So it never changes the output, and its gradient is exactly zero (the test
`test_a_key_bias_changes_nothing_and_gets_no_gradient` checks both).

The columns of $W_q$ are grouped by head. Cut them into t contiguous groups of nh/t heads:
**column-parallel by heads**. Rank $i$ computes $q$, $k$, $v$ for its own heads only, from a
Replicated $x$ (that is f again), and runs attention on them alone: $o_i$ is Sharded by heads.
$W_o$ is cut by the matching rows, so $o_i W_o^{(i)}$ is a **Partial** sum of $y$ and
**g** (one all-reduce) finishes the job; $b_o$ is added once, after it.

Backward is Lesson 3's argument again: g backward is the identity, each rank's $dx$ covers only its
own heads (Partial), and f backward all-reduces it. **One all-reduce each way.**

**The backward of one head**, which never leaves its rank. With $S = q k^\top/\sqrt{hs}$ (masked
above the diagonal), $P = \mathrm{softmax}(S)$ row by row and $o = P v$, given $do$:
$$ dv = P^\top do, \qquad dP = do\, v^\top, \qquad
   dS_{ij} = P_{ij}\Big(dP_{ij} - \sum_{j'} P_{ij'}\, dP_{ij'}\Big), $$
$$ dq = dS\, k / \sqrt{hs}, \qquad dk = dS^\top q / \sqrt{hs} . $$
The softmax line is the Jacobian of a softmax row applied to $dP$; masked entries have
$P_{ij} = 0$ and so get no gradient. Every quantity here belongs to one head, so a rank computes
the backward of its heads alone; only $dx = dq\,W_q^\top + dk\,W_k^\top + dv\,W_v^\top$,
summed over the heads of all ranks, needs f's all-reduce. With GQA a KV head read by several query
heads receives the sum of their $dk$, $dv$ (`reference.causal_attention_backward`)."""),
    new_code_cell("""from tp_from_scratch.plots import draw_layouts

H_, QKV_ = (3, 4), (3, 8)  # drawn sizes: rows B*T, columns H or nh*hs
draw_layouts([
    ("x  (B, T, H)", "Replicated", "f, @ Wqkv_i", H_),
    ("q_i, k_i, v_i\\n(B, T, nh/t*hs)", "Sharded", "attention\\nper head", QKV_),
    ("o_i  (B, T, nh/t*hs)", "Sharded", "@ Wo_i", QKV_),
    ("o_i @ Wo_i  (B, T, H)", "Partial", "g:\\nall-reduce", H_),
    ("y = sum + bo", "Replicated", "", H_),
], t=4, title="attention forward: one all-reduce (g); backward: one (f)")"""),
    new_markdown_cell(r"""The same head, forward on top and backward underneath, each box a tensor of this rank's
head and each arrow one line of the derivation above. Read the bottom row right to left: $dy$
arrives Replicated, g's backward hands it on unchanged, and from $do$ to $dx_i$ every product uses
only this head's $q$, $k$, $v$, $P$ (kept from forward, dotted lines). The two all-reduces sit at
the edges of the dashed box: g's after the row-parallel $W_o$ in forward, and f's in backward,
which turns the Partial $dx_i$ (this rank's heads only) into the Replicated $dx$."""),
    new_code_cell("""from tp_from_scratch.plots import draw_attention_backward

draw_attention_backward(rank=0, t=2)
plt.show()"""),
    new_markdown_cell(r"""## 2. Grouped-query attention: sharded or replicated KV heads

With GQA, nh/nkv query heads share one KV head. Query heads always split evenly (t must divide nh).
The KV heads follow their query heads:
* **t divides nkv**: each rank holds nkv/t KV heads, exactly the ones its query heads read (Sharded);
* **nkv < t** (nkv dividing t): there are not enough KV heads to go round. Each rank holds a
  **copy** of the one KV head its query heads read; t/nkv neighbouring ranks share a head
  (Replicated within that group).

Each box below is a head, coloured by the rank holding it; a KV head (black outline) that two
ranks hold a copy of is drawn in both colours."""),
    new_code_cell("""def draw_heads(ax, nh, nkv, t):
    for j in range(nh):  # query head j lives on rank j // (nh / t)
        ax.add_patch(Rectangle((j, 1.3), 0.9, 0.9, color=device_color(j // (nh // t))))
    for kv in range(nkv):
        holders = [r for r in range(t) if kv_heads_of_rank(nh, nkv, t, r)[0] <= kv < sum(kv_heads_of_rank(nh, nkv, t, r))]
        width = nh / nkv                  # a KV head sits under the query heads that read it
        for i, r in enumerate(holders):   # one stripe per rank holding a copy
            ax.add_patch(Rectangle((kv * width + i * (width - 0.1) / len(holders), 0), (width - 0.1) / len(holders), 0.9,
                                   color=device_color(r)))
        ax.add_patch(Rectangle((kv * width, 0), width - 0.1, 0.9, fill=False, ec="black", lw=2))
        ax.text(kv * width + (width - 0.1) / 2, 0.45, f"kv{kv}", ha="center", va="center", fontsize=8,
                color="white", fontweight="bold")
    ax.text(-0.2, 1.75, "query", ha="right", va="center", fontsize=9)
    ax.text(-0.2, 0.45, "KV", ha="right", va="center", fontsize=9)
    mode = "Sharded" if nkv % t == 0 else "Replicated copies"
    ax.set_title(f"nh={nh}, nkv={nkv}, t={t}: KV {mode}", fontsize=10)
    ax.set_xlim(-1.5, nh); ax.set_ylim(-0.2, 2.4); ax.axis("off")

fig, axes = plt.subplots(1, 3, figsize=(13, 1.8))
for ax, nkv in zip(axes, [8, 4, 2]):
    draw_heads(ax, 8, nkv, 4)
plt.show()
for nkv in [8, 4, 2, 1]:
    print(f"nh=8, nkv={nkv}, t=4: rank -> (first KV head, count):",
          [kv_heads_of_rank(8, nkv, 4, r) for r in range(4)])
try:
    kv_heads_of_rank(8, 8, 3, 0)
except ValueError as error:
    print("t=3:", error)"""),
    new_markdown_cell(r"""A KV head copied to several ranks gets a **Partial** gradient on each: rank $i$ only sees the
query heads it owns. The true gradient is the sum over the copies. `gather_attention_grads` adds
them when gluing the shards back (in training, the ranks sharing a head would all-reduce these
gradients among themselves before the optimizer step).

Now the check, for sharded and replicated KV heads: output and $dx$ on every rank, and every
weight gradient, against the single-device attention."""),
    new_code_cell("""B, T, H, nh = 2, 6, 16, 8                       # hs = H / nh = 2
x, dy = random_array(rng, (B, T, H)), random_array(rng, (B, T, H))

def attention_step(comm, params, nkv):
    local = shard_attention_params(params, nh, nkv, comm.world_size, comm.rank)
    y, cache = parallel_attention_forward(comm, x, local, nh, nkv)
    dx, grads = parallel_attention_backward(comm, dy, cache)
    return y, dx, grads

for nkv in [8, 2, 1]:
    params = reference.init_attention_params(rng, H, nh, nkv)
    y_ref, cache = reference.attention_forward(x, params, nh, nkv)
    dx_ref, grads_ref = reference.attention_backward(dy, cache)
    for t in [1, 2, 4, 8]:
        results = run_spmd(attention_step, t, params, nkv)
        for rank, (y, dx, _) in enumerate(results):
            assert_matches_reference(y, y_ref, name="y", rank=rank)
            assert_matches_reference(dx, dx_ref, name="dx", rank=rank)
        assert_all_match(gather_attention_grads([g for *_, g in results], nh, nkv), grads_ref)
    print(f"nkv={nkv}: y, dx and all {len(grads_ref)} parameter gradients match the single-device attention"
          " for t = 1, 2, 4, 8")

# the copies of a replicated KV head: each is Partial, their sum is the gradient
t, nkv = 4, 2
params = reference.init_attention_params(rng, H, nh, nkv)
grads_ref = reference.attention_backward(dy, reference.attention_forward(x, params, nh, nkv)[1])[1]
results = run_spmd(attention_step, t, params, nkv)
copy0, copy1 = results[0][2]["k.weight"], results[1][2]["k.weight"]   # ranks 0 and 1 share KV head 0
hs = H // nh
print("rank 0's copy alone matches?", np.allclose(copy0, grads_ref["k.weight"][:, :hs]),
      "| rank 1's alone?", np.allclose(copy1, grads_ref["k.weight"][:, :hs]))
assert_matches_reference(copy0 + copy1, grads_ref["k.weight"][:, :hs],
                         name="grad of k.weight, KV head 0 (sum of the two copies)")
print("their sum matches: the gradient of a replicated KV head is the SUM over its copies")"""),
    new_markdown_cell(r"""## 3. The transformer block: two regions, four all-reduces

A pre-LayerNorm block: $h = x + \mathrm{attn}(\mathrm{ln}_1(x))$, $y = h + \mathrm{mlp}(\mathrm{ln}_2(h))$.
Between the two parallel regions everything is Replicated: each rank applies the LayerNorms and
adds the residuals itself, on the whole (B, T, H) activation (cheap, and no communication; the
LayerNorm weights are Replicated and their gradients come out identical on every rank, because
they only ever see Replicated tensors). So per block:

| | forward | backward |
|---|---|---|
| attention | g: all-reduce of (B, T, H) | f: all-reduce of (B, T, H) |
| MLP | g: all-reduce of (B, T, H) | f: all-reduce of (B, T, H) |

and a ring all-reduce sends $2\frac{t-1}{t}N$ elements per rank, hence per block per step, per rank:
$$ \text{bytes sent} = 4 \times 2\,\frac{t-1}{t} \times B\,T\,H \times \text{itemsize}. $$"""),
    new_code_cell("""draw_layouts([
    ("x  (B, T, H)", "Replicated", "ln1, f,\\nQKV_i", H_),
    ("heads of rank i", "Sharded", "attn, @ Wo_i", QKV_),
    ("attn partial", "Partial", "g, + x", H_),
    ("h", "Replicated", "ln2, f,\\n@ W1_i, gelu", H_),
    ("a_i  (B, T, F/t)", "Sharded", "@ W2_i", QKV_),
    ("mlp partial", "Partial", "g, + h", H_),
    ("y", "Replicated", "", H_),
], t=4, title="one pre-LN block forward: two all-reduces (the two g's)")"""),
    new_code_cell("""config = BlockConfig(hidden=H, n_heads=nh, n_kv_heads=2, ffn=4 * H)
block_params = reference.init_block_params(rng, config)
y_ref, cache = reference.block_forward(x, block_params, config)
dx_ref, grads_ref = reference.block_backward(dy, cache)

def block_step(comm):
    local = shard_block_params(block_params, config, comm.world_size, comm.rank)
    comm.meter.reset()
    y, cache = parallel_block_forward(comm, x, local, config)
    forward = comm.meter.snapshot()["by_collective"]
    comm.meter.reset()
    dx, grads = parallel_block_backward(comm, dy, cache)
    return y, dx, grads, forward, comm.meter.snapshot()["by_collective"]

N, itemsize = B * T * H, x.itemsize
print(f"{'t':>2} {'all-reduces fwd+bwd':>20} {'bytes sent (meter)':>19} {'4 x 2(t-1)/t x BTH x 8':>23}")
measured = {}
for t in [1, 2, 4, 8]:
    results = run_spmd(block_step, t)
    for rank, (y, dx, grads, forward, backward) in enumerate(results):
        # the block's output and input gradient on every rank, then every parameter gradient
        assert_matches_reference(y, y_ref, name="y", rank=rank)
        assert_matches_reference(dx, dx_ref, name="dx", rank=rank)
        assert set(forward) == set(backward) == {"all_reduce"}
        assert forward["all_reduce"]["calls"] == backward["all_reduce"]["calls"] == 2
        sent = forward["all_reduce"]["bytes_sent"] + backward["all_reduce"]["bytes_sent"]
        assert sent == 4 * 2 * (t - 1) * N * itemsize // t, (rank, sent)
    assert_all_match(gather_block_grads([r[2] for r in results], config), grads_ref)
    measured[t] = sent
    print(f"{t:>2} {'2 + 2':>20} {sent:>19} {4 * 2 * (t - 1) * N * itemsize // t:>23}")
print("block output, dx and all", len(grads_ref), "parameter gradients match the single-device block")"""),
    new_code_cell("""fig, ax = plt.subplots(figsize=(6, 3.2))
ts = sorted(measured)
ax.plot(ts, [measured[t] for t in ts], "o", ms=8, label="meter (every rank)")
tt = np.linspace(1, max(ts), 100)
ax.plot(tt, 4 * 2 * (tt - 1) / tt * N * itemsize, "-", label="4 x 2(t-1)/t x BTH x 8")
ax.axhline(8 * N * itemsize, ls=":", c="grey", label="limit 8 x BTH x 8 bytes")
ax.set_xlabel("TP degree t"); ax.set_ylabel("bytes sent per rank, per block step"); ax.legend(fontsize=8)
ax.set_title("transformer block communication per rank")
plt.show()"""),
    new_markdown_cell(r"""The table one rank's meter prints for a whole block step (t = 4), and what each rank stores:
1/t of the query, output and MLP weights (and of the biases that follow them, `attn.q.bias` and
`mlp.fc.bias`), the Replicated LayerNorm weights and the biases added after an all-reduce
(`attn.o.bias`, `mlp.proj.bias`), and, because this block has nkv = 2 < t = 4 KV heads, **half**
of `attn.k.weight`, `attn.v.weight` and `attn.v.bias`, not a quarter: each rank holds a copy of
the one KV head its query heads read. The cell prints that breakdown and checks that it adds up
to the bytes per rank. The names are the torch GPT Block's, so
`reference.params_to_torch(block_params)` loads straight into it.

Those KV copies cost communication in training. Each copy's gradient is Partial (it covers its
rank's query heads only), so before the optimizer step the r = t/nkv ranks sharing a head
must all-reduce it: per rank, a ring among them sends 2(r-1)/r times one head's K/V gradient
(H·hs·2 weights + hs biases). The torch GPT does this with `nn.mappings.sum_over_replicas`: one
all-reduce over the *whole* TP group of a buffer with a slot per distinct KV head, so each rank
sends $2\frac{t-1}{t}$ times the full K/V weight gradient (all nkv heads), once per step and layer. It
needs no sub-group, at t/r times the bytes of the sharers-only all-reduce; for a small nkv this
is far less than the activations' all-reduces."""),
    new_code_cell("""def block_table(comm):
    local = shard_block_params(block_params, config, comm.world_size, comm.rank)
    comm.meter.reset()
    parallel_block_backward(comm, dy, parallel_block_forward(comm, x, local, config)[1])
    return comm.meter.table(), sum(p.nbytes for p in local.values())

results = run_spmd(block_table, 4)
print(results[0][0])
full = sum(p.nbytes for p in block_params.values())
print(f"\\nparameter bytes per rank at t=4: {[r[1] for r in results]} of {full} (1/t = {full // 4})")
local0 = shard_block_params(block_params, config, 4, 0)
share = {}  # what fraction of each full parameter rank 0 holds -> the parameters and their bytes
for key, value in local0.items():
    fraction = f"1/{block_params[key].nbytes // value.nbytes}" if value.nbytes < block_params[key].nbytes else "all"
    names, nbytes = share.get(fraction, ([], 0))
    share[fraction] = (names + [key], nbytes + value.nbytes)
for fraction, (names, nbytes) in share.items():
    print(f"  {fraction:>4} of {', '.join(names)}: {nbytes} B")
assert sum(nbytes for _, nbytes in share.values()) == results[0][1]
print(f"  = {results[0][1]} B per rank")"""),
    new_markdown_cell(r"""## Your turn: exercise 4

Open `exercises/ex04_parallel_attention.py` and write `causal_attention` (the scores, the causal
mask and a softmax that survives scores in the thousands: subtract each row's max before exp),
`shard_attention_params` (which heads go where, GQA included, as copies),
`parallel_attention_forward` and `parallel_attention_backward`. You may build on the library's
parallel linear layers from exercise 3 and on the single-device helpers in
`tp_from_scratch.layers.reference`. Then

    make grade EX=ex04            # or: .venv/bin/python -m pytest exercises -m ex04 -x

The graders run t = 1, 2, 3, 4 with sharded and replicated KV heads, compare the output and every
gradient with the single-device attention, and count your all-reduces.

**Summary.** Attention is column-parallel by heads (q, k, v of a rank's heads are `Sharded` by head),
runs locally per head, and its output projection is row-parallel: Partial → g → Replicated.
GQA: KV heads are Sharded when t divides nkv, and copied when nkv < t, where the copies' gradients
are Partial and add up. A pre-LN block is two such regions with Replicated LayerNorms and
residuals: 2 all-reduces forward, 2 backward, $4 \times 2\frac{t-1}{t}BTH$ elements per rank per step."""),
    new_code_cell("""print(f"lesson executed in {time.perf_counter() - LESSON_START:.1f} s")"""),
]

write_notebook(cells, HERE.parent / "04_parallel_attention.ipynb")
