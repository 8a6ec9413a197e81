"""Lesson 7: sequence parallelism (Korthikanti et al. 2022) and activation memory, measured.

  mappings.py   the paper's g (all-gather / reduce-scatter along T) and g-bar (the reverse), numpy
  layernorm.py  LayerNorm on a sequence shard; its weight and bias gradients are all-reduced
  linear.py     column / row layers with a sequence-sharded input / output
  block.py      the sequence-parallel pre-LN block, forward and backward by hand
  check.py      the block against the single-device reference on one rank of any backend
                (`mpiexec -n 4 python -m tp_from_scratch.sequence_parallel.check`)

Every function takes the communicator first, as in Lessons 2-4.
"""
