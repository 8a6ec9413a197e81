"""GPT-2 and Llama from the one Block: the key bias, RoPE, SwiGLU, and TP training at t = 1, 2, 4.

The TP forward/backward/step checks of both architectures run in test_model.py through
gpt/checks.py's configs_for (simulated ranks and torchrun); here: what is particular to them.
"""

import pytest
import torch

from single_device import layers_of, single_device_losses
from tp_from_scratch.comm import run_spmd
from tp_from_scratch.compare import assert_matches_reference, tolerance
from tp_from_scratch.gpt import train
from tp_from_scratch.gpt.checks import GPT2, LLAMA
from tp_from_scratch.gpt.data import global_batch
from tp_from_scratch.gpt.arch import shard_axis
from tp_from_scratch.gpt.model import GPTConfig, init_gpt


def test_arch_presets_and_explicit_fields():
    gpt2, llama = GPTConfig(arch="gpt2"), GPTConfig(arch="llama")
    assert (gpt2.norm, gpt2.position, gpt2.mlp, gpt2.gelu, gpt2.bias, gpt2.key_bias, gpt2.tie_embeddings) == \
        ("layernorm", "learned", "gelu", "tanh", True, True, True)
    assert (llama.norm, llama.position, llama.mlp, llama.bias, llama.tie_embeddings, llama.norm_eps) == \
        ("rmsnorm", "rope", "swiglu", False, False, 1e-6)
    assert GPTConfig(arch="llama", tie_embeddings=True).tie_embeddings  # a field set by hand wins
    assert GPTConfig(**llama.to_dict()) == llama                        # a checkpoint's meta round-trips
    with pytest.raises(ValueError, match="arch must be one of"):
        GPTConfig(arch="bert")
    with pytest.raises(ValueError, match="head size 3 is odd"):
        GPTConfig(arch="llama", hidden=12, n_heads=4, n_kv_heads=4).validate()


def test_llama_parameters_and_their_splits():
    names = set(init_gpt(LLAMA, 0).state_dict())
    assert "wpe.weight" not in names and "lm_head.weight" in names
    assert not any(n.endswith("bias") for n in names)
    assert {shard_axis(f"blocks.0.mlp.{m}.weight") for m in ("gate", "up")} == {0}
    assert shard_axis("blocks.0.mlp.down.weight") == 1
    assert shard_axis("blocks.0.ln1.weight") is None and shard_axis("blocks.0.attn.k.bias") == 0


def test_each_architectures_plan_names_every_module_with_parameters_and_builds_its_layers():
    # the sharding plan (gpt.arch.PLANS) is the one place that says how a module is split: every
    # parameter of every architecture's GPT (tied or untied, biases or not) must be named by it,
    # and the TP model's layers are the classes its styles ask for
    from tp_from_scratch.gpt.arch import ARCHS, COLWISE, KV_COLWISE, PLANS, ROWWISE, module_style
    from tp_from_scratch.gpt.parallelize import gpt_to_tp
    from tp_from_scratch.nn import ColumnParallelLinear, RowParallelLinear
    for arch in ARCHS:
        for tied in (True, False):
            config = GPTConfig(arch=arch, tie_embeddings=tied)
            model = init_gpt(config, 0)
            unnamed = [n for n, _ in model.named_parameters() if module_style(n.rpartition(".")[0], arch) is None]
            assert not unnamed, f"{arch}: no entry in PLANS[{arch!r}] for {unnamed}"
            if tied:
                continue  # the untied model has every module of the tied one, and its LM head
            layers = dict(run_spmd(lambda comm: gpt_to_tp(comm, model), 2)[0].named_modules())
            for pattern, style in PLANS[arch].items():
                name = pattern.replace("*", "0")
                if style in (COLWISE, KV_COLWISE, ROWWISE) and name in layers:
                    expected = RowParallelLinear if style == ROWWISE else ColumnParallelLinear
                    assert type(layers[name]) is expected, f"{arch}: {name} is {type(layers[name]).__name__}"


def test_gpt2_key_bias_changes_neither_the_loss_nor_any_other_gradient():
    # q.b_k is added to a whole row of scores; softmax is shift-invariant, so the key bias is
    # exact to drop: same loss, same gradient for every other parameter, and its own is ~0
    model = init_gpt(GPT2, 1, torch.float64)
    x, y = global_batch(0, 4, GPT2.seq_len, GPT2.vocab_size, 1)
    runs = []
    for scale in (0.0, 1.0):
        with torch.no_grad():
            for block in model.blocks:
                block.attn.k.bias.copy_(scale * torch.linspace(-1, 1, block.attn.k.bias.numel()))
        model.zero_grad()
        _, loss = model(x, y)
        loss.backward()
        runs.append((loss.detach(), {n: p.grad.clone() for n, p in model.named_parameters()}))
    (loss0, g0), (loss1, g1) = runs
    assert_matches_reference(loss1, loss0, name="loss with a key bias")
    for name in g0:
        if name.endswith("attn.k.bias"):
            assert_matches_reference(g1[name], torch.zeros_like(g1[name]), name=f"grad of {name}")
        else:
            assert_matches_reference(g1[name], g0[name], name=f"grad of {name} with a key bias")


def test_rope_depends_on_relative_positions_only():
    # q at position m and k at position n meet through the angle (m - n): shifting both by
    # the same amount leaves the score unchanged (here through the model's own tables)
    from tp_from_scratch.gpt.model import apply_rope, rope_tables
    g = torch.Generator().manual_seed(0)
    q, k = torch.randn(2, 1, 1, 8, generator=g, dtype=torch.float64)
    scores = []
    for shift in (0, 7):
        cos, sin = rope_tables(torch.tensor([3 + shift, 1 + shift]), 8, 10000.0, torch.float64)
        scores.append((apply_rope(q, cos[:1], sin[:1]) * apply_rope(k, cos[1:], sin[1:])).sum())
    assert_matches_reference(scores[1], scores[0], name="score after shifting both positions")
    assert not torch.allclose((q * k).sum(), scores[0])  # and RoPE did turn them


@pytest.mark.parametrize("arch,nkv,tp", [("gpt2", 4, 2), ("llama", 2, 4), ("llama", 1, 2)])
def test_architectures_train_like_one_device(arch, nkv, tp):
    # AdamW steps in float64 on the ring collectives follow single-device training; Llama
    # with fewer KV heads than ranks replicates them (their gradients summed over replicas)
    argv = ["--arch", arch, "--dtype", "float64", "--steps", "8", "--kv-heads", str(nkv), "--heads", "4",
            "--hidden", "16", "--seq-len", "16"]
    expected = single_device_losses(argv)
    for rank, losses in enumerate(run_spmd(lambda comm: train.train_on_comm(comm, argv), tp)):
        for step, (got, want) in enumerate(zip(losses, expected)):
            assert_matches_reference(torch.tensor(got, dtype=torch.float64), want,
                                     name=f"{arch} loss at step {step}", rank=rank,
                                     tol=tolerance("float64", layers=layers_of(argv), steps=step))
