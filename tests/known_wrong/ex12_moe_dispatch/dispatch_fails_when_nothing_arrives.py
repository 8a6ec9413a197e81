"""Known-wrong: dispatch receives block by block and concatenates only the blocks that hold
rows, which fails (numpy needs at least one array) on a rank whose experts nobody chose.
"""
import numpy as np

from tp_from_scratch.deepseek.dispatch import DispatchPlan, all_to_all_v, combine  # noqa: F401 (graded names; right: only dispatch is wrong)
from tp_from_scratch.collectives import exchange_counts
from tp_from_scratch.sharding import check_divisible


def dispatch(comm, x, scores, bias, k, n_experts):
    t, r = comm.world_size, comm.rank
    check_divisible(n_experts, t, "n_experts")
    experts = np.argsort(-(scores + bias), axis=1, kind="stable")[:, :k]
    pair_expert = experts.reshape(-1)
    order = np.argsort(pair_expert, kind="stable")
    per_expert = np.bincount(pair_expert, minlength=n_experts).reshape(t, n_experts // t)
    arriving = exchange_counts(comm, per_expert)
    send_counts, recv_counts = per_expert.sum(1), arriving.sum(1)
    sorted_rows, starts = x[order // k], np.cumsum([0, *send_counts])
    blocks = {r: sorted_rows[starts[r]:starts[r + 1]]}
    for step in range(1, t):
        dst, src = (r + step) % t, (r - step) % t
        comm.send(sorted_rows[starts[dst]:starts[dst + 1]], dst)
        blocks[src] = comm.recv(src)
    rows = np.concatenate([blocks[q] for q in range(t) if len(blocks[q])])
    local_expert = np.repeat(np.tile(np.arange(n_experts // t), t), arriving.reshape(-1))
    return rows, local_expert, DispatchPlan(experts, order, send_counts, recv_counts)
