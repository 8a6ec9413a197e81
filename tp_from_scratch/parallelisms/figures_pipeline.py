"""Lesson 11's pipeline pictures: when each stage computes what, and where it waits.

    draw_timeline(ax, timelines, title)       one row per stage: forward and backward boxes
    draw_schedules(p, m)                      GPipe and 1F1B on an ideal clock, one above the other

A box is one micro-batch's forward (light) or backward (dark) on one stage, labelled with
the micro-batch; the white gaps are the bubble. Micro-batch i is drawn in device_color(i),
so one micro-batch can be followed down the pipeline and back.
"""
import matplotlib.pyplot as plt
from matplotlib.patches import Rectangle

from tp_from_scratch.plots import device_color

from .schedules import bubble, bubble_formula, gpipe, in_flight, one_f_one_b, simulate


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
