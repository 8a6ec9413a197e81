"""Known-wrong: dispatch exchanges the counts on its own, with partners from a table written out
for the world sizes its author tried (1 to 5); at t = 6, which the stub promises, the table has
no row and it falls back to pairing by XOR, a perfect matching only for powers of two, so some
pairs of ranks never learn each other's counts. (Its all_to_all_v is right at every t.)
"""
import numpy as np

from tp_from_scratch.deepseek.dispatch import DispatchPlan, all_to_all_v, combine  # noqa: F401 (graded names; right: only dispatch is wrong)
from tp_from_scratch.sharding import check_divisible

# PARTNERS[t][r]: (send to, receive from) at steps 1 .. t-1, the pairwise schedule written out
PARTNERS = {t: [[((r + s) % t, (r - s) % t) for s in range(1, t)] for r in range(t)] for t in range(1, 6)}


def exchange_counts(comm, counts):
    t, r = comm.world_size, comm.rank
    arriving = np.zeros_like(counts)
    arriving[r] = counts[r]
    steps = PARTNERS[t][r] if t in PARTNERS else [(r ^ s, r ^ s) for s in range(1, t)]
    for dst, src in steps:
        if dst < t:
            comm.send(counts[dst].copy(), dst)
        if src < t:
            arriving[src] = comm.recv(src)
    return arriving


def dispatch(comm, x, scores, bias, k, n_experts):
    t = comm.world_size
    check_divisible(n_experts, t, "n_experts")
    experts = np.argsort(-(scores + bias), axis=1, kind="stable")[:, :k]
    pair_expert = experts.reshape(-1)
    order = np.argsort(pair_expert, kind="stable")
    per_expert = np.bincount(pair_expert, minlength=n_experts).reshape(t, n_experts // t)
    arriving = exchange_counts(comm, per_expert)
    send_counts, recv_counts = per_expert.sum(1), arriving.sum(1)
    rows = all_to_all_v(comm, x[order // k], send_counts, recv_counts)
    local_expert = np.repeat(np.tile(np.arange(n_experts // t), t), arriving.reshape(-1))
    return rows, local_expert, DispatchPlan(experts, order, send_counts, recv_counts)
