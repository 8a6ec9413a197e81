"""Lesson 12's planner (tp_from_scratch.deepseek.planner) against the models it plans.

Parameters: the formula = the numel of transformers' DeepseekV3ForCausalLM (random weights, tiny
configs) and of the course's ParallelDeepseekV3 on each rank. Bytes: TP's = what the simulator's
meter counts for the two all-reduces of a layer; EP's = the meter's on the expert-parallel layer
when the routing is balanced. Bad flags: refused in one line, before any work.
"""
import numpy as np
import pytest
import torch
from transformers import DeepseekV3Config, DeepseekV3ForCausalLM

from tp_from_scratch import collectives
from tp_from_scratch.comm import run_spmd
from tp_from_scratch.deepseek.planner import (balanced_counts, ep_bytes_per_token, main, parameter_count,
                                           tp_bytes_per_token)
from tp_from_scratch.deepseek import ep_bytes_sent


def tiny(**overrides):
    sizes = dict(vocab_size=67, hidden_size=32, intermediate_size=48, moe_intermediate_size=12,
                 num_hidden_layers=3, first_k_dense_replace=1, num_attention_heads=4, q_lora_rank=16,
                 kv_lora_rank=8, qk_nope_head_dim=6, qk_rope_head_dim=4, v_head_dim=5, n_routed_experts=8,
                 num_experts_per_tok=3, n_group=4, topk_group=2, n_shared_experts=1)
    return DeepseekV3Config(**{**sizes, **overrides})


@pytest.mark.parametrize("overrides", [{}, {"first_k_dense_replace": 0}, {"n_shared_experts": 2},
                                       {"first_k_dense_replace": 2, "n_shared_experts": 2},
                                       {"q_lora_rank": None, "attention_bias": True},
                                       {"tie_word_embeddings": True}])
def test_parameter_count_is_transformers_numel(overrides):
    config = tiny(**overrides)
    torch.manual_seed(0)
    model = DeepseekV3ForCausalLM(config)
    assert parameter_count(config) == sum(p.numel() for p in model.parameters())
    # active: the same model with only k routed experts per MoE layer
    active = DeepseekV3ForCausalLM(tiny(**{**overrides, "n_routed_experts": config.num_experts_per_tok,
                                           "n_group": 1, "topk_group": 1}))
    router = (config.n_routed_experts - config.num_experts_per_tok) * config.hidden_size  # the router is whole
    moe_layers = config.num_hidden_layers - config.first_k_dense_replace
    assert parameter_count(config, active=True) == sum(p.numel() for p in active.parameters()) + moe_layers * router


@pytest.mark.parametrize("layout,tp_ep", [("experts on all tokens", lambda t: (t, t)),
                                          ("expert parallel", lambda t: (1, t))])
def test_parameters_per_rank_are_the_course_models(layout, tp_ep):
    from tp_from_scratch.deepseek.model import ParallelDeepseekV3
    config = tiny(n_shared_experts=2)
    for t in (2, 4):
        held = run_spmd(lambda comm: sum(p.numel() for p in ParallelDeepseekV3(config, group=comm, layout=layout)
                                         .parameters()), t)
        tp, ep = tp_ep(t)
        assert held[0] == parameter_count(config, tp, ep), (layout, t)


def test_published_deepseek_v3_is_671b_total_37b_active():
    config = DeepseekV3Config()  # transformers' defaults: DeepSeek-V3's sizes
    assert round(parameter_count(config) / 1e9) == 671
    assert int(parameter_count(config, active=True) / 1e9) == 37


def test_tp_bytes_are_the_meters():
    config, t, tokens = tiny(), 4, 5

    def layer(comm):
        comm.meter.reset()
        for _ in range(2):  # attention's o_proj and the FFN: one all-reduce of (tokens, H) each
            collectives.all_reduce(comm, np.ones((tokens, config.hidden_size)))
        return comm.meter.bytes_sent
    assert sum(run_spmd(layer, t)) == tokens * tp_bytes_per_token(config, t, 8)


def test_ep_bytes_are_the_meters_under_balanced_routing():
    # the EP layer, on a router that sends every token to k experts in perfect balance
    from tp_from_scratch.deepseek.check import TINY, random_moe
    from tp_from_scratch.deepseek.expert_parallel import ExpertParallelMoE
    t, E, k, tokens = 4, TINY.n_routed_experts, TINY.num_experts_per_tok, 8
    moe = random_moe(TINY, seed=0)

    def layer(comm):
        ep = ExpertParallelMoE.from_module(moe, group=comm)
        x = torch.randn(tokens, TINY.hidden_size, dtype=torch.float64, generator=torch.Generator().manual_seed(comm.rank))
        comm.meter.reset()
        ep(x)
        return comm.meter.bytes_sent, ep.last_counts.numpy()
    out = run_spmd(layer, t)
    counts = [c for _, c in out]
    # the planner's formula on the counts the layer really sent equals the meter ...
    assert [sent for sent, _ in out] == [ep_bytes_sent(np.stack(counts), r, TINY.hidden_size, 8) for r in range(t)]
    # ... and balanced counts give 2 k (t-1)/t H b per token, plus the counts exchange
    balanced = balanced_counts(t, tokens, k, E // t)
    assert balanced.sum(axis=(1, 2)).tolist() == [tokens * k] * t
    config = tiny(hidden_size=TINY.hidden_size, n_routed_experts=E, num_experts_per_tok=k)
    per_token = ep_bytes_per_token(config, t, 8, tokens)
    assert per_token * tokens == ep_bytes_sent(balanced, 0, TINY.hidden_size, 8)
    assert per_token * tokens == 2 * tokens * k * (t - 1) // t * TINY.hidden_size * 8 + (t - 1) * (E // t) * 8


@pytest.mark.parametrize("argv,named", [(["--ep", "6"], "--ep 6"), (["--tp", "3"], "--tp 3"),
                                        (["--config", "no/such.json"], "--config"), (["--tp", "0"], "--tp"),
                                        (["--max-nodes", "9"], "--max-nodes 9")])
def test_bad_flags_are_refused_in_one_line(argv, named, capsys):
    with pytest.raises(SystemExit) as exit:
        main(argv)
    assert exit.value.code == 2
    error = capsys.readouterr().err.strip().splitlines()[-1]
    assert named in error, error


def test_the_dense_planner_points_to_the_course_map_which_names_this_one(capsys):
    # Lesson 9 does not name Lesson 12: its refusal points to the course map, whose row names this planner
    from pathlib import Path

    from tp_from_scratch.cost.planner import main as dense_main
    from tp_from_scratch.gpt.options import COURSE_MAP
    with pytest.raises(SystemExit):
        dense_main(["--arch", "deepseek_v3"])
    assert COURSE_MAP in capsys.readouterr().err.strip().splitlines()[-1]
    readme = (Path(__file__).resolve().parent.parent / "README.md").read_text()
    course = readme[readme.index("## The course"):readme.index("## Headline figures")]
    assert "-m tp_from_scratch.deepseek.planner" in course
