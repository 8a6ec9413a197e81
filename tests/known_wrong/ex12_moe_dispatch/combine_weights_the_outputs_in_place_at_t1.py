"""Known-wrong: at t = 1 combine skips the return all-to-all (nothing to send) and weights the
expert outputs in place, in the caller's own array: the result is right, but the caller's
outputs have changed.
"""
import numpy as np

from tp_from_scratch.deepseek.dispatch import DispatchPlan, all_to_all_v, dispatch  # noqa: F401 (graded names; right: only combine is wrong)


def combine(comm, outputs, scores, plan):
    if comm.world_size == 1:
        back = outputs  # no copy: "it is never returned"
    else:
        back = all_to_all_v(comm, outputs, plan.recv_counts, plan.send_counts)
    N, k = plan.experts.shape
    chosen = np.take_along_axis(scores, plan.experts, axis=1)
    weights = (chosen / chosen.sum(1, keepdims=True)).reshape(-1)[plan.order]
    back *= weights[:, None]
    y = np.zeros((N, outputs.shape[1]), np.result_type(outputs, scores))
    np.add.at(y, plan.order // k, back)
    return y
