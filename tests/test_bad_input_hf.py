"""Bad input to Hugging Face import/export and to generation.

Each case is one of ../shared/reviews/new-features-bad-input.md's, run in-process through the
command's own ``main``: it must be refused before any work, in one line naming the flag, file,
key or tensor, with a non-zero exit and nothing written; or, where transformers defines the
behaviour (a tied config whose file holds a head of its own), done as transformers does it.

The fixtures are the review's: a tiny GPT-2 and Llama (2 layers, H = 32, 4 heads, V = 67,
T = 16) exported to save_pretrained form by our own exporter, and a course GPT file.
"""
import json
import os
import shutil

import pytest
import torch

from tp_from_scratch.compare import assert_matches_reference
from tp_from_scratch.gpt import checkpoint as ckpt
from tp_from_scratch.gpt import convert, generate
from tp_from_scratch.gpt.model import GPTConfig, init_gpt


@pytest.fixture(scope="module")
def fixtures(tmp_path_factory):
    """{"gpt2", "llama": save_pretrained directories; "gpt": a single-device file} (read-only)."""
    root = tmp_path_factory.mktemp("hf_fixtures")
    paths = {}
    for arch, nkv in (("gpt2", 4), ("llama", 2), ("gpt", 2)):
        model = init_gpt(GPTConfig(arch=arch, vocab_size=67, seq_len=16, n_layers=2, hidden=32, n_heads=4,
                                   n_kv_heads=nkv), 0, torch.float32)
        if arch == "gpt":
            paths[arch] = root / "gpt.pt"
            ckpt.save_single_device(model, paths[arch])
        else:
            paths[arch] = root / f"hf_{arch}"
            convert.write_hf(paths[arch], model.state_dict(), model.config)
    return paths


def copy_of(fixtures, arch, tmp_path):
    """A private copy of a fixture directory, to damage."""
    return shutil.copytree(fixtures[arch], tmp_path / arch)


def edit_config(directory, **changes):
    path = directory / "config.json"
    hf = json.loads(path.read_text())
    for key, value in changes.items():
        if value is None:
            del hf[key]
        else:
            hf[key] = value
    path.write_text(json.dumps(hf))


def refusal(main, argv, capsys):
    """Run a command that must refuse: its exit status must be non-zero and its stderr end
    in one line (no traceback); that line is returned."""
    with pytest.raises(SystemExit) as exit_:
        main([str(a) for a in argv])
    err = capsys.readouterr().err
    assert exit_.value.code not in (0, None), f"exit status {exit_.value.code}; stderr: {err}"
    assert "Traceback" not in err, err
    return err.strip().splitlines()[-1]


def listing(directory):
    return sorted(os.listdir(directory))


# ---------------------------------------------------------------------------------------
# Import: configs and files that cannot be mapped exactly (a missing tensor too)
# ---------------------------------------------------------------------------------------

def test_untied_config_without_lm_head_is_refused_naming_both(fixtures, tmp_path, capsys):
    hf = copy_of(fixtures, "gpt2", tmp_path)       # tied: the file holds no lm_head.weight
    edit_config(hf, tie_word_embeddings=False)
    line = refusal(convert.main, ["import", hf, "--out", tmp_path / "out"], capsys)
    assert "lm_head.weight" in line and "tie_word_embeddings=false" in line, line
    assert not (tmp_path / "out").exists()


def test_truncated_safetensors_is_refused_naming_the_file(fixtures, tmp_path, capsys):
    hf = copy_of(fixtures, "gpt2", tmp_path)
    data = (hf / "model.safetensors").read_bytes()
    (hf / "model.safetensors").write_bytes(data[:len(data) // 2])
    line = refusal(convert.main, ["import", hf, "--out", tmp_path / "out"], capsys)
    assert str(hf / "model.safetensors") in line and "truncated or corrupt" in line, line
    assert not (tmp_path / "out").exists()


def test_config_that_is_not_json_is_refused_naming_the_file(fixtures, tmp_path, capsys):
    hf = copy_of(fixtures, "gpt2", tmp_path)
    (hf / "config.json").write_text('{"model_type": "gpt2", \n')
    line = refusal(convert.main, ["import", hf, "--out", tmp_path / "out"], capsys)
    assert str(hf / "config.json") in line and "JSON" in line, line
    assert not (tmp_path / "out").exists()


SIZES = {"gpt2": ("vocab_size", "n_positions", "n_layer", "n_embd", "n_head"),
         "llama": ("vocab_size", "max_position_embeddings", "num_hidden_layers", "hidden_size",
                   "num_attention_heads", "intermediate_size")}


@pytest.mark.parametrize("arch, key", [(arch, key) for arch, keys in SIZES.items() for key in keys])
def test_config_without_a_required_key_is_refused_naming_key_and_file(arch, key, fixtures, tmp_path, capsys):
    hf = copy_of(fixtures, arch, tmp_path)
    edit_config(hf, **{key: None})
    line = refusal(convert.main, ["import", hf, "--out", tmp_path / "out"], capsys)
    assert f"{hf / 'config.json'} has no {key} " in line, line
    assert not (tmp_path / "out").exists()


def test_pickled_code_in_pytorch_model_bin_never_runs_and_is_named(fixtures, tmp_path, capsys):
    evil = tmp_path / "evil"
    evil.mkdir()
    shutil.copy(fixtures["gpt2"] / "config.json", evil)
    marker = tmp_path / "PWNED"

    class Payload:                                   # unpickling it would create the marker file
        def __reduce__(self):
            return (os.system, (f"touch {marker}",))
    torch.save({"x": Payload()}, evil / "pytorch_model.bin")
    line = refusal(convert.main, ["import", evil, "--out", tmp_path / "out"], capsys)
    assert str(evil / "pytorch_model.bin") in line and "nothing in it ran" in line, line
    assert not marker.exists() and not (tmp_path / "out").exists()


def test_a_missing_tensor_is_refused_naming_it(fixtures, tmp_path, capsys):
    from safetensors.torch import load_file, save_file
    hf = copy_of(fixtures, "llama", tmp_path)
    tensors = load_file(hf / "model.safetensors")
    del tensors["model.layers.1.mlp.up_proj.weight"]
    save_file(tensors, hf / "model.safetensors")
    line = refusal(convert.main, ["import", hf, "--out", tmp_path / "out"], capsys)
    assert "has no tensor 'model.layers.1.mlp.up_proj.weight'" in line, line
    # ... and our own checkpoint missing one, in generate
    obj = torch.load(fixtures["gpt"], weights_only=True)
    del obj["model"]["blocks.1.attn.q.weight"]
    torch.save(obj, tmp_path / "missing.pt")
    line = refusal(generate.main, ["--load", tmp_path / "missing.pt", "--prompt", "1,2", "--new-tokens", 2], capsys)
    assert "has no tensor 'blocks.1.attn.q.weight'" in line, line
    line = refusal(convert.main, ["export", tmp_path / "missing.pt", "--out", tmp_path / "hf_out"], capsys)
    assert "has no tensor 'blocks.1.attn.q.weight'" in line and not (tmp_path / "hf_out").exists(), line


def test_a_tensor_of_another_shape_is_refused_naming_it(fixtures, tmp_path, capsys):
    hf = copy_of(fixtures, "llama", tmp_path)
    edit_config(hf, intermediate_size=96)          # the file's MLP is 128 wide
    line = refusal(convert.main, ["import", hf, "--single", tmp_path / "x.pt"], capsys)
    assert (f"{hf / 'model.safetensors'}: tensor 'model.layers.0.mlp.gate_proj.weight' is (128, 32), "
            "the config makes it (96, 32)") in line, line
    assert not (tmp_path / "x.pt").exists()


# A damaged tensor, in the four ways the issue-38 probe tried on DeepSeek-V3's import, for each
# importer: (file tensor, how it is damaged, the shape the config makes it, or None: missing).
# The GPT-2 c_attn one column too long was imported silently before (its q, k, v split dropped
# the extra row); the others were tracebacks (DeepSeek) or named our tensor, not the file's.
DAMAGE = {
    "gpt2": [("transformer.h.1.attn.c_attn.weight", "one column too long", (32, 96)),
             ("transformer.h.0.mlp.c_proj.weight", "one row short", (128, 32)),
             ("transformer.h.1.attn.c_attn.bias", "missing", None),
             ("transformer.wpe.weight", "transposed", (16, 32))],
    "llama": [("model.layers.1.self_attn.q_proj.weight", "one row too long", (32, 32)),
              ("model.layers.0.mlp.down_proj.weight", "one column short", (32, 128)),
              ("model.layers.1.mlp.up_proj.weight", "missing", None),
              ("model.layers.0.self_attn.k_proj.weight", "transposed", (16, 32))],
    "deepseek": [("model.layers.1.self_attn.q_b_proj.weight", "one row too long", (40, 16)),
                 ("model.layers.1.mlp.experts.3.down_proj.weight", "one column short", (32, 12)),
                 ("model.layers.2.mlp.experts.5.up_proj.weight", "missing", None),
                 ("model.layers.1.self_attn.kv_b_proj.weight", "transposed", (44, 8))],
}


def damaged(tensor, how):
    return {"one column too long": lambda: torch.cat([tensor, tensor[:, :1]], dim=1),
            "one row too long": lambda: torch.cat([tensor, tensor[:1]]),
            "one row short": lambda: tensor[:-1], "one column short": lambda: tensor[:, :-1],
            "transposed": lambda: tensor.t()}[how]().contiguous()


@pytest.fixture(scope="module")
def deepseek_files(tmp_path_factory):
    """A tiny DeepseekV3ForCausalLM's save_pretrained directory (experts one by one)."""
    from tests.hf_models import deepseek_v3
    path = tmp_path_factory.mktemp("hf_deepseek") / "hf"
    deepseek_v3(seed=38).save_pretrained(path)
    return path


@pytest.mark.parametrize("arch, case", [(a, i) for a in DAMAGE for i in range(4)],
                         ids=[f"{a}-{how}" for a, cases in DAMAGE.items() for _, how, _ in cases])
def test_a_damaged_tensor_is_refused_in_one_line_naming_file_tensor_and_shapes(arch, case, fixtures, tmp_path,
                                                                               capsys, request):
    from safetensors.torch import load_file, save_file
    from tp_from_scratch.deepseek import convert as ds_convert
    source = request.getfixturevalue("deepseek_files") if arch == "deepseek" else fixtures[arch]
    hf = shutil.copytree(source, tmp_path / arch)
    name, how, shape = DAMAGE[arch][case]
    tensors = load_file(hf / "model.safetensors")
    assert tuple(tensors[name].shape) == (shape or tuple(tensors[name].shape)), "the fixture's own shape"
    if how == "missing":
        del tensors[name]
    else:
        tensors[name] = damaged(tensors[name], how)
    save_file(tensors, hf / "model.safetensors")
    main = ds_convert.main if arch == "deepseek" else convert.main
    line = refusal(main, ["import", hf, "--out", tmp_path / "out"], capsys)
    if how == "missing":
        assert f"{hf / 'model.safetensors'} has no tensor {name!r}" in line, line
    else:
        assert (f"{hf / 'model.safetensors'}: tensor {name!r} is {tuple(tensors[name].shape)}, "
                f"the config makes it {shape}") in line, line
    assert not (tmp_path / "out").exists()


def test_linear_rope_scaling_is_refused_naming_that_type():
    with pytest.raises(convert.ConversionError) as e:
        convert.config_from_hf({"model_type": "llama", "rope_scaling": {"type": "linear", "factor": 2.0}})
    assert "'linear'" in str(e.value) and "Llama 3" not in str(e.value), e.value


# ---------------------------------------------------------------------------------------
# Import: a tied config whose file holds a head of its own: transformers' reading
# ---------------------------------------------------------------------------------------

def test_tied_config_with_a_distinct_head_is_kept_untied_with_a_warning(fixtures, tmp_path, capsys):
    hf = copy_of(fixtures, "llama", tmp_path)      # untied: the file holds its own lm_head.weight
    edit_config(hf, tie_word_embeddings=True)
    assert convert.main(["import", str(hf), "--single", str(tmp_path / "tied.pt")]) is None
    err = capsys.readouterr().err
    assert "warning:" in err and "lm_head.weight" in err and "tie_word_embeddings=true" in err, err
    loaded = ckpt.load_full(tmp_path / "tied.pt")
    from safetensors.torch import load_file
    head = load_file(hf / "model.safetensors")["lm_head.weight"]
    assert not loaded["config"].tie_embeddings
    assert_matches_reference(loaded["model"]["lm_head.weight"], head, name="imported lm_head", exact=True)
    # transformers reads the same directory the same way, logits and all: tests/test_convert.py
    # (test_a_tied_config_with_a_distinct_head_imports_as_transformers_loads_it)


def test_tied_config_with_an_equal_head_stays_tied(fixtures, tmp_path):
    # old .bin files hold lm_head.weight as a copy of the embedding: that is a tied model
    from safetensors.torch import load_file, save_file
    hf = copy_of(fixtures, "gpt2", tmp_path)
    tensors = load_file(hf / "model.safetensors")
    tensors["lm_head.weight"] = tensors["transformer.wte.weight"].clone()
    save_file(tensors, hf / "model.safetensors")
    config, full = convert.load_hf(hf)
    assert config.tie_embeddings and "lm_head.weight" not in full


# ---------------------------------------------------------------------------------------
# Import: where it writes
# ---------------------------------------------------------------------------------------

def test_import_single_onto_a_directory_is_refused_before_writing(fixtures, tmp_path, capsys):
    target = tmp_path / "adir"
    target.mkdir()
    before = listing(tmp_path)
    line = refusal(convert.main, ["import", fixtures["gpt2"], "--single", target], capsys)
    assert f"--single {target} is a directory" in line, line
    assert listing(tmp_path) == before and listing(target) == []    # no temporary file left


def test_outputs_that_cannot_be_written_are_refused_before_reading(fixtures, tmp_path, capsys):
    a_file = tmp_path / "a_file"
    a_file.write_text("x")
    line = refusal(convert.main, ["import", fixtures["gpt2"], "--out", a_file], capsys)
    assert f"--out {a_file} is a file" in line, line
    line = refusal(convert.main, ["export", fixtures["gpt"], "--out", a_file], capsys)
    assert f"--out {a_file} is a file" in line, line
    line = refusal(convert.main, ["import", fixtures["gpt2"], "--single", a_file / "x.pt"], capsys)
    assert f"--single {a_file / 'x.pt'}: {a_file} is a file, not a directory" in line, line
    line = refusal(convert.main, ["export", fixtures["gpt"], "--out", a_file / "hf"], capsys)
    assert f"--out {a_file / 'hf'}: {a_file} is a file, not a directory" in line, line
    line = refusal(convert.main, ["import", fixtures["gpt2"], "--out", tmp_path / "o", "--tp", 0], capsys)
    assert "--tp must be at least 1, got 0" in line, line
    line = refusal(convert.main, ["import", fixtures["gpt2"], "--out", tmp_path / "o", "--tp", 5], capsys)
    assert "--tp 5 does not fit" in line and "tp=5 is larger than n_heads 4" in line, line
    assert listing(tmp_path) == ["a_file"]


# ---------------------------------------------------------------------------------------
# Generate: refused before the model is loaded
# ---------------------------------------------------------------------------------------

@pytest.mark.parametrize("flags, words", [
    (["--prompt", ""], "--prompt is empty"),                                            
    (["--text", ""], "--text is empty"),                                                
    (["--prompt", "1,2,3", "--new-tokens", "0"], "--new-tokens must be at least 1, got 0"), 
    (["--prompt", "1,2,3", "--new-tokens", "-3"], "--new-tokens must be at least 1, got -3"),
    (["--prompt", "1,2,3", "--sample", "--temperature", "0"], "--temperature must be greater than 0"),
    (["--prompt", "1,2,3", "--sample", "--temperature", "-1"], "--temperature must be greater than 0"),
    (["--prompt", "1,2,3", "--sample", "--top-k", "-1"], "--top-k must be at least 1, got -1"),
    (["--prompt", "1,,3"], "--prompt must be comma-separated token ids"),
    (["--prompt", "1,2,3", "--temperature", "0.7"], "--temperature and --top-k shape sampling: add --sample"),
    (["--prompt", "1,2,3", "--top-k", "5"], "--temperature and --top-k shape sampling: add --sample"),
], ids=["empty-prompt", "empty-text", "new-tokens-0", "new-tokens-negative", "temperature-0",
        "temperature-negative", "top-k-negative", "bad-prompt", "temperature-without-sample",
        "top-k-without-sample"])
def test_generate_refuses_bad_flags_in_one_line(flags, words, fixtures, capsys):
    line = refusal(generate.main, ["--load", fixtures["gpt"], *flags], capsys)
    assert words in line, line
