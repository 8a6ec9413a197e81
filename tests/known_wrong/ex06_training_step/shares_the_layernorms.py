"""Known-wrong: the TP block reuses the single-device block's LayerNorm modules instead of copies.

Every number is right, but training the TP block moves the single-device block's norms too.
"""
from tp_from_scratch.gpt.step import all_reduces_of_a_step  # noqa: F401
from tp_from_scratch.gpt.step import tp_block as _tp_block


def tp_block(group, block, config):
    local = _tp_block(group, block, config)
    local.ln1, local.ln2 = block.ln1, block.ln2  # wrong: shared, not copied
    return local
