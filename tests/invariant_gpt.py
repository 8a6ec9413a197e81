"""The invariant GPT's bitwise check against t = 1 (tests/test_numerics_layers.py,
tests/spmd_scripts/numerics.py, tests/test_numerics_training.py); the model is the library's
(numerics/model.py's invariant_tp_gpt).
"""
import functools

import torch

from tp_from_scratch.comm import run_spmd
from tp_from_scratch.compare import assert_matches_reference
from tp_from_scratch.gpt.model import GPTConfig, init_gpt
from tp_from_scratch.gpt.parallelize import shard_tensor
from tp_from_scratch.nn.mappings import tp_rank, tp_world_size
from tp_from_scratch.numerics import check_invariant
from tp_from_scratch.numerics.model import invariant_tp_gpt


CONFIGS = [GPTConfig(vocab_size=64, seq_len=16, n_layers=1, hidden=64, n_heads=8, n_kv_heads=nkv, arch=arch)
           for arch, nkv in (("gpt2", 2), ("gpt", 4), ("llama", 8))]


def gpt_outputs(group, config):
    """(local logits, loss, {name: local gradient}) of the invariant TP GPT on a fixed batch."""
    gpt = init_gpt(config, 0)
    gen = torch.Generator().manual_seed(1)
    idx, targets = (torch.randint(0, config.vocab_size, (2, 16), generator=gen) for _ in range(2))
    model = invariant_tp_gpt(group, gpt)
    logits, loss = model(idx, targets)
    loss.backward()
    return logits.detach(), loss.detach(), {name: p.grad for name, p in model.named_parameters()}


@functools.lru_cache(maxsize=None)
def reference_outputs(index):
    """gpt_outputs of CONFIGS[index] at t = 1, on one simulated rank in this process (computed once)."""
    return run_spmd(gpt_outputs, 1, CONFIGS[index])[0]


def check_gpt(group):
    """The invariant GPT on ``group`` == t = 1, bit for bit: logits, loss, every gradient. GPT-2 with 2 KV
    heads (at t = 8 each on 4 ranks), the course's GPT with 4, Llama with 8; a config check_invariant
    refuses at t is skipped (GPT-2 at t = 4)."""
    t, r = tp_world_size(group), tp_rank(group)
    for config in CONFIGS:
        try:
            check_invariant(config, t)
        except ValueError:
            continue                                          # refused by name: numerics' own tests
        logits, loss, grads = gpt_outputs(group, config)
        want_logits, want_loss, want_grads = reference_outputs(CONFIGS.index(config))
        assert_matches_reference(logits, want_logits.tensor_split(t, -1)[r], name="logits", rank=r, exact=True)
        assert_matches_reference(loss, want_loss, name="loss", rank=r, exact=True)
        for name, grad in grads.items():
            assert_matches_reference(grad, shard_tensor(name, want_grads[name], t, r, config),
                                     name=f"{config.arch} grad of {name} at t={t}", rank=r, exact=True)
    return len(CONFIGS)
