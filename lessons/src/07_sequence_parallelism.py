"""Generate lessons/07_sequence_parallelism.ipynb (without outputs; `make lessons` executes it).

    .venv/bin/python lessons/src/07_sequence_parallelism.py
    .venv/bin/jupyter nbconvert --to notebook --execute --inplace lessons/07_sequence_parallelism.ipynb
"""
from pathlib import Path

from nbformat.v4 import new_code_cell, new_markdown_cell
from lesson_notebook import write_notebook

HERE = Path(__file__).resolve().parent

cells = [
    new_markdown_cell(r"""# Lesson 7 (ex07): sequence parallelism, and activation memory measured byte for byte

Tensor parallelism (Lessons 3-6) splits the weights and the work inside attention and the MLP
by t. But look at what every rank still holds in full: the residual stream, both LayerNorms
and their inputs, the inputs of the column layers. Those activations stay **Replicated**, so
activation memory stops shrinking as t grows. Korthikanti et al. (2022, "Reducing Activation
Recomputation in Large Transformer Models") noticed that these regions act on each position
on its own, so they can be split along the **sequence** instead: $(B, T, H) \to (B, T/t, H)$.
The all-reduce at each region boundary becomes a **reduce-scatter** and the identity becomes
an **all-gather**, and a ring reduce-scatter plus a ring all-gather *is* a ring all-reduce:
the same bytes on the wire, $1/t$ of the activations. (That holds for the block as the paper
draws it, section 4. The torch GPT of section 5 trades some bytes for memory: it gathers the
column layers' inputs again in backward instead of keeping them, and all-reduces the small
Partial gradients of LayerNorms and row biases, so it sends about 31 % more than the TP GPT;
section 5 measures both.)

What you will see:
1. where each activation of a block lives, with TP only and with TP + SP;
2. the paper's conjugate pair g / g-bar in numpy, and why LayerNorm's weight gradient needs an all-reduce;
3. the sequence-parallel block equal to the single-device block, t = 1..4, T not divisible by t;
4. the meter: 2 all-gathers + 2 reduce-scatters each way, exactly the TP block's bytes;
5. the torch GPT trained sequence-parallel, equal to one device, with the TP model's state dict;
   its collectives next to PyTorch's own `SequenceParallel` plan's, counted by `CommDebugMode`;
6. the bytes autograd saves for backward, **measured** per block, next to a formula for this model:
   measured / formula = 1.000 in every configuration; then the formula for the paper's 22B-1T models.

Legend: B batch, T sequence ($T_r$: this rank's positions), H hidden, F ffn, nh heads, hs head size,
t TP degree. Code: `tp_from_scratch/sequence_parallel/`. Exercise 7 (`exercises/ex07_sequence_parallel.py`)
asks for the two mappings and the LayerNorm backward."""),
    new_code_cell("""import sys, time
from pathlib import Path
if not (Path.cwd() / "tp_from_scratch").is_dir():  # run from lessons/: make the package importable
    sys.path.insert(0, str(Path.cwd().parent))

import numpy as np
import torch
import matplotlib.pyplot as plt

from tp_from_scratch.comm import run_spmd
from tp_from_scratch.compare import assert_matches_reference
from tp_from_scratch.layers import reference as ref
from tp_from_scratch.sharding import shard_sizes
from tp_from_scratch.testing import random_array, rank_rng
from tp_from_scratch.sequence_parallel import check, memory
from tp_from_scratch.sequence_parallel.mappings import (
    gather_from_sequence_parallel_region_forward, gather_from_sequence_parallel_region_backward,
    reduce_scatter_to_sequence_parallel_region_forward, reduce_scatter_to_sequence_parallel_region_backward,
    sequence_shard)
from tp_from_scratch.sequence_parallel.layernorm import (
    sequence_parallel_layernorm_forward, sequence_parallel_layernorm_backward)
from tp_from_scratch.sequence_parallel.figures import draw_block_layouts, plot_activation_memory
torch.set_num_threads(1)
START = time.perf_counter()"""),
    new_markdown_cell(r"""## 1. Where each activation lives

Rows are positions (T), columns hidden features (H, or F inside the MLP); each rank's part in
its colour, a **Partial** tensor (a full-size addend of a sum) hatched. With TP only, everything
outside attention and the MLP is **Replicated**: every rank normalises every position."""),
    new_code_cell("""draw_block_layouts(t=2, sequence_parallel=False)
plt.show()"""),
    new_markdown_cell(r"""With sequence parallelism the residual stream, the LayerNorms and the biases work on
**Sharded(seq)** (B, T/t, H) blocks. Entering attention or the MLP, the column layers need every
position, so an **all-gather along T** rebuilds (B, T, H); leaving them, the row layer's Partial
output is summed *and* split along T in one **reduce-scatter**.

| paper (Korthikanti 2022) | Megatron-LM code name | forward | backward |
|---|---|---|---|
| f (Lesson 3's f) | `copy_to_tensor_model_parallel_region` | identity | all-reduce |
| f-bar (Lesson 3's **g**) | `reduce_from_tensor_model_parallel_region` | all-reduce | identity |
| **g** | `gather_from_sequence_parallel_region` | all-gather(T) | reduce-scatter(T) |
| **g-bar** | `reduce_scatter_to_sequence_parallel_region` | reduce-scatter(T) | all-gather(T) |

The paper's g is *not* our Lesson 3 g (Megatron 2019, all-reduce forward): to keep one vocabulary
we use Megatron-LM's code names. g replaces f, g-bar replaces Lesson 3's g."""),
    new_code_cell("""draw_block_layouts(t=2, sequence_parallel=True)
plt.show()"""),
    new_markdown_cell(r"""## 2. The pair in numpy, on an uneven sequence

T need not divide by t: shards follow `numpy.array_split` (the first $T \bmod t$ ranks hold one more
position), the chunking `collectives.reduce_scatter` already uses, so each backward lands on the
shard its forward came from. T = 7 over t = 3 ranks gives 3, 2, 2 positions. Moving data is
exact; integer-valued data makes the sums exact too."""),
    new_code_cell("""t, T, B, H = 3, 7, 2, 4
full = random_array(rank_rng(0), (B, T, H))
print("positions per rank:", shard_sizes(T, t))

def pair(comm):
    x_shard = sequence_shard(comm, full)                                         # (B, T_r, H)
    gathered = gather_from_sequence_parallel_region_forward(comm, x_shard)       # g:  (B, T, H)
    partial = random_array(rank_rng(1, comm.rank), (B, T, H), integer=True)      # one addend per rank
    return (x_shard.shape, gathered, partial,
            gather_from_sequence_parallel_region_backward(comm, partial),        # g backward: RS
            reduce_scatter_to_sequence_parallel_region_forward(comm, partial),   # g-bar forward: RS
            reduce_scatter_to_sequence_parallel_region_backward(comm, x_shard))  # g-bar backward: AG

results = run_spmd(pair, t)
total = sum(r[2] for r in results)
for rank, (shape, gathered, _, g_back, gbar_fwd, gbar_back) in enumerate(results):
    assert_matches_reference(gathered, full, name="g forward", rank=rank, exact=True)
    assert_matches_reference(gbar_back, full, name="g-bar backward", rank=rank, exact=True)
    mine = np.array_split(total, t, axis=1)[rank]
    assert_matches_reference(g_back, mine, name="g backward", rank=rank, exact=True)
    assert_matches_reference(gbar_fwd, mine, name="g-bar forward", rank=rank, exact=True)
    print(f"rank {rank}: shard {shape} -> g -> {gathered.shape}; g-bar -> {gbar_fwd.shape}   all bit-exact")"""),
    new_markdown_cell(r"""### LayerNorm on a shard: the weight gradient is Partial

LayerNorm normalises each position over H, so a shard is normalised exactly as in the full
tensor. But its weight gradient is a sum over **all** positions, $\mathrm{dweight} = \sum_{b,\,s} dy \cdot \hat{x}$,
and a rank sees only its own: each rank's dweight (and dbias) is Partial. Left alone,
the Replicated LayerNorm weights would get different updates on every rank and drift apart.
One all-reduce of the (2H,) pair fixes it (Megatron-LM does the same for every parameter it
marks `sequence_parallel`)."""),
    new_code_cell("""rng = rank_rng(2)
x, dy = random_array(rng, (B, T, H)), random_array(rng, (B, T, H))
w, b = random_array(rng, (H,)), random_array(rng, (H,))
_, cache = ref.layernorm_forward(x, w, b)
_, dw_ref, db_ref = ref.layernorm_backward(dy, cache)

def layernorm(comm):
    y, c = sequence_parallel_layernorm_forward(comm, sequence_shard(comm, x), w, b)
    _, dw_partial, _ = ref.layernorm_backward(sequence_shard(comm, dy), c)       # without the all-reduce
    _, dw, db = sequence_parallel_layernorm_backward(comm, sequence_shard(comm, dy), c)
    return dw_partial, dw, db

for rank, (dw_partial, dw, db) in enumerate(run_spmd(layernorm, t)):
    off = np.abs(dw_partial - dw_ref).max()
    assert_matches_reference(dw, dw_ref, name="dweight", rank=rank)
    assert_matches_reference(db, db_ref, name="dbias", rank=rank)
    print(f"rank {rank}: own positions only: dweight off by {off:.2f};  all-reduced: equal to the reference")"""),
    new_markdown_cell(r"""## 3. The sequence-parallel block equals the single-device block

`check.check_everything` runs the block (`sequence_parallel/block.py`) on each rank's positions
against `layers.reference.block_forward/backward` on all of them: float64 and float32, $T = 2t$
and $T = 2t + 1$ (uneven), multi-head, grouped-query and multi-query attention. It compares the
output and dx shards and every parameter gradient (gathered), and checks the collectives:
forward 2 all-gathers + 2 reduce-scatters and nothing else, backward the same plus one
all-reduce per LayerNorm. The row-layer bias needs none: its backward has just all-gathered dy,
so the full bias gradient is summed from it. The same runs on real processes:

    .venv/bin/mpiexec -n 4 .venv/bin/python -m tp_from_scratch.sequence_parallel.check
"""),
    new_code_cell("""for t in (1, 2, 3, 4):
    compared = run_spmd(check.check_everything, t)
    print(f"t={t}: every rank compared {compared[0]} tensors with the reference: all match")"""),
    new_markdown_cell(r"""## 4. The meter: the same bytes as tensor parallelism

A ring all-reduce of N elements is a ring reduce-scatter then a ring all-gather. SP performs the
same two halves, with the block's computation in between. So per block and direction, SP's
all-gathers + reduce-scatters must send exactly the TP block's all-reduce bytes: per rank when
t divides T (the T-chunks are then the all-reduce's chunks), and summed over ranks always."""),
    new_code_cell("""rows = []
for t, T in [(2, 8), (4, 8), (3, 6), (3, 7), (4, 7)]:
    heads = 6 if t == 3 else 4
    config = ref.BlockConfig(hidden=2 * heads, n_heads=heads, n_kv_heads=heads // 2, ffn=4 * 2 * heads)
    params = ref.init_block_params(rank_rng(0), config)
    x, dy = random_array(rank_rng(1), (2, T, config.hidden)), random_array(rank_rng(2), (2, T, config.hidden))
    sp = run_spmd(lambda comm: check.block_traffic(comm, params, config, x, dy, True), t)
    tp = run_spmd(lambda comm: check.block_traffic(comm, params, config, x, dy, False), t)
    for direction, d in (("forward", 0), ("backward", 1)):
        calls = {k: v["calls"] for k, v in sp[0][d].items()}
        sp_bytes = [sum(r[d][k]["bytes_sent"] for k in ("all_gather", "reduce_scatter")) for r in sp]
        tp_bytes = [r[d]["all_reduce"]["bytes_sent"] for r in tp]
        ln_bytes = sum(r[d].get("all_reduce", {}).get("bytes_sent", 0) for r in sp)
        assert sum(sp_bytes) == sum(tp_bytes)
        if T % t == 0:
            assert sp_bytes == tp_bytes
        rows.append((t, T, direction, calls, sp_bytes, tp_bytes, ln_bytes))
print(f"{'t':>2} {'T':>2} {'direction':<9} {'SP collectives':<54} {'SP AG+RS bytes per rank':<26} {'TP all-reduce bytes':<24} LN grads, all ranks")
for t, T, direction, calls, spb, tpb, ln in rows:
    print(f"{t:>2} {T:>2} {direction:<9} {str(calls):<54} {str(spb):<26} {str(tpb):<24} {ln}")"""),
    new_markdown_cell(r"""When T = 7 is split over 3 or 4 ranks, the per-rank bytes differ (the T-chunks are not the
all-reduce's flat chunks) but the totals agree to the byte. The only extra traffic is the
LayerNorm gradients: 2 all-reduces of 2H values per block, tiny next to (B, T, H). (The last
column is summed over the ranks, unlike the two per-rank lists beside it: 512 at t = 2 is 2
all-reduces $\times$ 128 B $\times$ 2 ranks.)

## 5. The torch GPT, sequence-parallel

`sequence_parallel/nn.py` has the two mappings as autograd Functions (group first), and the
layers as functions of the **tensor-parallel modules' own parameters**:
`sequence_parallel_layer_norm` passes the LayerNorm weight and bias through f (identity forward,
all-reduce backward: their gradients are Partial), `column_linears_from_sequence` gathers once
for q, k and v, and `row_linear_to_sequence` reduce-scatters the row output and adds f(bias).
`SequenceParallelGPT` holds the TP GPT's modules, so its state dict *is* the TP
one: a checkpoint does not know whether it was trained with SP. Here: 4 AdamW steps in float64
on simulated ranks, T = 15 (uneven for t = 2 and 4), GQA with nkv = 2 (at t = 4 each KV head is
held by two ranks), against the single-device GPT."""),
    new_code_cell("""import copy
from tp_from_scratch.gpt.model import GPTConfig, init_gpt
from tp_from_scratch.gpt.parallelize import gpt_to_tp, shard_state_dict
from tp_from_scratch.gpt.step import train_step
from tp_from_scratch.sequence_parallel.model import gpt_to_sp

gpt_config = GPTConfig(vocab_size=67, seq_len=16, n_layers=2, hidden=32, n_heads=4, n_kv_heads=2)
gen = torch.Generator().manual_seed(1)
batches = [(torch.randint(0, 67, (2, 15), generator=gen), torch.randint(0, 67, (2, 15), generator=gen))
           for _ in range(4)]

def train(model):   # Lesson 6's step (gpt.step.train_step) on each batch
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
    losses = [train_step(model, opt, idx, targets).item() for idx, targets in batches]
    return losses, model.state_dict()

reference = init_gpt(gpt_config, seed=0, dtype=torch.float64)
single, single_weights = train(copy.deepcopy(reference))
print("single device :", " ".join(f"{l:.12f}" for l in single))
for t in (2, 4):
    def rank_run(comm):
        losses, weights = train(gpt_to_sp(comm, reference))
        same_names = list(gpt_to_tp(comm, reference).state_dict()) == list(weights)
        for name, want in shard_state_dict(single_weights, t, comm.rank, gpt_config).items():
            assert_matches_reference(weights[name], want, name=name, rank=comm.rank)
        return losses, same_names
    per_rank = run_spmd(rank_run, t)
    for step, (got, want) in enumerate(zip(per_rank[0][0], single)):
        assert_matches_reference(np.float64(got), np.float64(want), name=f"loss at step {step}")
    assert all(same for _, same in per_rank)
    diff = max(abs(a - b) for a, b in zip(per_rank[0][0], single))
    print(f"tp+sp, t={t}   :", " ".join(f"{l:.12f}" for l in per_rank[0][0]),
          f"  max |diff| {diff:.1e}; trained shards equal; state-dict names = TP's")"""),
    new_markdown_cell(r"""### What the torch models send, per training step

The meter of the simulated ranks (our ring collectives) for one forward and backward of the
TP and the SP GPT (2 layers, t = 2). SP's all-gathers and reduce-scatters replace the TP
blocks' all-reduces, and backward adds what the numpy block did not have: one more all-gather
per column group (the input is gathered again instead of being kept: the memory saving of
section 6), and an all-reduce for each Partial LayerNorm weight, LayerNorm bias and row bias
(f on each parameter; Megatron-LM coalesces them into one buffer). The embedding's all-reduce
and the cross-entropy's small all-reduces are the same in both. That embedding is the one place
where this SP leaves bytes on the table: the vocab-parallel embedding's Partial output is
all-reduced in full and then split to this rank's positions, where a reduce-scatter straight
into the sequence shard would do (Megatron-LM does that under SP). Totals: 77,520 B for TP
against 101,584 B for TP+SP on rank 0, +31 %, the price of the re-gathers that section 6 turns
into memory."""),
    new_code_cell("""def one_step_traffic(comm, build):
    model = build(comm, reference)
    comm.meter.reset()
    _, loss = model(*batches[0])
    loss.backward()
    return {name: (t.calls, t.bytes_sent) for name, t in sorted(comm.meter.by_collective.items())}

for name, build in (("TP", gpt_to_tp), ("TP+SP", gpt_to_sp)):
    traffic = run_spmd(lambda comm: one_step_traffic(comm, build), 2)[0]
    total = sum(b for _, b in traffic.values())
    print(f"{name:<6} rank 0: " + ", ".join(f"{k} {c} calls {b:,} B" for k, (c, b) in traffic.items())
          + f";  total {total:,} B")"""),
    new_markdown_cell(r"""### Ours next to PyTorch's `SequenceParallel`, call by call

`sequence_parallel/dtensor_plan.py` builds the same GPT with PyTorch's styles: `SequenceParallel`
on the LayerNorms, `PrepareModuleInput` Shard(1) -> Replicate in front of attention and the MLP
(the paper's g), `RowwiseParallel(output_layouts=Shard(1))` for o and proj (g-bar). On real
processes it trains to the single-device losses (float64, difference 0), and
`torch.distributed.tensor.debug.CommDebugMode` counts its collectives in one forward and one
backward, while `gpt.traffic.CollectiveCounter` counts ours on the same batch. A torchrun launch
takes longer than this notebook may, so the counts come from a committed file, written by the
command printed below (a test reruns it and checks the file is still what it gives)."""),
    new_code_cell("""import json
ROOT = Path.cwd() if (Path.cwd() / "tp_from_scratch").is_dir() else Path.cwd().parent
counts = json.loads((ROOT / "lessons" / "measurements" / "sp_collectives.json").read_text())
c = counts["config"]
print(f"GPT {c['layers']} layers, H={c['hidden']}, V={c['vocab']}, B={c['batch']}, T={c['seq_len']}, t={c['tp']}, "
      f"{c['dtype']}\\nmeasured with: {counts['command']}\\n")
print(f"{'calls':<15} {'ours fwd':>9} {'DTensor fwd':>12} {'ours bwd':>9} {'DTensor bwd':>12}")
for kind in ("all-gather", "reduce-scatter", "all-reduce"):
    cells = [counts[who][d].get(kind, 0) for d in ("forward", "backward") for who in ("ours", "dtensor")]
    print(f"{kind:<15} {cells[0]:>9} {cells[1]:>12} {cells[2]:>9} {cells[3]:>12}")
print("\\nDTensor's gradients still Partial after backward:",
      ", ".join(counts["dtensor_partial_gradients_after_backward"]))"""),
    new_markdown_cell(r"""Forward, the two agree where they do the same work: per block 2 all-gathers and 2
reduce-scatters, plus one all-gather leaving the region (ours in front of the LM head, DTensor's
after the last block). Our 4 extra all-reduces are the vocabulary sharding DTensor's plan does not
do: one for the vocab-parallel embedding, three in the vocab-parallel cross-entropy (max, target
logit, sum of exponentials).

Backward, they differ in three ways, each visible in the counts:
* **Re-gathering.** Ours has 4 more all-gathers: the column layers' gathered inputs are not kept
  but gathered again (Korthikanti §4.2.2), which is what makes the activation memory of section 6
  shrink with t. DTensor keeps them. Ours: 4 re-gathers + 4 for g-bar's backward + 1 for the scatter
  entering the region = 9; DTensor: 4 + 1 = 5.
* **g's backward.** Ours reduce-scatters each column group's summed input gradient (one for q, k, v
  together, one for fc: 2 per block, plus the LM head's: 5). DTensor has *no* reduce-scatter in
  backward: it all-reduces the Partial input gradient of each colwise layer separately (q, k, v and
  fc: 4 per block, 8 here) and then keeps its own positions. Same result; but a ring all-reduce
  sends twice the bytes of a ring reduce-scatter, and there is one per layer instead of one per group.
* **LayerNorm gradients.** Ours all-reduces every Partial parameter gradient in backward: 5
  LayerNorms $\times$ (weight, bias) + 4 row biases = 14 (Megatron-LM coalesces them into one buffer).
  DTensor leaves the LayerNorm gradients Partial after backward (listed above) and sums them when
  an operation needs them Replicate: in the optimizer step, outside what was counted. Its row
  biases' gradients are not in that list: they come from the all-gathered output gradient, whole.
  Ours adds the row bias on the sequence shard, after the reduce-scatter, so autograd sees it
  used on $T_r$ positions only: its gradient is Partial and needs the sum, 4 more all-reduces of
  H values per step. The numpy block of section 3 needed none because its hand-written backward
  computes the bias gradient from the dy that g-bar's backward has just all-gathered (every
  position); autograd computes a parameter's gradient where the parameter is used, so the torch
  block would need a fused Function (bias inside g-bar) to do the same. Megatron-LM makes our
  choice: under SP it marks the row bias as sequence-parallel and all-reduces its gradient with
  the LayerNorms'.

On gloo, a reduce-scatter is itself emulated with an all-reduce underneath, so wire bytes on CPU
are not a ring's; the byte-exact comparison with tensor parallelism is our meter's, section 4."""),
    new_markdown_cell(r"""## 6. Activation memory, measured

`memory.saved_bytes_per_block` runs one forward under `torch.autograd.graph.saved_tensors_hooks`:
every tensor autograd keeps for backward passes through the pack hook, which books its storage's
bytes once (q, k and v share their input: booked once), skips parameters (weights are not
activations), and charges the block running at the time. Then the formula, derived for **this**
model (`gpt/model.py`: pre-LN, GeLU, $F = 4H$, GQA, no dropout, $e$ = the dtype's itemsize), per rank:

| tensor saved for backward | one device, or TP | TP + SP |
|---|---|---|
| inputs of ln1 and ln2 (the residual stream) | $2eBTH$ | $2eBT_rH$ |
| LayerNorm mean and 1/std (2 per LayerNorm) | $4eBT$ | $4eBT_r$ |
| inputs of the column layers (q/k/v's, fc's) | $2eBTH$ | $2eBT_rH$ |
| q, k, v (k and v already repeated to nh heads), o's input | $4eBTH/t$ | same |
| softmax output | $eB\,nh\,T^2/t$ | same |
| causal mask (bool, not per batch or head) | $T^2$ | same |
| GeLU input, proj input | $2eBTF/t$ | same |

Under SP the column layers keep only the shard of their input and all-gather it again in
backward (the paper's §4.2.2: one more all-gather, overlapped with compute in Megatron-LM).
With TP only, the first three rows do not shrink with t; with SP only the causal mask does not.

**Selective recomputation** (`gpt_to_sp(..., recompute_attention=True)`, the paper's §5): the
attention core $\mathrm{softmax}(q k^\top/\sqrt{hs} + \text{mask})\, v$ becomes one autograd Function that keeps only q, k and
v and runs again in backward. The softmax output, the repeated k and v and the mask leave memory;
k and v are now kept with this rank's KV heads only, so here GQA does save memory:
$2eBT\max(nkv/t, 1)\,hs$ instead of $2eBTH/t$. The max: with $t > nkv$ the KV heads are
replicated (Lesson 4) and each rank keeps one whole head, not a fraction of one. That is why,
below, TP+SP+selective keeps a little *more* than $1/8$ of its t = 1 bytes at t = 8 (nkv = 4:
k and v stop shrinking after t = 4), while TP+SP keeps $1/8$ plus only the causal mask."""),
    new_code_cell("""course = GPTConfig()                       # the trainer's default GPT: H=64, nh=8, nkv=4, F=256, 2 layers
BATCH, SEQ = 4, 32
ts = [1, 2, 4, 8]
rows = memory.measure_block_memory(course, BATCH, SEQ, ts, dtype=torch.float32)
print(f"{'model':<16} {'t':>2} {'rank':>4} {'measured B/block':>17} {'formula':>9} {'measured/formula':>17}")
for r in rows:
    for m in r["measured"]:
        assert m == r["formula"], r          # exact, for every block and every rank
    if r["rank"] == 0:
        print(f"{r['model']:<16} {r['t']:>2} {r['rank']:>4} {r['measured'][0]:>17,} {r['formula']:>9,} "
              f"{r['measured'][0] / r['formula']:>17.3f}")
print(f"every rank, every block, {len(rows)} (model, t, rank) rows: measured / formula = 1.000 exactly")

def at(model, t):
    return next(r["measured"][0] for r in rows if r["model"] == model and r["t"] == t and r["rank"] == 0)
predicted = {m: [sum(memory.block_activation_bytes(course, BATCH, SEQ, 4, t, 0, m != "TP",
                                                    recompute_attention=m.endswith("selective")).values())
                  for t in ts] for m in ("TP", "TP+SP", "TP+SP+selective")}
measured = {m: [at(m, t) for t in ts] for m in predicted}
for m in measured:
    print(f"{m:<16}: a rank keeps {measured[m][2] / measured[m][0]:.1%} of its t=1 bytes at t=4, "
          f"{measured[m][3] / measured[m][0]:.1%} at t=8 ({measured[m][0] / measured['TP'][0]:.0%} of TP's at t=1)")
fig, ax = plt.subplots(figsize=(6, 3.5))
plot_activation_memory(ax, ts, measured, predicted)
ax.set_title(f"course GPT, B={BATCH}, T={SEQ}, float32")
plt.show()"""),
    new_markdown_cell(r"""### Against Korthikanti et al.'s $sbh(34 + 5as/h)$

Their count (16-bit activations, GPT-3 with dropout, $s = T$, $b = B$, $h = H$, $a = nh$) and ours at
$e = 2$, $F = 4H$, term by term:

| | Korthikanti (bytes) | ours, $e = 2$ | the difference |
|---|---|---|---|
| attention, linear parts | $11\,sbh$ | $10\,sbh$ | their dropout mask after the output projection (1 byte per element) |
| attention scores | $5\,as^2b$ | $2\,as^2b + s^2$ | theirs: softmax output (2), dropout mask (1), dropout output (2); ours: no dropout, plus our bool causal mask |
| MLP | $19\,sbh$ | $18\,sbh$ | their dropout mask after the MLP |
| LayerNorms | $4\,sbh$ | $4\,sbh + 8\,sb$ | LayerNorm's mean and 1/std, which they leave out |
| GQA | (multi-head) | no saving | our attention repeats k and v to the nh query heads before the matmuls, and those copies are what is saved |

So our model is $sbh(32 + 2as/h) + 8sb + s^2$ bytes per layer on one device, and with TP+SP
everything but the $s^2$ mask divides by t. Their formulas, per layer, for the four models of their
Table 3: sequence s = 2048 and tensor-parallel t = 8 for all four; pipeline p = 1, 8, 35, 64;
global batch 4, 64, 280, 512 (micro-batch 4, 1, 1, 1), i.e. 8, 64, 280, 512 GPUs."""),
    new_code_cell("""# (name, a heads, h hidden, L layers, p pipeline, global batch, b micro-batch); s = 2048, t = 8
# (Korthikanti et al. 2022, Table 3)
paper = [("22B", 64, 6144, 48, 1, 4, 4), ("175B", 96, 12288, 96, 8, 64, 1),
         ("530B", 128, 20480, 105, 35, 280, 1), ("1T", 160, 25600, 128, 64, 512, 1)]
s, t, GiB = 2048, 8, 2**30
print(f"{'model':<5} {'no parallelism':>15} {'TP':>8} {'TP+SP':>8} {'TP+sel.':>8} {'TP+SP+sel.':>11}   GiB per layer"
      f"   L layers (a 1F1B first stage holds L layers' worth), TP -> TP+SP")
for name, a, h, L, p, batch, b in paper:
    k = lambda **kw: memory.korthikanti_bytes(s, b, h, a, **kw) / GiB
    none, tp, sp = k(), k(t=t), k(t=t, sequence_parallel=True)
    tp_sel, sp_sel = k(t=t, selective=True), k(t=t, sequence_parallel=True, selective=True)
    print(f"{name:<5} {none:>15.2f} {tp:>8.2f} {sp:>8.2f} {tp_sel:>8.2f} {sp_sel:>11.2f}   "
          f"{' ' * 13}{L * tp:7.1f} -> {L * sp:6.1f} GiB (x{tp / sp:.1f} less)")"""),
    new_markdown_cell(r"""With TP alone at t = 8 a layer keeps $sbh(10 + 3 + 5as/(ht))$: the replicated $10\,sbh$ (of which
our model has $8\,sbh + 8\,sb$) no longer shrinks, and it is 38 % of the layer's bytes for 22B
(where the attention scores, $5as/(ht) = 13.3$, are larger), 43 % for 175B (a tie: 10 against
10) and 48 % for 530B and 1T (the largest single term, 10 against 8). Pipeline parallelism does not help here: with the 1F1B schedule the first stage keeps
its $L/p$ layers' activations for p micro-batches in flight, L layers' worth (each of the four runs
has at least p micro-batches per step: 280 for 530B at p = 35). For the 530B model
that is about 86 GiB per GPU with TP alone, more than an 80 GB A100 holds in total, hence full
recomputation before this paper. TP+SP divides every term by t; with selective recomputation
of the attention core (the $5as/h$ term) as well, the paper needs no other recomputation.

## Run it on real processes

* `.venv/bin/torchrun --standalone --nproc-per-node 2 -m tp_from_scratch.sequence_parallel.train --tp 2 --compare-single`:
  Lesson 6's trainer with the model run sequence-parallel (`--recompute-attention` for selective
  recomputation); every step against one device. Its header says `(scratch)`: `--impl scratch`,
  our layers (the default), on torch's native collectives (`--collectives native`, the default;
  `--collectives scratch` for our ring collectives). Its traffic summary names gloo's collective
  `reduce_scatter_single`: torch's name for a reduce-scatter of one tensor.
  Add `--impl dtensor` for PyTorch's `SequenceParallel` plan in the same trainer (with dp > 1 too).
* Checkpoints: the SP model's state dict is the TP model's, so a checkpoint does not know whether
  SP was on. `... sequence_parallel.train --tp 2 --steps 20 --save runs/sp`, then
  `.venv/bin/torchrun --standalone --nproc-per-node 4 -m tp_from_scratch.gpt.train --tp 4 --steps 50 --load runs/sp`
  continues it without SP at another t (and the other way round); a test checks such a chain
  step by step against one uninterrupted single-device run.
* `.venv/bin/torchrun --standalone --nproc-per-node 2 -m tp_from_scratch.sequence_parallel.dtensor_plan --write FILE`:
  the plan's losses against one device and the collective counts of the table above.
* `.venv/bin/torchrun --standalone --nproc-per-node 2 -m tp_from_scratch.bench train --sequence-parallel`: step
  time of ours, ours with selective recomputation and DTensor's plan, in alternating rounds, and the
  cost of recomputation as a ratio (one more attention forward per block in backward; measured on a
  quiet machine in `lessons/measurements/sp_step_time.txt`).

Exercise 7: `exercises/ex07_sequence_parallel.py`, graded by `.venv/bin/python -m pytest exercises -m ex07`."""),
    new_code_cell("""print(f"lesson executed in {time.perf_counter() - START:.1f} s")"""),
]

write_notebook(cells, HERE.parent / "07_sequence_parallelism.ipynb")
