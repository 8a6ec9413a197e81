"""Known-wrong: the receiver assumes it receives what it sends (recv_counts = its own
send_counts), without exchanging the counts: buffers of the wrong size whenever routing is uneven.
"""
import numpy as np

from tp_from_scratch.deepseek.dispatch import DispatchPlan, all_to_all_v, combine  # noqa: F401 (graded names; right: only dispatch is wrong)


def dispatch(comm, x, scores, bias, k, n_experts):
    t = comm.world_size
    if n_experts % t:
        raise ValueError(f"n_experts {n_experts} is not divisible by tp={t}")
    experts = np.argsort(-(scores + bias), axis=1, kind="stable")[:, :k]
    pair_expert = experts.reshape(-1)
    order = np.argsort(pair_expert, kind="stable")
    per_expert = np.bincount(pair_expert, minlength=n_experts).reshape(t, n_experts // t)
    arriving = per_expert  # never exchanged
    send_counts, recv_counts = per_expert.sum(1), arriving.sum(1)
    rows = all_to_all_v(comm, x[order // k], send_counts, recv_counts)
    local_expert = np.repeat(np.tile(np.arange(n_experts // t), t), arriving.reshape(-1))
    return rows, local_expert, DispatchPlan(experts, order, send_counts, recv_counts)
