"""Lesson 9's fair race: the three versions `bench train` times compute the same training.

One torchrun launch (tp=2, a tiny GPT whose vocabulary of 67 splits unevenly) trains ours,
PyTorch's DTensor plan with the vocabulary replicated, and the DTensor plan with the same
vocabulary sharding as ours (gpt.dtensor_plan.vocab_plan, loss_parallel), and writes every
step's loss. The reference is computed here: the single-device GPT trained on the same
batches in the same order with the same AdamW, every loss compared under the policy.
"""
import json

import pytest
import torch

from tp_from_scratch.comm.launchers import run_command, torchrun_command
from tp_from_scratch.compare import assert_matches_reference, tolerance
from tp_from_scratch.gpt.data import global_batch
from tp_from_scratch.gpt.model import GPTConfig, init_gpt

SIZES = dict(hidden=32, layers=2, heads=4, kv_heads=2, seq_len=16, vocab_size=67, batch_size=4)
STEPS, WARMUP, ROUNDS = 3, 1, 2


def single_device_losses(config):
    """Losses of the single-device GPT over bench train's schedule: the warmup steps, then
    ROUNDS passes over the STEPS batches (AdamW lr 1e-3, as bench train)."""
    model = init_gpt(config, 0)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3, foreach=False)
    batches = [global_batch(s, SIZES["batch_size"], config.seq_len, config.vocab_size, 0) for s in range(STEPS)]
    losses = []
    for x, y in batches[:WARMUP] + batches * ROUNDS:
        optimizer.zero_grad(set_to_none=True)
        _, loss = model(x, y)
        loss.backward()
        optimizer.step()
        losses.append(loss.detach())
    return losses


@pytest.mark.slow
@pytest.mark.timeout(150)
def test_vocab_sharded_dtensor_plan_trains_like_ours_and_single_device(tmp_path):
    out = tmp_path / "losses.json"
    flags = [f"--{k.replace('_', '-')}={v}" for k, v in SIZES.items()]
    cmd = torchrun_command(2, "tp_from_scratch.bench", "train", *flags, f"--steps-per-round={STEPS}",
                           f"--warmup={WARMUP}", f"--rounds={ROUNDS}", f"--losses={out}")
    result = run_command(cmd, timeout=120)
    assert result.returncode == 0, result.stdout[-4000:]
    assert "ratio scratch / dtensor-vocab" in result.stdout and "ratio scratch / dtensor " in result.stdout
    losses = json.loads(out.read_text())["losses"]
    config = GPTConfig(vocab_size=SIZES["vocab_size"], seq_len=SIZES["seq_len"], n_layers=SIZES["layers"],
                       hidden=SIZES["hidden"], n_heads=SIZES["heads"], n_kv_heads=SIZES["kv_heads"])
    reference = single_device_losses(config)
    assert set(losses) == {"scratch", "dtensor", "dtensor-vocab"}
    for name, got in losses.items():
        assert len(got) == len(reference), f"{name}: {len(got)} losses, expected {len(reference)}"
        for step, (g, r) in enumerate(zip(got, reference)):
            assert_matches_reference(torch.tensor(g, dtype=torch.float32), r,
                                     name=f"{name}: loss at step {step} against single device",
                                     tol=tolerance("float32", layers=config.n_layers, steps=step))
