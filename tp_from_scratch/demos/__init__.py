"""Runnable demos: .venv/bin/python -m tp_from_scratch.demos.<name>."""
