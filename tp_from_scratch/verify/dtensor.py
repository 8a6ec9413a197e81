"""PyTorch's own tensor parallelism (DTensor's ColwiseParallel / RowwiseParallel) as an Adapter.

    .venv/bin/torchrun --standalone --nproc-per-node 2 -m tp_from_scratch.verify tp_from_scratch.verify.dtensor:ADAPTER

Each factory deep-copies the single-device module and shards it in place with
parallelize_module over a 1-D DeviceMesh made from the group:

    column     ColwiseParallel(output_layouts=Shard(-1), or Replicate() for gather_output)
    row        RowwiseParallel(input_layouts=Shard(-1), or Replicate() when the input is whole)
    embedding  RowwiseParallel(input_layouts=Replicate()) on nn.Embedding (rows of the table)
    cross_entropy  F.cross_entropy on Shard(-1) logits inside loss_parallel()
    sp_layernorm   SequenceParallel() on nn.LayerNorm (input and output Shard(1))
    sp_block       SequenceParallel on the LayerNorm, ColwiseParallel(input_layouts=Shard(1))
                   on fc1, RowwiseParallel(output_layouts=Shard(1)) on fc2: PyTorch's SP plan

DTensor splits like torch.chunk (blocks of ceil(n/t)), so the layout is chunk_range. It needs
a torch ProcessGroup (no simulated ranks), and has no stand-alone f / g mappings.

"uneven" is not declared: DTensor.from_local, which RowwiseParallel applies to a Shard(-1)
input (and this adapter to the cross-entropy's logits), takes the global size to be t times
the local one unless told the shape, so a row layer fed shards of 5 and 4 fails
("a and b must have same reduction dim") and the loss over 7 + 6 logits comes out wrong.
"""
import copy

import torch
from torch.distributed.device_mesh import DeviceMesh
from torch.distributed.tensor import DTensor, Replicate, Shard
from torch.distributed.tensor.parallel import (ColwiseParallel, RowwiseParallel, SequenceParallel,
                                               loss_parallel, parallelize_module)
from torch.nn import functional as F

from tp_from_scratch.verify.adapter import Adapter, chunk_range


def _mesh(group, module):
    return DeviceMesh.from_group(group, next(module.parameters()).device.type)


def column(group, linear, gather_output=False):
    layer = copy.deepcopy(linear)
    style = ColwiseParallel(output_layouts=Replicate() if gather_output else Shard(-1))
    return parallelize_module(layer, _mesh(group, layer), style)


def row(group, linear, input_is_parallel=True):
    layer = copy.deepcopy(linear)
    style = RowwiseParallel(input_layouts=Shard(-1) if input_is_parallel else Replicate())
    return parallelize_module(layer, _mesh(group, layer), style)


def embedding(group, table):
    layer = copy.deepcopy(table)
    return parallelize_module(layer, _mesh(group, layer), RowwiseParallel(input_layouts=Replicate()))


class _LossParallel(torch.autograd.Function):
    """loss_parallel's forward and backward both need its context: run both in forward, keep dZ."""

    @staticmethod
    def forward(ctx, group, local_logits, target, ignore_index):
        mesh = DeviceMesh.from_group(group, local_logits.device.type)
        with torch.enable_grad(), loss_parallel():
            leaf = local_logits.detach().requires_grad_()
            z = DTensor.from_local(leaf, mesh, [Shard(-1)])
            loss = F.cross_entropy(z.flatten(0, -2), target.flatten(), ignore_index=ignore_index)
            loss.backward()
        ctx.save_for_backward(leaf.grad)
        return loss.full_tensor().detach()

    @staticmethod
    def backward(ctx, grad_loss):
        dz, = ctx.saved_tensors
        return None, dz * grad_loss, None, None


def cross_entropy(group, local_logits, target, ignore_index, vocab_start):
    return _LossParallel.apply(group, local_logits, target, ignore_index)


def sp_layernorm(group, norm):
    layer = copy.deepcopy(norm)
    return parallelize_module(layer, _mesh(group, layer), SequenceParallel(use_local_output=True))


def sp_block(group, block):
    layer = copy.deepcopy(block)
    plan = {"ln": SequenceParallel(), "fc1": ColwiseParallel(input_layouts=Shard(1)),
            "fc2": RowwiseParallel(output_layouts=Shard(1))}
    return parallelize_module(layer, _mesh(group, layer), plan)


ADAPTER = Adapter(name="pytorch DTensor", column=column, row=row, embedding=embedding,
                  cross_entropy=cross_entropy, layout=chunk_range,
                  sp_layernorm=sp_layernorm, sp_block=sp_block,
                  supports={"gather_output", "scatter_input", "padding_idx", "ignore_index"})
