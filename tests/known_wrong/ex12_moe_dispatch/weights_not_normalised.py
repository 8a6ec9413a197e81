"""Known-wrong: combine weights each output by its raw chosen score, not the score divided by
the sum of the token's k chosen scores: the weights do not sum to one.
"""
import numpy as np

from tp_from_scratch.deepseek.dispatch import DispatchPlan, all_to_all_v, dispatch  # noqa: F401 (graded names; right: only combine is wrong)


def combine(comm, outputs, scores, plan):
    back = all_to_all_v(comm, outputs, plan.recv_counts, plan.send_counts)
    N, k = plan.experts.shape
    weights = np.take_along_axis(scores, plan.experts, axis=1).reshape(-1)[plan.order]  # not normalised
    y = np.zeros((N, outputs.shape[1]), np.result_type(outputs, scores))
    np.add.at(y, plan.order // k, weights[:, None] * back)
    return y
