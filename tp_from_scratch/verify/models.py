"""What ``verify model`` runs: a single-device model and its tensor-parallel self, from one source.

    ours:gpt, ours:llama, ours:deepseek   this course's GPT / Llama (gpt.model) and DeepSeek-V3
                                          (deepseek.model), tiny and random
    hf:DIR[:PLAN]                         a save_pretrained directory through transformers' own
                                          TP: from_pretrained(DIR) and from_pretrained(DIR,
                                          tp_plan=PLAN), PLAN "auto" or a JSON file of rules
    entry:MODULE:FUNCTION                 your nn.Module and its DTensor plan: FUNCTION(mesh,
                                          dtype) -> (reference, parallel) or a dict (docs/verify.md)

A source's ``build(ctx, dtype)`` returns a Pair: both models and what the check needs to run
and compare them (how to call them, how a TP tensor becomes its full tensor, generation and a
save/reload round trip where the library offers one).
"""
import copy
import importlib
import json
import os
import sys
from contextlib import nullcontext
from dataclasses import dataclass, field
from pathlib import Path

import torch
import torch.nn.functional as F
from torch.distributed.tensor import DTensor

from tp_from_scratch.verify.locator import REPLICATED, first_tensor, gather_pieces, infer_layout, to_full
from tp_from_scratch.verify.ours_layout import deepseek_layout, gpt_layout, gpt_misplaced


@dataclass
class Context:
    """Where a configuration runs: the TP group (a ProcessGroup, or a Comm on simulated
    ranks), its 1-D DeviceMesh (None on simulated ranks), t, this rank in the group, a folder
    of this rank's own and one its whole TP group shares."""
    group: object
    mesh: object
    t: int
    rank: int
    tmp: str
    shared: str = ""


def _local(x):
    return x.to_local() if isinstance(x, DTensor) else x


@dataclass
class Pair:
    reference: torch.nn.Module
    parallel: torch.nn.Module
    group: object
    vocab_size: int
    run: object                       # run(model, ids, targets) -> (logits, loss)
    full_parameter: object            # (name, tensor) -> the full tensor (collective)
    layout_of: object = None          # (kind, name, local, reference) -> Layout, a message, None (skip)
    generate: object = None           # (model, prompt, n) -> ids (B, T0 + n)
    round_trip: object = None         # (parallel) -> [(name, before, after)] compared bit-exactly
    layers: int = 1
    precision: str = None             # the working precision when lower than the dtype's
    head_size_of: object = None       # (module name) -> head size of a q/k/v projection, or None
    loss_context: object = nullcontext  # what forward and backward of the TP loss run inside
    misplaced: object = None          # () -> a parameter whose local shape the plan does not give, or ""
    notes: list = field(default_factory=list)


def randomize(model, seed):
    """Every parameter drawn at random, norms near 1 (a zero bias or a unit norm would hide a
    bias added t times or a norm applied to the wrong shard). Own generator; in place."""
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in model.named_parameters():
            noise = torch.randn(p.shape, generator=g, dtype=torch.float64)
            norm = ("ln" in name or "norm" in name) and name.endswith("weight")
            p.copy_(1 + 0.1 * noise if norm else 0.2 * noise)
    return model


def greedy(model, prompt, n, full=lambda x: x):
    """Greedy ids from repeated whole forwards (no cache): for a model that has no generate."""
    ids = prompt
    with torch.no_grad():
        for _ in range(n):
            logits = first_tensor(model(ids))
            logits = logits.full_tensor() if isinstance(logits, DTensor) else full(logits)
            ids = torch.cat([ids, logits[:, -1].argmax(-1, keepdim=True)], dim=1)
    return ids


# ---------------------------------------------------------------------------------------
# This course's models
# ---------------------------------------------------------------------------------------

def ours_gpt_config(arch, t):
    """A tiny config every t in 2..4 can take: H 48, 12 heads of 4, V 67 (uneven at every t),
    GQA with 2 KV heads (replicated on 2 ranks each at t = 4), 3 at t = 3."""
    from tp_from_scratch.gpt.model import GPTConfig
    return GPTConfig(arch=arch, vocab_size=67, seq_len=16, n_layers=2, hidden=48, n_heads=12,
                     n_kv_heads=3 if t % 3 == 0 else 2, ffn=96)


def tp_of_ours(group, reference):
    """THE adapter to this course's TP GPT: gpt.parallelize.gpt_to_tp, the plan (gpt.arch.PLANS)
    applied to a copy of ``reference``."""
    from tp_from_scratch.gpt.parallelize import gpt_to_tp
    return gpt_to_tp(group, reference)


def build_ours_gpt(arch, ctx, dtype, seed=0):
    from tp_from_scratch.gpt.generate import generate
    from tp_from_scratch.gpt.arch import shard_axis
    from tp_from_scratch.gpt.model import GPT
    from tp_from_scratch.gpt.parallelize import gather_state_dict, gpt_to_tp, unshard_tensor
    config = ours_gpt_config(arch, ctx.t)
    config.validate(ctx.t)
    reference = randomize(GPT(config).to(dtype), seed)
    parallel = tp_of_ours(ctx.group, reference)

    def full_parameter(name, x):
        if shard_axis(name, config.arch) is None:
            return x
        return unshard_tensor(name, gather_pieces(ctx.group, x), config)

    def round_trip(model):
        full = gather_state_dict(ctx.group, model.state_dict(), config)
        back = gpt_to_tp(ctx.group, full, config).state_dict()
        return [(n, v, back[n]) for n, v in model.state_dict().items()]

    return Pair(reference, parallel, ctx.group, config.vocab_size, run=lambda m, ids, y: m(ids, y),
                full_parameter=full_parameter, layout_of=gpt_layout(config, ctx.t, ctx.rank),
                generate=lambda m, prompt, n: generate(m, prompt, n), round_trip=round_trip,
                layers=config.n_layers, head_size_of=lambda name: config.head_size
                if name.endswith(("attn.q", "attn.k", "attn.v")) else None,
                misplaced=lambda: gpt_misplaced(config, ctx.t, ctx.rank, reference, parallel))


def build_ours_deepseek(layout, ctx, dtype, seed=0):
    from tp_from_scratch.comm import Comm
    from tp_from_scratch.deepseek.checks import tiny_model_config
    from tp_from_scratch.deepseek.arch import shard, unshard
    from tp_from_scratch.deepseek.model import ParallelDeepseekV3, check_config, from_hf_state_dict, generate, hf_name
    config = tiny_model_config()
    check_config(config, ctx.t, layout)
    reference = randomize(ParallelDeepseekV3(config, group=Comm(0, 1), layout=layout).to(dtype), seed)
    sd = {hf_name(n): v for n, v in reference.state_dict().items()}
    parallel = from_hf_state_dict(config, sd, group=ctx.group, layout=layout, dtype=dtype)

    def run(model, ids, targets):
        logits = model(ids)
        return logits, F.cross_entropy(logits.flatten(0, 1), targets.flatten())

    def full_parameter(name, x):
        return unshard(name, gather_pieces(ctx.group, x), layout)

    def round_trip(model):
        out = []
        for name, v in model.state_dict().items():
            full = unshard(name, gather_pieces(ctx.group, v), layout)
            out.append((name, v, shard(name, full, layout, ctx.t, ctx.rank)))
        return out

    return Pair(reference, parallel, ctx.group, config.vocab_size, run=run, full_parameter=full_parameter,
                layout_of=deepseek_layout(config), generate=lambda m, p, n: generate(m, p, n)[0],
                round_trip=round_trip, layers=config.num_hidden_layers)


# ---------------------------------------------------------------------------------------
# transformers' own TP
# ---------------------------------------------------------------------------------------

def read_plan(plan):
    """"auto", or the rules of a JSON file {module pattern: style}."""
    if plan in (None, "auto"):
        return "auto"
    return json.loads(Path(plan).read_text())


def build_hf(directory, plan, ctx, dtype, seed=0):
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    from transformers import AutoModelForCausalLM
    from transformers.utils import logging
    logging.set_verbosity_error()
    logging.disable_progress_bar()
    reference = AutoModelForCausalLM.from_pretrained(directory, dtype=dtype).eval()
    parallel = AutoModelForCausalLM.from_pretrained(directory, dtype=dtype, tp_plan=read_plan(plan)).eval()
    config = reference.config
    head = getattr(config, "head_dim", None) or config.hidden_size // config.num_attention_heads

    def run(model, ids, targets):
        out = model(input_ids=ids, labels=ids)   # transformers shifts the labels itself
        return out.logits, out.loss

    def full_parameter(name, x):
        return x.full_tensor() if isinstance(x, DTensor) else x

    def generate(model, prompt, n):
        pad = config.pad_token_id if config.pad_token_id is not None else 0
        return model.generate(input_ids=prompt, attention_mask=torch.ones_like(prompt), max_new_tokens=n,
                              min_new_tokens=n, do_sample=False, pad_token_id=pad)

    def round_trip(model):
        import torch.distributed as dist
        saved = os.path.join(ctx.shared or ctx.tmp, "saved")
        model.save_pretrained(saved)          # every rank gathers; rank 0 alone writes the files
        dist.barrier(group=ctx.group)
        back = AutoModelForCausalLM.from_pretrained(saved, dtype=dtype)
        mine = dict(back.named_parameters())
        return [(n, full_parameter(n, p), mine[n]) for n, p in model.named_parameters()]

    def layout_of(kind, name, local, reference):
        return REPLICATED if name == "(logits)" else infer_layout(local, reference)

    return Pair(reference, parallel, ctx.group, config.vocab_size, run=run, full_parameter=full_parameter,
                layout_of=layout_of, generate=generate, round_trip=round_trip,
                layers=config.num_hidden_layers,
                precision="float32" if dtype == torch.float64 else None,   # its float32 islands
                head_size_of=lambda name: head if name.endswith(("q_proj", "k_proj", "v_proj")) else None)


# ---------------------------------------------------------------------------------------
# Any nn.Module with a DTensor plan: an entry point the engineer writes
# ---------------------------------------------------------------------------------------

def load_entry(spec):
    """The function ``module:function`` or ``path/file.py:function`` names."""
    where, _, name = spec.rpartition(":")
    if where.endswith(".py"):
        path = Path(where).resolve()
        sys.path.insert(0, str(path.parent))
        loaded = importlib.util.spec_from_file_location(path.stem, path)
        module = importlib.util.module_from_spec(loaded)
        loaded.loader.exec_module(module)
    else:
        module = importlib.import_module(where)
    return getattr(module, name)


def _head_size_of(model):
    sizes = {}
    for name, module in model.named_modules():
        size = getattr(module, "head_dim", None) or getattr(module, "head_size", None)
        if isinstance(size, int):
            for child, _ in module.named_children():
                sizes[f"{name}.{child}" if name else child] = size
    return sizes.get


def build_entry(spec, ctx, dtype, seed=0):
    from torch.distributed.tensor.parallel import loss_parallel
    made = load_entry(spec)(ctx.mesh, dtype)
    made = made if isinstance(made, dict) else dict(zip(("reference", "parallel"), made))
    reference, parallel = made["reference"], made["parallel"]
    custom_loss = made.get("loss")
    vocab = made.get("vocab_size") or first_tensor([p for p in reference.parameters()]).shape[0]
    sharded_logits = []

    def run(model, ids, targets):
        logits = first_tensor(model(ids))
        if model is reference:
            return logits, F.cross_entropy(logits.flatten(0, 1), targets.flatten())
        if custom_loss is not None:
            return logits, custom_loss(logits, targets)
        if isinstance(logits, DTensor) and logits.placements[0].is_shard():
            sharded_logits.append(True)
            with loss_parallel():
                return logits, F.cross_entropy(logits.flatten(0, 1), targets.flatten())
        full = logits.full_tensor() if isinstance(logits, DTensor) else logits
        return logits, F.cross_entropy(full.flatten(0, 1), targets.flatten())

    def loss_context():
        return loss_parallel() if sharded_logits else nullcontext()

    def full_parameter(name, x):
        return x.full_tensor() if isinstance(x, DTensor) else x

    def layout_of(kind, name, local, ref):
        return REPLICATED if name == "(logits)" else infer_layout(local, ref)

    return Pair(reference, parallel, ctx.group, made.get("vocab_size") or vocab, run=run,
                full_parameter=full_parameter, layout_of=layout_of,
                generate=lambda m, p, n: greedy(m, p, n, lambda x: to_full(ctx.group, x, REPLICATED)),
                layers=made.get("layers", 1), head_size_of=_head_size_of(parallel), loss_context=loss_context)


def builder(source):
    """The build(ctx, dtype, seed) function of a source string (see the module docstring)."""
    kind, _, rest = source.partition(":")
    if kind == "ours":
        if rest in ("gpt", "gpt2", "llama"):
            return lambda ctx, dtype, seed=0: build_ours_gpt(rest, ctx, dtype, seed)
        layout = {"deepseek": "experts on all tokens", "deepseek-etp": "expert tensor parallel"}[rest]
        return lambda ctx, dtype, seed=0: build_ours_deepseek(layout, ctx, dtype, seed)
    if kind == "hf":
        directory, _, plan = rest.partition("::")
        return lambda ctx, dtype, seed=0: build_hf(directory, plan or "auto", ctx, dtype, seed)
    if kind == "entry":
        return lambda ctx, dtype, seed=0: build_entry(rest, ctx, dtype, seed)
    raise ValueError(f"unknown source {source!r}")


def deepcopy_module(module):
    return copy.deepcopy(module)
