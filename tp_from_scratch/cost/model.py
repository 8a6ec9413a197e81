"""Lesson 9's cost model of one training step: memory, bytes, FLOPs and a predicted time.

    memory_per_rank(config, arch, t, batch)   weights, gradients, AdamW state, activations (bytes)
    traffic(config, t, batch, dp)             per call site: calls, payload bytes, ring bytes
    step_flops(config, arch, batch, t)        forward + backward FLOPs of one rank
    predict_step(config, profile, t, batch)   compute + element-wise + communication + overhead

The parameters and the collectives of a step are counted in Lesson 6 (gpt.inventory), the
ring's bytes next to the ring (collectives.ring_all_reduce_bytes), the activations by
Korthikanti et al.'s formula in Lesson 7 (sequence_parallel.memory.korthikanti_bytes); this
module prices them. A profile (PRESETS, or a JSON measured by cost.calibrate) gives the rates.
The command line is tp_from_scratch.cost.planner.
"""
import json
from pathlib import Path

from tp_from_scratch.collectives import ring_all_reduce_bytes, ring_messages
from tp_from_scratch.gpt.arch import head_counts, kv_replicas
from tp_from_scratch.gpt.inventory import architecture, collective_calls, parameter_count, parameters
from tp_from_scratch.sequence_parallel.memory import korthikanti_bytes
from tp_from_scratch.sharding import shard_sizes

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
# Memory per rank
# ---------------------------------------------------------------------------------------

# bytes per parameter: (weights, gradients, optimizer state)
PRECISIONS = {
    "fp32": (4, 4, 8),     # fp32 weights and grads; AdamW m and v in fp32
    "mixed": (2, 2, 12),   # bf16 weights and grads; fp32 master weights, m and v (ZeRO paper's 16 bytes)
}


def activation_bytes(config, batch, t, sequence_parallel=False, selective=False):
    """Activations kept for backward, per rank, all layers: Korthikanti et al. 2022's formula
    (sequence_parallel.memory.korthikanti_bytes, 16-bit activations, F = 4H, dropout) times L."""
    return config.n_layers * korthikanti_bytes(config.seq_len, batch, config.hidden, config.n_heads, t,
                                               sequence_parallel, selective)


def memory_per_rank(config, arch, t, batch, precision="fp32", sequence_parallel=False, selective=False):
    """{"weights", "gradients", "optimizer", "activations"} in bytes on TP rank 0 (the largest)."""
    n = parameter_count(config, arch, t, 0)
    w, g, o = PRECISIONS[precision]
    return {"weights": n * w, "gradients": n * g, "optimizer": n * o,
            "activations": activation_bytes(config, batch, t, sequence_parallel, selective)}


# ---------------------------------------------------------------------------------------
# Communication: the bytes of the collectives our trainer calls in one step
# ---------------------------------------------------------------------------------------

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
    heads = head_counts(config, t)[0][rank]   # nh/t, or this rank's share of heads t does not divide
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
    heads, kv = rank_heads(config, t, rank)
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
        out["rope"] = L * N * (heads + kv) * hs
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


def rank_heads(config, t, rank):
    """(query heads, KV heads) TP rank ``rank`` of t holds (gpt.arch.head_counts: uneven when t
    does not divide them, rank 0 the most)."""
    q, kv = head_counts(config, t)
    return q[rank], kv[rank // kv_replicas(config, t)]


def valid_tp_degrees(config, arch=None, largest=64):
    """The t in 1..largest that split heads, hidden and ffn evenly, and KV heads evenly or into
    whole replicated heads (t a multiple of nkv); the vocabulary may split unevenly. The degrees
    the planner's tables list: a t that splits heads or ffn unevenly also trains (gpt.arch.head_counts) and
    is priced when asked for (--tp), at the pace of rank 0, which holds the most."""
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
