"""Runnable demos: python -m tp_from_scratch.demos.<name>."""
