"""Known-wrong: the k largest scores taken from the end of a stable ascending sort, so that of
two tied experts the HIGHER id wins (the stub's rule keeps the lower one); without ties the
choice is right.
"""
import numpy as np

import tp_from_scratch.deepseek.dispatch as library
from tp_from_scratch.deepseek.dispatch import DispatchPlan, all_to_all_v  # noqa: F401 (graded names)
from tp_from_scratch.collectives import exchange_counts
from tp_from_scratch.sharding import check_divisible


def dispatch(comm, x, scores, bias, k, n_experts):
    t = comm.world_size
    check_divisible(n_experts, t, "n_experts")
    experts = np.argsort(scores + bias, axis=1, kind="stable")[:, ::-1][:, :k]  # ties: higher id first
    pair_expert = experts.reshape(-1)
    order = np.argsort(pair_expert, kind="stable")
    per_expert = np.bincount(pair_expert, minlength=n_experts).reshape(t, n_experts // t)
    arriving = exchange_counts(comm, per_expert)
    send_counts, recv_counts = per_expert.sum(1), arriving.sum(1)
    rows = all_to_all_v(comm, x[order // k], send_counts, recv_counts)
    local_expert = np.repeat(np.tile(np.arange(n_experts // t), t), arriving.reshape(-1))
    return rows, local_expert, DispatchPlan(np.ascontiguousarray(experts), order, send_counts, recv_counts)


combine = library.combine
