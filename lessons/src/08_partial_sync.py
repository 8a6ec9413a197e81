"""Generate lessons/08_partial_sync.ipynb (without outputs; `make lessons` executes it).

    .venv/bin/python lessons/src/08_partial_sync.py
    .venv/bin/jupyter nbconvert --to notebook --execute --inplace lessons/08_partial_sync.ipynb
"""
from pathlib import Path

from nbformat.v4 import new_code_cell, new_markdown_cell
from lesson_notebook import write_notebook

HERE = Path(__file__).resolve().parent

cells = [
    new_markdown_cell(r"""# Lesson 8 (ex08): partially synchronized activations (CAAT-Net, 2025)

Every block of Megatron TP ends its attention and its MLP with g: an all-reduce of a
(B, T, H) activation, forward, and another one backward. On large TP groups these all-reduces
are what the GPUs wait for. The 2025 advance that reduces the communication overhead of
large clusters is to **not synchronize all of it**: *Tensor-Parallelism with Partially
Synchronized Activations* (CAAT-Net, arXiv 2506.19645, NeurIPS 2025)
all-reduces only a leading fraction p of the H hidden channels and lets each rank keep its
own value in the rest. The paper reports cutting the TP communication by up to half (p = 0.5)
with no significant loss in pretraining quality for Llama-style models up to 7B parameters.

What changes compared with Lessons 4-6:

| | Megatron TP | CAAT, sync fraction p |
|---|---|---|
| row-parallel output (attention `o`, MLP `proj`) | g: all-reduce all H channels | **partial reduce**: all-reduce channels `[:k]`, $k = \lfloor pH \rfloor$; channels `[k:]` keep this rank's partial sum, times √t |
| backward of that output | identity | all-reduce of the gradient's `[:k]`; `[k:]` times √t |
| column-parallel input (q, k, v, fc) | f in every block | **no f**: each rank reads its own stream |
| f | one per block input | **one**, where the embedding enters the stack |
| LayerNorms, row biases | gradients equal on every rank | gradients **summed over the TP group** |
| LM head | after f, on the common hidden state | vocabulary shard r reads **rank r's own stream** |

So each rank carries its own residual stream: equal to the others in the synced channels,
its own in the private ones. The model now depends on t: p = 1 computes ordinary TP, and a
p < 1 checkpoint cannot be resharded to another t. Even at p = 1 the communication sits in
other places than Megatron's: the backward all-reduce of f before each column group is gone
(there is no f), and the row output's backward, identity in Megatron, all-reduces instead
(all of [:k] = all H channels). Per block it is the same count: two all-reduces forward, two
backward. In this lesson we build it twice, SPMD on t
ranks and as a single-device model that computes all t streams explicitly, and check that
they agree on every output and every gradient. Then we measure what it costs in loss.

Shapes: B batch, T sequence, H hidden, F ffn, V vocab, t TP degree, k synced channels.
Library: `tp_from_scratch/partial_sync/` (numpy: `mappings.py`, `block.py`, `reference.py`;
torch: `autograd.py`, `model.py`, `train.py`; `experiment.py`). Exercise 8 asks you to write
the torch Function and the gradient rule yourself."""),
    new_code_cell("""import sys, json
from pathlib import Path
if not (Path.cwd() / "tp_from_scratch").is_dir():  # run from lessons/: make the package importable
    sys.path.insert(0, str(Path.cwd().parent))
REPO = Path.cwd() if (Path.cwd() / "tp_from_scratch").is_dir() else Path.cwd().parent

import numpy as np
import torch
import matplotlib.pyplot as plt
from IPython.display import Image, Markdown, display

from tp_from_scratch.comm import run_spmd
from tp_from_scratch.compare import assert_matches_reference
from tp_from_scratch.testing import random_array, rank_rng
from tp_from_scratch.partial_sync import check, experiment, mappings, reference
from tp_from_scratch.partial_sync.figures import draw_streams
torch.set_num_threads(1)"""),
    new_markdown_cell(r"""## 1. Synced and private channels

Four ranks, H = 8, p = 0.5. The embedding output is one Replicated tensor; the single f at
the stack's entry hands it to every rank. From the first partial reduce on, the first
k = 4 channels are sums over all ranks (equal everywhere), and the other 4 are each rank's
own. Because the private channels feed the next LayerNorm and the next column layers, the
streams differ in *every* channel's downstream computation, but only the synced slice is
ever exchanged."""),
    new_code_cell("""fig, ax = plt.subplots(figsize=(11, 2.9))
draw_streams(ax, t=4, n_blocks=2, hidden=8, p=0.5)
fig.tight_layout()
plt.show()"""),
    new_markdown_cell(r"""## 2. The partial reduce, forward and backward

Write rank r's row-parallel output as a Partial tensor x_r (B, T, H): the true sum is Σ_r x_r.
The partial reduce gives stream s

$$z_s[:k] = \sum_r x_r[:k], \qquad z_s[k:] = \sqrt{t}\; x_s[k:].$$

**Backward, derived.** The loss depends on every stream, $L = L(z_0, \dots, z_{t-1})$. Channel j < k
of x_r reaches *every* stream with weight 1, so ∂L/∂x_r[j] = Σ_s ∂L/∂z_s[j]: an all-reduce of
the gradients' synced slice, the same slice as forward (an implementation that reduced
another slice backward would not be this map's transpose). Channel j ≥ k of x_r reaches only
stream r, times √t, so ∂L/∂x_r[j] = √t ∂L/∂z_r[j]: local. The backward is the same formula as
the forward: the map is J ⊗ I on the synced channels (J the t x t matrix of ones) and √t I on
the private ones, a symmetric matrix, its own transpose. That is a different property from
Megatron's pair: f and g are two different maps (identity and all-reduce), each the
transpose of the other.

`mappings.partial_reduce_forward(comm, x, p)` does it in numpy with one all-reduce of the
(B, T, k) slice, so the meter sees k/H of a full all-reduce's bytes. ($k = \lfloor pH \rfloor$, like
the authors' `int(hidden * drop_p)`: their code, `_PartialReduceFromModelParallelRegion` in
`megatron/core/tensor_parallel/mappings.py` of GitHub's itlamp/Megatron-LM-comms at commit 80d888f8;
a product within 1e-9 of an integer counts as that integer.)"""),
    new_code_cell("""t, shape = 4, (2, 16, 64)
for p in (1.0, 0.75, 0.5, 0.25, 0.0):
    def on_rank(comm):
        x = random_array(rank_rng(0, comm.rank), shape)
        z = mappings.partial_reduce_forward(comm, x, p)
        return comm.meter.bytes_sent
    sent = run_spmd(on_rank, t)
    k = mappings.synced_channels(shape[-1], p)
    print(f"p = {p:<4}  k = {k:2d} of {shape[-1]}   bytes sent per rank {sent[0]:>7,}   "
          f"= {sent[0] / (2 * (t - 1) / t * np.prod(shape) * 8):.2f} of a full ring all-reduce")"""),
    new_markdown_cell(r"""## 3. Why √t

A row-parallel output is a sum of t partial products. If they are roughly independent and of
equal variance σ², a synced channel carries variance tσ², a private channel only σ². The
next LayerNorm normalises over all H channels at once, so without a correction the private
channels would enter it t times weaker than the synced ones, and the residual stream would
be a mixture of two scales. Multiplying the private channels by √t restores one scale.
(One could instead scale the private rows of the weights once, at initialisation; but that
correction fades as the weights train. Scaling the activations forward, and so the gradients
backward, holds at every step: we do that.)"""),
    new_code_cell("""rng = np.random.default_rng(0)
for t in (2, 4, 8):
    partials = rng.standard_normal((t, 100_000))              # t ranks' partial sums of one channel
    print(f"t = {t}: var(synced) = {partials.sum(0).var():5.2f}   var(private) = {partials[0].var():4.2f}"
          f"   var(sqrt(t) * private) = {(np.sqrt(t) * partials[0]).var():5.2f}")"""),
    new_markdown_cell(r"""## 4. Parameters shared by the streams need their gradients summed

In ordinary TP a LayerNorm only ever sees Replicated tensors, so every rank computes the
same, complete gradient for its weight. In CAAT each rank applies the LayerNorm (and adds
the row-parallel biases) to **its own stream**. The single-device model uses one weight
for all t streams, so its gradient is the sum of t contributions, one per stream; rank r
only computes contribution r. Hence one all-reduce of all these small gradients after
backward (`sum_replicated_grads` in numpy, `all_reduce_replicated_grads` in torch). The position embedding is added
before the entry's f, where the streams are still one: it needs nothing.

Below, each rank's own `ln1.weight` gradient before the sum: they differ, and only their
sum is the t-stream reference's gradient."""),
    new_code_cell("""from tp_from_scratch.partial_sync import block
from tp_from_scratch.layers.block import shard_block_params
from tp_from_scratch.partial_sync.params import init_stack_params
t, p = 2, 0.5
config = check.check_config(t)
rng = rank_rng(1)
params = init_stack_params(rng, config, 2)
x = random_array(rng, (2, 3, config.hidden))
dys = random_array(rng, (t, 2, 3, config.hidden))
ys, cache = reference.streams_stack_forward(x, params, config, t, p)
_, grads_ref = reference.streams_stack_backward(dys, cache)

def on_rank(comm):
    local = [shard_block_params(prm, config, t, comm.rank) for prm in params]
    y, caches = block.parallel_stack_forward(comm, x, local, config, p)
    own = []
    for c in reversed(caches):             # the backward by hand, block by block, WITHOUT the sum
        dy_block = dys[comm.rank] if not own else dx
        dx, g = block.parallel_block_backward(comm, dy_block, c)
        own.append(g)
    return own[-1]["ln1.weight"]           # block 0's

own = run_spmd(on_rank, t)
for r, g in enumerate(own):
    print(f"rank {r}'s own grad of ln1.weight[:4]: {np.round(g[:4], 4)}")
print(f"their sum:                      {np.round(sum(own)[:4], 4)}")
print(f"t-stream reference:             {np.round(grads_ref[0]['ln1.weight'][:4], 4)}")
assert_matches_reference(sum(own), grads_ref[0]["ln1.weight"], name="summed ln1.weight grad")"""),
    new_markdown_cell(r"""## 5. Equal to the single-device t-stream model

`reference.streams_stack_forward(x, params, config, t, p)` is the CAAT model on **one device**: a
leading stream axis (t, B, T, H), stream s using rank s's shard of every column and row
weight, the partial reduce written as a sum over that axis. `block.parallel_stack_forward(comm, ...)`
is the SPMD version, one stream per rank. `check.check_stack` compares this rank's output
with stream `rank` of the reference, dx, every parameter gradient (gathered), and the bytes
the forward sent. At p = 1 the reference is the ordinary block stack of Lessons 3-4
(tests/test_partial_sync.py checks that too)."""),
    new_code_cell("""for t in (1, 2, 3, 4):
    worst = 0.0
    for p in check.SYNC_FRACTIONS:
        verdicts = run_spmd(check.check_stack, t, check.check_config(t), p)
        worst = max(worst, *(v.error for v in verdicts[0]))
    print(f"t = {t}: outputs, dx and all {len(verdicts[0]) - 2} gradients match for p in "
          f"{check.SYNC_FRACTIONS} (largest error over every p {worst:.1e})")"""),
    new_markdown_cell(r"""The same check on real processes, from the repository root:

    .venv/bin/mpiexec -n 4 .venv/bin/python -m tp_from_scratch.partial_sync.check

The torch GPT of Lesson 6 gets the same treatment in `partial_sync/model.py`: `caat_from_gpt`
applies Lesson 6's sharding plan to the GPT with its own style table (`caat_styles`): column
layers with `input_is_copied=True` (no f), a `PartialSyncRowParallelLinear`, and one f at the
entry; `t_stream_forward(gpt, ...)` is its
single-device twin on the GPT's own parameters. Twenty AdamW steps in float64 on two
simulated ranks, against the single-device t-stream model:"""),
    new_code_cell("""from tp_from_scratch.partial_sync import train as caat_train
argv = ["--tp", "2", "--sync-fraction", "0.5", "--steps", "20", "--dtype", "float64",
        "--hidden", "32", "--heads", "4", "--kv-heads", "2", "--seq-len", "16", "--batch-size", "4"]
ranks = run_spmd(caat_train.train_on_comm, 2, argv, timeout=120)
single = caat_train.t_stream_losses(argv)
for step in (0, 1, 10, 19):
    print(f"step {step:2d}: 2 ranks {ranks[0]['losses'][step]:.12f}   one device {single[step]:.12f}")
for step, (a, b) in enumerate(zip(ranks[0]["losses"], single)):
    assert_matches_reference(torch.tensor(a, dtype=torch.float64), torch.tensor(b, dtype=torch.float64),
                             name=f"loss at step {step}")
print("every step equal (float64 tolerance);", f"TP bytes per step on rank 0: {ranks[0]['bytes_sent'][0]:,}")"""),
    new_markdown_cell(r"""Where those bytes go, one step at t = 2 (every all-reduce a ring's, Lesson 2: at t = 2 a rank
sends the payload once): (B, T, H) = (4, 16, 32) float64 activations, k = 16 synced channels."""),
    new_code_cell("""B, T, H, k, e = 4, 16, 32, mappings.synced_channels(32, 0.5), 8
def ring(elements):
    return mappings.ring_all_reduce_bytes(elements, e, 2, 0)
ledger = [("embedding's all-reduce (vocab-parallel, forward)", ring(B * T * H)),
          ("4 partial reduces forward, (B, T, k) each", 4 * ring(B * T * k)),
          ("3 cross-entropy all-reduces (max, target, sum-exp), B*T each", 3 * ring(B * T)),
          ("4 partial reduces backward", 4 * ring(B * T * k)),
          ("the entry f's all-reduce backward, (B, T, H)", ring(B * T * H)),
          ("replicated gradients, one all-reduce: 5 LayerNorms x 2 x H + 4 row biases x H", ring(5 * 2 * H + 4 * H))]
for what, nbytes in ledger:
    print(f"{nbytes:>8,}  {what}")
print(f"{sum(b for _, b in ledger):>8,}  total; the meter counted {ranks[0]['bytes_sent'][0]:,}")
assert sum(b for _, b in ledger) == ranks[0]["bytes_sent"][0]"""),
    new_markdown_cell(r"""The same under real processes (tests/test_partial_sync_torch.py runs both):

    .venv/bin/torchrun --standalone --nproc-per-node 2 -m tp_from_scratch.partial_sync.train --tp 2 --sync-fraction 0.5 --compare-single --dtype float64

## 6. What does it cost? Held-out loss against bytes

`.venv/bin/python -m tp_from_scratch.partial_sync.experiment` trains the course GPT (H = 64, 2 layers,
V = 67) at tp = 2 and 4 for p in {1, 0.75, 0.5, 0.25, 0}, three seeds each, on the same
tokens of the Markov chain, and scores it on held-out tokens. Bytes per step and step time
come from the CAAT GPT on simulated ranks; the losses from its t-stream twin (equal to it, as just
checked, and several times faster on 2 cores). The committed run:"""),
    new_code_cell("""results = json.loads((REPO / "lessons/measurements/partial_sync.json").read_text())
print(results["command"], f"({results['wall_s']:.0f} s wall, {results['cpu_s']:.0f} s of CPU on a shared 2-core machine)")
print(f"{results['steps']} steps x {results['batch_size']} sequences x {results['config']['seq_len']} tokens per run; "
      f"best possible loss (entropy rate) {results['entropy_rate']:.4f}")
display(Markdown(experiment.table(results)))
display(Image(filename=str(REPO / "lessons/measurements/partial_sync.png")))"""),
    new_markdown_cell(r"""**What this run shows, and what it does not.**

* **Bytes.** Bytes per step fall linearly with p, to 0.80, 0.60, 0.41 and 0.21 of p = 1 at
  both tp = 2 and tp = 4. They do not reach 0 at p = 0: the embedding's all-reduce forward and
  the entry f's all-reduce backward (each a full (B, T, H)), the cross-entropy's small
  all-reduces and the replicated gradients' sum remain. With n layers the partial reduces
  are 4n of the 4n + 2 activation all-reduces, so a deeper model gets closer to k/H.
* **Loss, sanity check.** At p = 1, tp = 2 and tp = 4 give the same held-out loss
  (1.2492 ± 0.0047 for both): it is the same model, whatever t.
* **Loss, the finding.** Partial synchronization did **not** cost loss here: it lowered it.
  The ± is the standard deviation over the 3 seeds of each row. At tp = 2 the change is small
  (1.2492 → 1.2324 at p = 0: 0.017, which is 3.6 of p = 1's standard deviations, or 2.7
  standard deviations of the difference, √(s₁² + s₂²); with three seeds, "probably real").
  At tp = 4 it is clear: 1.2492 → 1.2040 at p = 0.5 and 1.1985 at p = 0, 8 to 11 standard
  deviations by the same two measures, and it falls steadily as p falls (at tp = 2, p = 0.25
  and p = 0.5 are equal within the noise). The paper also reports validation loss that can
  improve.
* **Not the √t.** The controls train tp = 4 without the √t on the private channels and land
  at the same loss (1.2060 ± 0.0065 at p = 0.5, 1.1944 ± 0.0039 at p = 0): in this setting the
  scaling is neither the cause of the gain nor needed to train.
* **Why we cannot generalise.** These are 200-step runs (51,200 tokens) of a 100k-parameter
  model on a first-order Markov chain: the next token depends on the current one only, so
  the mixing across heads and ranks that the partial reduce removes is something this task
  barely needs, and every run is still about 0.1 nats above the best possible loss (the
  table measures early training speed, not final quality). We did not find out why the
  private streams train faster here; at p = 0, t = 4 the model is four narrow networks
  sharing an embedding, each predicting a quarter of the vocabulary. A cost could well
  appear on real text, with longer training or at larger t, and this run cannot rule it out.
* **No step time.** The run also timed the steps, but as t threads passing ring messages on
  two cores that other jobs were using too (load average 7 to 12): noise, not a measurement of
  the saving, so the table leaves it out. The bytes are the reliable figure."""),
    new_markdown_cell(r"""## 7. And sequence parallelism?

Lesson 7's sequence parallelism replaces g by a reduce-scatter **along the sequence** and
runs the LayerNorms on a sequence shard, then all-gathers before the next column layers. It
saves activation memory, not bytes. Can it be combined with CAAT? The authors' code does not
(its Llama scripts, `examples/llama/run_llama_130M.sh`, `_1B.sh` and `_7B.sh` at the same commit, set
`HL_SEQ_PARALLEL=0`). What breaks:

* After a partial reduce, a token's private channels exist on **every** rank, one version
  per stream. Cutting the sequence into t shards would leave rank r holding, for the
  tokens of another rank's shard, neither that rank's private channels nor its own: its
  own stream's values for those tokens are needed again by its column layers after the
  all-gather, and an all-gather of the private channels would bring it the *other*
  streams' values instead. So private channels must stay full-length on their own rank.
* LayerNorm normalises each token over all H channels: synced (sequence-sharded under SP)
  and private (full-length) together. Either each rank first gathers the synced slice for
  the whole sequence, which is the all-gather SP was going to do anyway, so LayerNorm
  runs on the full sequence and its activation saving is gone, or it sends its private
  channels for the other ranks' tokens, which are exactly the bytes CAAT saved.
* What does combine: reduce-scatter / all-gather of the **synced slice only** (k/H of SP's
  traffic), with private channels kept whole. The memory saving of SP then applies to a
  fraction p of the activations, and the LayerNorm has to run after the gather. Nobody
  has measured whether that is worth it; this course does not implement it.

## Exercise 8

`exercises/ex08_partial_sync.py`: write `PartialReduceFromTensorParallelRegion` (forward and
the backward derived in section 2, one all-reduce of the k channels each way, no in-place
change of the caller's tensor, unlike the authors' code at p = 1, whose forward hands the caller's
tensor to Megatron's `_reduce`, an in-place all-reduce), `is_replicated_parameter` and
`all_reduce_replicated_grads` (section 4). `.venv/bin/python -m pytest exercises -m ex08` grades it, ending with
a two-block CAAT model on every rank against its t-stream single-device model."""),
]

write_notebook(cells, HERE.parent / "08_partial_sync.ipynb")
