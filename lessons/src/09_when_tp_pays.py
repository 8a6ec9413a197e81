"""Generate lessons/09_when_tp_pays.ipynb (without outputs; `make lessons` executes it).

    .venv/bin/python lessons/src/09_when_tp_pays.py
    .venv/bin/jupyter nbconvert --to notebook --execute --inplace lessons/09_when_tp_pays.ipynb

The measured numbers come from lessons/measurements/scaling*.json and step_profile.json, written
on a quiet machine by
    bash lessons/measurements/remeasure/09_scaling.sh
"""
from pathlib import Path

from nbformat.v4 import new_code_cell, new_markdown_cell
from lesson_notebook import write_notebook

HERE = Path(__file__).resolve().parent

cells = [
    new_markdown_cell(r"""# Lesson 9: when does tensor parallelism pay?

Lessons 1 to 6 proved that TP computes the right numbers. This lesson asks whether it makes
training **faster**, and when it stops paying. On this course's 2-core machine (section 4's
committed measurement), tp=2 on two processes was 1.56x (H=512) to 1.80x (H=1024) faster than
one process with one thread, and 0.87x to 1.02x of one process using both cores through two
BLAS threads: at H=1024 it wins, by a hair. Megatron-LM (Shoeybi et al. 2019) reported 77 % of
linear *weak* scaling at 8-way TP on NVLink-connected GPUs (the model grows with the GPUs).
This lesson builds one small cost model of a training step, `tp_from_scratch/cost/planner.py`, and
uses it for *strong* scaling (one model, more GPUs): for Megatron's 8.3B model at t = 8 on
NVLink it predicts 3.6x, 45 % of linear; it does not re-derive the weak-scaling figure. You can
run it on the command line with the trainer's own flags:

    .venv/bin/python -m tp_from_scratch.cost.planner --arch gpt2 --hidden 3072 --heads 32 --layers 72 \
        --vocab-size 51200 --seq-len 1024 --tp 8 --profile h100-nvlink --dtype bfloat16 --precision mixed

(`--precision mixed`: bf16 weights and gradients, fp32 master weights and AdamW state, as in
section 3. With `--dtype bfloat16` alone the memory table keeps weights and AdamW state in fp32.)

What you will see:
1. parameters, **exactly**: Megatron-LM's Table 1 and our own model;
2. **compute against communication** in one layer as t grows;
3. the planner's tables for GPT-2 small, Megatron's 8.3B and a Llama-3-70B-like model, on one
   8-GPU NVLink node and across nodes; **why TP stays inside a node**;
4. the planner's bytes against the meter's, and our **measured** strong scaling;
5. what to do on a CPU laptop.

Legend: B batch (sequences per DP rank), T sequence, H hidden, F ffn, V vocab, L layers,
nh heads, t the TP degree; C FLOP/s of one device, W bytes/s of its link, alpha the latency
of one message."""),
    new_code_cell("""import sys, json
from pathlib import Path
if not (Path.cwd() / "tp_from_scratch").is_dir():  # run from lessons/: make the package importable
    sys.path.insert(0, str(Path.cwd().parent))
REPO = Path.cwd() if (Path.cwd() / "tp_from_scratch").is_dir() else Path.cwd().parent

import matplotlib.pyplot as plt

from tp_from_scratch.cost import planner
from tp_from_scratch.gpt import train
from tp_from_scratch.gpt.model import GPTConfig
from tp_from_scratch.comm import run_spmd
from tp_from_scratch.plots import step_time_bars


def gpt2(hidden, heads, layers, vocab=51200, seq=1024):
    return GPTConfig(vocab_size=vocab, seq_len=seq, n_layers=layers, hidden=hidden,
                     n_heads=heads, n_kv_heads=heads)

GPT2_SMALL = gpt2(768, 12, 12, vocab=50257)
MEGATRON = {"1.2B": gpt2(1536, 16, 40), "2.5B": gpt2(1920, 20, 54),
            "4.2B": gpt2(2304, 24, 64), "8.3B": gpt2(3072, 32, 72)}
LLAMA_70B = GPTConfig(vocab_size=128256, seq_len=8192, n_layers=80, hidden=8192, n_heads=64,
                      n_kv_heads=8, ffn=28672, tie_embeddings=False)"""),
    new_markdown_cell(r"""## 1. Counting parameters exactly

A GPT-2 block holds q, k, v and o (4H² weights, 4H biases), the MLP (8H² weights, 5H biases) and
two LayerNorms (4H): **12H² + 13H** per layer. Add the token and position embeddings and the
final LayerNorm; the LM head reuses the token embedding. Megatron-LM (Shoeybi et al. 2019)
Table 1 rounds these to one decimal of a billion. `planner.parameters` lists every tensor with
the axis TP splits, so the same list gives each rank's share. The test suite checks the
counts against Table 1 and against `sum(p.numel())` of our `GPT` and of each TP rank's shard."""),
    new_code_cell("""print(f"{'model':<22} {'exact':>16} {'rounded':>8}")
for name, config in MEGATRON.items():
    n = planner.parameter_count(config, "gpt2")
    print(f"{'Megatron ' + name:<22} {n:>16,} {planner.rounded(n):>8}")
for name, config, arch in [("GPT-2 small", GPT2_SMALL, "gpt2"), ("Llama-3-70B-like", LLAMA_70B, "llama"),
                           ("ours (train defaults)", GPTConfig(), "gpt")]:
    n = planner.parameter_count(config, arch)
    print(f"{name:<22} {n:>16,} {planner.rounded(n):>8}")"""),
    new_markdown_cell(r"""## 2. Compute against communication, one layer, as t grows

Per layer and step, a TP rank multiplies B·T tokens by 1/t of the layer's weights: with F = 4H,
forward + backward (3x forward) is

$$\text{compute} = \frac{3 \cdot 2 \cdot BT \cdot 12H^2}{t\,C} \quad(\text{plus attention's } 12\,B T^2 H / t).$$

It also makes 4 all-reduces of a (B, T, H) activation (g after attention and after the MLP
forward, f before each in backward). A ring all-reduce sends $2\frac{t-1}{t}$ of the array per rank:

$$\text{communication} = 4\left(2(t-1)\alpha + \frac{2(t-1)}{t}\,\frac{BTH \cdot \text{bytes}}{W}\right).$$

Compute shrinks like 1/t; communication **grows** towards a constant. Their ratio is about
$\frac{(t-1)\cdot\text{bytes}\cdot C}{9HW}$: it depends on the model only through H, and on the hardware
through C/W, the FLOPs a device does in the time its link moves one byte. For an H100
(989 TFLOP/s bf16, vendor spec) on NVLink 4 (450 GB/s per direction) C/W is about 2200; on
InfiniBand NDR (50 GB/s) about 20,000, nine times worse. The plot is `planner.predict_step` for
GPT-2 small and Megatron's 8.3B model in bfloat16, B = 8 sequences. Its compute bars hold the
matmuls and the element-wise ops (norms, GeLU, softmax, adds, AdamW) priced at the memory's
bandwidth (HBM3, 3.35 TB/s, vendor spec) as our unfused code runs them: a step moves each
activation through memory many times. The crossover compares the matmuls alone with the
communication, as the rule of thumb below does."""),
    new_code_cell("""fig, axes = plt.subplots(1, 3, figsize=(14, 3.6))
for ax, (title, config, profile) in zip(axes, [
        ("GPT-2 small, NVLink", GPT2_SMALL, "h100-nvlink"),
        ("Megatron 8.3B, NVLink", MEGATRON["8.3B"], "h100-nvlink"),
        ("Megatron 8.3B, InfiniBand", MEGATRON["8.3B"], "h100-infiniband")]):
    prof = planner.load_profile(profile)
    degrees = [t for t in (1, 2, 4, 8, 16) if t in planner.valid_tp_degrees(config, "gpt2")]
    p = [planner.predict_step(config, prof, t, 8, itemsize=2, arch="gpt2") for t in degrees]
    step_time_bars(ax, [f"t={t}" for t in degrees], [x["compute_s"] + x["elementwise_s"] for x in p],
                   [x["communication_s"] for x in p], title=title)
    cross = planner.crossover_tp(config, prof, 8, itemsize=2, arch="gpt2")
    print(f"{title:<28} communication overtakes compute at t = {cross}")
fig.tight_layout()"""),
    new_markdown_cell(r"""### The JAX scaling book's rule of thumb

The scaling book ("How to Scale Your Model", Part 5, Training) models a TP'd MLP block and
finds it communication-bound once the TP degree exceeds about **F / (C/W)** (per mesh axis
used). Our own ratio of section 2 gives the same kind of rule: communication catches up with
the matmuls when $(t - 1)\cdot\text{bytes}\cdot C/W = 9H$, i.e. at $t^* = 1 + \frac{9H}{\text{bytes}\cdot C/W}$, which in bf16
(2 bytes) with F = 4H is $1 + \frac{9}{8}\frac{F}{C/W}$: 7.3 for the 8.3B model on NVLink where the book's
F/(C/W) says 5.6, the same order, and the same factor of nine between NVLink and InfiniBand.
The planner counts more precisely still (attention, the all-reduces' latency, the embedding
and loss collectives, no overlap), so the three need not agree exactly."""),
    new_code_cell("""print(f"{'model, link':<30} {'C/W':>7} {'F/(C/W)':>8} {'1+9H/(2C/W)':>12} {'planner crossover t':>20}")
for name, config in [("8.3B", MEGATRON["8.3B"]), ("GPT-2 small", GPT2_SMALL)]:
    for link in ("h100-nvlink", "h100-infiniband"):
        prof = planner.load_profile(link)
        intensity = prof["matmul_flops"]["1"] * prof["all_reduce"]["native"]["beta_s_per_byte"]
        cross = planner.crossover_tp(config, prof, 8, itemsize=2, arch="gpt2")
        ours = 1 + 9 * config.hidden / (2 * intensity)   # section 2's ratio, bf16
        print(f"{name + ', ' + link:<30} {intensity:>7.0f} {config.ffn / intensity:>8.1f} {ours:>12.1f} {str(cross):>20}")"""),
    new_markdown_cell(r"""## 3. The planner's tables

Everything the planner prints for one configuration: the exact count, memory per rank by t
(weights, gradients, AdamW state, and activations from Korthikanti et al. 2022's formulas,
with and without sequence parallelism and selective recomputation: those columns are the
paper's formula, not a count of our model), the collectives of one step with their bytes
(all in the activations' dtype, the cross-entropy's three small all-reduces too, where a
vocab-parallel loss usually reduces in fp32: a few KB either way), and the predicted step
time by t. Here Megatron's 8.3B model in mixed precision on one
8-GPU NVLink node."""),
    new_code_cell("""args = planner.build_parser().parse_args(
    "--arch gpt2 --hidden 3072 --heads 32 --layers 72 --vocab-size 51200 --seq-len 1024 "
    "--tp 8 --profile h100-nvlink --dtype bfloat16 --precision mixed --batch-size 8".split())
planner.report(args, planner.config_from_args(args), planner.load_profile(args.profile))"""),
    new_markdown_cell(r"""In mixed precision (bf16 weights and gradients; fp32 master weights, m and v under "AdamW":
16 bytes per parameter) the 8.3B model needs about 124 GiB at t = 1 before a single
activation, and about 15.6 GiB per GPU at t = 8. That, more than speed, is why Megatron used
TP: the model did not fit. The step-time table shows the price: 8 GPUs, about 3.6x faster.

Look at its "elem." column: priced as our code runs them, unfused, the element-wise ops take more
time than the matmuls at t = 8, and their replicated part (the norms, the residual adds) does not
shrink with t at all. At t = 1, about half of those bytes are the softmax over the materialised
T x T scores and a quarter AdamW's seven passes over its state (`planner.ELEMENTWISE_PASSES` lists
each op's reads and writes); both shrink with t, so at t = 8 the replicated residual adds (36 %)
and norms (15 %) are half of the element-wise bytes, the softmax a quarter and AdamW an eighth. That is why Megatron-LM fuses exactly these ops into single kernels (the scaled,
masked softmax; bias + GeLU; LayerNorm), why FlashAttention never writes the scores to memory,
and why a fused optimizer updates each parameter in one pass. The planner prices the unfused
code of this course; a fused model moves fewer bytes.

### A Llama-3-70B-like model: inside one node, and across two

Llama 3 70B (80 layers, H = 8192, 64 query and 8 key/value heads, F = 28672, V = 128256) with
one 8192-token sequence per rank. With t = 8 the TP group is one node on NVLink. With t = 16 it
spans two nodes, and every ring all-reduce is as slow as its slowest hop: InfiniBand. (At
T = 8192 the unfused softmax dominates the "elem." column: 64 heads x 8192² scores per layer
and sequence. With FlashAttention that term all but disappears.)"""),
    new_code_cell("""prof_node, prof_ib = planner.load_profile("h100-nvlink"), planner.load_profile("h100-infiniband")
print(f"{'t':>3} {'link':<16} {'params/rank':>14} {'compute ms':>11} {'elem. ms':>9} {'comm ms':>9} {'step ms':>9}")
for t, prof in [(1, prof_node), (2, prof_node), (4, prof_node), (8, prof_node), (16, prof_ib)]:
    p = planner.predict_step(LLAMA_70B, prof, t, 1, itemsize=2, arch="llama")
    n = planner.parameter_count(LLAMA_70B, "llama", t)
    print(f"{t:>3} {prof['name']:<16} {n:>14,} {p['compute_s']*1e3:>11.1f} {p['elementwise_s']*1e3:>9.1f} "
          f"{p['communication_s']*1e3:>9.1f} {p['step_s']*1e3:>9.1f}")"""),
    new_markdown_cell(r"""**Why TP stays inside a node.** TP's communication is on the critical path: every layer
waits for its all-reduce before the next matmul can start, four times per step and layer,
and its volume does not shrink as t grows. Data parallelism's single gradient all-reduce
per step can overlap with the backward pass, and pipeline parallelism sends one activation
per stage boundary. So the fastest link (NVLink, about 450 GB/s per direction, against
50 GB/s for one InfiniBand NDR port) goes to TP, and t stops at the number of GPUs in a
node (8). Across nodes: data and pipeline parallelism. (These are vendor-spec peak numbers
and an assumed latency. Real sustained FLOP/s are lower than peak, which alone would make the
communication a smaller share of the step; real link bandwidth is below peak too, which pushes
the other way. Which wins depends on the kernels and the network: calibrate, section 4.)"""),
    new_markdown_cell(r"""## 4. This machine: the planner's bytes, and measured strong scaling

First, the bytes. The planner lists every all-reduce our trainer makes (13 per step for the
default 2-layer model) and the bytes the from-scratch ring sends for each. Training two steps
on 3 simulated ranks (an uneven vocabulary split, so the ranks send different amounts), the
meter of every rank agrees to the byte:"""),
    new_code_cell("""argv = ["--tp", "3", "--steps", "2", "--hidden", "48", "--heads", "6", "--kv-heads", "3"]
args = train.parse(argv)                  # the trainer's settings; args.model is its GPTConfig
config = args.model

def one_rank(comm):
    train.train_on_comm(comm, argv)
    return comm.meter.snapshot()

for r, meter in enumerate(run_spmd(one_rank, 3)):
    predicted = 2 * sum(row["ring_bytes"] for row in planner.traffic(config, 3, args.batch_size, tp_rank=r))
    print(f"rank {r}: meter {meter['bytes_sent']:,} bytes sent, planner {predicted:,}")
    assert meter["bytes_sent"] == predicted
for row in planner.traffic(config, 3, args.batch_size):
    print(f"  {row['where']:<46} x{row['calls']:<2} {row['ring_bytes']:>8,} bytes")"""),
    new_markdown_cell(r"""Now time. `planner --calibrate` measured this machine: matmul FLOP/s of one process with one
and with two BLAS threads; the seconds per element of each element-wise op of the model,
forward and backward (LayerNorm, GeLU, the scaled and masked softmax, the residual adds,
attention's strided copies, the cross-entropy, AdamW); a per-step overhead (Python, autograd,
the optimizer's loop, timed on a model too small to compute); and the latency alpha and
bandwidth beta of gloo's all-reduce between two processes, fitted on the median call (a step
makes a dozen all-reduces and pays the typical one, not the luckiest).

The element-wise work is where TP's promise of "1/t of the work per rank" breaks: the norms
and the residual adds act on the whole (B, T, H) activation on every rank, whatever t is.
Only the activation, the softmax, the copies, the loss and AdamW (on the rank's own
parameters) shrink. Two rows even grow from t = 1 to t = 2: at t = 1 a row layer adds its bias
inside the matmul (one `addmm`), but with t > 1 the bias may only be added once, after the
all-reduce, as a separate add of a whole (B, T, H): `add` goes from 5 to 9 (B, T, H) per step
for two layers (x1.8), and those row biases' gradients (`bias_grad`) are whole on every rank too. `planner.elementwise_elements` counts each (a test checks every count against
the aten ops one forward actually runs, on every TP rank):"""),
    new_code_cell("""config = GPTConfig(vocab_size=512, seq_len=128, n_layers=2, hidden=512, n_heads=8, n_kv_heads=4)
prof = json.loads((REPO / "lessons/measurements/scaling.json").read_text())["profile"]
per_element = prof["elementwise_s_per_element"]["1"]
e1, e2 = planner.elementwise_elements(config, None, 4, 1), planner.elementwise_elements(config, None, 4, 2)
print("one step of H=512, L=2, T=128, B=4 at the calibrated seconds per element (one thread)")
print(f"{'op':<14} {'ns/elem.':>8} {'t=1 elements':>13} {'ms':>6} {'t=2 elements':>13} {'ms':>6}")
for op in e1:
    print(f"{op:<14} {per_element[op] * 1e9:>8.2f} {e1[op]:>13,} {e1[op] * per_element[op] * 1e3:>6.1f} "
          f"{e2[op]:>13,} {e2[op] * per_element[op] * 1e3:>6.1f}")
ms1, ms2 = (sum(e[op] * per_element[op] for op in e) * 1e3 for e in (e1, e2))
print(f"{'total':<14} {'':>8} {'':>13} {ms1:>6.1f} {'':>13} {ms2:>6.1f}   t=2 / t=1: {ms2 / ms1:.2f}, not 0.50")"""),
    new_markdown_cell(r"""`bench scaling` then timed a real training step (forward, backward,
AdamW) in three ways over several model sizes, alternating the three round by round:
tp = 1 with one thread, tp = 1 with two threads, and tp = 2 on two processes with one thread
each. Times are the best step of each (the one least disturbed by other programs on this
shared machine; the medians are in the file too). The file below is the committed
measurement, with the command that produced it."""),
    new_code_cell("""def show(measured):
    tp = [k for k in measured["rows"][0]["min_s"] if not k.startswith("tp1-")][0]
    print(measured["command"])
    prof = measured["profile"]
    together = prof.get("matmul_flops_concurrent", {}).get("1")
    print(f"profile: {prof['source']}; matmul GFLOP/s 1 thread {prof['matmul_flops']['1'] / 1e9:.0f}, "
          f"2 threads {prof['matmul_flops']['2'] / 1e9:.0f}"
          + (f", 1 thread while the other process multiplies too {together / 1e9:.0f}" if together else "")
          + f"; step overhead {1e3 * prof.get('step_overhead', {}).get('per_layer_s', 0):.1f} ms per layer; load average during the rows "
          f"{min(r['load_average'][0] for r in measured['rows']):.1f} to {max(r['load_average'][0] for r in measured['rows']):.1f}")
    print(f"{'H':>5} {'params':>10} {'tp1 1thr':>9} {'tp1 2thr':>9} {tp:>8} {'speedup':>8} {'eff.':>5} "
          f"{'vs 2thr':>8} | predicted/measured {'tp1 1thr':>8} {'tp1 2thr':>8} {tp:>6}")
    for row in measured["rows"]:
        m, r = row["min_s"], {k: f"{x:.2f}" if x else "-" for k, x in row["predicted_over_measured"].items()}
        print(f"{row['hidden']:>5} {row['parameters']:>10,} {m['tp1-1thread']*1e3:>9.1f} {m['tp1-2threads']*1e3:>9.1f} "
              f"{m[tp]*1e3:>8.1f} {row['speedup_vs_1thread']:>7.2f}x {row['efficiency']:>5.0%} "
              f"{row['speedup_vs_2threads']:>7.2f}x | {'':>18} {r['tp1-1thread']:>8} {r['tp1-2threads']:>8} {r[tp]:>6}")
    ratios = [x for row in measured["rows"] for x in row["predicted_over_measured"].values() if x]
    print(f"{sum(0.75 <= x <= 1.25 for x in ratios)} of {len(ratios)} predicted/measured ratios within ±25 % "
          f"({min(ratios):.2f} to {max(ratios):.2f})")

measured = json.loads((REPO / "lessons/measurements/scaling.json").read_text())
show(measured)
tp4 = REPO / "lessons/measurements/scaling_tp4.json"   # 4 ranks on 2 cores: oversubscribed
if tp4.exists():
    print()
    show(json.loads(tp4.read_text()))"""),
    new_code_cell("""rows = measured["rows"]
fig, (a, b) = plt.subplots(1, 2, figsize=(12, 3.6))
hs = [r["hidden"] for r in rows]
a.plot(hs, [r["speedup_vs_1thread"] for r in rows], "o-", label="tp=2 vs tp=1, 1 thread")
a.plot(hs, [r["speedup_vs_2threads"] for r in rows], "s-", label="tp=2 vs tp=1, 2 threads")
over_mpi = json.loads((REPO / "lessons/measurements/scaling_mpi.json").read_text())  # section "Is it the link?"
a.plot(hs, [r["speedup_vs_1thread"] for r in over_mpi["rows"]], "o--", color="C0", alpha=0.6,
       label="the same over MPI, vs 1 thread")
a.plot(hs, [r["speedup_vs_2threads"] for r in over_mpi["rows"]], "s--", color="C1", alpha=0.6,
       label="the same over MPI, vs 2 threads")
a.axhline(2.0, color="grey", ls=":", label="ideal on 2 cores")
a.axhline(1.0, color="red", ls=":", label="no gain")
a.set(xlabel="hidden size H", ylabel="speedup", title="strong scaling, measured (solid: gloo, dashed: MPI)",
      ylim=(0, 2.1))
a.legend(fontsize=7, loc="lower right")
big = rows[-1]
prof = measured["profile"]
config = GPTConfig(**{k: v for k, v in big["config"].items() if k in GPTConfig.__dataclass_fields__})
preds = [planner.predict_step(config, prof, 1, big["batch_size"], threads=1),
         planner.predict_step(config, prof, 1, big["batch_size"], threads=2),
         planner.predict_step(config, prof, 2, big["batch_size"], threads=1)]
step_time_bars(b, ["tp1 1thr", "tp1 2thr", "tp2"],
               [p["compute_s"] + p["elementwise_s"] + p["overhead_s"] for p in preds],
               [p["communication_s"] for p in preds],
               measured_s=[big["min_s"][k] for k in ("tp1-1thread", "tp1-2threads", "tp2")],
               title=f"H={big['hidden']}: predicted (bars) and measured (dash)")
fig.tight_layout()"""),
    new_markdown_cell(r"""How to read it: where predicted/measured is near 1, the model explains the step. Four
terms, each measured by `--calibrate`, none fitted to these steps: the matmul FLOPs at the
calibrated rate (with two processes, the rate one keeps while the other multiplies too); the
element-wise ops at their seconds per element; the all-reduces' alpha and beta; and a per-step
overhead. The line under each table counts the ratios within ±25 % (on the committed quiet run,
62 of the 63 in this table and the two below; the miss is at H = 128, where a step lasts a few
tens of milliseconds and each call's wait for a core weighs most).

Two lessons came out of getting there. A first version counted only matmuls, collectives and the
overhead, and predicted 0.34 to 0.86 of the measured time: the element-wise work is 10 to 15 % of
a step here (more at small H, where the softmax's T x T scores weigh more against the H² matmuls),
and it was missing. And an all-reduce timed alone after a barrier, on idle cores, costs about half
of what the same call costs inside a step, where it starts only when the later rank arrives and
its messages move only when the other process's thread gets a core back from a matmul; the
calibration now times the calls in lockstep between matmuls, as a step makes them.

The ratios hold on a quiet machine. Under load the calibration itself reads a fraction of the
quiet matmul rate, one process with two BLAS threads collapses (its threads wait for each other at
every parallel region while the scheduler hands their cores to other programs), and more processes
simply get more of the machine's time slices, so tp=4 can even look faster than 2x. The load
average is recorded per row (printed above); rerun the commands on a quiet machine to see your own.

### Where a tp=2 step's time goes

`bench scaling --trace` runs the same steps under `torch.profiler` (tp = 1 on one process with
one thread, then tp = 2, alternating) and sorts every moment of the fastest step into one kind:
**matmul** (`aten::mm`, `addmm`, `bmm`), **copy** (`copy_`, `clone`, `cat`, `repeat_interleave`),
**other ops** (every other aten op: LayerNorm, GeLU, softmax, masks, AdamW's element-wise
updates), **communication** (the `c10d` call that starts an all-reduce, and gloo's all-reduce on
its own thread, which our main thread waits for: no overlap), and **python**, the rest (the
interpreter, autograd's bookkeeping, the optimizer's loop). Two ranks make the same all-reduces
in the same order, so each call's shortest duration over the ranks is the transfer itself; the
rest of a rank's time in that call is **waiting for the other rank** to arrive. The Chrome/Perfetto traces go to `runs/scaling/trace/` (open them in
https://ui.perfetto.dev); the committed summary holds the breakdown and one step's timeline."""),
    new_code_cell("""from tp_from_scratch.plots import step_timeline

steps = json.loads((REPO / "lessons/measurements/step_profile.json").read_text())
print(steps["command"])
for row in steps["rows"]:
    print()
    print(f"H={row['hidden']} (load average {row['load_average'][0]:.1f}): ms per step on rank 0, and each kind's share")
    for setup, s in row["ranks"][0].items():
        parts = "  ".join(f"{k} {v * 1e3:.0f} ({v / s['step_s']:.0%})" for k, v in s["seconds"].items() if v)
        print(f"  {setup:<4} {s['step_s'] * 1e3:7.0f}   {parts}")
    for setup, p in row.get("predicted", {}).items():
        print(f"  {setup} predicted: matmul {p['compute_s'] * 1e3:.0f}, element-wise {p.get('elementwise_s', 0) * 1e3:.0f}, "
              f"communication {p['communication_s'] * 1e3:.0f}, overhead {p.get('overhead_s', 0) * 1e3:.0f} ms")
rows = steps["rows"]
fig, axes = plt.subplots(len(rows), 1, figsize=(12, 2.3 * len(rows)), squeeze=False)
for ax, row in zip(axes[:, 0], rows):
    tp = [k for k in row["ranks"][0] if k != "tp1"][0]
    lanes = [("tp1, 1 thread", row["ranks"][0]["tp1"]["timeline_ms"])]
    lanes += [(f"{tp} rank {r}", ranks[tp]["timeline_ms"]) for r, ranks in enumerate(row["ranks"])]
    step_timeline(ax, lanes, title=f"one training step, H={row['hidden']}")
fig.tight_layout()"""),
    new_markdown_cell(r"""How to read it. The matmuls halve: each rank multiplies by half of every weight, so the
blue of a tp = 2 rank is about half of tp = 1's. What tp = 1 never pays is orange: the 13
all-reduces of a step (the embedding's, two per layer forward and two backward, the head's, and
the loss's three small ones), each a blocking call the rank sits out. On the quiet run committed
here the transfers are about a tenth of a tp = 2 step at H = 512 and a twentieth at H = 1024, and
**waiting** for the other rank a few per cent more; under load, a rank that the scheduler pauses
makes the other wait, and waiting then costs as much as the transfers. The replicated work (LayerNorms, residual adds, the position embedding, AdamW on the
replicated parameters) does not shrink with t, and each parallel layer adds Python (autograd
Functions, the collective calls).

What we changed after reading these traces: a row-parallel layer's partial sum and the
vocab-parallel embedding's rows are temporaries nobody reads again, so their g all-reduces them
in place (`nn.mappings.reduce_from_tp_region_`) instead of copying each (B, T, H) first: 2L + 1
fewer copies per step (the traces count 41 `aten::clone` per tp = 2 step before, 36 after). It is a small gain (a copy of 2 MiB takes about half a millisecond here),
too small to see through this shared machine's noise; the traces show where the rest goes, and
none of it is a copy or an extra collective. What would help further is not more trimming but
**overlap**: starting a backward all-reduce and computing the weight gradient while it travels
(Lesson 10) hides the transfer and the waiting, if a core is free to drive it.

### Is it the link? The same TP over MPI's shared memory

Under torchrun the TP group is gloo's, and gloo moves every message over TCP, even between two
processes of one machine: the calibration times one all-reduce, in lockstep between matmuls, at
almost 2 ms even for 1 KiB (the table below: 1.79 ms). Under `mpiexec` the same model (the same Block, the same
TP layers) takes an `MPIComm` as its group instead: our ring all-reduce of Lesson 2 over MPI's
point-to-point messages, which MPICH passes through shared memory. Nothing else changes.

    .venv/bin/mpiexec -n 2 .venv/bin/python -m tp_from_scratch.bench scaling

"""),
    new_code_cell("""show(over_mpi)
links = {name: over_mpi["profile"]["all_reduce"][name] for name in ("native", "mpi")}
print()
for name, label in (("native", "gloo, native (torchrun)"), ("mpi", "our ring over MPI (mpiexec)")):
    fit = links[name]
    print(f"all-reduce in lockstep, {label:<28} 1 KiB {fit['seconds'][0] * 1e3:5.2f} ms   "
          f"4 MiB {fit['seconds'][-1] * 1e3:5.2f} ms")
print()
print(f"{'H':>5} {'tp=2 vs 2 threads: gloo':>25} {'MPI':>6}   {'vs 1 thread: gloo':>18} {'MPI':>6}")
for gloo, mpi in zip(measured["rows"], over_mpi["rows"]):
    print(f"{gloo['hidden']:>5} {gloo['speedup_vs_2threads']:>24.2f}x {mpi['speedup_vs_2threads']:>5.2f}x   "
          f"{gloo['speedup_vs_1thread']:>17.2f}x {mpi['speedup_vs_1thread']:>5.2f}x")"""),
    new_markdown_cell(r"""With a link several times cheaper per call, the same tp = 2 catches up with one process using
both cores through two BLAS threads at every size but the smallest, and its strong scaling comes
close to the 2x two cores allow; over gloo it gets there only at the largest size. What held TP back under torchrun was the link, not the sharding: the C/W ratio of
section 2 again, on a laptop. It is also why this course keeps both launchers: gloo is what
torch.distributed offers on CPUs (and the path to NCCL on GPUs), while MPI shows what the same
code does when its messages are cheap.

### The fair race against PyTorch's own TP

`bench train` times our GPT against PyTorch's DTensor TP on the same weights and batches, in
alternating rounds, and prints two ratios: against `dtensor_plan.tp_plan` (blocks sharded,
embedding and LM head **replicated**: every rank computes all V logits) and against
`dtensor_plan.vocab_plan`, the same sharding as ours (embedding
`RowwiseParallel(input_layouts=Replicate())`, the head's weight `Shard(0)` so the logits stay
`Shard(-1)`, and `loss_parallel`'s cross-entropy). Only the second is a fair race; both train
the same losses as one device (tests/test_plan_dtensor.py).

    .venv/bin/torchrun --standalone --nproc-per-node 2 -m tp_from_scratch.bench train

## 5. On a CPU laptop

* TP is rarely a speed-up tool on a few CPU cores. One process with as many BLAS threads as
  cores does the same matmuls with no all-reduces, in one memory. TP on processes only matches it
  when its messages are cheap relative to the compute: with MPI's shared memory from H = 192 on
  (0.99x to 1.10x), with gloo's TCP only at the largest size (H = 1024, 1.02x), and then only just.
  On a busy machine, separate single-threaded processes degrade more gracefully than a
  multi-threaded one: measure, with `bench scaling` (under torchrun and under mpiexec).
* TP on a laptop is for **learning and checking**: the simulated ranks of `run_spmd` and
  2-process torchrun runs prove the sharding correct, bit for bit, before you rent GPUs.
* If a model is too slow: a smaller model, shorter sequences, or more steps of a smaller
  batch (gradient accumulation) all help more than TP.
* When you do move to GPUs: run `planner` first with your model's flags and the node's link,
  keep t within one node, and look at the crossover t it prints."""),
]

write_notebook(cells, HERE.parent / "09_when_tp_pays.ipynb")
