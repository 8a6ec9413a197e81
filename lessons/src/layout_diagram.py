import matplotlib.pyplot as plt

from tp_from_scratch.plots import draw_matrix


def draw_layouts(steps, t, title=None):
    """Where each tensor lives: one column per step, one row per rank (device colours of tp_from_scratch.plots).

    steps: list of (label, layout, arrow, (rows, cols)) with layout "Replicated", "Sharded"
    (a block of columns per rank) or "Partial" (a full-size partial sum per rank, hatched);
    arrow: the operation into the next step.
    """
    widths = [shape[1] for *_, shape in steps]
    fig, axes = plt.subplots(t, len(steps), figsize=(1.7 * len(steps) + 0.12 * sum(widths), 0.9 * t + 1.3),
                             gridspec_kw={"width_ratios": widths, "wspace": 0.9}, squeeze=False)
    for col, (label, layout, arrow, shape) in enumerate(steps):
        for rank in range(t):
            ax = axes[rank][col]
            draw_matrix(ax, shape, 1 if layout == "Sharded" else None, t, rank=rank,
                        partial=layout == "Partial")
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
