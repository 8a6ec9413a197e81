"""Small matplotlib pictures for the lessons: matrices cut into shards, and memory per device.

    draw_matrix(ax, shape, split_axis, world_size, title)   one matrix, each shard in its device's colour
    draw_split_matmul(split, world_size, shape)             X @ W = Y as each device computes it
    memory_bars(ax, parts, labels, capacity=..., unit=...)  stacked bars of bytes per device
    plot_loss_comparison(path, steps, losses, ...)          TP vs single-device loss, to a PNG
    step_time_bars(ax, labels, compute_s, communication_s)  a step's compute and communication, stacked

Device i is always drawn in ``device_color(i)``, in every lesson, so a learner can follow a
shard from picture to picture. Shards are contiguous blocks as cut by
tp_from_scratch.sharding (uneven sizes split like numpy.array_split).
"""
from pathlib import Path

import matplotlib.pyplot as plt
from matplotlib.patches import Rectangle

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

    tolerance: the comparison's relative bound (compare.TOLERANCE[dtype]); a step whose
    difference is exactly 0 is drawn on a floor line far below it, in green.
    """
    steps = list(steps)
    fig, (a, b) = plt.subplots(1, 2, figsize=(10, 3.5))
    a.plot(steps, ref_losses, label="single device", lw=3, alpha=0.5)
    a.plot(steps, losses, "--", label=label)
    a.set(xlabel="step", ylabel="loss", title="training loss")
    a.legend()
    bound = tolerance * max(1.0, max(ref_losses))
    floor = bound * 1e-6
    diffs = [abs(p - q) for p, q in zip(losses, ref_losses)]
    b.semilogy(steps, [max(d, floor) for d in diffs], ".-", label="|difference|")
    zero = [s for s, d in zip(steps, diffs) if d == 0]
    b.semilogy(zero, [floor] * len(zero), "g.", label="bit-equal (0)")
    b.axhline(bound, color="r", ls=":", label="tolerance")
    b.set_ylim(floor / 3, bound * 30)
    b.set(xlabel="step", ylabel="|loss - single-device loss|", title=f"difference ({dtype_name})")
    b.legend()
    fig.tight_layout()
    Path(path).parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=100)
    plt.close(fig)


def step_time_bars(ax, labels, compute_s, communication_s, *, measured_s=None, title=None, unit="ms"):
    """Stacked bars of one training step: compute below, communication on top, one bar per setup.

    compute_s, communication_s: seconds per bar (e.g. tp_from_scratch.gpt.plan.predict_step's);
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
