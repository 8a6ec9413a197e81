"""Pipeline parallelism from point-to-point messages: the GPT split by depth over p stages.

    stage 0            stage 1                    stage p-1
    wte (+ wpe)        blocks[l1:l2]              blocks[..:n]
    blocks[0:l1]  --act-->  ...  --act-->         ln_f, LM head, loss
                  <--grad--      <--grad--

Each rank of the pipeline communicator ``comm`` (a tp_from_scratch.comm.Comm: the simulator,
TorchComm over gloo, or MPIComm) holds one stage: the embedding on the first, the final
norm, LM head and loss on the last, and the blocks split numpy.array_split style (the first
n_layers % p stages get one block more). A global batch (B, T) is cut into m micro-batches
along B; a schedule (schedules.py: GPipe or 1F1B) says in which order each stage runs them.

    forward    activations (B/m, T, H) go stage s -> s+1 with send/recv: no collective
    backward   their gradients (B/m, T, H) go s+1 -> s

Micro-batch i holds B_i of the B sequences, so its mean loss counts with weight B_i / B:
summed over micro-batches, losses and accumulated gradients equal the full batch's.
With tied embeddings the last stage keeps its own copy of wte for the LM head; after the
backwards, the first and last stages add each other's wte gradient (one send and one
recv each), so both copies take the same optimizer step and stay equal.

Tensor parallelism composes inside a stage: split the TP GPT (gpt_to_tp on the stage's TP
group) instead of the single-device one; activations between stages are then Replicated over the TP group
and every TP rank of a stage talks to the same TP rank of the next stage.

A ViT (gpt/vit.py, single-device or vit_to_tp's) splits the same way: its blocks are the
GPT's, only the ends differ. ``pieces_of`` says what each model keeps outside its blocks:

              first stage                          last stage                   between stages
    GPT       wte (+ wpe): token ids (B, T)        ln_f, LM head, loss (B, T)   (B/m, T, H)
    ViT       patch_embed, cls, pos: images        ln_f of the class token,     (B/m, P+1, H)
              (B, S, S)                            classifier, loss (B,)

Messages carry their shape and dtype, so a receiving stage needs neither T nor P+1.

Every rank builds the whole model and keeps its stage (simple, and the weights match one
device's by construction); a model too big for one rank would be built stage by stage.
"""
import time
from dataclasses import dataclass, field
from functools import partial

import numpy as np
import torch
import torch.nn as nn
import torch.nn.functional as F

from tp_from_scratch.gpt.model import GPT, embed
from tp_from_scratch.gpt.vit import ViT, classify, embed_patches
from tp_from_scratch.nn import copy_to_tp_region, vocab_parallel_cross_entropy
from tp_from_scratch.nn.collectives import numpy_to_tensor, tensor_to_numpy  # bfloat16 travels as float32
from tp_from_scratch.sharding import shard_range

from .schedules import OPS, bubble, check_sizes, schedule_for


def stage_layers(n_layers, stage, n_stages):
    """range of the blocks held by ``stage``: numpy.array_split of n_layers over n_stages."""
    check_sizes(n_stages, 1)
    return range(*shard_range(n_layers, stage, n_stages))


@dataclass(frozen=True)
class Pieces:
    """What a model keeps outside its blocks (attribute names) and how the pipeline's ends run."""
    first: tuple       # held by the first stage: the embedding
    last: tuple        # held by the last stage: final norm, head
    embed: object      # (first stage, inputs) -> activations (B, S, H)
    loss: object       # (last stage, activations (B, S, H), targets) -> mean loss
    tied: tuple = ()   # held by both ends, one weight: their gradients are summed


def gpt_loss(stage, x, targets, vocab_start=0):
    """Mean cross-entropy of the LM head on x (B, T, H) against targets (B, T); vocab-parallel under TP.

    vocab_start: the first vocabulary id of this TP rank's rows of the head.
    """
    h = stage.ln_f(x)
    head = stage.wte.weight if stage.config.tie_embeddings else stage.lm_head.weight  # (V or V/t, H)
    if stage.group is None:
        return F.cross_entropy(F.linear(h, head).flatten(0, 1), targets.flatten())
    logits = F.linear(copy_to_tp_region(stage.group, h), head)  # (B, T, V/t) Sharded(vocab)
    return vocab_parallel_cross_entropy(stage.group, logits.flatten(0, 1), targets.flatten(),
                                        vocab_start=vocab_start)


def vit_loss(stage, x, labels):
    """Mean cross-entropy of the classifier on the class token of x (B, P+1, H) against labels (B,).

    Norm and classifier are replicated and x is Replicated under TP: no collective here, and
    their gradients (and the first stage's) come out equal on every TP rank (check_pipeline).
    """
    return F.cross_entropy(classify(stage, x), labels)


def pieces_of(model, rank=0):
    """The Pieces of a GPT (single-device or parallelized) or ViT (TypeError for any other model)."""
    if isinstance(model, ViT):
        return Pieces(first=("patch", "patch_embed", "cls", "pos"), last=("ln_f", "head"),
                      embed=embed_patches, loss=vit_loss)
    if not isinstance(model, GPT):
        raise TypeError(f"rank {rank}: a pipeline stage splits a GPT (single-device or TP) or a ViT, "
                        f"got {type(model).__name__} (its forward is not the blocks' in order)")
    tied = model.config.tie_embeddings
    return Pieces(first=("wte", "wpe") if model.config.position == "learned" else ("wte",),
                  last=("ln_f", "wte" if tied else "lm_head"), embed=embed,
                  loss=partial(gpt_loss, vocab_start=getattr(model.wte, "vocab_start", 0)),
                  tied=("wte",) if tied else ())


class PipelineStage(nn.Module):
    """Stage ``comm.rank`` of ``comm.world_size``: the part of ``model`` it runs.

    ``model``: a GPT or a ViT (single-device, or gpt_to_tp's / vit_to_tp's); ``pieces_of``
    says what the first and last stages hold besides their blocks.
    Parameter names are the full model's ("blocks.3.mlp.fc.weight"), so a stage's
    parameters and gradients are compared with the single-device model by name.
    """

    def __init__(self, comm, model):
        super().__init__()
        self.pieces = pieces_of(model, comm.rank)
        self.comm, self.config = comm, model.config
        self.stage, self.n_stages = comm.rank, comm.world_size
        if self.config.n_layers < self.n_stages:  # a middle stage would hold nothing to train
            raise ValueError(f"rank {comm.rank}: {self.config.n_layers} blocks cannot fill "
                             f"{self.n_stages} pipeline stages (every stage needs at least one block)")
        self.is_first, self.is_last = self.stage == 0, self.stage == self.n_stages - 1
        self.group = getattr(model, "group", None)  # TP group inside the stage (None: one device)
        self.layers = stage_layers(self.config.n_layers, self.stage, self.n_stages)
        ends = (self.pieces.first if self.is_first else ()) + (self.pieces.last if self.is_last else ())
        for name, child in model.named_children():  # the full model's order: embedding, blocks, head
            if name == "blocks":
                self.blocks = nn.ModuleDict({str(i): child[i] for i in self.layers})
            elif name in ends:
                setattr(self, name, child)
        for name in ends:  # what is no module: the ViT's class token and positions, its patch size
            if not hasattr(self, name):
                setattr(self, name, getattr(model, name))

    def forward(self, x):
        """First stage: the model's input (token ids (B, T), images (B, S, S)); elsewhere the
        activations (B, S, H) of the previous stage -> this stage's activations (B, S, H)."""
        if self.is_first:
            x = self.pieces.embed(self, x)
        for block in self.blocks.values():
            x = block(x)
        return x

    def loss(self, x, targets):
        """Last stage: the model's mean loss on its activations x (B, S, H) against targets."""
        return self.pieces.loss(self, x, targets)


@dataclass
class StepResult:
    """What one pipelined forward-backward measured on this stage."""
    loss: float                     # the global batch's mean loss (sent to every stage)
    timeline: list                  # (op, mb, start, end) per action, perf_counter seconds
    peak_in_flight: int             # most micro-batches with saved activations at once
    peak_activation_bytes: int      # most bytes autograd held for them at once
    activation_bytes: list = field(default_factory=list)  # saved bytes per micro-batch


def _parameter_storages(module):
    return {p.untyped_storage().data_ptr() for p in module.parameters()}


class _Runner:
    """The state of one forward-backward on one stage: what each action needs and leaves."""

    def __init__(self, stage, idx, targets, n_micro):
        if idx.shape[0] < n_micro:
            raise ValueError(f"rank {stage.comm.rank}: a batch of {idx.shape[0]} sequences cannot "
                             f"be split into {n_micro} micro-batches")
        self.stage, self.comm = stage, stage.comm
        self.idx, self.targets = torch.tensor_split(idx, n_micro), torch.tensor_split(targets, n_micro)
        self.weight = [len(x) / len(idx) for x in self.idx]      # B_i / B
        self.like = next(stage.parameters())  # messages arrive in its dtype, on its device
        self.inputs, self.outputs, self.grads, self.input_grads = {}, {}, {}, {}
        self.loss = 0.0
        self.saved_bytes, self.live = {}, set()
        self.params = _parameter_storages(stage)

    def recv_act(self, mb):     # (B_i, T, H) (a ViT's: (B_i, P+1, H)); the leaf its grad lands on
        self.inputs[mb] = numpy_to_tensor(self.comm.recv(self.stage.stage - 1), self.like).requires_grad_()

    def forward(self, mb):
        counted = [0]

        def pack(t):  # count what autograd keeps for backward, weights aside
            if t.untyped_storage().data_ptr() not in self.params:
                counted[0] += t.numel() * t.element_size()
            return t
        with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
            y = self.stage(self.idx[mb] if self.stage.is_first else self.inputs[mb])
            if self.stage.is_last:
                y = self.stage.loss(y, self.targets[mb]) * self.weight[mb]
                self.loss += y.item()
        self.outputs[mb] = y
        self.saved_bytes[mb] = counted[0]
        self.live.add(mb)

    def send_act(self, mb):
        self.comm.send(tensor_to_numpy(self.outputs[mb]), self.stage.stage + 1)

    def recv_grad(self, mb):    # d loss / d (this stage's output of mb)
        self.grads[mb] = numpy_to_tensor(self.comm.recv(self.stage.stage + 1), self.like)

    def backward(self, mb):
        torch.autograd.backward(self.outputs.pop(mb), self.grads.pop(mb, None))
        self.live.discard(mb)
        if not self.stage.is_first:
            self.input_grads[mb] = self.inputs.pop(mb).grad

    def send_grad(self, mb):
        self.comm.send(tensor_to_numpy(self.input_grads.pop(mb)), self.stage.stage - 1)


def forward_backward(stage, idx, targets, n_micro, schedule="1f1b"):
    """Run one pipelined forward and backward of the batch (idx, targets) on this stage.

    idx, targets (B, T): the same global batch on every stage (the first reads idx, the
    last targets); for a ViT, images (B, S, S) and labels (B,). Gradients are accumulated
    into the stage's .grad (zero them first), summed over micro-batches with weights B_i / B,
    so they equal one device's on the whole batch.
    schedule: "gpipe", "1f1b", or a list of per-stage programs of schedules.Action.
    Point to point only: activations forward, gradients backward, then the tied embedding's
    gradient between the first and last stage and the loss from the last stage to all.
    """
    program = schedule_for(schedule, stage.n_stages, n_micro)[stage.stage]
    run = _Runner(stage, idx, targets, n_micro)
    timeline, peak, peak_bytes = [], 0, 0
    for op, mb in program:
        if op not in OPS:
            raise ValueError(f"rank {stage.comm.rank}: unknown action {op!r} (expected one of {OPS})")
        start = time.perf_counter()  # CLOCK_MONOTONIC: one clock for all processes of a machine
        getattr(run, op)(mb)
        timeline.append((op, mb, start, time.perf_counter()))
        peak = max(peak, len(run.live))
        peak_bytes = max(peak_bytes, sum(run.saved_bytes[i] for i in run.live))
    sync_tied_embedding_grad(stage)
    loss = share_loss(stage, run.loss)
    return StepResult(loss, timeline, peak, peak_bytes, [run.saved_bytes[i] for i in range(n_micro)])


def sync_tied_embedding_grad(stage):
    """First and last stage add each other's gradient of the tied wte (a two-rank all-reduce)."""
    if stage.n_stages == 1 or not (stage.is_first or stage.is_last):
        return
    peer = stage.n_stages - 1 if stage.is_first else 0
    for name in stage.pieces.tied:
        grad = getattr(stage, name).weight.grad
        stage.comm.send(tensor_to_numpy(grad), peer)
        other = numpy_to_tensor(stage.comm.recv(peer), grad)
        grad += other  # a + b on one stage, b + a on the other: the same bits


def share_loss(stage, loss):
    """The last stage's loss, sent to every other stage of the pipeline."""
    last = stage.n_stages - 1
    if stage.is_last:
        for s in range(last):
            stage.comm.send(np.array(loss), s)
        return loss
    return float(stage.comm.recv(last))


def train_step(stage, optimizer, idx, targets, n_micro, schedule="1f1b"):
    """zero_grad, forward_backward, optimizer.step: one training step; returns the StepResult."""
    optimizer.zero_grad(set_to_none=True)
    result = forward_backward(stage, idx, targets, n_micro, schedule)
    optimizer.step()
    return result


def gather_timelines(comm, timeline):
    """Every stage's timeline on stage 0 (a list per stage), None elsewhere: for ``bubble``."""
    codes = np.array([(OPS.index(op), mb, start, end) for op, mb, start, end in timeline], dtype=np.float64)
    if comm.rank != 0:
        comm.send(codes, 0)
        return None
    rows = [codes] + [comm.recv(s) for s in range(1, comm.world_size)]
    return [[(OPS[int(o)], int(mb), a, b) for o, mb, a, b in r] for r in rows]


def measured_bubble(comm, timeline):
    """``schedules.bubble`` of the timed run on stage 0 (None on the other stages)."""
    timelines = gather_timelines(comm, timeline)
    return None if timelines is None else bubble(timelines)
