"""DeepSeek-V3's router (technical report, eqs. 12-16; "noaux_tc" in its code).

For a token x (H,) and E experts with centroids W_g (E, H):

    s      = sigmoid(W_g x)                        affinity of each expert, (E,)
    choice = s + b                                 b: a bias for SELECTION only (auxiliary-loss-
                                                   free balancing: raised for idle experts between steps)
    groups: the E experts in n_group groups; a group's score is the sum of its top-2 choices;
            keep the topk_group best groups, mask the rest out
    experts = top-k of choice among the kept experts
    weights = s[experts] (never s + b), / their sum if norm_topk_prob, * routed_scaling_factor

Routing is discrete: two experts whose choice scores differ by less than the roundoff of the
computation may swap between two computations that are equal in exact arithmetic (t = 1 and
t = 4 add in different orders). ``routing_margin`` measures how far the data is from such a
tie; the tests check it before they compare.
"""
import torch

from tp_from_scratch.compare import TOLERANCE


def _masked_choice(x, weight, bias, config):
    """(scores (N, E), choice (N, E) with the experts of dropped groups at -inf, group_scores)."""
    scores = torch.sigmoid(x @ weight.T)  # (N, E)
    choice = scores + bias
    N, E = choice.shape
    G = config.n_group
    group_scores = choice.view(N, G, E // G).topk(2, dim=-1).values.sum(-1)  # (N, G)
    kept = group_scores.topk(config.topk_group, dim=-1).indices  # (N, topk_group)
    keep = torch.zeros(N, G, dtype=torch.bool, device=x.device).scatter(1, kept, True)
    keep = keep.repeat_interleave(E // G, dim=1)  # (N, E): an expert is kept with its group
    return scores, choice.masked_fill(~keep, float("-inf")), group_scores


def route(x, weight, bias, config):
    """x (N, H) -> (weights (N, k), experts (N, k)): each token's k experts and their weights.

    weight (E, H): the router's centroids; bias (E,): the selection bias (no gradient).
    Differentiable in x and weight through the weights; the choice itself is discrete.
    """
    scores, choice, _ = _masked_choice(x, weight, bias, config)
    experts = choice.topk(config.num_experts_per_tok, dim=-1).indices  # (N, k)
    weights = scores.gather(1, experts)  # the bias chose; it does not weigh
    if config.norm_topk_prob:
        weights = weights / (weights.sum(-1, keepdim=True) + 1e-20)
    return weights * config.routed_scaling_factor, experts


def routing_margin(x, weight, bias, config):
    """The smallest gap, over tokens, between a chosen and a rejected candidate: the k-th and
    (k+1)-th choice score among kept experts, and the topk_group-th and next group score.

    A computation whose error is below this margin chooses the same experts; a margin near
    roundoff means a near-tie that a different order of additions may break differently.
    """
    with torch.no_grad():
        _, choice, group_scores = _masked_choice(x, weight, bias, config)
        gaps = []
        k, kg = config.num_experts_per_tok, config.topk_group
        if k < choice.shape[1]:
            top = choice.topk(k + 1, dim=-1).values
            gaps.append(top[:, k - 1] - top[:, k])  # -inf next: infinitely far, no tie
        if kg < config.n_group:
            top = group_scores.topk(kg + 1, dim=-1).values
            gaps.append(top[:, kg - 1] - top[:, kg])
        if not gaps or x.shape[0] == 0:
            return float("inf")
        return float(torch.cat(gaps).min())


def check_routing_margin(margin, dtype, times=100):
    """Raise a ValueError if ``margin`` is within ``times`` the tolerance policy's bound of a tie.

    Two computations equal under the policy (compare.TOLERANCE: 1e-12 relative in float64,
    1e-5 in float32) may hand the router inputs that differ by that much; scores are
    sigmoids (at most 1, plus the bias), so a margin a hundred times the bound cannot be
    crossed by roundoff, and a different choice is then a bug, not a tie.
    """
    bound = times * TOLERANCE[str(dtype).replace("torch.", "")]
    if margin < bound:
        raise ValueError(f"routing near-tie: the smallest gap between a chosen and a rejected "
                         f"expert is {margin:.3g}, under {times} x the {dtype} tolerance "
                         f"({bound:.3g}); a different summation order may choose differently")
    return margin
