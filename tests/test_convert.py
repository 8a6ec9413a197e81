"""Hugging Face checkpoints in and out: our GPT (single device and TP at t = 1, 2, 4 on simulated
ranks) equals transformers' GPT2LMHeadModel / LlamaForCausalLM on the same weights.

Logits, the loss on the same targets, and the gradient of every parameter (ours mapped to
Hugging Face's names by convert.to_hf, which is linear, so it maps gradients too), float64.
"""
import json

import pytest
import torch
import torch.nn.functional as F

pytest.importorskip("transformers")
import hf_models  # noqa: E402  (tests/hf_models.py)

from tp_from_scratch.comm import run_spmd
from tp_from_scratch.compare import assert_matches_reference
from tp_from_scratch.gpt import checkpoint as ckpt
from tp_from_scratch.gpt import convert
from tp_from_scratch.gpt.data import global_batch
from tp_from_scratch.gpt.model import GPT, init_gpt
from tp_from_scratch.gpt.parallelize import gather_state_dict, gpt_to_tp
from tp_from_scratch.gpt.check import BASE
from tp_from_scratch.nn import gather_from_tp_region, tp_rank


def hf_reference(hf, x, y):
    """transformers' logits (B, T, V), loss on targets y, and every parameter's gradient."""
    hf.zero_grad()
    logits = hf(input_ids=x).logits
    loss = F.cross_entropy(logits.flatten(0, 1), y.flatten())
    loss.backward()
    return logits.detach(), loss.detach(), {n: p.grad.clone() for n, p in hf.named_parameters()}


def check_tp_against_hf(comm, config, full, x, y, ref, pad=None):
    """On one rank: the TP model from the imported weights against transformers' results (and,
    with ``pad``, the padding row's embedding gradient exactly zero, on the rank that holds it)."""
    logits_ref, loss_ref, grads_ref = ref
    rank = tp_rank(comm)
    model = gpt_to_tp(comm, full, config)
    logits, loss = model(x, y)
    loss.backward()
    assert_matches_reference(loss, loss_ref, name="loss against transformers", rank=rank)
    assert_matches_reference(gather_from_tp_region(comm, logits.detach(), model.wte.vocab_sizes), logits_ref,
                             name="logits against transformers", rank=rank)
    grads = gather_state_dict(comm, {n: p.grad for n, p in model.named_parameters()}, config)
    as_hf = convert.to_hf(grads, config)
    for name, g in grads_ref.items():
        assert_matches_reference(as_hf[name], g, name=f"grad of {name} against transformers", rank=rank)
    if pad is not None:
        start, stop = model.wte.vocab_start, model.wte.vocab_stop
        if start <= pad < stop:
            assert torch.count_nonzero(model.wte.weight.grad[pad - start]) == 0, f"rank {rank}: padding row's gradient"


def imported(hf, tmp_path):
    hf.save_pretrained(tmp_path)  # config.json + model.safetensors, as on the hub
    config, full = convert.load_hf(tmp_path, dtype=next(hf.parameters()).dtype)
    return config, full


@pytest.mark.parametrize("name", ["gpt2", "gpt2-pad-token-ignored", "llama-gqa", "llama-one-kv-head-tied",
                                  "llama-padding"])
def test_imported_model_equals_transformers_at_t_1_2_4(name, tmp_path):
    x, y = global_batch(0, 3, 16, 67, seed=5)
    pad = int(x[0, 0])   # a token of the batch: LlamaModel's embedding gives its row no gradient, GPT2Model's does
    hf = {"gpt2": lambda: hf_models.gpt2(),
          "gpt2-pad-token-ignored": lambda: hf_models.gpt2(pad_token_id=pad),
          "llama-gqa": lambda: hf_models.llama(),  # nkv = 2: replicated over 2 ranks at t = 4
          "llama-one-kv-head-tied": lambda: hf_models.llama(num_key_value_heads=1, tie_word_embeddings=True,
                                                            rms_norm_eps=1e-5),
          "llama-padding": lambda: hf_models.llama(pad_token_id=pad)}[name]()
    config, full = imported(hf, tmp_path)
    ref = hf_reference(hf, x, y)
    if name == "llama-padding":   # the reference is what the test says it is
        assert torch.count_nonzero(ref[2]["model.embed_tokens.weight"][pad]) == 0 and config.pad_token_id == pad
    for tp in (1, 2, 4):
        run_spmd(lambda comm: check_tp_against_hf(comm, config, full, x, y, ref,
                                                  config.pad_token_id if name == "llama-padding" else None), tp)


def test_unpatched_llama_agrees_in_float32(tmp_path):
    # transformers' own float32 RMSNorm and RoPE tables, our float64-then-cast tables: float32 tolerance
    hf = hf_models.llama(seed=2, dtype=torch.float32, patch=False)
    config, full = imported(hf, tmp_path)
    x, y = global_batch(1, 2, 16, 67, seed=5)
    ref = hf_reference(hf, x, y)
    run_spmd(lambda comm: check_tp_against_hf(comm, config, full, x, y, ref), 2)


@pytest.mark.parametrize("arch", ["gpt", "gpt2", "llama"])
def test_export_then_transformers_loads_the_same_model(arch, tmp_path):
    # ours -> save_pretrained directory -> transformers' from_pretrained: the same logits; the
    # course's own "gpt" (erf GeLU, no key bias, 4 KV heads for 8 query heads) becomes a GPT-2
    # with its KV heads repeated. Import of the export gives back our weights bit for bit.
    from transformers import AutoModelForCausalLM
    config = BASE if arch == "gpt" else convert.config_from_hf(
        json.loads(json.dumps(convert.hf_config(type(BASE)(**{**BASE.to_dict(), "arch": arch,
                                                              **_arch_fields(arch)})))))
    model = init_gpt(config, 3, torch.float64)
    with torch.no_grad():  # random biases and norms too
        g = torch.Generator().manual_seed(1)
        for n, p in model.named_parameters():
            p.add_(0.1 * torch.randn(p.shape, generator=g, dtype=torch.float64))
    ckpt.save_single_device(model, tmp_path / "ours.pt")
    assert convert.main(["export", str(tmp_path / "ours.pt"), "--out", str(tmp_path / "hf")]) is None
    hf = AutoModelForCausalLM.from_pretrained(tmp_path / "hf", dtype=torch.float64, attn_implementation="sdpa")
    if arch == "llama":
        hf_models.float64_llama(hf)
    x, _ = global_batch(0, 2, 16, 67, seed=2)
    assert_matches_reference(hf(input_ids=x).logits, model(x)[0], name=f"{arch} logits in transformers")
    if arch != "gpt":
        back = convert.load_hf(tmp_path / "hf")[1]
        for n, p in model.state_dict().items():
            assert_matches_reference(back[n], p, name=f"{n} after export and import", exact=True)


def _arch_fields(arch):
    # the arch preset's fields (BASE.to_dict() holds gpt's resolved values)
    from tp_from_scratch.gpt.arch import ARCHS
    fields = dict(ARCHS[arch])
    return {**fields, "n_kv_heads": BASE.n_heads if arch == "gpt2" else BASE.n_kv_heads}


def test_import_command_writes_a_sharded_checkpoint_that_loads_at_any_t(tmp_path):
    hf = hf_models.gpt2(dtype=torch.float32)
    hf.save_pretrained(tmp_path / "hf")
    convert.main(["import", str(tmp_path / "hf"), "--out", str(tmp_path / "ours"), "--tp", "2"])
    loaded = ckpt.load_full(tmp_path / "ours")
    assert loaded["meta"]["tp"] == 2 and loaded["config"].arch == "gpt2"
    model = GPT(loaded["config"])
    model.load_state_dict(loaded["model"])
    x, _ = global_batch(0, 2, 16, 67, seed=2)
    assert_matches_reference(model(x)[0], hf(input_ids=x).logits, name="logits of the imported checkpoint")


def test_unsupported_checkpoints_are_refused_with_the_reason():
    with pytest.raises(convert.ConversionError, match="rope_type 'llama3'"):
        convert.config_from_hf({"model_type": "llama", "rope_parameters": {"rope_type": "llama3"}})
    with pytest.raises(convert.ConversionError, match="only 'gpt2' and 'llama'"):
        convert.config_from_hf({"model_type": "bert"})


def test_a_gpt2model_file_as_on_the_hub_imports(tmp_path):
    # the hub's GPT-2 files were saved from GPT2Model: no "transformer." prefix, no lm_head
    # (tied), and older ones carry the causal-mask buffers h.i.attn.bias / masked_bias
    from safetensors.torch import save_file
    hf = hf_models.gpt2(dtype=torch.float32)
    sd = {k.removeprefix("transformer."): v.contiguous() for k, v in hf.state_dict().items() if k != "lm_head.weight"}
    for i in range(hf.config.n_layer):
        sd[f"h.{i}.attn.bias"] = torch.ones(1, 1, 16, 16).tril()
        sd[f"h.{i}.attn.masked_bias"] = torch.tensor(-1e4)
    save_file(sd, str(tmp_path / "model.safetensors"))
    (tmp_path / "config.json").write_text(json.dumps(hf.config.to_dict()))
    config, full = convert.load_hf(tmp_path / "model.safetensors")
    model = GPT(config)
    model.load_state_dict(full)
    x, _ = global_batch(0, 2, 16, 67, seed=2)
    assert_matches_reference(model(x)[0], hf(input_ids=x).logits, name="logits of the hub-style file")
    sd["h.0.attn.extra.weight"] = torch.zeros(2)
    save_file(sd, str(tmp_path / "model.safetensors"))
    with pytest.raises(convert.ConversionError, match="no place in the model"):
        convert.load_hf(tmp_path)


def test_a_tied_config_with_a_distinct_head_imports_as_transformers_loads_it(tmp_path):
    # config.json says tied, the file holds an lm_head.weight of its own;
    # from_pretrained keeps the two apart (and warns), so must the import: the same logits
    from transformers import LlamaForCausalLM
    hf_models.llama(seed=6, dtype=torch.float32).save_pretrained(tmp_path)   # untied
    hf_config = json.loads((tmp_path / "config.json").read_text())
    (tmp_path / "config.json").write_text(json.dumps({**hf_config, "tie_word_embeddings": True}))
    theirs = LlamaForCausalLM.from_pretrained(tmp_path, dtype=torch.float32, attn_implementation="sdpa").eval()
    with pytest.warns(convert.ConversionWarning, match="lm_head.weight differs"):
        config, full = convert.load_hf(tmp_path)
    ours = convert.gpt_from_weights(config, full, tmp_path)
    x, _ = global_batch(0, 2, 16, 67, seed=2)
    with torch.no_grad():
        assert_matches_reference(ours(x)[0], theirs(input_ids=x).logits, name="logits of the untied import")
