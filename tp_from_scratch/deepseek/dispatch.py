"""Expert parallelism's dispatch and combine in numpy, on any Comm: Exercise 12's reference.

The same steps as ExpertParallelMoE's forward (expert_parallel.py, in torch with autograd),
here on plain arrays and the from-scratch all-to-all, with a simple router (no groups) so
that each step stands alone:

    dispatch(comm, x, scores, bias, k, n_experts) -> (rows, local_expert, plan)
        choose each token's k experts by scores + bias (the bias selects, never weighs),
        sort the (token, expert) pairs by expert, hence by owning rank (E/t experts each),
        exchange the counts, then all_to_all_v the rows: from each source rank in order,
        its pairs for this rank's experts, by expert
    combine(comm, outputs, scores, plan) -> y
        all_to_all_v the expert outputs back (the counts swapped), and sum each token's k
        outputs weighted by its chosen scores, normalised to sum to one (scores alone)
"""
from dataclasses import dataclass

import numpy as np

from tp_from_scratch.collectives import all_to_all_v, exchange_counts
from tp_from_scratch.sharding import check_divisible


@dataclass
class DispatchPlan:
    """What combine needs: each token's experts (N, k), the pairs' order when sent (N k,),
    and the rows sent to / received from each rank (t,)."""
    experts: np.ndarray
    order: np.ndarray
    send_counts: np.ndarray
    recv_counts: np.ndarray


def choose_experts(scores, bias, k):
    """(N, k) expert ids: the k largest scores + bias of each token (ties to the lower id)."""
    choice = scores + bias
    return np.argsort(-choice, axis=1, kind="stable")[:, :k]


def dispatch(comm, x, scores, bias, k, n_experts):
    """This rank's tokens x (N, H) to the ranks owning their experts.

    scores (N, E): router affinities; bias (E,): the selection bias. Returns (rows (M, H),
    local_expert (M,) in [0, E/t), plan). x, scores and bias are not modified.
    """
    t, r = comm.world_size, comm.rank
    check_divisible(n_experts, t, "n_experts")
    experts = choose_experts(scores, bias, k)  # (N, k)
    pair_expert = experts.reshape(-1)  # (N k,): token n's j-th pair at n k + j
    order = np.argsort(pair_expert, kind="stable")  # by expert, hence by owning rank
    per_expert = np.bincount(pair_expert, minlength=n_experts).reshape(t, n_experts // t)
    arriving = exchange_counts(comm, per_expert)  # (t, E/t): what each source sends here, by expert
    send_counts, recv_counts = per_expert.sum(1), arriving.sum(1)
    rows = all_to_all_v(comm, x[order // k], send_counts, recv_counts)
    local_expert = np.repeat(np.tile(np.arange(n_experts // t), t), arriving.reshape(-1))
    return rows, local_expert, DispatchPlan(experts, order, send_counts, recv_counts)


def combine(comm, outputs, scores, plan):
    """The expert outputs (M, H), in the order dispatch's rows arrived, back to their tokens:
    y (N, H) = sum_j w_nj * output of pair (n, j), w = chosen scores / their sum."""
    back = all_to_all_v(comm, outputs, plan.recv_counts, plan.send_counts)  # (N k, H) in sent order
    N, k = plan.experts.shape
    chosen = np.take_along_axis(scores, plan.experts, axis=1)  # (N, k): the bias is not in here
    weights = (chosen / chosen.sum(1, keepdims=True)).reshape(-1)[plan.order]  # per pair, sent order
    y = np.zeros((N, outputs.shape[1]), np.result_type(outputs, scores))
    np.add.at(y, plan.order // k, weights[:, None] * back)
    return y
