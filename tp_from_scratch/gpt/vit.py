"""A tensor-parallel vision transformer: the GPT's Block on image patches, trained on digits.

    .venv/bin/python -m tp_from_scratch.gpt.vit                      # one device
    .venv/bin/torchrun --standalone --nproc-per-node 2 -m tp_from_scratch.gpt.vit --compare-single
    # where TP and one device part: t=2 on simulated ranks, against a one-ulp perturbation
    .venv/bin/python -m tp_from_scratch.gpt.vit --drift lessons/measurements/vit_drift_float32.json --steps 300

Nothing in the TP layers knows about language. The ViT is the same Block (the same plan turns
it into the same column and row layers, the same f and g) with three changes around it:

    image (B, 8, 8) --patches--> (B, P, p*p) --patch embedding--> (B, P, H)
    prepend a class token, add learned positions    -> (B, P+1, H)   Replicated
    blocks with causal=False (every patch sees every patch)
    final norm, the class token's vector -> classifier (H -> 10 classes) -> cross-entropy

The patch embedding, class token, positions and classifier are replicated, not split: each
is tiny (p*p*H, H, (P+1)*H and 10*H numbers), and a column-parallel patch embedding would
produce a Sharded(H) output that needs an all-gather before the residual stream, whose
every block expects it Replicated: communication to save a few kilobytes. Their gradients
are full on every rank already (the residual stream's gradient is Replicated once f's
backward all-reduce has run), as for the GPT's position embedding.

Training: AdamW, batch 64, 50 warm-up steps then cosine decay from lr 1e-3, 1,200 steps;
test accuracy 98.6% (one device), 98.1% (t = 2), 98.3% (t = 4), float32. One-pixel random shifts
as augmentation made it worse (93.3% at one device), so there are none.

Long runs: every step's loss equals one device's within the tolerance until roundoff, amplified
by training, outgrows it (``--drift``, t = 2: steps 0-119 in float32, 0-249 in float64; under
torchrun with ``--compare-single``, float32: 0-119 at t = 2, 0-99 at t = 4). A
single-device run whose initial weights are moved by one ulp parts from the reference the same
way (at steps 159 and 274), its weight differences growing at the same rate (float64: tenfold
every 40-100 steps for both), so this is not TP computing something else. Each step multiplies
the previous difference, and AdamW, which divides every gradient element by its own running
size, turns the rounding error of elements that are small next to the sums they came from into
visible updates from the first step on. After that the runs are two equally good trainings, with
close but not identical accuracies. ``--compare-single`` reports the last equal step.

Data: scikit-learn's 8x8 handwritten digits (1,797 images, shipped inside the package, no
download), pixel values / 16, a fixed seeded split of 360 test images.
"""
import argparse
import math
from pathlib import Path

import torch
import torch.nn as nn
import torch.nn.functional as F

from tp_from_scratch.gpt import optim
from tp_from_scratch.gpt.model import Block, GPTConfig, init_weights, make_norm
from tp_from_scratch.gpt.options import divides, first_problem, parse_valid_args, positive
from tp_from_scratch.gpt.parallelize import gather_state_dict, gpt_to_tp
from tp_from_scratch.gpt.step import train_step
from tp_from_scratch.nn.mappings import tp_rank

N_CLASSES = 10
LR = 1e-3          # the peak learning rate of train_vit's schedule
STEPS = 1200       # the command line's default length (about 55 epochs of 1,437 training images)


def vit_config(hidden=64, n_heads=4, n_layers=2, ffn=128):
    """Block sizes of the ViT (vocab_size and seq_len are unused by it)."""
    return GPTConfig(vocab_size=N_CLASSES, seq_len=17, n_layers=n_layers, hidden=hidden, n_heads=n_heads,
                     n_kv_heads=n_heads, ffn=ffn, causal=False, gelu="erf")


class ViT(nn.Module):
    """forward(images (B, 8, 8), labels (B,) or None) -> (logits (B, 10), mean loss or None).

    The single-device model; ``vit_to_tp`` applies the GPT's plan to it: the blocks' heads and
    ffn split, everything the plan does not name (outside the blocks) replicated.
    """

    def __init__(self, config, patch=2, image=8, *, dtype=torch.float32):
        super().__init__()
        config.validate(1)
        self.config, self.patch = config, patch
        n_patches = (image // patch) ** 2
        local = dict(dtype=dtype)
        self.patch_embed = nn.Linear(patch * patch, config.hidden, **local)      # replicated
        self.cls = nn.Parameter(torch.zeros(1, 1, config.hidden, **local))       # replicated
        self.pos = nn.Parameter(torch.zeros(n_patches + 1, config.hidden, **local))
        self.blocks = nn.ModuleList(Block(config).to(**local) for _ in range(config.n_layers))
        self.ln_f = make_norm(config, **local)
        self.head = nn.Linear(config.hidden, N_CLASSES, **local)                 # replicated

    def forward(self, images, labels=None):
        x = embed_patches(self, images)                                 # (B, P+1, H)
        for block in self.blocks:
            x = block(x)
        logits = classify(self, x)                                      # (B, 10) Replicated
        if labels is None:
            return logits, None
        return logits, F.cross_entropy(logits, labels)


def embed_patches(model, images):
    """images (B, S, S) -> (B, P+1, H): the class token, then the embedded patches; plus positions.

    ``model``: anything holding ``patch``, ``patch_embed``, ``cls`` and ``pos`` (the ViT, or the
    first stage of a pipeline).
    """
    B, S, _ = images.shape
    p = model.patch
    patches = images.reshape(B, S // p, p, S // p, p).transpose(2, 3).reshape(B, -1, p * p)  # (B, P, p*p)
    x = model.patch_embed(patches)                                  # (B, P, H)
    return torch.cat([model.cls.expand(B, 1, -1), x], dim=1) + model.pos  # (B, P+1, H)


def classify(model, x):
    """x (B, P+1, H) -> logits (B, 10): final norm of the class token's vector, then the classifier.

    ``model``: anything holding ``ln_f`` and ``head`` (the ViT, or the last stage of a pipeline).
    """
    return model.head(model.ln_f(x[:, 0]))


def init_vit(config, seed, dtype=torch.float32):
    """A single-device ViT with reproducible N(0, 0.02) weights, zero biases, unit norms."""
    return init_weights(ViT(config, dtype=dtype), seed, lambda name: 0.02)


def vit_to_tp(group, model):
    """This rank's TP ViT holding its shard of ``model``'s weights: the GPT's plan (its blocks'
    entries; patch embedding, class token, positions and classifier are not in it, so they stay
    whole) applied to a copy. No communication."""
    return gpt_to_tp(group, model)


def digits(seed=0, n_test=360):
    """(train images (N, 8, 8), train labels, test images, test labels) of sklearn's digits."""
    from sklearn.datasets import load_digits
    data = load_digits()
    images = torch.tensor(data.images, dtype=torch.float64) / 16.0
    labels = torch.tensor(data.target, dtype=torch.int64)
    order = torch.randperm(len(labels), generator=torch.Generator().manual_seed(seed))
    test, train = order[:n_test], order[n_test:]
    return images[train], labels[train], images[test], labels[test]


def batch(step, batch_size, n, seed):
    """Indices of step's minibatch: a fresh seeded permutation every epoch."""
    per_epoch = n // batch_size
    epoch, i = divmod(step, per_epoch)
    order = torch.randperm(n, generator=torch.Generator().manual_seed(seed * 100_003 + epoch))
    return order[i * batch_size:(i + 1) * batch_size]


def learning_rate(step, steps, lr, warmup=50):
    """Linear warm-up over ``warmup`` steps, then cosine decay to 0 at ``steps``."""
    return lr * min(1.0, (step + 1) / warmup) * 0.5 * (1 + math.cos(math.pi * step / steps))


def make_optimizer(model, lr=LR, weight_decay=0.0):
    return optim.AdamW(model.parameters(), lr=lr, betas=(0.9, 0.95), weight_decay=weight_decay)


def vit_step(model, optimizer, step, steps, data, batch_size=64, lr=LR, seed=0):
    """Lesson 6's training step (gpt.step.train_step) at step ``step`` of a ``steps``-step run
    (the learning rate warms up, then decays as a cosine); returns the loss."""
    x_train, y_train, _, _ = data
    for group in optimizer.param_groups:
        group["lr"] = learning_rate(step, steps, lr)
    idx = batch(step, batch_size, len(y_train), seed)
    return train_step(model, optimizer, x_train[idx].to(next(model.parameters()).dtype), y_train[idx]).item()


def train_vit(model, steps, data, batch_size=64, lr=LR, seed=0, weight_decay=0.0):
    """AdamW steps on the digits; returns the list of per-step losses (Python floats)."""
    optimizer = make_optimizer(model, lr, weight_decay)
    return [vit_step(model, optimizer, step, steps, data, batch_size, lr, seed) for step in range(steps)]


def drift(group, config, steps, data, dtype, seed=0, total_steps=STEPS):
    """Where TP and single-device training part, and whether TP is to blame (collective on ``group``).

    Follows the first ``steps`` steps of a ``total_steps``-step run (its learning-rate schedule).

    Trains three ViTs in lockstep: this rank's TP model, and on rank 0 the single-device model and
    a single-device copy whose initial weights are moved by about one unit in the last place
    (w * (1 + eps * N(0, 1))). Returns on rank 0 one row per step: the relative loss difference of
    TP and of the perturbed copy from the single-device run, and the largest weight difference of
    each relative to the largest weight of that parameter (TP weights gathered). If the perturbed
    copy parts from the reference like TP does, the parting is roundoff amplified by training,
    not something TP computes differently.
    """
    rank = tp_rank(group)
    eps = torch.finfo(dtype).eps
    models = [vit_to_tp(group, init_vit(config, seed, dtype))]
    if rank == 0:
        models += [init_vit(config, seed, dtype), init_vit(config, seed, dtype)]
        noise = torch.Generator().manual_seed(seed + 1)
        with torch.no_grad():
            for p in models[2].parameters():
                p.mul_(1 + eps * torch.randn(p.shape, generator=noise, dtype=dtype))
    optimizers = [make_optimizer(m) for m in models]
    rows = []
    for step in range(steps):
        losses = [vit_step(m, o, step, total_steps, data, seed=seed) for m, o in zip(models, optimizers)]
        tp_weights = gather_state_dict(group, {n: p.detach() for n, p in models[0].named_parameters()}, config)
        if rank == 0:
            ref = dict(models[1].named_parameters())
            weights = [tp_weights, dict(models[2].named_parameters())]
            rows.append({"step": step, "loss": losses[1],
                         "loss_diff_tp": abs(losses[0] - losses[1]) / max(1.0, abs(losses[1])),
                         "loss_diff_perturbed": abs(losses[2] - losses[1]) / max(1.0, abs(losses[1])),
                         **{f"weight_diff_{which}": max(((w[n] - r).abs().max() / r.abs().max()).item()
                                                        for n, r in ref.items())
                            for which, w in zip(("tp", "perturbed"), weights)}})
    return rows


@torch.no_grad()
def accuracy(model, images, labels):
    logits, _ = model(images.to(next(model.parameters()).dtype))
    return (logits.argmax(dim=-1) == labels).double().mean().item()


def write_drift(path, steps, dtype, seed):
    """Run drift at t = 2 on simulated ranks, write its rows as JSON, print where each run parts."""
    import json
    from tp_from_scratch.comm import run_spmd
    from tp_from_scratch.compare import TOLERANCE
    data, config = digits(seed), vit_config()
    rows = run_spmd(lambda comm: drift(comm, config, steps, data, dtype, seed), 2, timeout=600)[0]
    tol = TOLERANCE[str(dtype).removeprefix("torch.")]
    first = {which: next((r["step"] for r in rows if r[f"loss_diff_{which}"] > tol), None)
             for which in ("tp", "perturbed")}
    record = {"command": f".venv/bin/python -m tp_from_scratch.gpt.vit --drift {path} --steps {steps} --dtype "
                         f"{str(dtype).removeprefix('torch.')} --seed {seed}",
              "schedule_steps": STEPS, "tolerance": tol, "first_step_beyond_tolerance": first, "rows": rows}
    Path(path).parent.mkdir(parents=True, exist_ok=True)
    Path(path).write_text(json.dumps(record, indent=0))
    print(f"{dtype}, the first {steps} steps of the {STEPS}-step run: the loss first differs beyond {tol:.0e} "
          f"at step {first['tp']} (TP, t=2) and at step "
          f"{first['perturbed']} (one device, weights moved by one ulp); {path}")
    return 0


def validate(args, world):
    """The first problem with the command line for ``world`` processes, as a sentence; None if fine."""
    heads = vit_config().n_heads
    problem = first_problem(positive("--steps", args.steps), positive("--equal-steps", args.equal_steps),
                            divides("the world size", world, heads, "the ViT's heads"))
    if problem is None and args.compare_single and world == 1 and not args.drift:
        problem = "--compare-single compares TP with one device: launch 2 or more processes with torchrun"
    return problem


def main(argv=None):
    p = argparse.ArgumentParser(prog="python -m tp_from_scratch.gpt.vit", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--steps", type=int, default=STEPS)
    p.add_argument("--dtype", choices=["float32", "float64"], default="float32")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--compare-single", action="store_true", help="rank 0 also trains on one device")
    p.add_argument("--equal-steps", type=int, default=50, metavar="N",
                   help="with --compare-single: exit 1 only if one of the first N steps differs from one device's")
    p.add_argument("--drift", metavar="JSON", help="measure where TP (t=2, simulated ranks) and one device "
                   "part, against a one-ulp perturbation of the weights (see drift); write the rows here")
    args = parse_valid_args(p, validate, argv)
    if args.drift:
        return write_drift(args.drift, args.steps, getattr(torch, args.dtype), args.seed)
    from tp_from_scratch.comm.launch import torch_main
    torch_main(lambda: train_and_compare(args))


def train_and_compare(args):
    """Train on this world's ranks (t = the world size); with --compare-single rank 0 trains one
    device too and prints the trainers' verdict (gpt.train.Comparison); returns the exit status."""
    import torch.distributed as dist
    world, rank, dtype = dist.get_world_size(), dist.get_rank(), getattr(torch, args.dtype)
    group = dist.group.WORLD if world > 1 else None
    data, config = digits(args.seed), vit_config()
    single = init_vit(config, args.seed, dtype)
    model = single if group is None else vit_to_tp(group, init_vit(config, args.seed, dtype))
    losses = train_vit(model, args.steps, data, seed=args.seed)
    acc = accuracy(model, data[2], data[3])
    if rank != 0:
        return 0
    print(f"ViT tp={world}: {args.steps} steps, final loss {losses[-1]:.4f}, test accuracy {acc:.2%} "
          f"({len(data[3])} images)", flush=True)
    if not (args.compare_single and group is not None):
        return 0
    from tp_from_scratch.gpt.train import Comparison
    ref = train_vit(single, args.steps, data, seed=args.seed)
    comparison = Comparison(enumerate(torch.tensor(r, dtype=dtype) for r in ref), args.dtype, config.n_layers,
                            args.steps, args.equal_steps)
    for step, loss in enumerate(losses):
        comparison.check(step, torch.tensor(loss, dtype=dtype))
    largest = max(abs(a - b) / max(1.0, abs(b)) for a, b in zip(losses, ref))
    print(f"single device: final loss {ref[-1]:.4f}, test accuracy {accuracy(single, data[2], data[3]):.2%}; "
          f"largest relative difference of a step's loss {largest:.1e}", flush=True)
    print("\n".join(comparison.lines()), flush=True)
    return 1 if comparison.failed else 0

if __name__ == "__main__":
    main()
