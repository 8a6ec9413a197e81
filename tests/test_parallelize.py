"""gpt.parallelize applies a plan: the layouts it promises, the style table it takes, the copy it makes.

* every planned module's output in the TP model, brought back to the full tensor as
  gpt.arch.OUTPUT_LAYOUT says (gathered when Sharded, one copy per replicated KV block),
  equals the same module's output in the single-device model (t = 2, and t = 4 with KV heads
  held by two ranks);
* a style table passed in builds the model: its makers see every planned module once, with
  the site the plan gives it (one f for q, k, v and for gate, up; fc its own), and a table
  lacking a style the plan uses is refused by name;
* gpt_to_tp leaves the single-device model as it was (its TP copy trains apart), and builds
  the same model from the single-device state dict.
"""
import pytest
import torch

from tp_from_scratch.comm import run_spmd
from tp_from_scratch.compare import assert_matches_reference
from tp_from_scratch.gpt.arch import (COLWISE, KV_COLWISE, PLANS, REPLICATE, ROWWISE, SHARD_LAST, kv_replicas,
                                      module_style, output_layout)
from tp_from_scratch.gpt.data import global_batch
from tp_from_scratch.gpt.model import GPTConfig, init_gpt
from tp_from_scratch.gpt.parallelize import TP_STYLES, glue, gpt_to_tp
from tp_from_scratch.nn.mappings import all_gather

CONFIGS = {"gpt2": (GPTConfig(arch="gpt2", vocab_size=29, seq_len=8, n_layers=2, hidden=16, n_heads=4,
                              n_kv_heads=4, ffn=32), 2),
           "llama": (GPTConfig(arch="llama", vocab_size=29, seq_len=8, n_layers=2, hidden=16, n_heads=4,
                               n_kv_heads=2, ffn=32), 4)}   # at t = 4 each KV head sits on two ranks


def planned_outputs(model, arch, x, y):
    """{module name: its output} for every module of ``model`` the plan names, in one forward."""
    outputs, hooks = {}, []
    for name, module in model.named_modules():
        if name and module_style(name, arch) is not None:
            hooks.append(module.register_forward_hook(
                lambda m, args, out, name=name: outputs.__setitem__(name, out.detach())))
    model(x, y)
    for h in hooks:
        h.remove()
    return outputs


@pytest.mark.parametrize("arch", CONFIGS)
def test_output_layouts_bring_every_tp_module_back_to_the_single_device_output(arch):
    config, t = CONFIGS[arch]
    single = init_gpt(config, 1, torch.float64)
    x, y = global_batch(0, 2, config.seq_len, config.vocab_size, 1)
    want = planned_outputs(single, arch, x, y)

    def rank(comm):
        got = planned_outputs(gpt_to_tp(comm, single), arch, x, y)
        full = {}
        for name, out in got.items():
            if output_layout(name, arch) == SHARD_LAST:
                sizes = all_gather(comm, torch.tensor([out.shape[-1]])).tolist()
                pieces = list(all_gather(comm, out.contiguous(), -1, sizes).split(sizes, dim=-1))
                r = kv_replicas(config, t) if module_style(name, arch) == KV_COLWISE else 1
                out = glue(pieces, -1, r)
            else:
                assert output_layout(name, arch) == REPLICATE, name
            full[name] = out
        return full

    styles_seen = set()
    for r, full in enumerate(run_spmd(rank, t)):
        assert set(full) == set(want)
        for name, out in full.items():
            assert_matches_reference(out, want[name], name=f"{arch} {name} output", rank=r)
            styles_seen.add(module_style(name, arch))
    assert {COLWISE, KV_COLWISE, ROWWISE} <= styles_seen  # the hooks did see the parallel layers


def test_a_style_table_passed_in_builds_the_model_site_by_site():
    config, t = CONFIGS["llama"][0], 2
    gelu = GPTConfig(vocab_size=29, seq_len=8, n_layers=1, hidden=16, n_heads=4, n_kv_heads=4, ffn=32)

    def sites_of(cfg):
        seen = []

        def recording(make):
            def make_and_record(module, group, site):
                seen.append((site.name, site.copied))
                return make(module, group, site)
            return make_and_record

        styles = {s: recording(make) for s, make in TP_STYLES.items()}
        model = run_spmd(lambda comm: gpt_to_tp(comm, init_gpt(cfg, 0), styles=styles), t)[0]
        return dict(seen), model

    seen, model = sites_of(config)
    assert {n for n in seen if module_style(n, "llama") == ROWWISE} == {
        f"blocks.{i}.{m}" for i in range(2) for m in ("attn.o", "mlp.down")}
    assert {"blocks.0.attn.copy_in", "blocks.0.mlp.copy_in", "copy_in", "cross_entropy", "wte"} <= set(seen)
    # one f at each copy_in point serves the column layers reading it: they skip their own
    assert seen["blocks.1.attn.k"] and seen["blocks.0.mlp.up"] and seen["lm_head"]
    assert model.blocks[1].attn.q.input_is_copied and model.blocks[0].mlp.gate.input_is_copied
    gelu_seen, gelu_model = sites_of(gelu)
    assert not gelu_seen["blocks.0.mlp.fc"] and not gelu_model.blocks[0].mlp.fc.input_is_copied  # alone: own f
    assert model.group is not None

    with pytest.raises(Exception, match=r"no entry for \['rowwise'\].*blocks\.\d\.attn\.o"):
        run_spmd(lambda comm: gpt_to_tp(comm, init_gpt(gelu, 0),
                                        styles={s: m for s, m in TP_STYLES.items() if s != ROWWISE}), 2)


def test_gpt_to_tp_copies_the_single_device_model_or_builds_it_from_its_state_dict():
    config = CONFIGS["gpt2"][0]
    single = init_gpt(config, 2, torch.float64)
    before = {n: p.detach().clone() for n, p in single.named_parameters()}
    x, y = global_batch(0, 2, config.seq_len, config.vocab_size, 2)

    def rank(comm):
        model = gpt_to_tp(comm, single)
        from_state = gpt_to_tp(comm, single.state_dict(), config)
        same = {n: torch.equal(v, from_state.state_dict()[n]) for n, v in model.state_dict().items()}
        _, loss = model(x, y)
        loss.backward()
        with torch.no_grad():
            for p in model.parameters():
                p -= 0.1 * p.grad                             # a step on the TP copy
        return same

    for same in run_spmd(rank, 2):
        assert all(same.values()), [n for n, ok in same.items() if not ok]
    for name, p in single.named_parameters():
        assert torch.equal(p.detach(), before[name]), f"{name} moved with the TP copy"
        assert p.grad is None
    assert set(PLANS["gpt2"]) >= {"blocks.*.attn.copy_in", "copy_in", "cross_entropy"}
