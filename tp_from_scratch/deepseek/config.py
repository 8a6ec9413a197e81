"""MoEConfig: the numbers of a DeepSeekMoE layer, read from a Hugging Face DeepseekV3 config.

The course implements DeepSeek-V3's routing only ("noaux_tc": sigmoid scores, a bias used for
selection alone, group-limited top-k) and the SiLU-gated experts; a config asking for anything
else is refused by name before any weight is built.
"""
from dataclasses import dataclass


@dataclass(frozen=True)
class MoEConfig:
    """hidden H, expert FFN width F (moe_intermediate_size), E routed experts, k per token,
    E split into n_group groups of which topk_group are kept, and n_shared shared experts."""
    hidden_size: int
    moe_intermediate_size: int
    n_routed_experts: int
    num_experts_per_tok: int
    n_group: int = 1
    topk_group: int = 1
    norm_topk_prob: bool = True
    routed_scaling_factor: float = 1.0
    n_shared_experts: int = 1

    def __post_init__(self):
        E, k = self.n_routed_experts, self.num_experts_per_tok
        if E % self.n_group:
            raise ValueError(f"n_routed_experts={E} is not divisible by n_group={self.n_group}")
        if E // self.n_group < 2:
            raise ValueError(f"each of the n_group={self.n_group} groups needs at least 2 experts "
                             f"(a group's score is its top-2 sum), got {E // self.n_group}")
        if not 1 <= self.topk_group <= self.n_group:
            raise ValueError(f"topk_group={self.topk_group} must be between 1 and n_group={self.n_group}")
        if not 1 <= k <= self.topk_group * (E // self.n_group):
            raise ValueError(f"num_experts_per_tok={k} must be between 1 and the experts of the "
                             f"kept groups ({self.topk_group * (E // self.n_group)})")

    @property
    def shared_intermediate_size(self):
        """The shared experts run as one FFN of n_shared * F."""
        return self.n_shared_experts * self.moe_intermediate_size

    @classmethod
    def from_hf(cls, config):
        """The MoEConfig of a transformers DeepseekV3Config, or a ValueError naming what the
        course cannot map (another routing method or scoring function, another activation)."""
        method = getattr(config, "topk_method", "noaux_tc")
        if method != "noaux_tc":
            raise ValueError(f"topk_method={method!r} is not supported: the course implements "
                             "DeepSeek-V3's 'noaux_tc' routing only")
        scoring = getattr(config, "scoring_func", "sigmoid")
        if scoring != "sigmoid":
            raise ValueError(f"scoring_func={scoring!r} is not supported: DeepSeek-V3 scores with 'sigmoid'")
        if config.hidden_act != "silu":
            raise ValueError(f"hidden_act={config.hidden_act!r} is not supported: the experts are SiLU-gated")
        return cls(config.hidden_size, config.moe_intermediate_size, config.n_routed_experts,
                   config.num_experts_per_tok, config.n_group, config.topk_group,
                   bool(config.norm_topk_prob), float(config.routed_scaling_factor),
                   config.n_shared_experts)
