"""When does tensor parallelism pay? A cost model of one training step, in formulas you can check.

    # GPT-2 8.3B as in Megatron-LM (2019), Table 1, on one 8-GPU NVLink node
    .venv/bin/python -m tp_from_scratch.gpt.plan --arch gpt2 --hidden 3072 --heads 32 --layers 72 \\
        --vocab-size 51200 --seq-len 1024 --tp 8 --profile h100-nvlink
    # the run the trainer would make with the same flags, on this machine's measured profile
    .venv/bin/python -m tp_from_scratch.gpt.plan --tp 2 --profile runs/profile.json
    # measure this machine: matmul FLOP/s per process, seconds per element of each element-wise
    # op, the per-step overhead, alpha and beta of gloo's all-reduce
    .venv/bin/python -m tp_from_scratch.gpt.plan --calibrate            # writes runs/profile.json

The model flags are the trainer's (tp_from_scratch.gpt.train), so you plan the run you launch.
What it prints, for a model of V vocab, T positions, L layers, H hidden, nh / nkv heads of
size hs, F ffn, with t TP ranks, B sequences per DP rank:

* parameters, exactly, per architecture: ``gpt`` (this course's tp_from_scratch.gpt.model.GPT:
  no key bias, learned positions, LayerNorm with bias, tied unless --untied), ``gpt2`` (the
  same plus a key bias, multi-head, tied) and ``llama`` (RMSNorm, SwiGLU, no biases, rotary
  instead of learned positions, untied, grouped-query attention);
* memory per rank for each t: weights, gradients, AdamW state and activations;
* the collectives our trainer makes per step, with the bytes each one sends per rank;
* FLOPs per step (backward = 2x forward, so a step is 3x forward) and a predicted step time
  FLOPs / (matmul FLOP/s) + sum over element-wise ops of (elements * seconds per element)
  + sum over collectives of (messages * alpha + bytes * beta)
  + a measured per-step overhead (fixed + per layer: Python, autograd, the optimizer's loop);
* the TP degree at which one layer's communication takes longer than its compute.

The predicted time assumes no overlap of compute and communication: our trainer has none.
"""
import argparse
import json
import sys
from dataclasses import dataclass
from pathlib import Path

from tp_from_scratch.sharding import shard_sizes

ARCHS = ("gpt", "gpt2", "llama")

# Link and chip presets: vendor-spec numbers (peak, not sustained), labelled as such.
# alpha (latency per message) is not a vendor number: it is an assumption, said so.
# The element-wise ops run at the memory's bandwidth (H100 SXM HBM3: 3.35 TB/s, vendor spec) on
# 16-bit activations; they are unfused as in our code (a fused kernel moves fewer bytes).
HBM3 = {"memory_bytes_per_s": 3.35e12, "elementwise_itemsize": 2}
PRESETS = {
    "h100-nvlink": {
        "source": "vendor spec: H100 SXM dense BF16 989 TFLOP/s; NVLink 4 900 GB/s bidirectional "
                  "aggregate per GPU, taken as 450 GB/s per direction; alpha 5 us assumed",
        "matmul_flops": {"1": 989e12}, **HBM3,
        "all_reduce": {"native": {"alpha_s": 5e-6, "beta_s_per_byte": 1 / 450e9}}},
    "h100-infiniband": {
        "source": "vendor spec: H100 SXM dense BF16 989 TFLOP/s; InfiniBand NDR 400 Gb/s = 50 GB/s "
                  "per direction per GPU (one NIC each); alpha 10 us assumed",
        "matmul_flops": {"1": 989e12}, **HBM3,
        "all_reduce": {"native": {"alpha_s": 10e-6, "beta_s_per_byte": 1 / 50e9}}},
}


# ---------------------------------------------------------------------------------------
# Parameters: every tensor of the model, with the axis TP splits
# ---------------------------------------------------------------------------------------

@dataclass(frozen=True)
class Tensor:
    """A parameter of shape (rows, cols), ``copies`` of it (one per layer for block parameters).

    split: True when TP cuts ``rows`` over the ranks (column weights by output, row weights by
    input, embeddings by vocabulary); False when every rank holds all of it (norms, row biases).
    matmul: True when the forward multiplies every token by it (2 FLOPs per element per token).
    pieces: the most pieces ``rows`` may be cut into (0: no limit). k and v have one piece per
    KV head: with t > nkv ranks, each KV head is held whole by t / nkv neighbouring ranks.
    """
    name: str
    rows: int
    cols: int = 1
    split: bool = False
    copies: int = 1
    matmul: bool = False
    pieces: int = 0

    def replicas(self, t):
        """How many ranks hold the same piece: t / pieces when t exceeds ``pieces``, else 1."""
        return max(1, t // self.pieces) if self.split and self.pieces else 1

    def count(self, t=1, rank=0):
        """Elements on TP rank ``rank`` of ``t`` (uneven splits like numpy.array_split)."""
        r = self.replicas(t)
        rows = shard_sizes(self.rows, t // r)[rank // r] if self.split else self.rows
        return self.copies * rows * self.cols


# What each architecture is made of. A GPTConfig that carries these fields itself (the model's
# ``arch`` presets) is read directly; an older one gets them from here.
ARCH_FIELDS = {
    "gpt": dict(norm="layernorm", position="learned", mlp="gelu", bias=True, key_bias=False,
                tie_embeddings=True),
    "gpt2": dict(norm="layernorm", position="learned", mlp="gelu", bias=True, key_bias=True,
                 tie_embeddings=True),
    "llama": dict(norm="rmsnorm", position="rope", mlp="swiglu", bias=False, key_bias=False,
                  tie_embeddings=False),
}


def architecture(config, arch=None):
    """{norm, position, mlp, bias, key_bias, tie_embeddings} of ``config`` built as ``arch``.

    arch None: the config's own (``config.arch``, "gpt" for a config without one). The
    course's "gpt" follows the config's tie_embeddings; "gpt2" and "llama" are as published
    unless the config is itself of that arch and says otherwise.
    """
    own = getattr(config, "arch", "gpt")
    arch = arch or own
    if arch not in ARCH_FIELDS:
        raise ValueError(f"arch {arch!r} is not one of {ARCHS}")
    fields = dict(ARCH_FIELDS[arch])
    if arch == own:
        fields.update({k: getattr(config, k) for k in fields if getattr(config, k, None) is not None})
    return fields


def parameters(config, arch=None):
    """Every parameter of the model described by ``config`` (a GPTConfig), as Tensors.

    Names as in tp_from_scratch.gpt.model (``attn.q.weight``, ``mlp.fc.weight``, ...).
    """
    a = architecture(config, arch)
    V, T, L, H, F = config.vocab_size, config.seq_len, config.n_layers, config.hidden, config.ffn
    q, kv, nkv = config.n_heads * config.head_size, config.n_kv_heads * config.head_size, config.n_kv_heads

    def norm(name, copies=1):  # LayerNorm: weight and bias; RMSNorm: weight only
        out = [Tensor(f"{name}.weight", H, copies=copies)]
        return out + [Tensor(f"{name}.bias", H, copies=copies)] if a["norm"] == "layernorm" else out

    def column(name, rows, pieces=0, bias=a["bias"]):  # W[out_t, in], its bias split alike
        out = [Tensor(f"{name}.weight", rows, H, True, L, True, pieces)]
        return out + [Tensor(f"{name}.bias", rows, 1, True, L, pieces=pieces)] if bias else out

    def row(name, rows):  # W[out, in_t]: the rows here are its input features; bias whole
        out = [Tensor(f"{name}.weight", rows, H, True, L, True)]
        return out + [Tensor(f"{name}.bias", H, copies=L)] if a["bias"] else out

    attention = (column("attn.q", q) + column("attn.k", kv, nkv, a["bias"] and a["key_bias"])
                 + column("attn.v", kv, nkv) + row("attn.o", q))
    if a["mlp"] == "swiglu":
        mlp = column("mlp.gate", F) + column("mlp.up", F) + row("mlp.down", F)
    else:
        mlp = column("mlp.fc", F) + row("mlp.proj", F)
    return [Tensor("wte.weight", V, H, split=True),
            *([Tensor("wpe.weight", T, H)] if a["position"] == "learned" else []),
            *norm("ln1", L), *attention, *norm("ln2", L), *mlp, *norm("ln_f"),
            *([] if a["tie_embeddings"] else [Tensor("lm_head.weight", V, H, True, 1, True)])]


def parameter_count(config, arch=None, t=1, rank=0):
    """Exact number of parameters: of the whole model (t=1), or held by TP rank ``rank`` of ``t``."""
    return sum(p.count(t, rank) for p in parameters(config, arch))


def rounded(n):
    """1,213,479,936 -> '1.2B' as Megatron-LM's Table 1 writes it; millions as '124M'."""
    if n >= 1e9:
        return f"{n / 1e9:.1f}B"
    if n >= 1e6:
        return f"{n / 1e6:.0f}M"
    return f"{n / 1e3:.0f}K" if n >= 1e3 else str(n)


# ---------------------------------------------------------------------------------------
# Memory per rank
# ---------------------------------------------------------------------------------------

# bytes per parameter: (weights, gradients, optimizer state)
PRECISIONS = {
    "fp32": (4, 4, 8),     # fp32 weights and grads; AdamW m and v in fp32
    "mixed": (2, 2, 12),   # bf16 weights and grads; fp32 master weights, m and v (ZeRO paper's 16 bytes)
}


def activation_bytes(config, batch, t, sequence_parallel=False, selective=False):
    """Activations kept for backward, per rank, all layers: Korthikanti et al. 2022 (formula).

    Per layer, s = T, b = B, h = H, a = nh, with 16-bit activations and 1-byte dropout masks:
        TP                      sbh (10 + 24/t + 5as/(ht))     (their Eq. 2)
        TP + sequence parallel  sbh/t (34 + 5as/h)             (Eq. 4)
        ... + selective recompute of attention: drop the 5as/h terms (Table 2)
    The formula assumes F = 4H and dropout; it is the paper's, not a count of our model.
    """
    s, b, h, a = config.seq_len, batch, config.hidden, config.n_heads
    attention = 0 if selective else 5 * a * s / h
    if sequence_parallel:
        per_layer = s * b * h / t * (34 + attention)
    else:
        per_layer = s * b * h * (10 + 24 / t + attention / t)
    return config.n_layers * per_layer


def memory_per_rank(config, arch, t, batch, precision="fp32", sequence_parallel=False, selective=False):
    """{"weights", "gradients", "optimizer", "activations"} in bytes on TP rank 0 (the largest)."""
    n = parameter_count(config, arch, t, 0)
    w, g, o = PRECISIONS[precision]
    return {"weights": n * w, "gradients": n * g, "optimizer": n * o,
            "activations": activation_bytes(config, batch, t, sequence_parallel, selective)}


# ---------------------------------------------------------------------------------------
# Communication: the collectives our trainer calls in one step
# ---------------------------------------------------------------------------------------

@dataclass(frozen=True)
class Call:
    """``calls`` all-reduces of ``elements`` numbers each over ``group`` ("tp" or "dp")."""
    where: str
    group: str
    calls: int
    elements: int
    collective: str = "all_reduce"


def collective_calls(config, t, batch, dp=1, arch=None, tp_rank=0):
    """The collectives one step of tp_from_scratch.gpt.train makes on one rank.

    ``batch`` is the global batch (the trainer splits it over dp); N = B/dp * T tokens.
    Per step, whatever t is (at t = 1 they are still called, and send nothing):
      forward: g of the vocab-parallel embedding; g after attention's o and after the MLP's
               proj in each block; cross-entropy's three all-reduces of N numbers (max,
               target logit, sum of exponentials);
      backward: f before q/k/v and f inside fc in each block; f before the LM head.
    With t > nkv, each KV head lives on t/nkv ranks, and backward sums the gradient of each of
    its weights (k.weight, v.weight, v.bias) over them: one all-reduce per weight and layer of
    a buffer with a slot per KV head, nkv times the local weight (nn.mappings.sum_over_replicas).
    With dp > 1: one all-reduce of every local gradient (flattened), and one of the loss.
    """
    L, H = config.n_layers, config.hidden
    tokens = batch // dp * config.seq_len
    calls = [Call("embedding g (forward)", "tp", 1, tokens * H),
             Call("attention o: g (forward)", "tp", L, tokens * H),
             Call("mlp proj: g (forward)", "tp", L, tokens * H),
             Call("cross-entropy max, target, sum-exp (forward)", "tp", 3, tokens),
             Call("LM head f (backward)", "tp", 1, tokens * H),
             Call("q, k, v f (backward)", "tp", L, tokens * H),
             Call("mlp fc f (backward)", "tp", L, tokens * H)]
    for p in parameters(config, arch):
        if p.replicas(t) > 1:  # a slot for every distinct piece: t / replicas x the local piece
            calls.append(Call(f"{p.name} grad over KV replicas (backward)", "tp", p.copies,
                              t // p.replicas(t) * p.count(t, tp_rank) // p.copies))
    if dp > 1:
        calls += [Call("gradient average", "dp", 1, parameter_count(config, arch, t, tp_rank)),
                  Call("loss average", "dp", 1, 1)]
    return calls


def ring_all_reduce_bytes(elements, itemsize, world_size, rank):
    """Bytes rank ``rank`` sends in tp_from_scratch.collectives.all_reduce (ring RS + ring AG).

    The N elements are cut like numpy.array_split into p chunks; rank r sends every chunk
    but its own in the reduce-scatter and every chunk but chunk r+1 in the all-gather:
    2N - chunk_r - chunk_{r+1}, which is 2 (p-1)/p N when p divides N.
    """
    chunks = shard_sizes(elements, world_size)
    return itemsize * (2 * elements - chunks[rank] - chunks[(rank + 1) % world_size])


def ring_messages(world_size):
    """Messages each rank sends in a ring all-reduce: p-1 in each half."""
    return 2 * (world_size - 1)


def traffic(config, t, batch, dp=1, itemsize=4, arch=None, tp_rank=0, dp_rank=0):
    """Per call site, per step on one rank: calls, payload bytes and ring bytes sent.

    payload: what the rank hands to the collective (N * itemsize per call), which the
             trainer's CollectiveCounter adds up for torch.distributed's collectives;
    ring:    what the from-scratch ring all-reduce sends (the Comm's Meter counts it).
    """
    rows = []
    for c in collective_calls(config, t, batch, dp, arch, tp_rank):
        p, r = (t, tp_rank) if c.group == "tp" else (dp, dp_rank)
        rows.append({"where": c.where, "collective": c.collective, "group": c.group, "calls": c.calls,
                     "elements": c.elements, "payload_bytes": c.calls * c.elements * itemsize,
                     "ring_bytes": c.calls * ring_all_reduce_bytes(c.elements, itemsize, p, r),
                     "ring_messages": c.calls * ring_messages(p)})
    return rows


# ---------------------------------------------------------------------------------------
# FLOPs and time
# ---------------------------------------------------------------------------------------

def forward_flops(config, arch, batch, t=1, rank=0):
    """Forward FLOPs of one TP rank for ``batch`` sequences: 2 per multiply-add.

    Matmuls: 2 * tokens * (elements of every weight the tokens multiply), the LM head
    included (the tied embedding is a matmul there). Attention: q k^T and att @ v,
    2 * 2 * B * T^2 * hs per query head, over the full T x T square as our code computes it.
    """
    tokens = batch * config.seq_len
    weights = sum(p.count(t, rank) for p in parameters(config, arch) if p.matmul)
    if architecture(config, arch)["tie_embeddings"]:
        weights += shard_sizes(config.vocab_size, t)[rank] * config.hidden
    heads = config.n_heads // t
    attention = 4 * batch * config.seq_len ** 2 * config.head_size * heads * config.n_layers
    return 2 * tokens * weights + attention


def step_flops(config, arch, batch, t=1, rank=0):
    """Forward + backward = 3 x forward (backward computes both dX and dW, 2 matmuls per matmul)."""
    return 3 * forward_flops(config, arch, batch, t, rank)


# ---------------------------------------------------------------------------------------
# Element-wise work: what a FLOP count misses
# ---------------------------------------------------------------------------------------

# Reads + writes per element of each element-wise op, forward and backward together, unfused as
# our code runs them (each op reads its inputs from memory and writes its output): what a GPU
# profile's memory bandwidth turns into time. On this machine --calibrate times them instead.
ELEMENTWISE_PASSES = {
    "layernorm": 5,      # fwd: read x, write y; bwd: read x and dy, write dx
    "rmsnorm": 5,
    "gelu": 5,           # fwd: read x, write y; bwd: read x and dy, write dx
    "swiglu": 8,         # per element of gate: fwd read gate, up, write h; bwd read gate, up, dh, write both
    "rope": 10,          # x cos + rotate_half(x) sin: a concatenation, two products and a sum, and back
    "softmax": 13,       # scale, mask, softmax: 2 passes each forward, 3 + 2 + 2 backward
    "copy": 4,           # a strided copy (heads merged, KV heads repeated): read, write; back again
    "add": 6,            # the residual add (read 2, write 1) and its gradients summed in backward
    "bias_grad": 1,      # a bias's gradient: the output gradient summed over the tokens
    "cross_entropy": 5,  # max and log-sum-exp over the logits, then the gradient written
    "adamw": 7,          # read weight, grad, m, v; write weight, m, v (fp32, per parameter)
}


def elementwise_elements(config, arch, batch, t=1, rank=0):
    """{op: elements it goes over in one step (forward + backward) on TP rank ``rank``}.

    N = batch * T tokens, L layers. Replicated, the same on every TP rank whatever t is:
    the norms (2 per block and the final one, on (N, H)) and the residual adds (2 per block
    and the position add; with t > 1 also the row layers' biases, added after the all-reduce),
    and the gradient of those row biases (a sum over the N tokens of an (N, H) gradient).
    TP does not split this work: it is the serial part of Amdahl's law, and what sequence
    parallelism splits. Divided by t: the MLP's activation on (N, F/t), the scale, mask and
    softmax of the (B, nh/t, T, T) scores, attention's four strided copies per block on
    (N, nh/t * hs) (k and v repeated for their query heads, q's transposed view made
    contiguous for q k^T, the heads merged), the rotary embedding of q and k, the
    cross-entropy on (N, V/t) logits, the column biases' gradients, and AdamW on the parameters
    the rank holds.
    """
    a = architecture(config, arch)
    L, T, H = config.n_layers, config.seq_len, config.hidden
    N, hs = batch * T, config.head_size
    heads = shard_sizes(config.n_heads, t)[rank]
    out = {a["norm"]: (2 * L + 1) * N * H,
           "add": (2 * L + 1 + (2 * L if a["bias"] and t > 1 else 0)) * N * H,
           ("swiglu" if a["mlp"] == "swiglu" else "gelu"): L * N * shard_sizes(config.ffn, t)[rank],
           "softmax": L * batch * heads * T * T,
           "copy": 4 * L * N * heads * hs,
           "cross_entropy": N * shard_sizes(config.vocab_size, t)[rank],
           "bias_grad": N * sum(p.count(t, rank) for p in parameters(config, arch)
                                if p.name.endswith(".bias") and p.name.startswith(("attn.", "mlp."))),
           "adamw": parameter_count(config, arch, t, rank)}
    if a["position"] == "rope":
        out["rope"] = L * N * (heads + max(1, config.n_kv_heads // t)) * hs
    return out


def elementwise_seconds(config, profile, t, batch, arch=None, threads=1):
    """Seconds of one step's element-wise work on TP rank 0: elements x the profile's seconds per
    element of each op (--calibrate), or x passes x bytes / memory bandwidth (a GPU preset);
    0 for a profile that has neither."""
    elements = elementwise_elements(config, arch, batch, t, 0)
    measured = profile.get("elementwise_s_per_element", {}).get(str(threads))
    if measured:
        return sum(n * measured[op] for op, n in elements.items())
    if "memory_bytes_per_s" in profile:  # AdamW's state is fp32 whatever the activations are
        return sum(n * ELEMENTWISE_PASSES[op] * (4 if op == "adamw" else profile["elementwise_itemsize"])
                   for op, n in elements.items()) / profile["memory_bytes_per_s"]
    return 0.0


def load_profile(name_or_path):
    """A preset name (PRESETS) or the path of a JSON profile written by ``--calibrate``."""
    if name_or_path in PRESETS:
        return dict(PRESETS[name_or_path], name=name_or_path)
    profile = json.loads(Path(name_or_path).read_text())
    return dict(profile, name=str(name_or_path))


def all_reduce_seconds(profile, collectives, nbytes, world_size):
    """alpha-beta time of one ring all-reduce: 2(p-1) messages, 2(p-1)/p of the bytes each way."""
    if world_size == 1:
        return 0.0
    # measured at this world size when --calibrate ran it (4 processes on 2 cores share them),
    # else the 2-process fit (or a preset's link)
    measured_here = profile.get("all_reduce_by_world_size", {}).get(str(world_size), {})
    link = measured_here.get(collectives) or profile["all_reduce"][collectives]
    sent = 2 * (world_size - 1) / world_size * nbytes
    return ring_messages(world_size) * link["alpha_s"] + sent * link["beta_s_per_byte"]


def predict_step(config, profile, t, batch, dp=1, itemsize=4, arch=None, threads=1,
                 collectives="native"):
    """{"compute_s", "communication_s", "step_s"} predicted for one training step.

    compute: this rank's FLOPs / the profile's matmul FLOP/s for ``threads`` BLAS threads (with
    t * dp > 1 processes, the rate of one process while the others multiply too, when the profile
    has it), stretched by processes / cores when more processes than cores share the machine.
    elementwise: the norms, activations, softmax, adds, copies, loss and AdamW
    (elementwise_seconds), stretched alike.
    communication: every all-reduce of the step, alpha-beta, not overlapped with compute.
    overhead: the interpreter's and autograd's time per step (step_overhead), stretched alike.
    """
    flops = step_flops(config, arch, batch // dp, t, 0)
    rate = profile["matmul_flops"][str(threads)]
    together = profile.get("matmul_flops_concurrent", {}).get(str(threads))
    if together and t * dp > 1:  # several processes multiply at once: each at the concurrent rate
        rate = together
    busy = t * dp * threads / profile.get("cores", t * dp * threads)
    compute = flops / rate * max(1.0, busy)
    elementwise = elementwise_seconds(config, profile, t, batch // dp, arch, threads) * max(1.0, busy)
    comm = 0.0
    for c in collective_calls(config, t, batch, dp, arch):
        p = t if c.group == "tp" else dp
        comm += c.calls * all_reduce_seconds(profile, collectives, c.elements * itemsize, p)
    # what a step costs beyond its FLOPs and bytes: the interpreter, autograd's bookkeeping and
    # the optimizer's loop over parameters, measured by --calibrate on a model too small to compute
    cost = profile.get("step_overhead")
    overhead = (cost["fixed_s"] + cost["per_layer_s"] * config.n_layers) * max(1.0, busy) if cost else 0.0
    return {"flops": flops, "compute_s": compute, "elementwise_s": elementwise, "communication_s": comm,
            "overhead_s": overhead, "step_s": compute + elementwise + comm + overhead}


def valid_tp_degrees(config, arch=None, largest=64):
    """The t in 1..largest that split heads, hidden and ffn evenly, and KV heads evenly or into
    whole replicated heads (t a multiple of nkv); the vocabulary may split unevenly."""
    sizes = (config.n_heads, config.hidden, config.ffn)
    kv = config.n_kv_heads  # fewer KV heads than ranks: each is replicated on t / nkv ranks
    return [t for t in range(1, largest + 1) if all(s % t == 0 for s in sizes)
            and (kv % t == 0 or t % kv == 0) and t <= config.vocab_size]


def crossover_tp(config, profile, batch, itemsize=4, arch=None, collectives="native", largest=64):
    """The smallest valid t at which communication per step takes longer than compute; None if none.

    ``batch``: sequences per TP group (no data parallelism here).
    """
    for t in valid_tp_degrees(config, arch, largest):
        p = predict_step(config, profile, t, batch, 1, itemsize, arch, collectives=collectives)
        if t > 1 and p["communication_s"] > p["compute_s"]:
            return t
    return None


# ---------------------------------------------------------------------------------------
# Calibration: measure this machine
# ---------------------------------------------------------------------------------------

def fit_line(xs, ys):
    """Least-squares (intercept, slope) of ys = intercept + slope * xs."""
    n = len(xs)
    mx, my = sum(xs) / n, sum(ys) / n
    slope = sum((x - mx) * (y - my) for x, y in zip(xs, ys)) / sum((x - mx) ** 2 for x in xs)
    return my - slope * mx, slope


def measure_matmul_flops(threads, sizes=((1024, 512, 2048), (1024, 1024, 1024), (1024, 2048, 512)),
                         repeats=5):
    """Sustained float32 matmul FLOP/s of this process with ``threads`` BLAS threads.

    Each shape's rate is that of its fastest repeat (on a shared machine the others include
    time taken by other programs); the result is the median over the shapes.
    """
    import time

    import torch
    before = torch.get_num_threads()
    torch.set_num_threads(threads)
    rates = []
    try:
        for m, k, n in sizes:
            a, b = torch.randn(m, k), torch.randn(k, n)
            a @ b  # warm up
            times = []
            for _ in range(repeats):
                start = time.perf_counter()
                a @ b
                times.append(time.perf_counter() - start)
            rates.append(2 * m * k * n / min(times))  # the best run: least disturbed by others
    finally:
        torch.set_num_threads(before)
    return sorted(rates)[len(rates) // 2]


def elementwise_workloads(n=2 ** 20, parameters=2 ** 22):
    """({op: make}, {op: elements}): make() -> a function running the op forward and backward
    once on inputs of about ``n`` elements (4 MiB in float32, larger than this machine's caches
    per core, as a step's activations are), the way the model calls it (same functions, same
    shapes' last dimensions: H = 256, F = 1024, T = 128, head size 64, a vocabulary of 512);
    AdamW updates ``parameters`` elements (with its m and v, 64 MiB: an optimizer's state lives
    in memory, not in a cache)."""
    import torch
    import torch.nn.functional as F

    from tp_from_scratch.gpt.model import apply_rope, rope_tables
    H, T, hs = 256, 128, 64

    def leaf(*shape):
        return torch.randn(*shape, requires_grad=True)

    def fwd_bwd(f, *inputs):
        def run():
            out = f(*inputs)
            out.backward(torch.ones_like(out))
        return run

    def layernorm():
        x, w, b = leaf(n // H, H), leaf(H), leaf(H)
        return fwd_bwd(lambda x: F.layer_norm(x, (H,), w, b), x)

    def rmsnorm():
        x, w = leaf(n // H, H), leaf(H)
        return fwd_bwd(lambda x: F.rms_norm(x, (H,), w, 1e-6), x)

    def gelu():  # the exact (erf) form, the course's default; GPT-2's tanh form is priced alike
        return fwd_bwd(F.gelu, leaf(n // 1024, 1024))

    def swiglu():
        return fwd_bwd(lambda g, u: F.silu(g) * u, leaf(n // 1024, 1024), leaf(n // 1024, 1024))

    def rope():
        cos, sin = rope_tables(torch.arange(T), hs, 10000.0, torch.float32)
        return fwd_bwd(lambda x: apply_rope(x, cos, sin), leaf(n // (T * hs), 1, T, hs))

    def softmax():
        mask = torch.ones(T, T, dtype=torch.bool).tril()
        return fwd_bwd(lambda s: (s * hs ** -0.5).masked_fill(~mask, float("-inf")).softmax(-1),
                       leaf(n // (T * T), T, T))

    def copy():
        return fwd_bwd(lambda y: y.transpose(1, 2).reshape(n // (T * hs) // 4, T, 4 * hs),
                       leaf(n // (T * hs) // 4, 4, T, hs))

    def add():
        x, y = torch.randn(n // H, H), torch.randn(n // H, H)
        return lambda: (x + y, y + x)  # the forward add, and the two gradients summed in backward

    def bias_grad():
        g = torch.randn(n // 1024, 1024)
        return lambda: g.sum(0)

    def cross_entropy():
        logits, targets = leaf(n // 512, 512), torch.randint(0, 512, (n // 512,))
        return lambda: F.cross_entropy(logits, targets).backward()

    def adamw():
        w = torch.nn.Parameter(torch.randn(parameters))
        w.grad = torch.randn(parameters)
        return torch.optim.AdamW([w], lr=1e-4, foreach=False).step

    makers = {f.__name__: f for f in (layernorm, rmsnorm, gelu, swiglu, rope, softmax, copy, add,
                                       bias_grad, cross_entropy, adamw)}
    return makers, {op: parameters if op == "adamw" else n for op in makers}


def measure_elementwise(threads, repeats=9):
    """{op: seconds per element} of each element-wise op of the model, forward + backward, this
    process with ``threads`` threads: the fastest of ``repeats`` runs (as for matmuls, the run
    least disturbed by other programs) on the inputs of elementwise_workloads."""
    import time

    import torch
    before = torch.get_num_threads()
    torch.set_num_threads(threads)
    workloads, elements = elementwise_workloads()
    out = {}
    try:
        for op, make in workloads.items():
            run = make()
            run()  # warm up
            times = []
            for _ in range(repeats):
                start = time.perf_counter()
                run()
                times.append(time.perf_counter() - start)
            out[op] = min(times) / elements[op]
    finally:
        torch.set_num_threads(before)
    return out


def measure_step_overhead(depths=(1, 4), repeats=15):
    """{"fixed_s", "per_layer_s"}: a training step's time that is not arithmetic, one thread.

    Times full steps (forward, backward, AdamW without foreach, as bench scaling runs them) of
    GPTs too small for their FLOPs to matter (H=16, T=4, B=1) at two depths, fastest of
    ``repeats`` each, and fits time = fixed + per_layer * L: the Python, autograd and optimizer
    bookkeeping that a FLOP count misses, and what dominates the smallest models.
    """
    import time

    import torch

    from tp_from_scratch.gpt.model import GPTConfig, init_gpt
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    seconds = []
    try:
        for layers in depths:
            config = GPTConfig(vocab_size=16, seq_len=4, n_layers=layers, hidden=16, n_heads=4, n_kv_heads=2)
            model = init_gpt(config, 0)
            optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4, foreach=False)
            x = torch.zeros(1, 4, dtype=torch.long)
            times = []
            for _ in range(repeats + 2):
                start = time.perf_counter()
                optimizer.zero_grad(set_to_none=True)
                _, loss = model(x, x)
                loss.backward()
                optimizer.step()
                times.append(time.perf_counter() - start)
            seconds.append(min(times[2:]))
    finally:
        torch.set_num_threads(before)
    fixed, per_layer = fit_line(list(depths), seconds)
    return {"fixed_s": max(fixed, 0.0), "per_layer_s": max(per_layer, 0.0)}


def lockstep_fit(call, barrier, p, repeats=5, iterations=10):
    """{"alpha_s", "beta_s_per_byte", "bytes", "seconds"} of the all-reduce ``call(x)`` (x a float32
    tensor) on p ranks, timed as a training step pays it; every rank calls this at once.

    In a step, every rank multiplies, then all-reduces, then multiplies again: a call starts
    when both ranks arrive, each arriving a little late or early (their matmuls do not take
    exactly as long), and a message moves only when the other process's thread gets a core,
    which the other rank's matmul is using. So each size is timed in lockstep: ``iterations`` x
    (a matmul of about a millisecond, then the all-reduce) against the same matmuls alone, both
    on every rank at once; the difference per iteration is what one call costs a step (the
    median of ``repeats``). A call timed alone after a barrier, on idle cores, costs about half.

    For a ring of p ranks, one all-reduce of n bytes takes 2(p-1) alpha + 2(p-1)/p n beta,
    so the fitted line time = a + b n gives alpha = a / (2(p-1)), beta = b p / (2(p-1)).
    """
    import statistics
    import time

    import torch
    sizes = [2 ** k for k in range(8, 21, 2)]  # float32 elements: 1 KiB .. 4 MiB
    a, b = torch.randn(256, 512), torch.randn(512, 512)  # 134 MFLOP: about a millisecond

    def lockstep(x, with_call):
        barrier()
        start = time.perf_counter()
        for _ in range(iterations):
            a @ b
            if with_call:
                call(x)
        return time.perf_counter() - start

    seconds = []
    for n in sizes:
        x = torch.randn(n)
        lockstep(x, True)  # warm up
        per_call = [(lockstep(x, True) - lockstep(x, False)) / iterations for _ in range(repeats)]
        seconds.append(float(statistics.median(per_call)))
    intercept, slope = fit_line([4 * n for n in sizes], seconds)
    return {"alpha_s": max(intercept, 0.0) / ring_messages(p), "beta_s_per_byte": slope * p / (2 * (p - 1)),
            "bytes": [4 * n for n in sizes], "seconds": seconds}


def calibrate_worker(out_path):
    """Run under torchrun: gloo's native all-reduce and ours over TorchComm (lockstep_fit), and
    the matmul rate of one process while the others multiply too. Under mpiexec: our ring
    all-reduce over MPI's point-to-point messages (key "mpi")."""
    from tp_from_scratch import collectives
    from tp_from_scratch.comm.launch import launcher_from_env

    def ours(comm):
        return lambda x: collectives.all_reduce(comm, x.numpy())

    if launcher_from_env() == "mpi":
        from tp_from_scratch.comm.mpi import MPIComm
        comm = MPIComm(timeout=120)
        try:
            result = {"mpi": lockstep_fit(ours(comm), comm.barrier, comm.world_size)}
        finally:
            comm.close()
        if comm.rank == 0:
            Path(out_path).write_text(json.dumps(result))
        return

    import torch.distributed as dist

    from tp_from_scratch.comm import TorchComm
    from tp_from_scratch.comm.process_group import init_process_group
    init_process_group("cpu", timeout=120)
    p, rank = dist.get_world_size(), dist.get_rank()
    comm = TorchComm()
    try:
        # every rank multiplies at once: the rate of one process while the other cores are busy too
        # (shared caches, memory bandwidth, clock); a step waits for the slowest, so keep the lowest
        dist.barrier()
        rates = [None] * p
        dist.all_gather_object(rates, measure_matmul_flops(1))
        result = {"matmul_flops_concurrent": {"1": min(rates), "processes": p},
                  "native": lockstep_fit(dist.all_reduce, dist.barrier, p),
                  "scratch": lockstep_fit(ours(comm), dist.barrier, p)}
    finally:
        comm.close()
        dist.destroy_process_group()
    if rank == 0:
        Path(out_path).write_text(json.dumps(result))


def calibrate(out_path, timeout=300, world_sizes=(2, 4)):
    """Measure matmul FLOP/s (1 and 2 threads; 1 thread on each of 2 processes at once), each
    element-wise op's seconds per element, the step overhead, and gloo all-reduce alpha, beta on
    2 processes (and on each other of ``world_sizes``)."""
    import os
    import statistics
    import tempfile

    from tp_from_scratch.comm.launchers import LauncherNotFoundError, mpiexec_command, run_command, torchrun_command
    # the matmul rate drifts by 10-20 % over minutes on a shared machine: three passes,
    # 1 and 2 threads in turn, and the median of each
    passes = [{k: measure_matmul_flops(k) for k in (1, 2)} for _ in range(3)]
    profile = {"source": "measured here by plan --calibrate", "cores": os.cpu_count(),
               "matmul_flops": {str(k): statistics.median(r[k] for r in passes) for k in (1, 2)},
               "elementwise_s_per_element": {str(k): measure_elementwise(k) for k in (1, 2)},
               "step_overhead": measure_step_overhead()}

    def worker(command, p):
        with tempfile.TemporaryDirectory() as tmp:
            part = Path(tmp) / "all_reduce.json"
            out = run_command(command(p, "tp_from_scratch.gpt.plan", "--calibrate-worker", str(part)),
                              timeout=timeout)
            if out.returncode != 0:
                raise RuntimeError(f"the all-reduce calibration on {p} processes failed:\n{out.stdout[-3000:]}")
            return json.loads(part.read_text())

    for p in world_sizes:
        measured = worker(torchrun_command, p)
        concurrent = measured.pop("matmul_flops_concurrent")
        if p == 2:
            profile["matmul_flops_concurrent"], profile["all_reduce"] = concurrent, measured
        else:
            profile.setdefault("all_reduce_by_world_size", {})[str(p)] = measured
    try:  # our ring over MPI point-to-point, for bench scaling under mpiexec
        profile["all_reduce"].update(worker(mpiexec_command, 2))
    except LauncherNotFoundError as missing:
        print(f"no MPI fit: {missing}")
    Path(out_path).parent.mkdir(parents=True, exist_ok=True)
    Path(out_path).write_text(json.dumps(profile, indent=1))
    return profile


# ---------------------------------------------------------------------------------------
# Command line
# ---------------------------------------------------------------------------------------

def add_model_flags(parser):
    """The trainer's model-size flags (tp_from_scratch.gpt.train), same names and defaults."""
    from tp_from_scratch.gpt.model import GPTConfig
    d = GPTConfig()
    g = parser.add_argument_group("model size (the trainer's flags)")
    g.add_argument("--vocab-size", type=int, default=d.vocab_size)
    g.add_argument("--seq-len", type=int, default=d.seq_len)
    g.add_argument("--layers", type=int, default=d.n_layers)
    g.add_argument("--hidden", type=int, default=d.hidden)
    g.add_argument("--heads", type=int, default=d.n_heads)
    g.add_argument("--kv-heads", type=int, default=None, help=f"default {d.n_kv_heads} (gpt2: --heads)")
    g.add_argument("--ffn", type=int, default=0, help="0: 4 x hidden")
    g.add_argument("--untied", action="store_true", help="an LM head of its own (llama: always)")
    g.add_argument("--gelu", choices=["erf", "tanh"], default="erf", help="accepted; no effect on any count")
    g.add_argument("--batch-size", type=int, default=8, help="global batch B (split over dp)")


def config_from_args(args):
    """The GPTConfig the trainer would build from these flags, as architecture ``--arch``."""
    from tp_from_scratch.gpt.model import GPTConfig
    kv = args.kv_heads or (args.heads if args.arch == "gpt2" else min(GPTConfig().n_kv_heads, args.heads))
    kw = dict(vocab_size=args.vocab_size, seq_len=args.seq_len, n_layers=args.layers, hidden=args.hidden,
              n_heads=args.heads, n_kv_heads=kv, ffn=args.ffn)
    if "arch" in GPTConfig.__dataclass_fields__:  # the model knows the architectures itself
        return GPTConfig(**kw, arch=args.arch, **({"tie_embeddings": False} if args.untied else {}))
    return GPTConfig(**kw, tie_embeddings=not args.untied)  # gpt2 / llama: architecture() decides


def build_parser():
    p = argparse.ArgumentParser(prog="python -m tp_from_scratch.gpt.plan", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--arch", choices=ARCHS, default="gpt", help="gpt: this course's model")
    p.add_argument("--tp", type=int, default=1, help="the TP degree to predict the step time of")
    p.add_argument("--dp", type=int, default=1)
    p.add_argument("--dtype", choices=["float32", "float64", "bfloat16"], default="float32",
                   help="what travels in the all-reduces")
    p.add_argument("--precision", choices=sorted(PRECISIONS), default="fp32", help="memory table")
    p.add_argument("--profile", default="runs/profile.json",
                   help=f"a JSON from --calibrate, or a preset: {', '.join(PRESETS)}")
    p.add_argument("--collectives", choices=["native", "scratch", "mpi"], default="native",
                   help="whose all-reduce: gloo's, ours over gloo, ours over MPI (from --calibrate)")
    p.add_argument("--calibrate", action="store_true", help="measure this machine, write --profile")
    p.add_argument("--calibrate-worker", metavar="JSON", help=argparse.SUPPRESS)
    add_model_flags(p)
    return p


ITEMSIZE = {"float32": 4, "float64": 8, "bfloat16": 2}


def memory_unit(largest):
    """("GiB", 2**30) or ("MiB", 2**20): whichever shows ``largest`` bytes with digits to read."""
    return ("GiB", 2 ** 30) if largest >= 2 ** 30 else ("MiB", 2 ** 20)


def report(args, config, profile, say=print):
    """The planner's tables, as text."""
    arch, B, itemsize = args.arch, args.batch_size, ITEMSIZE[args.dtype]
    n = parameter_count(config, arch)
    fields = ", ".join(f"{k}={v}" for k, v in architecture(config, arch).items())
    say(f"{arch}: V={config.vocab_size} T={config.seq_len} L={config.n_layers} H={config.hidden} "
        f"nh={config.n_heads} nkv={config.n_kv_heads} F={config.ffn}; {fields}")
    say(f"parameters: {n:,} exactly, {rounded(n)} rounded")
    degrees = [t for t in valid_tp_degrees(config, arch) if t <= 64]
    unit, scale = memory_unit(sum(memory_per_rank(config, arch, 1, B // args.dp, args.precision).values()))

    def size(n):
        return f"{n / scale:10.3f}"

    say(f"\nmemory per rank ({unit}, TP rank 0, {args.precision}; activations are Korthikanti et al. 2022's "
        f"formula for 16-bit activations, B={B // args.dp} per rank)")
    say("(AdamW state: m and v, plus the fp32 master weights in mixed precision; total: without SP)")
    say(f"{'t':>3} {'weights':>10} {'grads':>10} {'AdamW':>10} {'act.':>10} {'act.SP':>10} "
        f"{'act.SP+sel':>10} {'total':>10}")
    for t in degrees:
        m = memory_per_rank(config, arch, t, B // args.dp, args.precision)
        sp = activation_bytes(config, B // args.dp, t, sequence_parallel=True)
        sel = activation_bytes(config, B // args.dp, t, sequence_parallel=True, selective=True)
        say(f"{t:>3} {size(m['weights'])} {size(m['gradients'])} {size(m['optimizer'])} "
            f"{size(m['activations'])} {size(sp)} {size(sel)} {size(sum(m.values()))}")
    t = args.tp
    say(f"\ncommunication per step on rank 0, tp={t} dp={args.dp}, {args.dtype} "
        f"(payload: handed to the collective; ring: sent by the ring all-reduce)")
    say(f"{'where':<46} {'group':<5} {'calls':>5} {'payload B':>14} {'ring B':>14}")
    rows = traffic(config, t, B, args.dp, itemsize, arch)
    for r in rows:
        say(f"{r['where']:<46} {r['group']:<5} {r['calls']:>5} {r['payload_bytes']:>14,} {r['ring_bytes']:>14,}")
    say(f"{'total':<46} {'':<5} {sum(r['calls'] for r in rows):>5} "
        f"{sum(r['payload_bytes'] for r in rows):>14,} {sum(r['ring_bytes'] for r in rows):>14,}")
    say(f"\nprofile {profile['name']}: {profile['source']}")
    say(f"{'t':>3} {'GFLOP/rank':>12} {'compute ms':>11} {'elem. ms':>10} {'comm ms':>10} {'overhead ms':>11} "
        f"{'step ms':>10} {'speedup':>8}")
    say("(compute: the matmuls; elem.: norms, activations, softmax, adds, copies, loss, AdamW)")
    base = None
    for d in degrees:
        p = predict_step(config, profile, d, B, args.dp, itemsize, arch, collectives=args.collectives)
        base = base or p["step_s"]
        say(f"{d:>3} {p['flops'] / 1e9:>12.2f} {p['compute_s'] * 1e3:>11.3f} {p['elementwise_s'] * 1e3:>10.3f} "
            f"{p['communication_s'] * 1e3:>10.3f} {p['overhead_s'] * 1e3:>11.3f} {p['step_s'] * 1e3:>10.3f} "
            f"{base / p['step_s']:>7.2f}x")
    cross = crossover_tp(config, profile, B // args.dp, itemsize, arch, args.collectives)
    if cross is None:
        say(f"\nadvice: communication stays below compute up to t={degrees[-1]} on this profile.")
    else:
        say(f"\nadvice: at t={cross} communication ({args.collectives} all-reduce) takes longer than "
            f"compute on this profile; beyond that, TP mostly adds waiting. Use a smaller t "
            f"and add data or pipeline parallelism instead.")


def main(argv=None):
    parser = build_parser()
    args = parser.parse_args(argv)
    if args.calibrate_worker:
        return calibrate_worker(args.calibrate_worker)
    if args.calibrate:
        path = args.profile if args.profile not in PRESETS else "runs/profile.json"
        profile = calibrate(path)
        print(f"wrote {path}:\n{json.dumps({k: v for k, v in profile.items()}, indent=1)[:2000]}")
        return 0
    config = config_from_args(args)
    try:
        config.validate(args.tp)
    except ValueError as e:
        parser.error(str(e))
    if args.profile not in PRESETS and not Path(args.profile).exists():
        parser.error(f"no profile {args.profile}: run with --calibrate first, or pass a preset "
                     f"({', '.join(PRESETS)})")
    profile = load_profile(args.profile)
    if args.collectives not in profile["all_reduce"]:
        parser.error(f"--collectives {args.collectives}: profile {args.profile} has no fit of that all-reduce "
                     f"(it has {', '.join(profile['all_reduce'])}); --calibrate fits native and scratch, "
                     f"and mpi where mpiexec is installed")
    report(args, config, profile)
    return 0


if __name__ == "__main__":
    sys.exit(main())
