"""Activation memory, measured: the bytes each transformer block saves for backward.

    .venv/bin/python -m tp_from_scratch.sequence_parallel.memory    # the table, measured vs formula, t = 1..8

``saved_bytes_per_block(model, idx, targets)`` runs one forward under
``torch.autograd.graph.saved_tensors_hooks``: every tensor autograd keeps for backward passes
through the pack hook, which books the bytes of its storage once (q, k and v reading the same
input book it once), skipping the parameters' storages (weights are not activations), to
the block running at that moment (module hooks on ``model.blocks``). The same model code
runs single-device, tensor-parallel and sequence-parallel, so the three are measured alike.

``block_activation_bytes(...)`` is the formula for THIS model (gpt/model.py), term by term,
per rank; the lesson prints measured / formula, which must be exactly 1. With e the dtype's
itemsize, B batch, T sequence (T_r this rank's positions), H hidden, F ffn, nh heads:

    tensor                                    single / TP (t ranks)   TP + SP
    ln1, ln2 inputs x, h                      2 e B T H                2 e B T_r H
    ln1, ln2 mean and 1/std                   4 e B T                  4 e B T_r
    inputs of q|k|v and of fc (a, m)          2 e B T H                2 e B T_r H  (re-gathered
                                                                       in backward, not kept)
    q, k, v (k, v repeated to the nh query    3 e B T H / t            same
      heads: GQA saves no memory here), o's
      input y
                                              + e B T H / t            same
    softmax output                            e B nh T^2 / t           same
    causal mask (bool, not per batch/head)    T^2                      same
    GeLU input, proj input                    2 e B T F / t            same

Korthikanti et al. (2022) count sbh(34 + 5as/h) bytes per layer for GPT-3 in 16-bit: the
same tensors plus dropout (a 1-byte mask after attention, after the MLP, and on the attention
probabilities, whose output is kept too), minus LayerNorm's statistics and the causal mask.
Our model has no dropout; see ``korthikanti_bytes`` for their formulas.
"""
from collections import defaultdict

import torch

from tp_from_scratch.sharding import shard_sizes


def saved_bytes_per_block(model, idx, targets):
    """{block index: bytes saved for backward, "outside": the rest (embeddings, head, loss)}.

    One forward pass; nothing is run backward. Each storage counts once, where it is first saved.
    """
    params = {p.untyped_storage().data_ptr() for p in model.parameters()}
    seen, booked, where = set(), defaultdict(int), ["outside"]

    def pack(t):
        storage = t.untyped_storage()
        key = storage.data_ptr()
        if storage.nbytes() and key not in params and key not in seen:
            seen.add(key)  # the graph keeps it alive, so no other storage takes this address
            booked[where[0]] += storage.nbytes()
        return t

    def enter(i):
        return lambda module, args: where.__setitem__(0, i)

    handles = []
    for i, block in enumerate(model.blocks):
        handles.append(block.register_forward_pre_hook(enter(i)))
        handles.append(block.register_forward_hook(lambda module, args, out: where.__setitem__(0, "outside")))
    try:
        with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
            _, loss = model(idx, targets)  # ``loss`` keeps the graph, and every saved tensor, alive
        return dict(booked)
    finally:
        for h in handles:
            h.remove()


def block_activation_bytes(config, batch, seq, itemsize, tp=1, rank=0, sequence_parallel=False,
                           save_gathered=False, recompute_attention=False):
    """Bytes one block saves for backward on rank ``rank``, by the table in the module docstring.

    config: a GPTConfig (hidden, ffn, n_heads); seq: the full T; itemsize: bytes per element
    of the activations (4 for float32, 8 for float64; LayerNorm's statistics share it).
    recompute_attention (selective recomputation, SP model only): q, k, v are kept as the
    projections made them (k, v with this rank's KV heads, not repeated), and the softmax
    output and causal mask are not kept at all.
    Returns {term: bytes}; sum the values for the total.
    """
    B, T, H, F, nh, t, e = batch, seq, config.hidden, config.ffn, config.n_heads, tp, itemsize
    T_r = shard_sizes(T, t)[rank] if sequence_parallel else T  # positions this rank holds
    T_in = T if save_gathered or not sequence_parallel else T_r
    if recompute_attention:
        kv_local = max(config.n_kv_heads // t, 1) * config.head_size  # a replicated KV head when nkv < t
        return {
            "LayerNorm inputs": 2 * e * B * T_r * H,
            "LayerNorm mean, 1/std": 4 * e * B * T_r,
            "column-layer inputs": 2 * e * B * T_in * H,
            "q, o input": 2 * e * B * T * H // t,
            "k, v (not repeated)": 2 * e * B * T * kv_local,
            "GeLU input, proj input": 2 * e * B * T * F // t,
        }
    return {
        "LayerNorm inputs": 2 * e * B * T_r * H,
        "LayerNorm mean, 1/std": 4 * e * B * T_r,
        "column-layer inputs": 2 * e * B * T_in * H,
        "q, k, v, o input": 4 * e * B * T * H // t,
        "softmax output": e * B * nh * T * T // t,
        "causal mask": T * T if getattr(config, "causal", True) else 0,
        "GeLU input, proj input": 2 * e * B * T * F // t,
    }


def korthikanti_bytes(s, b, h, a, t=1, sequence_parallel=False, selective=False):
    """Per-layer activation bytes of Korthikanti et al. 2022 (Eqs. 1, 2, 4; Table 2), 16-bit.

    s sequence, b batch, h hidden, a heads, t TP degree. selective: the attention core
    (QK^T, softmax, dropout, attention over V) is recomputed in backward.
    """
    scores = 0 if selective else 5 * a * s / h
    if sequence_parallel:
        return s * b * h / t * (34 + scores)
    return s * b * h * (10 + 24 / t + scores / t)


def measure_block_memory(config, batch, seq, ts=(1, 2, 4), dtype=torch.float32, seed=0):
    """Measured and predicted bytes per block for one device, TP, TP+SP and TP+SP with selective
    recomputation, at each t (simulated ranks).

    Returns rows {"model", "t", "rank", "measured" (every block's bytes), "formula"} for every rank.
    """
    from tp_from_scratch.comm import run_spmd
    from tp_from_scratch.gpt.model import init_gpt
    from tp_from_scratch.gpt.parallelize import gpt_to_tp
    from tp_from_scratch.sequence_parallel.model import gpt_to_sp

    reference = init_gpt(config, seed, dtype)
    gen = torch.Generator().manual_seed(seed)
    idx, targets = (torch.randint(0, config.vocab_size, (batch, seq), generator=gen) for _ in range(2))
    e = torch.empty(0, dtype=dtype).element_size()

    def blocks(measured):
        return [measured[i] for i in range(config.n_layers)]

    rows = [{"model": "single device", "t": 1, "rank": 0,
             "measured": blocks(saved_bytes_per_block(reference, idx, targets)),
             "formula": sum(block_activation_bytes(config, batch, seq, e).values())}]
    def selective(comm, model):
        return gpt_to_sp(comm, model, recompute_attention=True)

    for name, build, sp, recompute in (("TP", gpt_to_tp, False, False), ("TP+SP", gpt_to_sp, True, False),
                                       ("TP+SP+selective", selective, True, True)):
        for t in ts:
            per_rank = run_spmd(lambda comm: blocks(saved_bytes_per_block(build(comm, reference), idx, targets)), t)
            rows += [{"model": name, "t": t, "rank": r, "measured": m,
                      "formula": sum(block_activation_bytes(config, batch, seq, e, t, r, sp,
                                                            recompute_attention=recompute).values())}
                     for r, m in enumerate(per_rank)]
    return rows


def main(batch=4, seq=32, ts=(1, 2, 4, 8)):
    """Print measured and predicted bytes per block for the trainer's default GPT (float32)."""
    from tp_from_scratch.gpt.model import GPTConfig

    rows = measure_block_memory(GPTConfig(), batch, seq, ts)
    print(f"bytes saved for backward per block, GPTConfig() defaults, B={batch}, T={seq}, float32 (rank 0)")
    print(f"{'model':<16} {'t':>2} {'measured':>10} {'formula':>10} {'ratio':>6} {'of t=1':>7}")
    first = {}
    for r in rows:
        assert all(m == r["formula"] for m in r["measured"]), r  # every block, every rank
        if r["rank"] == 0:
            first.setdefault(r["model"], r["measured"][0])
            print(f"{r['model']:<16} {r['t']:>2} {r['measured'][0]:>10,} {r['formula']:>10,} "
                  f"{r['measured'][0] / r['formula']:>6.3f} {r['measured'][0] / first[r['model']]:>7.1%}")


if __name__ == "__main__":
    main()
