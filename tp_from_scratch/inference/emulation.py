"""The t-rank inference GPT on ONE device: the full weights, the rank partition explicit.

SPD and the quantized all-reduces change the function the model computes, and the change
depends on t: it acts on each rank's partial sum. So their single-device reference must hold
every rank's piece: for rank r, its heads' rows of q, k, v (its KV head, replicated when
nkv < t), its columns of o, its slice of the MLP, cut by gpt.model.shard_tensor exactly as the
TP model is cut. Per block, with P_r = rank r's partial of a row-parallel output:

    ordinary block    h = x + reduce([Y_r]) + b_o;   out = h + reduce([Z_r(ln2(h))]) + b_mlp
    SPD block         out = x + reduce([Y_r + Z_r(ln2(x + Y_r + b_o))]) + b_o + b_mlp

``reduce`` turns the list of t partials into what the ranks receive: their sum in rank order
(plain), or quantized.reference_reduce(bits, group_size, scheme) (the same QDQ arithmetic as the
collectives, so in float64 the two agree bit for bit). With no SPD block and the plain sum this
is the ordinary GPT, up to the order of the sums.
"""
import torch
from torch.nn import functional as F

from tp_from_scratch.gpt.model import GELUS, causal_self_attention, embed, rope_tables
from tp_from_scratch.gpt.parallelize import shard_tensor


def plain_sum(partials):
    """sum_r P_r in rank order: what an exact all-reduce delivers (up to its summation order)."""
    return sum(partials[1:], partials[0])


def _pieces(block, i, t, r, config):
    """{module: (weight, bias)} of rank r's shard of block i (copies, as the TP ranks hold them)."""
    out = {}
    for name, module in block.named_modules():
        if isinstance(module, torch.nn.Linear):
            def cut(leaf, p):
                return None if p is None else shard_tensor(f"blocks.{i}.{name}.{leaf}", p, t, r, config)
            out[name] = (cut("weight", module.weight), cut("bias", module.bias))
    return out


def _linear(pieces, name, x, bias=True):
    w, b = pieces[name]
    return F.linear(x, w, b if bias else None)


def _attention_partial(pieces, a, config, start=0):
    """Y_r: rank r's heads of attention on a = ln1(x) (B, T, H), through its columns of W_o."""
    q, k, v = (_linear(pieces, f"attn.{n}", a) for n in "qkv")
    rope = None
    if config.position == "rope":
        positions = torch.arange(start, start + a.shape[1])
        rope = rope_tables(positions, config.head_size, config.rope_theta, a.dtype)
    y = causal_self_attention(q, k, v, config.head_size, rope, None, config.causal)
    return _linear(pieces, "attn.o", y, bias=False)                          # (B, T, H) Partial


def _mlp_partial(pieces, m, config):
    """Z_r: rank r's slice of the MLP on m = ln2(h) (B, T, H)."""
    if config.mlp == "swiglu":
        hidden = F.silu(_linear(pieces, "mlp.gate", m)) * _linear(pieces, "mlp.up", m)  # (B, T, F/t)
        return _linear(pieces, "mlp.down", hidden, bias=False)
    hidden = F.gelu(_linear(pieces, "mlp.fc", m), approximate=GELUS[config.gelu])
    return _linear(pieces, "mlp.proj", hidden, bias=False)


def _bias(block, name):
    return block.get_submodule(name).bias


def partitioned_block(block, i, x, t, config, spd=False, reduce=plain_sum):
    """Block i of the t-rank model on x (B, T, H), every rank's share computed here."""
    ranks = [_pieces(block, i, t, r, config) for r in range(t)]
    mlp_row = "mlp.down" if config.mlp == "swiglu" else "mlp.proj"
    b_o, b_mlp = _bias(block, "attn.o"), _bias(block, mlp_row)

    def plus(y, b):
        return y if b is None else y + b

    a = block.ln1(x)
    ys = [_attention_partial(p, a, config) for p in ranks]
    if spd:  # rank r's MLP sees x + Y_r only; one reduce carries Y_r + Z_r
        zs = [_mlp_partial(p, block.ln2(plus(x + y, b_o)), config) for p, y in zip(ranks, ys)]
        return plus(plus(x + reduce([y + z for y, z in zip(ys, zs)]), b_o), b_mlp)
    h = plus(x + reduce(ys), b_o)
    m = block.ln2(h)
    return plus(h + reduce([_mlp_partial(p, m, config) for p in ranks]), b_mlp)


@torch.no_grad()
def partitioned_forward(gpt, idx, t, spd_blocks=(), reduce=plain_sum):
    """Logits (B, T, V) of the t-rank inference model, on one device, from a single-device GPT.

    ``spd_blocks``: the indices of the blocks whose attention all-reduce is dropped. ``reduce``:
    plain_sum, or quantized.reference_reduce(...) for every row-parallel output (the
    embedding's all-reduce stays exact: one rank holds each token's row). At t = 1, or with
    no SPD block and plain_sum, this is the single-device GPT.
    """
    config = gpt.config
    x = embed(gpt, idx)                                                    # (B, T, H)
    for i, block in enumerate(gpt.blocks):
        x = partitioned_block(block, i, x, t, config, i in spd_blocks, reduce)
    return F.linear(gpt.ln_f(x), gpt.head_weight())                       # (B, T, V)
