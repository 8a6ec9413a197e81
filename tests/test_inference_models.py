"""Lesson 14: the TP inference GPT with Sync-Point Drop and with quantized all-reduces equals its
single-device emulation (the full weights, the rank partition explicit) at float64, and sends
the bytes forward_bytes predicts; with no dropped block and 16 bits it is the ordinary GPT.

Two models: the course's GPT (LayerNorm, biases, learned positions, 12 heads, so t = 3 divides
them) at t = 2, 3, 4, and Llama (RMSNorm, RoPE, SwiGLU, no biases, 2 KV heads, replicated at
t = 4) at t = 2, 4. A quantized model is checked at the policy's float64 bound: every QDQ sees
bit-identical inputs on both sides (one rounding that flipped would cost a whole quantization
step, orders of magnitude above the bound); only the LM head's matmul on a vocabulary shard
rounds differently from the full one.
"""
import pytest
import torch

from tp_from_scratch.comm import SPMDError, run_spmd
from tp_from_scratch.compare import assert_matches_reference, tolerance
from tp_from_scratch.gpt.generate import generate
from tp_from_scratch.gpt.model import GPTConfig, init_gpt
from tp_from_scratch.inference.emulation import partitioned_forward
from tp_from_scratch.inference.models import (forward_bytes, inference_gpt, sensitivity_order, tensor_parallel_gpt,
                                              zero_shot_blocks)
from tp_from_scratch.inference.quantized import reference_reduce

LAYERS = 3
CONFIGS = {"gpt": GPTConfig(arch="gpt", vocab_size=29, seq_len=8, n_layers=LAYERS, hidden=48, n_heads=12,
                            n_kv_heads=12, ffn=96),
           "llama": GPTConfig(arch="llama", vocab_size=29, seq_len=8, n_layers=LAYERS, hidden=48, n_heads=12,
                              n_kv_heads=2, ffn=96),
           # heads, KV heads and FFN that t = 3 and 4 split unevenly (KV heads 2, 2, 1 and 2, 1, 1, 1)
           "uneven": GPTConfig(arch="llama", vocab_size=29, seq_len=8, n_layers=LAYERS, hidden=40, n_heads=10,
                               n_kv_heads=5, ffn=50)}
# (SPD blocks, bits, group size, scheme)
VARIANTS = {"spd": ((0, 2), 16, 128, "two_step"), "two_step": ((), 4, 16, "two_step"),
            "all_gather": ((), 6, 7, "all_gather"), "spd+8bit": ((1,), 8, 16, "two_step")}
BOUND = tolerance("float64", layers=LAYERS)


def model_and_tokens(arch):
    gpt = init_gpt(CONFIGS[arch], 146, torch.float64).eval()
    idx = torch.randint(0, 29, (2, 8), generator=torch.Generator().manual_seed(147))
    return gpt, idx


def tp_logits(gpt, idx, t, spd, bits, group_size, scheme):
    """Every rank's (B, T, V/t) logits side by side, and each rank's bytes sent in the forward."""
    def on_rank(comm):
        model = inference_gpt(comm, gpt, spd, bits, group_size, scheme)
        comm.meter.reset()
        with torch.no_grad():
            logits, _ = model(idx)
        return logits, comm.meter.bytes_sent

    results = run_spmd(on_rank, t)
    return torch.cat([r[0] for r in results], dim=-1), [r[1] for r in results]


# every variant at an even and an odd t or on both models; t = 4 replicates Llama's 2 KV heads
CASES = [("spd", "gpt", 2), ("spd", "gpt", 3), ("spd", "llama", 4), ("two_step", "gpt", 4), ("two_step", "gpt", 3),
         ("two_step", "llama", 2), ("all_gather", "gpt", 2), ("all_gather", "llama", 4), ("spd+8bit", "gpt", 3),
         ("spd+8bit", "llama", 2), ("spd", "uneven", 3), ("two_step", "uneven", 4), ("all_gather", "uneven", 3)]


@pytest.mark.parametrize("name, arch, t", CASES)
def test_tp_inference_gpt_equals_its_emulation(name, arch, t):
    gpt, idx = model_and_tokens(arch)
    plain, _ = gpt(idx)
    spd, bits, group_size, scheme = VARIANTS[name]
    got, sent = tp_logits(gpt, idx, t, spd, bits, group_size, scheme)
    emulated = partitioned_forward(gpt, idx, t, spd, reference_reduce(bits, group_size, scheme))
    assert_matches_reference(got, emulated, name=f"{arch} t={t} {name}: logits", tol=BOUND)
    # not vacuous: each variant computes another function than the ordinary GPT
    assert (got - plain).abs().max() > 1e3 * BOUND, f"{arch} t={t} {name} equals the ordinary GPT"
    for rank, n in enumerate(sent):
        want = forward_bytes(CONFIGS[arch], t, rank, idx.numel(), 8, spd, bits, group_size, scheme)
        assert n == want, f"{arch} t={t} {name} rank {rank}: sent {n} bytes, formula {want}"


@pytest.mark.parametrize("arch, t", [("gpt", 1), ("gpt", 3), ("llama", 4)])
def test_no_dropped_block_and_16_bits_is_the_ordinary_gpt(arch, t):
    gpt, idx = model_and_tokens(arch)
    plain, _ = gpt(idx)
    got, sent = tp_logits(gpt, idx, t, (), 16, 128, "two_step")
    assert_matches_reference(got, plain, name="TP inference GPT", tol=BOUND)
    assert_matches_reference(partitioned_forward(gpt, idx, t), plain, name="emulation", tol=BOUND)
    if t == 1:  # one rank: an SPD block is the ordinary block, and nothing is quantized
        for spd, bits in [((0, 1, 2), 16), ((), 4), ((1,), 2)]:
            got, _ = tp_logits(gpt, idx, 1, spd, bits, 8, "two_step")
            assert_matches_reference(got, plain, name=f"t=1 SPD {spd}, {bits} bits", tol=BOUND)


def test_spd_generation_with_the_kv_cache_equals_the_emulation_on_the_whole_sequence():
    # SPD's block reads the cache like Lesson 6's; decoding token by token must pick what the
    # emulation picks from the whole sequence at every step (greedy, t = 2)
    gpt, idx = model_and_tokens("llama")
    prompt = idx[:1, :4]

    def on_rank(comm):
        return generate(inference_gpt(comm, gpt, (1,), 4, 16), prompt, 3)

    ids = prompt
    for _ in range(3):
        logits = partitioned_forward(gpt, ids, 2, (1,), reference_reduce(4, 16))
        ids = torch.cat([ids, logits[:, -1].argmax(-1, keepdim=True)], dim=1)
    for rank, got in enumerate(run_spmd(on_rank, 2)):
        assert torch.equal(got, ids), f"rank {rank}: {got.tolist()} != {ids.tolist()}"


def test_sensitivity_order_goes_back_to_front():
    calls = []
    costs = {(): 10.0, (3,): 10.5, (2, 3): 13.0, (1, 2, 3): 13.1, (0, 1, 2, 3): 20.0}

    def evaluate(blocks):
        calls.append(blocks)
        return costs[blocks]

    order, sensitivity = sensitivity_order(evaluate, 4)
    assert calls == [(), (3,), (2, 3), (1, 2, 3), (0, 1, 2, 3)]
    assert sensitivity == pytest.approx({3: 0.5, 2: 2.5, 1: 0.1, 0: 6.9})
    assert order == [1, 3, 2, 0] and zero_shot_blocks(order, 2) == (1, 3)
    with pytest.raises(ValueError, match="k must be"):
        zero_shot_blocks(order, 5)


def test_bad_blocks_and_settings_are_named():
    gpt, _ = model_and_tokens("gpt")
    for spd, bits, needle in [((3,), 16, "spd_blocks"), ((1, 1), 16, "spd_blocks"), ((-1,), 16, "spd_blocks"),
                              ((), 5.0, "bits")]:
        with pytest.raises(SPMDError, match=needle):
            run_spmd(lambda comm: inference_gpt(comm, gpt, spd, bits), 2)
    # the ordinary model is built in one place, and inference_gpt starts from it
    names = run_spmd(lambda comm: sorted(tensor_parallel_gpt(comm, gpt).state_dict()), 2)[0]
    assert names == sorted(run_spmd(lambda comm: inference_gpt(comm, gpt, (0,), 4).state_dict(), 2)[0])


@pytest.mark.slow  # one launch: the native gloo collectives behind the same code
@pytest.mark.timeout(300)
def test_sampling_quantized_reduces_and_spd_on_gloo_under_torchrun():
    from tp_from_scratch.comm.launchers import run_command, torchrun_command
    result = run_command(torchrun_command(2, "tp_from_scratch.inference.check"), timeout=240)
    assert result.returncode == 0, result.stdout[-3000:]
    for check in ("check_sampling", "check_model", "check_quantized"):
        assert f"{check}: ok at t=2 (gloo)" in result.stdout, result.stdout[-3000:]
