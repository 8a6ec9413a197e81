"""tp_from_scratch: tensor parallelism built up from a split matmul to a trained GPT.

Every parallel result in this package is checked against a single-device reference
through tp_from_scratch.compare.assert_matches_reference.
"""
__version__ = "0.1.0"
