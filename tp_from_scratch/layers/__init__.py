"""Megatron-style tensor-parallel layers in numpy, forward and backward written out by hand.

  reference.py  single-device layers (no communication): the ground truth
  mappings.py   the conjugate pair f (identity / all-reduce) and g (all-reduce / identity)
  linear.py     column-parallel and row-parallel linear layers
  mlp.py        column Linear(H -> F), GeLU, row Linear(F -> H): one all-reduce each way
  attention.py  causal self-attention, heads split across ranks (GQA included)
  block.py      the pre-LayerNorm transformer block: two all-reduces each way
  check.py      every layer against its reference on one rank of any backend
                (`mpiexec -n 4 python -m tp_from_scratch.layers.check`)

Every parallel function takes the communicator ``comm`` explicitly, so the same code runs
on the simulator (run_spmd), under mpiexec (MPIComm) and under torchrun (TorchComm).
"""
from tp_from_scratch.layers import reference
from tp_from_scratch.layers.reference import BlockConfig
