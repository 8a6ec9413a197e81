"""Lesson 14: the planner's inference mode counts what the model holds and sends, and its times
move the way their formulas say. No test here asserts a measured time (the benchmark prints
those): every expected number is counted from a built model, its KV cache or the formulas.
"""
import math

import pytest
import torch

from tp_from_scratch.comm import run_spmd
from tp_from_scratch.cost.model import all_reduce_seconds
from tp_from_scratch.gpt.model import GPTConfig, KVCache, init_gpt
from tp_from_scratch.inference import planner
from tp_from_scratch.inference.latency import (PROFILES, decode_step, decode_table, kv_cache_bytes, load_profile,
                                               matmul_weights, memory_per_rank, prefill)
from tp_from_scratch.inference.models import tensor_parallel_gpt

SMALL = GPTConfig(arch="llama", vocab_size=37, seq_len=16, n_layers=2, hidden=32, n_heads=8, n_kv_heads=2, ffn=64)
TIED = GPTConfig(arch="gpt", vocab_size=37, seq_len=16, n_layers=2, hidden=32, n_heads=8, n_kv_heads=2, ffn=64)
LLAMA_70B = GPTConfig(arch="llama", vocab_size=128256, seq_len=8192, n_layers=80, hidden=8192, n_heads=64,
                      n_kv_heads=8, ffn=28672)


def held_by_ranks(config, t, prompt=5):
    """Per rank of a built TP model: (elements of the weights its matmuls read, its KV cache bytes
    after a prefill of ``prompt`` tokens and one decode step of B = 3 sequences)."""
    gpt = init_gpt(config, 148).eval()

    def on_rank(comm):
        model = tensor_parallel_gpt(comm, gpt)
        linears = sum(m.weight.numel() for m in model.modules() if isinstance(m, torch.nn.Linear)
                      or type(m).__name__.endswith("ParallelLinear"))
        head = model.head_weight().numel() if config.tie_embeddings else 0
        cache = KVCache(config.n_layers)
        with torch.no_grad():
            model(torch.zeros(3, prompt, dtype=torch.long), cache=cache)
            model(torch.zeros(3, 1, dtype=torch.long), cache=cache)
        return linears + head, sum(k.nbytes + v.nbytes for k, v in zip(cache.k, cache.v))

    return run_spmd(on_rank, t)


@pytest.mark.parametrize("config", [SMALL, TIED], ids=["llama-untied", "gpt-tied"])
@pytest.mark.parametrize("t", [1, 2, 4])
def test_weights_and_kv_cache_per_rank_are_what_a_rank_holds(config, t):
    # t = 4 > 2 KV heads: each rank caches one whole (replicated) KV head
    for rank, (weights, cache) in enumerate(held_by_ranks(config, t)):
        assert matmul_weights(config, t, rank) == weights, f"t={t} rank {rank}: weights read per step"
        assert kv_cache_bytes(config, t, 3, 6, 4) == cache, f"t={t} rank {rank}: KV cache bytes"


def test_seventy_billion_parameters_and_their_cache():
    m1 = memory_per_rank(LLAMA_70B, 1, 1, 8192, 2)
    assert m1["weights"] == 2 * 70_553_706_496  # Llama 3 70B's count (Lesson 9's inventory)
    assert m1["kv_cache"] == 80 * 8192 * 2 * 8 * 128 * 2  # L T (k, v) nkv hs bytes: 327,680 bytes per token
    assert memory_per_rank(LLAMA_70B, 8, 1, 8192, 2)["kv_cache"] == m1["kv_cache"] // 8


def test_published_call_latencies_come_back():
    # each GPU profile's alpha per message is its published per-call latency / 2(t-1)
    nvlink = load_profile("h100-nvlink")
    for t, seconds in [(2, 8.7e-6), (4, 9.2e-6), (8, 11.8e-6)]:
        assert all_reduce_seconds(nvlink, "native", 0, t) == pytest.approx(seconds)
    assert all_reduce_seconds(load_profile("h100-infiniband"), "native", 0, 16) == pytest.approx(47e-6)


def test_decode_step_arithmetic_and_limits():
    nvlink = load_profile("h100-nvlink")
    base = decode_step(LLAMA_70B, nvlink, 8, 1, 1024)
    # the terms: weights and cache read at HBM bandwidth; 2L + 1 calls; nothing at t = 1
    assert base["memory_s"] == pytest.approx((base["weights_bytes"] + base["kv_bytes"]) / 3.35e12)
    per_call = all_reduce_seconds(nvlink, "native", 8192 * 2, 8)
    assert base["all_reduce_s"] == pytest.approx(161 * per_call)
    one = decode_step(LLAMA_70B, nvlink, 1, 1, 1024)
    assert one["all_reduce_s"] == one["sampling_s"] == 0
    # more sequences or a longer context never make a step faster
    for t in (1, 2, 8):
        grid = {(b, c): decode_step(LLAMA_70B, nvlink, t, b, c)["step_s"] for b in (1, 8, 64) for c in (128, 4096)}
        assert all(grid[1, c] <= grid[8, c] <= grid[64, c] for c in (128, 4096))
        assert all(grid[b, 128] <= grid[b, 4096] for b in (1, 8, 64))
    # SPD on k blocks removes exactly k calls; dropping every block halves the block calls
    spd = decode_step(LLAMA_70B, nvlink, 8, 1, 1024, spd_blocks=20)
    assert base["all_reduce_s"] - spd["all_reduce_s"] == pytest.approx(20 * per_call)
    # sharded sampling sends fewer bytes than the gathered logits
    sharded = decode_step(LLAMA_70B, nvlink, 8, 1, 1024, sampling="sharded")
    assert sharded["sampling_s"] < base["sampling_s"]


def test_compression_buys_nothing_where_alpha_is_everything():
    # the same number of messages: on a link with no bandwidth cost, 4-bit all-reduces take as
    # long as 16-bit ones; on a slow link they are faster
    free_bytes = dict(load_profile("h100-pcie"), all_reduce={"native": {"alpha_s": 3e-6, "beta_s_per_byte": 0.0}},
                      all_reduce_by_world_size={})
    q = decode_step(LLAMA_70B, free_bytes, 8, 64, 1024, bits=4, group_size=128)
    assert q["all_reduce_s"] == pytest.approx(decode_step(LLAMA_70B, free_bytes, 8, 64, 1024)["all_reduce_s"])
    # CAAT-Net's partial sync (Lesson 8) likewise: fewer channels, as many calls; p = 0 leaves the embedding's
    assert decode_step(LLAMA_70B, free_bytes, 8, 64, 1024, synced_fraction=0.25)["all_reduce_s"] == \
        pytest.approx(q["all_reduce_s"])
    assert decode_step(LLAMA_70B, free_bytes, 8, 64, 1024, synced_fraction=0.0)["all_reduce_s"] == \
        pytest.approx(q["all_reduce_s"] / 161)
    pcie = load_profile("h100-pcie")
    assert decode_step(LLAMA_70B, pcie, 8, 64, 1024, bits=4)["all_reduce_s"] < \
        decode_step(LLAMA_70B, pcie, 8, 64, 1024)["all_reduce_s"]


def test_memory_bound_limit_speeds_up_by_t():
    # with free links, a step that only reads weights gets t times faster (the vocabulary and the
    # KV heads split unevenly or are replicated at large t, so not beyond 8 here)
    free = dict(load_profile("h100-nvlink"), all_reduce={"native": {"alpha_s": 0.0, "beta_s_per_byte": 0.0}},
                all_reduce_by_world_size={})
    steps = {t: decode_step(LLAMA_70B, free, t, 1, 1)["step_s"] for t in (1, 2, 4, 8)}
    for t in (2, 4, 8):
        assert steps[1] / steps[t] == pytest.approx(t, rel=1e-3)
    # prefill of a long prompt is compute-bound: FLOPs, not bytes, set its time
    p = prefill(LLAMA_70B, free, 8, 1, 4096)
    assert p["compute_s"] > p["memory_s"]


def test_sweep_table_marks_what_does_not_fit():
    rows = decode_table(LLAMA_70B, load_profile("h100-nvlink"), [1, 128], [8192], [1, 2, 4, 8])
    assert not rows[0]["fits"][1] and rows[0]["fits"][2]                  # 141 GB of weights
    assert rows[1]["smallest_fit"] == 8                                 # 128 x 8192 tokens of cache
    assert math.isclose(rows[0]["speedup"], rows[0]["steps"][1] / rows[0]["steps"][8])


def test_planner_command_line(capsys):
    argv = ["--arch", "llama", "--vocab-size", "128256", "--layers", "80", "--hidden", "8192", "--heads", "64",
            "--kv-heads", "8", "--ffn", "28672", "--context", "1024", "--profile", "h100-nvlink", "--sweep"]
    assert planner.main(argv) == 0
    out = capsys.readouterr().out
    assert "141.11" in out and "decode step (ms) by batch and context" in out
    for bad, needle in [(["--tp", "12"], "--tp 12"), (["--bits", "5", "--bits", "12"], "--bits"),
                        (["--spd-blocks", "81"], "--spd-blocks"), (["--profile", "no/such.json"], "no/such.json"),
                        (["--batch-size", "0"], "--batch-size")]:
        with pytest.raises(SystemExit) as stop:
            planner.main(argv + bad)
        assert stop.value.code == 2 and needle in capsys.readouterr().err
    assert set(PROFILES) == {"h100-nvlink", "h100-pcie", "h100-infiniband"}


def test_flops_are_lesson_9s_forward_flops():
    # a decode step of B sequences with one cached token is Lesson 9's forward of B one-token
    # sequences (its attention counts the full T x T square: 1 x 1 here); a prefill is its forward
    from dataclasses import replace

    from tp_from_scratch.cost.model import forward_flops
    nvlink = load_profile("h100-nvlink")
    for t in (1, 2, 8):
        one = replace(LLAMA_70B, seq_len=1)
        assert decode_step(LLAMA_70B, nvlink, t, 4, 1)["flops"] == forward_flops(one, "llama", 4, t)
        assert prefill(LLAMA_70B, nvlink, t, 2, 512)["flops"] == forward_flops(replace(LLAMA_70B, seq_len=512),
                                                                                "llama", 2, t)
