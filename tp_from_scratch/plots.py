"""Small matplotlib pictures for the lessons: matrices cut into shards, and memory per device.

    draw_matrix(ax, shape, split_axis, world_size, title)   one matrix, each shard in its device's colour
    draw_split_matmul(split, world_size, shape)             X @ W = Y as each device computes it
    memory_bars(ax, parts, labels, capacity=..., unit=...)  stacked bars of bytes per device
    plot_loss_comparison(path, steps, losses, ...)          TP vs single-device loss, to a PNG
    step_time_bars(ax, labels, compute_s, communication_s)  a step's compute and communication, stacked
    step_timeline(ax, rows)                                 a profiled step, a band per rank (bench scaling --trace)
    draw_layouts(steps, t, title)                           where each tensor of a layer lives, rank by rank
    tagged_blocks / decode / draw_before_after / draw_ring_steps   Lesson 2's collective pictures
    draw_attention_backward(rank, t)                        one head's backward, and where f and g sit
    draw_cross_entropy_all_reduces(t)                       the vocab-parallel loss's three all-reduces
    draw_course_map(lessons)                                which lesson builds on which (the site's landing page)

Device i is always drawn in ``device_color(i)``, in every lesson, so a learner can follow a
shard from picture to picture. Shards are contiguous blocks as cut by
tp_from_scratch.sharding (uneven sizes split like numpy.array_split).
"""
from pathlib import Path

import matplotlib.pyplot as plt
import numpy as np
from matplotlib.patches import FancyBboxPatch, Rectangle

from tp_from_scratch.sharding import shard_sizes

# colour-blind friendly (Okabe-Ito); device i gets DEVICE_COLORS[i % 8]
DEVICE_COLORS = ["#0072b2", "#e69f00", "#009e73", "#cc79a7", "#56b4e9", "#d55e00", "#f0e442", "#000000"]
EMPTY_COLOR = "#f2f2f2"   # a block this device does not hold
GRID_COLOR = "white"

UNITS = {"B": 1, "KiB": 2**10, "MiB": 2**20, "GiB": 2**30, "KB": 1e3, "MB": 1e6, "GB": 1e9}


def device_color(rank):
    """The colour of device ``rank`` in every picture of the course."""
    return DEVICE_COLORS[rank % len(DEVICE_COLORS)]


def shard_bounds(size, world_size):
    """[(start, stop)] of each device's block along an axis of ``size`` (array_split order)."""
    bounds, start = [], 0
    for n in shard_sizes(size, world_size):
        bounds.append((start, start + n))
        start += n
    return bounds


def draw_matrix(ax, shape, split_axis=None, world_size=1, title=None, *, rank=None, partial=False,
                dims=None, max_grid=40):
    """Draw a (rows, cols) matrix as a grid of cells, each shard coloured by the device that holds it.

    split_axis: 0 cuts it into blocks of rows, 1 into blocks of columns, None means replicated
                (every device holds all of it: drawn grey, or in ``rank``'s colour).
    rank:       draw only what device ``rank`` holds; the other blocks are left pale.
    partial:    the matrix is a partial sum on device ``rank`` (full shape, hatched), e.g. X_i @ W_i.
    dims:       axis names such as ("B", "H"), written with each axis size under the title.
    max_grid:   draw cell lines only when both sides have at most this many cells.
    Returns the list of (rank, rectangle) drawn for the device blocks.
    """
    rows, cols = shape
    drawn = []
    if split_axis is None:
        blocks = [(rank, (0, rows), (0, cols))]
    elif split_axis in (0, 1):
        cuts = shard_bounds(shape[split_axis], world_size)
        blocks = [(i, c, (0, cols)) if split_axis == 0 else (i, (0, rows), c) for i, c in enumerate(cuts)]
    else:
        raise ValueError(f"split_axis must be 0, 1 or None for a matrix, got {split_axis}")
    for owner, (r0, r1), (c0, c1) in blocks:
        holds = rank is None or owner == rank
        colour = "#bdbdbd" if owner is None else (device_color(owner) if holds else EMPTY_COLOR)
        rect = Rectangle((c0, rows - r1), c1 - c0, r1 - r0, facecolor=colour, edgecolor="black",
                         linewidth=1.2, hatch="//" if partial else None, alpha=0.85 if holds else 1.0)
        ax.add_patch(rect)
        drawn.append((owner, rect))
        if holds and owner is not None and split_axis is not None and (r1 - r0) * (c1 - c0) > 0:
            ax.text((c0 + c1) / 2, rows - (r0 + r1) / 2, f"dev {owner}", ha="center", va="center",
                    fontsize=8, color="white", fontweight="bold")
    if rows <= max_grid and cols <= max_grid:  # cell lines: a matrix, not a coloured box
        for r in range(1, rows):
            ax.plot([0, cols], [r, r], color=GRID_COLOR, linewidth=0.5)
        for c in range(1, cols):
            ax.plot([c, c], [0, rows], color=GRID_COLOR, linewidth=0.5)
    label = title or ""
    if dims:
        sizes = list(shape)
        if split_axis is not None:  # the sharded axis reads "F/t = 3"
            sizes[split_axis] = f"{dims[split_axis]}/{world_size}={shape[split_axis] // world_size}" \
                if shape[split_axis] % world_size == 0 else f"{dims[split_axis]} split"
        label += f"\n({', '.join(f'{d}={s}' if isinstance(s, int) else s for d, s in zip(dims, sizes))})"
    if partial:
        label += "\npartial sum"
    ax.set_title(label, fontsize=9)
    ax.set_xlim(-0.2, cols + 0.2)
    ax.set_ylim(-0.2, rows + 0.2)
    ax.set_aspect("equal")
    ax.axis("off")
    return drawn


def draw_split_matmul(split, world_size, shape=(4, 8, 12)):
    """A figure of Y = X @ W as each of ``world_size`` devices computes it, one row per device.

    split="column": device i holds all of X and W_i = W[:, block i]; it computes Y_i, a column
                    block of Y (concatenating the blocks is an all-gather).
    split="row":    device i holds X_i = X[:, block i] and W_i = W[block i, :]; it computes a
                    partial sum of Y of full shape (adding them is an all-reduce).
    shape: (B, H, F). Returns the Figure.
    """
    if split not in ("column", "row"):
        raise ValueError(f'split must be "column" or "row", got {split!r}')
    b, h, f = shape
    # (split axis of X, of W, of Y); None = the device holds all of it
    x_axis, w_axis, y_axis = (None, 1, 1) if split == "column" else (1, 0, None)
    fig, axes = plt.subplots(world_size, 5, figsize=(9, 1.9 * world_size),
                             gridspec_kw={"width_ratios": [h, 2, f, 2, f]}, squeeze=False)
    for i in range(world_size):
        ax_x, ax_at, ax_w, ax_eq, ax_y = axes[i]
        draw_matrix(ax_x, (b, h), x_axis, world_size, f"device {i}: X" + ("" if x_axis is None else f"_{i}"),
                    rank=i, dims=("B", "H"))
        draw_matrix(ax_w, (h, f), w_axis, world_size, f"W_{i}", rank=i, dims=("H", "F"))
        draw_matrix(ax_y, (b, f), y_axis, world_size, f"Y_{i}", rank=i, partial=(split == "row"),
                    dims=("B", "F"))
        for ax, sign in ((ax_at, "@"), (ax_eq, "=")):
            ax.text(0.5, 0.5, sign, ha="center", va="center", fontsize=16)
            ax.axis("off")
    after = "concatenate the Y_i (all-gather)" if split == "column" else "add the Y_i (all-reduce)"
    fig.suptitle(f"{split} split over t={world_size} devices: then {after} to get Y", fontsize=11)
    fig.tight_layout()
    return fig


def memory_bars(ax, parts, labels=None, *, capacity=None, capacity_label="device memory",
                unit="MiB", title=None):
    """Stacked bars of bytes: one bar per device (or per setup), one colour per part.

    parts:    {"W": [bytes on bar 0, bytes on bar 1, ...], "X": [...], ...}
    labels:   the bar names (default "device 0", "device 1", ...).
    capacity: bytes; draws a dashed line, e.g. an 80 GB GPU.
    unit:     one of B, KiB, MiB, GiB, KB, MB, GB.
    Returns the list of bar containers.
    """
    n = len(next(iter(parts.values())))
    labels = labels or [f"device {i}" for i in range(n)]
    scale = UNITS[unit]
    bottom = [0.0] * n
    bars = []
    for name, values in parts.items():
        if len(values) != n:
            raise ValueError(f"part {name!r} has {len(values)} values for {n} bars")
        heights = [v / scale for v in values]
        bars.append(ax.bar(labels, heights, bottom=bottom, label=name))
        bottom = [b + h for b, h in zip(bottom, heights)]
    for x, total in enumerate(bottom):
        ax.text(x, total, f"{total:.3g}", ha="center", va="bottom", fontsize=8)
    if capacity is not None:
        ax.axhline(capacity / scale, color="red", linestyle="--", linewidth=1.2)
        ax.text(-0.4, capacity / scale, capacity_label, color="red", va="bottom", ha="left", fontsize=8)
    ax.set_ylabel(unit)
    if title:
        ax.set_title(title, fontsize=10)
    ax.legend(fontsize=8)
    return bars


def plot_loss_comparison(path, steps, losses, ref_losses, label, tolerance, dtype_name):
    """Two panels saved to ``path``: both loss curves, and their absolute difference (log scale).

    tolerance: the comparison's relative bound, one number or one per step (compare.tolerance
    grows with the steps); a step whose difference is exactly 0 is drawn on a floor line far
    below the smallest bound, in green.
    """
    steps = list(steps)
    fig, (a, b) = plt.subplots(1, 2, figsize=(10, 3.5))
    a.plot(steps, ref_losses, label="single device", lw=3, alpha=0.5)
    a.plot(steps, losses, "--", label=label)
    a.set(xlabel="step", ylabel="loss", title="training loss")
    a.legend()
    scale = max(1.0, max(ref_losses))
    bounds = [b * scale for b in (tolerance if hasattr(tolerance, "__len__") else [tolerance] * len(steps))]
    floor = min(bounds) * 1e-6
    diffs = [abs(p - q) for p, q in zip(losses, ref_losses)]
    b.semilogy(steps, [max(d, floor) for d in diffs], ".-", label="|difference|")
    zero = [s for s, d in zip(steps, diffs) if d == 0]
    b.semilogy(zero, [floor] * len(zero), "g.", label="bit-equal (0)")
    b.plot(steps, bounds, color="r", ls=":", label="tolerance")
    b.set_ylim(floor / 3, max(bounds) * 30)
    b.set(xlabel="step", ylabel="|loss - single-device loss|", title=f"difference ({dtype_name})")
    b.legend()
    fig.tight_layout()
    Path(path).parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=100)
    plt.close(fig)


def step_time_bars(ax, labels, compute_s, communication_s, *, measured_s=None, title=None, unit="ms"):
    """Stacked bars of one training step: compute below, communication on top, one bar per setup.

    compute_s, communication_s: seconds per bar (e.g. tp_from_scratch.cost.model.predict_step's);
    measured_s: seconds actually measured, drawn as a black dash over each bar (None: skipped).
    unit: "ms" or "s". Returns the two bar containers.
    """
    scale = {"ms": 1e3, "s": 1.0}[unit]
    compute = [c * scale for c in compute_s]
    comm = [c * scale for c in communication_s]
    bars = [ax.bar(labels, compute, color=device_color(0), label="compute"),
            ax.bar(labels, comm, bottom=compute, color=device_color(1), label="communication")]
    if measured_s is not None:
        ax.scatter(labels, [m * scale for m in measured_s], marker="_", s=600, color="black",
                   zorder=3, label="measured")
    ax.set_ylabel(f"{unit} per step")
    if title:
        ax.set_title(title, fontsize=10)
    ax.legend(fontsize=8)
    return bars


# what each moment of a profiled step was spent on (bench scaling --trace's kinds)
TIMELINE_COLORS = {"matmul": "#0072b2", "other ops": "#56b4e9", "copy": "#009e73",
                   "communication": "#d55e00", "python": "#bbbbbb"}


def step_timeline(ax, rows, *, title=None):
    """One training step drawn as a band per row, coloured by what each moment was spent on.

    rows: [(label, [(start_ms, stop_ms, kind), ...])], e.g. one row per rank from the timelines
    tp_from_scratch.bench.scaling --trace writes (kinds: TIMELINE_COLORS). Returns ``ax``.
    """
    from matplotlib.patches import Patch
    for i, (label, segments) in enumerate(rows):
        spans = {}
        for start, stop, kind in segments:
            spans.setdefault(kind, []).append((start, stop - start))
        for kind, pieces in spans.items():
            ax.broken_barh(pieces, (i - 0.4, 0.8), color=TIMELINE_COLORS.get(kind, "black"))
    ax.set_yticks(range(len(rows)), [label for label, _ in rows])
    ax.invert_yaxis()
    ax.set_xlabel("ms from the start of the step")
    ax.legend(handles=[Patch(color=c, label=k) for k, c in TIMELINE_COLORS.items()], fontsize=8,
              ncol=len(TIMELINE_COLORS), loc="upper center", bbox_to_anchor=(0.5, -0.35))
    if title:
        ax.set_title(title, fontsize=10)
    return ax


# ---------------------------------------------------------------------------------------
# Lessons 3-4: where each tensor of a layer lives
# ---------------------------------------------------------------------------------------

# the axis a layout splits, in a (rows, cols) picture: None for a whole tensor per rank
LAYOUT_AXIS = {"Replicated": None, "Partial": None, "Sharded": 1, "Sharded(hidden)": 1, "Sharded(seq)": 0}


def draw_layouts(steps, t, title=None):
    """Where each tensor lives: one column per step, one row per rank (device colours of tp_from_scratch.plots).

    steps: list of (label, layout, arrow, (rows, cols)) with layout "Replicated", "Sharded" or
    "Sharded(hidden)" (a block of columns per rank), "Sharded(seq)" (a block of rows per rank:
    Lesson 7) or "Partial" (a full-size partial sum per rank, hatched); arrow: the operation
    into the next step.
    """
    unknown = {layout for _, layout, _, _ in steps} - set(LAYOUT_AXIS)
    if unknown:
        raise ValueError(f"unknown layout(s) {sorted(unknown)}: use one of {sorted(LAYOUT_AXIS)}")
    widths = [shape[1] for *_, shape in steps]
    fig, axes = plt.subplots(t, len(steps), figsize=(1.7 * len(steps) + 0.12 * sum(widths), 0.9 * t + 1.3),
                             gridspec_kw={"width_ratios": widths, "wspace": 0.9}, squeeze=False)
    for col, (label, layout, arrow, shape) in enumerate(steps):
        for rank in range(t):
            ax = axes[rank][col]
            draw_matrix(ax, shape, LAYOUT_AXIS[layout], t, rank=rank, partial=layout == "Partial")
            ax.set_title(label if rank == 0 else "", fontsize=9)
            if col == 0:
                ax.text(-0.15, 0.5, f"rank {rank}", transform=ax.transAxes, ha="right", va="center", fontsize=9)
        axes[-1][col].text(0.5, -0.25, layout, transform=axes[-1][col].transAxes, ha="center", va="top",
                           fontsize=10, fontweight="bold")
    fig.canvas.draw()  # fix the axes positions, then draw the arrows between the columns
    for col, (_, _, arrow, _) in enumerate(steps[:-1]):
        left, right = axes[0][col].get_position(), axes[0][col + 1].get_position()
        y = (axes[0][0].get_position().y1 + axes[-1][0].get_position().y0) / 2
        fig.patches.append(plt.matplotlib.patches.FancyArrowPatch(
            (left.x1 + 0.005, y), (right.x0 - 0.005, y), transform=fig.transFigure,
            arrowstyle="->", mutation_scale=14, lw=1.5))
        fig.text((left.x1 + right.x0) / 2, y + 0.02, arrow, ha="center", va="bottom", fontsize=8, color="crimson")
    if title:
        fig.suptitle(title, y=1.02)
    plt.show()


# ---------------------------------------------------------------------------------------
# Lesson 2: pictures of the collectives, decoded from the real arrays.
#
# Every block of data carries its history in its value: rank r's block i is
#     i * 2**p + 2**r
# A sum of blocks i from a set S of ranks is i * |S| * 2**p + sum(2**r for r in S), so the low
# p bits say WHICH ranks contributed and the rest says WHICH block it is. The pictures decode
# the real arrays that the library's collectives return or send: nothing is redrawn from what
# the algorithm "should" do.
# ---------------------------------------------------------------------------------------

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


def _block_label(value, p):
    """'b2' = rank 1's block 2; 'Σ2' = block 2 summed over every rank; 'abd2' = a partial sum."""
    block, ranks = decode(value, p)
    if len(ranks) == p and p > 1:
        return f"Σ{block}"
    return "".join(LETTERS[r] for r in sorted(ranks)) + str(block)


def _draw_block(ax, x, y, value, p, *, edge=None):
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
    ax.text(x + 0.47, y + 0.45, _block_label(value, p), ha="center", va="center", color=text_color, fontsize=9)


def draw_holdings(ax, holdings, p, title, width=None, edges=None):
    """One row per rank: the blocks it holds (None = holds nothing)."""
    width = width or max([len(h) for h in holdings if h is not None] + [1])
    for rank, held in enumerate(holdings):
        y = p - 1 - rank
        ax.text(-0.2, y + 0.45, f"rank {rank}", ha="right", va="center", fontsize=9, color=device_color(rank))
        for i in range(width):
            value = None if held is None or i >= len(held) else held[i]
            _draw_block(ax, i, y, value, p, edge=(edges or {}).get((rank, i)))
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


# ---------------------------------------------------------------------------------------
# Dataflow pictures: boxes for tensors, arrows for operations, collectives in crimson
# ---------------------------------------------------------------------------------------

COLLECTIVE_COLOR = "crimson"


def _node(ax, xy, text, face="white", edge="0.35", fontsize=9):
    """A tensor: text in a rounded box at data coordinates ``xy``; returns the text artist."""
    return ax.text(*xy, text, ha="center", va="center", fontsize=fontsize, zorder=3,
                   bbox=dict(boxstyle="round,pad=0.4", fc=face, ec=edge, lw=1.2))


def _edge(ax, start, end, sides=("right", "left"), color="0.35", lw=1.4):
    """An arrow from one box (a _node) to another, between the named sides of their boxes."""
    anchor = {"right": (1, 0.5), "left": (0, 0.5), "bottom": (0.5, 0), "top": (0.5, 1)}
    ax.annotate("", xy=anchor[sides[1]], xycoords=end, xytext=anchor[sides[0]], textcoords=start,
                zorder=2, arrowprops=dict(arrowstyle="-|>", color=color, lw=lw, shrinkA=4, shrinkB=4))


def draw_attention_backward(rank=0, t=2):
    """One attention head on rank ``rank`` of ``t``, forward (top) and backward (bottom).

    Everything between f and g belongs to the heads this rank holds and never leaves it;
    the only communication is g's all-reduce in forward (the row-parallel o projection's
    Partial sum) and f's all-reduce in backward (dx, a Partial sum over the ranks' heads).
    Returns the figure.
    """
    head = device_color(rank)
    light = plt.matplotlib.colors.to_rgba(head, 0.18)
    fig, ax = plt.subplots(figsize=(16, 5.6))
    fwd, bwd, out = 3.0, 1.0, -0.6
    xs = [0, 2.7, 5.3, 7.7, 9.8, 12.0, 15.2]
    forward = ["x  (B, T, H)\nReplicated",
               "$q = x W_q$, $k = x W_k$\n$v = x W_v$\n(B, T, hs): this head",
               "$S = q k^\\top / \\sqrt{hs}$\n(B, T, T), masked\nabove the diagonal",
               "$P = \\mathrm{softmax}(S)$\nrow by row",
               "$o = P v$\n(B, T, hs)",
               "$o\\, W_o^{(i)}$  (B, T, H)\nPartial: one term\nof the sum",
               "y  (B, T, H)\nReplicated"]
    top = [_node(ax, (x, fwd), text, face="#eeeeee" if i in (0, 6) else light)
           for i, (x, text) in enumerate(zip(xs, forward))]
    labels = ["f: identity", "", "", "", "$\\cdot W_o^{(i)}$\n(row-parallel)", "g: ALL-REDUCE\n(B, T, H)"]
    for i, label in enumerate(labels):
        color = COLLECTIVE_COLOR if i == 5 else "0.35"
        _edge(ax, top[i], top[i + 1], color=color, lw=2.2 if i == 5 else 1.4)
        ax.text((xs[i] + xs[i + 1]) / 2 + 0.25 * (i == 5), fwd + (0.62 if i < 5 else 0.1), label,
                ha="center", va="bottom", fontsize=8.5, color=color, fontweight="bold" if i == 5 else "normal")
    backward = ["$dx_i = dq\\,W_q^\\top + dk\\,W_k^\\top$\n$ + dv\\,W_v^\\top$\nPartial: this rank's heads",
                "$dq = dS\\, k / \\sqrt{hs}$\n$dk = dS^\\top q / \\sqrt{hs}$\n$dW_q = x^\\top dq$, ...",
                "$dS = P \\odot (dP - \\mathrm{rowsum}(P \\odot dP))$\nmasked: $P = 0$, so $dS = 0$",
                "$dP = do\\, v^\\top$\n$dv = P^\\top do$",
                "$do = dy\\, W_o^{(i)\\top}$\n$dW_o^{(i)} = o^\\top dy$",
                "dy, unchanged\n(g backward:\nidentity)",
                "dy  (B, T, H)\nReplicated"]
    bottom = [_node(ax, (x, bwd), text, face="#eeeeee" if i == 6 else light, fontsize=8.5)
              for i, (x, text) in enumerate(zip(xs, backward))]
    for i in range(6, 0, -1):
        _edge(ax, bottom[i], bottom[i - 1], ("left", "right"))
    dx = _node(ax, (xs[2], out), "dx  (B, T, H)\nReplicated", face="#eeeeee")
    _edge(ax, bottom[0], dx, ("bottom", "left"), color=COLLECTIVE_COLOR, lw=2.2)
    ax.text(xs[0] + 0.4, out - 0.05, "f backward:\nALL-REDUCE (B, T, H)", ha="center", va="top",
            fontsize=8.5, color=COLLECTIVE_COLOR, fontweight="bold")
    for x in xs[1:6]:  # forward results that backward reads (saved activations)
        ax.plot([x, x], [fwd - 0.62, bwd + 0.62], ls=":", color="0.6", zorder=1)
    ax.text(-1.5, fwd, "forward", ha="right", va="center", fontsize=10, fontweight="bold")
    ax.text(-1.5, bwd, "backward", ha="right", va="center", fontsize=10, fontweight="bold")
    ax.add_patch(Rectangle((1.35, 0.2), 11.6, 4.05, fc="none", ec=head, lw=1.5, ls="--", zorder=0))
    ax.text(10.4, -0.6, f"dashed: rank {rank} of t = {t}, its own heads only;\nno communication inside "
            "the box\ndotted: forward tensors that backward reads", ha="center", va="center", fontsize=9,
            color=head)
    ax.set_xlim(-2.6, 16.3)
    ax.set_ylim(-1.4, 4.5)
    ax.axis("off")
    ax.set_title("One attention head, forward and backward: g's all-reduce after the row-parallel "
                 "$W_o$, f's all-reduce of dx", fontsize=11)
    return fig


def draw_cross_entropy_all_reduces(t=3, tokens=4, vocab=13):
    """The vocabulary-parallel cross-entropy on ``t`` ranks: its three all-reduces of N = B*T numbers.

    Left: the logits (N, V), each rank holding a block of the vocabulary (uneven when t does
    not divide V). Right, one row per all-reduce: what each rank contributes (an N-vector in
    its colour), the reduction, what every rank gets, and why the loss needs it.
    Returns the figure.
    """
    fig = plt.figure(figsize=(14, 4.6))
    grid = fig.add_gridspec(1, 2, width_ratios=[1, 3.6], wspace=0.05)
    left, right = fig.add_subplot(grid[0]), fig.add_subplot(grid[1])
    draw_matrix(left, (tokens, vocab), 1, t, dims=("N", "V"), title="logits z: vocabulary blocks")
    steps = [("max", "max over ranks", "$m_i = \\max_v z_{n,v}$\n(own block)", "m  (N,)",
              "shift by the GLOBAL max: every\n$e^{z - m} \\leq 1$, no overflow, and every\nrank shifts by the same m"),
             ("sum", "sum", "$z_{n,y_n} - m_n$ if rank i\nowns $y_n$, else 0",
              "$z_y - m$  (N,)", "only one rank holds the target's\ncolumn: the sum hands it to all"),
             ("sum", "sum", "$S_i = \\sum_v e^{z_{n,v} - m_n}$\n(own block)", "S  (N,)",
              "the softmax denominator runs\nover the whole vocabulary")]
    bar_w, gap = 0.22, 0.08
    for row, (op, name, local, result, why) in enumerate(steps):
        y = 2 - row * 1.15
        for r in range(t):  # every rank's N-vector
            right.add_patch(Rectangle((r * (bar_w + gap), y - 0.4), bar_w, 0.8, fc=device_color(r), ec="black"))
        right.text(t * (bar_w + gap) + 0.15, y, local, va="center", fontsize=8.5)
        start = 2.35
        right.annotate("", xy=(start + 1.5, y), xytext=(start, y),
                       arrowprops=dict(arrowstyle="-|>", color=COLLECTIVE_COLOR, lw=2))
        right.text(start + 0.75, y + 0.08, f"{row + 1}. all-reduce\n({name})", ha="center", va="bottom",
                   fontsize=8.5, color=COLLECTIVE_COLOR, fontweight="bold")
        right.text(start + 0.75, y - 0.1, "N numbers", ha="center", va="top", fontsize=8, color=COLLECTIVE_COLOR)
        right.add_patch(Rectangle((start + 1.65, y - 0.4), bar_w, 0.8, fc="#bdbdbd", ec="black"))
        right.text(start + 1.65 + bar_w + 0.12, y, f"{result}\non every rank", va="center", fontsize=8.5)
        right.text(5.7, y, why, va="center", fontsize=8.5)
    for x, header in ((0, "each rank's (N,)"), (2.35, "the collective"), (3.9, "the result"),
                      (5.7, "why the loss needs it")):
        right.text(x, 2.65, header, fontsize=9, fontweight="bold")
    for r in range(t):
        right.text(r * (bar_w + gap) + bar_w / 2, -0.85, f"r{r}", ha="center", fontsize=8, color=device_color(r))
    right.text(0, -1.3, "loss$_n = \\log S_n - (z_{n,y_n} - m_n)$, the same on every rank.   Backward: "
               "$\\partial\\,$loss$/\\partial z = (e^{z-m}/S - \\mathrm{onehot}(y)) / N$ on each rank's own "
               "block: no communication.\nEach all-reduce carries N = B*T numbers (4 B*T bytes in float32); "
               "gathering the logits instead would move N*V.", fontsize=9)
    right.set_xlim(-0.1, 8.6)
    right.set_ylim(-1.8, 2.9)
    right.axis("off")
    fig.suptitle(f"Vocabulary-parallel cross-entropy on t = {t} ranks: three all-reduces of one number "
                 "per token", fontsize=11)
    return fig


def direct_prerequisites(lessons):
    """{number: the prerequisites not also reached through another one} (the transitive reduction):
    a lesson that builds on 5 and on 11, which itself builds on 6 and so on 5, gets one arrow, from
    11, instead of one that would cross the boxes in between. ``lessons``: (number, builds_on) pairs."""
    below = {}   # number -> every lesson it builds on, directly or not
    for number, builds_on in lessons:
        below[number] = set(builds_on).union(*(below.get(p, set()) for p in builds_on))
    return {number: tuple(p for p in builds_on if not any(p in below.get(q, ()) for q in builds_on))
            for number, builds_on in lessons}


def course_layout(lessons):
    """{number: (x, row)} for a top-down course map: each lesson one row below its deepest prerequisite.

    ``lessons`` is a list of (number, builds_on) pairs, prerequisites listed before the lessons
    that build on them. Each lesson wants to sit under the mean x of its prerequisites; lessons
    of one row keep at least 1 apart, in that order, and the row keeps the mean of what they want.
    """
    row, x = {}, {}
    for number, builds_on in lessons:
        missing = [p for p in builds_on if p not in row]
        if missing:
            raise ValueError(f"lesson {number} builds on {missing}, which are not listed before it")
        row[number] = 1 + max((row[p] for p in builds_on), default=-1)
    prerequisites = dict(lessons)
    for r in sorted(set(row.values())):
        wanted = {n: float(np.mean([x[p] for p in prerequisites[n]] or [0.0])) for n, _ in lessons if row[n] == r}
        in_row = sorted(wanted, key=lambda n: (wanted[n], n))
        placed = []
        for n in in_row:
            placed.append(wanted[n] if not placed else max(wanted[n], placed[-1] + 1))
        shift = np.mean(list(wanted.values())) - np.mean(placed)
        x.update({n: float(p + shift) for n, p in zip(in_row, placed)})
    return {n: (x[n], row[n]) for n, _ in lessons}


def draw_course_map(lessons, *, box_width=3.0, box_height=0.8, gap=0.25, inches_per_unit=0.66):
    """The course as a graph, top down: a box per lesson (title, what it teaches), an arrow per
    prerequisite not already reached through another (direct_prerequisites).

    ``lessons``: (number, title, teaches, builds_on) rows, prerequisites first. Sizes are in data
    units, ``inches_per_unit`` of the figure each. Returns the figure and {number: (x, y)} of
    each box's centre in data units.
    """
    direct = direct_prerequisites([(n, builds_on) for n, _, _, builds_on in lessons])
    layout = course_layout(list(direct.items()))
    columns = max(1, max(2 * abs(x) + 1 for x, _ in layout.values()))
    rows = 1 + max(r for _, r in layout.values())
    pitch_x, pitch_y = box_width + gap, box_height + 2 * gap
    fig, ax = plt.subplots(figsize=(inches_per_unit * columns * pitch_x, inches_per_unit * rows * pitch_y))
    centre = {n: (x * pitch_x, -r * pitch_y) for n, (x, r) in layout.items()}
    for number, title, teaches, _ in lessons:
        cx, cy = centre[number]
        ax.add_patch(FancyBboxPatch((cx - box_width / 2, cy - box_height / 2), box_width, box_height,
                                    boxstyle="round,pad=0.02,rounding_size=0.12", zorder=2,
                                    fc="#eaf3fb", ec=device_color(0), lw=1.4))
        ax.text(cx, cy + 0.15, f"{number}  {title}", ha="center", va="center", fontsize=10,
                weight="bold", zorder=3)
        ax.text(cx, cy - 0.18, teaches, ha="center", va="center", fontsize=9, color="0.2", zorder=3)
    for number, builds_on in direct.items():
        for prerequisite in builds_on:
            (x0, y0), (x1, y1) = centre[prerequisite], centre[number]
            skips_rows = round((y0 - y1) / pitch_y) > 1  # bend around the rows in between
            ax.annotate("", xy=(x1, y1 + box_height / 2), xytext=(x0, y0 - box_height / 2), zorder=1,
                        arrowprops=dict(arrowstyle="-|>", color="0.35", lw=1.3, shrinkA=2, shrinkB=2,
                                        connectionstyle=f"arc3,rad={0.35 if skips_rows else 0}"))
    xs = [x for x, _ in centre.values()]
    ax.set_xlim(min(xs) - pitch_x / 2, max(xs) + pitch_x / 2)
    ax.set_ylim(-(rows - 1) * pitch_y - pitch_y / 2, pitch_y / 2)
    ax.set_aspect("equal")
    ax.axis("off")
    fig.tight_layout(pad=0.2)
    return fig, centre
