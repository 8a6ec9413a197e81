"""Lesson 14: tensor parallelism at inference time (lessons/14_tp_inference.ipynb).

Why decode is latency-bound, and when TP speeds it up; the next token chosen from the
vocabulary shards; and two ways to drop or shrink TP's syncs at inference, each checked against
a single-device emulation.

  latency.py     the planner's inference mode: decode_step, prefill, memory_per_rank,
                 decode_table; GPU profiles (NVLink, PCIe, across nodes) with their sources
  planner.py     its command line: .venv/bin/python -m tp_from_scratch.inference.planner --help
  calibrate.py   this machine's profile (planner --calibrate; Lesson 9's machinery)
  benchmark.py   predicted against measured decode latency of gpt.generate at t = 1, 2, 4:
                 .venv/bin/python -m tp_from_scratch.inference.benchmark
  sampling.py    greedy_from_shards, sample_from_shards (Exercise 14), sample_gathered, their bytes
  quantized.py   QDQ, two_step_all_reduce and all_gather_all_reduce (Flash Communication and the
                 compress-then-gather variant), their emulations and bytes
  layers.py      PartialRowParallelLinear, QuantizedRowParallelLinear, SyncPointDropBlock
  models.py      tensor_parallel_gpt (the one place a TP model is built), inference_gpt,
                 forward_bytes, sensitivity_order and zero_shot_blocks (SPD's choice of blocks)
  emulation.py   partitioned_forward: the t-rank inference GPT on one device
  experiment.py  perplexity on real text against bytes per token and modelled decode latency
                 (plain TP, SPD, quantized all-reduce, CAAT-Net), one Pareto figure:
                 .venv/bin/python -m tp_from_scratch.inference.experiment

What it builds on: the TP GPT and its generation (Lesson 6), the vocabulary-parallel head and
the row-parallel layer (Lesson 5), the ring collectives and their bytes (Lesson 2), the
planner's inventory, profiles and calibration (Lesson 9), CAAT-Net's synced channels (Lesson 8).
"""
