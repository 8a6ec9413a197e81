"""torchtitan's Llama 3 with its own TP plan, as an entry point of `verify model` (CPU/gloo).

    .venv/bin/python -m tp_from_scratch.verify model --entry examples/torchtitan_llama.py:llama --t 2,3of3,2of4

torchtitan is not in requirements.txt (0.3.0 brings about 60 packages: datasets, wandb,
tensorboard, tyro, spmd_types, ...); install it and triton beside torch 2.13.0 first:
.venv/bin/python -m pip install torchtitan==0.3.0 triton. Three things make its Llama run on a CPU:

    * torchtitan picks its device once, at import (torchtitan.tools.utils.device_type): "cuda"
      when it finds no accelerator; its ParallelDims builds the mesh on that device, so it is
      set to "cpu" here;
    * its MoE token dispatcher, which the dense Llama imports too, imports triton at module level;
    * its language-model attention backends are flex (no backward on CPU: "FlexAttention does
      not support backward on CPU"), flex_flash (Hopper or Blackwell) and varlen (flash
      kernels: CUDA); its ScaledDotProductAttention, which it keeps for Flux, is built here
      directly (causal, every position of one document).

The plan is torchtitan's (set_llama3_sharding_config, applied by Module.parallelize) with the
"partial_dtensor" backend: DTensors on the TP axis, so its logits are Shard(-1) DTensors and
verify brings every record to its full tensor. The TP group is torchtitan's own: ParallelDims
lays a world of W processes out as W / t data-parallel replicas of consecutive TP groups of t
(the mesh verify hands in spans the same ranks).
"""
import copy

import torch
import torch.distributed as dist


def _config(dim, heads, kv_heads, ffn, vocab, layers):
    import torchtitan.models.llama3 as llama3
    from torchtitan.models.common import ComplexRoPE, Embedding, Linear, RMSNorm
    from torchtitan.models.common.attention import ScaledDotProductAttention
    from torchtitan.models.llama3.sharding import set_llama3_sharding_config

    sdpa = llama3.get_attention_config
    llama3.get_attention_config = lambda backend: ScaledDotProductAttention.Config()
    try:
        blocks = llama3._build_llama3_layers(
            fuse_qkv=True, n_layers=layers, dim=dim, n_heads=heads, n_kv_heads=kv_heads, hidden_dim=ffn,
            rope=ComplexRoPE.Config(dim=dim // heads, max_seq_len=64, theta=10000.0, scaling="none"),
            attn_backend="sdpa")
    finally:
        llama3.get_attention_config = sdpa
    config = llama3.Llama3Model.Config(
        dim=dim, vocab_size=vocab,
        tok_embeddings=Embedding.Config(num_embeddings=vocab, embedding_dim=dim, param_init=llama3._EMBEDDING_INIT),
        norm=RMSNorm.Config(normalized_shape=dim, param_init=llama3._NORM_INIT),
        lm_head=Linear.Config(in_features=dim, out_features=vocab, param_init=llama3._output_linear_init(dim)),
        layers=blocks)
    set_llama3_sharding_config(config, enable_sp=False)
    return config


def llama(mesh, dtype, dim=64, heads=4, kv_heads=2, ffn=128, vocab=128, layers=2, seed=0):
    """verify model's entry point: torchtitan's Llama 3 and its TP self, the same random weights.
    Needs torchtitan (and triton) importable; t must divide heads, kv_heads, ffn and vocab."""
    import torchtitan.distributed.parallel_dims as parallel_dims
    from torchtitan.distributed.parallel_dims import ParallelDims

    from tp_from_scratch.verify.models import randomize
    parallel_dims.device_type = "cpu"
    torch.manual_seed(seed)
    reference = _config(dim, heads, kv_heads, ffn, vocab, layers).build()
    reference.init_states(buffer_device=torch.device("cpu"))
    for p in reference.parameters():     # the RoPE table stays complex: only the parameters change dtype
        p.data = p.data.to(dtype)
    randomize(reference, seed)
    parallel = copy.deepcopy(reference)
    t, world = mesh.size(), dist.get_world_size()
    dims = ParallelDims(dp_replicate=world // t, dp_shard=1, cp=1, tp=t, pp=1, ep=1, world_size=world,
                        spmd_backend="partial_dtensor")
    dims.build_mesh()
    parallel.parallelize(dims)
    return dict(reference=reference.eval(), parallel=parallel.eval(), layers=layers, vocab_size=vocab)
