"""Known-wrong: combine multiplies each expert output by its weight twice
(as if the expert side had weighted it already).
"""
from dataclasses import dataclass

import numpy as np


@dataclass
class DispatchPlan:
    experts: np.ndarray
    order: np.ndarray
    send_counts: np.ndarray
    recv_counts: np.ndarray


def all_to_all_v(comm, x, send_counts, recv_counts):
    x = np.asarray(x)
    t, r = comm.world_size, comm.rank
    starts, out_starts = np.cumsum([0, *send_counts]), np.cumsum([0, *recv_counts])
    out = np.empty((int(sum(recv_counts)), *x.shape[1:]), x.dtype)
    out[out_starts[r]:out_starts[r + 1]] = x[starts[r]:starts[r + 1]]
    for step in range(1, t):
        dst, src = (r + step) % t, (r - step) % t
        comm.send(x[starts[dst]:starts[dst + 1]], dst)
        out[out_starts[src]:out_starts[src + 1]] = comm.recv(src)
    return out


def dispatch(comm, x, scores, bias, k, n_experts):
    t = comm.world_size
    if n_experts % t:
        raise ValueError(f"n_experts {n_experts} is not divisible by tp={t}")
    experts = np.argsort(-(scores + bias), axis=1, kind="stable")[:, :k]
    pair_expert = experts.reshape(-1)
    order = np.argsort(pair_expert, kind="stable")
    per_expert = np.bincount(pair_expert, minlength=n_experts).reshape(t, n_experts // t)
    arriving = all_to_all_v(comm, per_expert, np.ones(t, int), np.ones(t, int))
    send_counts, recv_counts = per_expert.sum(1), arriving.sum(1)
    rows = all_to_all_v(comm, x[order // k], send_counts, recv_counts)
    local_expert = np.repeat(np.tile(np.arange(n_experts // t), t), arriving.reshape(-1))
    return rows, local_expert, DispatchPlan(experts, order, send_counts, recv_counts)


def combine(comm, outputs, scores, plan):
    back = all_to_all_v(comm, outputs, plan.recv_counts, plan.send_counts)
    N, k = plan.experts.shape
    chosen = np.take_along_axis(scores, plan.experts, axis=1)
    weights = (chosen / chosen.sum(1, keepdims=True)).reshape(-1)[plan.order]
    y = np.zeros((N, outputs.shape[1]), np.result_type(outputs, scores))
    np.add.at(y, plan.order // k, weights[:, None] * weights[:, None] * back)
    return y
