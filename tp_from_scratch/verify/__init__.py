"""A conformance suite any tensor-parallel implementation can plug into (tooling).

    adapter.py     Adapter: how a library describes its layers, mappings, cross-entropy, global
                   setup, shard layout, supported features, SP layers and expected failures
    suite.py       every check, reported row by row, with the errors against the tolerance
                   policy and the collectives (calls and bytes) counted each way
    sp.py          the sequence-parallel checks (mappings along T, LayerNorm, block, token order)
    modes.py       two forwards before the backwards; forwards under no_grad / inference_mode
    recorder.py    what a check measured: quantities, collectives, where an exception came from
    worker.py      one rank of a launch: each check fenced off from the next
    supervisor.py  starts the workers, ends stuck ones, resumes after a bad check (a restart
                   budget per adapter), prints the progress
    report.py      the rows of every rank merged, the table, the summary, JSON, exit status
    ours.py        tp_from_scratch.nn (and Lesson 7's SP layers) as an Adapter; dtensor.py:
                   PyTorch's DTensor TP and SequenceParallel as one

    .venv/bin/python -m tp_from_scratch.verify module:ADAPTER [--t 2,3,4] [--json PATH] [--failures-only]
    run_spmd(run_suite, t, ADAPTER, exclusive=threading.Lock())   # simulated ranks, Comm groups

The adapter contract in full: docs/verify.md.
"""
from tp_from_scratch.verify.adapter import FEATURES, Adapter, chunk_range
from tp_from_scratch.verify.report import exit_status, merge, summary, table, write_json
from tp_from_scratch.verify.suite import run_suite

__all__ = ["Adapter", "FEATURES", "chunk_range", "run_suite", "merge", "table", "summary",
           "write_json", "exit_status"]
