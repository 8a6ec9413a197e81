"""Lesson 11: tensor parallelism among the parallelisms.

Data parallelism (hand-written averaging and PyTorch's DistributedDataParallel), ZeRO-style
sharding of optimizer state over the data-parallel group, pipeline parallelism from
point-to-point messages (GPipe and 1F1B schedules), and the dp x pp x tp mesh, each equal to
single-device training and measured side by side on the same GPT.
"""
