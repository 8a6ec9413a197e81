"""Hugging Face checkpoints in and out: GPT2LMHeadModel and LlamaForCausalLM <-> our GPT.

    # a downloaded GPT-2 small (config.json + model.safetensors) -> our checkpoint, 2 shards
    .venv/bin/python -m tp_from_scratch.gpt.convert import ~/gpt2 --out runs/gpt2 --tp 2
    # ... or one single-device file (what --load and generate --load also accept)
    .venv/bin/python -m tp_from_scratch.gpt.convert import ~/gpt2 --single runs/gpt2.pt
    # ours (a checkpoint root or a single-device file) -> a save_pretrained directory
    .venv/bin/python -m tp_from_scratch.gpt.convert export runs/ckpt --out runs/hf

The source is a directory as ``save_pretrained`` writes it (config.json and model.safetensors,
sharded model-0000i-of-0000n.safetensors with their index, or pytorch_model.bin), or a single
.safetensors file with ``--config config.json``. Nothing here downloads anything, and the
``safetensors`` package is needed only to read or write that format; transformers is never
imported (the tests use it to check the result).

The name map, per block i (HF GPT-2's Conv1D stores W as (in, out): transposed here):

    GPT-2  h.i.ln_1 / ln_2 / ln_f        -> blocks.i.ln1 / ln2 / ln_f
           h.i.attn.c_attn (H, 3H)        -> attn.q, attn.k, attn.v   (split in three, key bias kept)
           h.i.attn.c_proj, mlp.c_fc, mlp.c_proj -> attn.o, mlp.fc, mlp.proj
    Llama  layers.i.input_layernorm / post_attention_layernorm / norm -> ln1 / ln2 / ln_f
           self_attn.{q,k,v,o}_proj       -> attn.{q,k,v,o}  (same "rotate half" RoPE layout)
           mlp.{gate,up,down}_proj        -> mlp.{gate,up,down};  embed_tokens -> wte; lm_head

Exporting a config with fewer KV heads than heads to GPT-2 (which has none) repeats each KV
head for its group of query heads: the same function, as multi-head attention.

A tied head (``tie_word_embeddings``) is read as transformers' ``from_pretrained`` reads it:
when the file also holds an ``lm_head.weight`` different from the embedding, the head is kept
untied, with a warning, so the import computes what transformers computes. A file the converter
cannot map exactly (a required config key or tensor missing, a tensor of another shape, a
truncated file, a .bin holding more than tensors) is refused with one line naming the key,
tensor or file, before anything is written.

Precision: transformers computes Llama's RMSNorm and its RoPE cos/sin tables in float32 even in
a float64 model (and the eager attention's softmax); ours computes them in the model's dtype.
So the float64 tests compare against a Llama whose RMSNorm and rotary forwards are replaced by
the same formulas in float64, with "sdpa" attention (tests/hf_models.py), at float64's
tolerance, and against the unpatched Llama at float32's. docs/hugging_face.md says more.
"""
import argparse
import contextlib
import dataclasses
import json
import pickle
import sys
import warnings
from pathlib import Path

import torch

from tp_from_scratch.gpt import checkpoint as ckpt
from tp_from_scratch.gpt import options
from tp_from_scratch.gpt.model import GPT, GPTConfig
from tp_from_scratch.gpt.parallelize import shard_state_dict

GELU_OF_HF = {"gelu_new": "tanh", "gelu_pytorch_tanh": "tanh", "gelu": "erf"}


class ConversionError(ValueError):
    """A checkpoint or config this converter cannot map exactly."""


class ConversionWarning(UserWarning):
    """A checkpoint that contradicts its config, read as transformers reads it."""


@contextlib.contextmanager
def warnings_as_lines(prefix=""):
    """Inside: every warning printed at once as one line ``warning: ...`` on stderr."""
    with warnings.catch_warnings():
        warnings.simplefilter("always")
        warnings.showwarning = lambda message, *_: print(f"{prefix}warning: {message}", file=sys.stderr,
                                                          flush=True)
        yield


# The sizes a config.json must state (transformers would fill in a default model's instead,
# and then fail on every tensor's shape).
REQUIRED = {"gpt2": ("vocab_size", "n_positions", "n_layer", "n_embd", "n_head"),
            "llama": ("vocab_size", "max_position_embeddings", "num_hidden_layers", "hidden_size",
                      "num_attention_heads", "intermediate_size")}
EMBEDDING = {"gpt2": "wte.weight", "llama": "embed_tokens.weight"}
PREFIXES = {"gpt2": ("transformer.", ""), "llama": ("model.", "")}   # GPT2Model files have no prefix


# ---------------------------------------------------------------------------------------
# Configs
# ---------------------------------------------------------------------------------------

def hf_model_type(hf, where="config.json"):
    kind = hf.get("model_type")
    if kind not in REQUIRED:   # a later lesson's model has its own entry points (the course map lists them)
        raise ConversionError(f"{where}: model_type {kind!r}: only 'gpt2' and 'llama' checkpoints are supported "
                              f"here (another model's lesson has its own commands: see {options.COURSE_MAP})")
    return kind


def required_sizes(hf, kind, where="config.json"):
    """Refuse a config that lacks one of its architecture's sizes, or states one that is not >= 1."""
    missing = [k for k in REQUIRED[kind] if k not in hf]
    if missing:
        raise ConversionError(f"{where} has no {', '.join(missing)} (a {kind} config states "
                              f"{', '.join(REQUIRED[kind])})")
    for k in REQUIRED[kind]:
        if type(hf[k]) is not int or hf[k] < 1:
            raise ConversionError(f"{where}: {k} must be a whole number >= 1, got {hf[k]!r}")


def config_from_hf(hf, where="config.json"):
    """Our GPTConfig for a Hugging Face config.json dict (GPT-2 or Llama); ``where`` names the
    file in errors."""
    kind = hf_model_type(hf, where)
    if kind == "gpt2":
        act = hf.get("activation_function", "gelu_new")
        if act not in GELU_OF_HF:
            raise ConversionError(f"GPT-2 activation_function {act!r} is not one of {sorted(GELU_OF_HF)}")
        if hf.get("scale_attn_by_inverse_layer_idx") or not hf.get("scale_attn_weights", True):
            raise ConversionError("GPT-2 attention must be scaled by 1/sqrt(head size) only")
        required_sizes(hf, kind, where)
        H, nh = hf["n_embd"], hf["n_head"]
        return GPTConfig(arch="gpt2", vocab_size=hf["vocab_size"], seq_len=hf["n_positions"],
                         n_layers=hf["n_layer"], hidden=H, n_heads=nh, n_kv_heads=nh,
                         ffn=hf.get("n_inner") or 4 * H, gelu=GELU_OF_HF[act],
                         norm_eps=hf.get("layer_norm_epsilon", 1e-5),
                         tie_embeddings=hf.get("tie_word_embeddings", True))
    rope = hf.get("rope_parameters") or hf.get("rope_scaling") or {}
    scaling = rope.get("rope_type", rope.get("type", "default"))
    if scaling != "default":
        raise ConversionError(f"Llama rope_type {scaling!r}: only the default (unscaled) RoPE is implemented, "
                              f"not the {scaling!r} scaling this config asks for")
    if hf.get("attention_bias") or hf.get("mlp_bias"):
        raise ConversionError("Llama with attention_bias or mlp_bias is not supported")
    if hf.get("hidden_act", "silu") != "silu":
        raise ConversionError(f"Llama hidden_act {hf['hidden_act']!r}: only silu (SwiGLU) is supported")
    required_sizes(hf, kind, where)
    H, nh = hf["hidden_size"], hf["num_attention_heads"]
    if hf.get("head_dim") not in (None, H // nh):
        raise ConversionError(f"head_dim {hf['head_dim']} is not hidden_size / num_attention_heads = {H // nh}")
    return GPTConfig(arch="llama", vocab_size=hf["vocab_size"], seq_len=hf["max_position_embeddings"],
                     n_layers=hf["num_hidden_layers"], hidden=H, n_heads=nh,
                     n_kv_heads=hf.get("num_key_value_heads") or nh, ffn=hf["intermediate_size"],
                     norm_eps=hf.get("rms_norm_eps", 1e-6),
                     rope_theta=float(rope.get("rope_theta", hf.get("rope_theta", 10000.0))),
                     tie_embeddings=hf.get("tie_word_embeddings", False),
                     pad_token_id=hf.get("pad_token_id"))   # LlamaModel's padding_idx (GPT2Model has none)


def export_kind(config):
    """'gpt2' or 'llama': the Hugging Face class that computes exactly what ``config`` does."""
    if (config.norm, config.position, config.mlp) == ("layernorm", "learned", "gelu") and config.bias:
        if config.pad_token_id is not None:
            raise ConversionError(f"pad_token_id={config.pad_token_id}: GPT-2's embedding has no padding row "
                                  "(transformers' GPT2Model ignores pad_token_id), so no GPT-2 computes this model")
        return "gpt2"
    if (config.norm, config.position, config.mlp, config.bias) == ("rmsnorm", "rope", "swiglu", False):
        return "llama"
    raise ConversionError(f"no Hugging Face class matches norm={config.norm}, position={config.position}, "
                          f"mlp={config.mlp}, bias={config.bias}")


def hf_config(config):
    """A config.json dict for ``config`` (the inverse of config_from_hf)."""
    kind = export_kind(config)
    common = {"model_type": kind, "vocab_size": config.vocab_size,
              "tie_word_embeddings": config.tie_embeddings}
    if kind == "gpt2":
        return {**common, "architectures": ["GPT2LMHeadModel"], "n_positions": config.seq_len,
                "n_ctx": config.seq_len, "n_embd": config.hidden, "n_layer": config.n_layers,
                "n_head": config.n_heads, "n_inner": config.ffn,
                "activation_function": "gelu_new" if config.gelu == "tanh" else "gelu",
                "layer_norm_epsilon": config.norm_eps, "resid_pdrop": 0.0, "embd_pdrop": 0.0,
                "attn_pdrop": 0.0, "scale_attn_weights": True}
    return {**common, "architectures": ["LlamaForCausalLM"], "hidden_size": config.hidden,
            "intermediate_size": config.ffn, "num_hidden_layers": config.n_layers,
            "num_attention_heads": config.n_heads, "num_key_value_heads": config.n_kv_heads,
            "head_dim": config.head_size, "max_position_embeddings": config.seq_len,
            "rms_norm_eps": config.norm_eps, "hidden_act": "silu", "attention_bias": False,
            "mlp_bias": False, "rope_theta": config.rope_theta, "pad_token_id": config.pad_token_id,
            "rope_parameters": {"rope_type": "default", "rope_theta": config.rope_theta}}


# ---------------------------------------------------------------------------------------
# State dicts (pure functions of tensors: they also map gradients, which the tests use)
# ---------------------------------------------------------------------------------------

_GPT2_BUFFERS = ("attn.bias", "attn.masked_bias")  # causal-mask buffers in old GPT-2 files


def _prefix(sd, kind, where):
    """The prefix of the Hugging Face names in ``sd`` ("transformer." / "model." or none)."""
    for p in PREFIXES[kind]:
        if p + EMBEDDING[kind] in sd:
            return p
    raise ConversionError(f"{where} has no tensor {EMBEDDING[kind]!r} "
                          f"(looked for {[p + EMBEDDING[kind] for p in PREFIXES[kind]]})")


def check_tensors(sd, expected, where):
    """Refuse, in one line naming the file ``where`` and the tensor, a state dict read from it
    that lacks a tensor of ``expected`` (file name -> shape) or holds one of another shape:
    before any model is built, so no tensor is split, stacked or loaded on a wrong guess."""
    for name, shape in expected.items():
        if name not in sd:
            raise ConversionError(f"{where} has no tensor {name!r}")
        if tuple(sd[name].shape) != tuple(shape):
            raise ConversionError(f"{where}: tensor {name!r} is {tuple(sd[name].shape)}, the config "
                                  f"makes it {tuple(shape)}")


def require_head(sd, tied, where="the checkpoint"):
    """An untied config needs the file's own lm_head.weight: refuse, naming both, where it has none."""
    if not tied and "lm_head.weight" not in sd:
        raise ConversionError(f"{where} has no lm_head.weight, but config.json says "
                              f"tie_word_embeddings=false (a head of its own)")


def head_tied_as_transformers(sd, tied, embedding, where="the checkpoint", config_key="tie_word_embeddings"):
    """Whether the LM head is the embedding ``sd[embedding]``, as transformers' from_pretrained
    decides: a tied config whose file holds an lm_head.weight that is not the embedding is kept
    untied, with a warning (the file, not the config, says what the model computes); an equal
    copy (old .bin files and some save_pretrained files hold one) stays tied."""
    head = sd.get("lm_head.weight")
    if not tied or head is None:
        return tied
    if head.shape == sd[embedding].shape and torch.equal(head, sd[embedding]):
        return True
    warnings.warn(f"{where}: config.json says {config_key}=true but lm_head.weight differs from "
                  f"{embedding}; kept untied, as transformers does", ConversionWarning)
    return False


def tie_as_transformers(sd, config, where="the checkpoint"):
    """``config``, untied where transformers' from_pretrained would keep the file's head apart
    (head_tied_as_transformers)."""
    kind = export_kind(config)
    embedding = _prefix(sd, kind, where) + EMBEDDING[kind]
    if head_tied_as_transformers(sd, config.tie_embeddings, embedding, where) == config.tie_embeddings:
        return config
    return dataclasses.replace(config, tie_embeddings=False)


def hf_shapes(config, sd, where="the checkpoint"):
    """{file name: shape} of every tensor a Hugging Face file of ``config`` holds, under the
    prefix ``sd`` uses; read off a model built on the meta device (shapes, no memory). A tied
    config's lm_head.weight is expected only where the file holds one (a copy)."""
    kind = export_kind(config)
    config.validate()
    with torch.device("meta"):
        ours = GPT(config).state_dict()
    if config.tie_embeddings:
        ours["lm_head.weight"] = ours["wte.weight"]
    p, standard = _prefix(sd, kind, where), PREFIXES[kind][0]
    shapes = {(p + k[len(standard):] if k.startswith(standard) else k): tuple(v.shape)
              for k, v in to_hf(ours, config).items()}
    if config.tie_embeddings and "lm_head.weight" not in sd:
        del shapes["lm_head.weight"]
    return shapes


def from_hf(sd, config, where="the checkpoint"):
    """Our single-device state dict from a Hugging Face state dict of ``config``'s architecture
    (a tied ``config`` reads no lm_head.weight: see tie_as_transformers). ``where`` names the
    file in errors."""
    kind = export_kind(config)
    out, used = {}, set()

    def take(name):
        if name not in sd:
            raise ConversionError(f"{where} has no tensor {name!r} (a {kind} of {config.n_layers} layers)")
        used.add(name)
        return sd[name]

    H = config.hidden
    p = _prefix(sd, kind, where)
    if kind == "gpt2":
        out["wte.weight"], out["wpe.weight"] = take(p + "wte.weight"), take(p + "wpe.weight")
        for i in range(config.n_layers):
            h, b = f"{p}h.{i}.", f"blocks.{i}."
            for ours, theirs in (("ln1", "ln_1"), ("ln2", "ln_2")):
                out[b + ours + ".weight"], out[b + ours + ".bias"] = take(h + theirs + ".weight"), take(h + theirs + ".bias")
            qkv_w = take(h + "attn.c_attn.weight").t()      # Conv1D (H, 3H) -> (3H, H)
            qkv_b = take(h + "attn.c_attn.bias")
            for part, w, bias in zip("qkv", qkv_w.split(H), qkv_b.split(H)):
                out[f"{b}attn.{part}.weight"], out[f"{b}attn.{part}.bias"] = w, bias
            for ours, theirs in (("attn.o", "attn.c_proj"), ("mlp.fc", "mlp.c_fc"), ("mlp.proj", "mlp.c_proj")):
                out[f"{b}{ours}.weight"] = take(f"{h}{theirs}.weight").t()
                out[f"{b}{ours}.bias"] = take(f"{h}{theirs}.bias")
            used.update(h + buf for buf in _GPT2_BUFFERS)
        out["ln_f.weight"], out["ln_f.bias"] = take(p + "ln_f.weight"), take(p + "ln_f.bias")
    else:
        out["wte.weight"] = take(p + "embed_tokens.weight")
        for i in range(config.n_layers):
            h, b = f"{p}layers.{i}.", f"blocks.{i}."
            out[b + "ln1.weight"] = take(h + "input_layernorm.weight")
            out[b + "ln2.weight"] = take(h + "post_attention_layernorm.weight")
            for part in "qkvo":
                out[f"{b}attn.{part}.weight"] = take(f"{h}self_attn.{part}_proj.weight")
            for part in ("gate", "up", "down"):
                out[f"{b}mlp.{part}.weight"] = take(f"{h}mlp.{part}_proj.weight")
        out["ln_f.weight"] = take(p + "norm.weight")
    if not config.tie_embeddings:
        require_head(sd, False, where)
        out["lm_head.weight"] = take("lm_head.weight")
    else:
        used.add("lm_head.weight")                           # a tied head is the embedding
    unused = sorted(set(sd) - used)
    if unused:
        raise ConversionError(f"{len(unused)} tensors of {where} have no place in the model, "
                              f"e.g. {unused[:3]}")
    return {k: v.contiguous() for k, v in out.items()}


def gpt_from_weights(config, full, where):
    """A single-device GPT (eval mode) holding the state dict ``full``; a tensor of ``config``'s
    model missing from it, one more, or one of another shape is refused naming the tensor."""
    config.validate()
    model = GPT(config).to(next(iter(full.values())).dtype)
    want = {k: tuple(v.shape) for k, v in model.state_dict().items()}
    for name, shape in want.items():
        if name not in full:
            raise ConversionError(f"{where} has no tensor {name!r}")
        if tuple(full[name].shape) != shape:
            raise ConversionError(f"{where}: tensor {name!r} is {tuple(full[name].shape)}, the config "
                                  f"makes it {shape}")
    extra = sorted(set(full) - set(want))
    if extra:
        raise ConversionError(f"{where} holds {len(extra)} tensors the model has no place for, e.g. {extra[:3]}")
    model.load_state_dict(full)
    return model.eval()


def to_hf(sd, config):
    """A Hugging Face state dict (GPT2LMHeadModel or LlamaForCausalLM names) from ours."""
    kind = export_kind(config)
    out = {}
    if kind == "gpt2":
        p, g = "transformer.", config.n_heads // config.n_kv_heads
        out[p + "wte.weight"], out[p + "wpe.weight"] = sd["wte.weight"], sd["wpe.weight"]
        for i in range(config.n_layers):
            h, b = f"{p}h.{i}.", f"blocks.{i}."
            for ours, theirs in (("ln1", "ln_1"), ("ln2", "ln_2")):
                out[h + theirs + ".weight"], out[h + theirs + ".bias"] = sd[b + ours + ".weight"], sd[b + ours + ".bias"]
            w = [sd[f"{b}attn.{x}.weight"] for x in "qkv"]
            bias = [sd.get(f"{b}attn.{x}.bias") for x in "qkv"]
            if bias[1] is None:                               # no key bias: exactly zero (see model.py)
                bias[1] = torch.zeros(w[1].shape[0], dtype=w[1].dtype, device=w[1].device)
            # GQA -> multi-head: each KV head repeated for the g query heads that read it
            w[1:] = [_repeat_heads(x, g, config.head_size) for x in w[1:]]
            bias[1:] = [_repeat_heads(x, g, config.head_size) for x in bias[1:]]
            out[h + "attn.c_attn.weight"] = torch.cat(w).t()
            out[h + "attn.c_attn.bias"] = torch.cat(bias)
            for ours, theirs in (("attn.o", "attn.c_proj"), ("mlp.fc", "mlp.c_fc"), ("mlp.proj", "mlp.c_proj")):
                out[f"{h}{theirs}.weight"] = sd[f"{b}{ours}.weight"].t()
                out[f"{h}{theirs}.bias"] = sd[f"{b}{ours}.bias"]
        out[p + "ln_f.weight"], out[p + "ln_f.bias"] = sd["ln_f.weight"], sd["ln_f.bias"]
    else:
        p = "model."
        out[p + "embed_tokens.weight"] = sd["wte.weight"]
        for i in range(config.n_layers):
            h, b = f"{p}layers.{i}.", f"blocks.{i}."
            out[h + "input_layernorm.weight"] = sd[b + "ln1.weight"]
            out[h + "post_attention_layernorm.weight"] = sd[b + "ln2.weight"]
            for part in "qkvo":
                out[f"{h}self_attn.{part}_proj.weight"] = sd[f"{b}attn.{part}.weight"]
            for part in ("gate", "up", "down"):
                out[f"{h}mlp.{part}_proj.weight"] = sd[f"{b}mlp.{part}.weight"]
        out[p + "norm.weight"] = sd["ln_f.weight"]
    out["lm_head.weight"] = sd["wte.weight"] if config.tie_embeddings else sd["lm_head.weight"]
    return {k: v.contiguous() for k, v in out.items()}


def _repeat_heads(x, g, head_size):
    """(nkv*hs, ...) -> (nkv*g*hs, ...): every head's rows g times, in place of its group."""
    if g == 1:
        return x
    return x.reshape(-1, head_size, *x.shape[1:]).repeat_interleave(g, dim=0).reshape(-1, *x.shape[1:])


# ---------------------------------------------------------------------------------------
# Files
# ---------------------------------------------------------------------------------------

def config_path_of(path, config_path=None):
    """The config.json of a checkpoint: ``config_path``, or the one beside ``path``."""
    if config_path:
        return Path(config_path)
    path = Path(path)
    return (path if path.is_dir() else path.parent) / "config.json"


def read_json(path, what="config"):
    """A JSON object (dict) from ``path``, or a ConversionError naming the file."""
    if not Path(path).exists():
        raise ConversionError(f"no {Path(path).name} at {path} (pass --config)")
    hf, problem = options.json_file(what, path)
    if problem:
        raise ConversionError(problem)
    if not isinstance(hf, dict):
        raise ConversionError(f"{what} {path} holds a {type(hf).__name__}, not a JSON object")
    return hf


def weight_files(path):
    """The tensor files of a save_pretrained directory (or the one file ``path``)."""
    path = Path(path)
    if not path.is_dir():
        return [path]
    files = sorted(path.glob("*.safetensors")) or sorted(path.glob("pytorch_model*.bin"))
    if not files:
        raise ConversionError(f"no *.safetensors or pytorch_model*.bin in {path}")
    return files


def read_tensors(files):
    """One state dict from every file, each read without running any code (safetensors, or
    torch.load with weights_only); a file that fails is named."""
    sd = {}
    for f in files:
        try:
            if f.suffix == ".safetensors":
                from safetensors.torch import load_file  # only for this format
                part = load_file(str(f))
            else:
                part = torch.load(f, map_location="cpu", weights_only=True)
        except pickle.UnpicklingError:
            raise ConversionError(f"{f} holds more than tensors (pickled objects or code) or is damaged: "
                                  f"torch.load(weights_only=True) refused it and nothing in it ran") from None
        except Exception as e:  # safetensors' SafetensorError, a damaged zip's RuntimeError, OSError
            raise ConversionError(f"{f} is truncated or corrupt: {str(e).splitlines()[0]}") from None
        if not isinstance(part, dict) or not all(torch.is_tensor(v) for v in part.values()):
            raise ConversionError(f"{f} does not hold a dict of tensors")
        sd.update(part)
    return sd


def read_hf(path, config_path=None):
    """(config.json dict, state dict, where) of a save_pretrained directory or a .safetensors
    file; ``where`` names the tensor file(s) in errors."""
    hf = read_json(config_path_of(path, config_path))
    files = weight_files(path)
    where = str(files[0]) if len(files) == 1 else f"{path} ({len(files)} files)"
    return hf, read_tensors(files), where


def read_eos_ids(path, config_path=None):
    """The end-of-sequence ids a Hugging Face checkpoint names (a tuple, maybe empty), as its
    generate reads them: generation_config.json's eos_token_id if present, else config.json's."""
    config_file = config_path_of(path, config_path)
    generation = config_file.parent / "generation_config.json"
    hf = read_json(generation, "generation config") if generation.exists() else {}
    eos = hf["eos_token_id"] if "eos_token_id" in hf else read_json(config_file).get("eos_token_id")
    ids = eos if isinstance(eos, list) else [] if eos is None else [eos]
    if not all(type(i) is int and i >= 0 for i in ids):
        raise ConversionError(f"eos_token_id {eos!r} of {config_file.parent} is not a token id or a list of them")
    return tuple(ids)


def write_hf(directory, sd, config):
    """A save_pretrained-style directory: config.json and model.safetensors."""
    hf = to_hf(sd, config)
    if config.tie_embeddings:
        hf.pop("lm_head.weight")  # transformers ties it back to the embedding on load
    write_hf_files(directory, hf, hf_config(config))


def write_hf_files(directory, sd, hf_config_dict):
    """model.safetensors and config.json in ``directory``, each written atomically (a reader sees
    the old file or the whole new one): the files of a save_pretrained directory."""
    from safetensors.torch import save
    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    data = save({k: v.detach().contiguous() for k, v in sd.items()}, metadata={"format": "pt"})
    ckpt.write_atomic(directory / "model.safetensors", data)
    ckpt.write_atomic(directory / "config.json", json.dumps(hf_config_dict, indent=1).encode())


def load_hf(path, config_path=None, dtype=None):
    """(our GPTConfig, our full state dict) from a Hugging Face checkpoint on disk."""
    hf, sd, where = read_hf(path, config_path)
    config = config_from_hf(hf, str(config_path_of(path, config_path)))
    require_head(sd, config.tie_embeddings, where)
    check_tensors(sd, hf_shapes(config, sd, where), where)   # every name and shape, before any split
    config = tie_as_transformers(sd, config, where)
    full = from_hf(sd, config, where)
    if dtype is not None:
        full = {k: v.to(dtype) for k, v in full.items()}
    return config, full


def write_checkpoint(root, config, full, tp, step=0, eos_ids=()):
    """Our sharded checkpoint (one shard per TP rank, no optimizer state) of a full state dict;
    its meta.json keeps the end-of-sequence ids for generate."""
    name = ckpt.new_checkpoint_name(step)
    records = [ckpt.write_shard(root, name, r, tp, shard_state_dict(full, tp, r, config)) for r in range(tp)]
    return ckpt.commit(root, name, config, tp, step, records, {"imported": True, "eos_token_ids": list(eos_ids)})


def check_arguments(args, world=1):
    """The first problem with the command line (a sentence), or None: before any file is read."""
    if args.cmd == "export":
        return options.first_problem(options.existing_path("source", args.source),
                                     options.directory_to_write("--out", args.out))
    return options.first_problem(options.existing_path("source", args.source),
                                 options.existing_path("--config", args.config),
                                 options.positive("--tp", args.tp),
                                 options.file_to_write("--single", args.single),
                                 options.directory_to_write("--out", args.out))


def main(argv=None):
    parser = argparse.ArgumentParser(prog="python -m tp_from_scratch.gpt.convert", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = parser.add_subparsers(dest="cmd", required=True)
    im = sub.add_parser("import", help="a Hugging Face GPT-2 / Llama checkpoint -> ours")
    im.add_argument("source", help="save_pretrained directory, or a .safetensors file with --config")
    im.add_argument("--config", help="config.json (default: beside the source)")
    im.add_argument("--dtype", choices=["float32", "float64"], default="float32")
    where = im.add_mutually_exclusive_group(required=True)
    where.add_argument("--out", help="checkpoint root to write (sharded, --tp shards)")
    where.add_argument("--single", help="single-device .pt file to write")
    im.add_argument("--tp", type=int, default=1, help="shards in the checkpoint (any t it validates for)")
    ex = sub.add_parser("export", help="ours (checkpoint root or single-device .pt) -> save_pretrained directory")
    ex.add_argument("source")
    ex.add_argument("--out", required=True)
    args = options.parse_valid_args(parser, check_arguments, argv)
    try:
        with warnings_as_lines():
            run(args)
    except (ConversionError, ckpt.CheckpointError, ValueError) as e:
        parser.exit(1, f"error: {e}\n")


def run(args):
    """The import or export the command line asks for (its arguments already checked)."""
    if args.cmd == "import":
        config, full = load_hf(args.source, args.config, getattr(torch, args.dtype))
        n = sum(v.numel() for v in full.values())
        model = gpt_from_weights(config, full, args.source)   # every tensor in place, of its shape
        if args.single:
            Path(args.single).parent.mkdir(parents=True, exist_ok=True)
            ckpt.save_single_device(model, args.single)
            print(f"wrote {args.single}: {config.arch}, {n:,} parameters")
        else:
            try:
                config.validate(args.tp)
            except ValueError as e:
                raise ConversionError(f"--tp {args.tp} does not fit {args.source}: {e}") from None
            ckpt_meta = write_checkpoint(args.out, config, full, args.tp,
                                         eos_ids=read_eos_ids(args.source, args.config))
            print(f"wrote {args.out}: {config.arch}, {n:,} parameters in {args.tp} shards "
                  f"({', '.join('%.1f MiB' % (r['bytes'] / 2**20) for r in ckpt_meta['shards'])})")
    else:
        loaded = ckpt.load_full(args.source)
        model = gpt_from_weights(loaded["config"], loaded["model"], args.source)  # every tensor in place
        write_hf(args.out, model.state_dict(), model.config)
        print(f"wrote {args.out}: config.json and model.safetensors ({export_kind(model.config)})")


if __name__ == "__main__":
    main()
