"""Known-wrong: counts accumulated in a float array (np.zeros(t) += 1 per pair) and kept in the
plan as floats; its own all-to-all casts them with int() where it slices, so the rows travel
right, but the plan's send_counts and recv_counts are not the integer arrays the stub promises.
"""
import numpy as np

from tp_from_scratch.deepseek.dispatch import DispatchPlan
from tp_from_scratch.sharding import check_divisible


def all_to_all_v(comm, x, send_counts, recv_counts):
    x = np.asarray(x)
    t, r = comm.world_size, comm.rank
    starts = np.cumsum([0, *[int(c) for c in send_counts]])
    out_starts = np.cumsum([0, *[int(c) for c in recv_counts]])
    out = np.empty((int(out_starts[-1]), *x.shape[1:]), x.dtype)
    out[out_starts[r]:out_starts[r + 1]] = x[starts[r]:starts[r + 1]]
    for step in range(1, t):
        dst, src = (r + step) % t, (r - step) % t
        comm.send(x[starts[dst]:starts[dst + 1]], dst)
        out[out_starts[src]:out_starts[src + 1]] = comm.recv(src)
    return out


def dispatch(comm, x, scores, bias, k, n_experts):
    t = comm.world_size
    check_divisible(n_experts, t, "n_experts")
    experts = np.argsort(-(scores + bias), axis=1, kind="stable")[:, :k]
    pair_expert = experts.reshape(-1)
    order = np.argsort(pair_expert, kind="stable")
    per_expert = np.zeros(n_experts)  # float64
    for e in pair_expert:
        per_expert[e] += 1
    per_expert = per_expert.reshape(t, n_experts // t)
    arriving = all_to_all_v(comm, per_expert, [1] * t, [1] * t)  # (t, E/t) floats
    send_counts, recv_counts = per_expert.sum(1), arriving.sum(1)
    rows = all_to_all_v(comm, x[order // k], send_counts, recv_counts)
    local_expert = np.repeat(np.tile(np.arange(n_experts // t), t), arriving.reshape(-1).astype(int))
    return rows, local_expert, DispatchPlan(experts, order, send_counts, recv_counts)


def combine(comm, outputs, scores, plan):
    back = all_to_all_v(comm, outputs, plan.recv_counts, plan.send_counts)
    N, k = plan.experts.shape
    chosen = np.take_along_axis(scores, plan.experts, axis=1)
    weights = (chosen / chosen.sum(1, keepdims=True)).reshape(-1)[plan.order]
    y = np.zeros((N, outputs.shape[1]), np.result_type(outputs, scores))
    np.add.at(y, plan.order // k, weights[:, None] * back)
    return y
