"""What a later lesson changes in this lesson's run (gpt/train.py), and what the run asks of a model.

    ModelKind   the model trained: how it is built, cut into checkpoints, described, sized
    Hooks       a later lesson's parts of the run: its model, its parallel model (or the whole
                build), its step, its single-device reference, its metrics and last words

Each later lesson's trainer passes the few it changes (its docstring says which); the loop, the
data, the checkpoints, the report and the single-device verdict stay this lesson's.
"""
from dataclasses import dataclass, field
from typing import Callable, Optional

from tp_from_scratch.gpt import checkpoint as ckpt
from tp_from_scratch.gpt.clip import gpt_placement
from tp_from_scratch.gpt.model import init_gpt
from tp_from_scratch.gpt.step import gpt_loss, train_step


@dataclass(frozen=True)
class ModelKind:
    """What the trainer asks of the model it trains (Lesson 6: the GPT; a later lesson's own).

    init(config, seed, dtype): the single-device model every rank starts from (and the
    reference trains); sharding: how checkpoints cut and glue it (checkpoint.GPTSharding's
    methods); description: what its checkpoints hold and loaders check (default
    checkpoint.model_description(config)); meta: more entries for their metadata;
    placement(config, tp): name -> the groups each parameter is split over (gpt/clip.py), which
    --clip-grad-norm reads to count every distinct piece of the gradient once.
    """
    name: str = "GPT"
    init: Callable = init_gpt
    sharding: object = ckpt.GPT_SHARDING
    description: Optional[dict] = None
    meta: dict = field(default_factory=dict)
    placement: Callable = gpt_placement

    def layers(self, config):
        """The depth the tolerance policy counts (compare.tolerance)."""
        return config.n_layers

    def shape(self, config):
        """(T, V) of the batches it trains on."""
        return config.seq_len, config.vocab_size

    def checkpoint_description(self, config):
        """What this model's checkpoints of ``config`` hold (description, default the GPT's)."""
        return self.description or ckpt.model_description(config)

    def sizes(self, config):
        """The sizes line of the run's first report."""
        return (f"{config.n_layers} layers, H={config.hidden}, nh={config.n_heads}, nkv={config.n_kv_heads}, "
                f"F={config.ffn}, V={config.vocab_size}, T={config.seq_len}")


@dataclass(frozen=True)
class Hooks:
    """A later lesson's changes to Lesson 6's run; every field is optional.

    model: what the model is (ModelKind). parallelize(full, group): the model this rank trains
    from the single-device one (default gpt_to_tp, or the DTensor plan for --impl dtensor);
    build(opts, mesh, group) -> (model, optimizer): both, instead (say DDP, ZeRO or a pipeline;
    no --load). step: THE step with some parts changed (train_step's signature).
    reference: (name, loss(gpt, x, y)) of the single-device reference (say, t streams).
    metrics(group, counter): before a step; returns a function giving more fields for its
    record. finish(mesh, group, counter, n_steps): every rank, after the report.
    """
    model: ModelKind = ModelKind()
    parallelize: Optional[Callable] = None
    build: Optional[Callable] = None
    step: Callable = train_step
    reference: tuple = ("single-device", gpt_loss)
    metrics: Optional[Callable] = None
    finish: Optional[Callable] = None
