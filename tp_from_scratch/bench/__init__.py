"""Benchmarks (not tests): timings and bandwidths, printed as tables.

    python -m tp_from_scratch.bench collectives   (under mpiexec or torchrun)
    python -m tp_from_scratch.bench train         (under torchrun)
"""
