"""The TP-invariant GPT: Lesson 6's TP GPT with every column and row layer swapped for Lesson 13's
invariant one, the shared f removed, and the LM head and the loss made invariant.

    invariant_tp_gpt(group, gpt, leaves)   this rank's model; forward(idx, targets, cache) ->
                                           (local logits (B, T, V/t), loss), the same bits at
                                           every t that divides ``leaves`` (cache: gpt.generate's
                                           KVCache, as the GPT's)

It is built from gpt_to_tp's model (the plan, its state dict, its checkpoints: unchanged) by
swapping each parallel linear for its invariant twin (numerics.INVARIANT_STYLES says which) and
replacing the forward's head and loss; check_invariant refuses first, by name, what the fixed
tree cannot serve. Also a condition on the batch (numerics/layers.py): B*T a multiple of the
element-wise loop's step (32 float32 covers AVX2 and AVX512) keeps the activations t-invariant.
"""
import types

from tp_from_scratch.gpt.model import embed
from tp_from_scratch.gpt.parallelize import gpt_to_tp
from tp_from_scratch.nn import ColumnParallelLinear, RowParallelLinear
from tp_from_scratch.nn.mappings import tp_world_size
from tp_from_scratch.numerics.cross_entropy import invariant_vocab_parallel_cross_entropy
from tp_from_scratch.numerics.layers import (InvariantColumnParallelLinear, InvariantRowParallelLinear,
                                             check_invariant, invariant_lm_head)
from tp_from_scratch.numerics.tree import DEFAULT_LEAVES


def invariant_tp_gpt(group, gpt, leaves=DEFAULT_LEAVES):
    """This rank's TP-invariant GPT, from the single-device ``gpt``: forward(idx, targets) ->
    (local logits (B, T, V/t), loss), the same bits at every t that divides ``leaves``."""
    check_invariant(gpt.config, tp_world_size(group), leaves)
    model = gpt_to_tp(group, gpt)
    for name, module in list(model.named_modules()):
        if isinstance(module, (ColumnParallelLinear, RowParallelLinear)):
            parent, _, child = name.rpartition(".")
            kind = InvariantColumnParallelLinear if isinstance(module, ColumnParallelLinear) else InvariantRowParallelLinear
            extra = {"replicas": module.replicas} if kind is InvariantColumnParallelLinear else {}
            swap = kind(module.in_features, module.out_features, module.bias is not None, group=group,
                        leaves=leaves, init=False, dtype=module.weight.dtype, **extra)
            swap.load_state_dict(module.state_dict())
            setattr(model.get_submodule(parent), child, swap)
        if hasattr(module, "copy_in"):
            module.copy_in = lambda x: x  # each invariant column layer sums its own dX over the tree

    def forward(self, idx, targets=None, cache=None):           # cache: generate's KVCache
        x = embed(self, idx, cache)                                 # (B, T, H)
        for i, block in enumerate(self.blocks):
            x = block(x, None if cache is None else cache.layer(i))
        logits = invariant_lm_head(self.group, self.ln_f(x), self.head_weight(), self.config.vocab_size, leaves)
        if targets is None:
            return logits, None
        return logits, invariant_vocab_parallel_cross_entropy(self.group, logits.flatten(0, 1), targets.flatten(),
                                                              vocab_start=self.wte.vocab_start, leaves=leaves)

    model.forward = types.MethodType(forward, model)
    return model
