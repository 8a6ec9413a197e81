"""Exercise 6: assemble the tensor-parallel transformer block, and account for every
all-reduce of a training step (lessons/06_training.ipynb).

Replace each `raise NotImplementedError(...)` with your code, then run
    make grade            (or: .venv/bin/python -m pytest exercises -m ex06 -x)

Everything runs on ONE rank; `group` is that rank's communicator (the graders pass the
simulated ranks' Comm). The graders then train: they run the single-device block and yours
on the same data, take one SGD step on each, and compare the output, the input gradient,
every parameter's gradient and every updated weight with this rank's shard of the
single-device ones; and they run a whole TP GPT step (gpt.parallelize.gpt_to_tp, its
blocks replaced by yours) and compare your account of its all-reduces with what the meter
counted on every rank: how many, forward and backward, and how many bytes each rank sent.

Your layers: the ColumnParallelLinear / RowParallelLinear you wrote in Exercise 5a are the
library's (imported below), with two more options used here:
    ColumnParallelLinear.from_linear(linear, group=group)   -> this rank's rows of W and b
    layer.input_is_copied = True     the layer skips its own f: the caller applied one already
    RowParallelLinear.from_linear(linear, group=group)      -> this rank's columns of W, all of b
    copy_to_tp_region(group, x)      f: identity forward, all-reduce backward
A gpt.model.Block has ln1, attn (q, k, v, o and copy_in: the function applied to attention's
input before q, k and v read it), ln2 and mlp (fc, proj); read its forward in
tp_from_scratch/gpt/model.py. t divides n_heads, n_kv_heads and ffn here (whole KV heads on
every rank, no replicated ones).
"""
import copy  # noqa: F401

from tp_from_scratch.gpt.model import Block, GPTConfig  # noqa: F401
from tp_from_scratch.nn import ColumnParallelLinear, RowParallelLinear, copy_to_tp_region  # noqa: F401
from tp_from_scratch.nn.mappings import tp_rank, tp_world_size  # noqa: F401
from tp_from_scratch.sharding import shard_sizes  # noqa: F401


def tp_block(group, block, config):
    """This rank's tensor-parallel copy of the single-device ``block`` (a gpt.model.Block of ``config``).

    q, k, v and mlp.fc column-parallel, attn.o and mlp.proj row-parallel, ONE f in front of
    q, k and v together (attn.copy_in), the LayerNorms whole. Same parameter names as
    ``block`` (attn.q.weight, ln1.bias, ...), same dtype. Every parameter is a copy:
    ``block`` must be unchanged after the graders train yours (a shared LayerNorm, or a
    weight that is a view of block's, would move with it). No communication. Forward must
    make 2 all-reduces (the two g's), backward 2 (the two f's); at t = 1 you may skip them.
    """
    raise NotImplementedError("Exercise 6 (tp_block): see lessons/06_training.ipynb")


def all_reduces_of_a_step(config, batch_size, t, rank, itemsize=4):
    """Every all-reduce that rank ``rank`` of ``t`` makes in one training step (forward,
    backward) of the TP GPT (gpt.parallelize.gpt_to_tp) with ``config``, on batch_size sequences of
    config.seq_len tokens, numbers of ``itemsize`` bytes.

    Returns a list with one tuple per all-reduce call, in any order:
        (phase, where, elements, bytes_sent)
    phase: "forward" or "backward"; where: your own words ("attention o: g", ...);
    elements: how many numbers the rank hands to that all-reduce;
    bytes_sent: what the from-scratch ring all-reduce (Lesson 2) sends from THIS rank: it cuts
    the N elements into t chunks like numpy.array_split, and rank r sends every chunk but chunk
    r in the reduce-scatter and every chunk but chunk r+1 in the all-gather. When t does not
    divide N the ranks send different amounts.
    The library calls every all-reduce even at t = 1 (each then sends 0 bytes): list them too.
    Count the model's all-reduces: the embedding, each block, the LM head, the loss.
    Raises ValueError (naming the quantity) when rank is not one of the t ranks, when t < 1,
    when config cannot be split over t ranks (config.validate(t) says why: a size smaller than
    t, say), or when t does not divide n_kv_heads (this ledger counts whole KV heads on every
    rank: no KV head replicated). config is not modified.
    """
    raise NotImplementedError("Exercise 6 (all_reduces_of_a_step): see lessons/06_training.ipynb")
