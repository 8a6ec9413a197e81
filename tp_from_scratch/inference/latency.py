"""The planner's inference mode: the time of a prefill and of one decode step on t ranks.

    decode_step(config, profile, t, batch, context)   one step: B new tokens, one per sequence
    prefill(config, profile, t, batch, prompt)        the prompt's forward: time to first token
    memory_per_rank(config, t, batch, context)        weights and KV cache of TP rank 0 (bytes)
    decode_table(config, profile, batches, contexts)  step time by t, batch and context

What a decode step costs TP rank 0 (the largest shard), no overlap (our code has none):

    memory      (its matmul weights + its KV cache) / memory bandwidth: every weight is read once
                per step whatever B is; the cache holds L B context 2 (nkv/t, at least one) hs
    compute     2 B (its matmul weights) + 4 B context hs (nh/t) L FLOPs / FLOP/s
                (the two are one roofline: the larger of them is the step's arithmetic)
    all-reduce  2L + 1 of (B, H): the embedding's g, and g after attention and after the MLP in
                every block, each alpha-beta (cost.model.all_reduce_seconds); an SPD block has one;
                quantized ones send fewer bytes in as many messages; CAAT-Net's p H channels
    sampling    gpt.generate all-gathers the (B, V/t) logits; sampling.sample_from_shards
                all-gathers (B, 2) candidates (and (B, k) scores for top-k) instead
    overhead    this CPU's per-step Python cost, fixed + per layer (--calibrate); 0 on a GPU
                profile (CUDA graphs assumed: no launch cost)

In decode the all-reduces carry B H numbers (16 KiB for B = 1, H = 8192 in bf16): alpha, the
latency of a call, dominates them, not bytes. Every collective is counted as Lesson 2's ring
counts it: 2(t-1) messages for an all-reduce (and for the two-step quantized one), t-1 for an
all-gather; a GPU profile sets alpha per message from a published per-call all-reduce latency.
A library's one-shot kernel does either in one step, so there an all-gather costs about what an
all-reduce costs, not half: the ring's count is this model's assumption, said so. The parameters and shapes come from Lesson 6's
inventory (through cost.model), the link prices from Lesson 9's profiles.
"""
import json
import math
from pathlib import Path

from tp_from_scratch.collectives import ring_messages
from tp_from_scratch.cost.model import PRESETS, all_reduce_seconds, architecture, parameters, rank_heads
from tp_from_scratch.inference.quantized import UNQUANTIZED, reduce_bytes, reduce_messages
from tp_from_scratch.inference.sampling import exchanges, sharded_sampling_bytes
from tp_from_scratch.partial_sync.mappings import synced_channels
from tp_from_scratch.sharding import shard_sizes

# ---------------------------------------------------------------------------------------
# GPU profiles: Lesson 9's chips and links, with what inference adds (capacity, call latency)
# ---------------------------------------------------------------------------------------

GB = 1e9


def _per_call(latency_s, degrees=(2, 4, 8, 16)):
    """A link's alpha per ring message chosen so that one small all-reduce takes ``latency_s``
    at each t (latency_s: one number, or {t: seconds}): alpha = latency / 2(t-1). The published
    small-message figures below are per call; a library's small-message algorithm is no ring."""
    at = latency_s if isinstance(latency_s, dict) else dict.fromkeys(degrees, latency_s)
    return {str(t): s / ring_messages(t) for t, s in at.items()}


def _profile(base, source, capacity, latency_s, beta_s_per_byte, **chip):
    alphas = _per_call(latency_s)
    link = {"native": {"alpha_s": alphas["2"], "beta_s_per_byte": beta_s_per_byte}}
    by_t = {t: {"native": {"alpha_s": a, "beta_s_per_byte": beta_s_per_byte}} for t, a in alphas.items()}
    return {**base, **chip, "source": source, "memory_capacity_bytes": capacity, "all_reduce": link,
            "all_reduce_by_world_size": by_t}


# vLLM's custom all-reduce on H100, the row "data size 32768" (no unit given) of the unit-test table
# in sgl-project/sglang#2904, timed without CUDA graphs (so a launch is included)
NVLINK_CALL = {2: 8.7e-6, 4: 9.2e-6, 8: 11.8e-6}
PROFILES = {
    "h100-nvlink": _profile(
        PRESETS["h100-nvlink"],
        "H100 SXM 80 GB (vendor spec: 989 TFLOP/s dense BF16, HBM3 3.35 TB/s), NVLink 4 450 GB/s per "
        "direction; a small all-reduce takes 8.7 / 9.2 / 11.8 us at t = 2 / 4 / 8 (vLLM's custom "
        "all-reduce on H100, data size 32768, without CUDA graphs: sgl-project/sglang#2904), "
        "11.8 us assumed at t = 16",
        80 * GB, {**NVLINK_CALL, 16: NVLINK_CALL[8]}, PRESETS["h100-nvlink"]["all_reduce"]["native"]["beta_s_per_byte"]),
    "h100-pcie": _profile(
        PRESETS["h100-nvlink"],
        "H100 PCIe 80 GB (vendor spec: 756 TFLOP/s dense BF16, HBM2e 2.0 TB/s), PCIe Gen5 x16 "
        "64 GB/s per direction, each GPU's own link taken as the bottleneck; a small all-reduce "
        "assumed at 25 us (no published figure read)",
        80 * GB, 25e-6, 1 / 64e9, matmul_flops={"1": 756e12}, memory_bytes_per_s=2.0e12),
    "h100-infiniband": _profile(
        PRESETS["h100-infiniband"],
        "H100 SXM 80 GB across nodes, InfiniBand NDR 50 GB/s per direction per GPU (Lesson 9's "
        "preset); a small all-reduce over 2 nodes x 8 GPUs takes about 47 us (NCCL NVLSTree, "
        "16 H20 GPUs, NDR: NVIDIA/nccl#1244), taken at every t",
        80 * GB, 47e-6, PRESETS["h100-infiniband"]["all_reduce"]["native"]["beta_s_per_byte"]),
}
MEASURED = "runs/inference_profile.json"  # what --calibrate writes


def load_profile(name_or_path):
    """A GPU profile (PROFILES) or the path of a JSON profile written by --calibrate."""
    if name_or_path in PROFILES:
        return dict(PROFILES[name_or_path], name=name_or_path)
    return dict(json.loads(Path(name_or_path).read_text()), name=str(name_or_path))


# ---------------------------------------------------------------------------------------
# What one rank holds and reads
# ---------------------------------------------------------------------------------------

def matmul_weights(config, t, rank=0, arch=None):
    """Elements of the weights rank ``rank`` multiplies by each token: every block's linears,
    the LM head (the token embedding itself when tied); the embeddings' lookups read B rows only."""
    n = sum(p.count(t, rank) for p in parameters(config, arch) if p.matmul)
    if architecture(config, arch)["tie_embeddings"]:
        n += shard_sizes(config.vocab_size, t)[rank] * config.hidden
    return n


def kv_heads_per_rank(config, t):
    """KV heads rank 0 caches: nkv / t, ⌈nkv/t⌉ when t does not divide them (rank 0 holds the
    largest piece of every split, so it sets the step), or one whole (replicated) head when nkv < t."""
    return rank_heads(config, t, 0)[1]


def query_heads_per_rank(config, t):
    """Query heads rank 0 attends with: nh / t, or the most any rank holds (gpt.arch.head_counts)."""
    return rank_heads(config, t, 0)[0]


def kv_cache_bytes(config, t, batch, context, itemsize):
    """Keys and values one rank caches for ``batch`` sequences of ``context`` tokens, all layers."""
    return config.n_layers * batch * context * 2 * kv_heads_per_rank(config, t) * config.head_size * itemsize


def memory_per_rank(config, t, batch, context, itemsize, arch=None):
    """{"weights", "kv_cache"} bytes on TP rank 0 (every parameter it holds, and its cache)."""
    held = sum(p.count(t, 0) for p in parameters(config, arch))
    return {"weights": held * itemsize, "kv_cache": kv_cache_bytes(config, t, batch, context, itemsize)}


# ---------------------------------------------------------------------------------------
# Prices
# ---------------------------------------------------------------------------------------

def link_seconds(profile, t, messages, bytes_sent, collectives="native"):
    """messages x alpha + bytes x beta on the link cost.model.all_reduce_seconds prices (its fit
    at this t when the profile has one)."""
    if t == 1:
        return 0.0
    link = profile.get("all_reduce_by_world_size", {}).get(str(t), {}).get(collectives) \
        or profile["all_reduce"][collectives]
    return messages * link["alpha_s"] + bytes_sent * link["beta_s_per_byte"]


def reduce_seconds(profile, t, n, itemsize, bits=UNQUANTIZED, group_size=128, scheme="two_step",
                   collectives="native"):
    """One row-parallel reduce of n numbers: the plain all-reduce (bits 16), or a quantized one's
    messages and bytes (quantized.reduce_messages, reduce_bytes on rank 0) on the same link."""
    if bits == UNQUANTIZED:
        return all_reduce_seconds(profile, collectives, n * itemsize, t)
    return link_seconds(profile, t, reduce_messages(t, bits, scheme),
                        reduce_bytes(n, t, 0, bits, group_size, itemsize, scheme), collectives)


def sampling_seconds(profile, t, batch, vocab_size, itemsize, sampling="gathered", top_k=0, collectives="native"):
    """The token choice's exchange: all-gather of the (B, V/t) logits (gathered, t-1 messages,
    (t-1)/t of B V itemsize) or of the candidates (sharded, sampling.sharded_sampling_bytes)."""
    if sampling == "sharded":
        return link_seconds(profile, t, exchanges(top_k) * (t - 1), sharded_sampling_bytes(batch, t, top_k),
                            collectives)
    return link_seconds(profile, t, t - 1, (t - 1) / t * batch * vocab_size * itemsize, collectives)


def _rates(profile, t):
    """(matmul FLOP/s, memory bytes/s, stretch): a CPU with more processes than cores runs
    each at cores / processes of its time (as cost.model.predict_step stretches a step)."""
    rate = profile["matmul_flops"]["1"]
    together = profile.get("matmul_flops_concurrent", {}).get("1")
    if together and t > 1:
        rate = together
    return rate, profile["memory_bytes_per_s"], max(1.0, t / profile.get("cores", t))


def _overhead(profile, config):
    cost = profile.get("decode_overhead")
    return cost["fixed_s"] + cost["per_layer_s"] * config.n_layers if cost else 0.0


def all_reduces_seconds(config, profile, t, tokens, itemsize, spd_blocks=0, bits=UNQUANTIZED, group_size=128,
                        scheme="two_step", synced_fraction=1.0, collectives="native"):
    """A forward's all-reduces over ``tokens`` positions: the embedding's exact one of (tokens, H),
    and 2L - spd_blocks row-parallel reduces of (tokens, floor(p H)), quantized at bits < 16."""
    n = tokens * synced_channels(config.hidden, synced_fraction)
    reduces = 2 * config.n_layers - spd_blocks
    per_reduce = reduce_seconds(profile, t, n, itemsize, bits, group_size, scheme, collectives) if n else 0.0
    return all_reduce_seconds(profile, collectives, tokens * config.hidden * itemsize, t) + reduces * per_reduce


def decode_step(config, profile, t, batch, context, itemsize=2, arch=None, sampling="gathered", top_k=0,
                collectives="native", **syncs):
    """{"memory_s", "compute_s", "all_reduce_s", "sampling_s", "overhead_s", "step_s", ...} of one
    decode step of ``batch`` sequences, each with ``context`` tokens cached, on TP rank 0.

    step = max(memory, compute) + all-reduces + sampling + overhead (nothing overlapped).
    ``syncs`` (all_reduces_seconds): spd_blocks, how many blocks drop their attention all-reduce;
    bits < 16 (group_size, scheme), the row-parallel reduces quantized (quantized.reduce_bytes'
    messages and bytes); synced_fraction p < 1, CAAT-Net's partial sync (Lesson 8): each block
    all-reduce carries floor(p H) channels.
    """
    rate, bandwidth, stretch = _rates(profile, t)
    weights = matmul_weights(config, t, 0, arch)
    kv = kv_cache_bytes(config, t, batch, context, itemsize)
    heads = query_heads_per_rank(config, t)
    flops = 2 * batch * weights + 4 * batch * context * config.head_size * heads * config.n_layers
    memory = (weights * itemsize + kv) / bandwidth * stretch
    compute = flops / rate * stretch
    all_reduce = all_reduces_seconds(config, profile, t, batch, itemsize, collectives=collectives, **syncs)
    choose = sampling_seconds(profile, t, batch, config.vocab_size, itemsize, sampling, top_k, collectives)
    overhead = _overhead(profile, config) * stretch
    step = max(memory, compute) + all_reduce + choose + overhead
    return {"weights_bytes": weights * itemsize, "kv_bytes": kv, "flops": flops, "memory_s": memory,
            "compute_s": compute, "all_reduce_s": all_reduce, "sampling_s": choose, "overhead_s": overhead,
            "step_s": step, "tokens_per_s": batch / step}


def prefill(config, profile, t, batch, prompt, itemsize=2, arch=None, sampling="gathered", top_k=0,
            collectives="native", **syncs):
    """{"compute_s", "memory_s", "all_reduce_s", "sampling_s", "overhead_s", "step_s"}: the
    prompt's forward (B x prompt tokens) and the first token's choice: time to first token.
    Attention over the full prompt x prompt square, as our code computes it; ``syncs`` as for
    decode_step."""
    rate, bandwidth, stretch = _rates(profile, t)
    weights = matmul_weights(config, t, 0, arch)
    tokens = batch * prompt
    heads = query_heads_per_rank(config, t)
    flops = 2 * tokens * weights + 4 * batch * prompt ** 2 * config.head_size * heads * config.n_layers
    memory = (weights * itemsize + kv_cache_bytes(config, t, batch, prompt, itemsize)) / bandwidth * stretch
    compute = flops / rate * stretch
    all_reduce = all_reduces_seconds(config, profile, t, tokens, itemsize, collectives=collectives, **syncs)
    choose = sampling_seconds(profile, t, batch, config.vocab_size, itemsize, sampling, top_k, collectives)
    overhead = _overhead(profile, config) * stretch
    return {"flops": flops, "compute_s": compute, "memory_s": memory, "all_reduce_s": all_reduce,
            "sampling_s": choose, "overhead_s": overhead,
            "step_s": max(memory, compute) + all_reduce + choose + overhead}


def fits(config, profile, t, batch, context, itemsize, arch=None):
    """True when rank 0's weights and KV cache fit the profile's device memory (no capacity: True)."""
    capacity = profile.get("memory_capacity_bytes")
    return capacity is None or sum(memory_per_rank(config, t, batch, context, itemsize, arch).values()) <= capacity


def decode_table(config, profile, batches, contexts, degrees, itemsize=2, arch=None, **options):
    """[{"batch", "context", "steps": {t: step_s}, "fits": {t: bool}, "speedup": step(1) / step(t_max),
    "smallest_fit": t, "speedup_vs_smallest_fit"}] for every batch and context: one row each."""
    rows = []
    for context in contexts:
        for batch in batches:
            steps = {t: decode_step(config, profile, t, batch, context, itemsize, arch, **options)["step_s"]
                     for t in degrees}
            fit = {t: fits(config, profile, t, batch, context, itemsize, arch) for t in degrees}
            smallest = next((t for t in degrees if fit[t]), None)
            top = degrees[-1]
            rows.append({"batch": batch, "context": context, "steps": steps, "fits": fit,
                         "speedup": steps[degrees[0]] / steps[top], "smallest_fit": smallest,
                         "speedup_vs_smallest_fit": steps[smallest] / steps[top] if smallest else math.nan})
    return rows
