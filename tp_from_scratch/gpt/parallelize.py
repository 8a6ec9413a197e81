"""Tensor parallelism applied from the plan: the single-device GPT in, this rank's TP GPT out.

    parallelize(model, group, plan=None, styles=TP_STYLES, config=None)   in place, like DTensor's
                                            parallelize_module(model, mesh, plan) and picotron's
                                            apply_tensor_parallel: returns ``model``
    gpt_to_tp(group, model_or_state_dict, config=None)   the same on a copy (the reference stays)
    tp_to_gpt(tp_model)                     the single-device GPT back (collective)
    shard_tensor / unshard_tensor           one tensor's piece on a rank, the whole from the pieces
    shard_state_dict / unshard_state_dict   the same for a state dict
    gather_state_dict(group, local, config) every rank's pieces all-gathered and glued (collective)

``parallelize`` walks the model and looks every module up in the plan (gpt.arch.PLANS: module
name pattern -> style): a planned module is handed to ``styles[style]``, which returns what
takes its place, built from the full module's weights (this rank's shard, a copy: the rank
needs no communication and the plan alone says which piece is its). With the default
``TP_STYLES``, Lesson 5's layers:

    COPY_IN         a block's (and the head's) copy_in point -> f (copy_to_tp_region)
    COLWISE         nn.Linear -> ColumnParallelLinear.from_linear (no f of its own when its
                    module has a COPY_IN point: one f for q, k, v; one for gate, up)
    KV_COLWISE      the same with replicas = t/nkv when there are fewer KV heads than ranks
    ROWWISE         nn.Linear -> RowParallelLinear.from_linear (g after the partial sums)
    VOCAB_PARALLEL  nn.Embedding -> VocabParallelEmbedding.from_embedding; the untied LM head
                    -> a ColumnParallelLinear of the same vocabulary rows; nn.CrossEntropyLoss ->
                    VocabParallelCrossEntropy (the loss without gathering the logits)
    REPLICATED      left as it is (norms, the position embedding)

So per block the TP model makes 2 all-reduces forward (the g's) and 2 backward (the f's), as
Megatron's does: the COPY_IN points keep ONE f for the column layers that read one input.

The extension point: ``styles`` is a parameter. A later lesson parallelizes the same model by
the same plan with its own table, {style: make(module, group, site) -> replacement}, without
touching gpt/: partially synchronized activations swap ROWWISE for a partial-sync row layer
(and add a style of their own to the plan where the streams begin); layers whose reductions
must follow a fixed tree, uneven head splits, dropped sync points or a quantized all-reduce
are each a style table too. ``site`` (a Site) says where the module sits: its full name (a
layer index, say), its parent, the model's config, and whether its parent applies f at a
copy_in point. Start from ``{**TP_STYLES, ROWWISE: my_row_style}``.
"""
import copy
from dataclasses import dataclass
from functools import partial

import torch
from torch import nn

from tp_from_scratch.gpt.arch import (COLWISE, COPY_IN, KV_COLWISE, PLANS, REPLICATED, ROWWISE,
                                      VOCAB_PARALLEL, head_split_sizes, kv_replicas, module_style, replicas_of,
                                      shard_axis, split_sizes)
from tp_from_scratch.gpt.model import GPT
from tp_from_scratch.nn import (ColumnParallelLinear, RowParallelLinear, VocabParallelEmbedding,
                                copy_to_tp_region, vocab_parallel_cross_entropy)
from tp_from_scratch.nn.mappings import all_gather, tp_rank, tp_world_size
from tp_from_scratch.sharding import shard_range

# ---------------------------------------------------------------------------------------
# The styles: how a module of each style becomes this rank's part of the TP model
# ---------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Site:
    """Where a planned module sits, for a style to read what it needs."""
    name: str           # its full name in the model, e.g. "blocks.0.attn.k" ("attn.k" in a lone Block)
    parent: nn.Module   # the module holding it
    config: object      # the model's config (KV heads, vocabulary size, ...)
    copied: bool        # its parent applies f at a copy_in point planned COPY_IN: the column
                        # layers reading that input skip their own f (a row layer ignores it)


class VocabParallelCrossEntropy(nn.Module):
    """nn.CrossEntropyLoss on logits Sharded(vocab): (N, V/t) local logits, (N,) global target
    ids -> the mean loss over the whole vocabulary, Replicated. Forward: three all-reduces of N
    numbers (nn.cross_entropy); the logits are never gathered."""

    def __init__(self, vocab_start, *, group):
        super().__init__()
        self.group, self.vocab_start = group, vocab_start  # the first id of this rank's vocabulary rows

    def forward(self, logits, targets):
        return vocab_parallel_cross_entropy(self.group, logits, targets, vocab_start=self.vocab_start)

    def extra_repr(self):
        return f"vocab_start={self.vocab_start}"


def copy_in_style(point, group, site):
    """COPY_IN: f (identity forward, all-reduce backward), a plain function like the point it replaces."""
    return partial(copy_to_tp_region, group)


def column_style(linear, group, site, replicas=1):
    """COLWISE: this rank's rows of W and b (out/t; whole query heads, gpt.arch.split_sizes); no f
    of its own where its parent applies one."""
    sizes = head_split_sizes(site.name, site.config, tp_world_size(group))  # None: like numpy.array_split
    layer = ColumnParallelLinear.from_linear(linear, group=group, replicas=replicas, sizes=sizes)
    layer.input_is_copied = site.copied
    return layer


def kv_column_style(linear, group, site):
    """KV_COLWISE: whole KV heads; t/nkv neighbouring ranks hold the same one when nkv < t."""
    return column_style(linear, group, site, replicas=kv_replicas(site.config, tp_world_size(group)))


def row_style(linear, group, site):
    """ROWWISE: this rank's columns of W (in/t; the columns of its query heads for attention's o),
    the bias whole; the input arrives Sharded."""
    sizes = head_split_sizes(site.name, site.config, tp_world_size(group))  # None: like numpy.array_split
    return RowParallelLinear.from_linear(linear, group=group, sizes=sizes)


def vocab_parallel_style(module, group, site):
    """VOCAB_PARALLEL: the embedding, the untied LM head and the loss, by vocabulary rows
    (sharding.shard_range: uneven when t does not divide V)."""
    if isinstance(module, nn.Embedding):
        return VocabParallelEmbedding.from_embedding(module, group=group)
    if isinstance(module, nn.Linear):   # the untied head: read as head_weight(), (V/t, H)
        return column_style(module, group, site)
    if isinstance(module, nn.CrossEntropyLoss):
        start, _ = shard_range(site.config.vocab_size, tp_rank(group), tp_world_size(group))
        return VocabParallelCrossEntropy(start, group=group)
    raise TypeError(f"{site.name}: VOCAB_PARALLEL splits an Embedding, a Linear head or a "
                    f"CrossEntropyLoss, not a {type(module).__name__}")


def replicated_style(module, group, site):
    """REPLICATED: the module stays whole on every rank."""
    return module


# style -> make(module, group, site): what takes the module's place on this rank
TP_STYLES = {COPY_IN: copy_in_style, COLWISE: column_style, KV_COLWISE: kv_column_style, ROWWISE: row_style,
             VOCAB_PARALLEL: vocab_parallel_style, REPLICATED: replicated_style}

# ---------------------------------------------------------------------------------------
# Applying a plan
# ---------------------------------------------------------------------------------------


def _join(prefix, name):
    return f"{prefix}.{name}" if prefix else name


def planned_sites(model, plan):
    """[(parent, attribute, full name, style)] of every module of ``model`` the plan names, and
    of every input point it names (a plain function attribute such as attn.copy_in)."""
    points = {pattern.rpartition(".")[2] for pattern in plan}  # the last component of each pattern
    sites = []
    for prefix, parent in model.named_modules():
        children = list(parent._modules) + [a for a in sorted(points) if callable(vars(parent).get(a))]
        for attr in children:
            style = module_style(_join(prefix, attr), plan=plan)
            if style is not None:
                sites.append((parent, attr, _join(prefix, attr), style))
    return sites


def parallelize(model, group, plan=None, styles=TP_STYLES, config=None):
    """Turn the single-device ``model`` into this rank's TP model over ``group``, in place.

    plan: {module name pattern: style} (default: gpt.arch.PLANS[config.arch]); patterns match
    the end of a name, so a lone Block is parallelized by the GPT's plan too. styles: {style:
    make(module, group, site)}, default TP_STYLES. config: default ``model.config``; it is
    validated for t ranks first. Every rank calls it with the same full weights; no
    communication. Returns ``model``, which records its group as ``model.group``.
    """
    config = config if config is not None else model.config
    t = tp_world_size(group)
    config.validate(t)
    plan = PLANS[config.arch] if plan is None else plan
    sites = planned_sites(model, plan)
    missing = sorted({style for *_, style in sites} - set(styles))
    if missing:
        raise ValueError(f"the style table has no entry for {missing} (used by the plan at "
                         f"{next(name for _, _, name, s in sites if s == missing[0])})")
    for parent, attr, name, style in reversed(sites):  # children first: a parent's style sees them parallel
        # one f for the column layers of a module whose copy_in point the plan turns into f
        copied = callable(vars(parent).get("copy_in")) and module_style(_join(name.rpartition(".")[0], "copy_in"),
                                                                        plan=plan) == COPY_IN
        site = Site(name, parent, config, copied)
        setattr(parent, attr, styles[style](getattr(parent, attr), group, site))
    model.group = group
    return model


def gpt_to_tp(group, model_or_state_dict, config=None, *, plan=None, styles=TP_STYLES):
    """This rank's TP model of a single-device GPT (or ViT, or Block), or of a GPT's full state dict.

    The single-device model is left as it is: parallelize runs on a copy (without gradients).
    config: needed with a state dict, or with a module that has none (a Block). Every rank calls
    it with the same full weights; no communication.
    """
    if isinstance(model_or_state_dict, nn.Module):
        model = copy.deepcopy(model_or_state_dict)
        for p in model.parameters():
            p.grad = None
    elif config is None:
        raise ValueError("gpt_to_tp needs config= when given a state dict")
    else:
        first = next(iter(model_or_state_dict.values()))
        # built with torch's default init, then overwritten (the meta device would spare both,
        # but entering it first costs seconds, and more when simulated ranks enter it at once)
        model = GPT(config).to(dtype=first.dtype, device=first.device)
        model.load_state_dict(model_or_state_dict)
    return parallelize(model, group, plan, styles, config)


# ---------------------------------------------------------------------------------------
# Conversion through state dicts: the plan says how each parameter is split
# ---------------------------------------------------------------------------------------

# shard_axis(name) and replicas_of(name, config, tp) come from the architecture's sharding plan
# (gpt.arch.PLANS): e.g. blocks.0.attn.q.weight -> 0 (column), blocks.0.mlp.down.weight -> 1 (row)


def cut(full, axis, sizes, rank, replicas=1):
    """Rank ``rank``'s piece of ``full`` split along ``axis`` into pieces of ``sizes`` (a copy;
    whole when axis is None). A tensor held by r replicas is cut into t/r pieces; rank i takes
    piece i // r."""
    if axis is None:
        return full.clone()
    return torch.split(full, sizes, dim=axis)[rank // replicas].clone()


def glue(pieces, axis, replicas=1):
    """The full tensor from every rank's piece (rank order): the inverse of cut."""
    if axis is None:
        return pieces[0].clone()
    return torch.cat(pieces[::replicas], dim=axis)  # one copy of each replicated piece


def shard_tensor(name, full, tp, rank, config):
    """This rank's piece of the full tensor ``full`` named ``name`` (a copy): its rows or columns
    as the plan splits them (gpt.arch.split_sizes: heads whole, the rest like numpy.array_split)."""
    axis = shard_axis(name, config.arch)
    sizes = None if axis is None else split_sizes(name, config, tp, full.shape[axis])
    return cut(full, axis, sizes, rank, replicas_of(name, config, tp))


def unshard_tensor(name, pieces, config):
    """The full tensor from every rank's piece, in rank order: the inverse of shard_tensor."""
    return glue(pieces, shard_axis(name, config.arch), replicas_of(name, config, len(pieces)))


def shard_state_dict(full, tp, rank, config):
    """Single-device state dict -> rank ``rank``'s state dict of the TP model."""
    return {name: shard_tensor(name, tensor, tp, rank, config) for name, tensor in full.items()}


def unshard_state_dict(pieces, config):
    """Every TP rank's state dict (a list in rank order) -> the single-device state dict."""
    return {name: unshard_tensor(name, [p[name] for p in pieces], config) for name in pieces[0]}


def gather_state_dict(group, local_state_dict, config):
    """Every TP rank's tensors gathered to all ranks and glued into the full state dict.

    Collective over ``group`` (a ProcessGroup or a Comm): one all-gather per sharded tensor,
    along its shard axis; replicated tensors are taken from this rank.
    """
    full = {}
    for name, local in local_state_dict.items():
        axis = shard_axis(name, config.arch)
        if axis is None:
            full[name] = local.detach().clone()
            continue
        sizes = all_gather(group, torch.tensor([local.shape[axis]])).tolist()  # every rank's length
        pieces = all_gather(group, local.detach(), axis, sizes).split(sizes, dim=axis)
        full[name] = unshard_tensor(name, list(pieces), config)
    return full


def tp_to_gpt(tp_model):
    """The single-device GPT with the full weights of ``tp_model`` (collective over its group)."""
    full = gather_state_dict(tp_model.group, tp_model.state_dict(), tp_model.config)
    model = GPT(tp_model.config).to(next(iter(full.values())).dtype)
    model.load_state_dict(full)
    return model
