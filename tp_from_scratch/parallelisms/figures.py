"""Lesson 11's pictures: what each rank holds under each parallelism, and the pipeline's timelines.

    holdings(config, dp, pp, tp, zero)          per rank, per part of the model (embeddings, each
                                                block, final norm / head): the share of its weights,
                                                gradients and optimizer state the rank holds
    draw_holdings(config, dp, pp, tp, zero)     one panel per rank; three bars per part: W, G, O,
                                                in the rank's colour (plots.device_color)

Each bar spans the part's elements, 0 to 1. TP draws the rank's slice of every block (the
replicated norms and row biases, a few hundred numbers, are not drawn); PP leaves the other
stages' blocks empty; ZeRO draws, of the parameters flattened in model order and cut into dp
chunks (parallelisms/zero.py), the part of this rank's chunk falling in each part: the optimizer
state for ZeRO-1, and the gradients too for ZeRO-2.

The pipeline:

    draw_timeline(ax, timelines, title)       one row per stage: forward and backward boxes
    draw_schedules(p, m)                      GPipe and 1F1B on an ideal clock, one above the other

A box is one micro-batch's forward (light) or backward (dark) on one stage, labelled with
the micro-batch; the white gaps are the bubble. Micro-batch i is drawn in device_color(i),
so one micro-batch can be followed down the pipeline and back.
"""
import matplotlib.pyplot as plt
from matplotlib.patches import Rectangle

from tp_from_scratch.gpt.inventory import parameters
from tp_from_scratch.parallelisms.cost import stage_blocks
from tp_from_scratch.gpt.mesh import rank_of
from tp_from_scratch.parallelisms.schedules import bubble, bubble_formula, gpipe, in_flight, one_f_one_b, simulate
from tp_from_scratch.parallelisms.zero import chunk_bounds
from tp_from_scratch.plots import EMPTY_COLOR, device_color


def parts(config, pp=1, stage=0, t=1, tp_rank=0):
    """[(name, local elements)] of a rank's parameters in model (= flattening) order; None for a
    part this stage does not hold."""
    tensors = parameters(config)
    first, last = stage == 0, stage == pp - 1
    start = sum(stage_blocks(config.n_layers, s, pp) for s in range(stage))
    mine = range(start, start + stage_blocks(config.n_layers, stage, pp))

    def count(names):
        return sum(p.count(t, tp_rank) for p in tensors if p.name in names)
    block = sum(p.count(t, tp_rank) // p.copies for p in tensors
                if not p.name.startswith(("wte", "wpe", "ln_f", "lm_head")))
    tied_here = last and config.tie_embeddings
    out = [("embeddings", count({"wte.weight", "wpe.weight"}) if first else
            count({"wte.weight"}) if tied_here else None)]
    out += [(f"block {i}", block if i in mine else None) for i in range(config.n_layers)]
    out.append(("norm, head", count({"ln_f.weight", "ln_f.bias", "lm_head.weight"}) if last else None))
    return out


def holdings(config, dp=1, pp=1, tp=1, zero=0):
    """{rank: [(part, W range, G range, O range)]}: ranges (lo, hi) within [0, 1], or None."""
    out = {}
    for d in range(dp):
        for s in range(pp):
            for i in range(tp):
                rank, rows = rank_of(d, s, i, dp, pp, tp), []
                local = parts(config, pp, s, tp, i)
                numel = sum(n for _, n in local if n)
                lo_chunk, hi_chunk = chunk_bounds(numel, dp, d) if zero else (0, numel)
                offset = 0
                for name, n in local:
                    if not n:
                        rows.append((name, None, None, None))
                        continue
                    w = (i / tp, (i + 1) / tp)
                    a, b = max(lo_chunk, offset), min(hi_chunk, offset + n)
                    share = None if a >= b else (w[0] + (a - offset) / n * (w[1] - w[0]),
                                                 w[0] + (b - offset) / n * (w[1] - w[0]))
                    rows.append((name, w, share if zero == 2 else w, share))
                    offset += n
                out[rank] = rows
    return out


def draw_holdings(config, dp=1, pp=1, tp=1, zero=0, title=None):
    """One panel per rank: for every part of the model, bars W, G and O of what the rank holds."""
    held = holdings(config, dp, pp, tp, zero)
    fig, axes = plt.subplots(1, len(held), figsize=(2.3 * len(held), 0.5 + 0.42 * (config.n_layers + 2)),
                             sharey=True, squeeze=False)
    for ax, (rank, rows) in zip(axes[0], sorted(held.items())):
        for j, (name, *bars) in enumerate(rows):
            y = len(rows) - 1 - j
            for k, (label, span) in enumerate(zip("WGO", bars)):
                yy = y + 0.62 - 0.28 * k
                ax.add_patch(Rectangle((0, yy), 1, 0.22, facecolor=EMPTY_COLOR, edgecolor="0.7", linewidth=0.5))
                if span is not None:
                    ax.add_patch(Rectangle((span[0], yy), span[1] - span[0], 0.22, facecolor=device_color(rank)))
                if rank == min(held):
                    ax.text(-0.04, yy + 0.11, label, ha="right", va="center", fontsize=6)
        d, s, i = (rank // tp) % dp, rank // (tp * dp), rank % tp
        ax.set_title(f"rank {rank}\n(dp {d}, pp {s}, tp {i})", fontsize=8)
        ax.set_xlim(-0.25, 1.02)
        ax.set_ylim(-0.1, len(rows))
        ax.set_xticks([])
        ax.set_yticks([len(rows) - 1 - j + 0.45 for j in range(len(rows))])
        ax.set_yticklabels([r[0] for r in rows], fontsize=7)
        for side in ("top", "right", "bottom", "left"):
            ax.spines[side].set_visible(False)
        ax.tick_params(length=0)
    name = title or f"dp={dp} x pp={pp} x tp={tp}" + (f", ZeRO-{zero}" if zero else "")
    fig.suptitle(f"{name}: W weights, G gradients, O optimizer state held by each rank", fontsize=9)
    fig.tight_layout()
    return fig



def draw_timeline(ax, timelines, title=None):
    """Draw per-stage timelines [(op, mb, start, end)] (from ``simulate`` or a timed run) on ``ax``.

    Times are shown from the earliest start; stage 0 is the top row.
    """
    t0 = min(t[2] for tl in timelines for t in tl)
    end = max(t[3] for tl in timelines for t in tl) - t0
    for stage, timeline in enumerate(timelines):
        for op, mb, start, stop in timeline:
            if op not in ("forward", "backward"):
                continue
            backward = op == "backward"
            ax.add_patch(Rectangle((start - t0, stage - 0.4), stop - start, 0.8, facecolor=device_color(mb),
                                   alpha=1.0 if backward else 0.45, edgecolor="black", linewidth=0.5))
            ax.text(start - t0 + (stop - start) / 2, stage, f"{'B' if backward else 'F'}{mb}",
                    ha="center", va="center", fontsize=7, color=_text_color(mb, backward))
    n = len(timelines)
    ax.set_xlim(0, end)
    ax.set_ylim(n - 0.5, -0.5)
    ax.set_yticks(range(n), [f"stage {s}" for s in range(n)])
    ax.set_xlabel("time")
    fraction = bubble(timelines)["fraction"]
    ax.set_title(f"{title + ': ' if title else ''}bubble {fraction:.0%}")
    return ax


def _text_color(mb, backward):
    light = device_color(mb) in ("#f0e442", "#e69f00", "#56b4e9")  # yellow, orange, sky blue
    return "white" if backward and not light else "black"


def draw_schedules(p, m, t_forward=1.0, t_backward=2.0):
    """GPipe above 1F1B for p stages and m micro-batches on an ideal clock; returns the figure."""
    fig, axes = plt.subplots(2, 1, figsize=(10, 1.0 + 0.9 * p * 2), sharex=True)
    for ax, (name, make) in zip(axes, [("GPipe", gpipe), ("1F1B", one_f_one_b)]):
        schedule = make(p, m)
        peak = max(in_flight(program) for program in schedule)
        draw_timeline(ax, simulate(schedule, t_forward, t_backward),
                      f"{name}, p={p}, m={m}, at most {peak} micro-batches in flight")
    axes[0].set_xlabel("")
    fig.suptitle(f"(p-1)/(m+p-1) = {bubble_formula(p, m):.0%}", fontsize=10)
    fig.tight_layout()
    return fig
