"""Megatron-style tensor-parallel layers in numpy, forward and backward written out by hand.

  reference.py  single-device layers (no communication): the ground truth
  mappings.py   the conjugate pair f (identity / all-reduce) and g (all-reduce / identity)
  linear.py     column-parallel and row-parallel linear layers
  mlp.py        column Linear(H -> F), GeLU, row Linear(F -> H): one all-reduce each way
  attention.py  causal self-attention, heads split across ranks (GQA included)
  block.py      the pre-LayerNorm transformer block: two all-reduces each way
  check.py      every layer against its reference on one rank of any backend
                (`.venv/bin/mpiexec -n 4 .venv/bin/python -m tp_from_scratch.layers.check`)

Every parallel function takes the communicator ``comm`` as its FIRST argument, so the same
code runs on the simulator (run_spmd), under mpiexec (MPIComm) and under torchrun (TorchComm).
The parallel versions are named parallel_mlp_forward(comm, x, params_local) and so on; the
single-device ones in reference.py keep the plain names, e.g. mlp_forward(x, params).

One vocabulary with the torch code of the later lessons: parameter names are those of the torch
GPT's Block (ln1.weight, attn.q.weight, attn.o.bias, mlp.fc.weight, mlp.proj.bias, ...), with
the same bias choices (no attn.k.bias). One difference, on purpose: numpy keeps the math
layout W (in, out) and computes y = x @ W + b, while torch's nn.Linear stores weight (out, in)
= W^T. reference.params_from_torch / params_to_torch convert, transposing the 2-D weights.
"""
from tp_from_scratch.layers import reference  # noqa: F401 (re-exported)
from tp_from_scratch.layers.reference import BlockConfig  # noqa: F401 (re-exported)
