"""Known-wrong: combine reads the weights in send order, then turns plan.order into each pair's
token in place (plan.order //= k) to scatter the rows back: the output is right, but the plan
dispatch returned is changed, and a second combine with it (the backward's) would be wrong.
"""
import numpy as np

from tp_from_scratch.deepseek.dispatch import DispatchPlan, all_to_all_v, dispatch  # noqa: F401 (graded names; right: only combine is wrong)


def combine(comm, outputs, scores, plan):
    back = all_to_all_v(comm, outputs, plan.recv_counts, plan.send_counts)
    N, k = plan.experts.shape
    chosen = np.take_along_axis(scores, plan.experts, axis=1)
    weights = (chosen / chosen.sum(1, keepdims=True)).reshape(-1)[plan.order]
    token = plan.order
    token //= k
    y = np.zeros((N, outputs.shape[1]), np.result_type(outputs, scores))
    np.add.at(y, token, weights[:, None] * back)
    return y
