"""Graders for Exercise 6: the tensor-parallel block in a training step, and its all-reduces.

The block: t simulated ranks (run_spmd) each build theirs from the same single-device
gpt.model.Block with random weights and biases, run forward, a replicated loss, backward and
one SGD step; every rank's output, input gradient, parameter gradients and updated weights
must equal its shard of the single-device ones (float64), the meter must show 2 all-reduces
each way, and the single-device block must be unchanged (your parameters are copies).

The account: a whole TP GPT step (gpt.parallelize.gpt_to_tp, its blocks replaced by
yours) runs on every rank, and the meter's all-reduce calls and bytes sent, forward and
backward, on EVERY rank, must equal your list. B*T = 10 tokens: at t = 3 and 4 the loss's
all-reduces split unevenly, so the ranks send different byte counts.
"""
from collections import Counter
from dataclasses import asdict

import pytest
import torch

from tp_from_scratch.compare import assert_matches_reference
from tp_from_scratch.gpt.model import GPT, GPTConfig, init_gpt
from tp_from_scratch.gpt.parallelize import gpt_to_tp, shard_tensor
from tp_from_scratch.sharding import shard_sizes
from tp_from_scratch.testing import random_array, rank_rng
from tp_from_scratch.tools.grading import assert_not_aliased, collective_calls, expected_calls, run_graded

WORLD_SIZES = [1, 2, 3, 4]
B = 2
# every t above divides n_heads, n_kv_heads, hidden and ffn; V = 29 is prime (uneven vocab)
CONFIG = dict(vocab_size=29, seq_len=5, n_layers=2, hidden=24, n_heads=12, n_kv_heads=12, ffn=48)
LR = 0.1


def config():
    return GPTConfig(**CONFIG)


def random_block(dtype):
    """A single-device Block whose every weight, bias and norm parameter is random (numpy-drawn)."""
    block = GPT(config()).blocks[0].to(dtype)
    rng = rank_rng(80, 0)
    with torch.no_grad():
        for p in block.parameters():
            p.copy_(torch.tensor(random_array(rng, tuple(p.shape)), dtype=dtype))
    return block


def mse(y, target):
    return ((y - target) ** 2).mean()  # the same number on every rank: y and target are replicated


def block_step(comm, impl):
    dtype = torch.float64
    single = random_block(dtype)
    source = {name: p.detach().clone() for name, p in single.named_parameters()}
    rng = rank_rng(81, 0)  # replicated data: rank 0's stream on every rank
    x = torch.tensor(random_array(rng, (B, CONFIG["seq_len"], CONFIG["hidden"])), dtype=dtype)
    target = torch.tensor(random_array(rng, tuple(x.shape)), dtype=dtype)
    x_given = x.clone()

    x_ref = x.clone().requires_grad_()
    y_ref = single(x_ref)
    mse(y_ref, target).backward()
    grads_ref = {name: p.grad.clone() for name, p in single.named_parameters()}
    single.zero_grad(set_to_none=True)

    tp = impl.tp_block(comm, single, config())
    names = sorted(n for n, _ in tp.named_parameters())
    assert names == sorted(source), f"rank {comm.rank}: tp_block's parameters {names}, expected {sorted(source)}"
    for name, param in tp.named_parameters():  # each by name: a shared LayerNorm names its weight
        assert_not_aliased(param, list(single.parameters()), f"tp_block's {name}", comm.rank)
    xt = x.clone().requires_grad_()
    comm.meter.reset()
    y = tp(xt)
    forward = collective_calls(comm, reset=True)
    mse(y, target).backward()
    backward = collective_calls(comm, reset=True)
    grads = {name: p.grad.clone() for name, p in tp.named_parameters()}
    with torch.no_grad():  # one SGD step, by hand (building a torch.optim optimizer imports torch._dynamo: seconds)
        for p in tp.parameters():
            p -= LR * p.grad
    # the single-device block was only read: the TP step must not have moved it
    for name, p in single.named_parameters():
        assert torch.equal(p.detach(), source[name]), (
            f"rank {comm.rank}: the single-device block's {name} changed (in tp_block, or when your "
            f"block trained): tp_block must copy every parameter (LayerNorms too), never share or edit them")
    assert torch.equal(x, x_given), f"rank {comm.rank}: the block's input x was modified"
    return dict(y=y.detach(), y_ref=y_ref.detach(), dx=xt.grad, dx_ref=x_ref.grad, grads=grads,
                grads_ref=grads_ref, weights={n: p.detach() for n, p in tp.named_parameters()},
                source=source, forward=forward, backward=backward)


@pytest.mark.parametrize("t", WORLD_SIZES)
def test_tp_block_trains_like_the_single_device_block(impl, t):
    cfg = config()
    for rank, r in enumerate(run_graded(block_step, t, impl)):
        assert_matches_reference(r["y"], r["y_ref"], name="block output", rank=rank)
        assert_matches_reference(r["dx"], r["dx_ref"], name="block dX (needs f's all-reduce)", rank=rank)
        for name, grad in r["grads"].items():
            shard = shard_tensor(name, r["grads_ref"][name], t, rank, cfg)
            assert_matches_reference(grad, shard, name=f"d {name} (this rank's shard)", rank=rank)
            stepped = shard_tensor(name, r["source"][name] - LR * r["grads_ref"][name], t, rank, cfg)
            assert_matches_reference(r["weights"][name], stepped, name=f"{name} after an SGD step", rank=rank)
        for phase, got in (("forward", r["forward"]), ("backward", r["backward"])):
            assert got in expected_calls(t, {"all_reduce": 2}), (
                f"rank {rank}: the block's {phase} made the collective calls {got}, expected "
                f"{{'all_reduce': 2}} (two g's forward; backward one f for q, k, v together and one for fc)")


# -- the account of a whole step, against the meter -------------------------------------------

def model_step(comm, impl):
    cfg = config()
    single = init_gpt(cfg, seed=82)
    rng = rank_rng(83, 0)
    idx = torch.tensor(rng.integers(0, cfg.vocab_size, size=(B, cfg.seq_len)))
    targets = torch.tensor(rng.integers(0, cfg.vocab_size, size=(B, cfg.seq_len)))
    _, loss_ref = single(idx, targets)
    model = gpt_to_tp(comm, single)
    for i, block in enumerate(single.blocks):
        model.blocks[i] = impl.tp_block(comm, block, cfg)
    comm.meter.reset()
    _, loss = model(idx, targets)
    forward = comm.meter.snapshot()["by_collective"].get("all_reduce", {})
    comm.meter.reset()
    loss.backward()
    backward = comm.meter.snapshot()["by_collective"].get("all_reduce", {})
    return loss.item(), loss_ref.item(), forward, backward


def ring_bytes(elements, itemsize, t, rank):
    """The grader's own count: rank r skips chunk r (reduce-scatter) and chunk r+1 (all-gather)."""
    chunks = shard_sizes(elements, t)
    return itemsize * (2 * elements - chunks[rank] - chunks[(rank + 1) % t])


def expected_elements(cfg, batch_size):
    """{phase: Counter of elements per all-reduce}: activations B*T*H, the loss's three B*T."""
    tokens = batch_size * cfg.seq_len
    act = tokens * cfg.hidden
    return {"forward": Counter({act: 2 * cfg.n_layers + 1, tokens: 3}),   # embedding + 2 g per block
            "backward": Counter({act: 2 * cfg.n_layers + 1})}             # 2 f per block + LM head


def check_ledger(ledger, cfg, batch_size, t, rank, itemsize, meter=None):
    where = f"rank {rank} of t={t}"
    for entry in ledger:
        assert len(entry) == 4 and entry[0] in ("forward", "backward"), (
            f"{where}: {entry!r} is not a (phase 'forward'/'backward', where, elements, bytes_sent) tuple")
    for phase, want in expected_elements(cfg, batch_size).items():
        mine = [e for e in ledger if e[0] == phase]
        calls, sent = len(mine), sum(e[3] for e in mine)
        if meter is not None:  # the meter is the judge: calls and bytes this rank really sent
            counted = meter[phase]
            assert (calls, sent) == (counted.get("calls", 0), counted.get("bytes_sent", 0)), (
                f"{where}, {phase}: your list says {calls} all-reduces sending {sent} bytes, the meter "
                f"counted {counted.get('calls', 0)} sending {counted.get('bytes_sent', 0)} bytes")
        assert Counter(e[2] for e in mine) == want, (
            f"{where}, {phase}: all-reduces of {dict(Counter(e[2] for e in mine))} elements "
            f"({{elements: calls}}), expected {dict(want)}")
        for _, what, elements, nbytes in mine:
            assert nbytes == ring_bytes(elements, itemsize, t, rank), (
                f"{where}, {phase} ({what}): {elements} elements -> {nbytes} bytes sent, expected "
                f"{ring_bytes(elements, itemsize, t, rank)} (chunks {shard_sizes(elements, t)} of "
                f"{itemsize} bytes)")


@pytest.mark.parametrize("t", WORLD_SIZES)
def test_all_reduces_of_a_step_match_the_meter_on_every_rank(impl, t):
    cfg = config()
    before = asdict(cfg)
    for rank, (loss, loss_ref, forward, backward) in enumerate(run_graded(model_step, t, impl)):
        assert_matches_reference(torch.tensor(loss), torch.tensor(loss_ref), name="TP GPT loss", rank=rank)
        ledger = impl.all_reduces_of_a_step(cfg, B, t, rank)
        check_ledger(ledger, cfg, B, t, rank, 4, {"forward": forward, "backward": backward})
    assert asdict(cfg) == before, "all_reduces_of_a_step modified the config"


def test_all_reduces_of_a_large_model_step(impl):
    # GPT-2-small sizes in bfloat16 (2 bytes), t = 3: 7 * 1024 tokens, uneven over 3 ranks
    cfg = GPTConfig(vocab_size=50257, seq_len=1024, n_layers=12, hidden=768, n_heads=12, n_kv_heads=12)
    for rank in range(3):
        check_ledger(impl.all_reduces_of_a_step(cfg, 7, 3, rank, itemsize=2), cfg, 7, 3, rank, 2)


# the TP degree by the stub's name, t, or as "tp" / "TP degree" ("t" as a word: not the t of "can't")
TP_DEGREE = r"tp|(?<![\w'])t(?![\w'])"


@pytest.mark.parametrize("change,t,rank,quantity", [
    ({}, 4, 4, "rank"),                               # no rank 4 among 4
    ({}, 2, -1, "rank"),
    ({}, 0, 0, TP_DEGREE),                            # t < 1
    ({}, 5, 0, "hidden|n_heads|n_kv_heads|kv|ffn"),   # 5 divides none of them: any may be named first
    (dict(n_heads=8, n_kv_heads=2, hidden=16), 4, 0, "kv"),  # 2 KV heads on 4 ranks: replicated
    (dict(ffn=3), 4, 0, "ffn"),                       # fewer FFN columns than ranks
])
def test_all_reduces_of_a_step_raises_the_promised_errors(impl, change, t, rank, quantity):
    cfg = GPTConfig(**{**CONFIG, **change})
    with pytest.raises(ValueError, match=f"(?i){quantity}"):
        impl.all_reduces_of_a_step(cfg, B, t, rank)
