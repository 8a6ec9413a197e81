"""Lesson 9: when does tensor parallelism pay? A cost model of one training step.

    model.py       memory, bytes, FLOPs, element-wise work and the predicted step time
    calibrate.py   measure this machine (matmul rate, element-wise ops, overhead, alpha-beta)
    plan.py        the command line: .venv/bin/python -m tp_from_scratch.cost.planner --help

What it counts comes from earlier lessons: the parameters and the collectives of a step
(gpt.inventory, Lesson 6), the ring's bytes (collectives, Lesson 2), the activations
(sequence_parallel.memory, Lesson 7).
"""
