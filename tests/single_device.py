"""Test-only helpers: the single-device reference run of a trainer command line.

The trainer's own reference is tp_from_scratch.gpt.step.single_device_run; these wrap it the
way the tests ask for it (a command line in, losses or final weights out).
"""
from tp_from_scratch.gpt import checkpoint as ckpt
from tp_from_scratch.gpt.model import init_gpt
from tp_from_scratch.gpt.step import single_device_run
from tp_from_scratch.gpt.train import parse



def single_device_weights(argv):
    """The single-device GPT's state dict after training with the command line ``argv``."""
    opts = parse(argv)
    config = opts.model
    model = init_gpt(config, opts.seed, opts.torch_dtype)
    for _ in single_device_run(config, opts, model=model):
        pass
    return model.state_dict()


def single_device_losses(argv, start=None):
    """[loss per step] of the single-device reference for the same command line as the trainer."""
    opts = parse(argv)
    full = ckpt.load_full(opts.load, opts.model) if opts.load and start is None else start
    return [loss for _, loss in single_device_run(opts.model, opts, full)]


def layers_of(argv):
    """The number of transformer blocks the command line ``argv`` trains: the tolerance's depth."""
    return parse(argv).model.n_layers


def lr_of(argv):
    """The learning rate the command line ``argv`` trains with (the optimizer's default if unset)."""
    return parse(argv).learning_rate
