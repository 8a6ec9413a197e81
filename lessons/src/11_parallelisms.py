"""Generate lessons/11_parallelisms.ipynb (without outputs; `make lessons` executes it).

    .venv/bin/python lessons/src/11_parallelisms.py
    .venv/bin/jupyter nbconvert --to notebook --execute --inplace lessons/11_parallelisms.ipynb

Section 5 (the pipeline) reads its measured bubble from lessons/measurements/pipeline_bubble.json
(parallelisms.measure_pipeline; lessons/measurements/remeasure/11_pipeline_bubble.sh).
The measured table comes from lessons/measurements/parallelisms.json, written by
    .venv/bin/python -m tp_from_scratch.bench parallelisms --json lessons/measurements/parallelisms.json
(one torchrun launch of 4 processes, every strategy in turn; lessons/measurements/remeasure/11_parallelisms.sh).
Everything else runs live in a few seconds: ZeRO on simulated ranks, the cost model, the pictures.
"""
from pathlib import Path

from nbformat.v4 import new_code_cell, new_markdown_cell
from lesson_notebook import write_notebook

HERE = Path(__file__).resolve().parent

cells = [
    new_markdown_cell(r"""# Lesson 11 (ex11): tensor parallelism among the parallelisms

Tensor parallelism is one of several ways to spread training over devices, and it is worth
telling apart from its neighbours. In short: pipeline parallelism cuts the network **by depth**, and the
stages wait on each other (the *pipeline bubble*); tensor parallelism cuts **each layer**, so
no stage waits, but it talks in every layer and needs far more bandwidth; data parallelism,
through PyTorch's `DistributedDataParallel`, is the default for any model that fits on one
device. Large vision transformers combine TP with pipelining.

Lesson 1 said this in words. Here we build the other three, train the same GPT with each of
them (every step's loss equal to one device's), and **measure** them side by side: memory per
rank, bytes per step, step time and bubble. Then we ask the question learners ask after TP:
*why not FSDP, and when do I add a pipeline?*

Where things are:
* `tp_from_scratch/gpt/mesh.py`: the dp x pp x tp mesh and its rank layout (Lesson 6's is its pp = 1 case);
* in `tp_from_scratch/parallelisms/`: `zero.py`: ZeRO-1 and ZeRO-2 from scratch; `train.py`: the trainer
  (`.venv/bin/python -m tp_from_scratch.parallelisms.train --dp D --pp P --tp T [--ddp] [--zero 1|2]
  [--schedule gpipe|1f1b --micro-batches M]`), which reuses Lesson 6's loop;
* `pipeline.py`, `schedules.py`: the pipeline (GPipe and 1F1B from send/recv);
* `cost.py`: Lesson 9's cost model extended to dp x pp x tp; `memory.py`: what we count;
* `.venv/bin/python -m tp_from_scratch.bench parallelisms`: the comparison.

Legend: B global batch, T sequence, H hidden, L layers, N parameters (of a rank's stage and TP
shard), p pipeline stages, m micro-batches, t TP degree, dp data-parallel degree."""),
    new_code_cell("""import sys, json
from pathlib import Path
if not (Path.cwd() / "tp_from_scratch").is_dir():  # run from lessons/: make the package importable
    sys.path.insert(0, str(Path.cwd().parent))
REPO = Path.cwd() if (Path.cwd() / "tp_from_scratch").is_dir() else Path.cwd().parent

import matplotlib.pyplot as plt
import torch

from tp_from_scratch.comm import run_spmd
from tp_from_scratch.cost.model import load_profile
from tp_from_scratch.gpt.model import GPTConfig
from tp_from_scratch.gpt.inventory import parameter_count
from tp_from_scratch.gpt.vit import embed_patches
from tp_from_scratch.parallelisms import check, cost
from tp_from_scratch.parallelisms.compare import table
from tp_from_scratch.parallelisms.figures import draw_holdings, draw_schedules, draw_timeline
from tp_from_scratch.parallelisms.pipeline import PipelineStage, forward_backward, stage_layers
from tp_from_scratch.gpt.mesh import coordinates, groups
from tp_from_scratch.parallelisms.schedules import bubble, bubble_formula, format_schedule, one_f_one_b, gpipe, simulate

MEASURED = json.loads((REPO / "lessons/measurements/parallelisms.json").read_text())
config = GPTConfig(n_layers=4)     # the comparison's model: the trainer's --layers 4, other flags default
print(f"the comparison's GPT: {parameter_count(config):,} parameters, L={config.n_layers}, H={config.hidden}, "
      f"V={config.vocab_size}, T={config.seq_len}; global batch B=8; {MEASURED['ranks']} ranks")"""),
    new_markdown_cell(r"""## 1. Four ways to cut one training step

| | what a rank holds | what it sends per step | who waits |
|---|---|---|---|
| **DP** (DDP) | the whole model, its gradients and optimizer state; $B/dp$ of the batch | one all-reduce of all N gradients (bucketed, overlapped with backward) | nobody, if the all-reduce hides behind backward |
| **ZeRO-1 / 2** | the whole model; $1/dp$ of the optimizer state (ZeRO-2: of the gradients too) | reduce-scatter of the gradients + all-gather of the parameters | as DP |
| **PP** | $L/p$ blocks, whole | one activation (B/m, T, H) per micro-batch to the next stage, one gradient back | the other stages, during the fill and drain: the bubble |
| **TP** | $1/t$ of every layer | all-reduces of (B, T, H) in every layer, forward and backward | every rank, at every all-reduce |

FSDP (ZeRO-3) goes one step further than ZeRO-2: it shards the weights too and all-gathers
each layer just before using it (forward and again in backward). We stop at ZeRO-2.

## 2. The mesh: TP innermost

Four processes can be dp=4, pp=4, tp=4, or a product. The trainer numbers them as Megatron-LM
does by default (order "tp-dp-pp", read from the inside out):

    rank = (pp_index * dp + dp_index) * tp + tp_index

TP varies fastest, so a TP group is consecutive ranks, which `torchrun` puts on one node: TP
talks in every layer and gets NVLink. DP groups are ranks tp apart inside a pipeline stage;
pipeline stages are $dp \cdot tp$ apart, across nodes, where the traffic is smallest (one activation
per micro-batch, point to point). With pp = 1 this is exactly Lesson 6's dp x tp mesh."""),
    new_code_cell("""dp, pp, tp = 2, 2, 2
for kind, members in groups(dp, pp, tp).items():
    print(f"{kind} groups: {members}")
print("rank -> (dp_index, pp_index, tp_index):", {r: coordinates(r, dp, pp, tp) for r in range(8)})"""),
    new_markdown_cell(r"""## 3. Data parallelism, the real way

Lesson 6 averaged gradients by hand after backward: one `all_reduce` of every gradient,
flattened. PyTorch's `DistributedDataParallel` does the same arithmetic, but it groups the
gradients into **buckets** (25 MiB by default) in reverse order of use, and starts each
bucket's all-reduce from an autograd hook as soon as its last gradient is ready, while backward
carries on with the earlier layers: communication overlapped with computation (Li et al. 2020,
"PyTorch Distributed"). `--ddp` wraps the (tensor-parallel) model in DDP over the DP group;
the losses are the hand-written average's, step for step (tests/test_parallelisms.py checks
both, and ZeRO's, against one device and each other in one launch):

    .venv/bin/torchrun --standalone --nproc-per-node 4 -m tp_from_scratch.parallelisms.train --dp 2 --tp 2 --ddp --compare-single

Our model is small enough to fit into one bucket, so DDP sends exactly what the hand-written
average sends; the difference is *when* (during backward instead of after it).

## 4. ZeRO: shard what every DP rank duplicates

AdamW keeps two numbers per parameter (m and v; with mixed precision also a float32 master
copy: 12 bytes per parameter, against 2 for the bf16 weights). Every DP rank keeps the same
copy. Rajbhandari et al. (2020) shard it: flatten the N parameters, cut them into dp chunks,
and let rank r update only chunk r:

    ZeRO-1 (the paper's P_os):  reduce-scatter the gradients -> AdamW on chunk r -> all-gather the chunks
    ZeRO-2 (P_os+g):            the same, and each rank frees the full gradient after the reduce

Rank r needs only chunk r of the averaged gradient, so a reduce-scatter is all it asks for. A
ring all-reduce *is* a reduce-scatter plus an all-gather, so ZeRO sends DP's bytes: the
gradients go round once, reduced, and the parameters come back in the second half instead of
the averaged gradients. ZeRO-1 and ZeRO-2 differ in memory only.

The naive first version of ZeRO-1 all-reduces the whole gradient and then uses a quarter of it
(`ZeroOptimizer(..., gradient_reduce="all_reduce")`): the all-reduce alone is DP's $2\frac{dp-1}{dp}N$,
and the all-gather adds $\frac{dp-1}{dp}N$, **1.5x** DP's bytes, for an average each rank mostly throws
away. DeepSpeed first shipped ZeRO-1 that way and later moved to the partition-aware reduce
("ZeRO stage 1 with reduced communication": 1.5x -> 1x of data parallelism). Below: ZeRO on 3
simulated ranks (58 parameters do not split evenly into 3) against unsharded AdamW (the
trainers', `gpt/optim.py`: `torch.optim.AdamW` bit for bit), every step, then the bytes each
sends, as the Comm's meter counts them (the messages our ring collectives really send). The
same check from the command line (dp = 1 to 4 on simulated ranks; under `mpiexec` or `torchrun`
on real processes):

    .venv/bin/python -m tp_from_scratch.parallelisms.check zero
"""),
    new_code_cell("""# check zero: a 58-parameter model, rank-distinct rows, ZeroOptimizer over the simulated ranks'
# ring collectives; every rank compares its parameters after each step with unsharded AdamW
run_spmd(check.zero_report, 3)
from tp_from_scratch.nn.mappings import all_reduce
def dp_step(comm):  # DP's step for the same gradients: one all-reduce of the 58 (padded to 60) values
    for _ in range(check.ZERO_STEPS):
        all_reduce(comm, torch.zeros(60, dtype=torch.float64))
sent = {}
for label, run in (("DP (all-reduce)", dp_step),
                   ("ZeRO-1 naive", lambda comm: check.zero_run(comm, 1, gradient_reduce="all_reduce")),
                   ("ZeRO-1", lambda comm: check.zero_run(comm, 1)), ("ZeRO-2", lambda comm: check.zero_run(comm, 2))):
    traffic = run_spmd(lambda comm: (run(comm), comm.meter.by_collective)[1], 3)[0]
    sent[label] = sum(v.bytes_sent for v in traffic.values())
    print(f"{label:<16} rank 0 sent in 3 steps: {sent[label]:>5} B  (" +
          ", ".join(f"{k} {v.bytes_sent} B" for k, v in sorted(traffic.items())) + ")")
assert sent["ZeRO-1"] == sent["ZeRO-2"] == sent["DP (all-reduce)"] and 2 * sent["ZeRO-1 naive"] == 3 * sent["ZeRO-1"]"""),
    new_markdown_cell(r"""The optimizer state splits 320 + 320 + 288 = 928 bytes, the 928 of unsharded AdamW (58
parameters $\times$ 2 states $\times$ 8 bytes). What each rank holds, drawn for the comparison's GPT at dp=4:
every rank holds all weights (W); ZeRO-1 keeps 1/4 of the optimizer state (O); ZeRO-2 also
keeps only that quarter of the gradients (G) after the step. The chunks follow the flattened
parameter order, so a chunk boundary falls wherever it falls, inside a block."""),
    new_code_cell("""for zero in (1, 2):
    draw_holdings(config, dp=4, zero=zero)
plt.show()"""),
    new_markdown_cell(r"""**Why not FSDP?** Count the model state per rank in mixed precision (2 bytes of weights, 2
of gradients, 12 of optimizer state per parameter: the paper's $K = 12$) for the ZeRO paper's
example, 7.5B parameters on 64 DP ranks, and for an 8B model on one 8-GPU node with 80 GB
each (`cost.zero_model_state_bytes`; the paper's Figure 1 gives 120, 31.4, 16.6 and 1.9 GB):"""),
    new_code_cell("""print(f"{'model, dp':<16} {'DP':>8} {'ZeRO-1':>8} {'ZeRO-2':>8} {'FSDP/ZeRO-3':>12}   (GB of model state per rank)")
for name, n, d in (("7.5B, dp=64", 7.5e9, 64), ("8B, dp=8", 8.0e9, 8)):
    print(f"{name:<16} " + " ".join(f"{cost.zero_model_state_bytes(n, d, s) / 1e9:>{w}.1f}"
                                    for s, w in zip(range(4), (8, 8, 8, 12))))"""),
    new_markdown_cell(r"""The 8B model does not fit an 80 GB GPU with plain DDP (128 GB, before any activation);
ZeRO-1 brings it to 44 GB and ZeRO-2 to 30 GB without cutting a single layer, and for the same
bytes as DDP. FSDP goes to 16 GB, at the price of all-gathering every layer's weights
in the forward and again in the backward: 1.5x DDP's traffic. That is the answer to "why not
FSDP?": often, do use it; it shards what DDP duplicates. What it does not shrink are the
**activations** of a layer (each rank still runs whole layers on its own batch) and the
**time** of one step of one sequence: those need TP (or sequence/context parallelism)."""),
    new_markdown_cell(r"""## 5. Pipeline parallelism

A pipeline cuts the network **by depth**: stage s of p holds a run of consecutive blocks
(numpy's `array_split` rule: the first `L % p` stages get one block more), the first stage
also the embedding, the last the final norm, the LM head and the loss. Between stages only
one tensor moves, point to point: the activations `(B/m, T, H)` of a micro-batch forward
(`send`/`recv`), their gradient backward. No collective at all.

The batch is cut into m **micro-batches** so that stages can work at the same time. Micro-batch
i holds $B_i$ of the $B$ sequences; its mean loss counts with weight $B_i/B$, so the summed losses
and the gradients accumulated over the micro-batches are exactly those of the whole batch.
With tied embeddings, the last stage keeps a copy of `wte` for the head; the first and last
stage add each other's gradient of it after the backwards (Megatron-LM's "embedding group").

A **schedule** says, for each stage, in which order it runs its actions: receive
activations (`ra`), forward (`F`), send activations (`sa`), receive the output gradient
(`rg`), backward (`B`), send the input gradient (`sg`). It is plain data:
`tp_from_scratch/parallelisms/schedules.py`."""),
    new_code_cell("""print("stage blocks for L=5, p=2:", [list(stage_layers(5, s, 2)) for s in range(2)])
print("GPipe, p=3, m=4:")
print(format_schedule(gpipe(3, 4)))
print("1F1B, p=3, m=4:")
print(format_schedule(one_f_one_b(3, 4)))"""),
    new_markdown_cell(r"""**GPipe** runs all forwards, then all backwards: every stage keeps the saved activations of
all m micro-batches until its first backward. **1F1B** ("one forward, one backward"): stage s
runs a warm-up of $\min(p-1-s,\ m)$ forwards (the micro-batches that must pass it before the first
comes back from the last stage), then alternates one forward and one backward, then drains
the remaining backwards; it never holds more than $\min(p-s,\ m)$ micro-batches. Sends return at
once, receives wait; `check_schedule` verifies every rule (each micro-batch forwarded before
its backward, each send matched by the neighbour's receive in order, no deadlock).

Now the real thing: the GPT on 3 simulated stages, 1F1B over 4 micro-batches, three AdamW
steps. Every stage compares every step's loss, each of its gradients and its parameters
after the last step with the same GPT trained on one device (`assert_matches_reference`),
and counts the micro-batches whose saved activations are alive."""),
    new_code_cell("""pp_config = GPTConfig(**check.CONFIG)        # 5 blocks: 2 + 2 + 1 over 3 stages
batches = check.global_batches(3, pp_config)
single = check.single_device_training(pp_config, batches)
for schedule in ("gpipe", "1f1b"):
    results = run_spmd(check.check_pipeline_training, 3, single, batches, 4, schedule)
    print(f"{schedule:5}: 3 steps equal to one device on every stage; micro-batches in flight per stage "
          f"{[r.peak_in_flight for r in results]}, saved activations per stage "
          f"{[f'{r.peak_activation_bytes / 1024:.0f} KiB' for r in results]}")"""),
    new_markdown_cell(r"""GPipe holds all 4 micro-batches on every stage; 1F1B holds 3, 2, 1: the activation memory of
1F1B no longer grows with m, which is why every large-scale pipeline uses it. The idle time is
the same for both: at the start the later stages wait for the first micro-batch to arrive, at
the end the earlier stages wait for the last gradient. On an ideal clock (messages free,
every forward and backward the same length) each stage idles $p-1$ slots out of $m+p-1$:
the **bubble** $(p-1)/(m+p-1)$. More micro-batches shrink it; each box below is one
micro-batch's forward (light) or backward (dark), the white is the bubble:"""),
    new_code_cell("""draw_schedules(4, 8)
plt.show()
for name, make in (("GPipe", gpipe), ("1F1B", one_f_one_b)):
    for m in (1, 4, 8):
        ideal = bubble(simulate(make(4, m)))["fraction"]
        print(f"{name:5} p=4 m={m}: bubble on an ideal clock {ideal:.3f}, (p-1)/(m+p-1) = {bubble_formula(4, m):.3f}")"""),
    new_markdown_cell(r"""Measured on real processes (`.venv/bin/torchrun --standalone --nproc-per-node 2 -m tp_from_scratch.parallelisms.measure_pipeline`:
2 stages of 4 blocks, H=256, batch 16 x 64 tokens, float32, one process per core). Each
action is timed on each stage; the bubble is the idle share between the first start and the
last end. Measured on a quiet machine, it follows the formula at m = 1 (0.50) and m = 4 (about
0.25 against 0.20) but stays near 0.2 at m = 8, where the formula says 0.11: the stages are not
equally long (the last one also computes the LM head and the loss), a backward is not exactly
twice a forward, and every message is a copy through gloo that takes the sender's own core, a
cost paid per micro-batch that the formula leaves out. The counts of micro-batches in flight and
their bytes are exact: GPipe holds all m, 1F1B at most $p - s$."""),
    new_code_cell("""PIPE = json.loads((REPO / "lessons/measurements/pipeline_bubble.json").read_text())
print(f"{'schedule':8} {'m':>2} {'bubble':>7} {'(p-1)/(m+p-1)':>14}  in flight per stage  saved activations per stage (MiB)")
for r in PIPE:
    mib = ", ".join(f"{b / 2**20:.1f}" for b in r["activation_bytes_per_stage"])
    print(f"{r['schedule']:8} {r['m']:2} {r['bubble_measured']:7.2f} {r['bubble_formula']:14.2f}  "
          f"{str(r['in_flight_per_stage']):19}  {mib}")
fig, axes = plt.subplots(2, 1, figsize=(10, 3.6))
for ax, name in zip(axes, ("gpipe", "1f1b")):
    row = next(r for r in PIPE if r["schedule"] == name and r["m"] == 4)
    draw_timeline(ax, [[tuple(t) for t in tl] for tl in row["timelines"]], f"{name}, p=2, m=4, measured (seconds)")
fig.tight_layout()
plt.show()"""),
    new_markdown_cell(r"""The pipeline composes with TP: build each stage from the TP GPT (`gpt_to_tp`) on the stage's TP
group, and ranks lay out as $\mathrm{rank} = \mathrm{stage} \cdot t + \mathrm{tp\_rank}$ (TP innermost, inside a node). The same
check runs pp=2 x tp=2 on 4 processes, on both process backends:

    .venv/bin/torchrun --standalone --nproc-per-node 4 -m tp_from_scratch.parallelisms.check pipeline --tp 2
    .venv/bin/mpiexec -n 4 .venv/bin/python -m tp_from_scratch.parallelisms.check pipeline --tp 2

**Exercise 11** asks you to write `one_f_one_b(n_stages, n_micro)`: each stage's ordered list
of actions. The graders check its rules, its in-flight bound, its bubble on the ideal clock,
and then train the pipeline with it: `make grade EX=ex11` (or `.venv/bin/python -m pytest exercises -m ex11`)."""),
    new_markdown_cell(r"""What each rank holds under each strategy of the comparison below (GPipe and 1F1B hold the
same weights; TP+SP the same as TP): DP copies everything, PP cuts by depth, TP by width, and
the hybrids do both: each rank holds a block of the model by depth and a slice by width."""),
    new_code_cell("""draw_holdings(config, dp=4, title="dp4 (DDP or the hand-written average)")
draw_holdings(config, pp=4, title="pp4 (GPipe or 1F1B)")
draw_holdings(config, tp=4, title="tp4 (with or without SP)")
draw_holdings(config, dp=2, tp=2)
draw_holdings(config, pp=2, tp=2)
plt.show()"""),
    new_markdown_cell(r"""## 6. Measured side by side

One model (the trainer's `--layers 4`: 4 blocks, H=64, V=67, T=32), one global batch (B=8), 4
CPU processes, float32, AdamW, for every strategy. The trainer measured each rank; the row
shows the rank holding the most memory and the rank sending the most bytes:

* **weights, grads, optim**: KiB of tensors held after a step (ZeRO's weights include the flat
  copy of its chunk); **act**: the most KiB autograd kept for backward at once (saved-tensor
  hooks, weights excluded), **act\***: Korthikanti et al.'s formula for the same layers in 16-bit
  with dropout, for its trend only;
* **TP / DP KiB**: bytes per step handed to the collectives of the TP and DP groups; **p2p**:
  bytes sent point to point between stages; **model**: the cost model's total for that rank
  (`parallelisms/cost.py`; the test suite checks every rank's bytes and weight, gradient and
  optimizer bytes against it exactly);
* **step ms**: median step time; **bubble**: idle share of the stages' time from their
  timestamps, beside $(p-1)/(m+p-1)$."""),
    new_code_cell("""print(f"measured {MEASURED['date']} on {MEASURED['cores']} cores, torch {MEASURED['torch']}: "
      f"{MEASURED['command']}")
print(table(MEASURED["rows"]))
by_strategy = {r["strategy"]: r for r in MEASURED["rows"]}   # ZeRO-1 and -2 send DP's bytes, to the byte
assert by_strategy["dp4 zero1"]["bytes"]["dp"] == by_strategy["dp4 zero2"]["bytes"]["dp"] == by_strategy["dp4"]["bytes"]["dp"]"""),
    new_code_cell("""rows = MEASURED["rows"]
labels = [r["strategy"] for r in rows]
fig, (a, b) = plt.subplots(1, 2, figsize=(14, 4.2))
bottom = [0.0] * len(rows)
for part in ("weights", "gradients", "optimizer", "activations"):
    h = [r["memory"][part] / 2**10 for r in rows]
    a.bar(labels, h, bottom=bottom, label=part)
    bottom = [x + y for x, y in zip(bottom, h)]
a.set_ylabel("KiB on the fullest rank"); a.set_title("memory per rank"); a.legend(fontsize=8)
bottom = [0.0] * len(rows)
for kind in ("tp", "dp", "p2p"):
    h = [r["bytes"][kind] / 2**10 for r in rows]
    b.bar(labels, h, bottom=bottom, label={"tp": "TP collectives", "dp": "DP collectives", "p2p": "pipeline send"}[kind])
    bottom = [x + y for x, y in zip(bottom, h)]
b.set_ylabel("KiB per step, busiest rank"); b.set_title("bytes sent per step"); b.legend(fontsize=8)
for ax in (a, b):
    ax.tick_params(axis="x", rotation=60, labelsize=8)
fig.tight_layout(); plt.show()"""),
    new_markdown_cell(r"""What the table says, for this model (bytes: what a ring algorithm sends, KiB per step):

* **DP** holds everything on every rank (weights + gradients + 2x optimizer state = $4N$ floats)
  and sends one all-reduce of the N gradients per step: $2\frac{p-1}{p}N = 1.5N$ at p = 4.
* **ZeRO-1/2** keep the weights and cut the optimizer column to a quarter (plus the chunk's flat
  master copy, counted under weights: 741 + 185 KiB). Their grads column: ZeRO-1 keeps every
  parameter's gradient (741 KiB, as DP) **plus** the gradient buffer of its chunk (185 KiB, the
  inner AdamW's `.grad` of its flat chunk, where the reduce-scatter's result lands), so 926 KiB,
  more than DP; ZeRO-2 frees the full gradients and keeps only the chunk's buffer, a quarter.
  Both send exactly DP's bytes (reduce-scatter + all-gather = an all-reduce); the naive ZeRO-1
  of section 4 would send 1.5x. The DP column counts what a ring algorithm sends for the
  collectives the trainer called; gloo itself emulates a reduce-scatter with an all-reduce and
  moves twice as much for it, which is why section 4 counts ZeRO's true bytes on our Comm.
* **PP** holds about a quarter of the weights (the first stage the embeddings, the last a copy
  of the tied embedding for its head) and sends only activations and their gradients, plus, once
  per step, the tied embedding's gradient between the first and the last stage (section 5): the
  fewest bytes of all, and no collective at all. That exchange is why pp2xtp2 sends 73 KiB where
  its activations are 64 KiB: 2144 float32 gradients of its half of the embedding, about 8 KiB. Activations: GPipe's first stage keeps all 8
  sequences of its block whatever m is; 1F1B with m = 8 keeps at most p = 4 micro-batches of 1,
  half of it. The act column names the rank it shows (@s: the pipeline stage): the largest
  holder can change between rows. Under GPipe the last stage is the largest (it keeps every
  micro-batch's activations *and* the LM head's logits); under 1F1B the last stage keeps one
  micro-batch at a time, so the largest is an earlier stage. The bubble: see below.
* **TP** holds a quarter of every layer and sends the most: every block all-reduces (B, T, H)
  four times per step, whatever the batch split, and every rank sees the whole batch, so its
  activations are the largest here (the LayerNorm and residual regions are not split). **SP**
  splits those over T too: the activations drop by almost half, for 25 % more bytes in our
  implementation, whose column layers keep only their sequence shard and all-gather it again in
  backward (as Megatron-LM does), instead of all-reducing once.
* The **hybrids** sit in between: dp2xtp2 has TP groups of 2 ranks (ring factor 1 instead of 1.5)
  on half the batch, a third of tp4's TP bytes, plus a DP all-reduce of half the model;
  pp2xtp2 sends TP all-reduces inside each stage and a few activations between the two.
* **Bubble**: on the pipelines the stages' timestamps show most of the time idle, far above
  $(p-1)/(m+p-1)$. That is this machine, not the schedule: 4 processes on 2 shared cores, and
  micro-batches so small (one sequence of 32 tokens) that a send and a receive through gloo cost
  as much as a block's forward. The schedules themselves leave exactly the formula's bubble on
  an ideal clock, and section 5's 2-process pipeline (one process per core, H=256, 64 tokens per
  sequence) measured close to it. A pipeline pays when a micro-batch's compute dwarfs a message.

Step times on 4 CPU processes tell you about gloo on a laptop, not about a GPU cluster: use the
cost model with a link profile (Lesson 9) to predict those.

## 7. When each is the right tool

* **The model, its gradients and AdamW state fit on one device: use DDP.** It sends N
  gradients per step once, overlapped with backward, and never waits inside a layer. That is
  the default for a reason.
* **They do not fit, but the weights do (the optimizer state is the 12 of 16 bytes per
  parameter in mixed precision): shard the state, ZeRO-1/2, or FSDP/ZeRO-3 for the weights too.**
  Same bytes as DDP (ZeRO-1 and -2), dp times less optimizer memory.
* **One layer's activations are too big, or a single step must be fast (latency, inference):
  TP, inside a node.** Only TP cuts the activations of one layer and the time of one matmul,
  and it pays for it with all-reduces in every layer; Lesson 9's crossover says how large t
  can be before communication dominates, and it is within NVLink reach.
* **The model is deep and must span nodes: PP across nodes**, with enough micro-batches to make
  the bubble small ($m \ge 4p$ keeps it under 20 %) and 1F1B to bound the activations.
* Big models use all three: TP inside the node, PP across nodes, DP (or ZeRO/FSDP) over the
  copies: the 3-D mesh of section 2.

## 8. The ViT case: TP inside a node, PP across

Large vision transformers (ViT-H, ViT-22B) are the same blocks on image patches
(`tp_from_scratch/gpt/vit.py` trains one with TP:
`.venv/bin/torchrun --standalone --nproc-per-node 2 -m tp_from_scratch.gpt.vit --compare-single`).
Take a ViT-Huge-sized stack of GPT blocks (H=1280, 32 layers, 16 heads, 257 patch tokens, a
1000-class head in place of the vocabulary: a GPT stack standing in for the ViT, so its head is
tied to an input embedding of 1000 rows, which a real ViT's untied classifier is not) on two 8-GPU nodes, and ask the cost model what
each rank sends per step, and how long that takes over NVLink and over InfiniBand (the
Lesson 9 presets; bf16, 32 images per pipeline):"""),
    new_code_cell("""vit_h = GPTConfig(vocab_size=1000, seq_len=257, n_layers=32, hidden=1280, n_heads=16, n_kv_heads=16, causal=False)
nvlink, ib = (load_profile(n)["all_reduce"]["native"]["beta_s_per_byte"] for n in ("h100-nvlink", "h100-infiniband"))
print(f"ViT-H-sized stack: {parameter_count(vit_h) / 1e6:.0f}M parameters; bytes per step on the busiest rank (bf16)")
print(f"{'layout on 16 GPUs':<36} {'TP bytes':>10} {'p2p bytes':>10} {'TP time':>17} {'p2p time':>9}")
for name, kw, tp_link, p2p_link in (
        ("tp=16 (TP across both nodes)", dict(t=16, pp=1), ib, nvlink),
        ("tp=8 inside, pp=2 across (m=8)", dict(t=8, pp=2, micro_batches=8), nvlink, ib),
        ("pp=2 inside, tp=8 across (m=8)", dict(t=8, pp=2, micro_batches=8), ib, nvlink)):
    rows = [cost.step_bytes(vit_h, 32, itemsize=2, stage=s, **kw) for s in range(kw["pp"])]
    tp_bytes = max(r["all_reduce/tp"]["bytes"] for r in rows)
    p2p = max(r["p2p"]["bytes"] for r in rows)
    print(f"{name:<36} {tp_bytes / 1e9:>8.2f}GB {p2p / 1e6:>8.1f}MB {tp_bytes * 2 * tp_link * 1e3:>12.0f} ms "
          f"{p2p * p2p_link * 1e3:>6.1f} ms")"""),
    new_markdown_cell(r"""(TP time: a ring all-reduce sends about twice its payload; latency terms left out; no
overlap. The pipeline's bytes include 0.32 MB of the stand-in's tied head: the bf16 gradient of
a rank's eighth of the $1000 \times 1280$ embedding, exchanged between the first and the last stage,
which a real ViT would not send.) TP's traffic is gigabytes per step, the pipeline's megabytes: put TP across the
nodes and it costs about ten times more time than on NVLink, while the pipeline's messages
barely notice InfiniBand. TP on NVLink, the pipeline's small messages across nodes. This is why the layout of section 2 puts TP innermost."""),
    new_markdown_cell(r"""### A ViT through the pipeline: TP inside a node, PP across

Section 5's pipeline splits the ViT as it splits the GPT: the blocks are the same, only the two
ends differ (`pipeline.pieces_of` names them for each model):

* **stage 0**: the patch embedding, the class token and the learned positions, then its blocks.
  Images (B, 8, 8) become P = 16 patches of 2x2, embedded and put behind the class token:
  (B, P+1, H);
* **middle stages**: blocks only;
* **the last stage**: its blocks, then the final norm of the class token's vector, the
  classifier (H -> 10 classes) and the cross-entropy against the labels (B,).

The pipeline's messages are the activations (B/m, P+1, H) going forward and their gradients
going back, one per micro-batch: these are what crosses the nodes. Inside a stage, build it
from `vit_to_tp(tp_group, vit)`: the blocks' heads and ffn are split over the node's t GPUs and
their all-reduces stay on NVLink. With $\mathrm{rank} = \mathrm{stage} \cdot t + \mathrm{tp\_rank}$ (section 2), pp=2 x tp=8 on
two 8-GPU nodes puts stage 0 on node 0 and stage 1 on node 1. The patch embedding, class
token, positions, norm and classifier stay replicated: their inputs are Replicated, so their
gradients come out equal on every TP rank with no collective (the check below compares them).

Here on 2 simulated stages, GPipe and 1F1B at m = 4, two AdamW steps in float64 on random
images: every loss, gradient and final parameter against the same ViT on one device. With TP
inside the stages the check runs on 4 processes (pp=2 x tp=2; `tests/test_pipeline_launch.py`
runs it, after the GPT's):

    .venv/bin/torchrun --standalone --nproc-per-node 4 -m tp_from_scratch.parallelisms.check pipeline --tp 2 --model vit"""),
    new_code_cell("""vit_config = check.MODELS["vit"][0]()          # 3 blocks, H=16: 2 + 1 over 2 stages
vit_batches = check.global_batches(2, vit_config, kind="vit")  # images (4, 8, 8), labels (4,)
vit_single = check.single_device_training(vit_config, vit_batches, kind="vit")
held = run_spmd(lambda comm: [n for n, _ in PipelineStage(comm, check.new_model(vit_config, "vit"))
                              .named_parameters() if not n.startswith("blocks.")], 2)
for s, names in enumerate(held):
    print(f"stage {s}: blocks {list(stage_layers(vit_config.n_layers, s, 2))} and {names}")
vit = check.new_model(vit_config, "vit")
print("a micro-batch's message between the stages (1 of the 4 images):",
      tuple(embed_patches(vit, vit_batches[0][0][:1]).shape), "= (B/m, P+1, H)")
for schedule in ("gpipe", "1f1b"):
    results = run_spmd(check.check_pipeline_training, 2, vit_single, vit_batches, 4, schedule, kind="vit")
    print(f"ViT {schedule:5}: 2 steps equal to one device on both stages; micro-batches in flight per stage "
          f"{[r.peak_in_flight for r in results]}")"""),
    new_markdown_cell(r"""## What we did not build

FSDP / ZeRO-3 (weights sharded and gathered per layer), interleaved (virtual-stage) 1F1B, and
DDP's overlap measured on its own (our buckets: one, the model is small)."""),
]

write_notebook(cells, HERE.parent / "11_parallelisms.ipynb")
