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
"""
import argparse
import json
from pathlib import Path

import torch

from tp_from_scratch.gpt import checkpoint as ckpt
from tp_from_scratch.gpt.model import GPT, GPTConfig, shard_state_dict

GELU_OF_HF = {"gelu_new": "tanh", "gelu_pytorch_tanh": "tanh", "gelu": "erf"}


class ConversionError(ValueError):
    """A checkpoint or config this converter cannot map exactly."""


# ---------------------------------------------------------------------------------------
# Configs
# ---------------------------------------------------------------------------------------

def hf_model_type(hf):
    kind = hf.get("model_type")
    if kind not in ("gpt2", "llama"):
        raise ConversionError(f"model_type {kind!r}: only 'gpt2' and 'llama' checkpoints are supported")
    return kind


def config_from_hf(hf):
    """Our GPTConfig for a Hugging Face config.json dict (GPT-2 or Llama)."""
    kind = hf_model_type(hf)
    if kind == "gpt2":
        act = hf.get("activation_function", "gelu_new")
        if act not in GELU_OF_HF:
            raise ConversionError(f"GPT-2 activation_function {act!r} is not one of {sorted(GELU_OF_HF)}")
        if hf.get("scale_attn_by_inverse_layer_idx") or not hf.get("scale_attn_weights", True):
            raise ConversionError("GPT-2 attention must be scaled by 1/sqrt(head size) only")
        H, nh = hf["n_embd"], hf["n_head"]
        return GPTConfig(arch="gpt2", vocab_size=hf["vocab_size"], seq_len=hf["n_positions"],
                         n_layers=hf["n_layer"], hidden=H, n_heads=nh, n_kv_heads=nh,
                         ffn=hf.get("n_inner") or 4 * H, gelu=GELU_OF_HF[act],
                         norm_eps=hf.get("layer_norm_epsilon", 1e-5),
                         tie_embeddings=hf.get("tie_word_embeddings", True))
    rope = hf.get("rope_parameters") or hf.get("rope_scaling") or {}
    if rope.get("rope_type", rope.get("type", "default")) != "default":
        raise ConversionError(f"Llama rope_type {rope.get('rope_type', rope.get('type'))!r}: only the "
                              f"default (unscaled) RoPE is implemented, not Llama 3's scaled one")
    if hf.get("attention_bias") or hf.get("mlp_bias"):
        raise ConversionError("Llama with attention_bias or mlp_bias is not supported")
    if hf.get("hidden_act", "silu") != "silu":
        raise ConversionError(f"Llama hidden_act {hf['hidden_act']!r}: only silu (SwiGLU) is supported")
    H, nh = hf["hidden_size"], hf["num_attention_heads"]
    if hf.get("head_dim") not in (None, H // nh):
        raise ConversionError(f"head_dim {hf['head_dim']} is not hidden_size / num_attention_heads = {H // nh}")
    return GPTConfig(arch="llama", vocab_size=hf["vocab_size"], seq_len=hf["max_position_embeddings"],
                     n_layers=hf["num_hidden_layers"], hidden=H, n_heads=nh,
                     n_kv_heads=hf.get("num_key_value_heads") or nh, ffn=hf["intermediate_size"],
                     norm_eps=hf.get("rms_norm_eps", 1e-6),
                     rope_theta=float(rope.get("rope_theta", hf.get("rope_theta", 10000.0))),
                     tie_embeddings=hf.get("tie_word_embeddings", False))


def export_kind(config):
    """'gpt2' or 'llama': the Hugging Face class that computes exactly what ``config`` does."""
    if (config.norm, config.position, config.mlp) == ("layernorm", "learned", "gelu") and config.bias:
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
            "mlp_bias": False, "rope_theta": config.rope_theta,
            "rope_parameters": {"rope_type": "default", "rope_theta": config.rope_theta}}


# ---------------------------------------------------------------------------------------
# State dicts (pure functions of tensors: they also map gradients, which the tests use)
# ---------------------------------------------------------------------------------------

_GPT2_BUFFERS = ("attn.bias", "attn.masked_bias")  # causal-mask buffers in old GPT-2 files


def _prefix(sd, name, candidates):
    for p in candidates:
        if p + name in sd:
            return p
    raise ConversionError(f"no {name!r} in the checkpoint (looked for {[p + name for p in candidates]})")


def from_hf(sd, config):
    """Our single-device state dict from a Hugging Face state dict of ``config``'s architecture."""
    kind = export_kind(config)
    out, used = {}, set()

    def take(name):
        used.add(name)
        return sd[name]

    H = config.hidden
    if kind == "gpt2":
        p = _prefix(sd, "wte.weight", ("transformer.", ""))   # GPT2Model files have no prefix
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
        p = _prefix(sd, "embed_tokens.weight", ("model.", ""))
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
        out["lm_head.weight"] = take("lm_head.weight")
    else:
        used.add("lm_head.weight")                           # a tied head is the embedding
    unused = sorted(set(sd) - used)
    if unused:
        raise ConversionError(f"{len(unused)} tensors of the checkpoint have no place in the model, "
                              f"e.g. {unused[:3]}")
    return {k: v.contiguous() for k, v in out.items()}


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
                bias[1] = torch.zeros(w[1].shape[0], dtype=w[1].dtype)
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

def read_hf(path, config_path=None):
    """(config.json dict, state dict) of a save_pretrained directory or a .safetensors file."""
    path = Path(path)
    directory = path if path.is_dir() else path.parent
    config_path = Path(config_path) if config_path else directory / "config.json"
    if not config_path.exists():
        raise ConversionError(f"no config.json at {config_path} (pass --config)")
    hf = json.loads(config_path.read_text())
    if path.is_dir():
        files = sorted(path.glob("*.safetensors")) or sorted(path.glob("pytorch_model*.bin"))
        if not files:
            raise ConversionError(f"no *.safetensors or pytorch_model*.bin in {path}")
    else:
        files = [path]
    sd = {}
    for f in files:
        if f.suffix == ".safetensors":
            from safetensors.torch import load_file  # only for this format
            sd.update(load_file(str(f)))
        else:
            sd.update(torch.load(f, map_location="cpu", weights_only=True))
    return hf, sd


def write_hf(directory, sd, config):
    """A save_pretrained-style directory: config.json and model.safetensors."""
    from safetensors.torch import save_file
    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    hf = to_hf(sd, config)
    if config.tie_embeddings:
        hf.pop("lm_head.weight")  # transformers ties it back to the embedding on load
    save_file({k: v.detach().contiguous() for k, v in hf.items()}, str(directory / "model.safetensors"),
              metadata={"format": "pt"})
    (directory / "config.json").write_text(json.dumps(hf_config(config), indent=1))


def load_hf(path, config_path=None, dtype=None):
    """(our GPTConfig, our full state dict) from a Hugging Face checkpoint on disk."""
    hf, sd = read_hf(path, config_path)
    config = config_from_hf(hf)
    full = from_hf(sd, config)
    if dtype is not None:
        full = {k: v.to(dtype) for k, v in full.items()}
    return config, full


def write_checkpoint(root, config, full, tp, step=0):
    """Our sharded checkpoint (one shard per TP rank, no optimizer state) of a full state dict."""
    name = ckpt.new_checkpoint_name(step)
    records = [ckpt.write_shard(root, name, r, tp, shard_state_dict(full, tp, r, config)) for r in range(tp)]
    return ckpt.commit(root, name, config, tp, step, records, {"imported": True})


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
    args = parser.parse_args(argv)
    try:
        if args.cmd == "import":
            config, full = load_hf(args.source, args.config, getattr(torch, args.dtype))
            n = sum(v.numel() for v in full.values())
            if args.single:
                model = GPT(config).to(getattr(torch, args.dtype))
                model.load_state_dict(full)
                ckpt.save_single_device(model, args.single)
                print(f"wrote {args.single}: {config.arch}, {n:,} parameters")
            else:
                config.validate(args.tp)
                ckpt_meta = write_checkpoint(args.out, config, full, args.tp)
                print(f"wrote {args.out}: {config.arch}, {n:,} parameters in {args.tp} shards "
                      f"({', '.join('%.1f MiB' % (r['bytes'] / 2**20) for r in ckpt_meta['shards'])})")
        else:
            loaded = ckpt.load_full(args.source)
            write_hf(args.out, loaded["model"], loaded["config"])
            print(f"wrote {args.out}: config.json and model.safetensors ({export_kind(loaded['config'])})")
    except (ConversionError, ckpt.CheckpointError, ValueError) as e:
        parser.exit(1, f"error: {e}\n")


if __name__ == "__main__":
    main()
