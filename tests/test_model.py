"""The GPT: its config checks, the state-dict conversion, and the TP model on simulated ranks
(under torchrun at tp = 4 in `make test-slow`)."""
import pytest
import torch

from tests.slow import only_in_test_slow
from tp_from_scratch.compare import assert_matches_reference, tolerance
from tp_from_scratch.gpt.data import global_batch
from tp_from_scratch.gpt.arch import kv_replicas, shard_axis
from tp_from_scratch.gpt.model import GPTConfig, init_gpt
from tp_from_scratch.gpt.parallelize import shard_state_dict, unshard_state_dict
from dataclasses import replace

from tp_from_scratch.comm import run_spmd
from tp_from_scratch.comm.launchers import run_command, torchrun_command
from single_device import layers_of, single_device_losses
from tp_from_scratch.gpt import train
from tp_from_scratch.gpt.check import check_config, configs_for
from tp_from_scratch.layers import reference
from tp_from_scratch.testing import random_array, rank_rng

SMALL = GPTConfig(vocab_size=13, seq_len=8, n_layers=2, hidden=16, n_heads=4, n_kv_heads=2, ffn=24,
                  tie_embeddings=False)


@pytest.mark.parametrize("tp", [1, 2, 4])
def test_shard_then_unshard_is_the_identity(tp):
    # V = 13 splits unevenly for tp = 2, 4; at tp = 4 each of the 2 KV heads sits on 2 ranks;
    # moving data only, so bit-exact
    full = init_gpt(SMALL, seed=tp).state_dict()
    pieces = [shard_state_dict(full, tp, r, SMALL) for r in range(tp)]
    for name, value in full.items():
        axis = shard_axis(name)
        copies = kv_replicas(SMALL, tp) if ".attn.k." in name or ".attn.v." in name else 1
        if axis is not None:
            assert sum(p[name].shape[axis] for p in pieces) == copies * value.shape[axis], name
    back = unshard_state_dict(pieces, SMALL)
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
    (GPTConfig(hidden=30, n_heads=6, n_kv_heads=6), 7, "tp=7 is larger than n_heads 6: every rank needs at least one"),
    (GPTConfig(hidden=48, n_heads=6, n_kv_heads=3), 4, "tp=4 is larger than n_kv_heads 3 but not a multiple"),
    (GPTConfig(ffn=3), 4, "tp=4 is larger than ffn size 3"),
    (GPTConfig(n_heads=8, n_kv_heads=3), 1, "n_heads 8 is not a multiple of n_kv_heads 3"),
    (GPTConfig(hidden=96, n_heads=12, n_kv_heads=4), 6, "tp=6 is larger than n_kv_heads 4 but not a multiple"),
    (GPTConfig(), 0, "tp must be at least 1, got 0"),
])
def test_config_errors_name_the_quantity(config, tp, message):
    with pytest.raises(ValueError, match=message):
        config.validate(tp)


# In `make test-slow`: make test holds its claims on simulated ranks (the next test: every check
# at tp = 1..4, ring collectives; tests/test_generate.py: generation at every tp) and launched
# by tests/test_train.py (tp = 4 and dp = 2 x tp = 2 on native and from-scratch collectives, float32
# and float64: every step's loss and the trained weights equal one device's)
@pytest.mark.slow
@pytest.mark.timeout(300)
@only_in_test_slow("4 processes on 2 cores")
@pytest.mark.parametrize("nproc", [4])  # t = 2 under torchrun: tests/test_train.py's tp=2 runs
def test_tp_gpt_equals_single_device_under_torchrun(nproc):
    # logits, loss, every gradient, the parameters after one step, tied and untied, one KV
    # head replicated on every rank, float64 and float32, native and from-scratch collectives:
    # see tp_from_scratch/gpt/check.py
    out = run_command(torchrun_command(nproc, "tp_from_scratch.gpt.check"), timeout=280)
    assert out.returncode == 0, out.stdout[-4000:]
    for dtype in ("float64", "float32"):
        assert f"model checks passed (tp={nproc}, {dtype}, native collectives" in out.stdout
    assert f"model checks passed (tp={nproc}, float64, from-scratch collectives)" in out.stdout
    assert f"generation checks passed (tp={nproc}" in out.stdout


@pytest.mark.parametrize("tp", [1, 2, 3, 4])
def test_tp_gpt_equals_single_device_on_simulated_ranks(tp):
    # the same checks as under torchrun, on in-process ranks with the ring collectives; at
    # tp = 3 the heads, KV heads and FFN widths of these configs split unevenly (whole heads)
    for config in configs_for(tp):
        run_spmd(lambda comm: check_config(comm, config, torch.float64), tp)


@pytest.mark.parametrize("nkv,tp", [(2, 4), (1, 2), (1, 4)])
def test_replicated_kv_heads_train_like_one_device(nkv, tp):
    # fewer KV heads than ranks: each KV head's weights sit on tp/nkv ranks, whose gradients
    # are summed among them. Five AdamW steps in float64 on the ring collectives must follow
    # single-device training, and the copies must stay identical.
    argv = ["--dtype", "float64", "--steps", "5", "--kv-heads", str(nkv), "--heads", "4", "--hidden", "16"]
    expected = single_device_losses(argv)
    for rank, losses in enumerate(run_spmd(lambda comm: train.train_on_comm(comm, argv), tp)):
        for step, (got, want) in enumerate(zip(losses, expected)):
            assert_matches_reference(torch.tensor(got, dtype=torch.float64), want, name=f"loss at step {step}",
                                     rank=rank, tol=tolerance("float64", layers=layers_of(argv), steps=step))


def test_the_torch_block_equals_the_numpy_block_on_the_same_weights():
    # Lesson 4's numpy block and Lesson 6's torch Block are one model: same parameter names
    # (numpy holds W as (in, out), torch as (out, in)), same biases, the tanh GeLU
    config = replace(SMALL, gelu="tanh")
    block = init_gpt(config, 3, torch.float64).blocks[0]
    x = torch.tensor(random_array(rank_rng(3), (2, config.seq_len, config.hidden)), requires_grad=True)
    y = block(x)
    dy = random_array(rank_rng(4), tuple(y.shape))
    y.backward(torch.tensor(dy))
    params = reference.params_from_torch({k: v.detach() for k, v in block.state_dict().items()})
    y_np, cache = reference.block_forward(x.detach().numpy(), params, config)
    dx_np, grads = reference.block_backward(dy, cache)
    assert_matches_reference(y.detach().numpy(), y_np, name="block output")
    assert_matches_reference(x.grad.numpy(), dx_np, name="dX")
    torch_grads = reference.params_from_torch({n: p.grad for n, p in block.named_parameters()})
    assert set(torch_grads) == set(grads)
    for name, g in grads.items():
        assert_matches_reference(torch_grads[name], g, name=f"grad of {name}")
