"""Lesson 12's planner: DeepSeek-V3's parameters, memory per rank and bytes per token, TP against EP.

    # the published DeepSeek-V3 (transformers' DeepseekV3Config defaults): 671B, 37.6B active
    .venv/bin/python -m tp_from_scratch.deepseek.planner
    # another DeepseekV3 config (a config.json), planned at TP=4 against EP=32
    .venv/bin/python -m tp_from_scratch.deepseek.planner --config path/to/config.json --tp 4 --ep 32

Lesson 9's planner (tp_from_scratch.cost.planner) counts dense models; this one adds what a
mixture-of-experts with latent attention changes, on Lesson 9's and earlier lessons' formulas:

* parameters, exactly as transformers' DeepseekV3ForCausalLM holds them (the sum of its
  parameters' numel; the router's selection bias is a buffer, not counted), and the active ones:
  all but the routed experts a token does not use (k of E). The multi-token-prediction module
  (report §2.2; 14B more by DeepSeek's README) is not in transformers' model, so not in the count;
* weights, gradients and AdamW state per rank (cost.model.PRECISIONS) with attention and the dense
  and shared FFNs split over TP=t, the routed experts over EP=e (E/e whole experts per rank), and
  the embedding and head whole, as the course's ParallelDeepseekV3 holds them (TP=EP=t: its
  tensor-parallel layout; TP=1, EP=t: its expert-parallel layout, DeepSeek-V3's in training);
* the bytes per token and layer, forward: TP's two ring all-reduces of H numbers
  (collectives.ring_all_reduce_bytes) against EP's dispatch and combine
  (deepseek.expert_parallel.ep_bytes_sent) under balanced routing, also at node granularity
  (node-limited routing: a token goes to at most M nodes, once each, across InfiniBand).
"""
import argparse
import sys

import numpy as np

from tp_from_scratch.collectives import ring_all_reduce_bytes
from tp_from_scratch.cost.model import PRECISIONS
from tp_from_scratch.gpt.inventory import rounded
from tp_from_scratch.gpt.options import (at_least, at_most, divides, first_problem, json_file, parse_valid_args,
                                         positive)
from tp_from_scratch.sharding import shard_sizes

from .expert_parallel import ep_bytes_sent

ITEMSIZE = {"bfloat16": 2, "float32": 4, "float64": 8}


# ---------------------------------------------------------------------------------------
# Parameters
# ---------------------------------------------------------------------------------------

def attention_parameters(c, t=1):
    """MLA's parameters on one TP rank of t (heads split; latents, their norms and biases replicated)."""
    H, nh = c.hidden_size, c.num_attention_heads // t
    qk, bias = c.qk_nope_head_dim + c.qk_rope_head_dim, int(bool(c.attention_bias))
    if c.q_lora_rank is None:
        q = H * nh * qk  # q_proj, split by heads
    else:  # q_a_proj (+ bias), q_a_layernorm, q_b_proj split by heads
        q = (H + bias) * c.q_lora_rank + c.q_lora_rank + c.q_lora_rank * nh * qk
    kv = ((H + bias) * (c.kv_lora_rank + c.qk_rope_head_dim) + c.kv_lora_rank  # kv_a (+ bias), its norm
          + c.kv_lora_rank * nh * (c.qk_nope_head_dim + c.v_head_dim))     # kv_b, split by heads
    return q + kv + nh * c.v_head_dim * H + bias * H  # o_proj row-split, its bias replicated


def ffn_parameters(hidden, width):
    """A SiLU-gated FFN of ``width``: gate, up and down, no biases."""
    return 3 * hidden * width


def layer_parameters(c, moe, t=1, e=1, experts=None):
    """One decoder layer on one rank: two norms, attention over t, then the dense FFN (over t)
    or the MoE layer: router (replicated), shared experts (over t), ``experts`` routed experts
    (default E/e) whole."""
    H = c.hidden_size
    n = 2 * H + attention_parameters(c, t)
    if not moe:
        return n + ffn_parameters(H, c.intermediate_size // t)
    experts = c.n_routed_experts // e if experts is None else experts
    return (n + c.n_routed_experts * H + ffn_parameters(H, c.n_shared_experts * c.moe_intermediate_size // t)
            + experts * ffn_parameters(H, c.moe_intermediate_size))


def parameter_count(c, t=1, e=1, active=False):
    """The parameters of DeepseekV3ForCausalLM (config ``c``) on one rank (t=e=1: all of them),
    held as the course's ParallelDeepseekV3 holds them: the embedding and head whole on every rank.

    active: those one token uses, the num_experts_per_tok of the routed experts (t=e=1 only).
    """
    dense, moe = c.first_k_dense_replace, c.num_hidden_layers - c.first_k_dense_replace
    experts = c.num_experts_per_tok if active else None
    heads = 1 if c.tie_word_embeddings else 2  # embedding (+ untied head), whole on every rank
    return (heads * c.vocab_size * c.hidden_size + c.hidden_size  # ... and the final norm
            + dense * layer_parameters(c, False, t, e) + moe * layer_parameters(c, True, t, e, experts))


def memory_per_rank(c, t, e, precision="mixed"):
    """{"weights", "gradients", "optimizer"} bytes on rank 0 (no activations)."""
    n = parameter_count(c, t, e)
    w, g, o = PRECISIONS[precision]
    return {"weights": n * w, "gradients": n * g, "optimizer": n * o}


# ---------------------------------------------------------------------------------------
# Bytes per token per layer, forward
# ---------------------------------------------------------------------------------------

def tp_bytes_per_token(c, t, itemsize):
    """Bytes all t ranks together send for one token in one layer's forward under TP: two ring
    all-reduces of H (attention's o_proj, and the FFN or MoE layer). Every rank of the group holds
    every token, so this is also what one rank sends per token of its own 1/t share."""
    return 2 * sum(ring_all_reduce_bytes(c.hidden_size, itemsize, t, r) for r in range(t))


def balanced_counts(ranks, tokens, copies, slots=1):
    """(ranks, ranks, slots): every rank sends ``tokens`` tokens ``copies`` times each, spread as
    evenly as can be over the ranks and their slots (experts): routing in perfect balance."""
    even = np.array(shard_sizes(tokens * copies, ranks * slots)).reshape(ranks, slots)
    return np.broadcast_to(even, (ranks, ranks, slots))


def ep_bytes_per_token(c, e, itemsize, tokens=4096):
    """Bytes one rank sends per token of its own in one MoE layer's forward under EP=e: dispatch +
    combine of its tokens' k copies (those to other ranks) and the counts, over ``tokens`` tokens
    per rank routed in perfect balance (ep_bytes_sent)."""
    E = c.n_routed_experts
    counts = balanced_counts(e, tokens, c.num_experts_per_tok, E // e)
    return ep_bytes_sent(counts, 0, c.hidden_size, itemsize) / tokens


def node_bytes_per_token(c, nodes, per_node, max_nodes, itemsize, tokens=4096):
    """Node-limited routing: bytes one GPU sends across nodes per token of its own and MoE layer:
    each token goes once to each of its ``max_nodes`` nodes (balanced over ``nodes``), and is
    forwarded to its experts inside the node over NVLink (not counted). ``tokens`` per GPU."""
    counts = balanced_counts(nodes, tokens * per_node, max_nodes)
    return ep_bytes_sent(counts, 0, c.hidden_size, itemsize) / (tokens * per_node)


# ---------------------------------------------------------------------------------------
# Command line
# ---------------------------------------------------------------------------------------

def build_parser():
    p = argparse.ArgumentParser(prog="python -m tp_from_scratch.deepseek.planner", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--config", default=None,
                   help="a DeepseekV3 config.json; default: transformers' DeepseekV3Config() (DeepSeek-V3)")
    p.add_argument("--tp", type=int, default=8, help="the TP degree to price (default 8: one node)")
    p.add_argument("--ep", type=int, default=64, help="the EP degree to price (default 64, as trained)")
    p.add_argument("--gpus-per-node", type=int, default=8)
    p.add_argument("--max-nodes", type=int, default=4, help="node-limited routing: nodes per token (M)")
    p.add_argument("--tokens", type=int, default=4096, help="tokens per rank and micro-batch (EP's counts)")
    p.add_argument("--dtype", choices=list(ITEMSIZE), default="bfloat16", help="what travels")
    p.add_argument("--precision", choices=sorted(PRECISIONS), default="mixed", help="memory table")
    return p


# the config's sizes this planner multiplies and divides by, and the least each may be
SIZES = {"vocab_size": 1, "hidden_size": 1, "intermediate_size": 1, "num_hidden_layers": 1, "first_k_dense_replace": 0,
         "num_attention_heads": 1, "kv_lora_rank": 1, "qk_nope_head_dim": 1, "qk_rope_head_dim": 1, "v_head_dim": 1,
         "moe_intermediate_size": 1, "n_routed_experts": 1, "num_experts_per_tok": 1, "n_shared_experts": 0}


def config_problem(c, path):
    """The first size of the config that no model has (or that overflows), as a sentence naming
    the file and the key; None if fine."""
    where = f"--config {path}:"
    return first_problem(
        *(at_least(f"{where} {key}", getattr(c, key), lowest) or at_most(f"{where} {key}", getattr(c, key))
          for key, lowest in SIZES.items()),
        None if c.q_lora_rank is None else positive(f"{where} q_lora_rank", c.q_lora_rank),
        None if c.num_experts_per_tok <= c.n_routed_experts else
        f"{where} num_experts_per_tok {c.num_experts_per_tok} is more than n_routed_experts {c.n_routed_experts}",
        None if c.first_k_dense_replace <= c.num_hidden_layers else
        f"{where} first_k_dense_replace {c.first_k_dense_replace} is more than num_hidden_layers "
        f"{c.num_hidden_layers}")


def load_config(path):
    """(DeepseekV3Config, None) or (None, one sentence naming the file and what is wrong): a
    config.json of another model (its model_type) is not planned as if it were DeepSeek-V3's."""
    from transformers import DeepseekV3Config
    if path is None:
        return DeepseekV3Config(), None
    data, problem = json_file("--config", path)
    if problem:
        return None, problem
    if not isinstance(data, dict) or data.get("model_type") != "deepseek_v3":
        found = f"model_type {data.get('model_type')!r}" if isinstance(data, dict) else "not a JSON object"
        return None, (f"--config {path}: {found}, not DeepSeek-V3's 'deepseek_v3' (a dense model's config: "
                      f"Lesson 9's python -m tp_from_scratch.cost.planner takes its sizes as flags)")
    try:
        c = DeepseekV3Config(**{k: v for k, v in data.items() if k != "model_type"})
    except Exception as error:  # noqa: BLE001 - transformers' checks raise TypeError, ValueError or its own
        return None, f"--config {path}: not a DeepseekV3 config ({' '.join(str(error).split())})"
    problem = config_problem(c, path)
    return (None, problem) if problem else (c, None)


def validate(args, world=1):
    """The first problem with the flags, as one sentence; None if fine."""
    problem = first_problem(*(positive(f"--{name.replace('_', '-')}", getattr(args, name))
                              for name in ("tp", "ep", "gpus_per_node", "max_nodes", "tokens")))
    if problem:
        return problem
    c, problem = load_config(args.config)
    if problem:
        return problem
    nodes = args.ep // args.gpus_per_node
    return first_problem(
        divides("--tp", args.tp, c.num_attention_heads, "the attention heads"),
        divides("--tp", args.tp, c.intermediate_size, "the dense FFN's width"),
        divides("--tp", args.tp, c.n_shared_experts * c.moe_intermediate_size, "the shared experts' width"),
        divides("--ep", args.ep, c.n_routed_experts, "the routed experts"),
        divides("--gpus-per-node", args.gpus_per_node, args.ep, "--ep (EP spans whole nodes)"),
        None if args.max_nodes <= max(nodes, 1) else
        f"--max-nodes {args.max_nodes}: EP={args.ep} spans only {nodes} node(s) of {args.gpus_per_node}")


def report(args, c, say=print):
    b, t, e = ITEMSIZE[args.dtype], args.tp, args.ep
    total, active = parameter_count(c), parameter_count(c, active=True)
    say(f"DeepseekV3: H={c.hidden_size} L={c.num_hidden_layers} (first {c.first_k_dense_replace} dense) "
        f"E={c.n_routed_experts} routed + {c.n_shared_experts} shared, k={c.num_experts_per_tok}, "
        f"F={c.moe_intermediate_size}, dense F={c.intermediate_size}, heads={c.num_attention_heads}, "
        f"V={c.vocab_size}")
    say(f"parameters: {total:,} ({rounded(total)}) total, {active:,} ({rounded(active)}) active per token")
    say("(transformers' DeepseekV3ForCausalLM, embedding and head included; without the "
        "multi-token-prediction module, report §2.2)")
    say(f"\nmemory per rank, GiB ({args.precision}: weights, gradients, AdamW; no activations); "
        f"attention, dense/shared FFNs over TP, routed experts over EP, embedding and head whole")
    say(f"{'TP':>3} {'EP':>3} {'weights':>9} {'grads':>9} {'AdamW':>9} {'total':>9}")
    for tp, ep in sorted({(1, 1), (1, e), (t, 1), (t, t), (t, e)}):
        if c.n_routed_experts % ep == 0:
            m = memory_per_rank(c, tp, ep, args.precision)
            say(f"{tp:>3} {ep:>3} " + " ".join(f"{v / 2 ** 30:9.1f}" for v in m.values())
                + f" {sum(m.values()) / 2 ** 30:9.1f}")
    tp_b, ep_b = tp_bytes_per_token(c, t, b), ep_bytes_per_token(c, e, b, args.tokens)
    nodes = e // args.gpus_per_node
    say(f"\nbytes one GPU sends per token of its share, per layer, forward, {args.dtype}:")
    say(f"  TP={t}: 2 ring all-reduces of H          {tp_b:>12,.0f}")
    say(f"  EP={e}: dispatch + combine, balanced     {ep_b:>12,.0f}  (counts included; {args.tokens} tokens per GPU)")
    if nodes > 1:
        node_b = node_bytes_per_token(c, nodes, args.gpus_per_node, args.max_nodes, b, args.tokens)
        say(f"  EP={e} across {nodes} nodes, <= {args.max_nodes} nodes per token {node_b:>8,.0f}  (InfiniBand)")


def main(argv=None):
    args = parse_valid_args(build_parser(), validate, argv, world=1)
    report(args, load_config(args.config)[0])
    return 0


if __name__ == "__main__":
    sys.exit(main())
