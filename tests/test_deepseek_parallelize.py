"""Lesson 12's TP model is its plan applied to the single-device DeepSeek-V3.

The single-device DeepseekV3 (deepseek/single_device.py, and the MLA and MoE files it is built
from) imports no parallel layer, mapping or collective; deepseek.model.parallelize turns it into
rank r's model by arch.PLANS, and at t = 2 in each of the three layouts that model equals the
single-device one: logits, and every parameter's gradient gathered from the ranks (and each
rank's piece), float64, on simulated ranks. Routing is discrete: every router's margin is
measured on the reference before anything is compared.
"""
import pytest
import torch

from tests import test_layout as layout_scan
from tp_from_scratch.comm import run_spmd
from tp_from_scratch.compare import assert_matches_reference
from tp_from_scratch.deepseek import check_routing_margin, routing_margin
from tp_from_scratch.deepseek.arch import shard, unshard
from tp_from_scratch.deepseek.check import tiny_model_config
from tp_from_scratch.deepseek.expert_parallel import LAYOUTS
from tp_from_scratch.deepseek.model import MODEL_LAYOUTS, parallelize
from tp_from_scratch.deepseek.moe import DeepSeekMoE
from tp_from_scratch.deepseek.single_device import DeepseekV3
from tp_from_scratch.nn import ColumnParallelLinear, RowParallelLinear
from tp_from_scratch.testing import rank_rng

SINGLE_DEVICE_FILES = ("single_device.py", "mla.py", "moe.py", "router.py", "config.py")
PARALLEL = ("tp_from_scratch.deepseek.expert_parallel", "tp_from_scratch.deepseek.autograd",
            "tp_from_scratch.deepseek.model")


def test_the_single_device_deepseek_imports_no_parallel_layer():
    # the files the single-device model is built from import nothing of Lesson 5's layers,
    # mappings or collectives, nor the MoE layers' parallel layouts, not even inside a function;
    # and every deepseek module they import is one of them
    deepseek = layout_scan.PACKAGE / "deepseek"

    def found(path):
        return [(layout_scan.resolve(name) or name, line) for name, line in layout_scan.imports(path)]

    bad, outside = [], []
    for file in SINGLE_DEVICE_FILES:
        for module, line in found(deepseek / file):
            if layout_scan.component(module) == "nn" or module in PARALLEL:
                bad.append(f"deepseek/{file}:{line} imports {module}")
            elif module.startswith("tp_from_scratch.deepseek.") and f"{module.rpartition('.')[2]}.py" \
                    not in SINGLE_DEVICE_FILES:
                outside.append(f"deepseek/{file}:{line} imports {module}")
    assert not bad, bad
    assert not outside, f"the single-device model's files import another deepseek module: {outside}"
    assert any(layout_scan.component(m) == "nn" for m, _ in found(deepseek / "model.py"))  # the scan sees them
    # and what it builds is torch's modules and those files' only
    where = {type(m).__module__ for m in DeepseekV3(tiny_model_config()).modules()}
    allowed = {f"tp_from_scratch.deepseek.{f[:-3]}" for f in SINGLE_DEVICE_FILES}
    assert {w for w in where if not w.startswith("torch.nn.")} <= allowed, where


def random_model(config, seed):
    """A float64 DeepseekV3 with every weight and every router's selection bias drawn at random."""
    model = DeepseekV3(config).double()
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in model.parameters():
            p.copy_(0.2 * torch.randn(p.shape, generator=g, dtype=torch.float64))
        for name, buffer in model.named_buffers():
            if name.endswith("e_score_correction_bias"):
                buffer.copy_(0.3 * torch.randn(buffer.shape, generator=g, dtype=torch.float64))
    return model


def reference_run(model, ids, dlogits):
    """The single-device logits and gradients, with every router's margin checked on the way."""
    def margin(module, inputs, output):
        h = inputs[0].detach().reshape(-1, module.config.hidden_size)
        check_routing_margin(routing_margin(h, module.gate.weight, module.gate.e_score_correction_bias,
                                            module.config), h.dtype)

    hooks = [m.register_forward_hook(margin) for m in model.modules() if isinstance(m, DeepSeekMoE)]
    assert hooks, "no MoE layer found"
    logits = model(ids)
    (logits * dlogits).sum().backward()
    for h in hooks:
        h.remove()
    return logits.detach(), {n: p.grad.clone() for n, p in model.named_parameters()}


def _rank(comm, config, state, layout, ids, dlogits):
    model = DeepseekV3(config).double()
    model.load_state_dict(state)
    parallelize(model, comm, layout)
    if layout == "expert parallel":   # each rank its own sequence
        ids, dlogits = ids[comm.rank:comm.rank + 1], dlogits[comm.rank:comm.rank + 1]
    logits = model(ids)
    (logits * dlogits).sum().backward()
    model.sum_replicated_gradients()  # expert parallelism's data-parallel sum (nothing otherwise)
    attn = model.layers[0].self_attn
    kinds = (type(attn.q_b_proj), type(attn.o_proj), attn.q_b_proj.__dict__.get("input_is_copied"),
             type(model.layers[-1].mlp))
    return logits.detach(), {n: p.grad for n, p in model.named_parameters()}, kinds


@pytest.mark.parametrize("layout", MODEL_LAYOUTS)
def test_parallelize_equals_the_single_device_model(layout):
    t, config = 2, tiny_model_config()
    reference = random_model(config, seed=7)
    state = {n: v.clone() for n, v in reference.state_dict().items()}
    ids = torch.tensor(rank_rng(8).integers(0, config.vocab_size, size=(t, 6)))
    dlogits = torch.tensor(rank_rng(9).standard_normal((t, 6, config.vocab_size)))
    logits_ref, grads_ref = reference_run(reference, ids, dlogits)
    results = run_spmd(_rank, t, config, state, layout, ids, dlogits)
    for r, (logits, grads, kinds) in enumerate(results):
        split_heads = layout != "expert parallel"
        # the plan swapped in Lesson 5's layers (one f on the latents: q_b skips its own) and the layout's MoE
        assert kinds == ((ColumnParallelLinear, RowParallelLinear, True) if split_heads
                         else (torch.nn.Linear, torch.nn.Linear, None)) + (LAYOUTS[layout],), (layout, kinds)
        expected = logits_ref if split_heads else logits_ref[r:r + 1]
        assert_matches_reference(logits, expected, name=f"logits ({layout})", rank=r)
        assert set(grads) == set(grads_ref)
        for name, g in grads.items():
            assert_matches_reference(g, shard(name, grads_ref[name], layout, t, r),
                                     name=f"grad {name} ({layout})", rank=r)
    for name, g in grads_ref.items():
        gathered = unshard(name, [grads[name] for _, grads, _ in results], layout)
        assert_matches_reference(gathered, g, name=f"gathered grad {name} ({layout})")
