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
parameters' gradients are summed after backward (after_backward); the reference is the same
model on one device trained on the whole batch.

--layout tp is "experts on all tokens": every rank holds every token, its heads and its
experts. --layout ep is "expert parallel": the --tp ranks form the expert-parallel group, rank
r takes rows r*B/t .. (r+1)*B/t of the batch, attention and dense FFNs are whole on every rank.
Either way each rank's loss is the global mean (each rank's share of the summed cross-entropy,
added over the group), so the loss equals one device's at every step.

--save and --load are Lesson 6's checkpoints with this model's cut (deepseek/checkpoint.py): a
checkpoint loads at any --tp and --layout, and with --load the model's sizes are the
checkpoint's (an imported Hugging Face model too: deepseek.convert import); a size flag given
that contradicts them is refused.
"""
from dataclasses import dataclass
import torch
import torch.nn.functional as F
from torch import nn

from tp_from_scratch.comm import Comm
from tp_from_scratch.gpt import checkpoint as ckpt
from tp_from_scratch.gpt import train as gpt_train
from tp_from_scratch.gpt.mesh import setup_mesh
from tp_from_scratch.nn.mappings import reduce_from_tp_region, tp_rank, tp_world_size

from .checkpoint import DESCRIPTION, DeepSeekSharding
from .model import ParallelDeepseekV3, check_config, config_from_hf, from_hf_state_dict, hf_name

ARCH = "deepseek_v3"
LAYOUTS = {"tp": "experts on all tokens", "ep": "expert parallel"}


@dataclass(frozen=True)
class DeepSeekTrainConfig(gpt_train.TrainConfig):
    """Lesson 6's settings, plus the layout, the experts and a smaller default model.

    The size flags (SIZE_FLAGS) stay None unless given, so that with --load a flag given is
    checked against the checkpoint and one not given takes its value; size(flag) is the
    value a fresh model uses."""
    layout: str = "tp"
    experts: int = 8
    arch: str = ARCH
    ARCHS = (ARCH,)
    hidden: int = 32
    heads: int = 4
    layers: int = 2
    seq_len: int = 16
    vocab_size: int = 64

    def size(self, flag):
        """The size flag's value, or its default when not given."""
        given = getattr(self, flag)
        return getattr(DeepSeekTrainConfig, flag) if given is None else given


# the size flags and the config fields they set (what --load takes from the checkpoint instead)
SIZE_FLAGS = {"hidden": "hidden_size", "heads": "num_attention_heads", "layers": "num_hidden_layers",
              "experts": "n_routed_experts", "vocab_size": "vocab_size", "ffn": "intermediate_size"}


def model_config(opts):
    """The DeepseekV3 config (transformers' field names) of the settings, or with --load the
    checkpoint's, with the sizes Lesson 6's loop reads (n_layers, seq_len) and the arch."""
    hf = ckpt.read_metadata(opts.load)[1]["config"] if opts.load else flag_config(opts)
    config = config_from_hf({**hf, "model_type": ARCH})
    config.n_layers, config.seq_len, config.arch = config.num_hidden_layers, opts.seq_len, ARCH
    config.summary = lambda: (f"{config.n_layers} layers, H={config.hidden_size}, "
                              f"nh={config.num_attention_heads}, E={config.n_routed_experts}, "
                              f"V={config.vocab_size}, T={opts.seq_len}")
    return config


def flag_config(opts):
    """The config.json dict of the size flags: the course's small DeepSeek-V3."""
    H, nh = opts.size("hidden"), opts.size("heads")
    return dict(model_type=ARCH, vocab_size=256 if opts.data == "text" else opts.size("vocab_size"), hidden_size=H,
              intermediate_size=opts.size("ffn") or 2 * H, num_hidden_layers=opts.size("layers"),
              first_k_dense_replace=1,
              num_attention_heads=nh, num_key_value_heads=nh, q_lora_rank=H // 2, kv_lora_rank=H // 4,
              qk_nope_head_dim=H // nh, qk_rope_head_dim=4, v_head_dim=H // nh, rms_norm_eps=1e-6,
              hidden_act="silu", moe_intermediate_size=H // 2, n_routed_experts=opts.size("experts"),
              num_experts_per_tok=2, n_group=1, topk_group=1, norm_topk_prob=True,
              routed_scaling_factor=2.5, n_shared_experts=1, max_position_embeddings=opts.seq_len)


def loaded_size_problem(opts, config):
    """With --load: the first size flag given that contradicts the checkpoint, or data it cannot model."""
    for flag, field in SIZE_FLAGS.items():
        given = getattr(opts, flag)
        if given is not None and given != getattr(config, field):
            return (f"--{flag.replace('_', '-')} {given} contradicts the checkpoint's {field}="
                    f"{getattr(config, field)} (with --load the model's sizes are the checkpoint's: drop the flag)")
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


def hooks_for(opts, config):
    def parallelize(full, group):
        sd = {hf_name(n): v for n, v in full.model.state_dict().items()}
        dtype = next(full.parameters()).dtype
        return CausalLM(from_hf_state_dict(config, sd, group=group, layout=LAYOUTS[opts.layout], dtype=dtype))

    return gpt_train.Hooks(parallelize=parallelize, init_model=init_model, description=DESCRIPTION,
                           after_backward=lambda m: m.model.sum_replicated_gradients(),
                           checkpoint_meta={"layout": LAYOUTS[opts.layout]},
                           sharding=DeepSeekSharding(LAYOUTS[opts.layout]))


def build_parser():
    p = gpt_train.build_parser()
    p.prog = "python -m tp_from_scratch.deepseek.train"
    p.description = __doc__
    d = DeepSeekTrainConfig()
    p.set_defaults(arch=d.arch, seq_len=d.seq_len, **{flag: None for flag in SIZE_FLAGS})
    for action in p._actions:
        if action.dest == "arch":
            action.choices = [ARCH]
    g = p.add_argument_group("DeepSeek-V3")
    g.add_argument("--layout", choices=list(LAYOUTS), default=d.layout,
                   help="tp: every rank all tokens, its heads and experts; ep: every rank its own rows, "
                        "whole attention, its experts")
    g.add_argument("--experts", type=int, help=f"routed experts E (2 per token, 1 shared; default {d.experts})")
    for action in p._actions:   # the sizes' defaults, said in the help (the values are None until given)
        if action.dest in SIZE_FLAGS and action.dest != "experts":
            action.help = f"default {getattr(d, action.dest)}" + (" (0: 2 x hidden)" if action.dest == "ffn" else "")
    return p


def validate(opts, world_size):
    """The first problem with the settings for this world size, as a sentence; None if fine."""
    problem = gpt_train.flag_problem(opts)
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
    if opts.size("hidden") % opts.size("heads"):
        return f"--hidden {opts.size('hidden')} is not divisible by --heads {opts.size('heads')}"
    try:
        if opts.load:
            ckpt.check_description(ckpt.read_metadata(opts.load)[1], DESCRIPTION, opts.load)
        config = model_config(opts)
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
    config = model_config(opts)
    hooks = hooks_for(opts, config)
    model = hooks.parallelize(init_model(config, opts.seed, opts.torch_dtype), comm)
    optimizer = gpt_train.make_optimizer(model.parameters(), opts)
    return [loss.item() for _, loss in gpt_train.steps_on_comm(opts, config, model, optimizer, hooks.after_backward)]


def single_device_losses(argv=()):
    """The reference: the same model on one device, trained on the whole batch of every step."""
    opts = parse(argv)
    return [loss for _, loss in gpt_train.single_device_run(model_config(opts), opts, init_model=init_model)]


def main(argv=None):
    opts = gpt_train.parse_config(build_parser(), validate, argv, config_class=DeepSeekTrainConfig)
    mesh = setup_mesh(opts.tp, opts.device, opts.timeout)
    config = model_config(opts)
    gpt_train.run_and_exit(lambda o, c, m: gpt_train.run(o, c, m, hooks_for(o, c)), opts, config, mesh)


if __name__ == "__main__":
    main()
