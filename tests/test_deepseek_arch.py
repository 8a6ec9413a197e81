"""DeepSeek-V3's sharding plans (deepseek.arch.PLANS) name every tensor and describe the model.

In every MoE layout, with and without the query latent: every parameter and buffer of the
model is named by the layout's plan, and the tensor each rank's layers hold is exactly the
plan's cut of the full one (the layers build their local shapes themselves, so a plan that
said another split would disagree here); the cut is undone by the glue.
"""
import pytest
import torch

from tests.hf_models import deepseek_v3_config
from tp_from_scratch.comm import run_spmd
from tp_from_scratch.deepseek.arch import EXPERT_TP, EXPERTS, PLANS, shard, split_of, unshard
from tp_from_scratch.deepseek.model import MODEL_LAYOUTS, ParallelDeepseekV3
from tp_from_scratch.gpt.arch import COLWISE, REPLICATED, ROWWISE, module_style


def _config(query_latent):
    return deepseek_v3_config(**({} if query_latent else {"q_lora_rank": None}))


def _local_shapes(comm, config, layout):
    return {n: tuple(v.shape) for n, v in ParallelDeepseekV3(config, group=comm, layout=layout).state_dict().items()}


@pytest.mark.parametrize("query_latent", [True, False])
@pytest.mark.parametrize("layout", MODEL_LAYOUTS)
def test_every_deepseek_tensor_is_named_by_its_plan_and_cut_as_the_layers_hold_it(layout, query_latent):
    config = _config(query_latent)
    assert set(PLANS) == set(MODEL_LAYOUTS)
    g = torch.Generator().manual_seed(3)
    full = {n: torch.randn(s, generator=g, dtype=torch.float64)
            for n, s in run_spmd(_local_shapes, 1, config, layout)[0].items()}
    unnamed = [n for n in full if module_style(n.rpartition(".")[0], plan=PLANS[layout]) is None]
    assert not unnamed, f"{layout}: no entry in deepseek.arch.PLANS for {unnamed}"
    t = 2
    for r, shapes in enumerate(run_spmd(_local_shapes, t, config, layout)):
        assert set(shapes) == set(full)
        for name, value in full.items():
            assert tuple(shard(name, value, layout, t, r).shape) == shapes[name], (layout, name, r)
    for name, value in full.items():
        pieces = [shard(name, value, layout, t, r) for r in range(t)]
        assert torch.equal(unshard(name, pieces, layout), value), (layout, name)


def test_the_plans_split_heads_by_rows_and_experts_by_layout():
    head_rows = "layers.1.self_attn.{}.weight"
    for layout in ("experts on all tokens", "expert tensor parallel"):
        assert module_style("layers.1.self_attn.q_a_proj", plan=PLANS[layout]) == REPLICATED
        assert module_style("layers.1.self_attn.kv_b_proj", plan=PLANS[layout]) == COLWISE
        assert module_style("layers.1.self_attn.o_proj", plan=PLANS[layout]) == ROWWISE
        assert split_of(head_rows.format("q_b_proj"), layout) == 0 and split_of(head_rows.format("q_proj"), layout) == 0
        assert split_of(head_rows.format("o_proj"), layout) == 1
    assert module_style("layers.1.mlp.experts", plan=PLANS["experts on all tokens"]) == EXPERTS
    assert module_style("layers.1.mlp.experts", plan=PLANS["expert tensor parallel"]) == EXPERT_TP
    # expert parallelism: each rank its own tokens, so all but the routed experts whole
    ep = PLANS["expert parallel"]
    assert {s for p, s in ep.items() if p != "layers.*.mlp.experts"} == {REPLICATED}
    assert ep["layers.*.mlp.experts"] == EXPERTS
    with pytest.raises(ValueError, match="no entry in deepseek.arch.PLANS"):
        split_of("layers.1.self_attn.rotary.weight", "expert parallel")
