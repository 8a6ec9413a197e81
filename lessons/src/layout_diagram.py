import matplotlib.pyplot as plt
from matplotlib.patches import Rectangle

LAYOUT_COLORS = {"Replicated": "#4c72b0", "Sharded": "#55a868", "Partial": "#dd8452"}


def draw_layouts(steps, t, title=None):
    """Draw where each tensor lives: one column per step, one row per rank.

    steps: list of (label, layout, arrow) with layout "Replicated", "Sharded" (a column
    block per rank) or "Partial" (a full-size partial sum per rank); arrow: the text on
    the arrow into the next step ("" for none).
    """
    fig, ax = plt.subplots(figsize=(2.6 * len(steps), 0.75 * t + 1.3))
    for col, (label, layout, arrow) in enumerate(steps):
        x0 = col * 3.0
        ax.text(x0 + 0.7, t + 0.15, label, ha="center", va="bottom", fontsize=9)
        for rank in range(t):
            y0 = t - 1 - rank
            ax.add_patch(Rectangle((x0, y0 + 0.1), 1.4, 0.7, fill=False, ec="grey", ls=":"))
            if layout == "Sharded":  # only block `rank` of the feature axis lives here
                w = 1.4 / t
                ax.add_patch(Rectangle((x0 + rank * w, y0 + 0.1), w, 0.7, color=LAYOUT_COLORS[layout]))
            else:
                ax.add_patch(Rectangle((x0, y0 + 0.1), 1.4, 0.7, color=LAYOUT_COLORS[layout],
                                       alpha=0.45 if layout == "Partial" else 1.0,
                                       hatch="//" if layout == "Partial" else None))
            if col == 0:
                ax.text(-0.15, y0 + 0.45, f"rank {rank}", ha="right", va="center", fontsize=9)
        ax.text(x0 + 0.7, -0.25, layout, ha="center", va="top", fontsize=9, color=LAYOUT_COLORS[layout])
        if col < len(steps) - 1:
            ax.annotate("", xy=(x0 + 2.9, t / 2), xytext=(x0 + 1.5, t / 2),
                        arrowprops=dict(arrowstyle="->", lw=1.5))
            ax.text(x0 + 2.2, t / 2 + 0.1, arrow, ha="center", va="bottom", fontsize=8, color="crimson")
    ax.set_xlim(-1.0, 3.0 * len(steps) - 1.4)
    ax.set_ylim(-0.7, t + 0.9)
    ax.axis("off")
    if title:
        ax.set_title(title)
    plt.show()
