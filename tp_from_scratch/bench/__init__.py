"""Benchmarks (not tests): timings and bandwidths, printed as tables.

    .venv/bin/python -m tp_from_scratch.bench collectives   (under mpiexec or torchrun)
    .venv/bin/python -m tp_from_scratch.bench train         (under torchrun)
"""
