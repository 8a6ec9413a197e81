"""The GPT: its config checks, the state-dict conversion, and the TP model under torchrun."""
import pytest
import torch

from tp_from_scratch.compare import assert_matches_reference
from tp_from_scratch.gpt.data import global_batch
from tp_from_scratch.gpt.model import (GPTConfig, init_gpt, shard_axis, shard_state_dict,
                                   unshard_state_dict)
from tp_from_scratch.comm.launchers import run_command, torchrun_command

SMALL = GPTConfig(vocab_size=13, seq_len=8, n_layers=2, hidden=16, n_heads=4, n_kv_heads=2, ffn=24,
                  tie_embeddings=False)


@pytest.mark.parametrize("tp", [1, 2, 3, 4])
def test_shard_then_unshard_is_the_identity(tp):
    # V = 13 splits unevenly for tp = 2, 3, 4; moving data only, so bit-exact
    full = init_gpt(SMALL, seed=tp).state_dict()
    pieces = [shard_state_dict(full, tp, r) for r in range(tp)]
    for name, value in full.items():
        axis = shard_axis(name)
        if axis is not None:
            assert sum(p[name].shape[axis] for p in pieces) == value.shape[axis]
    back = unshard_state_dict(pieces)
    for name, value in full.items():
        assert_matches_reference(back[name], value, name=name, exact=True)


def test_every_parameter_has_the_intended_split():
    names = dict(init_gpt(SMALL, 0).named_parameters())
    assert shard_axis("wte.weight") == 0 and shard_axis("lm_head.weight") == 0
    assert shard_axis("blocks.1.attn.q.weight") == 0 and shard_axis("blocks.1.mlp.fc.bias") == 0
    assert shard_axis("blocks.1.attn.o.weight") == 1 and shard_axis("blocks.1.mlp.proj.weight") == 1
    replicated = {n for n in names if shard_axis(n) is None}
    assert replicated == {"wpe.weight", "ln_f.weight", "ln_f.bias"} | {
        f"blocks.{i}.{m}" for i in range(2) for m in (
            "ln1.weight", "ln1.bias", "ln2.weight", "ln2.bias", "attn.o.bias", "mlp.proj.bias")}


def test_the_gpt_is_causal_and_deterministic():
    x, y = global_batch(0, 2, SMALL.seq_len, SMALL.vocab_size, seed=0)  # (B, T)
    model = init_gpt(SMALL, 0, torch.float64)
    logits, loss = model(x, y)
    assert logits.shape == (2, SMALL.seq_len, SMALL.vocab_size) and loss.ndim == 0
    # changing the last token must not change any earlier position's logits
    x2 = x.clone()
    x2[:, -1] = (x2[:, -1] + 1) % SMALL.vocab_size
    assert_matches_reference(model(x2)[0][:, :-1], logits[:, :-1], name="logits before the change",
                             exact=True)
    assert_matches_reference(init_gpt(SMALL, 0, torch.float64)(x, y)[1], loss, name="loss", exact=True)


@pytest.mark.parametrize("config, tp, message", [
    (GPTConfig(hidden=30, n_heads=6, n_kv_heads=6), 4, "hidden size 30 is not divisible by tp=4"),
    (GPTConfig(hidden=48, n_heads=6, n_kv_heads=3), 2, "n_kv_heads 3 is not divisible by tp=2"),
    (GPTConfig(ffn=102), 4, "ffn size 102 is not divisible by tp=4"),
    (GPTConfig(n_heads=8, n_kv_heads=3), 1, "n_heads 8 is not a multiple of n_kv_heads 3"),
    (GPTConfig(n_kv_heads=4), 8, "tp=8 is larger than n_kv_heads 4"),
    (GPTConfig(), 0, "tp must be at least 1, got 0"),
])
def test_config_errors_name_the_quantity(config, tp, message):
    with pytest.raises(ValueError, match=message):
        config.validate(tp)


@pytest.mark.slow
@pytest.mark.timeout(300)
@pytest.mark.parametrize("nproc", [2, 4])
def test_tp_gpt_equals_single_device_under_torchrun(nproc):
    # logits, loss, every gradient, the parameters after one step, tied and untied, float64
    # and float32: see tp_from_scratch/gpt/checks.py
    out = run_command(torchrun_command(nproc, "tp_from_scratch.gpt.checks"), timeout=280)
    assert out.returncode == 0, out.stdout[-4000:]
    for dtype in ("float64", "float32"):
        assert f"model checks passed (tp={nproc}, {dtype}, tied and untied head)" in out.stdout
