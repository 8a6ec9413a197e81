"""Lesson 7, torch: the sequence-parallel GPT is the tensor-parallel GPT, with 1/t of the activations.

Story: SequenceParallelGPT reuses the TP model's modules, so (1) its state dict IS the TP
model's, (2) training it gives the single-device losses and weights (float64, simulated
ranks, T not divisible by t), and (3) the bytes autograd saves for backward per block,
measured with saved_tensors_hooks, equal the formula of sequence_parallel.memory exactly,
for one device, TP, TP+SP and TP+SP with selective recomputation, at t = 1, 2, 4.
"""
import copy

import pytest
import torch

from tp_from_scratch.comm import SPMDError, run_spmd
from tp_from_scratch.compare import assert_matches_reference, tolerance
from tp_from_scratch.gpt.model import GPTConfig, init_gpt
from tp_from_scratch.gpt.parallelize import gpt_to_tp, shard_state_dict
from tp_from_scratch.sequence_parallel.memory import block_activation_bytes, saved_bytes_per_block
from tp_from_scratch.sequence_parallel.model import gpt_to_sp
from tp_from_scratch.sequence_parallel.nn import gather_from_sequence_parallel_region

# nkv = 2: at t = 4 each KV head is held by two ranks; T = 15 splits unevenly over 2 and 4
CONFIG = GPTConfig(vocab_size=67, seq_len=16, n_layers=2, hidden=32, n_heads=4, n_kv_heads=2)
B, T, STEPS = 2, 15, 3
LR = 1e-2


def batches(seed=1):
    gen = torch.Generator().manual_seed(seed)
    return [(torch.randint(0, CONFIG.vocab_size, (B, T), generator=gen),
             torch.randint(0, CONFIG.vocab_size, (B, T), generator=gen)) for _ in range(STEPS)]


def train(model, data):
    """AdamW steps; returns (losses, state dict after training)."""
    optimizer = torch.optim.AdamW(model.parameters(), lr=LR)
    losses = []
    for idx, targets in data:
        _, loss = model(idx, targets)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        losses.append(loss.detach())
    return losses, model.state_dict()


@pytest.mark.parametrize("t,recompute,arch", [(2, False, "gpt"), (4, False, "gpt"), (2, True, "gpt"),
                                               (4, True, "llama"), (2, False, "gpt2")])
def test_sequence_parallel_training_equals_single_device(t, recompute, arch):
    # recompute: selective recomputation, the attention core run again in backward;
    # llama: RMSNorm (weight only), RoPE, SwiGLU (gate and up share one all-gather)
    config = GPTConfig(vocab_size=67, seq_len=16, n_layers=2, hidden=32, n_heads=4, n_kv_heads=2, arch=arch)
    assert arch != "llama" or (config.norm, config.position, config.mlp) == ("rmsnorm", "rope", "swiglu")
    reference = init_gpt(config, seed=0, dtype=torch.float64)
    data = batches()
    expected_losses, expected_weights = train(copy.deepcopy(reference), data)

    def on_rank(comm):
        losses, weights = train(gpt_to_sp(comm, reference, recompute_attention=recompute), data)
        mine = shard_state_dict(expected_weights, t, comm.rank, config)
        # the policy's growth rule: the loss of step k has been through n_layers blocks and k steps
        for step, (got, want) in enumerate(zip(losses, expected_losses)):
            assert_matches_reference(got, want, name=f"loss at step {step}", rank=comm.rank,
                                     tol=tolerance(torch.float64, layers=config.n_layers, steps=step))
        # after the steps every shard still equals the single-device weights' shard: the
        # LayerNorm and row-bias gradients (Partial under SP) were all-reduced. AdamW turns the
        # roundoff of a near-zero gradient entry into a weight error up to lr / eps times larger
        # (compare.py's growth rule; measured here: blocks.0.attn.v.weight, llama, t = 4)
        weight_tol = tolerance(torch.float64, layers=config.n_layers, steps=STEPS, adamw_lr=LR)
        for name, tensor in mine.items():
            assert_matches_reference(weights[name], tensor, name=name, rank=comm.rank, tol=weight_tol)
        return len(weights)

    assert run_spmd(on_rank, t) == [len(expected_weights)] * t


def test_the_state_dict_is_the_tensor_parallel_one():
    reference = init_gpt(CONFIG, seed=0, dtype=torch.float32)

    def on_rank(comm):
        tp, sp = gpt_to_tp(comm, reference).state_dict(), gpt_to_sp(comm, reference).state_dict()
        assert list(sp) == list(tp), f"rank {comm.rank}: names differ"
        for name in tp:
            assert_matches_reference(sp[name], tp[name], name=name, rank=comm.rank, exact=True)

    run_spmd(on_rank, 2)


def selective(comm, model):
    return gpt_to_sp(comm, model, recompute_attention=True)


def measured_and_formula(build, t, dtype, sequence_parallel, recompute=False):
    reference = init_gpt(CONFIG, seed=0, dtype=dtype)
    idx, targets = batches()[0]
    itemsize = torch.empty(0, dtype=dtype).element_size()

    def on_rank(comm):
        measured = saved_bytes_per_block(build(comm, reference), idx, targets)
        formula = sum(block_activation_bytes(CONFIG, B, T, itemsize, t, comm.rank, sequence_parallel,
                                             recompute_attention=recompute).values())
        return [measured[i] for i in range(CONFIG.n_layers)], formula

    return run_spmd(on_rank, t)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
@pytest.mark.parametrize("t", [1, 2, 4])
def test_activation_bytes_measured_equal_the_formula(t, dtype):
    single = saved_bytes_per_block(init_gpt(CONFIG, 0, dtype), *batches()[0])
    itemsize = torch.empty(0, dtype=dtype).element_size()
    assert [single[i] for i in range(CONFIG.n_layers)] == [
        sum(block_activation_bytes(CONFIG, B, T, itemsize).values())] * CONFIG.n_layers
    for name, build, sp, recompute in (("TP", gpt_to_tp, False, False), ("TP+SP", gpt_to_sp, True, False),
                                       ("TP+SP+selective", selective, True, True)):
        for rank, (per_block, formula) in enumerate(measured_and_formula(build, t, dtype, sp, recompute)):
            assert per_block == [formula] * CONFIG.n_layers, \
                f"{name} t={t} rank {rank}: measured {per_block}, formula {formula}"


def test_a_shard_that_breaks_the_array_split_rule_is_refused():
    def on_rank(comm):
        return gather_from_sequence_parallel_region(comm, torch.zeros(1, 1 + 2 * comm.rank, 4), [1, 3])

    with pytest.raises(SPMDError, match=r"rank \d: sequence shard of length \d"):
        run_spmd(on_rank, 2)
