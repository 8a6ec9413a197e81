"""Exercise 12: expert parallelism's dispatch and combine, on your own all-to-all
(lessons/12_deepseek_v3_moe.ipynb).

Replace each `raise NotImplementedError(...)` with your code, then run
    make grade            (or: .venv/bin/python -m pytest exercises -m ex12)
The graders run your functions on the simulator (tp_from_scratch.comm.run_spmd) for world
sizes 1 to 6 (odd ones too), with uneven counts and empty blocks, ranks with no tokens
(N = 0) and ranks whose experts nobody chose, and tied scores.

You may use comm.rank, comm.world_size, comm.send(array, dst), comm.recv(src) and numpy.
Every rank owns E/t experts: rank d owns experts [d E/t, (d+1) E/t).
The router here is simpler than DeepSeek-V3's (Lesson 12, section 2): a plain top-k of
scores + bias, with no groups (n_group, topk_group) and no routed_scaling_factor; the
weights are normalised (norm_topk_prob).

1. all_to_all_v: rank r sends rows [c_<d, c_<=d) of x to rank d (c = send_counts) and
   returns what it receives, concatenated in SOURCE-rank order; recv_counts[q] is the rows
   rank q sends here. Pairwise exchange: at step s = 1 .. t-1 send to (r + s) % t and
   receive from (r - s) % t (any other pairing must still work for every t, odd ones too).
2. dispatch: choose each token's k experts by scores + bias (np.argsort(-(scores + bias),
   axis=1, kind="stable")[:, :k]: of tied scores, the lower expert id); list the (token,
   expert) pairs as token n's j-th pair at n k + j and sort them by expert (np.argsort(...,
   kind="stable")); exchange the counts (every receiver must learn how many rows each source
   sends it, per local expert: an all-to-all of one row of counts to each rank); send the rows.
3. combine: send the expert outputs back (the counts swapped) and sum each token's k outputs
   weighted by w_nj = s_nj / sum_j s_nj, s the chosen experts' SCORES: the bias selects, it
   never weighs. Apply each weight once. Leave every input untouched (outputs and plan too).
Expert ids, positions and counts are integer arrays (any integer dtype).
"""
from dataclasses import dataclass

import numpy as np


@dataclass
class DispatchPlan:
    """What combine needs from dispatch, all integer arrays: experts (N, k), the pairs' send
    order (N k,), send_counts and recv_counts (t,)."""
    experts: np.ndarray
    order: np.ndarray
    send_counts: np.ndarray
    recv_counts: np.ndarray


def all_to_all_v(comm, x, send_counts, recv_counts):
    """(sum send_counts, ...) -> (sum recv_counts, ...): block d of x to rank d; what arrives
    in source-rank order. A new array; x is not modified."""
    raise NotImplementedError("Exercise 12 (all_to_all_v): see lessons/12_deepseek_v3_moe.ipynb")


def dispatch(comm, x, scores, bias, k, n_experts):
    """This rank's tokens x (N, H) to the ranks owning their experts.

    Returns (rows (M, H), local_expert (M,) integers, plan): from each source rank in order,
    its pairs for this rank's experts sorted by expert; local_expert = expert id - r E/t, in
    [0, E/t). N or M may be 0.
    Raises ValueError naming n_experts if t does not divide it. Inputs are not modified.
    """
    raise NotImplementedError("Exercise 12 (dispatch): see lessons/12_deepseek_v3_moe.ipynb")


def combine(comm, outputs, scores, plan):
    """Expert outputs (M, H), in the order dispatch's rows arrived -> y (N, H): each token's
    k outputs, weighted by its chosen scores normalised to sum to one."""
    raise NotImplementedError("Exercise 12 (combine): see lessons/12_deepseek_v3_moe.ipynb")
