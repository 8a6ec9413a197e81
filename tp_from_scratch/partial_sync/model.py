"""The CAAT GPT in torch: Lesson 6's GPT parallelized with partial-sync row layers, and its
t-stream reference.

    caat_from_gpt (one rank of t)                  t_stream_forward (one device, all t streams)
    wte (vocab-parallel) + wpe   Replicated        wte + wpe
    f, once: the t streams begin                   t copies of x
    Block x n_layers, on this rank's stream:       every block on every stream s:
      column layers, input_is_copied=True            stream s uses rank s's shard of q, k, v, fc
        (no f: each rank reads its own stream)
      PartialSyncRowParallelLinear at o, proj:       z_s[:k] = sum_r partial_r[:k]
        partial reduce, + bias                       z_s[k:] = sqrt(t) partial_s[k:],  + bias
    ln_f, head on this rank's vocab rows           logits = [ln_f(x_s) @ W_vocab_s^T for s], side by side
    vocab-parallel cross-entropy                   cross-entropy over the whole vocabulary

The model is the GPT's own sharding plan (gpt.arch.PLANS) applied by gpt.parallelize with
CAAT's style table (``caat_styles``) instead of Lesson 6's: the same shards, other layers where
the streams meet. No recombination: the head's vocabulary shard s reads stream s. The
parameters shared by the streams (LayerNorms, o.bias, proj.bias) need their gradients summed
over the ranks after backward: autograd.all_reduce_replicated_grads. The position embedding
sits before the f and needs nothing. The model depends on t; at p = 1 it is the ordinary TP GPT.
"""
import math
from dataclasses import replace

import torch
from torch.nn import functional as F

from tp_from_scratch.gpt.arch import COLWISE, COPY_IN, KV_COLWISE, PLANS, ROWWISE, replicas_of, shard_axis
from tp_from_scratch.gpt.model import causal_self_attention
from tp_from_scratch.gpt.parallelize import TP_STYLES, column_style, gpt_to_tp, kv_column_style
from tp_from_scratch.nn import RowParallelLinear, copy_to_tp_region
from tp_from_scratch.nn.mappings import tp_world_size
from tp_from_scratch.partial_sync.autograd import partial_reduce_from_tp_region
from tp_from_scratch.partial_sync.mappings import synced_channels

# why CAAT-Net refuses heads and FFN widths that t does not divide
CAAT_EVEN = "CAAT-Net's streams (each cut evenly, as their single-device reference cuts them)"


class PartialSyncRowParallelLinear(RowParallelLinear):
    """A row-parallel layer whose g is the partial reduce: Y = partial_reduce(X_i @ W_i^T) + b.

    forward: all-reduce of the leading k = floor(p * out) channels, sqrt(t) on the rest;
    backward: the same on the gradient. The bias is added after the scaling (as Megatron adds
    it later, in its bias-dropout-add), once per stream.
    """

    def __init__(self, in_features, out_features, sync_fraction, *, group, dtype=None, device=None, init=True):
        super().__init__(in_features, out_features, bias=True, input_is_parallel=True, group=group,
                         dtype=dtype, device=device, init=init)
        synced_channels(out_features, sync_fraction)  # a p outside [0, 1] fails here, by name
        self.sync_fraction = sync_fraction

    @classmethod
    def from_linear(cls, linear, sync_fraction, *, group):
        """This rank's columns of a single-device nn.Linear's W and all of its bias (copies)."""
        w = linear.weight
        layer = cls(linear.in_features, linear.out_features, sync_fraction, group=group, dtype=w.dtype,
                    device=w.device, init=False)
        with torch.no_grad():
            layer.weight.copy_(w[:, layer.input_start:layer.input_stop])
            layer.bias.copy_(linear.bias)
        return layer

    def forward(self, x):                       # x (..., in/t) Sharded
        partial = F.linear(x, self.weight)      # (..., out) Partial
        return partial_reduce_from_tp_region(self.group, partial, self.sync_fraction) + self.bias


STREAMS_BEGIN = "streams_begin"  # CAAT's own style: f on a module's input, where the streams part


def streams_begin_style(block, group, site):
    """f on the first block's input (a forward pre-hook, as DTensor's PrepareModuleInput): from
    there on each rank carries its own stream, and backward all-reduces dx once, at the embedding."""
    block.register_forward_pre_hook(lambda module, args: (copy_to_tp_region(group, args[0]), *args[1:]))
    return block


def caat_styles(sync_fraction):
    """gpt.parallelize's TP_STYLES with CAAT's changes: every column layer reads this rank's own
    stream (no f in front of it, nor at the blocks' copy_in points: the streams never rejoin),
    the row layers are partial-sync ones, and the one f sits where the streams begin."""
    def own_stream(style):
        return lambda linear, group, site: style(linear, group, replace(site, copied=True))

    return {**TP_STYLES, COPY_IN: lambda point, group, site: point,
            COLWISE: own_stream(column_style), KV_COLWISE: own_stream(kv_column_style),
            ROWWISE: lambda linear, group, site: PartialSyncRowParallelLinear.from_linear(
                linear, sync_fraction, group=group),
            STREAMS_BEGIN: streams_begin_style}


def caat_plan(arch="gpt"):
    """The architecture's sharding plan, plus where CAAT's streams begin: the first block's input."""
    return {**PLANS[arch], "blocks.0": STREAMS_BEGIN}


def caat_from_gpt(group, gpt, sync_fraction):
    """This rank's CAAT GPT (sync fraction p) holding its shard of a single-device GPT's weights
    (copies). forward(idx, targets) -> (this rank's logits (B, T, V/t), loss): the loss is the
    full vocabulary's mean cross-entropy, the same on every rank."""
    gpt.config.check_even(tp_world_size(group), CAAT_EVEN)
    return gpt_to_tp(group, gpt, plan=caat_plan(gpt.config.arch), styles=caat_styles(sync_fraction))


# ---------------------------------------------------------------------------------------
# The single-device reference: every stream explicitly, on the GPT's own full parameters
# ---------------------------------------------------------------------------------------

def _piece(name, full, t, s, config):
    """Stream s's piece of the full tensor ``name`` (a view, so gradients reach ``full``)."""
    axis = shard_axis(name)
    if axis is None:
        return full
    r = replicas_of(name, config, t)
    return torch.tensor_split(full, t // r, dim=axis)[s // r]


def streams_partial_reduce(partials, p, scale_private=True):
    """[partial_s (..., H)] -> [z_s]: z_s[:k] = sum over r, z_s[k:] = sqrt(t) partial_s[k:].

    scale_private=False drops the sqrt(t): a control for the experiment, not the CAAT model.
    """
    t, k = len(partials), synced_channels(partials[0].shape[-1], p)
    synced = partials[0][..., :k]
    for q in partials[1:]:
        synced = synced + q[..., :k]
    scale = math.sqrt(t) if scale_private else 1.0
    return [torch.cat([synced, q[..., k:] * scale], dim=-1) for q in partials]


def _block_streams(block, xs, t, p, config, scale_private=True):
    def piece(module_name, param_name, s):
        full = block.get_submodule(module_name).get_parameter(param_name)
        return _piece(f"{module_name}.{param_name}", full, t, s, config)

    def bias(module_name, s):
        return None if block.get_submodule(module_name).bias is None else piece(module_name, "bias", s)

    parts = []
    for s, x in enumerate(xs):
        a = block.ln1(x)
        q = F.linear(a, piece("attn.q", "weight", s), bias("attn.q", s))
        k = F.linear(a, piece("attn.k", "weight", s), bias("attn.k", s))
        v = F.linear(a, piece("attn.v", "weight", s), bias("attn.v", s))
        y = causal_self_attention(q, k, v, block.attn.head_size)
        parts.append(F.linear(y, piece("attn.o", "weight", s)))
    hs = [x + z + block.attn.o.bias for x, z in zip(xs, streams_partial_reduce(parts, p, scale_private))]
    parts = []
    for s, h in enumerate(hs):
        m = F.linear(block.ln2(h), piece("mlp.fc", "weight", s), bias("mlp.fc", s))
        m = F.gelu(m, approximate=block.mlp.approximate)
        parts.append(F.linear(m, piece("mlp.proj", "weight", s)))
    return [h + z + block.mlp.proj.bias for h, z in zip(hs, streams_partial_reduce(parts, p, scale_private))]


def t_stream_forward(gpt, idx, targets, t, p, scale_private=True):
    """The CAAT model of TP degree t on ONE device, with a single-device GPT's parameters.

    Returns (logits (B, T, V), mean cross-entropy or None): what the t ranks of caat_from_gpt's model compute
    together, stream s standing for rank s. At p = 1 every stream equals the GPT's own.
    scale_private=False: the same without the sqrt(t) (the experiment's control only).
    """
    config = gpt.config
    x = gpt.wte(idx) + gpt.wpe(torch.arange(idx.shape[1], device=idx.device))
    xs = [x] * t
    for block in gpt.blocks:
        xs = _block_streams(block, xs, t, p, config, scale_private)
    name = "wte.weight" if config.tie_embeddings else "lm_head.weight"
    logits = torch.cat([F.linear(gpt.ln_f(x_s), _piece(name, gpt.head_weight(), t, s, config))
                        for s, x_s in enumerate(xs)], dim=-1)  # (B, T, V)
    if targets is None:
        return logits, None
    return logits, F.cross_entropy(logits.flatten(0, 1), targets.flatten())
