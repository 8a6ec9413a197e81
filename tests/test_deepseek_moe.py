"""DeepSeekMoE (Lesson 12): the router and the layer equal transformers' DeepseekV3, and the
three ways to run it on t ranks each equal one device, outputs and every gradient, float64.

Routing is discrete, so before any comparison the test measures how far the data is from a
near-tie (router.routing_margin): a margin a million times float64's epsilon means no order
of additions can pick a different expert, and a failure is then a bug, never a tie.
"""
import re

import numpy as np
import pytest
import torch

from tests.hf_models import deepseek_moe, deepseek_v3_config
from tests.slow import only_in_test_slow
from tp_from_scratch.comm import SPMDError, run_spmd
from tp_from_scratch.comm.launchers import mpiexec_command, run_command, torchrun_command
from tp_from_scratch.compare import assert_matches_reference
from tp_from_scratch.deepseek import (LAYOUTS, DeepSeekMoE, MoEConfig,
                                      all_reduce_bytes_sent, check_routing_margin, ep_bytes_sent,
                                      route, routing_margin, tokens_per_rank)
from tp_from_scratch.deepseek.check import TINY, check_layout, layout_data, random_moe
from tp_from_scratch.testing import random_array, rank_rng

# t = 3 needs experts, groups and widths divisible by 3
SIZES = {1: {}, 2: {}, 4: {}, 3: dict(n_routed_experts=6, n_group=3, topk_group=2)}


def hf_and_ours(t=1, seed=0):
    hf = deepseek_moe(seed, **SIZES[t])
    ours = DeepSeekMoE(MoEConfig.from_hf(hf.config)).double()
    ours.load_state_dict(hf.state_dict())  # the same names and layouts: loads as it is
    return hf, ours


def tokens(seed, rank, n, hidden=32):
    return torch.tensor(random_array(rank_rng(seed, rank), (n, hidden)), requires_grad=True)


def margin_ok(moe, x):
    g = moe.gate
    return check_routing_margin(routing_margin(x.detach(), g.weight, g.e_score_correction_bias, moe.config),
                                x.dtype)


def test_our_router_picks_transformers_experts_with_its_weights_in_float32():
    # transformers' own router, unpatched (float32): the same experts, the same weights
    hf = deepseek_moe(3, dtype=torch.float32, patch=False)
    config = MoEConfig.from_hf(hf.config)
    x = tokens(4, 0, 40).float().detach()
    check_routing_margin(routing_margin(x, hf.gate.weight, hf.gate.e_score_correction_bias, config), x.dtype)
    _, hf_weights, hf_experts = hf.gate(x)
    weights, experts = route(x, hf.gate.weight, hf.gate.e_score_correction_bias, config)
    hf_order, order = hf_experts.argsort(-1), experts.argsort(-1)  # the k experts in any order
    assert torch.equal(hf_experts.gather(1, hf_order), experts.gather(1, order)), "different experts chosen"
    assert_matches_reference(weights.gather(1, order), hf_weights.gather(1, hf_order), name="routing weights")


def test_the_float64_router_patch_restates_transformers_router():
    # tests/hf_models.py's float64 router against transformers' float32 original on the same
    # float32 data: any difference in selection would show as different experts
    unpatched, patched = deepseek_moe(5, dtype=torch.float32, patch=False), deepseek_moe(5, dtype=torch.float32)
    x = tokens(6, 0, 40).float().detach()
    _, w0, e0 = unpatched.gate(x)
    _, w1, e1 = patched.gate(x)
    assert torch.equal(e0.sort(-1).values, e1.sort(-1).values)
    assert_matches_reference(w1.gather(1, e1.argsort(-1)), w0.gather(1, e0.argsort(-1)), name="patched router")


def test_deepseek_moe_equals_transformers_layer_outputs_and_gradients():
    hf, ours = hf_and_ours(seed=7)
    x = tokens(8, 0, 2 * 9).view(2, 9, 32).detach()
    margin_ok(ours, x.view(-1, 32))
    dy = torch.tensor(random_array(rank_rng(9), (2, 9, 32)))
    results = []
    for model in (hf, ours):
        xi = x.clone().requires_grad_(True)
        y = model(xi)
        (y * dy).sum().backward()
        results.append((y, xi.grad, {n: p.grad for n, p in model.named_parameters()}))
    (y_hf, gx_hf, grads_hf), (y, gx, grads) = results
    assert_matches_reference(y, y_hf, name="MoE output")
    assert_matches_reference(gx, gx_hf, name="MoE input gradient")
    assert grads.keys() == grads_hf.keys()
    for name in grads:
        assert_matches_reference(grads[name], grads_hf[name], name=f"grad {name}")


# ---- the three layouts on t ranks ---------------------------------------------------------
# deepseek.check.check_layout compares rank r's output, input gradient and every weight's
# gradient with its share of the reference's; here the reference is transformers' weights

@pytest.mark.parametrize("t", [1, 2, 3, 4])
@pytest.mark.parametrize("layout", list(LAYOUTS))
def test_each_layout_equals_one_device(layout, t):
    _, reference = hf_and_ours(t, seed=11 + t)
    xs, dys = layout_data(layout, t, reference.config.hidden_size, seed=20 + t)
    run_spmd(check_layout, t, layout, reference, xs, dys)


@pytest.mark.parametrize("layout", list(LAYOUTS))
def test_a_rank_whose_experts_get_no_token_has_zero_gradients_as_on_one_device(layout):
    # the last rank's experts are never chosen (their selection bias far below the others'):
    # one device's stacked experts give them a zero gradient, so must that rank, not None
    # (an optimizer skips a None gradient, while AdamW's moments and SGD's momentum still move)
    t = 2
    reference = random_moe(TINY, seed=5)
    with torch.no_grad():
        reference.gate.e_score_correction_bias[TINY.n_routed_experts // t:] -= 10.0
    xs, dys = layout_data(layout, t, TINY.hidden_size, seed=6)
    run_spmd(check_layout, t, layout, reference, xs, dys)


@pytest.mark.parametrize("t", [2, 3, 4])
@pytest.mark.parametrize("layout", list(LAYOUTS))
def test_bytes_on_the_wire_equal_the_formula(layout, t):
    _, reference = hf_and_ours(t, seed=40 + t)
    H, N = reference.config.hidden_size, 12
    xs, dys = layout_data(layout, t, H, seed=50 + t, tokens=N)
    out = run_spmd(check_layout, t, layout, reference, xs, dys)
    if layout == "expert parallel":
        counts = np.stack([o[1].numpy() for o in out])  # (t, t, E/t)
        # none dropped: every token's k pairs were sent somewhere
        assert counts.sum() == sum(len(x) for x in xs) * reference.config.num_experts_per_tok
        expected = [ep_bytes_sent(counts, r, H, 8) for r in range(t)]
    else:
        expected = [all_reduce_bytes_sent(N * H, t, r, 8) for r in range(t)]
    assert [o[0] for o in out] == expected


@pytest.mark.slow
@pytest.mark.timeout(240)
# 4 processes under torchrun in make test-slow: 4 ranks run under mpiexec below, 2 under torchrun here
@pytest.mark.parametrize("nproc", [2, pytest.param(4, marks=only_in_test_slow("4 processes under torchrun"))])
def test_every_layout_and_the_model_under_torchrun_native_and_from_scratch(nproc):
    result = run_command(torchrun_command(nproc, "tp_from_scratch.deepseek.check", "--timeout", 90), timeout=200)
    passed = re.findall(r"rank (\d+): deepseek checks passed", result.stdout)
    assert result.returncode == 0 and sorted(map(int, passed)) == list(range(nproc)), result.stdout[-3000:]
    assert result.stdout.count("expert parallel (native)") == nproc, result.stdout[-3000:]
    assert result.stdout.count("model with expert tensor parallel (scratch)") == nproc, result.stdout[-3000:]


@pytest.mark.slow
@pytest.mark.timeout(240)
def test_every_layout_and_the_model_under_mpiexec_on_the_from_scratch_collectives():
    # the same torch layers, their collectives Lesson 2's over MPI (through the nn bridge)
    result = run_command(mpiexec_command(4, "tp_from_scratch.deepseek.check", "--timeout", 90), timeout=200)
    passed = re.findall(r"rank (\d+): deepseek checks passed", result.stdout)
    assert result.returncode == 0 and sorted(map(int, passed)) == list(range(4)), result.stdout[-3000:]
    assert result.stdout.count("expert parallel (mpi)") == 4, result.stdout[-3000:]
    assert result.stdout.count("model with expert tensor parallel (mpi)") == 4, result.stdout[-3000:]


def test_load_per_rank_counts_every_pair_once():
    _, reference = hf_and_ours(4, seed=60)
    x = tokens(61, 0, 64).detach()
    _, experts = route(x, reference.gate.weight, reference.gate.e_score_correction_bias, reference.config)
    load = tokens_per_rank(experts, reference.config.n_routed_experts, 4)
    per_expert = torch.bincount(experts.reshape(-1), minlength=8)
    assert load.tolist() == per_expert.view(4, 2).sum(1).tolist() and load.sum() == 64 * 3


@pytest.mark.parametrize("change, match", [
    (dict(topk_method="greedy"), "topk_method='greedy' is not supported"),
    (dict(scoring_func="softmax"), "scoring_func='softmax' is not supported"),
    (dict(hidden_act="gelu"), "hidden_act='gelu' is not supported"),
])
def test_configs_the_course_cannot_map_are_named(change, match):
    config = deepseek_v3_config()
    for key, value in change.items():
        setattr(config, key, value)
    with pytest.raises(ValueError, match=match):
        MoEConfig.from_hf(config)


@pytest.mark.parametrize("layout, t, match", [
    ("expert parallel", 3, "n_routed_experts \\(for expert parallelism\\) 8 is not divisible by tp=3"),
    ("experts on all tokens", 3, "n_routed_experts \\(for expert parallelism\\) 8 is not divisible by tp=3"),
    ("expert tensor parallel", 5, "is not divisible by tp=5"),
])
def test_ranks_that_do_not_divide_the_experts_are_named(layout, t, match):
    _, reference = hf_and_ours()
    with pytest.raises(SPMDError, match=match):
        run_spmd(lambda comm: LAYOUTS[layout].from_module(reference, group=comm), t, timeout=10)


def test_a_near_tie_is_refused_by_the_margin_check():
    _, reference = hf_and_ours(seed=70)
    gate = reference.gate
    x = tokens(71, 0, 4).detach()
    bias = gate.e_score_correction_bias.clone()
    # move the best rejected expert of token 0 onto the k-th chosen one: an exact tie
    scores = torch.sigmoid(x @ gate.weight.T) + bias
    config = reference.config
    margin = routing_margin(x, gate.weight, bias, config)
    check_routing_margin(margin, torch.float64)
    from tp_from_scratch.deepseek.router import _masked_choice
    _, choice, _ = _masked_choice(x, gate.weight, bias, config)
    top = choice[0].topk(config.num_experts_per_tok + 1)
    kth, next_ = top.indices[-2], top.indices[-1]
    bias[next_] += scores[0, kth] - scores[0, next_] - 1e-13
    tied = routing_margin(x, gate.weight, bias, config)
    assert tied < 1e-12
    with pytest.raises(ValueError, match="routing near-tie"):
        check_routing_margin(tied, torch.float64)


# ---- training: a few SGD steps, each step's loss equal to one device ------------------------

def _sgd_losses(model, xs, targets, steps, lr):
    """Per step: (loss of these tokens, routing margin of these tokens), then an SGD step."""
    out = []
    for _ in range(steps):
        x = torch.cat(xs) if isinstance(xs, list) else xs
        margin = routing_margin(x, model.gate.weight.detach(), model.gate.e_score_correction_bias, model.config)
        model.zero_grad()
        loss = 0.5 * ((model(x) - targets) ** 2).sum()
        loss.backward()
        with torch.no_grad():
            for p in model.parameters():
                p -= lr * p.grad
        out.append((loss.detach(), margin))
    return out


@pytest.mark.parametrize("layout", list(LAYOUTS))
def test_three_sgd_steps_give_one_devices_losses(layout):
    t, steps, lr = 2, 3, 0.02
    _, reference = hf_and_ours(t, seed=80)
    xs, targets = layout_data(layout, t, reference.config.hidden_size, seed=81)

    def rank(comm):
        layer = LAYOUTS[layout].from_module(reference, group=comm)
        return _sgd_losses(layer, xs[comm.rank], targets[comm.rank], steps, lr)

    per_rank = run_spmd(rank, t)
    ep = layout == "expert parallel"
    full_x, full_target = (torch.cat(xs), torch.cat(targets)) if ep else (xs[0], targets[0])
    expected = _sgd_losses(reference, full_x, full_target, steps, lr)  # the reference itself steps
    for step, (loss_ref, margin) in enumerate(expected):
        check_routing_margin(margin, torch.float64)  # no near-tie anywhere on the way
        # at this point the step's loss must be one device's: EP adds its ranks' own tokens
        losses = [per_rank[r][step][0] for r in range(t)]
        got = [sum(losses)] if ep else losses
        for r, loss in enumerate(got):
            assert_matches_reference(loss, loss_ref, name=f"{layout} loss at step {step}", rank=r)
