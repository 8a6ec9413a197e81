"""The inference GPT on t ranks: Lesson 6's TP GPT with some syncs dropped (SPD) or shrunk
(quantized all-reduce), its bytes per forward, and SPD's choice of blocks.

    tensor_parallel_gpt(group, gpt)                 the ordinary TP GPT (the one place it is built)
    inference_gpt(group, gpt, spd_blocks, bits, group_size, scheme)
    forward_bytes(config, t, rank, tokens, itemsize, spd_blocks, bits, group_size, scheme, synced_fraction)
    sensitivity_order(evaluate, n_layers)           SPD's back-to-front block sensitivities

Every row-parallel module of the plan (gpt.arch.PLANS: attn.o, mlp.proj or mlp.down) becomes a
QuantizedRowParallelLinear when bits < 16, and every block in ``spd_blocks`` a
SyncPointDropBlock (whose one all-reduce is quantized alike). The parameter names stay those of
the single-device GPT.
"""
from tp_from_scratch.collectives import ring_all_reduce_bytes
from tp_from_scratch.gpt.parallelize import gpt_to_tp
from tp_from_scratch.inference.layers import (QuantizedRowParallelLinear, SyncPointDropBlock, quantized_reduce,
                                              row_modules)
from tp_from_scratch.inference.quantized import UNQUANTIZED, check_quantization, reduce_bytes
from tp_from_scratch.partial_sync.mappings import synced_channels


def tensor_parallel_gpt(group, gpt):
    """This rank's shard of the single-device ``gpt`` as Lesson 6's TP GPT, in eval mode.

    The one place this lesson builds a TP model: through gpt.parallelize.gpt_to_tp (the plan
    applied to a copy); its ``styles=`` parameter is where the quantized row layer can become
    the ROWWISE style it is given.
    """
    return gpt_to_tp(group, gpt).eval()


def check_blocks(spd_blocks, n_layers):
    """A ValueError naming a block index outside 0 .. n_layers - 1 (or repeated)."""
    blocks = list(spd_blocks)
    bad = [b for b in blocks if isinstance(b, bool) or not isinstance(b, int) or not 0 <= b < n_layers]
    if bad or len(set(blocks)) != len(blocks):
        raise ValueError(f"spd_blocks must be distinct block indices 0..{n_layers - 1}, got {blocks}")
    return set(blocks)


def inference_gpt(group, gpt, spd_blocks=(), bits=UNQUANTIZED, group_size=128, scheme="two_step"):
    """This rank's inference GPT: ``tensor_parallel_gpt`` with SPD on ``spd_blocks`` and, at
    bits < 16, every row-parallel all-reduce quantized (``scheme``, ``group_size``). Returns the
    model; its forward(idx, cache=...) gives this rank's (B, T, V/t) logits, as Lesson 6's does."""
    check_quantization(bits, group_size, scheme)
    config = gpt.config
    spd = check_blocks(spd_blocks, config.n_layers)
    model = tensor_parallel_gpt(group, gpt)
    if bits != UNQUANTIZED:
        for block in model.blocks:
            for name in row_modules(config.arch):
                parent, _, leaf = name.rpartition(".")
                setattr(block.get_submodule(parent), leaf,
                        QuantizedRowParallelLinear.from_row(block.get_submodule(name), bits, group_size, scheme))
    reduce = quantized_reduce(bits, group_size, scheme) if bits != UNQUANTIZED else None
    for i in sorted(spd):
        model.blocks[i] = SyncPointDropBlock(model.blocks[i], group, config.arch, reduce)
    return model


def forward_bytes(config, t, rank, tokens, itemsize, spd_blocks=(), bits=UNQUANTIZED, group_size=128,
                  scheme="two_step", synced_fraction=1.0):
    """Bytes rank ``rank`` sends in one forward of ``tokens`` (B T) positions, logits left sharded:
    the embedding's exact all-reduce of (tokens, H), then per block two row-parallel reduces of
    (tokens, H), one for an SPD block, each as quantized.reduce_bytes says. synced_fraction p < 1:
    CAAT-Net's partial reduce (Lesson 8), each block reduce of (tokens, floor(p H)) channels."""
    spd = check_blocks(spd_blocks, config.n_layers)
    n = tokens * config.hidden
    per_reduce = reduce_bytes(tokens * synced_channels(config.hidden, synced_fraction), t, rank, bits, group_size,
                              itemsize, scheme)
    reduces = 2 * config.n_layers - len(spd)
    return ring_all_reduce_bytes(n, itemsize, t, rank) + reduces * per_reduce


# ---------------------------------------------------------------------------------------
# Which blocks: SPD's sensitivity order
# ---------------------------------------------------------------------------------------

def sensitivity_order(evaluate, n_layers):
    """(blocks, least sensitive first; {block: sensitivity}) by SPD's back-to-front procedure.

    As the paper's ICML review describes it (OpenReview 23zxLtvder): sync-point drop is applied
    starting from the last block, one more block at a time towards the first, the perplexity
    measured after each; the increase each block adds is its sensitivity:

        sensitivity(i) = evaluate(drop i .. L-1) - evaluate(drop i+1 .. L-1)

    The paper sorts the blocks by it into insensitive (SPD zero-shot), sensitive (SPD with
    block-to-block distillation) and extremely sensitive (head grouping); zero-shot SPD on k
    blocks takes the k least sensitive (``zero_shot_blocks``). ``evaluate(blocks)``: perplexity
    (or loss) of the model with SPD on that tuple of blocks. Ties go to the later block.
    """
    sensitivity, previous = {}, evaluate(())
    for i in reversed(range(n_layers)):
        current = evaluate(tuple(range(i, n_layers)))
        sensitivity[i], previous = current - previous, current
    return sorted(range(n_layers), key=lambda i: (sensitivity[i], -i)), sensitivity


def zero_shot_blocks(order, k):
    """The k least sensitive blocks of ``order`` (sensitivity_order's first result), sorted."""
    if not 0 <= k <= len(order):
        raise ValueError(f"k must be 0..{len(order)} blocks, got {k}")
    return tuple(sorted(order[:k]))
