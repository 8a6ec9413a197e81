"""Run ``python -m MODULE ARGS`` with rank 0 starting its main only after rank 1 has imported the
module and DELAY seconds more: the race in which rank 1 meets a bad command line first, forced.

    torchrun --nproc-per-node 2 -m tests.spmd_scripts.rank0_late MARKER_DIR DELAY MODULE [ARGS...]

Rank 1 imports MODULE (torch and all: the slow part of a start), leaves a file in MARKER_DIR,
then runs its main; its refusal of the command line follows within milliseconds. Rank 0 waits for that
file (at most 120 s), then DELAY seconds, then imports and runs MODULE. A rank that left at once with its
refusal unsaid would have torchrun stop rank 0 long before rank 0 printed anything.
"""
import importlib
import os
import sys
import time
from pathlib import Path

marker_dir, delay, module, *args = sys.argv[1:]
marker = Path(marker_dir) / "rank1-imported"
if os.environ["RANK"] == "0":
    deadline = time.monotonic() + 120
    while not marker.exists() and time.monotonic() < deadline:
        time.sleep(0.05)
    time.sleep(float(delay))
    entry = importlib.import_module(module)
else:
    entry = importlib.import_module(module)
    marker.touch()
sys.argv = [module, *args]
entry.main()   # what ``python -m MODULE`` runs
