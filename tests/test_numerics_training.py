"""The invariant GPT trained and sampled on simulated ranks: every loss of a training run and
every greedily generated token the same bits at t = 1, 2, 4 and 8.

The layers' bits (tests/test_numerics_layers.py) carry over to training because the optimizer
is element-wise: equal gradients give equal updates, so equal weights, so equal losses at the
next step, for as long as the run lasts. `make test` trains 10 steps; `make test-slow`
(TP_TEST_SLOW=1) trains Llama 1,000 steps at every t (minutes on 2 cores). Generation: greedy decoding, each token the argmax of the gathered
logits of the whole sequence so far; a changed bit in a logit could flip a near-tie. And
gpt.generate's own loop (prefill, then one token at a time against the KV cache, as
numerics.generate runs it): every step's gathered logits the same bits at every t, where the
plain TP GPT's differ.
"""
import pytest
import torch

from tests.invariant_gpt import CONFIGS, invariant_tp_gpt
from tests.slow import SLOW
from tp_from_scratch.comm import run_spmd
from tp_from_scratch.gpt.data import global_batch
from tp_from_scratch.gpt.model import init_gpt
from tp_from_scratch.nn.mappings import gather_from_tp_region
from tp_from_scratch.numerics import check_invariant

STEPS = {"llama": 1000 if SLOW else 10, "gpt2": 10}
BY_ARCH = {config.arch: config for config in CONFIGS}


def training_losses(group, config, steps):
    """Every step's loss of AdamW training of the invariant GPT on ``group``, float32."""
    model = invariant_tp_gpt(group, init_gpt(config, 0))
    optimizer = torch.optim.AdamW(model.parameters(), lr=3e-3, betas=(0.9, 0.95), weight_decay=0.0, foreach=False)
    losses = []
    for step in range(steps):
        x, y = global_batch(step, 2, config.seq_len, config.vocab_size, seed=0)   # (B, T), the same on every rank
        optimizer.zero_grad(set_to_none=True)
        loss = model(x, y)[1]
        loss.backward()
        optimizer.step()
        losses.append(loss.detach())
    return torch.stack(losses)


def greedy_ids(group, config, new_tokens=12):
    """The prompt and ``new_tokens`` greedy tokens of the invariant GPT (its initial weights)."""
    model = invariant_tp_gpt(group, init_gpt(config, 0))
    ids = torch.tensor([[1, 2, 3, 4]])
    with torch.no_grad():
        for _ in range(new_tokens):
            logits = gather_from_tp_region(group, model(ids)[0][:, -1])   # (1, V): every vocabulary shard
            ids = torch.cat([ids, logits.argmax(-1, keepdim=True)], 1)
    return ids


def serving(arch):
    return [t for t in (1, 2, 4, 8) if not _refused(BY_ARCH[arch], t)]


def _refused(config, t):
    try:
        check_invariant(config, t)
        return False
    except ValueError:
        return True


@pytest.mark.timeout(3600 if SLOW else 300)
@pytest.mark.parametrize("arch", ["llama", "gpt2"])
def test_every_training_loss_is_the_same_bits_at_every_t(arch):
    config, steps = BY_ARCH[arch], STEPS[arch]
    want = run_spmd(training_losses, 1, config, steps, timeout=3000)[0]
    assert len(set(want.tolist())) > steps // 2, "the run must move: its losses must change"
    for t in serving(arch)[1:]:
        for rank, got in enumerate(run_spmd(training_losses, t, config, steps, timeout=3000)):
            assert torch.equal(got, want), (
                f"{arch} at t={t}, rank {rank}: first differing step "
                f"{int((got != want).nonzero()[0])} of {steps}")


def cached_decode_logits(group, config, build):
    """gpt.generate's loop on build(group, gpt): the ids and every step's gathered last logits
    (its ``pick`` hook records them, then picks the argmax)."""
    from tp_from_scratch.gpt.generate import generate
    seen = []

    def pick(group, local, vocab_start, i):
        full = gather_from_tp_region(group, local.contiguous())   # (1, V)
        seen.append(full)
        return full.argmax(-1)
    with torch.no_grad():
        ids = generate(build(group, init_gpt(config, 0)).eval(), torch.tensor([[1, 2, 3, 4]]), 12, pick=pick)
    return ids, torch.stack(seen)


@pytest.mark.timeout(300)
@pytest.mark.parametrize("arch", ["llama", "gpt2"])
def test_generate_with_the_kv_cache_gives_every_logit_the_same_bits_at_every_t(arch):
    from tp_from_scratch.gpt.parallelize import gpt_to_tp
    config, plain_differs = BY_ARCH[arch], False
    want = run_spmd(cached_decode_logits, 1, config, invariant_tp_gpt)[0]
    plain = run_spmd(cached_decode_logits, 1, config, gpt_to_tp)[0]
    for t in serving(arch)[1:]:
        for rank, (ids, logits) in enumerate(run_spmd(cached_decode_logits, t, config, invariant_tp_gpt)):
            assert torch.equal(ids, want[0]) and torch.equal(logits, want[1]), f"{arch} at t={t}, rank {rank}"
        plain_differs |= not torch.equal(run_spmd(cached_decode_logits, t, config, gpt_to_tp)[0][1], plain[1])
    assert plain_differs, "the plain TP GPT's logits must change with t, or this test proves nothing"


@pytest.mark.timeout(300)
@pytest.mark.parametrize("arch", ["llama", "gpt2"])
def test_greedy_generation_gives_the_same_ids_at_every_t(arch):
    config = BY_ARCH[arch]
    want = run_spmd(greedy_ids, 1, config)[0]
    for t in serving(arch)[1:]:
        for rank, got in enumerate(run_spmd(greedy_ids, t, config)):
            assert torch.equal(got, want), f"{arch} at t={t}, rank {rank}: {got.tolist()} != {want.tolist()}"
