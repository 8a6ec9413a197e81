"""Train DeepSeek-V3 (MLA + DeepSeekMoE) with Lesson 6's trainer, checked against one device.

    # tensor parallel (the serving layout): MLA heads and every expert's rows split, float64
    .venv/bin/torchrun --standalone --nproc-per-node 2 -m tp_from_scratch.deepseek.train --layout tp --dtype float64 --steps 5 --compare-single
    # expert parallel (DeepSeek-V3's training): each rank its own rows of the batch, experts spread
    .venv/bin/torchrun --standalone --nproc-per-node 2 -m tp_from_scratch.deepseek.train --layout ep --dtype float64 --steps 5 --compare-single
    # the text corpus (bytes, V = 256), a validation loss every 10 steps
    .venv/bin/torchrun --standalone --nproc-per-node 2 -m tp_from_scratch.deepseek.train --layout ep --data text --steps 30 --eval-every 10
    # save under expert parallelism, resume on 4 ranks in the tensor-parallel layout
    .venv/bin/torchrun --standalone --nproc-per-node 2 -m tp_from_scratch.deepseek.train --tp 2 --layout ep --steps 4 --save runs/ds
    .venv/bin/torchrun --standalone --nproc-per-node 4 -m tp_from_scratch.deepseek.train --tp 4 --layout tp --steps 8 --load runs/ds --compare-single

This is gpt/train.py's run (the step, loop, metrics, report and single-device comparison) with
Hooks: the model is Lesson 12's ParallelDeepseekV3 built from one seeded single-device model
(init_model) in the chosen layout (parallelize); under expert parallelism the replicated
parameters' gradients are summed after backward (the step's after_backward); the reference is
the same model on one device trained on the whole batch; DeepSeekModel tells the run its depth,
its batches' shape and its sizes.

--layout tp is "experts on all tokens": every rank holds every token, its heads and its
experts. --layout ep is "expert parallel": the --tp ranks form the expert-parallel group, rank
r takes rows r*B/t .. (r+1)*B/t of the batch, attention and dense FFNs are whole on every rank.
Either way each rank's loss is the global mean (each rank's share of the summed cross-entropy,
added over the group), so the loss equals one device's at every step.

--clip-grad-norm clips after that sum (and the DP average) by the global norm, placed by the
layout's plan (arch.clip_placement): a split parameter (an expert, a head's rows) counted on
every rank, a whole one once (tests/test_numerics_clip.py proves it against one device's
clip_grad_norm_).

--save and --load are Lesson 6's checkpoints with this model's cut (deepseek/checkpoint.py): a
checkpoint loads at any --tp and --layout, and with --load the model's sizes are the
checkpoint's (an imported Hugging Face model too: deepseek.convert import); a size flag given
that contradicts them is refused.
"""
import argparse
from dataclasses import dataclass, field, fields, replace
from functools import partial

import torch
import torch.nn.functional as F
from torch import nn

from tp_from_scratch.comm import Comm
from tp_from_scratch.comm.launch import torch_main
from tp_from_scratch.gpt import checkpoint as ckpt
from tp_from_scratch.gpt import options
from tp_from_scratch.gpt import train as gpt_train
from tp_from_scratch.gpt.hooks import Hooks, ModelKind
from tp_from_scratch.gpt.mesh import setup_mesh
from tp_from_scratch.gpt.step import make_optimizer, single_device_run, steps_on_comm, train_step
from tp_from_scratch.nn.mappings import reduce_from_tp_region, tp_rank, tp_world_size

from .arch import clip_placement
from .checkpoint import DESCRIPTION, DeepSeekSharding
from .model import ParallelDeepseekV3, check_config, config_from_hf, from_hf_state_dict, hf_name

ARCH = "deepseek_v3"
LAYOUTS = {"tp": "experts on all tokens", "ep": "expert parallel"}
# the size flags this model takes (gpt/options.py's, by their dests), with its small defaults, and
# the config field each sets (what --load takes from the checkpoint instead)
SIZES = {"hidden": 32, "n_heads": 4, "n_layers": 2, "vocab_size": 64, "ffn": 0}
SIZE_FIELDS = {"hidden": "hidden_size", "n_heads": "num_attention_heads", "n_layers": "num_hidden_layers",
               "experts": "n_routed_experts", "vocab_size": "vocab_size", "ffn": "intermediate_size"}


@dataclass(frozen=True)
class DeepSeekTrainConfig(gpt_train.TrainConfig):
    """Lesson 6's settings, plus the layout, the experts and a smaller default model.

    The size flags stay None unless given (``sizes``, and ``experts``), so that with --load a
    flag given is checked against the checkpoint and one not given takes its value;
    size(name) is the value a fresh model uses. ``model`` is transformers' DeepseekV3 config
    (None when a --load checkpoint cannot be read: validate names the problem)."""
    layout: str = "tp"
    experts: int = None
    seq_len: int = 16
    sizes: dict = field(default_factory=dict)

    @classmethod
    def from_args(cls, args):
        ours = {f.name for f in fields(cls)} - {"model", "sizes"}
        opts = cls(**{k: v for k, v in vars(args).items() if k in ours}, sizes={k: getattr(args, k) for k in SIZES})
        try:
            return replace(opts, model=model_config(opts))
        except (OSError, ValueError):   # an unreadable --load: validate says why
            return opts

    def size(self, name):
        """The size's value: the flag's, or this model's default when not given."""
        given = self.experts if name == "experts" else self.sizes.get(name)
        return ({**SIZES, "experts": 8}[name]) if given is None else given


def model_config(opts):
    """The DeepseekV3 config (transformers' field names) of the settings, or with --load the
    checkpoint's."""
    hf = ckpt.read_metadata(opts.load)[1]["config"] if opts.load else flag_config(opts)
    return config_from_hf({**hf, "model_type": ARCH})


def flag_config(opts):
    """The config.json dict of the size flags: the course's small DeepSeek-V3."""
    H, nh = opts.size("hidden"), opts.size("n_heads")
    return dict(model_type=ARCH, vocab_size=256 if opts.data == "text" else opts.size("vocab_size"), hidden_size=H,
              intermediate_size=opts.size("ffn") or 2 * H, num_hidden_layers=opts.size("n_layers"),
              first_k_dense_replace=1,
              num_attention_heads=nh, num_key_value_heads=nh, q_lora_rank=H // 2, kv_lora_rank=H // 4,
              qk_nope_head_dim=H // nh, qk_rope_head_dim=4, v_head_dim=H // nh, rms_norm_eps=1e-6,
              hidden_act="silu", moe_intermediate_size=H // 2, n_routed_experts=opts.size("experts"),
              num_experts_per_tok=2, n_group=1, topk_group=1, norm_topk_prob=True,
              routed_scaling_factor=2.5, n_shared_experts=1, max_position_embeddings=opts.seq_len)


def loaded_size_problem(opts, config):
    """With --load: the first size flag given that contradicts the checkpoint, or data it cannot model."""
    for name, hf_field in SIZE_FIELDS.items():
        given = opts.experts if name == "experts" else opts.sizes.get(name)
        if given is not None and given != getattr(config, hf_field):
            return (f"{options.FLAG_OF.get(name, '--experts')} {given} contradicts the checkpoint's {hf_field}="
                    f"{getattr(config, hf_field)} (with --load the model's sizes are the checkpoint's: drop the flag)")
    if opts.data == "text" and config.vocab_size < 256:
        return f"--data text needs 256 token ids (bytes), but the checkpoint's vocab_size is {config.vocab_size}"
    return None


class CausalLM(nn.Module):
    """ParallelDeepseekV3 with the GPT's interface: (ids, targets) -> (logits, mean loss).

    Under expert parallelism the rank runs its own rows of the batch and returns its share of
    the summed cross-entropy added over the group (g: forward all-reduce, backward identity),
    so every rank holds the global mean and each backward reaches its own tokens only."""

    def __init__(self, model):
        super().__init__()
        self.model = model

    def forward(self, ids, targets):
        group, n_tokens = self.model.group, targets.numel()
        if self.model.layout == "expert parallel":
            ids, targets = ids.chunk(tp_world_size(group))[tp_rank(group)], targets.chunk(tp_world_size(group))[tp_rank(group)]
        logits = self.model(ids)
        share = F.cross_entropy(logits.reshape(-1, logits.shape[-1]), targets.reshape(-1), reduction="sum") / n_tokens
        if self.model.layout == "expert parallel":
            share = reduce_from_tp_region(group, share)
        return logits, share


def init_model(config, seed, dtype):
    """The single-device model every rank starts from: matrices N(0, 0.02) from ``seed``, norms 1."""
    torch.manual_seed(seed)
    model = ParallelDeepseekV3(config, group=Comm(0, 1))
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in model.parameters():
            if p.ndim >= 2:
                p.copy_(0.02 * torch.randn(p.shape, generator=g))
    return CausalLM(model.to(dtype))


@dataclass(frozen=True)
class DeepSeekModel(ModelKind):
    """What Lesson 6's run asks of DeepSeek-V3 (gpt.hooks.ModelKind): its depth, its batches'
    (T, V) (T: --seq-len, a run setting here) and its sizes line."""
    name: str = ARCH
    seq_len: int = 16

    def layers(self, config):
        return config.num_hidden_layers

    def shape(self, config):
        return self.seq_len, config.vocab_size

    def sizes(self, config):
        return (f"{config.num_hidden_layers} layers, H={config.hidden_size}, nh={config.num_attention_heads}, "
                f"E={config.n_routed_experts}, V={config.vocab_size}, T={self.seq_len}")


def sum_replicated_gradients(model):
    """Expert parallelism's addition to the step: the gradients of the parameters every rank
    holds whole (attention, dense FFNs, norms) summed over the group (see ParallelDeepseekV3)."""
    model.model.sum_replicated_gradients()


def hooks_for(opts):
    """What Lesson 12 changes in Lesson 6's run: the model (built from one seeded single-device
    DeepSeek-V3, cut for --layout), the replicated gradients summed after backward."""
    layout = LAYOUTS[opts.layout]

    def parallelize(full, group):
        sd = {hf_name(n): v for n, v in full.model.state_dict().items()}
        dtype = next(full.parameters()).dtype
        return CausalLM(from_hf_state_dict(opts.model, sd, group=group, layout=layout, dtype=dtype))

    kind = DeepSeekModel(init=init_model, sharding=DeepSeekSharding(layout), description=DESCRIPTION,
                         meta={"layout": layout}, seq_len=opts.seq_len,
                         placement=lambda config, tp: clip_placement(layout))
    return Hooks(model=kind, parallelize=parallelize, step=partial(train_step, after_backward=sum_replicated_gradients))


def build_parser():
    d = DeepSeekTrainConfig()
    p = argparse.ArgumentParser(prog="python -m tp_from_scratch.deepseek.train", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    options.add_train_flags(p, d)
    # Lesson 6's size flags that this model has, not given until given (the defaults, said in the help)
    options.add_model_flags(p, defaults={**{k: None for k in SIZES}, "seq_len": d.seq_len}, only=(*SIZES, "seq_len"),
                            helps={k: f"default {v}" + (" (0: 2 x hidden)" if k == "ffn" else "") for k, v in SIZES.items()})
    g = p.add_argument_group("DeepSeek-V3")
    g.add_argument("--layout", choices=list(LAYOUTS), default=d.layout,
                   help="tp: every rank all tokens, its heads and experts; ep: every rank its own rows, "
                        "whole attention, its experts")
    g.add_argument("--experts", type=int, help="routed experts E (2 per token, 1 shared; default 8)")
    return p


def validate(opts, world_size):
    """The first problem with the settings for this world size, as a sentence; None if fine."""
    problem = options.train_flag_problem(opts) or options.positive("--experts", opts.experts)
    if problem:
        return problem
    if opts.impl != "scratch":
        return "deepseek_v3 trains with --impl scratch only (DTensor has no plan for MLA and the experts here)"
    if world_size % opts.tp != 0:
        return f"world size {world_size} is not divisible by tp={opts.tp}"
    dp = world_size // opts.tp
    per = dp * (opts.tp if opts.layout == "ep" else 1)
    if opts.batch_size % per != 0:
        return f"batch size {opts.batch_size} is not divisible by {per} (dp x the ranks of --layout {opts.layout})"
    if opts.device == "cuda" and not torch.cuda.is_available():
        return "--device cuda was asked for, but torch sees no CUDA device"
    if opts.size("hidden") % opts.size("n_heads"):
        return f"--hidden {opts.size('hidden')} is not divisible by --heads {opts.size('n_heads')}"
    try:
        if opts.load:
            ckpt.check_description(ckpt.read_metadata(opts.load)[1], DESCRIPTION, opts.load)
        config = opts.model or model_config(opts)
        check_config(config, opts.tp, LAYOUTS[opts.layout])
        if opts.load:
            problem = loaded_size_problem(opts, config)
            if problem:
                return problem
            ckpt.check_resumable(opts.load, config, DESCRIPTION, opts.steps, opts.optimizer,
                                 DeepSeekSharding(LAYOUTS[opts.layout]))
    except ValueError as e:   # CheckpointError included
        return str(e)
    return None


def parse(argv=()):
    """The settings for the command line ``argv`` (no validation: in-process use)."""
    return DeepSeekTrainConfig.from_args(build_parser().parse_args([str(a) for a in argv]))


def train_on_comm(comm, argv=()):
    """One rank's run on a tp_from_scratch Comm (run_spmd's simulated ranks), dp = 1: the model,
    data, optimizer and step of the command line ``argv``; returns the per-step losses."""
    opts = parse(argv)
    hooks = hooks_for(opts)
    model = hooks.parallelize(init_model(opts.model, opts.seed, opts.torch_dtype), comm)
    optimizer = make_optimizer(model.parameters(), opts)
    return [loss.item() for _, loss in steps_on_comm(opts, model, optimizer, hooks.model.shape(opts.model),
                                                     after_backward=sum_replicated_gradients,
                                                     clip=gpt_train.clipper_on_comm(opts, comm, hooks.model))]


def single_device_losses(argv=()):
    """The reference: the same model on one device, trained on the whole batch of every step."""
    opts = parse(argv)
    return [loss for _, loss in single_device_run(opts.model, opts, init_model=init_model,
                                                  shape=hooks_for(opts).model.shape(opts.model))]


def main(argv=None):
    opts = gpt_train.parse_config(build_parser(), validate, argv, config_class=DeepSeekTrainConfig)
    torch_main(lambda: gpt_train.run(opts, setup_mesh(opts.tp, opts.device, opts.timeout), hooks_for(opts)),
               opts.device, opts.timeout, errors=(ckpt.CheckpointError,))


if __name__ == "__main__":
    main()
