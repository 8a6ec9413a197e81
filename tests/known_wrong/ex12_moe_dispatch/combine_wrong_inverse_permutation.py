"""Known-wrong: combine un-sorts the returned rows with back[order] (the permutation again)
instead of its inverse (pairs[order] = back), so most rows land on another token.
"""
import numpy as np

from tp_from_scratch.deepseek.dispatch import DispatchPlan, all_to_all_v, dispatch  # noqa: F401 (graded names; right: only combine is wrong)


def combine(comm, outputs, scores, plan):
    back = all_to_all_v(comm, outputs, plan.recv_counts, plan.send_counts)  # (N k, H), send order
    N, k = plan.experts.shape
    pairs = back[plan.order]  # wrong: the inverse is pairs[plan.order] = back
    chosen = np.take_along_axis(scores, plan.experts, axis=1)
    weights = (chosen / chosen.sum(1, keepdims=True)).reshape(-1)  # token n's j-th at n k + j
    y = np.zeros((N, outputs.shape[1]), np.result_type(outputs, scores))
    np.add.at(y, np.arange(N * k) // k, weights[:, None] * pairs)
    return y
