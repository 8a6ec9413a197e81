# Pictures for Lesson 2 (pasted into the notebook by lessons/src/02_collectives.py).
#
# Every block of data carries its history in its value: rank r's block i is
#     i * 2**p + 2**r
# A sum of blocks i from a set S of ranks is i * |S| * 2**p + sum(2**r for r in S), so the low
# p bits say WHICH ranks contributed and the rest says WHICH block it is. The pictures below
# decode the real arrays that the library's collectives return or send: nothing is redrawn
# from what the algorithm "should" do.
import matplotlib.pyplot as plt
import numpy as np
from matplotlib.patches import Rectangle

from tp_from_scratch.plots import EMPTY_COLOR, device_color

LETTERS = "abcdefgh"


def tagged_blocks(rank, p, n_blocks=None):
    """Rank ``rank``'s blocks 0..n_blocks-1, each value encoding (block, rank); float64, exact."""
    n_blocks = p if n_blocks is None else n_blocks
    return np.array([i * 2 ** p + 2 ** rank for i in range(n_blocks)], dtype=np.float64)


def decode(value, p):
    """(block index, set of contributing ranks) of a tagged value, or sum of tagged values."""
    v = int(value)
    ranks = {r for r in range(p) if v >> r & 1}
    return (v >> p) // max(len(ranks), 1), ranks


def label(value, p):
    """'b2' = rank 1's block 2; 'Σ2' = block 2 summed over every rank; 'abd2' = a partial sum."""
    block, ranks = decode(value, p)
    if len(ranks) == p and p > 1:
        return f"Σ{block}"
    return "".join(LETTERS[r] for r in sorted(ranks)) + str(block)


def cell(ax, x, y, value, p, *, edge=None):
    """One block: the colour of its rank, or grey getting darker as more ranks are summed in."""
    if value is None:
        ax.add_patch(Rectangle((x, y), 0.95, 0.9, color=EMPTY_COLOR))
        return
    _, ranks = decode(value, p)
    if len(ranks) == 1:
        color, text_color = device_color(next(iter(ranks))), "white"
    else:
        shade = 0.85 - 0.65 * len(ranks) / p
        color, text_color = (shade, shade, shade), ("white" if shade < 0.5 else "black")
    ax.add_patch(Rectangle((x, y), 0.95, 0.9, color=color, ec=edge or color, lw=3 if edge else 0))
    ax.text(x + 0.47, y + 0.45, label(value, p), ha="center", va="center", color=text_color, fontsize=9)


def draw_holdings(ax, holdings, p, title, width=None, edges=None):
    """One row per rank: the blocks it holds (None = holds nothing)."""
    width = width or max([len(h) for h in holdings if h is not None] + [1])
    for rank, held in enumerate(holdings):
        y = p - 1 - rank
        ax.text(-0.2, y + 0.45, f"rank {rank}", ha="right", va="center", fontsize=9, color=device_color(rank))
        for i in range(width):
            value = None if held is None or i >= len(held) else held[i]
            cell(ax, i, y, value, p, edge=(edges or {}).get((rank, i)))
    ax.set_xlim(-1.3, width + 0.1)
    ax.set_ylim(-0.2, p + 0.1)
    ax.set_title(title, fontsize=10)
    ax.axis("off")


def draw_before_after(name, before, after, p, note=""):
    """Who holds what before and after one collective, side by side."""
    width = max(len(h) for h in before + after if h is not None)
    fig, (left, right) = plt.subplots(1, 2, figsize=(2.2 + 1.1 * width, 0.5 * p + 0.9))
    draw_holdings(left, before, p, "before", width)
    draw_holdings(right, after, p, "after", width)
    fig.suptitle(f"{name}{'   ' + note if note else ''}", fontsize=11)
    fig.tight_layout()
    plt.show()


def draw_ring_steps(states, sends, titles, p):
    """The ring all-reduce, one panel per step: what each rank holds, and (red) what it sends next.

    states[k]: per rank, its blocks before step k; sends[k]: the (rank, block) pairs sent in step k.
    """
    steps = len(states)
    cols = (steps + 1) // 2
    fig, axes = plt.subplots(2, cols, figsize=(2.6 * cols, 2 * (0.5 * p + 0.6)))
    for k, ax in enumerate(axes.flat):
        if k >= steps:
            ax.axis("off")
            continue
        edges = {(r, block): "red" for r, block in sends[k]} if k < len(sends) else {}
        draw_holdings(ax, states[k], p, titles[k], p, edges)
    fig.tight_layout()
    plt.show()

