"""A conformance suite any tensor-parallel implementation can plug into (tooling).

    adapter.py  Adapter: how a library describes its column/row layers, embedding, mappings,
                cross-entropy, global setup, shard layout and supported features
    suite.py    every check, reported row by row (PASS / FAIL / SKIP / NOT PROVIDED), with the
                errors against the tolerance policy and the collectives counted each way
    report.py   the rows of every rank merged into one table or JSON
    ours.py     tp_from_scratch.nn as an Adapter; dtensor.py: PyTorch's DTensor TP as one

    .venv/bin/torchrun --standalone --nproc-per-node 2 -m tp_from_scratch.verify module:ADAPTER [--json PATH]
    run_spmd(run_suite, t, ADAPTER, exclusive=threading.Lock())   # simulated ranks, Comm groups
"""
from tp_from_scratch.verify.adapter import FEATURES, Adapter, chunk_range
from tp_from_scratch.verify.report import exit_status, merge, table, write_json
from tp_from_scratch.verify.suite import run_suite

__all__ = ["Adapter", "FEATURES", "chunk_range", "run_suite", "merge", "table", "write_json",
           "exit_status"]
