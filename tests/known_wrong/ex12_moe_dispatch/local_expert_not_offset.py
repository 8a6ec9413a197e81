"""Known-wrong: local_expert is the global expert id, not the id minus r E/t, so rank r > 0
names experts it does not hold (out of [0, E/t)).
"""

from tp_from_scratch.deepseek.dispatch import DispatchPlan, all_to_all_v, combine  # noqa: F401 (graded names; right: only dispatch is wrong)
from tp_from_scratch.deepseek.dispatch import dispatch as _library


def dispatch(comm, x, scores, bias, k, n_experts):
    rows, local_expert, plan = _library(comm, x, scores, bias, k, n_experts)
    return rows, local_expert + comm.rank * (n_experts // comm.world_size), plan
