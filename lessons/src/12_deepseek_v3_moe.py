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

Every lesson so far split a dense model with tensor parallelism. DeepSeek-V3, a
mixture-of-experts model, was trained without it. Its technical report (arXiv 2412.19437)
trains the 671B-parameter model (37B active per token, §4.2) on 2048 H800 GPUs — 8 per node
joined by NVLink and NVSwitch, nodes joined by InfiniBand (§3.1) — with **16-way pipeline
parallelism (DualPipe), 64-way expert parallelism spanning 8 nodes and ZeRO-1 data
parallelism, and no tensor parallelism** (§3.2). Its servers then run attention with TP (TP4)
and the experts with EP (EP32 to prefill, EP320 to decode: §3.4). This lesson builds both
halves, then weighs what the report says about the choice and what the course adds to it.

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
* `mla.py` MLA and its latent cache; `single_device.py` the whole model on one device, and
  `model.py` its `parallelize` (the layout's plan applied to it), equal to
  transformers' `DeepseekV3ForCausalLM` (`tests/test_deepseek_model.py`) in two layouts: tensor
  parallel (heads split, the experts in one of section 3's all-reduce layouts: on all tokens, or
  split by width), and expert parallel, as DeepSeek-V3 trained (each rank its own sequences,
  attention whole with its gradients summed as in data parallelism, the experts spread over the
  all-to-all);
* `check.py`: the MoE layer in all three layouts, and the whole model in the two all-reduce
  layouts, against one device (the expert-parallel model is checked in
  `tests/test_deepseek_model.py`), also under
  `.venv/bin/torchrun --standalone --nproc-per-node 4 -m tp_from_scratch.deepseek.check` and, on
  Lesson 2's collectives over MPI, `.venv/bin/mpiexec -n 4 .venv/bin/python -m tp_from_scratch.deepseek.check`;
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
from tp_from_scratch.deepseek.arch import split_axis
from tp_from_scratch.deepseek.check import TINY, check_layout, layout_data, random_moe
from tp_from_scratch.deepseek.mla import cache_bytes_per_token
from tp_from_scratch.deepseek.model import DeepseekV3, generate, parallelize
from tp_from_scratch.deepseek.planner import (attention_parameters, ep_bytes_per_token, memory_per_rank,
                                              node_bytes_per_token, parameter_count, tp_bytes_per_token)
from tp_from_scratch.gpt.model import GPTConfig, KVCache, init_gpt
from tp_from_scratch.gpt.parallelize import gpt_to_tp
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
    new_code_cell("""# (rows, columns) of each weight in the tiny config, and the axis its layout's sharding plan
# splits (deepseek.arch.PLANS; None: replicated)
c = DeepseekV3Config(hidden_size=32, q_lora_rank=16, kv_lora_rank=8, num_attention_heads=4, qk_nope_head_dim=6,
                     qk_rope_head_dim=4, v_head_dim=5, n_routed_experts=8, moe_intermediate_size=12)
qk, heads = c.qk_nope_head_dim + c.qk_rope_head_dim, c.num_attention_heads
TP, EP, ETP = "experts on all tokens", "expert parallel", "expert tensor parallel"
weights = [("q_a", (c.q_lora_rank, c.hidden_size), split_axis("layers.0.self_attn.q_a_proj.weight", TP)),
           ("q_b", (heads * qk, c.q_lora_rank), split_axis("layers.0.self_attn.q_b_proj.weight", TP)),
           ("kv_a", (c.kv_lora_rank + c.qk_rope_head_dim, c.hidden_size),
            split_axis("layers.0.self_attn.kv_a_proj_with_mqa.weight", TP)),
           ("kv_b", (heads * (c.qk_nope_head_dim + c.v_head_dim), c.kv_lora_rank),
            split_axis("layers.0.self_attn.kv_b_proj.weight", TP)),
           ("o", (c.hidden_size, heads * c.v_head_dim), split_axis("layers.0.self_attn.o_proj.weight", TP)),
           ("router", (c.n_routed_experts, c.hidden_size), split_axis("layers.0.mlp.gate.weight", TP)),
           # gate_up_proj (E, 2F, H): the expert axis, or the F columns of each expert
           ("experts (EP)\\nexpert x F", (c.n_routed_experts, c.moe_intermediate_size),
            split_axis("layers.0.mlp.experts.gate_up_proj", EP)),
           ("experts (ETP)\\nexpert x F", (c.n_routed_experts, c.moe_intermediate_size),
            split_axis("layers.0.mlp.experts.gate_up_proj", ETP))]
fig, axes = plt.subplots(2, len(weights), figsize=(15, 4.2))
for col, (name, shape, axis) in enumerate(weights):
    for rank in range(2):
        draw_matrix(axes[rank][col], shape, axis, 2, rank=rank)
        axes[rank][col].set_title(f"{name}" if rank == 0 else "", fontsize=9)
        for label in axes[rank][col].texts:           # draw_matrix writes "dev r": rank r, upright in a narrow block
            label.set_text(label.get_text().replace("dev", "rank"))
            width, height = shape[1] / (2 if axis == 1 else 1), shape[0] / (2 if axis == 0 else 1)
            label.set_rotation(90 if width < height / 1.5 else 0)
for rank in range(2):                                  # the row's rank, left of its first panel (draw_matrix hides axes)
    box = axes[rank][0].get_position()
    fig.text(box.x0, (box.y0 + box.y1) / 2, f"rank {rank} holds", rotation=90, ha="right", va="center", fontsize=10)
plt.show()"""),

    # ------------------------------------------------------------------ all-to-all
    new_markdown_cell(r"""## 2. The router, and the all-to-all it needs

**The router** (`router.py`; the report's eqs. 12-16 in §2.1.2, and the released code). A
token's affinity to routed expert i is $s_i = \sigma(u^\top e_i)$ (u the token, $e_i$ the
expert's centroid). The experts are *chosen* by $s_i + b_i$, with a per-expert bias b that
balances the load (section 3), but *weighted* by $s_i$ alone: "the bias term is only used for
routing" (eq. 16). DeepSeek-V3's released configuration adds three things:
* **Node-limited groups** (`n_group` = 8, `topk_group` = 4). The 256 experts form 8 groups of 32
  — with the experts placed in order over EP = 64 (4 per GPU, 8 GPUs per node), one group is one
  node's experts. Each group is scored by the sum of its 2 highest $s_i + b_i$, the best 4 groups
  are kept, and the token's 8 experts are the top 8 among the kept groups' 128. This is how the
  code implements the report's node-limited routing: "at most M nodes, which are selected
  according to the sum of the highest $K_r/M$ affinity scores of the experts distributed on each
  node" (§2.1.2), with M = 4 and $K_r/M$ = 8/4 = 2 (§4.2).
* **Normalisation** (`norm_topk_prob`): the 8 chosen affinities are divided by their sum, so a
  token's weights sum to one (eq. 13).
* **`routed_scaling_factor` = 2.5**: the normalised weights are multiplied by 2.5 before the
  routed experts' outputs are summed. The factor is in the released `config.json` and in
  transformers' `DeepseekV3TopkRouter`; the report's equations have no such factor.

`route` does all three, and `tests/test_deepseek_moe.py` checks its choices and weights against
transformers' router. **Exercise 12 simplifies**: a plain top-k of $s + b$ over all experts (no
groups) and normalised weights without the 2.5. The all-to-all it exercises is the same: the
groups only change which experts a token picks, and the factor only scales what combine sums.

**The all-to-all.** Expert parallelism gives each of t ranks its own tokens (its data-parallel share) and E/t
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
   *is* combine and vice versa (`deepseek.autograd.AllToAll`).

Bytes rank q sends in one forward: in dispatch the rows of its own off-rank pairs,
$\sum_{d \ne q} c_{q,d}$; in combine the outputs it computed for the other ranks' pairs,
$\sum_{s \ne q} c_{s,q}$ — a different number unless routing is balanced (below, rank 1
dispatches 7 rows and returns 27). In all $\big(\sum_{d \ne q} c_{q,d} + \sum_{s \ne q} c_{s,q}\big)\,H\,b$,
plus $(t-1)\,E/t \times 8$ for the counts (`ep_bytes_sent`). Summed over the ranks, both sums
count every off-rank pair once, so the whole job sends $2\,(\text{off-rank pairs})\,H\,b$;
under balanced routing each token of the batch costs $2k\frac{t-1}{t}Hb$ on the wire."""),
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
    for (i, j), v in np.ndenumerate(m):                 # column j: the other rank, in its colour
        ax.add_patch(plt.Rectangle((j - 0.5, i - 0.5), 1, 1, facecolor=device_color(j), alpha=0.35, edgecolor="white", lw=2))
        ax.text(j, i, v, ha="center", va="center", fontsize=11)
    ax.set_xlim(-0.5, t - 0.5); ax.set_ylim(t - 0.5, -0.5); ax.set_xticks(range(t)); ax.set_yticks(range(t))
    ax.set_title(title, fontsize=10); ax.set_xlabel("to rank" if m is counts else "from rank"); ax.set_ylabel("rank")
plt.show()
off_rank = counts - np.diag(np.diag(counts))
print("tokens per rank:", [len(x) for x in xs], "; pairs each rank's experts receive:", counts.sum(0).tolist())
print("rows each rank sends: in dispatch", off_rank.sum(1).tolist(), "(its own off-rank pairs), in combine",
      off_rank.sum(0).tolist(), "(the outputs it computed for other ranks)")"""),

    # ------------------------------------------------------------------ layouts
    new_markdown_cell(r"""## 3. Three ways to run the layer on t ranks

| layout | tokens on a rank | experts on a rank | forward collectives | wire bytes per token of the batch |
|---|---|---|---|---|
| (a) expert parallel (DeepSeek-V3's) | its own | E/t whole | counts + 2 all-to-all | $2k\frac{t-1}{t}Hb$ (balanced) |
| (b) experts on all tokens | all | E/t whole | 1 all-reduce | $t \cdot 2\frac{t-1}{t}Hb = 2(t-1)Hb$ |
| (c) expert tensor parallel (Megatron's ETP) | all | F/t of every expert | 1 all-reduce | $2(t-1)Hb$ |

In (b) and (c) every rank holds every token, so each of the t ranks sends a ring all-reduce's
$2\frac{t-1}{t}Hb$ for it; in (a) a token lives on one rank and travels only to its k experts.
EP is cheaper per token of the batch when k < t (DeepSeek-V3: k = 8, EP = 64). DeepSeek-V3
runs its experts with (a) both in training (EP64, §3.2) and in serving (EP32 and EP320, with
all-to-all dispatch and combine, §3.4); (b) and (c) are what a TP group does when every rank
holds every token, the course's tensor-parallel model among them.

Each runs below at t = 4 and is checked against one device — output, input gradient and
every weight's gradient, float64, through `assert_matches_reference` (`check.check_layout`).
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
model = DeepseekV3(config)                       # one device: the reference
with torch.no_grad():
    for p in model.parameters():
        p.copy_(0.2 * torch.randn(p.shape, generator=torch.Generator().manual_seed(p.numel())))
state = model.state_dict()
prompt = torch.tensor(rank_rng(5).integers(0, 67, size=(1, 4)))

def generate_on(comm):
    ranked = DeepseekV3(config)
    ranked.load_state_dict(state)
    parallelize(ranked, comm)             # the layout's plan (deepseek.arch.PLANS) cuts every weight
    ids, cache = generate(ranked, prompt, 8)
    return ids, cache.nbytes() / (cache.length() * len(cache.layers))

def gpt_cache_on(comm, n_kv_heads):       # Lesson 6's Llama-style GPT of the same width: H = 32, 4 heads
    gpt_config = GPTConfig(arch="llama", hidden=32, n_heads=4, n_kv_heads=n_kv_heads, n_layers=2)
    gpt, cache = gpt_to_tp(comm, init_gpt(gpt_config, 0, torch.float64)), KVCache(2)
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
whole latent. DeepSeek-V3's servers run attention with a small TP and many data-parallel groups
(TP4 with DP8 to prefill, TP4 with DP80 to decode, §3.4), and the one reason the report gives for
the small TP is that "its small TP size of 4 limits the overhead of TP communication" (§3.4.1).
The table adds the course's own reading: a larger TP would still split the attention *weights*
and compute (q_b, kv_b, o), but every rank would keep the whole latent cache, while data
parallelism splits the sequences, and with them the cache."""),

    # ------------------------------------------------------------------ why no TP
    new_markdown_cell(r"""## 5. Why DeepSeek-V3 trained without TP

The numbers are Lesson 12's planner's (`tp_from_scratch/deepseek/planner.py`, built on Lesson 9's
cost model and Lesson 2's ring formula); from the repository root:

    .venv/bin/python -m tp_from_scratch.deepseek.planner --tp 8 --ep 64

Its parameter count is exact — the numel of transformers' `DeepseekV3ForCausalLM`
(`tests/test_deepseek_plan.py` checks it on small configs, and per rank against the course's
model) — without the multi-token-prediction module that DeepSeek-V3 trains with (§2.2, depth
D = 1, §4.2) and its released files add: 14B more, 685B in all, by the repository's README, or
11.5B unique parameters by its `README_WEIGHTS.md`, the module sharing the embedding and output
head with the main model. Per token and layer, forward, bf16 (b = 2): TP = 8 inside a node makes
two ring all-reduces of H = 7168 numbers; EP = 64 spans 8 nodes, and node-limited routing sends a
token to at most 4 of them (one copy per node, forwarded inside the node over NVLink, §3.2.2), so
what crosses InfiniBand is the all-to-all between nodes:"""),
    new_code_cell("""v3, b = DeepseekV3Config(), 2                     # DeepSeek-V3's sizes; bf16
print(f"parameters: {parameter_count(v3) / 1e9:.1f}B, {parameter_count(v3, active=True) / 1e9:.1f}B active per token")
print("GiB per GPU of weights, gradients and AdamW (Lesson 9's mixed precision, 16 B per parameter):")
for tp, ep in [(8, 8), (1, 64), (8, 64)]:          # before pipelines (16 stages) and ZeRO-1 divide it further
    print(f"  TP={tp}, routed experts over {ep:2d} GPUs: {sum(memory_per_rank(v3, tp, ep, 'mixed').values()) / 2**30:5.0f}")
tp8 = tp_bytes_per_token(v3, 8, b)                  # 2 ring all-reduces of H per layer, all 8 ranks
ep = node_bytes_per_token(v3, nodes=8, per_node=8, max_nodes=4, itemsize=b)   # across InfiniBand
# a GPU's share of the batch is the same either way; under TP each of its tokens is also on 7 other GPUs
print(f"TP = 8 on NVLink (160 GB/s per GPU):  {tp8 / 1e3:6.1f} KB per token per layer, "
      f"{tp8 / 160e9 * 1e9:5.0f} ns of link per GPU per token of its share, between a layer's matmuls")
print(f"EP over InfiniBand (50 GB/s per GPU): {ep / 1e3:6.1f} KB per token per layer, "
      f"{ep / 50e9 * 1e9:5.0f} ns of link per GPU per token of its share, overlapped (DualPipe)")
print(f"TP's bytes / EP's: {tp8 / ep:.1f}x; EP=64 balanced over all GPUs, NVLink included: "
      f"{ep_bytes_per_token(v3, 64, b) / 1e3:.1f} KB")
# as DeepSeek-V3 sends them (§3.3.3): dispatch in FP8 (1 byte), combine in BF16; both move the same rows
ep_fp8 = (node_bytes_per_token(v3, nodes=8, per_node=8, max_nodes=4, itemsize=1) + ep) / 2
print(f"EP with an FP8 dispatch and a BF16 combine: {ep_fp8 / 1e3:.1f} KB per token per layer (and FP8 scales); "
      f"TP's bytes / EP's: {tp8 / ep_fp8:.1f}x")"""),
    new_markdown_cell(r"""**37B, 37.6B, 36.7B.** The report rounds the active parameters to 37B (§4.2). The 37.6B above
is the exact numel of what one token uses, 37,552,282,624: every parameter outside the routed
experts, and 8 of the 256 routed experts in each of the 58 MoE layers, the embedding (0.93B) and
the output head (0.93B) included. DeepSeek's `README_WEIGHTS.md` gives "36.7B (including 0.9B for
Embedding and 0.9B for the output Head)" without its breakdown; the course could not reproduce
that figure and keeps its own count.

In bf16, TP's all-reduces move 4x the bytes that EP's all-to-all sends across InfiniBand — 5.3x
as DeepSeek-V3 sends them, with the dispatch in FP8 (§3.3.3) — but on a 3.2x faster link
(§3.2.2), and each TP GPU carries all 8 of its group's tokens: per GPU, the link times are of the
same order. The report's own reasons are brief: it "meticulously" optimised the memory footprint,
"thereby enabling us to train DeepSeek-V3 without using costly Tensor Parallelism" (§3.2), and it
built DualPipe because cross-node expert parallelism left
"an inefficient computation-to-communication ratio of approximately 1:1" (§3.2.1). The rest is
the course's own reading:
* **Where the communication can hide.** TP's all-reduces sit between a layer's matmuls, and
  Lesson 10 hides them only against that layer's own matmuls (the backward's behind dW, the
  forward's in a collective matmul). DualPipe overlaps one micro-batch's all-to-all with another
  micro-batch's whole compute, so that "both all-to-all and PP communication can be fully hidden"
  (§3.2.1), and with at most 4 nodes per token "our MoE training framework can nearly achieve
  full computation-communication overlap" (§2.1.2).
* **TP shrinks every matmul**; EP keeps experts whole. At t = 8 an expert's 2048-wide FFN becomes
  256-wide slivers (ETP); EP gives each GPU 4 whole experts per layer (256 / 64).
* **TP stops at the node**: beyond 8 GPUs its all-reduces would cross InfiniBand, ~3x slower
  (160 against 50 GB/s, §3.2.2).
* **Memory: EP already does most of what TP would.** The routed experts are 97 % of the
  parameters: TP = 8 with the experts split 8 ways leaves a GPU 1287 GiB, EP = 64 without TP
  407 GiB (the first two rows), so what lowers memory is spreading the experts. TP = 8 on top
  of EP = 64 would halve it again (222 GiB, the third row): TP would still save memory, and the
  report made it fit without TP (§3.2.3): RMSNorm and the MLA up-projections recomputed in
  backward, EMA weights in CPU memory, the embedding and output head
  shared with the MTP module — and AdamW's moments kept in BF16 (§3.3.3), where the 16 B per
  parameter above is Lesson 9's budget, not DeepSeek's. Pipelines (16 stages) and ZeRO-1 divide
  it further.

**Why servers still use TP for attention.** The report's one reason, quoted in this lesson's
section 4: TP4 "limits the overhead of TP communication" (§3.4.1). The course's reading: decoding is latency-bound — one
token's matmuls are small and each step waits for them — so splitting attention's heads over 4
GPUs of one node (NVLink) cuts the weights each GPU reads per step: by 3.2x for MLA, not 4, since
the down-projections `q_a` and `kv_a` are replicated (below); the latent cache costs little to
replicate."""),
    new_code_cell("""mla = {t: attention_parameters(v3, t) for t in (1, 4)}   # one layer's MLA, on one rank of t
print(f"MLA parameters per layer and rank: {mla[1]:,} at t = 1, {mla[4]:,} at t = 4: {mla[1] / mla[4]:.1f}x fewer "
      f"(q_a and kv_a, {v3.hidden_size * (v3.q_lora_rank + v3.kv_lora_rank + v3.qk_rope_head_dim):,}, on every rank)")"""),

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
  a difference that remains is a bug. The layer's checks (`check.check_layout`, section 3) and
  the test suites (`tests/test_deepseek_moe.py`, and `tests/test_deepseek_model.py` at every MoE
  layer's input) run it first. The whole-model checks of `check.py` (`check_model`) and the
  trainer's and generator's `--compare-single` do not: they rely on float64 and random data,
  where a near-tie is improbable, but one would show there as a mismatch, not as a refusal.

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
* DeepSeek-V3 trained without TP: it made the memory fit otherwise and hid EP's all-to-all
  behind compute (§3.2); its servers use a small TP for attention and EP for the experts (§3.4).
* Equal, for a discrete router, means equal where the margin says no tie is near.

Train the model yourself with Lesson 6's trainer, save it in one layout, generate from it in
another, and hand it to transformers (docs/running.md has the rest):

```bash
.venv/bin/torchrun --standalone --nproc-per-node 2 -m tp_from_scratch.deepseek.train --tp 2 --layout ep --data text --steps 20 --compare-single --save runs/ds
.venv/bin/torchrun --standalone --nproc-per-node 2 -m tp_from_scratch.deepseek.generate --load runs/ds --layout etp --prompt 72,101,108 --new-tokens 8 --compare-single
.venv/bin/python -m tp_from_scratch.deepseek.convert export runs/ds --out runs/ds-hf
```

Exercise 12 (`exercises/ex12_moe_dispatch.py`): write the EP dispatch and combine on your own
all-to-all, with section 2's router simplified (no groups, no `routed_scaling_factor`).""")
]

write_notebook(cells, HERE.parent / "12_deepseek_v3_moe.ipynb")
