"""One training step of the tensor-parallel GPT: a block assembled from the parallel layers,
and every all-reduce of the step accounted for (Lesson 6, Exercise 6).

    tp_block(group, block, config)                         this rank's shard of a single-device Block
    all_reduces_of_a_step(config, batch_size, t, rank)     [(phase, where, elements, bytes_sent)]

A block on t ranks (Megatron's f and g, Lesson 5):

    forward   x Replicated -f-> q, k, v (heads/t) -> attention -> o (row) Partial -g-> + x
              -f-> fc (F/t) -> GeLU -> proj (row) Partial -g-> + x        2 all-reduces (g)
    backward  the g's pass the gradient through; the f's sum dX of the heads' and the
              ffn's shards                                                2 all-reduces (f)

q, k and v read one input, so the block applies ONE f for all three: backward all-reduces
their summed input gradient once, not three times. Around the blocks, the TP GPT (the plan
applied to gpt.model's GPT, gpt.parallelize) adds the embedding's g (forward), the LM head's f
(backward) and the vocabulary-parallel cross-entropy's three all-reduces of B*T numbers (forward).
"""
from tp_from_scratch.collectives import ring_all_reduce_bytes
from tp_from_scratch.gpt.inventory import collective_calls
from tp_from_scratch.gpt.parallelize import gpt_to_tp
from tp_from_scratch.nn.mappings import tp_world_size
from tp_from_scratch.sharding import check_divisible


def tp_block(group, block, config):
    """This rank's tensor-parallel copy of the single-device ``block`` (a gpt.model.Block).

    q, k, v and fc become column-parallel, o and proj row-parallel, one f serves q, k and v;
    the norms are copied whole. The parameters have ``block``'s names, dtype and device, and
    are copies: training the result never changes ``block``. No communication.
    """
    check_whole_kv_heads(config, tp_world_size(group))
    return gpt_to_tp(group, block, config)  # a copy, parallelized by the Block's part of the GPT's plan


def check_whole_kv_heads(config, t):
    """ValueError naming the size unless ``config`` splits over t ranks with whole KV heads per rank."""
    config.validate(t)
    check_divisible(config.n_kv_heads, t, "n_kv_heads")  # no KV head replicated over ranks


def all_reduces_of_a_step(config, batch_size, t, rank, itemsize=4):
    """Every all-reduce rank ``rank`` of ``t`` makes in one training step of the TP GPT.

    One entry per call: (phase "forward" or "backward", where, elements, bytes_sent), with
    elements the numbers the rank hands to the all-reduce (B*T*H for an activation, B*T for
    the loss's) and bytes_sent what the ring all-reduce of tp_from_scratch.collectives sends
    from this rank: 2N - chunk_r - chunk_{r+1} elements of ``itemsize`` bytes, with the N
    elements cut into t chunks like numpy.array_split (uneven when t does not divide N).
    At t = 1 every all-reduce is still called and sends nothing.
    """
    if not 0 <= rank < max(t, 1):
        raise ValueError(f"rank {rank} does not exist among t={t} ranks")
    check_whole_kv_heads(config, t)
    ledger = []
    for call in collective_calls(config, t, batch_size):
        phase = "backward" if call.where.endswith("(backward)") else "forward"
        sent = ring_all_reduce_bytes(call.elements, itemsize, t, rank)
        ledger += [(phase, call.where, call.elements, sent)] * call.calls
    return ledger
