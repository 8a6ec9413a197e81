"""The CAAT block stack on ONE device: all t streams computed explicitly, no communication.

This is the model that CAAT with tensor parallelism t and sync fraction p defines, written
with a leading stream axis s = 0 .. t-1: xs (t, B, T, H) holds every rank's residual stream.
Stream s uses the parameter shard that rank s would hold; the partial reduce becomes

    z_s[..., :k] = sum over r of partial_r[..., :k]     (the same on every stream)
    z_s[..., k:] = sqrt(t) * partial_s[..., k:]          (stream s's own)

and the parameters shared by all streams (LayerNorms, bo, b2) collect one gradient per stream
that the computation adds up by itself: a broadcast forward is a sum backward. The TP
version (block.py) must reproduce every output and gradient; at p = 1 every stream equals
the ordinary single-device block (layers.reference.block_forward).
"""
import math

import numpy as np

from tp_from_scratch.layers.block import shard_block_params
from tp_from_scratch.layers.reference import layernorm_backward, layernorm_forward
from tp_from_scratch.partial_sync.local import (
    attention_partial_backward, attention_partial_forward, mlp_partial_backward, mlp_partial_forward)
from tp_from_scratch.partial_sync.mappings import synced_channels
from tp_from_scratch.partial_sync.params import check_whole_kv_heads, split_axis


def streams_partial_reduce(partials, p):
    """The partial reduce over explicit streams: partials (t, ..., H) -> z (t, ..., H).

    Its own transpose, so the same function is the backward (dz -> dpartials).
    """
    t, k = partials.shape[0], synced_channels(partials.shape[-1], p)
    z = np.empty_like(partials)
    z[..., :k] = partials[..., :k].sum(axis=0)  # every stream gets the sum
    z[..., k:] = partials[..., k:] * partials.dtype.type(math.sqrt(t))
    return z


def _each_stream(fn, xs, locals_, *args):
    """fn(xs[s], locals_[s], *args) for every stream: (stacked outputs (t, ...), caches)."""
    outs, caches = zip(*(fn(x, local, *args) for x, local in zip(xs, locals_)))
    return np.stack(outs), list(caches)


def _each_stream_backward(fn, dys, caches):
    dxs, grads = zip(*(fn(dy, c) for dy, c in zip(dys, caches)))
    return np.stack(dxs), list(grads)


def _bias_grad(dys):
    return dys.reshape(-1, dys.shape[-1]).sum(axis=0)  # over streams too


def streams_block_forward(xs, params, config, p):
    """One CAAT block on all streams xs (t, B, T, H); params: the FULL block params."""
    t = xs.shape[0]
    check_whole_kv_heads(config, t)
    locals_ = [shard_block_params(params, config, t, s) for s in range(t)]
    a, c_ln1 = layernorm_forward(xs, params["ln1.weight"], params["ln1.bias"])  # per stream
    att, c_att = _each_stream(attention_partial_forward, a, locals_,
                              config.n_heads // t, config.n_kv_heads // t)
    h = xs + streams_partial_reduce(att, p) + params["attn.o.bias"]
    m, c_ln2 = layernorm_forward(h, params["ln2.weight"], params["ln2.bias"])
    mlp, c_mlp = _each_stream(mlp_partial_forward, m, locals_)
    ys = h + streams_partial_reduce(mlp, p) + params["mlp.proj.bias"]
    return ys, (p, config, c_ln1, c_att, c_ln2, c_mlp)


def _assemble(grads_per_stream, config):
    """Stream s's gradients of its shard -> the full gradient (concatenated in stream order)."""
    return {key: np.concatenate([g[key] for g in grads_per_stream], axis=split_axis(key))
            for key in grads_per_stream[0]}


def streams_block_backward(dys, cache):
    """Backward of streams_block_forward for dys (t, B, T, H): (dxs (t, B, T, H), full grads)."""
    p, config, c_ln1, c_att, c_ln2, c_mlp = cache
    dm, g_mlp = _each_stream_backward(mlp_partial_backward, streams_partial_reduce(dys, p), c_mlp)
    grads = _assemble(g_mlp, config)
    grads["mlp.proj.bias"] = _bias_grad(dys)
    dh_ln, grads["ln2.weight"], grads["ln2.bias"] = layernorm_backward(dm, c_ln2)
    dh = dys + dh_ln
    da, g_att = _each_stream_backward(attention_partial_backward, streams_partial_reduce(dh, p), c_att)
    grads.update(_assemble(g_att, config))
    grads["attn.o.bias"] = _bias_grad(dh)
    dx_ln, grads["ln1.weight"], grads["ln1.bias"] = layernorm_backward(da, c_ln1)
    return dh + dx_ln, grads


def streams_stack_forward(x, params_list, config, t, p):
    """The CAAT stack for TP degree t on x (B, T, H): (ys (t, B, T, H), one stream per rank, cache)."""
    ys = np.repeat(x[None], t, axis=0)  # the entry: every stream starts from the same x
    caches = []
    for params in params_list:
        ys, cache = streams_block_forward(ys, params, config, p)
        caches.append(cache)
    return ys, caches


def streams_stack_backward(dys, caches):
    """Backward of streams_stack_forward for dys (t, B, T, H): (dx (B, T, H), list of full grads per block)."""
    grads = []
    for cache in reversed(caches):
        dys, g = streams_block_backward(dys, cache)
        grads.append(g)
    grads.reverse()
    return dys.sum(axis=0), grads  # the entry's copy to t streams: its gradient is the sum
