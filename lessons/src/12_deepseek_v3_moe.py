"""Generate lessons/12_deepseek_v3_moe.ipynb (without outputs; `make lessons` executes it).

    .venv/bin/python lessons/src/12_deepseek_v3_moe.py
    .venv/bin/jupyter nbconvert --to notebook --execute --inplace lessons/12_deepseek_v3_moe.ipynb

Everything runs live on simulated ranks in well under a minute: no measurement file.
"""
from pathlib import Path

from nbformat.v4 import new_code_cell, new_markdown_cell
from lesson_notebook import write_notebook

HERE = Path(__file__).resolve().parent

cells = [
    new_markdown_cell(r"""# Lesson 12 (ex12): DeepSeek-V3 — tensor parallelism meets mixture-of-experts

The text this course grew from names two systems trained with Megatron-LM's tensor
parallelism: Llama 3 and DeepSeek-V3. The second is the odd one out. Its technical report
(arXiv 2412.19437, §3.1-3.2) trains the 671B-parameter model (37B active per token) on 2048
H800 GPUs — 8 per node joined by NVLink and NVSwitch, nodes joined by InfiniBand — with
**16-way pipeline parallelism (DualPipe), 64-way expert parallelism spanning 8 nodes and
ZeRO-1 data parallelism, and no tensor parallelism**. Servers then run attention with TP and
the experts with EP (§3.4). This lesson builds both halves and says why.

Two ideas change what TP buys:
* **Multi-head latent attention (MLA)** compresses keys and values into one latent vector per
  token (512 numbers plus a 64-number RoPE key), from which every head's keys and values are
  expanded. Heads split across ranks as in Lesson 4; the latent does not.
* **DeepSeekMoE**: each token goes to 8 of 256 routed experts, plus a shared expert. Spreading
  experts over ranks needs the one collective Lesson 2 did not use: **all-to-all with uneven
  counts**.

Where things are (`tp_from_scratch/deepseek/`):
* `router.py` the router and its margin; `moe.py` the layer on one device;
* `expert_parallel.py` the three ways to run it on t ranks, and their traffic;
* `mla.py` MLA with heads split and its latent cache; `model.py` the whole model, equal to
  transformers' `DeepseekV3ForCausalLM` (`tests/test_deepseek_model.py`) in two layouts: tensor
  parallel, as served (heads split, experts in an inference layout), and expert parallel, as
  trained (each rank its own sequences, attention whole with its gradients summed as in data
  parallelism, the experts spread over the all-to-all);
* `checks.py`: every layout against one device, also under
  `.venv/bin/torchrun --standalone --nproc-per-node 4 -m tp_from_scratch.deepseek.checks` and, on
  Lesson 2's collectives over MPI, `.venv/bin/mpiexec -n 4 .venv/bin/python -m tp_from_scratch.deepseek.checks`;
* `checkpoint.py`, `convert.py`: the trainer's checkpoints in any layout, Hugging Face files in and out."""),
    new_code_cell("""import sys
from pathlib import Path
if not (Path.cwd() / "tp_from_scratch").is_dir():  # run from lessons/: make the package importable
    sys.path.insert(0, str(Path.cwd().parent))

import numpy as np
import torch
import matplotlib.pyplot as plt
from transformers import DeepseekV3Config

from tp_from_scratch import collectives
from tp_from_scratch.comm import run_spmd
from tp_from_scratch.compare import assert_matches_reference
from tp_from_scratch.deepseek import (LAYOUTS, MoEConfig, all_reduce_bytes_sent, check_routing_margin,
                                      ep_bytes_sent, route, routing_margin, tokens_per_rank)
from tp_from_scratch.deepseek.checks import TINY, check_layout, layout_data, random_moe
from tp_from_scratch.deepseek.mla import cache_bytes_per_token
from tp_from_scratch.deepseek.model import ParallelDeepseekV3, generate
from tp_from_scratch.deepseek.plan import (ep_bytes_per_token, memory_per_rank, node_bytes_per_token,
                                           parameter_count, tp_bytes_per_token)
from tp_from_scratch.gpt.model import GPTConfig, KVCache, TensorParallelGPT
from tp_from_scratch.gpt.text import text_batch
from tp_from_scratch.plots import device_color, draw_matrix
from tp_from_scratch.testing import random_array, rank_rng
torch.set_default_dtype(torch.float64)"""),

    # ------------------------------------------------------------------ where
    new_markdown_cell(r"""## 1. What lives where at t = 2

One decoder layer, as the course's `ParallelDeepseekV3` holds it on two ranks (each rank in
its colour; grey: not held). MLA's down-projections `q_a`, `kv_a` and their norms are
**replicated**: every rank computes the same latents. The per-head up-projections `q_b` and
`kv_b` are **column-parallel** (rank r holds the rows of its heads), `o` is **row-parallel**
(a partial sum, all-reduced: Megatron's g). In the MoE layer the router is replicated; the
experts are split either **by expert** (expert parallelism: 4 of the 8 on each rank) or **by
width** (expert tensor parallelism: half of every expert's FFN).

Where does the backward's all-reduce go? The latents are replicated, then each rank's heads
read them: the gradient arriving at the latents is a **partial** sum. Lesson 8's rule puts the
sum where the ranks start to differ, so `mla.py` applies f to the latents themselves —
q_lora + kv_lora + rope = 2112 numbers per token in DeepSeek-V3, fewer than its H = 7168 — and
everything before them (`q_a`, `kv_a`, the norms, x) then gets full gradients with no further
collective."""),
    new_code_cell("""# (rows, columns) of each weight in the tiny config, and the axis it is split on (None: replicated)
c = DeepseekV3Config(hidden_size=32, q_lora_rank=16, kv_lora_rank=8, num_attention_heads=4, qk_nope_head_dim=6,
                     qk_rope_head_dim=4, v_head_dim=5, n_routed_experts=8, moe_intermediate_size=12)
qk, heads = c.qk_nope_head_dim + c.qk_rope_head_dim, c.num_attention_heads
weights = [("q_a", (c.q_lora_rank, c.hidden_size), None), ("q_b", (heads * qk, c.q_lora_rank), 0),
           ("kv_a", (c.kv_lora_rank + c.qk_rope_head_dim, c.hidden_size), None),
           ("kv_b", (heads * (c.qk_nope_head_dim + c.v_head_dim), c.kv_lora_rank), 0),
           ("o", (c.hidden_size, heads * c.v_head_dim), 1), ("router", (c.n_routed_experts, c.hidden_size), None),
           ("experts (EP)\\nexpert x F", (c.n_routed_experts, c.moe_intermediate_size), 0),
           ("experts (ETP)\\nexpert x F", (c.n_routed_experts, c.moe_intermediate_size), 1)]
fig, axes = plt.subplots(2, len(weights), figsize=(15, 4.2))
for col, (name, shape, axis) in enumerate(weights):
    for rank in range(2):
        draw_matrix(axes[rank][col], shape, axis, 2, rank=rank)
        axes[rank][col].set_title(f"{name}" if rank == 0 else "", fontsize=9)
    axes[0][0].set_ylabel("rank 0"); axes[1][0].set_ylabel("rank 1")
plt.show()"""),

    # ------------------------------------------------------------------ all-to-all
    new_markdown_cell(r"""## 2. The all-to-all, derived

Expert parallelism gives each of t ranks its own tokens (its data-parallel share) and E/t
experts. After routing, rank q holds $c_{q,d}$ (token, expert) pairs whose expert lives on rank
d. Everything that must happen follows:

1. **The counts travel first.** Rank d must size its buffer before the rows arrive, and only
   the senders know $c_{q,d}$. `exchange_counts` is itself an all-to-all of t equal blocks: rank d
   receives column d of the count matrix — the matrix **transposed**. (The course exchanges one
   count per expert, (t, E/t) per rank, so the receiver also knows which expert each row is for.)
2. **Dispatch**: rank q sorts its pairs by expert — hence by destination — and sends block d to
   rank d: `all_to_all_v`, a pairwise exchange (step s: send to q+s, receive from q−s), every
   block received straight into its place. Nothing is dropped: the counts sized every buffer.
3. Each rank runs its experts on what arrived, then **combine** is the same all-to-all run
   backwards (counts swapped): every row returns to the rank and position it came from, where
   it is weighted by the router and summed. As an autograd function, the backward of dispatch
   *is* combine and vice versa (`nn.mappings.AllToAll`).

Bytes a rank sends in one forward: its off-rank pairs go out and as many rows come back from
others' tokens: $2\,(\text{off-rank pairs})\,H\,b$, plus $(t-1)\,E/t \times 8$ for the counts.
Under balanced routing each token of the batch costs $2k\frac{t-1}{t}Hb$ on the wire."""),
    new_code_cell("""t, moe = 4, random_moe(TINY, seed=1)
xs, _ = layout_data("expert parallel", t, TINY.hidden_size, seed=2)
counts = np.zeros((t, t), int)                       # counts[q, d]: pairs rank q sends rank d
for q, x in enumerate(xs):
    _, experts = route(x, moe.gate.weight, moe.gate.e_score_correction_bias, TINY)
    counts[q] = tokens_per_rank(experts, TINY.n_routed_experts, t).numpy()

def exchanged(comm):
    return collectives.exchange_counts(comm, counts[comm.rank])
received = np.stack(run_spmd(exchanged, t))
assert (received == counts.T).all()                  # what rank d learns: column d, the transpose

fig, axes = plt.subplots(1, 2, figsize=(8, 3.2))
for ax, m, title in [(axes[0], counts, "sent: counts[q, d]"), (axes[1], received, "received: counts[d, q]")]:
    ax.imshow(m, cmap="Blues")
    for (i, j), v in np.ndenumerate(m):
        ax.text(j, i, v, ha="center", va="center", color=device_color(j))
    ax.set_title(title, fontsize=10); ax.set_xlabel("to rank" if m is counts else "from rank"); ax.set_ylabel("rank")
plt.show()
print("tokens per rank:", [len(x) for x in xs], "; pairs each rank's experts receive:", counts.sum(0).tolist())"""),

    # ------------------------------------------------------------------ layouts
    new_markdown_cell(r"""## 3. Three ways to run the layer on t ranks

| layout | tokens on a rank | experts on a rank | forward collectives | wire bytes per token of the batch |
|---|---|---|---|---|
| (a) expert parallel (training) | its own | E/t whole | counts + 2 all-to-all | $2k\frac{t-1}{t}Hb$ (balanced) |
| (b) experts on all tokens (inference) | all | E/t whole | 1 all-reduce | $t \cdot 2\frac{t-1}{t}Hb = 2(t-1)Hb$ |
| (c) expert tensor parallel (Megatron's ETP) | all | F/t of every expert | 1 all-reduce | $2(t-1)Hb$ |

In (b) and (c) every rank holds every token, so each of the t ranks sends a ring all-reduce's
$2\frac{t-1}{t}Hb$ for it; in (a) a token lives on one rank and travels only to its k experts.
EP is cheaper per token of the batch when k < t (DeepSeek-V3: k = 8, EP = 64).

Each runs below at t = 4 and is checked against one device — output, input gradient and
every weight's gradient, float64, through `assert_matches_reference` (`checks.check_layout`).
The bytes are the meter's, asserted equal to the formula."""),
    new_code_cell("""t, rows = 4, []
for layout in LAYOUTS:
    xs, dys = layout_data(layout, t, TINY.hidden_size, seed=3, tokens=16)
    out = run_spmd(check_layout, t, layout, moe, xs, dys)    # raises unless every rank equals one device
    tokens = sum(len(x) for x in xs) if layout == "expert parallel" else len(xs[0])
    if layout == "expert parallel":
        all_counts = np.stack([o[1].numpy() for o in out])
        formula = [ep_bytes_sent(all_counts, r, TINY.hidden_size, 8) for r in range(t)]
    else:
        formula = [all_reduce_bytes_sent(len(xs[0]) * TINY.hidden_size, t, r, 8) for r in range(t)]
    sent = [o[0] for o in out]
    assert sent == formula
    layer = LAYOUTS[layout].from_module(moe, group=run_spmd(lambda comm: comm, t)[0])
    params = sum(p.numel() for p in layer.parameters())
    rows.append((layout, params, sum(sent) / tokens))          # every rank's bytes, per token of the batch
print(f"t = {t}, H = {TINY.hidden_size}, k = {TINY.num_experts_per_tok}, float64; one device holds "
      f"{sum(p.numel() for p in moe.parameters())} parameters")
print(f"{'layout':24s} {'params per rank':>16s} {'wire bytes per token (measured)':>32s}")
for layout, params, per_token in rows:
    print(f"{layout:24s} {params:16d} {per_token:32.0f}")"""),
    new_markdown_cell(r"""Here k = 3 < t = 4, so expert parallelism moves fewer bytes per token, although its shared
experts are replicated on every rank (more parameters per rank). What it also buys: each rank computes only its own
tokens (the all-reduce layouts compute the router and the shared expert for all tokens on every
rank), each expert stays one whole matmul (ETP cuts every expert into F/t-wide slivers: 2048/8 =
256 columns at DeepSeek-V3's size), and the all-to-all can be overlapped with another
micro-batch's compute, which is what DualPipe does.

**Load imbalance.** EP's cost is set by the busiest rank. A real batch — bytes of the
Python standard library (Lesson 6's text) embedded and routed by a random model — is not
balanced; DeepSeek-V3 balances it without an auxiliary loss by raising the selection bias of
under-loaded experts after each step ($b_i \mathrel{+}= \gamma$ if expert i is under the mean,
$-\gamma$ above). The bias only chooses; it never weighs (`route` gathers the sigmoid scores,
not score + bias)."""),
    new_code_cell("""ids = text_batch(0, 4, 64, seed=0)[0]                          # (4, 64) bytes of real text
embedding = torch.nn.Embedding(256, TINY.hidden_size)
torch.nn.init.normal_(embedding.weight, generator=torch.Generator().manual_seed(0))
x = embedding(ids).reshape(-1, TINY.hidden_size).detach()        # 256 tokens
bias, gamma = moe.gate.e_score_correction_bias.clone(), 0.01
for step in range(41):
    _, experts = route(x, moe.gate.weight, bias, TINY)
    per_expert = torch.bincount(experts.reshape(-1), minlength=TINY.n_routed_experts).double()
    load = tokens_per_rank(experts, TINY.n_routed_experts, 4)
    if step % 5 == 0:
        print(f"bias step {step:2d}: pairs per rank {load.tolist()}, busiest / mean = "
              f"{load.max() / load.double().mean():.2f}")
    bias += gamma * torch.sign(per_expert.mean() - per_expert)     # the report's update rule"""),
    new_markdown_cell(r"""The busiest rank falls from about 2.5 times the mean to 1.3-1.4 within 25 updates, and stays
near there without settling: a sign rule moves every bias by ±γ at every step, so on the same
256 tokens it keeps stepping over the balance point. DeepSeek-V3 steps far more
gently (γ = 0.001, §4.2) over a stream of new batches, and adds a small sequence-wise balance
loss for the extreme cases."""),

    # ------------------------------------------------------------------ MLA cache
    new_markdown_cell(r"""## 4. MLA's cache: the latent, measured

Generation caches, per token and layer, what later tokens attend to. MHA caches K and V of its
heads; a rank with nh/t heads caches 1/t of them. MLA caches the latent $[c_{kv} \mid
\text{RoPE}(k_{rope})]$, kv_lora + rope numbers, from which each rank expands **its own** heads'
keys and values every step. The latent is not split by heads, so **every rank caches all of it,
whatever t**, while a GQA rank caches max(n_kv/t, 1) KV heads (a KV head cannot be split).
Below: the course's model generates greedily with the latent cache at t = 1, 2, 4
(the same tokens on every rank and at every t — `tests/test_deepseek_model.py` checks them
against transformers' `generate`), and the cache is measured, beside the KV cache of Lesson
6's Llama-style GPT of the same width (H = 32, 4 heads)."""),
    new_code_cell("""config = DeepseekV3Config(vocab_size=67, hidden_size=32, intermediate_size=48, moe_intermediate_size=12,
                          num_hidden_layers=2, first_k_dense_replace=1, num_attention_heads=4, q_lora_rank=16,
                          kv_lora_rank=8, qk_nope_head_dim=6, qk_rope_head_dim=4, v_head_dim=5, n_routed_experts=8,
                          num_experts_per_tok=3, n_group=4, topk_group=2, n_shared_experts=2,
                          rope_parameters={"rope_type": "default", "rope_theta": 1000.0})
model = ParallelDeepseekV3(config, group=run_spmd(lambda comm: comm, 1)[0])
with torch.no_grad():
    for p in model.parameters():
        p.copy_(0.2 * torch.randn(p.shape, generator=torch.Generator().manual_seed(p.numel())))
state = model.state_dict()
prompt = torch.tensor(rank_rng(5).integers(0, 67, size=(1, 4)))

def generate_on(comm):
    from tp_from_scratch.deepseek.model import shard
    ranked = ParallelDeepseekV3(config, group=comm)
    ranked.load_state_dict({n: shard(n, v, config, ranked.layout, comm.world_size, comm.rank) for n, v in state.items()})
    ids, cache = generate(ranked, prompt, 8)
    return ids, cache.nbytes() / (cache.length() * len(cache.layers))

def gpt_cache_on(comm, n_kv_heads):       # Lesson 6's Llama-style GPT of the same width: H = 32, 4 heads
    gpt_config = GPTConfig(arch="llama", hidden=32, n_heads=4, n_kv_heads=n_kv_heads, n_layers=2)
    gpt, cache = TensorParallelGPT(gpt_config, group=comm, dtype=torch.float64), KVCache(2)
    with torch.no_grad():
        gpt(prompt, cache=cache)
    return sum(x.numel() * x.element_size() for x in cache.k + cache.v) / (len(cache) * 2)

print(f"{'t':>2s} {'MLA':>6s} {'MHA (4 KV heads)':>17s} {'GQA (2 KV heads)':>17s}   bytes per token, per layer, "
      "per rank, measured (float64)")
for t in (1, 2, 4):
    out = run_spmd(generate_on, t)
    assert all(torch.equal(ids, out[0][0]) for ids, _ in out)
    assert out[0][1] == cache_bytes_per_token(config, t, 8, "mla")
    mha, gqa = (run_spmd(gpt_cache_on, t, n)[0] for n in (4, 2))
    print(f"{t:2d} {out[0][1]:6.0f} {mha:17.0f} {gqa:17.0f}")
print("tokens:", out[0][0].tolist())"""),
    new_markdown_cell(r"""At DeepSeek-V3's size (bf16, 61 layers) the same formulas give:"""),
    new_code_cell("""v3 = DeepseekV3Config()                             # the defaults are DeepSeek-V3's own sizes
print(f"{'t':>2s} {'MLA':>8s} {'MHA (128 heads)':>16s} {'GQA (8 KV heads)':>17s}   KB per token per rank, 61 layers, bf16")
gqa = DeepseekV3Config(num_key_value_heads=8)
for t in (1, 2, 4, 8):
    mla, mha, g = (61 * cache_bytes_per_token(cfg, t, 2, kind) / 1e3
                   for cfg, kind in ((v3, "mla"), (v3, "mha"), (gqa, "gqa")))
    print(f"{t:2d} {mla:8.1f} {mha:16.1f} {g:17.1f}")"""),
    new_markdown_cell(r"""70 KB per token on every rank — about 1/70 of MHA's at t = 1, but TP does not shrink it at all:
at t = 8 each rank of an MHA server caches 1/8 of its heads, while each MLA rank still caches the
whole latent. That is why servers run MLA **data-parallel** across many ranks (the report's
decoding: attention with TP4 and DP80, §3.4) and keep TP small: TP still splits the attention
*weights* and compute (q_b, kv_b, o), and with a latent that small, replicating the cache over 4
ranks is cheap."""),

    # ------------------------------------------------------------------ why no TP
    new_markdown_cell(r"""## 5. Why DeepSeek-V3 trained without TP

The numbers are Lesson 12's planner's (`tp_from_scratch/deepseek/plan.py`, built on Lesson 9's
cost model and Lesson 2's ring formula); from the repository root:

    .venv/bin/python -m tp_from_scratch.deepseek.plan --tp 8 --ep 64

Its parameter count is exact — the numel of transformers' `DeepseekV3ForCausalLM`
(`tests/test_deepseek_plan.py` checks it on small configs, and per rank against the course's
model) — without the report's multi-token-prediction module (14B more, 685B in all). Per token
and layer, forward, bf16 (b = 2): TP = 8 inside a node makes two ring all-reduces of H = 7168
numbers; EP = 64 spans 8 nodes, and node-limited routing sends a token to at most 4 of them (one
copy per node, forwarded inside the node over NVLink), so what crosses InfiniBand is the
all-to-all between nodes:"""),
    new_code_cell("""v3, b = DeepseekV3Config(), 2                     # DeepSeek-V3's sizes; bf16
print(f"parameters: {parameter_count(v3) / 1e9:.1f}B, {parameter_count(v3, active=True) / 1e9:.1f}B active per token")
for tp, ep in [(8, 8), (1, 64)]:                   # before pipelines (16 stages) and ZeRO-1 divide it further
    print(f"TP={tp}, routed experts over {ep:2d} GPUs: {sum(memory_per_rank(v3, tp, ep, 'mixed').values()) / 2**30:7.0f} GiB per GPU "
          "of weights, gradients and AdamW (mixed precision)")
tp8 = tp_bytes_per_token(v3, 8, b)                  # 2 ring all-reduces of H per layer, all 8 ranks
ep = node_bytes_per_token(v3, nodes=8, per_node=8, max_nodes=4, itemsize=b)   # across InfiniBand
# a GPU's share of the batch is the same either way; under TP each of its tokens is also on 7 other GPUs
print(f"TP = 8 on NVLink (160 GB/s per GPU):  {tp8 / 1e3:6.1f} KB per token per layer, "
      f"{tp8 / 160e9 * 1e9:5.0f} ns of link per GPU per token of its share, on the critical path")
print(f"EP over InfiniBand (50 GB/s per GPU): {ep / 1e3:6.1f} KB per token per layer, "
      f"{ep / 50e9 * 1e9:5.0f} ns of link per GPU per token of its share, overlapped (DualPipe)")
print(f"TP's bytes / EP's: {tp8 / ep:.1f}x; EP=64 balanced over all GPUs, NVLink included: "
      f"{ep_bytes_per_token(v3, 64, b) / 1e3:.1f} KB")"""),
    new_markdown_cell(r"""TP's all-reduces move 4x the bytes of EP's all-to-all, but on a 3.2x faster link, and each
TP GPU carries all 8 of its group's tokens: per GPU, the link time is of the same order. What
decided it is *when* that time is paid (§3.2):
* **TP sits on the critical path**: two all-reduces per layer, forward and backward, that the
  next matmul waits for. The all-to-all of one micro-batch overlaps the compute of another
  (DualPipe), and the report sizes the routing (at most 4 nodes per token) so that it hides fully.
* **TP shrinks every matmul**; EP keeps experts whole. At t = 8 an expert's 2048-wide FFN becomes
  256-wide slivers (ETP); EP gives each GPU 4 whole experts per layer (256 / 64).
* **TP stops at the node**: beyond 8 GPUs its all-reduces would cross InfiniBand, ~3x slower.
* **EP holds less per GPU**: TP = 8 (the experts split 8 ways with it) leaves each GPU 3x the
  weights and optimizer state of EP = 64 (the planner's table above).
* **Memory was made to fit otherwise**: recomputing RMSNorm and the MLA up-projections in
  backward, EMA weights in CPU memory, the embedding and output head shared with the MTP module.

**Why servers still use TP for attention.** Decoding is latency-bound: one token's matmuls are
small and each step waits for them. Splitting attention's heads over 4 GPUs of one node (NVLink)
cuts the weights each must read per step by 4; the latent cache costs little to replicate."""),

    # ------------------------------------------------------------------ equal
    new_markdown_cell(r"""## 6. What "equal" means when routing is discrete

Every check in this course compares a parallel result with one device's under the tolerance
policy: summation order may differ, so results differ by roundoff. But routing is a `top-k`: if
two experts' scores are within roundoff of each other, t = 1 and t = 4 may pick **different
experts**, and the outputs then differ by O(1) — not a bug, a tie. The course guards against it:
* **float64** everywhere the router is checked (roundoff ~1e-16, not bf16's 1e-3);
* a **margin check** before comparing: `routing_margin` is the smallest gap between a chosen and
  a rejected candidate (the k-th and (k+1)-th expert, and the kept and dropped groups);
  `check_routing_margin` refuses data whose margin is under 100 times the policy's tolerance, so
  a difference that remains is a bug. Every test and check of this lesson runs it first.

A tie made on purpose: move a rejected expert's bias onto the k-th chosen one's score."""),
    new_code_cell("""x = random_array(rank_rng(6), (1, TINY.hidden_size))
x = torch.tensor(x)
w, bias = moe.gate.weight.detach(), moe.gate.e_score_correction_bias.clone()
print(f"random data: margin {routing_margin(x, w, bias, TINY):.3g} (accepted: "
      f"{check_routing_margin(routing_margin(x, w, bias, TINY), torch.float64):.3g})")
_, experts = route(x, w, bias, TINY)
scores = torch.sigmoid(x @ w.T)[0] + bias
per_group = TINY.n_routed_experts // TINY.n_group        # a rival in a kept group: a chosen expert's
kept = {e // per_group for e in experts[0].tolist()}
rejected = [e for e in scores.argsort(descending=True).tolist()
            if e not in experts[0].tolist() and e // per_group in kept][0]
kth = min(experts[0].tolist(), key=lambda e: scores[e])
bias[rejected] += scores[kth] - scores[rejected] - 1e-14        # now 1e-14 below the k-th choice
margin = routing_margin(x, w, bias, TINY)
try:
    check_routing_margin(margin, torch.float64)
except ValueError as error:
    print(error)"""),
    new_markdown_cell(r"""## Summary

* All-to-all with uneven counts is the collective of expert parallelism: counts first (an
  all-to-all of integers, the count matrix transposed), then the rows; combine is dispatch run
  backwards, and each is the other's gradient.
* DeepSeekMoE runs on t ranks three ways, each equal to one device with every gradient: EP
  (each token's rows travel to its k experts: k/t of the all-reduce layouts' bytes per token,
  whole experts, own tokens), experts on all tokens, expert TP (one all-reduce each).
* MLA splits its heads like any attention; its latent cache is 70 KB per token at DeepSeek-V3's
  size on **every** rank, whatever t.
* DeepSeek-V3 traded TP's per-layer all-reduces for an all-to-all it could hide.
* Equal, for a discrete router, means equal where the margin says no tie is near.

Train the model yourself with Lesson 6's trainer, save it in one layout, generate from it in
another, and hand it to transformers (docs/running.md has the rest):

```bash
.venv/bin/torchrun --standalone --nproc-per-node 2 -m tp_from_scratch.deepseek.train --tp 2 --layout ep --data text --steps 20 --compare-single --save runs/ds
.venv/bin/torchrun --standalone --nproc-per-node 2 -m tp_from_scratch.deepseek.generate --load runs/ds --layout etp --prompt 72,101,108 --new-tokens 8 --compare-single
.venv/bin/python -m tp_from_scratch.deepseek.convert export runs/ds --out runs/ds-hf
```

Exercise 12 (`exercises/ex12_moe_dispatch.py`): write the EP dispatch and combine on your own
all-to-all.""")
]

write_notebook(cells, HERE.parent / "12_deepseek_v3_moe.ipynb")
