"""The sequence-parallel pre-LN transformer block (Korthikanti et al. 2022, Fig. 5), in numpy.

Where each activation lives, per rank, with T_r this rank's positions (T/t when t divides T):

    x        (B, T_r, H)      Sharded(1)   the residual stream never leaves its shard
    ln1      (B, T_r, H)      Sharded(1)   LayerNorm per position: no communication
      g      (B, T, H)        Replicated   all-gather along T
    q, k, v  (B, T, nh/t*hs)  Sharded(-1)  this rank's heads, every position (causal attention
                                           needs the whole sequence)
    o        (B, T, H)        Partial      row-parallel output projection
      g-bar  (B, T_r, H)      Sharded(1)   reduce-scatter along T, then + bias
    h = x + attn              Sharded(1)
    ln2, g, fc, GeLU, proj, g-bar: the same pattern, with (B, T, F/t) Sharded(-1) inside
    y = h + mlp (B, T_r, H)   Sharded(1)

Compared with Lesson 3's block, each all-reduce became a reduce-scatter (g-bar) and each
identity f an all-gather (g): 2 all-gathers + 2 reduce-scatters forward, the same backward,
the same bytes. Backward adds one all-reduce per LayerNorm for its Partial weight and bias
gradients (layernorm.py). The parameters and their shards are exactly Lesson 3's
(``layers.block.shard_block_params``), so the two blocks share checkpoints.
"""
from tp_from_scratch.layers.attention import kv_heads_of_rank
from tp_from_scratch.layers.reference import (
    gelu_backward, gelu_forward, qkv_attention_backward, qkv_attention_forward, sub_params)
from tp_from_scratch.sequence_parallel.layernorm import (
    sequence_parallel_layernorm_backward, sequence_parallel_layernorm_forward)
from tp_from_scratch.sequence_parallel.linear import (
    sequence_parallel_column_linear_backward, sequence_parallel_column_linear_forward,
    sequence_parallel_row_linear_backward, sequence_parallel_row_linear_forward)
from tp_from_scratch.sequence_parallel.mappings import (
    gather_from_sequence_parallel_region_backward, gather_from_sequence_parallel_region_forward)


def sequence_parallel_attention_forward(comm, x_shard, params_local, n_heads, n_kv_heads):
    """Attention on a sequence shard: all-gather (g), local heads, row projection, reduce-scatter (g-bar).

    x_shard (B, T_r, H) Sharded(1); params_local as in layers.attention; global head counts.
    Returns (y_shard (B, T_r, H) Sharded(1), cache).
    """
    tp = comm.world_size
    _, n_kv_local = kv_heads_of_rank(n_heads, n_kv_heads, tp, comm.rank)
    # q, k and v read the same gathered x: one all-gather serves all three
    x = gather_from_sequence_parallel_region_forward(comm, x_shard)                 # (B, T, H)
    o_local, c_attn = qkv_attention_forward(x, params_local, n_heads // tp, n_kv_local)  # (B, T, nh/t*hs)
    p = params_local
    y, c_out = sequence_parallel_row_linear_forward(comm, o_local, p["o.weight"], p["o.bias"])  # (B, T_r, H)
    return y, (c_attn, c_out)


def sequence_parallel_attention_backward(comm, dy_shard, cache):
    """Backward: all-gather of dy (g-bar backward), reduce-scatter of dx (g backward).

    Returns (dx_shard (B, T_r, H), grads_local) keyed like the local attention params.
    """
    c_attn, c_out = cache
    do_local, dwo, dbo = sequence_parallel_row_linear_backward(comm, dy_shard, c_out)  # (B, T, nh/t*hs)
    dx_partial, grads = qkv_attention_backward(do_local, c_attn)                      # (B, T, H) Partial
    grads.update({"o.weight": dwo, "o.bias": dbo})
    return gather_from_sequence_parallel_region_backward(comm, dx_partial), grads


def sequence_parallel_mlp_forward(comm, x_shard, params_local):
    """fc (column, all-gather in), GeLU on (B, T, F/t), proj (row, reduce-scatter out).

    x_shard (B, T_r, H); params_local fc.weight (H, F/t), fc.bias, proj.weight (F/t, H), proj.bias as in layers.mlp.
    Returns (y_shard (B, T_r, H), cache).
    """
    p = params_local
    a, c1 = sequence_parallel_column_linear_forward(comm, x_shard, p["fc.weight"], p["fc.bias"])  # (B, T, F/t)
    h, cg = gelu_forward(a)                                                                     # (B, T, F/t)
    y, c2 = sequence_parallel_row_linear_forward(comm, h, p["proj.weight"], p["proj.bias"])     # (B, T_r, H)
    return y, (c1, cg, c2)


def sequence_parallel_mlp_backward(comm, dy_shard, cache):
    """Backward of the MLP: one all-gather, one reduce-scatter. Returns (dx_shard, grads_local)."""
    c1, cg, c2 = cache
    dh, dw_proj, db_proj = sequence_parallel_row_linear_backward(comm, dy_shard, c2)  # (B, T, F/t)
    da = gelu_backward(dh, cg)
    dx_shard, dw_fc, db_fc = sequence_parallel_column_linear_backward(comm, da, c1)
    grads = {"fc.weight": dw_fc, "fc.bias": db_fc, "proj.weight": dw_proj, "proj.bias": db_proj}
    return dx_shard, grads


def sequence_parallel_block_forward(comm, x_shard, params_local, config):
    """The block on x_shard (B, T_r, H) Sharded(1): 2 all-gathers + 2 reduce-scatters.

    params_local from layers.block.shard_block_params (the TP block's shards); config with
    n_heads, n_kv_heads. Returns (y_shard (B, T_r, H) Sharded(1), cache).
    """
    p = params_local
    a, c_ln1 = sequence_parallel_layernorm_forward(comm, x_shard, p["ln1.weight"], p["ln1.bias"])
    att, c_att = sequence_parallel_attention_forward(
        comm, a, sub_params(p, "attn."), config.n_heads, config.n_kv_heads)
    h = x_shard + att  # the residual add, on this rank's positions
    m, c_ln2 = sequence_parallel_layernorm_forward(comm, h, p["ln2.weight"], p["ln2.bias"])
    mlp, c_mlp = sequence_parallel_mlp_forward(comm, m, sub_params(p, "mlp."))
    return h + mlp, (c_ln1, c_att, c_ln2, c_mlp)


def sequence_parallel_block_backward(comm, dy_shard, cache):
    """Backward for dy_shard (B, T_r, H): 2 all-gathers + 2 reduce-scatters + 2 LayerNorm all-reduces.

    Returns (dx_shard (B, T_r, H), grads_local) keyed like the local params; the LayerNorm
    and row-bias gradients are whole and identical on every rank.
    """
    c_ln1, c_att, c_ln2, c_mlp = cache
    dm, g_mlp = sequence_parallel_mlp_backward(comm, dy_shard, c_mlp)
    dh_ln, dg2, db2 = sequence_parallel_layernorm_backward(comm, dm, c_ln2)
    dh = dy_shard + dh_ln  # the residual passes dy straight through
    da, g_att = sequence_parallel_attention_backward(comm, dh, c_att)
    dx_ln, dg1, db1 = sequence_parallel_layernorm_backward(comm, da, c_ln1)
    grads = {"ln1.weight": dg1, "ln1.bias": db1, "ln2.weight": dg2, "ln2.bias": db2}
    grads.update({f"attn.{k}": v for k, v in g_att.items()})
    grads.update({f"mlp.{k}": v for k, v in g_mlp.items()})
    return dh + dx_ln, grads
