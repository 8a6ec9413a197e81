"""DeepSeekMoE on t ranks, three ways, each equal to one device (torch autograd, any group).

Torch, not numpy: the router's top-k, the gathers and the index_adds of dispatch and
combine all have gradients autograd already knows, so each layout is its forward alone; the
only hand-written backwards are the collectives' (f, g, and the all-to-all's, which is the
all-to-all run backwards).

(a) ExpertParallelMoE, DeepSeek-V3's layout (64-way EP in training, no TP, report §3.2; EP32
    and EP320 in serving, §3.4).
    Each rank brings its OWN tokens (its data-parallel share) and owns E/t experts. Per layer:
        route locally -> exchange counts -> all-to-all the rows to the experts' ranks (dispatch)
        -> run the local experts -> all-to-all the outputs back (combine) -> weight and sum.
    No token is dropped: the counts travel first, so every receiver sizes its buffer.
    Replicated weights (router, shared experts) see only this rank's tokens: their gradients
    are summed over the ranks (f on the weight: identity forward, all-reduce backward).
(b) ExpertsOnAllTokensMoE, an all-reduce layout: every rank holds ALL tokens (replicated, as
    after TP attention) and E/t experts; it runs its experts on the tokens routed to them,
    shared experts column/row-split; one all-reduce of the partial sums (g).
(c) ExpertTensorParallelMoE (Megatron's ETP): every rank holds a 1/t column/row slice of
    EVERY expert (F/t wide), shared experts split likewise; one all-reduce (g).

In (b) and (c) each rank's router sees only its partial's gradient: x and the router's
weight enter through f, whose backward sums them.

Traffic per rank, forward (H hidden, b bytes per number, N tokens):
    (a) 2 * (pairs sent off-rank) * H b  +  (t-1) * E/t * 8 for the counts
        ~ 2 k (t-1)/t H b per token under balanced routing
    (b), (c) one ring all-reduce of (N, H): ~ 2 (t-1)/t H b per token, whatever k
"""
import numpy as np
import torch
from torch import nn

from tp_from_scratch.collectives import ring_all_reduce_bytes
from tp_from_scratch.nn.collectives import exchange_counts
from tp_from_scratch.nn.mappings import copy_to_tp_region, reduce_from_tp_region, tp_rank, tp_world_size
from tp_from_scratch.sharding import check_divisible

from .arch import shard
from .autograd import all_to_all
from .moe import Experts, GatedFFN, Router, combine, expert_rows, gated_ffn, pairs
from .router import route


def _rows(x):
    return x.reshape(-1, x.shape[-1])  # (B, T, H) -> (N, H)


def dispatch_counts(expert, n_experts, t):
    """counts[d, e]: pairs this rank sends rank d for its e-th local expert, (t, E/t)."""
    return torch.bincount(expert, minlength=n_experts).view(t, n_experts // t)


class _Sharded(nn.Module):
    """What every layout shares: the group, the config, the router (replicated)."""

    def __init__(self, config, group):
        super().__init__()
        self.config, self.group = config, group
        self.t, self.rank = tp_world_size(group), tp_rank(group)
        self.gate = Router(config)

    def route(self, x, weight):
        return route(x, weight, self.gate.e_score_correction_bias, self.config)

    @classmethod
    def from_module(cls, moe, *, group):
        """This rank's share of a single-device DeepSeekMoE, in its dtype: each tensor cut as the
        layout's plan says (arch.PLANS: the router whole; experts by expert or by width; shared
        experts split like an MLP, or whole under expert parallelism). model.parallelize's MOE style
        calls it on each untouched single-device layer of the model."""
        layer = cls(moe.config, group=group).to(moe.gate.weight.dtype)
        layer.load_state_dict({name: shard(name, full, cls.layout, layer.t, layer.rank)
                               for name, full in moe.state_dict().items()})
        return layer


def check_fits(layout, config, t):
    """Refuse, naming the quantity, a layer ``config`` that ``layout`` cannot cut over t ranks:
    whole experts need t | E; split shared experts need t | n_shared F; expert TP needs t | F.
    The one statement of these rules: the layers, the model's check_config and the import use it."""
    if layout in ("expert parallel", "experts on all tokens"):
        check_divisible(config.n_routed_experts, t, "n_routed_experts (for expert parallelism)")
    if layout in ("experts on all tokens", "expert tensor parallel"):
        check_divisible(config.shared_intermediate_size, t, "shared experts' width n_shared*F")
    if layout == "expert tensor parallel":
        check_divisible(config.moe_intermediate_size, t, "moe_intermediate_size F (for expert TP)")


class ExpertParallelMoE(_Sharded):
    """(a) E/t experts per rank, this rank's tokens dispatched and combined by all-to-all.

    (N_r, H) or (B, T, H) of this rank's own tokens -> the same shape.
    """

    layout = "expert parallel"

    def __init__(self, config, *, group):
        super().__init__(config, group)
        check_fits(self.layout, config, self.t)
        self.n_local = config.n_routed_experts // self.t
        self.experts = Experts(self.n_local, config.hidden_size, config.moe_intermediate_size)
        self.shared_experts = GatedFFN(config.hidden_size, config.shared_intermediate_size)
        self.last_counts = None  # (t, E/t) pairs sent per rank and local expert, for the lesson

    def forward(self, x):
        g, flat = self.group, _rows(x)
        weights, experts = self.route(flat, copy_to_tp_region(g, self.gate.weight))
        token, expert, weight = pairs(weights, experts)
        order = torch.argsort(expert, stable=True)  # by expert, hence by the rank that owns it
        token, expert, weight = token[order], expert[order], weight[order]
        counts = dispatch_counts(expert, self.config.n_routed_experts, self.t)  # (t, E/t)
        arriving = exchange_counts(g, counts.cpu().numpy())  # (t, E/t): what each source sends here
        self.last_counts = counts
        send, recv = counts.sum(1).tolist(), arriving.sum(1).tolist()
        received = all_to_all(g, flat[token], send, recv)  # (M_r, H): from each source, by expert
        local_expert = torch.arange(self.n_local).repeat(self.t).repeat_interleave(arriving.reshape(-1))
        local_expert = local_expert.to(flat.device)
        out = expert_rows(received, local_expert, self.experts.gate_up_proj, self.experts.down_proj)
        back = all_to_all(g, out, recv, send)  # (N_r k, H), in the order the rows left
        y = combine(flat.shape[0], token, weight, back) + _replicated_ffn(g, self.shared_experts, flat)
        return y.view(x.shape)


def _replicated_ffn(group, ffn, x):
    """The shared experts on this rank's tokens; their weights pass through f, so each
    gradient is summed over the ranks (each saw only its own tokens)."""
    gate, up, down = (copy_to_tp_region(group, lin.weight) for lin in (ffn.gate_proj, ffn.up_proj, ffn.down_proj))
    return gated_ffn(x, torch.cat([gate, up]), down)


class _SplitShared(_Sharded):
    """(b) and (c): tokens replicated; shared experts column/row-split; one all-reduce."""

    def __init__(self, config, group):
        super().__init__(config, group)
        check_fits(self.layout, config, self.t)
        self.shared_experts = GatedFFN(config.hidden_size, config.shared_intermediate_size // self.t)

    def forward(self, x):
        g = self.group
        flat = copy_to_tp_region(g, _rows(x))  # f: x is used by every rank's partial
        weights, experts = self.route(flat, copy_to_tp_region(g, self.gate.weight))
        token, expert, weight = pairs(weights, experts)
        rows = expert_rows(flat[token], expert, self.experts.gate_up_proj, self.experts.down_proj,
                           first=self.first_expert)
        partial = combine(flat.shape[0], token, weight, rows) + self.shared_experts(flat)
        return reduce_from_tp_region(g, partial).view(x.shape)  # g: the one all-reduce


class ExpertsOnAllTokensMoE(_SplitShared):
    """(b) E/t whole experts per rank, run on the tokens (of all of them) routed to them."""

    layout = "experts on all tokens"

    def __init__(self, config, *, group):
        super().__init__(config, group)
        n_local = config.n_routed_experts // self.t
        self.first_expert = self.rank * n_local
        self.experts = Experts(n_local, config.hidden_size, config.moe_intermediate_size)


class ExpertTensorParallelMoE(_SplitShared):
    """(c) every expert's FFN split: columns [r F/t, (r+1) F/t) of gate and up, rows of down."""

    layout, first_expert = "expert tensor parallel", 0

    def __init__(self, config, *, group):
        super().__init__(config, group)
        self.experts = Experts(config.n_routed_experts, config.hidden_size, config.moe_intermediate_size // self.t)


LAYOUTS = {cls.layout: cls for cls in (ExpertParallelMoE, ExpertsOnAllTokensMoE, ExpertTensorParallelMoE)}


# ---- traffic and balance ----------------------------------------------------------------

def ep_bytes_sent(counts, rank, hidden, itemsize):
    """Bytes rank ``rank`` sends in one EP forward: the rows of its own off-rank pairs
    (dispatch), the outputs it computed for other ranks' pairs (combine: a different number
    unless routing is balanced), and the counts exchange.

    counts: (t, t, E/t) array, counts[q, d, e] = pairs rank q sends rank d for expert e.
    """
    counts = np.asarray(counts)
    t = counts.shape[0]
    # Python integers from here: numpy's int64 would wrap around, silently, for a planner's large counts
    dispatched = int(counts[rank].sum()) - int(counts[rank, rank].sum())
    returned = int(counts[:, rank].sum()) - int(counts[rank, rank].sum())  # rows it computed for others
    return (dispatched + returned) * hidden * itemsize + (t - 1) * counts.shape[2] * 8


def all_reduce_bytes_sent(n_elements, t, rank, itemsize):
    """Bytes the ring all-reduce of n elements sends from ``rank`` (Lesson 2's formula)."""
    return int(ring_all_reduce_bytes(n_elements, itemsize, t, rank))


def tokens_per_rank(experts, n_experts, t):
    """(t,): the (token, expert) pairs each rank's experts receive: the load EP must balance."""
    return torch.bincount(experts.reshape(-1) // (n_experts // t), minlength=t)
