"""DeepSeek-V3 on a single device: the reference every parallel layout is checked against, and
the model deepseek.model.parallelize turns into this rank's by the layout's plan (arch.PLANS).

Written like gpt/model.py: nn.Linear, nn.Embedding, MLA with all its heads (mla.py), the dense
layers' GatedFFN and DeepSeekMoE (moe.py); nothing of tensor parallelism. Its input points are
plain functions, the identity here, that parallelize fills: each MLA's and dense FFN's
``copy_in`` (f), and the model's ``reduce_replicated`` (the data-parallel sum of the replicated
gradients under expert parallelism). Parameter names are transformers' (model.hf_name).
"""
import torch
from torch import nn

from .config import MoEConfig
from .mla import MLA, RMSNorm
from .moe import DeepSeekMoE, GatedFFN


def _identity(x):
    return x


class DecoderLayer(nn.Module):
    def __init__(self, config, index, moe):
        super().__init__()
        self.input_layernorm = RMSNorm(config.hidden_size, config.rms_norm_eps)
        self.self_attn = MLA(config, index)
        self.post_attention_layernorm = RMSNorm(config.hidden_size, config.rms_norm_eps)
        if index < config.first_k_dense_replace:
            self.mlp = GatedFFN(config.hidden_size, config.intermediate_size)
        else:
            self.mlp = DeepSeekMoE(moe)

    def forward(self, x, positions, cache=None):
        x = x + self.self_attn(self.input_layernorm(x), positions, cache)
        return x + self.mlp(self.post_attention_layernorm(x))


def pad_token_id(config):
    """The padding row of the embedding (transformers' padding_idx), or None."""
    return getattr(config, "pad_token_id", None)


def tied(config):
    """Does the LM head reuse the embedding (transformers' tie_word_embeddings, default False)?"""
    return bool(getattr(config, "tie_word_embeddings", False))


class DeepseekV3(nn.Module):
    """(B, T) token ids -> (B, T, V) logits on one device; after parallelize, replicated on
    every rank of ``group`` (under expert parallelism, of this rank's own tokens)."""

    group, layout = None, None   # set by parallelize

    def __init__(self, config):
        super().__init__()
        moe = MoEConfig.from_hf(config)  # the MoE layers' fields (model.check_config refuses what it cannot map)
        self.config = config
        self.reduce_replicated = _identity  # a plain function: parallelize sets the sum over the ranks
        # pad_token_id's row gets no gradient, as in transformers (nn.Embedding's padding_idx)
        self.embed_tokens = nn.Embedding(config.vocab_size, config.hidden_size, padding_idx=pad_token_id(config))
        self.layers = nn.ModuleList(DecoderLayer(config, i, moe) for i in range(config.num_hidden_layers))
        self.norm = RMSNorm(config.hidden_size, config.rms_norm_eps)
        self.lm_head = nn.Linear(config.hidden_size, config.vocab_size, bias=False)
        if tied(config):   # tie_word_embeddings: the head IS the embedding (one parameter, one gradient)
            self.lm_head.weight = self.embed_tokens.weight

    def forward(self, ids, cache=None):
        past = cache.length() if cache is not None else 0
        positions = torch.arange(past, past + ids.shape[1])
        x = self.embed_tokens(ids)  # (B, T, H)
        for layer in self.layers:
            x = layer(x, positions, cache)
        return self.lm_head(self.norm(x))

    def replicated_parameters(self):
        """Under expert parallelism, the parameters every rank holds whole and uses on its own
        tokens only (all but the MoE layers', whose router and shared experts sum their own)."""
        if self.layout != "expert parallel":
            return []
        return [p for name, p in self.named_parameters() if not in_moe_layer(name, self.config)]

    def sum_replicated_gradients(self):
        """Data parallelism's all-reduce after backward: each replicated gradient summed over the ranks."""
        for p in self.replicated_parameters():
            p.grad = self.reduce_replicated(p.grad)


def in_moe_layer(name, config):
    """Is parameter ``name`` (layers.i.mlp...) one of a MoE layer's (not a dense layer's)?"""
    return ".mlp." in name and int(name.split(".")[1]) >= config.first_k_dense_replace


