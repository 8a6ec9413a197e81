"""Generate lessons/13_tp_numerics.ipynb (without outputs; `make lessons` executes it).

    .venv/bin/python lessons/src/13_tp_numerics.py
    .venv/bin/jupyter nbconvert --to notebook --execute --inplace lessons/13_tp_numerics.ipynb

Everything runs live: the measurements on simulated ranks in this process, the benchmark (a
few seconds), and one torchrun launch of 2 processes for the doubling backward. No measurement file.
"""
from pathlib import Path

from nbformat.v4 import new_code_cell, new_markdown_cell
from lesson_notebook import write_notebook

HERE = Path(__file__).resolve().parent

cells = [
    new_markdown_cell(r"""# Lesson 13 (ex13): the numerics of tensor parallelism — the same bits at every t

This course checks every step against one device *within a tolerance*: the parallel code adds
the same numbers in another order, and floating-point addition is not associative. That is
enough to prove the code right, and it is why `docs/running.md` says a float32 run at tp = 2
agrees with one device for the first ~20 steps and then parts: training amplifies the roundoff.

Some uses need more than that. Reinforcement learning trains a model with one TP degree and
samples from it with another, and both must give the same probabilities: "Deterministic
Inference across Tensor Parallel Sizes" (TBIK, arXiv 2511.17826) reports that a mismatch
between the training engine (TP = 1) and the rollout engine (multi-GPU TP) "can degrade or even
collapse training" (abstract). Its key insight, in its words: "enforce a consistent reduction
order across and within GPUs" (abstract). This lesson does that from scratch, on the CPU:

1. **why t changes the bits**: the order of the sums in the row-parallel matmul, the ring's
   rank-dependent order, and the kernels' dependence on the shard's shape, each measured here;
2. **how to make them not change**: a fixed binary tree over a fixed number of leaves, and
   matmuls whose bits do not depend on how t sliced them; then every output and every gradient
   of a GPT is `torch.equal` at t = 1, 2, 4 and 8;
3. **what it costs**, measured;
4. two numerical traps TP code falls into: **gradient clipping** with the wrong norm, and the
   **all-reduce whose backward doubles** the gradient.

Where things are (`tp_from_scratch/numerics/`): `tree.py` (the fixed tree on a Comm, numpy;
Exercise 13's reference), `reduction.py` (the same tree on torch tensors, on a Comm or a
ProcessGroup), `matmul.py`, `layers.py` and `cross_entropy.py` (the invariant layers), `model.py`
and `train.py` (the invariant GPT, and Lesson 6's trainer on it), `measure.py` (this lesson's
measurements), `bench.py`, `clip.py`, `doubling.py`, and `check.py`, which runs the claims on real
processes:

    .venv/bin/mpiexec -n 4 .venv/bin/python -m tp_from_scratch.numerics.check

Legend: t TP degree, L leaves of the fixed tree (8 here), M rows (tokens, $B \cdot T$), K the reduced
axis, N output features, V vocabulary, nh heads, nkv KV heads, hs head size."""),
    new_code_cell("""import sys
from pathlib import Path
if not (Path.cwd() / "tp_from_scratch").is_dir():  # run from lessons/: make the package importable
    sys.path.insert(0, str(Path.cwd().parent))

import copy
import numpy as np
import torch

from tp_from_scratch.comm import run_spmd
from tp_from_scratch.comm.launchers import run_command, torchrun_command
from tp_from_scratch.gpt.model import GPTConfig, init_gpt
from tp_from_scratch.gpt.parallelize import gpt_to_tp
from tp_from_scratch.numerics import bench, check, check_invariant, measure, tree
from tp_from_scratch.numerics.clip import (clip_grad_norm, gpt_placement, norm_counting_replicas_t_times,
                                           norm_without_tp_sum)
from tp_from_scratch.testing import random_array, rank_rng
print("BLAS threads:", torch.get_num_threads(), "| CPU vector capability:", torch.backends.cpu.get_cpu_capability())"""),

    # ------------------------------------------------------------------ 1. why
    new_markdown_cell(r"""## 1. Why t changes the bits

### 1a. The order of the sums in the row-parallel matmul

A row-parallel linear (Lesson 3) computes $Y = XW$ with K, the reduced axis, split over the t
ranks: rank r multiplies its K/t columns of X by its K/t rows of W, and the all-reduce adds the t
partial sums. One device adds the K products of each output element in whatever order its BLAS
kernel blocks them; t ranks add K/t of them each, then t partials. The same numbers, added in
another order: in float32, X (64 x 512) and W (512 x 384), against X @ W on one device:"""),
    new_code_cell("""bits = measure.row_parallel_bits()
print(f"{'t':>2}  {'plain: equal to one device':>27} {'max |diff|':>11}")
for t, row in bits.items():
    print(f"{t:>2}  {str(row['plain equal']):>27} {row['plain diff']:>11.2e}")"""),
    new_markdown_cell(r"""Where t = 2 comes out equal on this machine, it is luck of the kernel's blocking, not a
guarantee: at t = 4 and 8 the bits differ, by a few times $10^{-5}$ on outputs of typical size
$\sqrt{512} \approx 23$, which is roundoff: far inside the tolerance policy, so every earlier lesson's
check passes, but not the same bits.

### 1b. The ring's order depends on the rank

Lesson 2's ring all-reduce cuts the array into t chunks, and chunk c's partial sum starts at rank
c + 1 and travels around the ring, each rank adding its own piece: chunk c is
$((x_{c+1} + x_{c+2}) + \dots) + x_c$. Which rank's value comes first, found for each chunk by
trying every starting rank on the ring's actual result (t = 4, 4096 float32 per rank):"""),
    new_code_cell("""starts = measure.ring_chunk_orders(4)
for chunk, start in enumerate(starts):
    x = [f"x{(start + j) % 4}" for j in range(4)]
    print(f"chunk {chunk}: starts at rank {start}: (({x[0]} + {x[1]}) + {x[2]}) + {x[3]}")"""),
    new_markdown_cell(r"""Four chunks, four orders; and a different t cuts different chunks with different orders
again. So even with the same partial sums, the ring cannot give t-independent bits: the order
of the reduction must be fixed by something other than the ranks.

### 1c. The matmul kernel depends on the shard's shape

A column-parallel layer at t ranks computes out/t columns of the output; a vocabulary of V at t
ranks, V/t. BLAS chooses its kernel and blocking from the shapes it is handed, so a column of
$XW^\top$ can come out in other bits when it is computed with fewer neighbours. Is the product of the
first m rows of X (or the first n rows of W) the same bits as those rows (columns) of the whole
product? float32, X (96 x 256), W (192 x 256):"""),
    new_code_cell("""for name, table in measure.matmul_slice_bits().items():
    print(f"{name:<17} rows:   " + "  ".join(f"{m}:{'=' if ok else 'X'}" for m, ok in table["rows"].items()))
    print(f"{'':<17} columns:" + "  ".join(f"{n}:{'=' if ok else 'X'}" for n, ok in table["columns"].items()))"""),
    new_markdown_cell(r"""(= the same bits, X other bits.) On this machine `F.linear` is not slice-invariant for narrow
column slices and for some row counts (which ones depends on the kernel and the number of threads). `invariant_linear` (`numerics/matmul.py`) is: it forms the
products x[m, k] w[n, k] of a block of rows and sums each over its **contiguous** K axis, so every
output element is its own reduction of the same K numbers in the same order, whatever else is
beside it. BLAS stays fine wherever the shapes do not depend on t.

Attention splits heads, so each rank runs its batched matmuls ($qk^\top$ and $\mathrm{att}\, v$) and the softmax
on nh/t heads. Does that change a head's bits? 8 heads of (32 x 8):"""),
    new_code_cell("""print("per-head bmm and softmax on nh/t heads, the same bits as on all 8:", measure.head_count_bits())"""),
    new_markdown_cell(r"""On this machine it does not: the batched matmul treats each head alone. So attention needs no
change; the layers around it do.

### 1d. Element-wise kernels have a vector path and a scalar tail

An element-wise function is computed a vector at a time, and the elements left over at the end
of the tensor by a scalar loop. If the two paths round differently, an element's bits depend on
where it falls, and a rank's shard of F/t features puts elements elsewhere than one device's F.
Lengths up to 128 at which f(x[:n]) differs from the first n elements of f(x), for one of 8
random x (float32):"""),
    new_code_cell("""step = measure.elementwise_step()
print(f"ATen's element-wise loop takes {step} float32 numbers per step on this CPU")
for name, lengths in measure.elementwise_tail_bits().items():
    multiples = [n for n in lengths if n % step == 0]
    print(f"{name:<12} {len(lengths):>3} of 128 lengths differ {str(lengths[:3])[:-1] + ', ...]' if len(lengths) > 3 else lengths}; "
          f"multiples of {step} among them: {multiples}")"""),
    new_markdown_cell(r"""exp agrees at every length, the exact GeLU everywhere but (as measured here) on a tensor of one
element; SiLU (Llama's MLP) and the tanh GeLU (GPT-2's) do not, but never on a length that is a
multiple of the loop's step: ATen's `vectorized_loop` (aten/src/ATen/native/cpu/Loops.h) handles
two vectors per iteration, $2 \times 8$ float32 with AVX2, $2 \times 16$ with AVX512 (the capability printed at
the top), and the elements past the last whole step with a scalar loop. A TP MLP's activation holds
$B \cdot T \cdot F/t$ numbers per rank: when that is a multiple of the step at every t ($B \cdot T$ a multiple of 32 is
enough on both), no element takes the scalar path, and every t gives the same bits. The invariant layers do not own the activation, so
this is a condition on the batch, stated in `numerics/layers.py`.

## 2. Making the bits not change

### 2a. The fixed binary tree

Fix the order once, for every t: cut the reduced axis into **L leaves** (L a power of two; 8,
the largest t served) and always add them as the complete binary tree over leaves 0 .. L-1:

    ((l0 + l1) + (l2 + l3)) + ((l4 + l5) + (l6 + l7))
     \_ t=4: rank 0 _/   \_ rank 1 _/   ...
     \______ t=2: rank 0 ________/   \______ rank 1 ______/

Rank r holds leaves $rL/t$ to $(r+1)L/t - 1$, **a whole subtree**, and sums it in tree order
(`tree.local_tree_sum`); then the ranks combine by Lesson 10's **recursive doubling**: round k
pairs rank v with $v \oplus 2^k$ (XOR), and the lower rank's partial goes left. Those rounds are exactly the
tree's upper levels. Every t dividing L performs the same additions in the same order:"""),
    new_code_cell("""leaves = np.stack([random_array(rank_rng(13, leaf), (4096,), np.float32) for leaf in range(8)])
one_rank = tree.local_tree_sum(leaves)                 # t = 1: the whole tree on one rank

def reduce_my_leaves(comm):
    here = 8 // comm.world_size
    comm.meter.reset()
    total = tree.tree_all_reduce(comm, leaves[comm.rank * here:(comm.rank + 1) * here])
    return total, comm.meter.messages_sent, comm.meter.bytes_sent

for t in (1, 2, 4, 8):
    results = run_spmd(reduce_my_leaves, t)
    same = all(np.array_equal(total, one_rank) for total, _, _ in results)
    print(f"t={t}: every rank holds t = 1's bits: {same}; rank 0 sent {results[0][1]} messages, "
          f"{results[0][2]:,} bytes (tree_traffic: {tree.tree_traffic(t, one_rank.nbytes)})")
try:
    run_spmd(lambda comm: tree.tree_all_reduce(comm, leaves[:2]), 3)
except Exception as error:
    print("t=3:", str(error).splitlines()[0])"""),
    new_markdown_cell(r"""$\log_2 t$ messages of the whole array per rank: the latency of recursive doubling and its bytes,
$N \log_2 t$, against the ring's $2\frac{t-1}{t}N$ (the same at t = 2, 1.33 times at t = 4, 1.71 times at
t = 8). A t that does not divide L leaves no subtree per rank and is refused by name. (On a torch
ProcessGroup, `reduction.tree_all_reduce` runs the same rounds with `dist.isend`/`dist.irecv`: a
native `dist.all_reduce` picks its own order, which changes with t.)

### 2b. The row-parallel matmul over fixed leaves

The row-parallel sum is a reduction over K: make its leaves K/L columns each. Every leaf's partial
product x[:, leaf] @ w[leaf, :] is one BLAS call of the same shape at every t, so it has the same
bits at every t; the tree adds them (`tree.invariant_row_parallel_matmul`, the matmul of Exercise 13).
The same X and W as in 1a:"""),
    new_code_cell("""print(f"{'t':>2} {'tree: equal to t = 1':>21} {'max |diff| to X @ W':>20}")
for t, row in bits.items():
    print(f"{t:>2} {str(row['tree equal']):>21} {row['tree diff']:>20.2e}")"""),
    new_markdown_cell(r"""The tree is not one device's BLAS order either: it differs from X @ W by roundoff, as every
other order does. What it buys is that it is **the same order at every t**.

### 2c. Every layer, forward and backward

Two rules cover a whole GPT:

* where **t splits a reduction**, cut it into L leaves, compute each leaf's partial with BLAS on a
  shape that does not depend on t, and add the leaves with the fixed tree;
* where **t slices an output** (rows or columns of a result), compute it with `invariant_linear`.

| layer | forward | backward |
|---|---|---|
| column-parallel W[out_t, in] (q, k, v, fc, gate, up) | $Y_i = X W_i^\top$: out sliced, invariant_linear | dW_i, db_i: out sliced, invariant; dX: a sum over out, split: leaves of out/L rows, the tree (the layer's own f) |
| row-parallel W[out, in_t] (o, proj, down) | Y: a sum over in, split: leaves of in/L columns, the tree, + b once | dX_i, dW_i: in sliced, invariant_linear; no communication |
| vocab-parallel head E[V_t, H] | logits_i: V sliced, invariant_linear | dE_i invariant; dh: a sum over V, split: the tree over vocabulary leaves |
| vocab-parallel cross-entropy | max and target logit: exact in any order; $S = \sum \exp$: per-leaf sums, the tree | softmax - one-hot: element-wise, no communication |
| embedding | one row and t - 1 zeros: exact in any order | unchanged |

Two consequences. Lesson 5 lets q, k and v share one f, summing their partial dX on each rank
before one all-reduce; here each layer's dX goes through the tree first, and autograd adds the
three replicated results in the graph's order, the same at every t. And a KV head held by
r = t / nkv ranks (nkv < t) gets its dY summed over those ranks in rank order, which is the order
in which t = 1 adds the heads of a GQA group (one after the other, measured): equal bits when each
rank holds one query head. With RoPE each replica turns its partial dK back through the rotation
before the sum, which t = 1 does after: `check_invariant` refuses that case by name.

`numerics.check.check_layers` runs the column layer (also with a KV head on several ranks), the
row layer, the head and the cross-entropy at t and compares every output and every gradient
with t = 1, bit for bit (it raises on the first bit that differs):"""),
    new_code_cell("""for t in (1, 2, 4, 8):
    counts = run_spmd(check.check_layers, t)
    print(f"t={t}: {counts[0]} outputs and gradients per rank, each equal to t = 1's bit for bit")
for change, t in ((dict(n_kv_heads=4, arch="llama"), 8), (dict(vocab_size=67), 4)):
    try:
        check_invariant(GPTConfig(**{**dict(vocab_size=64, hidden=64, n_heads=8), **change}), t)
    except ValueError as error:
        print(f"t={t}, {change}: refused: {error}")"""),
    new_markdown_cell(r"""`tests/test_numerics_layers.py` assembles a whole GPT from these layers (GPT-2 with 2 KV heads,
this course's GPT with 4, Llama with 8) and proves its logits, its loss and every gradient
`torch.equal` to t = 1's at t = 2, 4 and 8 on simulated ranks (GPT-2 is skipped at t = 4, where
its 2 KV heads on 2 ranks each with 2 query heads per rank are refused, as above);
`tests/test_numerics_launch.py` does the same under torchrun, and under mpiexec in `make test-slow`
(t = 2 and 4; t = 8 in `make test-slow` too, `tests/test_slow_tp8.py`); `tests/test_numerics_training.py` trains it with AdamW
(element-wise: equal gradients, equal updates) and decodes greedily, and every loss and every
generated id is `torch.equal` at t = 1, 2, 4 and 8 (10 steps in `make test`, Llama's 1,000 in
`make test-slow`).

### 2d. What breaks it

Each ingredient is needed. The same 8 leaves of 4096 float32 numbers, summed with a ring in place
of the recursive doubling, or with a rank's leaves added one after the other instead of as a
subtree, against the tree on one rank; and a vocabulary of 8 split one row per rank (t = 8), its
logits computed row by row with BLAS and with `invariant_linear`:"""),
    new_code_cell("""for name, row in measure.breaking_variants().items():
    print(f"{name:<22}", "  ".join(f"t={t}: {'=' if ok else 'X'}" for t, ok in row.items()))
print("one-row vocabulary shards, the same bits as the whole product:", measure.one_row_shard_bits())"""),
    new_markdown_cell(r"""The ring is harmless at t = 2 (two partial sums add the same either way round) and wrong from
t = 4; a sequential sum inside a rank is wrong as long as a rank holds more than two leaves; BLAS
on a one-row shard gives other bits. `tests/test_numerics_layers.py` patches the ring and the
sequential sum into the layers of the invariant Llama in turn and proves that its logits or
gradients at t = 8 then differ from t = 1's; and patches BLAS in place of `invariant_linear` into
the LM head of a vocabulary of 8 (one row per rank at t = 8), whose logits then differ.

## 3. What it costs

`numerics/bench.py` times a TP MLP (fc column-parallel, GeLU, proj row-parallel) forward and
backward on 2 simulated ranks with Lesson 5's layers and with the invariant ones, and the two
all-reduces alone, with the bytes the meter counts (fastest of 5 runs each; ranks are threads of
this process, so compare the columns, not the absolute times). The same from a shell, larger:
`.venv/bin/python -m tp_from_scratch.numerics.bench --tp 4 --tokens 256 --hidden 256 --ffn 1024`."""),
    new_code_cell("""rows = bench.compare(tp=2, tokens=64, hidden=128, ffn=512, numbers=1 << 16, repeats=5)
print(bench.table(rows))
print(f"the invariant MLP took {rows[0][3]:.1f} times the default's time")"""),
    new_markdown_cell(r"""Why the invariant MLP is slower (the factor printed above): `invariant_linear` materialises the $M \times N \times K$
products of every sliced matmul (here fc's forward, both weight gradients and the row layer's
dX) and then sums them, where BLAS keeps partial sums in registers and streams each operand
once: the same multiply-adds, but K numbers written and read again for every output element.
The per-leaf products are L/t small BLAS calls instead of one, and every leaf is copied to a
contiguous block first. The tree all-reduce adds each rank's L/t leaves, work the default path
does not have (the ring is handed the rank's sum), and sends the same bytes as the ring at t = 2,
$\log_2 t \,/\, \big(2\frac{t-1}{t}\big)$ times them beyond; against that extra work it sends fewer messages, $\log_2 t$
against the ring's $2(t-1)$ (at t = 2 one exchange of the whole array where the ring makes two
rounds of half arrays), so its time can come out below the ring's, as the all-reduce row shows
when it does. On a GPU a kernel can block the products itself
and still fix the order (TBIK's abstract: kernels written in Triton, integrated into vLLM and
FSDP); this course's version trades speed for a few lines that show the order.

## 4. Gradient clipping, right and wrong

Training clips the gradient: torch.nn.utils.clip_grad_norm_ scales every gradient by
$\min\big(1, \mathtt{max\_norm} / (\lVert g \rVert + 10^{-6})\big)$, $\lVert g \rVert$ the norm of all gradients as one vector. Under TP no rank
holds that vector. Two shortcuts are wrong, and they slip into real code: TransformerEngine's ROCm
fork marked replicated weights as tensor-parallel, so Megatron counted them once per TP rank, and
the reported norm came out 1.52 times too large at TP = 8 (ROCm/TransformerEngine PR #715, its
description: a 4-layer DeepSeek-V4-Flash; 1.36 times for a 6-layer DeepSeek-V3):

* **summing every rank's local squares over the TP group**: the replicated parameters (norms, the
  row layers' biases, the position embedding) count t times, a KV head held by r ranks r times;
* **each rank's local norm alone**: the sharded parameters miss the other ranks' pieces, and the
  ranks disagree on the norm, hence on the factor: the replicas drift apart.

The right norm counts every distinct piece once: a rank adds the squares of the pieces it *owns*
(its shard of a sharded parameter; a replicated one only on TP rank 0; a KV head only on the first
of its replicas), then one all-reduce sums them. Megatron-LM does the same: MegatronOptimizer.get_main_grads_for_grad_norm
(megatron/core/optimizer/optimizer.py) keeps a gradient only when param_is_not_tensor_parallel_duplicate
(a sharded parameter, or any parameter on TP rank 0), and get_grad_norm_fp32
(megatron/core/optimizer/clip_grads.py) sums the kept gradients' p-th powers over the
model-parallel group. The right norm is Lesson 6's (`gpt/clip.py`, re-exported by
`numerics/clip.py` beside the two wrong ones): it reads who owns what from the sharding plan
(`gpt.arch.shard_axis`, `replicas_of`; Lesson 12's `deepseek.arch.clip_placement` reads
DeepSeek-V3's plan the same way); a "dp" group counts the DP replicas once. The one trainer clips
with it: `--clip-grad-norm MAX`, after the DP average, with
the single-device reference clipping by torch's `clip_grad_norm_`:

    .venv/bin/torchrun --standalone --nproc-per-node 2 -m tp_from_scratch.gpt.train --tp 2 --clip-grad-norm 0.5 --dtype float64 --compare-single

prints 50 of 50 steps equal to one device's. The lessons' trainers clip the same way, each after
its own gradient sum: sequence_parallel.train (the LayerNorms' gradients summed over the sequence
shards), partial_sync.train (the streams' shared parameters summed; the norm equals the t-stream
model's) and deepseek.train (under expert parallelism each rank's experts counted, the whole
attention once after its gradients are summed; under expert tensor parallelism each expert's
columns). parallelisms.train refuses the flag by name: its DDP, ZeRO and pipeline steps place the
gradients their own way.
GPT-2 and Llama (one KV head, so replicated on every rank) at t = 4, float64:"""),
    new_code_cell("""def norms(comm, gpt, batch, config):
    model = gpt_to_tp(comm, gpt)
    model(*batch)[1].backward()
    wrong = norm_counting_replicas_t_times(model, comm), norm_without_tp_sum(model)
    right = clip_grad_norm(model, 0.05, placement=gpt_placement(config, comm.world_size), groups={"tp": comm})
    return right, *wrong

print(f"{'':<6} {'one device (torch)':>19} {'clip.py':>19} {'replicated x t':>15} {'local only (ranks 0..3)':>36}")
for arch, nkv in (("gpt2", 4), ("llama", 1)):
    config = GPTConfig(vocab_size=67, seq_len=16, n_layers=2, hidden=32, n_heads=4, n_kv_heads=nkv, arch=arch)
    gpt = init_gpt(config, 0, torch.float64)
    gen = torch.Generator().manual_seed(1)
    batch = tuple(torch.randint(0, 67, (2, 16), generator=gen) for _ in range(2))
    reference = copy.deepcopy(gpt)
    reference(*batch)[1].backward()
    truth = torch.nn.utils.clip_grad_norm_(reference.parameters(), 0.05).item()
    results = run_spmd(norms, 4, gpt, batch, config)
    local = " ".join(f"{r[2].item():.4f}" for r in results)
    print(f"{arch:<6} {truth:>19.15f} {results[0][0].item():>19.15f} {results[0][1].item():>15.4f} {local:>36}")"""),
    new_markdown_cell(r"""The right norm equals one device's to float64's roundoff (the order of the squares' sum
differs); the gradients clipped by it equal one device's clipped gradients
(`tests/test_numerics_clip.py` checks every one at t = 1, 2 and 4, the max-norm too, and for
Lesson 8's private channels and Lesson 12's experts;
`tests/test_numerics_launch.py` on a dp x tp mesh under torchrun). The first wrong norm is too large, the second too small and
different on every rank.

## 5. The all-reduce whose backward doubles

Lesson 5's g (`nn.mappings.reduce_from_tp_region`) is an all-reduce forward and the **identity**
backward. PyTorch has differentiable all-reduces too: `torch.distributed.nn.functional.all_reduce`
(its `_AllReduce` Function's backward is `_AllReduce.apply` of the gradient; deprecated, with a
FutureWarning pointing to `torch.distributed._functional_collectives.all_reduce`, whose autograd
rule, `all_reduce_backward` in that file, is again an all-reduce with the same op: torch 2.13's
sources). Put one where g belongs, in a row-parallel linear whose output every rank turns
into the same loss, and compare the weight gradient with one device's (2 processes, float64;
`numerics/doubling.py`):"""),
    new_code_cell("""out = run_command(torchrun_command(2, "tp_from_scratch.numerics.doubling"), timeout=180)
print(out.stdout[out.stdout.index("t = 2"):] if out.returncode == 0 else out.stdout[-3000:])"""),
    new_markdown_cell(r"""Exactly 2: torch's all-reduce has an all-reduce as its backward. That is the adjoint of
"$y_q = \sum_r x_r$ on every rank q" read as t **different** outputs, each with its own loss: it
differentiates $\sum_q L(y_q)$. With the same loss on every rank that sum is $t\,L(Y)$, so every rank's
identical loss is counted once per rank: the backward of a sum of t identical losses.

When is it the right backward? When the ranks' outputs really do go on to different losses that
are added: each rank computes the loss of its own data after the sum, and the objective is the
sum over the ranks (divide by t for their mean). In tensor parallelism everything after g is
replicated, one loss counted once, so the identity is right: Megatron's g. (`tests/test_numerics_launch.py`
checks the 2.000000 under torchrun, and 4 at t = 4.)

## Summary

* t changes the bits through the order of the sums (the row-parallel K split and the ring's
  rank-dependent order) and through kernels that depend on the shard's shape (BLAS on narrow
  slices, the scalar tails of SiLU and tanh-GeLU).
* A fixed binary tree over L leaves, each rank a whole subtree and the ranks combined by recursive
  doubling, plus matmuls that compute every sliced output element alone, makes every output and
  gradient the same bits at every t dividing L. It costs from a few to tens of times the default
  path's time on a CPU (section 3 prints the factor), and $\log_2 t \,/\, \big(2\frac{t-1}{t}\big)$ times the ring's bytes.
* Clip by the norm in which each distinct piece counts once; torch's differentiable all-reduce is
  not Megatron's g.

Lesson 6's trainer clips by the right norm (`--clip-grad-norm`). The invariant layers keep the
constructor and state dict of Lesson 5's (`numerics.INVARIANT_STYLES` maps each style of the
sharding plan to its invariant layer), so `numerics/model.py` builds the invariant GPT from Lesson
6's TP GPT, and `numerics.train` is Lesson 6's trainer on it (one hook, as Lesson 7's is): its
losses are the same bits at t = 1, 2 and 4 under torchrun and under mpiexec on Lesson 2's
collectives (`tests/test_numerics_launch.py`), and what the tree cannot serve is refused by name:

    .venv/bin/torchrun --standalone --nproc-per-node 2 -m tp_from_scratch.numerics.train --tp 2 --vocab-size 64 --steps 20 --metrics runs/invariant_t2.jsonl
    .venv/bin/mpiexec -n 2 .venv/bin/python -m tp_from_scratch.numerics.train --tp 2 --vocab-size 64 --steps 20

`numerics.generate` is Lesson 6's `gpt.generate` (prefill, then decoding against the KV cache) on
the invariant GPT, through the same kind of hook; every step's logits are the same bits at every t
(`tests/test_numerics_training.py`), so are the ids (launched at t = 1, 2 and 4):

    .venv/bin/torchrun --standalone --nproc-per-node 2 -m tp_from_scratch.numerics.train --tp 2 --vocab-size 64 --steps 20 --save runs/invariant
    .venv/bin/torchrun --standalone --nproc-per-node 4 -m tp_from_scratch.numerics.generate --load runs/invariant --prompt 1,2,3 --new-tokens 20

## Exercise 13

Write `tree_all_reduce(comm, leaves, n_leaves)` and `invariant_row_parallel_matmul(comm, x_shard,
w_shard, n_leaves)` in `exercises/ex13_tree_reduction.py` on `comm.send` and `comm.recv`;
`.venv/bin/python -m pytest exercises -m ex13` grades them bit for bit: the tree at t = 1, 2, 4, 8
(and other trees), the same bits on every rank, odd t refused by name, empty and 0-d leaves,
integers, infinities and subnormals, the inputs untouched, new results (also after a second call),
and $\log_2 t$ messages to the recursive-doubling partners."""),
]

write_notebook(cells, HERE.parent / "13_tp_numerics.ipynb")
