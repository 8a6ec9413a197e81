"""Test-only helpers: the single-device reference run of a trainer command line.

The trainer's own reference is tp_from_scratch.gpt.train.single_device_run; these wrap it the
way the tests ask for it (a command line in, losses or final weights out).
"""
from tp_from_scratch.gpt import checkpoint as ckpt
from tp_from_scratch.gpt.model import init_gpt
from tp_from_scratch.gpt.train import build_parser, config_from_args, default_lr, single_device_run

import torch


def single_device_weights(argv):
    """The single-device GPT's state dict after training with the command line ``argv``."""
    args = build_parser().parse_args(list(argv))
    config = config_from_args(args)
    model = init_gpt(config, args.seed, getattr(torch, args.dtype))
    for _ in single_device_run(config, args, model=model):
        pass
    return model.state_dict()


def single_device_losses(argv, start=None):
    """[loss per step] of the single-device reference for the same command line as the trainer."""
    args = build_parser().parse_args(list(argv))
    full = ckpt.load_full(args.load, config_from_args(args)) if args.load and start is None else start
    return [loss for _, loss in single_device_run(config_from_args(args), args, full)]


def layers_of(argv):
    """The number of transformer blocks the command line ``argv`` trains: the tolerance's depth."""
    return config_from_args(build_parser().parse_args(list(argv))).n_layers


def lr_of(argv):
    """The learning rate the command line ``argv`` trains with (the optimizer's default if unset)."""
    return default_lr(build_parser().parse_args(list(argv)))
