"""DeepSeek-V3's training checkpoints: Lesson 6's files (gpt/checkpoint.py: atomic, checksummed,
resharded on load) with this model's cut and its own description.

A checkpoint root written by ``deepseek.train --save DIR`` or ``deepseek.convert import`` holds
one shard per rank, ``meta.json`` with the model's config (transformers' DeepseekV3 fields, what
config.json holds), the layout it was saved in, and the description
``{"family": "deepseek_v3", ...}``: Lesson 6's loaders refuse it naming Lesson 12's commands,
and these loaders refuse a GPT's. A checkpoint saved at t ranks in one layout loads at any
other t and layout: every tensor is glued back with ``arch.unshard`` (the saved layout's plan) and
cut again with ``arch.shard`` (the loading one's); AdamW's moments go the same way.

    DeepSeekSharding(layout)             the cut, for gpt/checkpoint.py's functions and Hooks.sharding
    DESCRIPTION                          what every Lesson 12 loader expects
    write(root, config, state, layout, tp=1)   a checkpoint of a full state dict (the import)
    load(root, sharding)                 the whole checkpoint: {"config", "model", "meta", ...}
"""
import torch

from tp_from_scratch.gpt import checkpoint as ckpt

from .arch import shard, unshard
from .model import MODEL_LAYOUTS, config_from_hf

DESCRIPTION = {"family": "deepseek_v3", "arch": "deepseek_v3", "partial_sync": None}
PREFIX = "model."   # the trainer's CausalLM holds the model as .model


def _ours(name):
    """A trainer state-dict name -> ParallelDeepseekV3's (model.layers.0... -> layers.0...)."""
    return name[len(PREFIX):] if name.startswith(PREFIX) else name


class DeepSeekSharding(ckpt.GPTSharding):
    """gpt/checkpoint.py's three methods for DeepSeek-V3: configs are DeepseekConfig, tensors are
    cut for ``layout`` (one of model.MODEL_LAYOUTS) and glued from the layout the checkpoint
    records."""

    def __init__(self, layout="experts on all tokens"):
        if layout not in MODEL_LAYOUTS:
            raise ValueError(f"layout {layout!r} is not one of {MODEL_LAYOUTS}")
        self.layout = layout

    def config_of(self, meta_config):
        return config_from_hf({**meta_config, "model_type": "deepseek_v3"})

    def shard(self, name, full, tp, rank, config):
        return shard(_ours(name), full, self.layout, tp, rank)

    def unshard(self, name, pieces, meta):
        layout = meta.get("layout")
        if layout not in MODEL_LAYOUTS:
            raise ckpt.CheckpointError(f"checkpoint metadata records layout {layout!r}, not one of {MODEL_LAYOUTS}")
        return unshard(_ours(name), pieces, layout)


def write(root, config, state, layout="experts on all tokens", tp=1, step=0, extra=None):
    """Write the full state dict ``state`` (trainer names, model.…) of ``config`` as a checkpoint
    of ``tp`` shards in ``layout`` under ``root`` (atomically, as the trainer's saves); its meta."""
    sharding = DeepSeekSharding(layout)
    name = ckpt.new_checkpoint_name(step)
    records = [ckpt.write_shard(root, name, r, tp, {k: sharding.shard(k, v, tp, r, config) for k, v in state.items()})
               for r in range(tp)]
    return ckpt.commit(root, name, config, tp, step, records, {"layout": layout, **(extra or {})},
                       description=DESCRIPTION)


def load(root, sharding=None, config=None):
    """gpt/checkpoint.py's load_full for DeepSeek-V3: the whole model, whatever t and layout it
    was saved in; a GPT's checkpoint is refused by name."""
    return ckpt.load_full(root, config, DESCRIPTION, sharding or DeepSeekSharding())


def state_from_model(model):
    """The trainer's full state-dict names for a one-rank ParallelDeepseekV3."""
    return {PREFIX + k: v.detach().clone() for k, v in model.state_dict().items()}


def model_state(state):
    """ParallelDeepseekV3's names from the trainer's (the inverse of state_from_model)."""
    return {_ours(k): v for k, v in state.items() if torch.is_tensor(v)}
