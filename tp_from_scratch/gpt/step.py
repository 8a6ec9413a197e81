"""One training step of the tensor-parallel GPT: THE step every trainer runs, a block assembled
from the parallel layers, and every all-reduce of the step accounted for (Lesson 6, Exercise 6).

    train_step(model, optimizer, x, y, dp_group, dp)       zero_grad, forward and backward, the DP
                                                           average, optimizer step: the global mean loss
    single_device_run(config, opts)                        the reference: (step, loss) on one device
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
import contextlib
from functools import partial

import torch
import torch.distributed as dist

from tp_from_scratch.collectives import ring_all_reduce_bytes
from tp_from_scratch.gpt import checkpoint as ckpt
from tp_from_scratch.gpt import optim
from tp_from_scratch.gpt.data import global_batch
from tp_from_scratch.gpt.inventory import collective_calls
from tp_from_scratch.gpt.model import init_gpt
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


# ---------------------------------------------------------------------------------------
# THE training step, and the single-device reference it is checked against
# ---------------------------------------------------------------------------------------

def make_optimizer(params, opts):
    """AdamW (betas 0.9, 0.95, no weight decay) or SGD with momentum; element-wise, so TP-safe
    (gpt/optim.py: torch.optim's, bit for bit)."""
    if opts.optimizer == "sgd":
        return optim.SGD(params, lr=opts.learning_rate, momentum=0.9)
    return optim.AdamW(params, lr=opts.learning_rate, betas=(0.9, 0.95), weight_decay=0.0)


def average_gradients(params, group, dp):
    """Data parallelism: every gradient becomes its mean over the DP group (one all-reduce)."""
    grads = [p.grad.to_local() if hasattr(p.grad, "to_local") else p.grad for p in params]
    flat = torch.cat([g.reshape(-1) for g in grads])
    dist.all_reduce(flat, group=group)
    flat /= dp
    offset = 0
    for g in grads:
        g.copy_(flat[offset:offset + g.numel()].view_as(g))
        offset += g.numel()


def gpt_loss(model, x, y):
    """The GPT's mean cross-entropy on a batch."""
    return model(x, y)[1]


def forward_backward(model, x, y, loss_fn=gpt_loss):
    """The loss of one batch, its gradients accumulated into the parameters."""
    loss = loss_fn(model, x, y)
    loss.backward()
    return loss


def train_step(model, optimizer, x, y, dp_group=None, dp=1, *, after_backward=None,
               run_batch=forward_backward, average=True, context=contextlib.nullcontext, clip=None):
    """THE training step: zero_grad, forward and backward, after_backward(model), the DP
    gradient average, clip(model) (--clip-grad-norm: gpt/clip.py), optimizer step; returns the
    global mean loss (detached).

    Every trainer's step is this one. A later lesson changes a part: run_batch(model, x, y)
    (a pipeline's), average=False (DDP and ZeRO average themselves), context (what
    forward and backward run inside: DTensor's loss_parallel). With dp=1 it touches no
    process group, so it also runs on in-process simulated ranks.
    """
    optimizer.zero_grad(set_to_none=True)
    with context():
        loss = run_batch(model, x, y)
    if after_backward is not None:
        after_backward(model)
    if average and dp > 1:
        average_gradients([p for p in model.parameters() if p.grad is not None], dp_group, dp)
    if clip is not None:
        clip(model)                 # on the averaged gradients: the norm of the global batch's
    optimizer.step()
    loss = loss.detach().clone()
    if dp > 1:
        dist.all_reduce(loss, group=dp_group)
        loss /= dp
    return loss


def batches(opts, shape, first=0):
    """(step, (x, y)) of every step first .. opts.steps-1: the global batch (B, T) of token ids
    below V, shape = (T, V), a function of (seed, step) (gpt.data)."""
    for step in range(first, opts.steps):
        yield step, global_batch(step, opts.batch_size, *shape, opts.seed, opts.data)


def single_device_run(config, opts, start=None, model=None, loss_fn=gpt_loss, init_model=init_gpt, shape=None):
    """The reference: the single-device GPT trained on the whole global batch of every step.

    A generator of (step, loss tensor). ``start``: a checkpoint.load_full() result to resume
    from (weights, optimizer state, step); otherwise fresh weights from ``opts.seed``.
    ``model``: a GPT to train in place (to read its weights afterwards); default a new one.
    ``loss_fn(gpt, x, y)``: the reference's loss; ``init_model``: how the model is built;
    ``shape``: the batches' (T, V), default the GPT config's (seq_len, vocab_size).
    """
    model = init_model(config, opts.seed, opts.torch_dtype) if model is None else model
    optimizer = make_optimizer(model.parameters(), opts)
    first = 0
    if start is not None:
        model.load_state_dict(start["model"])
        ckpt.load_optimizer_state_by_name(model, optimizer, start["optimizer"])
        first = start["step"]
    clip = None
    if getattr(opts, "clip_grad_norm", None) is not None:   # torch's own, on the whole model
        clip = lambda m: torch.nn.utils.clip_grad_norm_(m.parameters(), opts.clip_grad_norm)  # noqa: E731
    for step, (x, y) in batches(opts, shape or (config.seq_len, config.vocab_size), first):
        yield step, train_step(model, optimizer, x, y, run_batch=partial(forward_backward, loss_fn=loss_fn), clip=clip)


def steps_on_comm(opts, model, optimizer, shape, after_backward=None, clip=None):
    """Steps 0 .. opts.steps-1 on simulated ranks (dp = 1), batches of shape (T, V): a generator
    of (step, loss tensor). clip(model): after backward, before the optimizer step."""
    for step, (x, y) in batches(opts, shape):
        yield step, train_step(model, optimizer, x, y, after_backward=after_backward, clip=clip)
