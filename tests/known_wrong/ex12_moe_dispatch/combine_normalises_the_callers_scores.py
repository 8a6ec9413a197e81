"""Known-wrong: combine normalises each token's chosen scores and writes them back into the
caller's scores array (np.put_along_axis) before reading its weights from it: the output is
right, but the router's scores the caller still holds (for its backward, its logs) changed.
"""
import numpy as np

from tp_from_scratch.deepseek.dispatch import DispatchPlan, all_to_all_v, dispatch  # noqa: F401 (graded names; right: only combine is wrong)


def combine(comm, outputs, scores, plan):
    back = all_to_all_v(comm, outputs, plan.recv_counts, plan.send_counts)
    N, k = plan.experts.shape
    chosen = np.take_along_axis(scores, plan.experts, axis=1)
    np.put_along_axis(scores, plan.experts, chosen / chosen.sum(1, keepdims=True), axis=1)
    weights = np.take_along_axis(scores, plan.experts, axis=1).reshape(-1)[plan.order]
    y = np.zeros((N, outputs.shape[1]), np.result_type(outputs, scores))
    np.add.at(y, plan.order // k, weights[:, None] * back)
    return y
