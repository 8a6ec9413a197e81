"""Lesson 8: partially synchronized activations (CAAT-Net, arXiv 2506.19645, NeurIPS 2025).

At the two row-parallel outputs of every block only the leading p*H hidden channels are
all-reduced; the rest stay private to each rank, so each rank carries its own residual
stream. The model then depends on t, and is checked against a single-device reference that
computes all t streams explicitly.

  mappings.py   the partial reduce (numpy, forward and backward) and the gradient sum of
                parameters shared by the streams
  params.py     block parameter names, sharding and gathering
  local.py      what one rank computes on its stream between two partial reduces
  block.py      the TP block stack (one stream per rank)
  reference.py  the single-device t-stream reference of the same model
  check.py      the TP stack against the reference on any backend

torch (the GPT of Lesson 6):
  autograd.py   the partial reduce as an autograd Function; summing the shared parameters' grads
  model.py      caat_from_gpt (one rank: the GPT's plan with CAAT's styles) and
                t_stream_forward (the single-device t-stream model)
  train.py      `.venv/bin/python -m tp_from_scratch.partial_sync.train --sync-fraction p`
  experiment.py held-out loss against bytes per step, tp in {2, 4}, p in {1, ..., 0}
  figures.py    the picture of synced and private channels
"""
