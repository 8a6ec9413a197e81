"""Lesson 7: sequence parallelism (Korthikanti et al. 2022) and activation memory, measured.

  mappings.py   the paper's g (all-gather / reduce-scatter along T) and g-bar (the reverse), numpy
  layernorm.py  LayerNorm on a sequence shard; its weight and bias gradients are all-reduced
  linear.py     column / row layers with a sequence-sharded input / output
  block.py      the sequence-parallel pre-LN block, forward and backward by hand
  check.py      the block against the single-device reference on one rank of any backend
                (`.venv/bin/mpiexec -n 4 .venv/bin/python -m tp_from_scratch.sequence_parallel.check`)
  nn.py         torch: the two mappings as autograd Functions, LayerNorm with all-reduced
                weight gradients, column layers fed by one all-gather, row layers reduce-scattered
  model.py      SequenceParallelGPT: the tensor-parallel GPT's modules, run sequence-parallel
  memory.py     bytes saved for backward per block, measured with saved_tensors_hooks, and
                the formula that predicts them exactly; Korthikanti et al.'s formulas
  train.py      Lesson 6's trainer run sequence-parallel: ours, or --impl dtensor; its
                checkpoints are the TP model's (load them with or without SP, at any tp)
  dtensor_plan.py  PyTorch's SequenceParallel plan on the same GPT, and the collective counts
                of ours next to its (CommDebugMode)

Every function takes the communicator (numpy) or group (torch) first, as in Lessons 2-5.
"""
