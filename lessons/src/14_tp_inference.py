"""Generate lessons/14_tp_inference.ipynb (without outputs; `make lessons` executes it).

    .venv/bin/python lessons/src/14_tp_inference.py
    .venv/bin/jupyter nbconvert --to notebook --execute --inplace lessons/14_tp_inference.ipynb

The measured decode latencies come from lessons/measurements/decode_latency.json, written on a
quiet machine by
    bash lessons/measurements/remeasure/14_decode_latency.sh
Everything else runs live on simulated ranks in well under a minute.
"""
from pathlib import Path

from nbformat.v4 import new_code_cell, new_markdown_cell
from lesson_notebook import write_notebook

HERE = Path(__file__).resolve().parent

cells = [
    new_markdown_cell(r"""# Lesson 14: tensor parallelism at inference time (ex14)

The text this course grew from says TP is needed "to keep latency low during real-time
inference". Lesson 6 generated text with TP and timed it: on this machine a decode step got
*slower* at t = 2. Both are true, and this lesson says when each one holds.

1. **Why decode is latency-bound**: the planner's inference mode prices a decode step (weights
   and KV cache read at memory bandwidth, 2L + 1 all-reduces of B·H numbers, the token choice's
   exchange) and answers at which batch and context t = 8 speeds a Llama-3-70B-like decode up,
   and by how much; then it predicts Lesson 6's measured decode latency on this machine.
2. **The next token from the vocabulary shards** (Exercise 14): greedy, temperature and top-k
   without gathering the (B, V) logits, with ids *identical* to the gathered choice at every t.
3. **Dropping or shrinking TP's syncs at inference**, two recent techniques: Sync-Point Drop
   (Kim et al., ICML 2025) and quantized all-reduce (Flash Communication, Li et al., arXiv
   December 2024), each
   equal to a float64 single-device emulation, with bytes = formula, beside CAAT-Net (Lesson 8).
4. **What each costs on real text**: perplexity against bytes per token against the modelled
   decode step, for all of them on one small trained model, with the papers' numbers beside ours.
5. **Heads that t does not divide** (section 7): 52 heads at t = 8 or 3, FFN widths and KV heads
   split ⌈n/t⌉ or ⌊n/t⌋, equal to one device in training, generation, checkpoints and Hugging
   Face's import and export.

Where things are (`tp_from_scratch/inference/`): `latency.py` the model, `planner.py` its command
line, `calibrate.py` and `benchmark.py` this machine; `sampling.py`; `quantized.py` (the
collectives and their emulations), `layers.py` (the TP layers and SPD's block), `models.py` (the
inference GPT, its bytes, SPD's block order), `emulation.py` (the t-rank model on one device),
`experiment.py` (section 6).

Legend: B batch (sequences decoded together), T sequence, H hidden, F ffn, V vocab, L layers,
nh / nkv query / KV heads of size hs, t the TP degree; a decode step makes one token per sequence."""),
    new_code_cell("""import sys, json
from pathlib import Path
if not (Path.cwd() / "tp_from_scratch").is_dir():  # run from lessons/: make the package importable
    sys.path.insert(0, str(Path.cwd().parent))
REPO = Path.cwd() if (Path.cwd() / "tp_from_scratch").is_dir() else Path.cwd().parent

import torch
import matplotlib.pyplot as plt

from tp_from_scratch.collectives import ring_all_reduce_bytes
from tp_from_scratch.comm import run_spmd
from tp_from_scratch.compare import assert_matches_reference, tolerance
from tp_from_scratch.gpt.model import GPTConfig, init_gpt
from tp_from_scratch.inference import benchmark, latency, planner
from tp_from_scratch.inference.emulation import partitioned_forward
from tp_from_scratch.inference.models import forward_bytes, inference_gpt, sensitivity_order, zero_shot_blocks
from tp_from_scratch.inference.quantized import quantized_all_reduce, reduce_bytes, reference_reduce
from tp_from_scratch.inference.sampling import (gathered_sampling_bytes, greedy_from_shards, sample_from_shards,
                                                sample_gathered, sharded_sampling_bytes)
from tp_from_scratch.plots import step_time_bars
from tp_from_scratch.sharding import shard_sizes

LLAMA_70B = GPTConfig(arch="llama", vocab_size=128256, seq_len=8192, n_layers=80, hidden=8192, n_heads=64,
                      n_kv_heads=8, ffn=28672)
NVLINK, PCIE, IB = (latency.load_profile(name) for name in ("h100-nvlink", "h100-pcie", "h100-infiniband"))"""),
    new_markdown_cell(r"""## 1. Why decode is latency-bound

A decode step pushes **one token per sequence** through the model. Every weight is read from
memory once per step whatever B is, and multiplied by B tokens: 2 FLOPs per weight per token
against 2 bytes (bf16) per weight. A matmul is compute-bound only when the tokens in flight
outnumber the chip's FLOP/s per byte/s of memory: the JAX scaling book ("How to Scale Your
Model", Part 7, *All About Transformer Inference*, "Linear operations") calls it $B_\text{crit}$,
240 for bf16 on a TPU v5e; for an H100 SXM, 989 TFLOP/s over 3.35 TB/s (vendor spec) is about
295. Below it, a step's time is its **bytes read**:

$$T_\text{read} = \frac{\text{(matmul weights)}/t + \text{(KV cache)}/t}{\text{memory bandwidth}},
\qquad \text{KV cache} = L \cdot B \cdot \text{context} \cdot 2 \cdot n_\text{kv} \cdot hs \cdot \text{bytes}$$

So TP helps decode the way the book says ("Distributing Inference Over Multiple Accelerators":
for generation, more chips give "access to more HBM bandwidth (for potentially better per-step
latency)"): more chips, more memory bandwidth for the same bytes. The price: per step, **2L + 1 all-reduces**
(the vocabulary-parallel embedding's, and g after attention and after the MLP in every block) of
B·H numbers each, 16 KiB at B = 1 and H = 8192. A message that small is all latency: a call costs
α, whatever it carries. Here α comes from a per-call figure for each profile (its source is
printed: a published measurement for NVLink and InfiniBand, an assumption for PCIe), and a call is priced as `cost.model.all_reduce_seconds` prices Lesson 9's: $2(t-1)$
messages of the ring, $2\frac{t-1}{t}$ of the bytes (α per message = the published call latency / $2(t-1)$;
an all-gather, t-1 messages, then costs half a call: the ring's count, an assumption of the model). Then the token choice: gpt.generate all-gathers the (B, V/t)
logits (section 3 replaces that). Nothing overlaps: our code overlaps nothing.

The planner, for the Llama-3-70B-like model of Lesson 9 on one 8-GPU NVLink node, one sequence
with 8192 tokens cached (`latency.decode_step`; the same table on the command line:
`.venv/bin/python -m tp_from_scratch.inference.planner --arch llama --vocab-size 128256 --layers 80 --hidden 8192 --heads 64 --kv-heads 8 --ffn 28672 --batch-size 1 --context 8192 --profile h100-nvlink`):"""),
    new_code_cell("""args = planner.build_parser().parse_args(
    "--arch llama --vocab-size 128256 --layers 80 --hidden 8192 --heads 64 --kv-heads 8 --ffn 28672 "
    "--batch-size 1 --context 8192 --profile h100-nvlink".split())
planner.report(args, planner.config_from_args(args), NVLINK)"""),
    new_markdown_cell(r"""At t = 1 the weights alone (141 GB in bf16) do not fit an 80 GB H100: the t = 1 row is the time
one device *would* take. The first t that fits is 2. From there every doubling of t halves the
bytes each GPU reads, while the all-reduces do not shrink: they take a larger share of each step
as t grows. Now the question the lesson set out with: at which batch and context does t = 8 speed
a 70B decode up, and by how much? One row per batch and context; the last column compares t = 8
with the smallest t whose weights and KV cache fit one GPU (`latency.decode_table`):"""),
    new_code_cell("""for profile in (NVLINK, PCIE):
    print(f"== {profile['name']}: {profile['source']}")
    planner.report_sweep(LLAMA_70B, profile, [1, 2, 4, 8], 2, {})
    rows = latency.decode_table(LLAMA_70B, profile, [1, 8, 32, 128], [1024, 8192], [1, 2, 4, 8])
    fastest = all(r["steps"][8] < r["steps"][t] for r in rows for t in (1, 2, 4))
    gains = [r["speedup_vs_smallest_fit"] for r in rows if r["smallest_fit"] and r["smallest_fit"] < 8]
    print(f"t = 8 is the fastest t in every row: {fastest}; over the smallest t that fits it is "
          f"{min(gains):.2f}x to {max(gains):.2f}x faster (rows where a smaller t fits)\\n")
# across two nodes: t = 16 over InfiniBand against t = 8 inside one NVLink node
for batch, context in [(1, 8192), (32, 8192)]:
    inside = latency.decode_step(LLAMA_70B, NVLINK, 8, batch, context)
    across = latency.decode_step(LLAMA_70B, IB, 16, batch, context)
    print(f"B={batch:>3}, context {context}: t=8 NVLink {inside['step_s'] * 1e3:6.2f} ms "
          f"(all-reduces {inside['all_reduce_s'] * 1e3:5.2f}), t=16 across two nodes {across['step_s'] * 1e3:6.2f} ms "
          f"(all-reduces {across['all_reduce_s'] * 1e3:5.2f})")"""),
    new_markdown_cell(r"""How to read it. On NVLink, t = 8 is the fastest degree in every row, and the gain over the
smallest t that fits is largest where that t is 2 (small batch, short context): there the step
is almost all weight reads, and t = 8 reads a quarter of them. Where the KV cache grows (B = 128
at 8192 tokens: 343 GB of keys and values), only t = 8 fits at all. The all-reduces are the part
that does not shrink: at B = 1 they are about a quarter of the t = 8 step here. Ladder Residual's
authors report 38 % of a 70B TP=8 inference step in all-reduce on H100s (Zhang et al. 2025, arXiv
2501.06589; the figure is from the first author's blog post, repository Nanami18/Nanami18.github.io,
`blogs/ladder_residual/together_blog.md`), though their kernels and ours are not the same system. Over PCIe each call costs more (an assumed 25 µs, no published figure read) and
the link is seven times slower: the same t buys less. Across two nodes, t = 16 halves the bytes
each GPU reads again, but 161 calls at about 47 µs each (NCCL across two nodes of 8 H20 GPUs over InfiniBand NDR,
NVIDIA/nccl#1244)
cost more than it saves: **why TP stays inside a node**, for inference as for training (Lesson 9).

Everything here is a model: vendor-spec peak bandwidth (real kernels reach perhaps 70-80 % of it),
published call latencies from other systems, no overlap, no kernel launch cost in the arithmetic
(CUDA graphs assumed; the NVLink call latencies were timed without them, launch included).
The lesson's own check of the model is on the machine it runs on:

### This machine: predicted against measured

`.venv/bin/python -m tp_from_scratch.inference.benchmark` runs Lesson 6's latency bench
(`gpt.generate bench`: a random Llama-style model, 4 layers, H = 512, V = 4096, B = 1, greedy, one
BLAS thread per rank) with python at t = 1 and torchrun at t = 2 and 4, and predicts each step from
the profile `planner --calibrate` measured here: the memory bandwidth of a decode-like matmul, the
Python overhead of a decode step per layer (on a model too small to compute), and gloo's
all-reduce fitted in lockstep between matmuls at 2 and 4 processes (Lesson 9's calibration). The
committed measurement:"""),
    new_code_cell("""measured = json.loads((REPO / "lessons/measurements/decode_latency.json").read_text())
print(f"{measured['command']}, {measured['date']}, {measured['cores']} cores, "
      f"load average {measured['load_average'][0]:.1f}")
profile = dict(measured["profile"])
ratios = benchmark.report(measured["rows"], profile)
fig, ax = plt.subplots(figsize=(6, 3.4))
predictions = [benchmark.predict(row, profile)[0] for row in measured["rows"]]
step_time_bars(ax, [f"t={row['tp']}" for row in measured["rows"]],
               [max(p["memory_s"], p["compute_s"]) + p["overhead_s"] for p in predictions],
               [p["all_reduce_s"] + p["sampling_s"] for p in predictions],
               measured_s=[row["decode_ms_per_token"] / 1e3 for row in measured["rows"]],
               title="decode step on this machine: predicted (bars), measured (dash)")
fig.tight_layout()"""),
    new_markdown_cell(r"""What it shows. On two CPU cores TP makes decode slower, and the model says why: splitting the
weights this small model reads (71 MB in float32 at t = 1) saves the "read" column's milliseconds,
while each of the nine gloo all-reduces of a step costs 2(t − 1) messages of about α (two at
t = 2, six at t = 4), milliseconds each (gloo moves every message over TCP, even between two processes of one machine, Lesson 9),
and at t = 4 four processes share two cores. The ratio line above says how close the prediction
came: here within the ±25 % this lesson aims at at t = 1, 2 and 4. The load average printed above
is read after the run, whose own t = 4 bench is four processes on two cores; the machine was
quieter than for the two earlier runs, at load averages of 10.2 and 8.6, which came out at 0.56 to
0.64 and at 1.36 to 1.65: on two cores shared with other programs the calibration (memory
bandwidth, the per-layer overhead) and the bench, minutes apart, see different machines. Rerun `bash lessons/measurements/remeasure/14_decode_latency.sh` on a quiet
machine to see yours; the benchmark prints the ratios and asserts nothing."""),
    new_markdown_cell(r"""## 2. The next token from the vocabulary shards (Exercise 14)

The LM head is vocabulary-parallel (Lesson 5): rank r holds the logits of its ids, Sharded(vocab).
Lesson 6's `generate` all-gathers them to (B, V) on every rank, then picks: for Llama 3's
V = 128256 in bf16 that is 224 KB sent per rank per sequence and token at t = 8, to choose one
number. Serving engines have begun to pick from the shards instead: vLLM for greedy draft tokens
in speculative decoding (`use_local_argmax_reduction`, vllm-project/vllm#46448, merged), with open
pull requests for greedy and top-k decoding in vLLM (#54332) and for greedy decoding in SGLang
(sgl-project/sglang#35268). (The issue that asked for this lesson cites vLLM PRs #34049 and
#39419 and their +9 % to +31 % throughput; the course could not find them, so it quotes no number.)

**Greedy** is a maximum, and a maximum splits over ranks: each rank sends its row maximum and its
id, (B, 1, 2) float64; every rank takes the largest, ties to the lowest id (as torch.argmax on
the gathered row). A rank with no ids (V < t) sends (-inf, +inf), which loses every comparison.

**Sampling** is made a maximum too, by the Gumbel-max trick: with $G_v$ independent standard
Gumbel noise, $\arg\max_v (s_v + G_v)$ is a sample from softmax(s) (Gumbel 1954; Maddison, Tarlow
and Minka, "A* Sampling", 2014, §2). The noise must be the same on every rank for the same id,
and must not depend on t: `sampling.gumbel_noise` computes $G_v$ from (seed, position, row, id)
alone with a counter-based hash (SplitMix64's mixer, Steele et al. 2014), as GPU samplers use
Philox: no generator state, nothing to exchange. Scores follow gpt.generate.sampling_scores
(float32 logits / temperature). **Top-k** needs the k-th largest score of the whole row: each
rank sends its own k largest (padded with -inf when it holds fewer than k ids, so every rank sends
(B, k) float32), every rank takes the k-th largest of the t·k (the global top k are among them),
and masks the scores below it; scores *equal* to it stay, as sampling_scores keeps them.

How this relates to gpt.generate's `choose` today: that is the exponential race
$\arg\max_v p_v / E_v$, $E_v \sim \text{Exp}(1)$, which torch.multinomial runs on the CPU. Since
$-\log E_v$ is a standard Gumbel variable, the race *is* Gumbel-max on $\log p_v$: the same
distribution. The random numbers differ (a counter per id instead of a generator's next B·V
draws), so the same seed gives another sequence than `choose` (or transformers' `generate`) gives."""),
    new_code_cell("""V, B = 23, 6
logits = torch.randn(B, V, generator=torch.Generator().manual_seed(14))
logits[0, 0] = logits[0, -1] = logits[0].max() + 1      # a tie across ranks: the lowest id wins
logits[1] = float("-inf")                               # a row with nothing possible
reference = {"greedy": logits.argmax(-1), "T=0.7": sample_gathered(logits, 1, 40, 0.7),
             "T=1, top-3": sample_gathered(logits, 1, 40, 1.0, 3)}

for t in (1, 2, 3, 4, 8):                               # V = 23 split unevenly: 3 ids or 2 at t = 8
    sizes = shard_sizes(V, t)

    def one_rank(comm):
        start = sum(sizes[:comm.rank])
        local = logits[:, start:start + sizes[comm.rank]]
        comm.meter.reset()
        ids = {"greedy": greedy_from_shards(comm, local, start), "T=0.7": sample_from_shards(comm, local, start, 1, 40, 0.7),
               "T=1, top-3": sample_from_shards(comm, local, start, 1, 40, 1.0, 3)}
        return ids, comm.meter.bytes_sent

    for rank, (ids, sent) in enumerate(run_spmd(one_rank, t)):
        assert all(torch.equal(ids[k], reference[k]) for k in reference), (t, rank)
        assert sent == 2 * sharded_sampling_bytes(B, t) + sharded_sampling_bytes(B, t, 3)
    print(f"t={t:>2}: every rank chose {', '.join(f'{k} {v.tolist()}' for k, v in ids.items())}")

print("\\nbytes one rank sends to choose B tokens, Llama 3's vocabulary (bf16 logits):")
for t in (2, 4, 8):
    print(f"  t={t}: gathered {gathered_sampling_bytes(1, 128256, t, 0, 2):>9,} per sequence, from the shards "
          f"{sharded_sampling_bytes(1, t):>4} (top-50: {sharded_sampling_bytes(1, t, 50):>5,})")"""),
    new_markdown_cell(r"""The same ids at every t, ties and an impossible row included, for a few bytes per sequence
(the tests also run V = 5 on 8 ranks, three of which hold no ids).
In decode the bytes matter less than the call: the exchange is one more all-gather either way
(two with top-k), so on a GPU the saving is the gathered logits' bandwidth and the sampling work on
V/t entries instead of V; the planner prices both (`--sampling sharded`). Generation uses it through
a hook: `gpt.generate.generate(model, prompt, n, pick=sampling.shard_picker(sample, seed,
temperature, top_k))` chooses every token from the shards, and the tests check that the sequences
are those of one device at t = 2 and 3 (the vocabulary split unevenly) for fewer bytes than
gathering. Without `pick`, generate keeps Lesson 6's gathered `choose`, whose samples use other
random numbers.

**Exercise 14** (`exercises/ex14_sharded_sampling.py`): write `greedy_from_shards` and
`sample_from_shards` yourself. The graders (`exercises/test_ex14_sharded_sampling.py`, run them
with `make grade EX=ex14`) compare your ids with the gathered choice at t = 1, 2, 3, 4 and 8, with
planted ties, ranks that hold no ids, huge logits and infinities, float32, float64, float16 and
bfloat16, ids beyond the whole numbers a half-precision logit can hold (bfloat16 counts exactly only
to 256), and read the meter: only candidates may travel.

## 3. Sync-Point Drop: one all-reduce per block instead of two

Kim, Hoang, Kundu, Samragh and Cho (Apple), "SPD: Sync-Point Drop for Efficient Tensor Parallelism
of Large Language Models", ICML 2025 (arXiv 2502.20727). The abstract: SPD "selectively drop[s]
synchronization on attention outputs", with "a block design that allows execution to proceed
without communication", applied per block by its sensitivity; "about 20% overall inference latency
reduction with < 1% accuracy regression for LLaMA2-70B inference over 8 GPUs" (the PMLR abstract;
arXiv v3's reads "with 1%"). The course did not read the paper's method section; the block below
follows how two independent public single-device simulations read its Fig. 2 (they agree; the
course could not check the figure itself):

$$Y_r = \text{attn}_r(\text{ln}_1(x))\,W_{o,r}^\top \;\text{(Partial, no all-reduce)},\qquad
Z_r = \text{mlp}_r(\text{ln}_2(x + Y_r + b_o)),\qquad
\text{out} = x + \textstyle\sum_r (Y_r + Z_r) + b_o + b_\text{mlp}$$

Rank r's MLP sees only its own heads' attention output; the one all-reduce of the block carries
both partials, so after the block the stream is replicated and exact again (unlike CAAT-Net's
private streams, Lesson 8). The function depends on t: which heads a rank holds decides $Y_r$.
At t = 1 the block is the ordinary one. The emulation (`emulation.partitioned_forward`) computes
every rank's share on one device from the full weights, cut as the TP model is cut:"""),
    new_code_cell("""config = GPTConfig(arch="llama", vocab_size=64, seq_len=16, n_layers=4, hidden=48, n_heads=12,
                   n_kv_heads=2, ffn=96)
gpt = init_gpt(config, 14, torch.float64).eval()
idx = torch.randint(0, 64, (2, 16), generator=torch.Generator().manual_seed(0))
plain, _ = gpt(idx)
spd = (2, 3)

for t in (2, 4):
    def one_rank(comm):
        model = inference_gpt(comm, gpt, spd_blocks=spd)
        comm.meter.reset()
        with torch.no_grad():
            local, _ = model(idx)
        return local, comm.meter.bytes_sent

    results = run_spmd(one_rank, t)
    got = torch.cat([logits for logits, _ in results], dim=-1)
    emulated = partitioned_forward(gpt, idx, t, spd)
    assert_matches_reference(got, emulated, name="SPD logits", tol=tolerance("float64", layers=4))
    sent = [n for _, n in results]
    assert sent == [forward_bytes(config, t, r, idx.numel(), 8, spd) for r in range(t)]
    print(f"t={t}: SPD on blocks {spd} equals its emulation (largest difference {(got - emulated).abs().max():.1e}); "
          f"it moved the logits by {(got - plain).abs().max():.3f} from the ordinary model; rank 0 sent {sent[0]:,} bytes, "
          f"the ordinary model {forward_bytes(config, t, 0, idx.numel(), 8):,}")"""),
    new_markdown_cell(r"""**Which blocks.** As the ICML review describes the paper (OpenReview 23zxLtvder): SPD is applied
starting from the **last** block, one block more at a time towards the first, the perplexity
measured after each; the increase a block adds is its sensitivity. Blocks are then sorted into
insensitive (SPD zero-shot, no training), sensitive (SPD with block-to-block distillation) and
extremely sensitive (head grouping). `models.sensitivity_order(evaluate, L)` runs that back-to-front
sweep with any `evaluate(blocks)`, and `zero_shot_blocks(order, k)` takes the k least sensitive.
Here `evaluate` is the emulation's loss at t = 2 on random tokens of the random model above: it
shows the procedure; the sensitivities of an untrained model say nothing about a trained one."""),
    new_code_cell("""targets = torch.randint(0, 64, (2, 16), generator=torch.Generator().manual_seed(1))

def loss_with_spd(blocks):
    logits = partitioned_forward(gpt, idx, 2, blocks)
    return torch.nn.functional.cross_entropy(logits.flatten(0, 1), targets.flatten()).item()

order, sensitivity = sensitivity_order(loss_with_spd, config.n_layers)
print("sensitivity (loss added), back to front:", {b: f"{s:+.2e}" for b, s in sorted(sensitivity.items())})
print("least sensitive first:", order, "-> zero-shot SPD on 2 blocks:", zero_shot_blocks(order, 2))"""),
    new_markdown_cell(r"""## 4. Quantized all-reduce: the same calls, fewer bytes

Flash Communication (Li, Zhang, Ye et al., Meituan, arXiv 2412.04964; the abstract: intra-node
communication "more than 3x" faster, time-to-first-token "2x" lower, "nearly no sacrifice in model
accuracy"; per its summaries, on LLaMA-2/3 with L40 and A100 GPUs) replaces the row-parallel
all-reduce by a **two-step** one: every rank quantizes its partial and sends chunk j to rank j; rank
j dequantizes the t pieces, sums them in its own precision, re-quantizes its sum and all-gathers
it. The **all-gather variant** (compress, gather every partial, sum locally) sends each partial
once, quantized once; Hansen-Palmus et al. (arXiv 2411.09510) compress the row-parallel outputs
before they travel (their abstract), and the all-gather is the course's reading of how, not checked
in the paper.

`quantized.py` quantizes per group of g numbers, asymmetric min-max: $\text{lo} = \min$, $\text{scale} = (\max -
\min)/(2^{\text{bits}} - 1)$, $\text{code} = \operatorname{round}((x - \text{lo})/\text{scale})$, half to even, in the tensor's own dtype; codes are
packed bits to a number, and each group's lo and scale travel in the tensor's dtype. (The paper's
own group size and scale format were not read here. vLLM's QuickReduce, for AMD MI300, uses
symmetric INT4 groups of 32 and is switched on by an environment variable that picks FP, INT8,
INT6 or INT4 (vllm-project/vllm#19744, merged); an earlier integration PR, vllm#19094, closed
unmerged, made FP8 its default because "Q4 scenarios can cause serious accuracy problems on some
models".) Single device, with $P_r$ rank r's partial:

$$\text{two-step: } \text{out}_j = \text{QDQ}\Big(\sum_r \text{QDQ}(P_r[j])\Big) \text{ per chunk } j,
\qquad \text{all-gather: } \text{out} = \sum_r \text{QDQ}(P_r)$$

The first quantizes at two stages (each rank's partial, then each chunk's sum), the second at one
(each partial); both add t quantized partials. In float64 the collectives equal these
bit for bit, and the meter counts the bytes of `quantized.reduce_bytes`:"""),
    new_code_cell("""from tp_from_scratch.testing import random_array, rank_rng

shape, group = (4, 512), 128
for t in (2, 3, 4):
    def one_rank(comm):
        x = torch.tensor(random_array(rank_rng(14, comm.rank), shape))
        out = {}
        for scheme in ("two_step", "all_gather"):
            for bits in (8, 6, 4):
                comm.meter.reset()
                out[scheme, bits] = quantized_all_reduce(comm, x, bits, group, scheme), comm.meter.bytes_sent
        return out

    partials = [torch.tensor(random_array(rank_rng(14, r), shape)) for r in range(t)]
    exact = sum(partials)
    line = []
    for rank, out in enumerate(run_spmd(one_rank, t)):
        for (scheme, bits), (y, sent) in out.items():
            assert torch.equal(y, reference_reduce(bits, group, scheme)(partials))
            assert sent == reduce_bytes(exact.numel(), t, rank, bits, group, 8, scheme)
            if rank == 0:
                line.append(f"{scheme} {bits}-bit {sent / ring_all_reduce_bytes(exact.numel(), 8, t, 0):.2f}x bytes, "
                            f"error {(y - exact).abs().max() / exact.abs().max():.1e}")
    print(f"t={t}: every rank equals the emulation bit for bit;", "; ".join(line))"""),
    new_markdown_cell(r"""Bytes against the plain ring all-reduce of the same float64 tensor: the two-step sends a fixed
fraction of it at every t (its messages are the ring's: an all-to-all and an all-gather, t − 1 each),
the all-gather variant a fraction that grows with t ((t − 1) whole payloads instead of 2(t − 1)/t
of the tensor), so it pays only at small t. Against 8-byte numbers 8 bits are a small fraction;
against bf16 activations (2 bytes), 8 bits in groups of 128 send 0.52 of the plain bytes in the
two-step and 4 bits 0.27 (`quantized.payload_bytes`); the all-gather variant's ratio is t/2 times that.

## 5. Beside CAAT-Net: what each buys, priced by the planner

Three ways to make TP's syncs cheaper, on the 70B model at t = 8. **CAAT-Net** (Lesson 8) all-
reduces only p·H channels, in training and inference, and must be trained that way. **SPD** drops
whole calls at inference, with no retraining for its insensitive blocks. **Quantized all-reduce**
keeps every call and shrinks its bytes, with no retraining. Bytes per rank for one decode step
(B = 1) and the modelled decode step and prefill (8192 tokens), NVLink and PCIe:"""),
    new_code_cell("""def setups():
    yield "plain TP", {}, forward_bytes(LLAMA_70B, 8, 0, 1, 2)
    for k in (20, 40, 80):
        yield f"SPD, {k} of 80 blocks", {"spd_blocks": k}, forward_bytes(LLAMA_70B, 8, 0, 1, 2, tuple(range(k)))
    for bits in (8, 4):
        for scheme in ("two_step", "all_gather"):
            yield (f"{bits}-bit {scheme}", {"bits": bits, "scheme": scheme},
                   forward_bytes(LLAMA_70B, 8, 0, 1, 2, (), bits, 128, scheme))
    for p in (0.5, 0.25):
        yield f"CAAT-Net p={p}", {"synced_fraction": p}, forward_bytes(LLAMA_70B, 8, 0, 1, 2, synced_fraction=p)

print(f"{'':<24} {'bytes/step':>11} {'decode ms NVLink':>17} {'PCIe':>7} {'prefill ms NVLink':>18} {'PCIe':>8}")
for name, options, sent in setups():
    d = [latency.decode_step(LLAMA_70B, prof, 8, 1, 8192, **options)["step_s"] * 1e3 for prof in (NVLINK, PCIE)]
    p = [latency.prefill(LLAMA_70B, prof, 8, 1, 8192, **options)["step_s"] * 1e3 for prof in (NVLINK, PCIE)]
    print(f"{name:<24} {sent:>11,} {d[0]:>17.2f} {d[1]:>7.2f} {p[0]:>18.1f} {p[1]:>8.1f}")"""),
    new_markdown_cell(r"""The pattern the papers report, from the model: in **decode**, where every call is latency,
dropping calls is what helps (SPD: all 80 blocks take 13 % off the NVLink step here, 16 % off
PCIe's, where the paper reports about 20 % end to end on 8 GPUs), and compression or fewer channels
leave the step as it was. The all-gather variant's lower decode time is the ring's count of its
messages (t − 1 instead of 2(t − 1)), not a measured fact (section 1). In **prefill**, where each
all-reduce carries 8192·H numbers, bytes are what cost: compression or CAAT's fewer channels cut
the time to the first token, most on the slower PCIe link, where 4 bits cut it to less than half in this model
(Flash Communication's abstract: time-to-first-token 2x lower; summaries name L40 and A100 GPUs). The all-gather variant at t = 8 sends more than the plain all-reduce
and is slower. (The model's verdict; vllm-project/vllm#39783, open, reports its int8/fp8 two-shot
all-reduce cutting time-to-first-token 1.03-1.08x on Llama-3.3-70B at TP 4, and "no benefit" in
decode, where all-reduce is latency-bound.)

| technique | block all-reduces | bytes vs plain TP | retraining | the function depends on t | single-device reference |
|---|---|---|---|---|---|
| plain TP | 2 | 1 | — | no | the GPT |
| CAAT-Net (p) | 2, of p·H channels | about p | from scratch | yes | t streams (Lesson 8) |
| SPD (k of L blocks) | 1 in SPD blocks | (2L − k)/2L | none for insensitive blocks | yes | $Y_r$ into $\text{mlp}_r$, $\sum_r (Y_r + Z_r)$ |
| quantized, two-step | 2, compressed | payload / tensor | none | yes, via the partials | $\text{QDQ}(\sum_r \text{QDQ}(P_r[j]))$ |
| quantized, all-gather | 2, compressed | t/2 · payload / tensor | none | yes | $\sum_r \text{QDQ}(P_r)$ |

All three change what the model computes, and all three differently at each t: none of them can
be resharded for free. What each costs in accuracy is the next section's question.

## 6. On real text: perplexity, bytes per token and the modelled decode step

Every technique above is exact against its emulation; this section asks what each costs. One GPT
of the course (the `gpt` architecture, the one Lesson 8's CAAT-Net streams run: 4 layers, H = 64,
8 heads, 0.2 M parameters) is trained for 300 steps on bytes of the Python standard library's
source (`gpt/text.py`, V = 256) and scored on held-out bytes at t = 4 through the emulations the
tests prove equal to the TP models: plain TP; **SPD** zero-shot on k = 1 .. 4 blocks in the
back-to-front sensitivity order (measured on training bytes; the paper's distillation and head
grouping are not built); the **two quantized all-reduces** at 8, 6, 4, 3 and 2 bits in groups of
16 and 128 (here H = 64, so a group of 128 spans two tokens' rows, and in decode one token's row is
one group); and **CAAT-Net** at p = 0.5 and 0.25, trained from scratch on the same bytes for the
same steps. Bytes per generated token: rank 0's, B = 1, bfloat16 messages (`models.forward_bytes`,
which the tests hold to the meter). Time: the planner's decode step of this model on this CPU's
profile (the one measured in section 1), NVLink and PCIe. Measured by
`bash lessons/measurements/remeasure/14_text_experiment.sh` (minutes); the notebook reads the result:"""),
    new_code_cell("""from tp_from_scratch.inference import experiment

text = json.loads((REPO / "lessons/measurements/tp_inference_text.json").read_text())
print(f"{text['command']}, {text['date']}; {text['data']}; {text['steps']} steps; t = {text['t']}; "
      f"single-device held-out loss {text['single_device_loss']:.4f} nats per byte\\n")
print(experiment.table(text))
fig, axes = plt.subplots(1, 4, figsize=(13, 3.6), sharey=True)
experiment.plot(text, axes)
fig.suptitle("held-out perplexity against bytes per token and the modelled decode step (Pareto frontier dashed)")
fig.tight_layout()"""),
    new_markdown_cell(r"""What it shows, at this scale (one seed, 300 steps: differences of a few tenths of a percent are
within what another seed could move). **SPD**: the back-to-front sweep finds the first block the
sensitive one. Dropping the other three blocks' attention all-reduce, zero-shot, costs 0.1 %
perplexity (13.69 to 13.71), sends a third fewer bytes and takes about 30 % off the modelled NVLink
step of this tiny model (each call is α here); dropping the fourth costs 18 %. The paper reports
about 20 % lower end-to-end latency at < 1 % accuracy regression for LLaMA2-70B on 8 GPUs, with
distillation and head grouping for the blocks zero-shot cannot take (its abstract and the ICML
review); ours shows the shape (most blocks cheap to drop, some not), not those numbers.
**Quantized all-reduce**: 8 and 6 bits move perplexity by under 0.1 %, 4 bits in groups of 16 by
0.06 % (two-step); 2 bits in groups of 128 cost 10 % (two-step) and 6 % (all-gather). At equal bits
the two-step errs more than the all-gather (two quantization stages against one) and sends fewer
bytes at t = 4. Neither saves modelled decode time through its bytes: at a few hundred bytes a
call is α (the all-gather's lower time is the ring's message count, section 5). Flash
Communication reports "nearly no sacrifice in model accuracy" (abstract); vLLM's QuickReduce
integration warned that INT4 "can cause serious accuracy problems on some models" (vllm#19094);
and Dong et al., "Towards Low-bit Communication for Tensor Parallel LLM Inference" (arXiv
2411.07942, abstract), find outlier channels in the features TP communicates, keep them in high
precision and average 4.2 bits. **CAAT-Net** at p = 0.5 and 0.25 sends half and a quarter of the
block all-reduces' channels, and the model prices its decode step as plain TP's (same calls). Its
perplexity comes from *another* model, trained from scratch with partial synchronization: 10.95
and 10.46 against plain TP's 13.69 here. That is the direction CAAT-Net's abstract allows
("validation loss can even improve") and Lesson 8 saw on the Markov chain with three seeds, but
these models are far from trained (300 steps), where one training run can simply learn faster
than another early on; one seed cannot say whether the gap would last.

What a model this small cannot show: 4 blocks leave little room for SPD's insensitive blocks
(LLaMA2-70B has 80); a 0.2 M-parameter model trained for minutes has few of the outlier channels
that make 4-bit communication hard in large models (2411.07942), so compression looks easier here
than at 70B; and the times are the planner's, not measured: on this CPU every gloo call costs
milliseconds whatever it carries, so no technique here would change a measured step by its bytes.

## 7. Heads that t does not divide

LLaMA-33B has 52 heads; vLLM refuses it at t = 3 and a fine-tune of it at t = 8 ("Total number of
attention heads (52) must be divisible by tensor parallel size", vllm-project/vllm#414, where a
maintainer suggests padding the model's dimensions or another GPU count, and #2652), and Qwen2-7B's
28 query heads on 4 KV heads at t = 8 (#11797, a feature request that proposes padding or
replicated attention). Until this lesson the
course refused them too. A head cannot be cut without communication: its softmax needs the sum
over all of its dimensions. A query head cannot leave its KV head either, unless that KV head is
held by both ranks (its projection, cache and gradient sums duplicated) or its keys and values are
sent. The course splits by whole KV heads (`gpt.arch.head_counts`; the rule is its own choice):

* nkv ≥ t: rank r holds ⌈nkv/t⌉ or ⌊nkv/t⌋ whole KV heads (the first nkv mod t ranks one more, as
  `numpy.array_split`) and the nh/nkv query heads that read each. With multi-head attention
  (nkv = nh) that is ⌈nh/t⌉ or ⌊nh/t⌋ query heads: 7, 7, 7, 7, 6, 6, 6, 6 for 52 at t = 8.
* nkv < t: each KV head is held by t/nkv neighbouring ranks (Lesson 6's replication), which split
  its query heads ⌈⌉ or ⌊⌋; t must then be a multiple of nkv, the one refusal that remains here
besides a t larger than a size itself (fewer heads or FFN columns than ranks).
* The FFN width and the vocabulary split like `numpy.array_split`, column by column.

Nothing else changes: the layers are Lesson 5's, given the plan's sizes (`gpt.arch.split_sizes`);
the two all-reduces of a block still carry B·T·H numbers; checkpoints, DCP, the planner's inventory
and `verify`'s layouts read the same sizes, and so do SPD and the quantized all-reduce of sections
3 and 4 (their tests run a model of 10 heads on 5 KV heads against the emulation: SPD at t = 3, the
quantized all-reduces at t = 3 and 4). The price is balance: the rank with the most heads sets
the step. At t = 8 it attends with 7 of the 52 heads, 8 % more than the mean 6.5, and holds 2.5 %
more parameters than the mean (printed below; the FFN's columns differ by one at most). With
grouped-query attention the KV heads set the grain, and the price grows: 20 query heads on 4 KV
heads split 10, 5, 5 at t = 3, 50 % above the mean; 64 on 8 (Llama 3 70B's) split 16, 16, 8, 8, 8, 8
at t = 6. Splitting the query heads evenly instead, with each KV head at a boundary held by both of
its ranks (the nkv < t mechanism), would balance the query heads at the cost of duplicated KV
projections, cache and gradient sums; the course keeps KV heads whole. What cannot split unevenly says why: DTensor's `ColwiseParallel` (torch.chunk's split would
cut a head), Lesson 13's fixed reduction tree and CAAT-Net (Lesson 8) refuse such a t, naming the
size."""),
    new_code_cell("""from tp_from_scratch.gpt.arch import head_counts
from tp_from_scratch.gpt.check import UNEVEN_GPT2, UNEVEN_LLAMA, check_config, check_generation
from tp_from_scratch.gpt.inventory import parameter_count

# the sizes of their Hugging Face configs (seq_len enters no count; Qwen2's q, k, v biases, 129,024
# parameters, are left out: the course's llama has none)
LLAMA_33B = GPTConfig(arch="llama", vocab_size=32000, seq_len=2048, n_layers=60, hidden=6656, n_heads=52,
                      n_kv_heads=52, ffn=17920)
QWEN2_7B = GPTConfig(arch="llama", vocab_size=152064, seq_len=2048, n_layers=28, hidden=3584, n_heads=28,
                     n_kv_heads=4, ffn=18944)
for name, config, t in (("LLaMA-33B", LLAMA_33B, 8), ("LLaMA-33B", LLAMA_33B, 3), ("Qwen2-7B", QWEN2_7B, 8)):
    q, kv = head_counts(config, t)
    held = [parameter_count(config, t=t, rank=r) for r in range(t)]
    print(f"{name} at t={t}: query heads {q}, KV heads per piece {kv}; parameters per rank "
          f"{min(held) / 1e6:,.0f}M to {max(held) / 1e6:,.0f}M (the largest {max(held) / (sum(held) / t):.3f} x the mean)")

# and the promise, live on simulated ranks: 52 heads (GPT-2 style) at t = 8, 20 on 4 KV heads (Llama) at
# t = 3 (tests/test_uneven.py runs both at both)
for config, t in ((UNEVEN_GPT2, 8), (UNEVEN_LLAMA, 3)):
    run_spmd(lambda comm: check_config(comm, config, torch.float64), t)
    run_spmd(lambda comm: check_generation(comm, config, torch.float32), t)
    print(f"{config.arch}, {config.n_heads} heads on {config.n_kv_heads} KV heads, FFN {config.ffn}, t={t} "
          f"{head_counts(config, t)[0]}: logits, loss, every gradient, one SGD step and generated ids "
          "equal to one device")"""),
    new_markdown_cell(r"""`tests/test_uneven.py` proves more at t = 3 and 8: five training steps of the trainer's own loop
(with Lesson 7's sequence parallelism too),
both checkpoint formats saved at t = 3 and loaded into the TP model at t = 8, 2 and 1 bit for bit,
transformers' own GPT-2 of 52 heads and Llama of 20 on 4 KV heads imported and equal to it at
every gradient, an export read back by transformers, the planner's per-rank counts equal to what
the built model holds, and every refusal that remains. Lesson 6's trainer takes such a size as it is:

    .venv/bin/torchrun --standalone --nproc-per-node 3 -m tp_from_scratch.gpt.train --tp 3 --arch gpt2 --hidden 104 --heads 52 --kv-heads 52 --ffn 100 --steps 20 --compare-single

## Summary

* Decode reads every weight once per step: below ~300 tokens per step it is memory-bound, and TP
  speeds it up by splitting the bytes read, paying 2L + 1 latency-bound all-reduces per step. On
  one NVLink node the model finds t = 8 the fastest degree for the 70B model at every batch and
  context tried; across nodes, or on this CPU, the calls cost more than the split saves.
* The next token needs no gathered logits: candidates and Gumbel noise of the ids give the same
  ids at every t.
* SPD drops calls; quantized all-reduce shrinks bytes; CAAT-Net shrinks channels. In decode only the
  first helps much; in prefill the others do. Each is exact against its single-device emulation.
* KV heads and FFN widths that t does not divide split ⌈n/t⌉ or ⌊n/t⌋, and each rank takes the query
  heads of its KV heads (⌈nh/t⌉ or ⌊nh/t⌋ with multi-head attention); the rank with the most heads
  sets the pace, and one device is still the answer.
* On real text, at this small scale: zero-shot SPD on the least sensitive blocks and 4-bit
  communication in small groups cost well under 1 % perplexity; the most sensitive block, or 2 bits
  in large groups, cost 5-18 %. What 70B models pay is the papers' to say."""),
]

write_notebook(cells, HERE.parent / "14_tp_inference.ipynb")
