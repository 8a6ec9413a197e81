"""The two wrong gradient norms under TP, beside the right one (gpt/clip.py, the trainer's
--clip-grad-norm): Lesson 13 shows all three.

    norm_counting_replicas_t_times   sum every rank's local squares over the TP group: the
                                     replicated parameters (norms, biases of row layers, wpe)
                                     count t times, a KV head held by r ranks r times
    norm_without_tp_sum              each rank's local norm alone: the sharded parameters
                                     miss the other ranks' pieces, and every rank clips by
                                     another factor, so the replicas drift apart
"""
from tp_from_scratch.gpt.clip import (EPS, _local_power_sum, _named, _reduce, clip_grad_norm, gpt_placement,
                                      grad_norm, owns)

__all__ = ["EPS", "clip_grad_norm", "gpt_placement", "grad_norm", "owns", "norm_counting_replicas_t_times",
           "norm_without_tp_sum"]


def norm_counting_replicas_t_times(parameters, group, norm_type=2.0):
    """WRONG: every rank's local gradients, all of them, summed over the TP group. A replicated
    parameter counts t times, a KV head held by r ranks r times."""
    return _reduce([group], _local_power_sum([p.grad for _, p in _named(parameters)], norm_type), norm_type)


def norm_without_tp_sum(parameters, norm_type=2.0):
    """WRONG: this rank's local gradients alone. A sharded parameter counts only this rank's piece,
    and the ranks disagree on the norm (so on the clipping factor)."""
    return _reduce([], _local_power_sum([p.grad for _, p in _named(parameters)], norm_type), norm_type)
