"""The CAAT GPT in torch: Lesson 6's Block on partial-sync row layers, and its t-stream reference.

    CAATGPT (one rank of t)                        t_stream_forward (one device, all t streams)
    wte (vocab-parallel) + wpe   Replicated        wte + wpe
    f, once: the t streams begin                   t copies of x
    Block x n_layers, on this rank's stream:       every block on every stream s:
      column layers, input_is_copied=True            stream s uses rank s's shard of q, k, v, fc
        (no f: each rank reads its own stream)
      PartialSyncRowParallelLinear at o, proj:       z_s[:k] = sum_r partial_r[:k]
        partial reduce, + bias                       z_s[k:] = sqrt(t) partial_s[k:],  + bias
    ln_f, head on this rank's vocab rows           logits = [ln_f(x_s) @ W_vocab_s^T for s], side by side
    vocab-parallel cross-entropy                   cross-entropy over the whole vocabulary

No recombination: the head's vocabulary shard s reads stream s. The parameters shared by
the streams (LayerNorms, o.bias, proj.bias) need their gradients summed over the ranks after
backward: autograd.all_reduce_replicated_grads. The position embedding sits before the f
and needs nothing. The model depends on t; at p = 1 it is the ordinary TP GPT.
"""
import math

import torch
from torch import nn
from torch.nn import functional as F

from tp_from_scratch.gpt.model import (Block, causal_self_attention, kv_replicas, replicas_of,
                                       shard_axis, shard_state_dict)
from tp_from_scratch.nn import (ColumnParallelLinear, RowParallelLinear, VocabParallelEmbedding,
                                copy_to_tp_region, vocab_parallel_cross_entropy)
from tp_from_scratch.nn.mappings import tp_rank, tp_world_size
from tp_from_scratch.partial_sync.autograd import partial_reduce_from_tp_region
from tp_from_scratch.partial_sync.mappings import synced_channels


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

    def forward(self, x):                       # x (..., in/t) Sharded
        partial = F.linear(x, self.weight)      # (..., out) Partial
        return partial_reduce_from_tp_region(self.group, partial, self.sync_fraction) + self.bias


class CAATGPT(nn.Module):
    """One TP rank of the GPT with partially synchronized activations (sync fraction p).

    forward(idx, targets) -> (this rank's logits (B, T, V/t), loss). The loss is the full
    vocabulary's mean cross-entropy, the same on every rank. Parameters are created empty;
    fill them with :func:`caat_from_gpt` (same names as the single-device GPT).
    """

    def __init__(self, group, config, sync_fraction, *, dtype=torch.float32, device=None):
        super().__init__()
        tp = tp_world_size(group)
        config.validate(tp)
        self.config, self.group, self.sync_fraction = config, group, sync_fraction
        kw = dict(dtype=dtype, device=device, init=False)
        replicas = kv_replicas(config, tp)

        def column(n_in, n_out, bias=True, input_is_copied=True, kv=False):
            # every column layer reads this rank's own stream: no f in front of any of them
            return ColumnParallelLinear(n_in, n_out, bias, group=group, input_is_copied=True,
                                        replicas=replicas if kv else 1, **kw)

        def row(n_in, n_out):
            return PartialSyncRowParallelLinear(n_in, n_out, sync_fraction, group=group, **kw)

        local = dict(dtype=dtype, device=device)
        self.wte = VocabParallelEmbedding(config.vocab_size, config.hidden, group=group, **kw)
        self.wpe = nn.Embedding(config.seq_len, config.hidden, **local)
        self.blocks = nn.ModuleList(Block(config, column, row) for _ in range(config.n_layers))
        for block in self.blocks:
            block.to(**local)
        self.ln_f = nn.LayerNorm(config.hidden, **local)
        if not config.tie_embeddings:
            self.lm_head = nn.Linear(config.hidden, self.wte.weight.shape[0], bias=False, **local)

    def head_weight(self):
        return self.wte.weight if self.config.tie_embeddings else self.lm_head.weight  # (V/t, H)

    def forward(self, idx, targets=None):
        x = self.wte(idx) + self.wpe(torch.arange(idx.shape[1], device=idx.device))  # (B, T, H)
        # the one f: from here on each rank carries its own stream; backward all-reduces once
        x = copy_to_tp_region(self.group, x)
        for block in self.blocks:
            x = block(x)
        logits = F.linear(self.ln_f(x), self.head_weight())  # (B, T, V/t): this stream's vocab rows
        if targets is None:
            return logits, None
        loss = vocab_parallel_cross_entropy(self.group, logits.flatten(0, 1), targets.flatten(),
                                            vocab_start=self.wte.vocab_start)
        return logits, loss


def caat_from_gpt(group, gpt, sync_fraction):
    """This rank's CAATGPT holding its shard of a single-device GPT's weights (copies)."""
    w = next(gpt.parameters())
    model = CAATGPT(group, gpt.config, sync_fraction, dtype=w.dtype, device=w.device)
    local = shard_state_dict(gpt.state_dict(), tp_world_size(group), tp_rank(group), gpt.config)
    model.load_state_dict(local)
    return model


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

    Returns (logits (B, T, V), mean cross-entropy or None): what the t ranks of CAATGPT compute
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
