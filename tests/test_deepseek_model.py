"""The course's DeepSeek-V3 (MLA heads split, dense FFNs split, DeepSeekMoE in an inference
layout) equals transformers' DeepseekV3ForCausalLM built from a tiny config with random weights:
logits and every parameter's gradient, float64, at t = 1, 2, 4 on simulated ranks; greedy
generation with the latent cache equals transformers' generate; what it cannot map is named.

Routing is discrete: a forward hook on every transformers router measures the margin of the
hidden states it routes (deepseek.router.routing_margin) before anything is compared.
"""
import pytest
import torch

from tests.hf_models import deepseek_v3, deepseek_v3_config
from tp_from_scratch.comm import SPMDError, run_spmd
from tp_from_scratch.compare import assert_matches_reference
from tp_from_scratch.deepseek.arch import shard
from tp_from_scratch.deepseek.mla import cache_bytes_per_token
from tp_from_scratch.deepseek.model import (INFERENCE_LAYOUTS, ParallelDeepseekV3, check_config,
                                            from_hf_state_dict, generate, hf_name, to_hf_state_dict)
from tp_from_scratch.deepseek import MoEConfig, check_routing_margin, routing_margin
from tp_from_scratch.testing import rank_rng


def ids_for(seed, vocab, shape=(2, 7)):
    return torch.tensor(rank_rng(seed).integers(0, vocab, size=shape))


def reference_run(hf, ids, dlogits):
    """transformers' logits and gradients, with every router's margin checked on the way."""
    moe_config = MoEConfig.from_hf(hf.config)

    def margin(module, inputs, output):
        h = inputs[0].detach().reshape(-1, hf.config.hidden_size)
        check_routing_margin(routing_margin(h, module.weight, module.e_score_correction_bias, moe_config), h.dtype)

    hooks = [m.register_forward_hook(margin) for m in hf.modules() if type(m).__name__ == "DeepseekV3TopkRouter"]
    assert hooks, "no router found: the MoE layers were not built"
    hf.zero_grad()
    logits = hf(ids).logits
    (logits * dlogits).sum().backward()
    for h in hooks:
        h.remove()
    return logits.detach(), {n: p.grad.clone() for n, p in hf.named_parameters()}


def _rank(comm, config, sd, layout, ids, dlogits):
    model = from_hf_state_dict(config, sd, group=comm, layout=layout)
    logits = model(ids)
    (logits * dlogits).sum().backward()
    return logits.detach(), {n: p.grad for n, p in model.named_parameters()}


@pytest.mark.parametrize("layout", INFERENCE_LAYOUTS)
@pytest.mark.parametrize("t", [1, 2, 4])
def test_logits_and_every_gradient_equal_transformers(t, layout):
    hf = deepseek_v3(seed=t)
    ids = ids_for(10 + t, hf.config.vocab_size)
    dlogits = torch.tensor(rank_rng(20 + t).standard_normal((2, 7, hf.config.vocab_size)))
    logits_ref, grads_ref = reference_run(hf, ids, dlogits)
    sd = hf.state_dict()
    for r, (logits, grads) in enumerate(run_spmd(_rank, t, hf.config, sd, layout, ids, dlogits)):
        # at this point every rank's logits must be transformers' (they are replicated)
        assert_matches_reference(logits, logits_ref, name="logits", rank=r)
        assert len(grads) == len(grads_ref)
        for name, g in grads.items():
            expected = shard(name, grads_ref[hf_name(name)], layout, t, r)
            assert_matches_reference(g, expected, name=f"grad {name}", rank=r)


def _rank_from_files(comm, path, layout, ids, dlogits):
    from tp_from_scratch.deepseek.model import load_hf
    model = load_hf(path, group=comm, layout=layout)
    logits = model(ids)
    (logits * dlogits).sum().backward()
    return logits.detach(), {n: p.grad for n, p in model.named_parameters()}


@pytest.mark.parametrize("files", ["padding", "tied", "tied-with-a-copy"])
def test_pad_token_id_and_tied_embeddings_imported_from_files_equal_transformers(files, tmp_path):
    # pad_token_id: transformers' embedding gives the padding row no gradient (nn.Embedding's
    # padding_idx); tie_word_embeddings: one parameter, embedding and head, whose gradient sums
    # both uses. save_pretrained leaves a tied head out; other files carry a copy of it.
    from safetensors.torch import load_file, save_file
    pad = 5
    hf = deepseek_v3(seed=40, **({"pad_token_id": pad} if files == "padding" else {"tie_word_embeddings": True}))
    if files != "padding":
        assert hf.lm_head.weight is hf.model.embed_tokens.weight, "transformers' reference is not tied"
    ids = ids_for(41, hf.config.vocab_size)
    ids[:, 1] = pad
    dlogits = torch.tensor(rank_rng(42).standard_normal((2, 7, hf.config.vocab_size)))
    logits_ref, grads_ref = reference_run(hf, ids, dlogits)
    if files == "padding":
        assert torch.count_nonzero(grads_ref["model.embed_tokens.weight"][pad]) == 0
    hf.save_pretrained(tmp_path)
    if files == "tied-with-a-copy":
        sd = load_file(tmp_path / "model.safetensors")
        sd["lm_head.weight"] = sd["model.embed_tokens.weight"].clone()
        save_file(sd, tmp_path / "model.safetensors", metadata={"format": "pt"})
    layout = INFERENCE_LAYOUTS[0]
    for t in (1, 2):
        for r, (logits, grads) in enumerate(run_spmd(_rank_from_files, t, tmp_path, layout, ids, dlogits)):
            assert_matches_reference(logits, logits_ref, name=f"logits ({files})", rank=r)
            assert sorted(hf_name(n) for n in grads) == sorted(grads_ref), "the same parameters (tied: one)"
            for name, g in grads.items():
                expected = shard(name, grads_ref[hf_name(name)], layout, t, r)
                assert_matches_reference(g, expected, name=f"grad {name} ({files})", rank=r)
            if files == "padding":
                assert torch.count_nonzero(grads["embed_tokens.weight"][pad]) == 0, f"rank {r}: padding row"
    if files != "padding":   # exported back: save_pretrained's files of a tied model (no head of its own)
        import json
        from tp_from_scratch.comm import Comm
        from tp_from_scratch.deepseek.model import load_hf, save_hf
        save_hf(tmp_path / "back", load_hf(tmp_path, group=Comm(0, 1)))
        original, back = load_file(tmp_path / "model.safetensors"), load_file(tmp_path / "back" / "model.safetensors")
        original.pop("lm_head.weight", None)
        assert set(back) == set(original) and all(torch.equal(back[k], v) for k, v in original.items())
        assert json.loads((tmp_path / "back" / "config.json").read_text())["tie_word_embeddings"] is True


@pytest.mark.parametrize("t", [2, 4])
def test_queries_without_a_latent_equal_transformers(t):
    # q_lora_rank=None (DeepSeek-V2-Lite's form, kept by DeepseekV3): q_proj split by heads
    hf = deepseek_v3(seed=95 + t, q_lora_rank=None)
    assert hasattr(hf.model.layers[0].self_attn, "q_proj")
    ids = ids_for(96, hf.config.vocab_size)
    dlogits = torch.tensor(rank_rng(97).standard_normal((2, 7, hf.config.vocab_size)))
    logits_ref, grads_ref = reference_run(hf, ids, dlogits)
    for r, (logits, grads) in enumerate(run_spmd(_rank, t, hf.config, hf.state_dict(), INFERENCE_LAYOUTS[1], ids,
                                                 dlogits)):
        assert_matches_reference(logits, logits_ref, name="logits without a query latent", rank=r)
        assert len(grads) == len(grads_ref) and "layers.0.self_attn.q_proj.weight" in grads
        for name, g in grads.items():
            expected = shard(name, grads_ref[hf_name(name)], INFERENCE_LAYOUTS[1], t, r)
            assert_matches_reference(g, expected, name=f"grad {name}", rank=r)


def _generate(comm, config, sd, prompt, n):
    model = from_hf_state_dict(config, sd, group=comm)
    ids, cache = generate(model, prompt, n)
    return ids, cache.nbytes() / (cache.length() * len(cache.layers) * prompt.shape[0])


@pytest.mark.parametrize("t", [1, 2, 4])
def test_greedy_generation_with_the_latent_cache_equals_transformers(t):
    hf = deepseek_v3(seed=30 + t)
    prompt = ids_for(31 + t, hf.config.vocab_size, (2, 4))
    expected = hf.generate(prompt, max_new_tokens=6, do_sample=False, pad_token_id=0)
    for r, (ids, per_token) in enumerate(run_spmd(_generate, t, hf.config, hf.state_dict(), prompt, 6)):
        assert torch.equal(ids, expected), f"rank {r}: {ids.tolist()} != {expected.tolist()}"
        # the latent is not split: every rank caches kv_lora + rope numbers per token and layer
        assert per_token == cache_bytes_per_token(hf.config, t, 8, "mla")


def test_export_gives_back_transformers_state_dict():
    hf = deepseek_v3(seed=40)
    sd = run_spmd(lambda comm: to_hf_state_dict(from_hf_state_dict(hf.config, hf.state_dict(), group=comm)), 1)[0]
    expected = hf.state_dict()
    assert sd.keys() == expected.keys()
    for name in sd:
        assert_matches_reference(sd[name], expected[name], name=name, exact=True)


@pytest.mark.parametrize("change, t, match", [
    (dict(topk_method="greedy"), 1, "topk_method='greedy' is not supported"),
    (dict(rope_parameters={"rope_type": "llama3", "rope_theta": 1000.0, "factor": 4.0}), 1,
     "rope_type='llama3' is not supported"),
    (dict(rope_parameters={"rope_type": "yarn", "rope_theta": 1000.0, "factor": 4.0}), 1,
     "rope_type='yarn' needs original_max_position_embeddings"),
    (dict(rope_parameters={"rope_type": "yarn", "rope_theta": 1000.0, "original_max_position_embeddings": 8}), 1,
     "rope_type='yarn' needs factor"),
    ({}, 3, "num_attention_heads 4 is not divisible by tp=3"),
])
def test_configs_and_degrees_the_course_cannot_map_are_named(change, t, match):
    config = deepseek_v3_config()
    for key, value in change.items():
        setattr(config, key, value)
    with pytest.raises(ValueError, match=match):
        check_config(config, t)


def test_an_unknown_layout_is_refused_for_the_model():
    with pytest.raises(SPMDError, match="layout 'pipeline' is not one of"):
        run_spmd(lambda comm: from_hf_state_dict(deepseek_v3_config(), {}, group=comm, layout="pipeline"), 1)


def _ep_rank(comm, config, sd, ids, dlogits):
    model = from_hf_state_dict(config, sd, group=comm, layout="expert parallel")
    logits = model(ids[comm.rank])
    (logits * dlogits[comm.rank]).sum().backward()
    model.sum_replicated_gradients()  # data parallelism's all-reduce, after backward
    return logits.detach(), {n: p.grad for n, p in model.named_parameters()}


@pytest.mark.parametrize("t", [2, 4])
def test_expert_parallel_training_layout_equals_transformers(t):
    # DeepSeek-V3's own: each rank its own sequences, attention whole, experts spread
    hf = deepseek_v3(seed=70 + t)
    V = hf.config.vocab_size
    ids = [ids_for(71 + r, V, (1, 7)) for r in range(t)]
    dlogits = [torch.tensor(rank_rng(80, r).standard_normal((1, 7, V))) for r in range(t)]
    logits_ref, grads_ref = reference_run(hf, torch.cat(ids), torch.cat(dlogits))
    for r, (logits, grads) in enumerate(run_spmd(_ep_rank, t, hf.config, hf.state_dict(), ids, dlogits)):
        assert_matches_reference(logits, logits_ref[r:r + 1], name="logits of this rank's sequence", rank=r)
        for name, g in grads.items():
            expected = shard(name, grads_ref[hf_name(name)], "expert parallel", t, r)
            assert_matches_reference(g, expected, name=f"grad {name}", rank=r)


def test_files_in_and_out_of_the_save_pretrained_format(tmp_path):
    from transformers import DeepseekV3ForCausalLM
    from tests.hf_models import float64_deepseek
    from tp_from_scratch.deepseek.model import load_hf, save_hf
    hf = deepseek_v3(seed=50)
    hf.save_pretrained(tmp_path / "hf")
    ids = ids_for(51, hf.config.vocab_size)
    expected = hf(ids).logits.detach()
    # in: two ranks read the files, each keeps its share
    for r, logits in enumerate(run_spmd(lambda comm: load_hf(tmp_path / "hf", group=comm)(ids).detach(), 2)):
        assert_matches_reference(logits, expected, name="logits of the imported model", rank=r)
    # out: one rank writes them, transformers reads them back
    run_spmd(lambda comm: save_hf(tmp_path / "ours", load_hf(tmp_path / "hf", group=comm)), 1)
    back = DeepseekV3ForCausalLM.from_pretrained(tmp_path / "ours", experts_implementation="eager")
    back = float64_deepseek(back.to(torch.float64).eval())  # the router is loaded in float32
    assert_matches_reference(back(ids).logits.detach(), expected, name="logits after export")


def test_a_checkpoint_of_another_model_type_is_named(tmp_path):
    from tp_from_scratch.deepseek.model import config_from_hf
    with pytest.raises(ValueError, match="model_type 'llama': only 'deepseek_v3'"):
        config_from_hf({"model_type": "llama"})
    with pytest.raises(ValueError, match="config.json lacks kv_lora_rank"):
        config_from_hf({k: v for k, v in deepseek_v3_config().to_dict().items() if k != "kv_lora_rank"})


# ---- training on real text through THE training step: every step's loss equal to transformers' ----

def _next_byte_loss(forward, n_tokens):
    """run_batch for gpt.step.train_step: cross-entropy summed over these tokens / all tokens of
    the step, so that under expert parallelism the ranks' losses (and gradients) add up to the mean."""
    def run_batch(model, x, y):
        logits = forward(model, x)
        loss = torch.nn.functional.cross_entropy(logits.reshape(-1, logits.shape[-1]), y.reshape(-1),
                                                 reduction="sum") / n_tokens
        loss.backward()
        return loss
    return run_batch


@pytest.mark.parametrize("layout", ["experts on all tokens", "expert parallel"])
def test_three_training_steps_on_text_give_transformers_losses(layout):
    from tp_from_scratch.gpt.text import VOCAB_SIZE, text_batch
    from tp_from_scratch.gpt.step import train_step
    t, lr = 2, 0.05
    hf = deepseek_v3(seed=60, vocab_size=VOCAB_SIZE)
    batches = [text_batch(step, 2, 8, seed=61)[0] for step in range(3)]  # (2, 9): 2 sequences of 8 + 1
    n_tokens = 2 * 8
    sd = {k: v.clone() for k, v in hf.state_dict().items()}

    def margins(module, inputs, output):  # every router, every step: no near-tie on the way
        h = inputs[0].detach().reshape(-1, hf.config.hidden_size)
        check_routing_margin(routing_margin(h, module.weight, module.e_score_correction_bias,
                                            MoEConfig.from_hf(hf.config)), h.dtype)

    for m in hf.modules():
        if type(m).__name__ == "DeepseekV3TopkRouter":
            m.register_forward_hook(margins)
    hf_step = _next_byte_loss(lambda model, x: model(x).logits, n_tokens)
    optimizer = torch.optim.SGD(hf.parameters(), lr=lr)
    expected = [train_step(hf, optimizer, ids[:, :-1], ids[:, 1:], run_batch=hf_step) for ids in batches]

    def rank(comm):
        model = from_hf_state_dict(hf.config, sd, group=comm, layout=layout)
        optimizer = torch.optim.SGD(model.parameters(), lr=lr)
        run_batch = _next_byte_loss(lambda m, x: m(x), n_tokens)
        mine = (lambda ids: ids[comm.rank:comm.rank + 1]) if layout == "expert parallel" else (lambda ids: ids)
        return [train_step(model, optimizer, mine(ids)[:, :-1], mine(ids)[:, 1:], run_batch=run_batch,
                           after_backward=ParallelDeepseekV3.sum_replicated_gradients) for ids in batches]

    per_rank = run_spmd(rank, t)
    for step, loss_ref in enumerate(expected):
        # at this point the step's loss must be transformers': expert parallelism adds its ranks' shares
        losses = [per_rank[r][step] for r in range(t)]
        for r, loss in enumerate([sum(losses)] if layout == "expert parallel" else losses):
            assert_matches_reference(loss, loss_ref, name=f"{layout} loss at step {step}", rank=r)


def test_ranks_that_do_not_divide_the_experts_are_named_for_expert_parallelism():
    hf = deepseek_v3(seed=90)
    with pytest.raises(SPMDError, match=r"n_routed_experts \(for expert parallelism\) 8 is not divisible by tp=3"):
        run_spmd(lambda comm: from_hf_state_dict(hf.config, hf.state_dict(), group=comm, layout="expert parallel"), 3)


# ---- YaRN: DeepSeek-V3's RoPE, stretched from a 4K to a 128K context ----------------------------

# DeepSeek-V3's own rope_scaling (its config.json), a variant whose cos/sin factor is not 1 and
# whose ramp is not rounded, and one with YaRN's defaults only
YARNS = [dict(factor=40, beta_fast=32, beta_slow=1, mscale=1.0, mscale_all_dim=1.0,
              original_max_position_embeddings=4096),
         dict(factor=8.0, mscale=0.707, mscale_all_dim=1.0, original_max_position_embeddings=8, truncate=False),
         dict(factor=3.0, original_max_position_embeddings=16)]


def yarn_config(rope, **sizes):
    return deepseek_v3_config(rope_parameters={"rope_type": "yarn", "rope_theta": 10000.0, **rope}, **sizes)


@pytest.mark.parametrize("rope", YARNS, ids=["deepseek_v3", "attention_factor", "defaults"])
@pytest.mark.parametrize("rope_dim", [4, 64])
def test_yarn_frequencies_and_scales_equal_transformers(rope, rope_dim):
    from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS
    from transformers.models.deepseek_v3.modeling_deepseek_v3 import yarn_apply_mscale
    from tp_from_scratch.deepseek.mla import rope_frequencies
    config = yarn_config(rope, qk_rope_head_dim=rope_dim,
                         max_position_embeddings=int(rope["factor"] * rope["original_max_position_embeddings"]))
    inv_freq, cos_sin, softmax = rope_frequencies(config)
    expected, attention_scaling = ROPE_INIT_FUNCTIONS["yarn"](config)      # transformers computes them in float32
    assert_matches_reference(inv_freq.float(), expected, name="YaRN frequencies (float32's precision)")
    qk = config.qk_nope_head_dim + rope_dim
    assert cos_sin == pytest.approx(attention_scaling, rel=1e-15)
    assert softmax / qk ** 0.5 == pytest.approx(yarn_apply_mscale(config.rope_parameters, qk ** -0.5), rel=1e-15)
    plain = 10000.0 ** -(torch.arange(0, rope_dim, 2, dtype=torch.float64) / rope_dim)
    assert (inv_freq <= plain * (1 + 1e-12)).all() and inv_freq[-1] < plain[-1]   # YaRN only slows pairs down


@pytest.mark.parametrize("t", [1, 2])
def test_a_yarn_model_equals_transformers(t):
    # transformers' float32 frequencies given to both models (their formula is checked above):
    # the rest (angles, the cos/sin and softmax scales, the cache) must match at float64
    from transformers import DeepseekV3ForCausalLM
    from tests.hf_models import float64_deepseek, randomize, randomize_router_bias
    config = yarn_config(dict(YARNS[1], original_max_position_embeddings=4), max_position_embeddings=32)
    hf = float64_deepseek(randomize_router_bias(randomize(DeepseekV3ForCausalLM(config), 90), 91).double().eval())
    inv_freq = next(m.inv_freq for m in hf.modules() if type(m).__name__ == "DeepseekV3RotaryEmbedding")
    ids = ids_for(92, config.vocab_size)
    dlogits = torch.tensor(rank_rng(93).standard_normal((2, 7, config.vocab_size)))
    logits_ref, grads_ref = reference_run(hf, ids, dlogits)

    def rank(comm):
        model = from_hf_state_dict(config, hf.state_dict(), group=comm)
        for layer in model.layers:
            layer.self_attn.inv_freq.copy_(inv_freq)
        assert layer.self_attn.rope_multiplier != 1.0 and layer.self_attn.softmax_scale != (6 + 4) ** -0.5
        logits = model(ids)
        (logits * dlogits).sum().backward()
        return logits.detach(), {n: p.grad for n, p in model.named_parameters()}, generate(model, ids[:, :3], 4)[0]

    hf.generation_config.eos_token_id = None          # ours has no end-of-sequence stop
    expected_ids = hf.generate(ids[:, :3], max_new_tokens=4, do_sample=False, pad_token_id=0)
    for r, (logits, grads, generated) in enumerate(run_spmd(rank, t)):
        assert_matches_reference(logits, logits_ref, name="logits with YaRN", rank=r)
        for name, g in grads.items():
            assert_matches_reference(g, shard(name, grads_ref[hf_name(name)], INFERENCE_LAYOUTS[0], t, r),
                                     name=f"grad {name} with YaRN", rank=r)
        assert torch.equal(generated, expected_ids), (generated.tolist(), expected_ids.tolist())


def test_deepseek_v3s_own_config_json_reads_with_its_yarn():
    from tp_from_scratch.deepseek.model import config_from_hf
    own = {k: v for k, v in deepseek_v3_config().to_dict().items() if k != "rope_parameters"}
    own.update(rope_theta=10000, rope_scaling={"type": "yarn", **YARNS[0]})   # as deepseek-ai's config.json
    config = config_from_hf(own)
    assert config.rope_parameters == {"rope_type": "yarn", "rope_theta": 10000, **YARNS[0]}
    check_config(config, 2)


def test_every_tensor_of_the_files_must_have_its_place_but_the_mtp_module(recwarn):
    # a stray tensor is named; DeepSeek-V3's multi-token-prediction layer (its files append it as
    # layer num_hidden_layers) is skipped with a warning, as transformers skips it; float8 refused
    hf = deepseek_v3(seed=98)
    config, sd = hf.config, hf.state_dict()
    L = config.num_hidden_layers

    def load(state, **changes):
        for key, value in changes.items():
            setattr(config, key, value)
        return run_spmd(lambda comm: from_hf_state_dict(config, state, group=comm), 1)[0]

    with pytest.raises(SPMDError, match=r"1 tensors have no place in the model, e.g. \['model.extra'\]"):
        load({**sd, "model.extra": torch.zeros(1)})
    scales = {f"model.layers.{L - 1}.mlp.shared_experts.up_proj.weight_scale_inv": torch.ones(1)}
    with pytest.raises(SPMDError, match="block-quantized float8 weights: dequantize them first"):
        load({**sd, **scales})
    mtp = {f"model.layers.{L}.eh_proj.weight": torch.zeros(2, 2), f"model.layers.{L}.enorm.weight": torch.ones(2)}
    with pytest.raises(SPMDError, match=f"model.layers.{L}.eh_proj.weight"):
        load({**sd, **mtp}, num_nextn_predict_layers=0)
    load({**sd, **mtp}, num_nextn_predict_layers=1)
    assert any("skipped 2 tensors of the multi-token-prediction module" in str(w.message) for w in recwarn)
    name = "model.layers.0.self_attn.o_proj.weight"
    with pytest.raises(SPMDError, match=f"{name} is torch.float8_e4m3fn: quantized weights are not supported"):
        load({**sd, name: sd[name].to(torch.float8_e4m3fn)})
