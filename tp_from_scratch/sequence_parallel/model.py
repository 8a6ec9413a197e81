"""The sequence-parallel GPT: the tensor-parallel GPT's own modules, run with a different forward.

Sequence parallelism changes no weight. ``SequenceParallelGPT`` takes the TP GPT (gpt.parallelize) and
keeps its modules (the same ``gpt.model.Block`` objects, the same parameter names and shards,
so the same checkpoint); only where the activations live between the layers differs:

    idx (B, T) --wte (vocab-parallel, all-reduce) + wpe--> (B, T, H) Replicated
      --scatter(T)--> x (B, T_r, H) Sharded(1)                   T_r: this rank's positions
    per block:
      ln1 on (B, T_r, H) --g: all-gather(T)--> q, k, v (B, T, heads/t*hs)   Sharded heads
      attention --o, g-bar: reduce-scatter(T)--> + x                         Sharded(1)
      ln2 --g--> fc (B, T, F/t) --GeLU--> proj --g-bar--> + x                Sharded(1)
    ln_f on (B, T_r, H) --g--> (B, T, H) --LM head--> logits (B, T, V/t) Sharded(vocab)

The same holds for the three architectures of gpt/model.py: RMSNorm's weight is Partial like
LayerNorm's, RoPE turns each head by its position after the all-gather (positions 0 .. T-1,
as in TP), and SwiGLU's gate and up share one all-gather like q, k and v.

Per block: 2 all-gathers + 2 reduce-scatters forward where the TP model makes 2 all-reduces;
backward the same, plus one all-gather per column group (the gathered input is not kept,
see nn.ColumnLinearsFromSequence) and the all-reduces of the LayerNorm and row-bias
gradients, which are Partial under SP. Megatron-LM turns the embedding's all-reduce into a
reduce-scatter; here it stays an all-reduce followed by a local split, to reuse the TP
embedding unchanged.
"""
import torch
from torch import nn
from torch.nn import functional as F

from tp_from_scratch.gpt.model import causal_self_attention, embed, rope_tables
from tp_from_scratch.gpt.parallelize import gpt_to_tp
from tp_from_scratch.nn import vocab_parallel_cross_entropy
from tp_from_scratch.nn.mappings import tp_world_size
from tp_from_scratch.sequence_parallel.nn import (
    column_linears_from_sequence, gather_from_sequence_parallel_region, row_linear_to_sequence,
    scatter_to_sequence_parallel_region, sequence_parallel_layer_norm)
from tp_from_scratch.sharding import shard_sizes


class RecomputedAttention(torch.autograd.Function):
    """Selective activation recomputation (Korthikanti et al. §5): the attention core
    softmax(q k^T / sqrt(hs) + mask) v keeps only q, k, v for backward and runs again there.

    The softmax output (B, nh/t, T, T), the repeated k and v and the causal mask are never
    kept: the T^2 terms, the largest at long sequences, leave activation memory for one
    extra attention forward per backward.
    """

    @staticmethod
    def forward(ctx, head_size, rope, causal, q, k, v):
        ctx.head_size, ctx.rope, ctx.causal = head_size, rope, causal  # rope: (cos, sin) tables, not learned
        ctx.save_for_backward(q, k, v)
        return causal_self_attention(q, k, v, head_size, rope, causal=causal)  # autograd records nothing here

    @staticmethod
    def backward(ctx, dy):
        q, k, v = (x.detach().requires_grad_() for x in ctx.saved_tensors)
        with torch.enable_grad():  # the forward again, this time recorded, then its backward
            y = causal_self_attention(q, k, v, ctx.head_size, ctx.rope, causal=ctx.causal)
        return (None, None, None, *torch.autograd.grad(y, (q, k, v), dy))


class SequenceParallelBlock(nn.Module):
    """A gpt.model.Block's own modules (ln1, attn, ln2, mlp: same names, same shards), run on
    this rank's positions x (B, T_r, H) with the sequence-parallel mappings."""

    def __init__(self, group, block, save_gathered=False, recompute_attention=False):
        super().__init__()
        self.group, self.save_gathered, self.recompute_attention = group, save_gathered, recompute_attention
        self.ln1, self.attn, self.ln2, self.mlp = block.ln1, block.attn, block.ln2, block.mlp

    def forward(self, x, sizes):
        """x (B, T_r, H) -> (B, T_r, H); sizes: every rank's T_r."""
        group, attn, mlp, keep = self.group, self.attn, self.mlp, self.save_gathered
        a = sequence_parallel_layer_norm(group, x, self.ln1)                   # (B, T_r, H)
        q, k, v = column_linears_from_sequence(group, a, (attn.q, attn.k, attn.v), sizes, keep)
        rope = None                                                            # (B, T, heads/t*hs)
        if attn.rope:  # attention sees every position after the gather: positions 0 .. T-1
            positions = torch.arange(sum(sizes), device=x.device)
            rope = rope_tables(positions, attn.head_size, attn.rope_theta, x.dtype)
        causal = getattr(attn, "causal", True)
        if self.recompute_attention:
            y = RecomputedAttention.apply(attn.head_size, rope, causal, q, k, v)  # (B, T, nh/t*hs)
        else:
            y = causal_self_attention(q, k, v, attn.head_size, rope, causal=causal)
        x = x + row_linear_to_sequence(group, y, attn.o)                        # (B, T_r, H)
        m = sequence_parallel_layer_norm(group, x, self.ln2)
        if mlp.swiglu:  # gate and up read one gathered input
            gate, up = column_linears_from_sequence(group, m, (mlp.gate, mlp.up), sizes, keep)
            return x + row_linear_to_sequence(group, F.silu(gate) * up, mlp.down)
        (h,) = column_linears_from_sequence(group, m, (mlp.fc,), sizes, keep)  # (B, T, F/t)
        h = F.gelu(h, approximate=mlp.approximate)
        return x + row_linear_to_sequence(group, h, mlp.proj)                   # (B, T_r, H)


class SequenceParallelGPT(nn.Module):
    """The TP GPT (gpt_to_tp's) run sequence-parallel: forward(idx, targets) -> (local logits, loss).

    Holds the TP model's modules under the same names (``state_dict`` is the TP one). The loss
    is the full mean cross-entropy, identical on every rank. save_gathered: keep the
    all-gathered inputs of the column layers for backward instead of gathering them again.
    recompute_attention: selective recomputation of the attention core (RecomputedAttention).
    """

    def __init__(self, tp_model, save_gathered=False, recompute_attention=False):
        super().__init__()
        self.config, self.group, self.save_gathered = tp_model.config, tp_model.group, save_gathered
        # registered in the TP model's order, so the state dict lists the same names in the same order
        self.wte = tp_model.wte
        if self.config.position == "learned":
            self.wpe = tp_model.wpe
        self.blocks = nn.ModuleList(SequenceParallelBlock(self.group, b, save_gathered, recompute_attention)
                                    for b in tp_model.blocks)
        self.ln_f = tp_model.ln_f
        if not self.config.tie_embeddings:
            self.lm_head = tp_model.lm_head

    def head_weight(self):
        return self.wte.weight if self.config.tie_embeddings else self.lm_head.weight  # (V/t, H)

    def forward(self, idx, targets=None):
        group, T = self.group, idx.shape[1]
        sizes = shard_sizes(T, tp_world_size(group))
        x = embed(self, idx)                                               # (B, T, H) Replicated
        x = scatter_to_sequence_parallel_region(group, x)                 # (B, T_r, H)
        for block in self.blocks:
            x = block(x, sizes)
        # g: every position for the head; its backward reduce-scatters the Partial grads of the
        # vocab shards (the job of f in the TP model)
        h = gather_from_sequence_parallel_region(group, sequence_parallel_layer_norm(group, x, self.ln_f), sizes)
        logits = F.linear(h, self.head_weight())                          # (B, T, V/t)
        if targets is None:
            return logits, None
        loss = vocab_parallel_cross_entropy(group, logits.flatten(0, 1), targets.flatten(),
                                            vocab_start=self.wte.vocab_start)
        return logits, loss


def gpt_to_sp(group, model_or_state_dict, config=None, save_gathered=False, recompute_attention=False):
    """A SequenceParallelGPT holding this rank's shard of a single-device GPT (or its state dict)."""
    return SequenceParallelGPT(gpt_to_tp(group, model_or_state_dict, config), save_gathered,
                               recompute_attention)
