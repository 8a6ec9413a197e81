"""DeepSeekMoE on one device: the reference every parallel layout is checked against.

    y = shared(x) + sum_{j<k} w_j(x) * expert_{e_j(x)}(x)

Every expert (shared ones too) is a SiLU-gated FFN, down(silu(gate x) * up x). The parameters
carry Hugging Face's names and layouts, so a DeepseekV3MoE's state_dict loads as it is:

    gate.weight                 (E, H)       the router's centroids
    gate.e_score_correction_bias (E,)        the selection bias (a buffer: no gradient)
    experts.gate_up_proj        (E, 2F, H)   gate rows [0, F), up rows [F, 2F)
    experts.down_proj           (E, H, F)
    shared_experts.{gate,up}_proj.weight (n_shared F, H), shared_experts.down_proj.weight (H, n_shared F)
"""
import torch
import torch.nn.functional as F
from torch import nn

from .router import route


def gated_ffn(x, gate_up, down):
    """(M, H) -> (M, H): down(silu(gate x) * up x), gate_up (2F, H) stacked gate over up, down (H, F)."""
    gate, up = (x @ gate_up.T).chunk(2, dim=-1)  # (M, F) each
    return (F.silu(gate) * up) @ down.T


def expert_rows(rows, expert_ids, gate_up, down, first=0):
    """Row m of ``rows`` (M, H) through expert expert_ids[m]; rows for an expert outside
    [first, first + len(gate_up)) (held by another rank) come out zero. -> (M, H)

    gate_up (E_local, 2F, H), down (E_local, H, F): the experts this rank holds.
    """
    out = rows.new_zeros(rows.shape)
    for e in range(gate_up.shape[0]):
        # an expert with no rows still runs (on none): its weights then get a zero gradient, as
        # on one device, not None, which an optimizer would skip (AdamW's moments still move)
        mine = (expert_ids == first + e).nonzero().squeeze(1)  # (M_e,)
        out = out.index_copy(0, mine, gated_ffn(rows[mine], gate_up[e], down[e]))
    return out


def pairs(weights, experts):
    """The (token, expert) pairs of a routing, flattened: (token (N k,), expert (N k,), weight (N k,))."""
    N, k = experts.shape
    token = torch.arange(N, device=experts.device).repeat_interleave(k)
    return token, experts.reshape(-1), weights.reshape(-1)


def combine(N, token, weight, rows):
    """(N, H): the weighted sum, per token, of its pairs' expert outputs ``rows`` (N k, H)."""
    return rows.new_zeros((N, rows.shape[1])).index_add(0, token, weight[:, None] * rows)


class Router(nn.Module):
    """The router's parameter and buffer under Hugging Face's names (gate.weight, gate.e_score_correction_bias)."""

    def __init__(self, config):
        super().__init__()
        self.weight = nn.Parameter(torch.empty(config.n_routed_experts, config.hidden_size))
        self.register_buffer("e_score_correction_bias", torch.zeros(config.n_routed_experts))


class Experts(nn.Module):
    """Some routed experts' weights, stacked: (E_here, 2F_here, H) and (E_here, H, F_here)."""

    def __init__(self, n_experts, hidden, width):
        super().__init__()
        self.gate_up_proj = nn.Parameter(torch.empty(n_experts, 2 * width, hidden))
        self.down_proj = nn.Parameter(torch.empty(n_experts, hidden, width))


def _identity(x):
    return x


class GatedFFN(nn.Module):
    """A SiLU-gated FFN of width ``width`` (a dense layer's FFN, the shared experts, or a rank's
    column shard of them). ``copy_in``: where gate and up start reading x, the identity here;
    for a dense layer's FFN tensor parallelism puts ONE f there (model.parallelize, the plan's
    COPY_IN), gate and up column-parallel, down row-parallel (its g)."""

    def __init__(self, hidden, width):
        super().__init__()
        self.copy_in = _identity  # a plain function, not a module
        self.gate_proj = nn.Linear(hidden, width, bias=False)
        self.up_proj = nn.Linear(hidden, width, bias=False)
        self.down_proj = nn.Linear(width, hidden, bias=False)

    def forward(self, x):
        x = self.copy_in(x)
        return self.down_proj(F.silu(self.gate_proj(x)) * self.up_proj(x))


class DeepSeekMoE(nn.Module):
    """The whole layer on one device: (B, T, H) -> (B, T, H)."""

    def __init__(self, config):
        super().__init__()
        self.config = config
        self.gate = Router(config)
        self.experts = Experts(config.n_routed_experts, config.hidden_size, config.moe_intermediate_size)
        self.shared_experts = GatedFFN(config.hidden_size, config.shared_intermediate_size)

    def forward(self, x):
        flat = x.reshape(-1, x.shape[-1])  # (N, H), N = B T
        weights, experts = route(flat, self.gate.weight, self.gate.e_score_correction_bias, self.config)
        token, expert, weight = pairs(weights, experts)
        rows = expert_rows(flat[token], expert, self.experts.gate_up_proj, self.experts.down_proj)
        routed = combine(flat.shape[0], token, weight, rows)
        return (routed + self.shared_experts(flat)).view(x.shape)
