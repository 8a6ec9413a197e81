"""Known-wrong: the counts are integers, but local_expert is built with np.repeat over a float
array of ids (np.arange(E/t, dtype=float)), so every received row's expert id is a float: the
grader's experts index with int(e) and would still compute the right output, but the stub
promises integer ids (a float id cannot index a weight in the learner's own expert loop).
"""
import numpy as np

from tp_from_scratch.deepseek.dispatch import DispatchPlan, all_to_all_v, combine  # noqa: F401 (graded names; right: only dispatch is wrong)
from tp_from_scratch.sharding import check_divisible


def dispatch(comm, x, scores, bias, k, n_experts):
    t = comm.world_size
    check_divisible(n_experts, t, "n_experts")
    experts = np.argsort(-(scores + bias), axis=1, kind="stable")[:, :k]
    pair_expert = experts.reshape(-1)
    order = np.argsort(pair_expert, kind="stable")
    per_expert = np.bincount(pair_expert, minlength=n_experts).reshape(t, n_experts // t)
    arriving = all_to_all_v(comm, per_expert, [1] * t, [1] * t)  # (t, E/t): row q from rank q
    send_counts, recv_counts = per_expert.sum(1), arriving.sum(1)
    rows = all_to_all_v(comm, x[order // k], send_counts, recv_counts)
    ids = np.arange(n_experts // t, dtype=float)
    local_expert = np.repeat(np.tile(ids, t), arriving.reshape(-1))
    return rows, local_expert, DispatchPlan(experts, order, send_counts, recv_counts)
