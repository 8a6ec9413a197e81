"""An adapter file that fails to import on rank 1 only:
the suite must show rank 1's own error at once, not a collective timeout."""
import os

if os.environ.get("RANK") == "1":
    raise RuntimeError("adapter import failed on rank 1 only")

from tp_from_scratch.verify.ours import ADAPTER  # noqa: E402,F401
