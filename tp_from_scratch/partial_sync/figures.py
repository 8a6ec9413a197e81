"""The picture of Lesson 8: which hidden channels are synced and which are private, per rank and block.

    draw_streams(ax, t, n_blocks, hidden, p)

One row per rank, one column group per block output (attention then MLP of each block). Each
cell is one hidden channel of that rank's residual stream after that partial reduce: the
leading k = floor(p*H) channels are the same on every rank (gray, "synced"); the rest belong
to the rank's own stream and are drawn in its device colour ("private"). The stack begins
as ONE stream (the embedding, Replicated): the first column is all gray.
"""
from matplotlib.patches import Patch, Rectangle

from tp_from_scratch.partial_sync.mappings import synced_channels
from tp_from_scratch.plots import device_color

SYNCED_COLOR = "#9a9a9a"


def draw_streams(ax, t, n_blocks, hidden, p, title=None):
    """Draw the streams of t ranks through n_blocks blocks of width ``hidden`` at sync fraction p."""
    k = synced_channels(hidden, p)
    stages = ["embedding"] + [f"block {b}\n{part}" for b in range(n_blocks) for part in ("attn", "mlp")]
    gap = 2
    for col, _ in enumerate(stages):
        x0 = col * (hidden + gap)
        for rank in range(t):
            y0 = (t - 1 - rank) * 1.3
            for c in range(hidden):
                private = col > 0 and c >= k
                ax.add_patch(Rectangle((x0 + c, y0), 1, 1, facecolor=device_color(rank) if private else SYNCED_COLOR,
                                       edgecolor="white", linewidth=0.5))
    ax.set_xlim(-1, len(stages) * (hidden + gap))
    ax.set_ylim(-0.4, t * 1.3 + 0.2)
    ax.set_xticks([col * (hidden + gap) + hidden / 2 for col in range(len(stages))])
    ax.set_xticklabels(stages, fontsize=8)
    ax.set_yticks([(t - 1 - r) * 1.3 + 0.5 for r in range(t)])
    ax.set_yticklabels([f"rank {r}" for r in range(t)])
    ax.tick_params(length=0)
    for side in ("top", "right", "left", "bottom"):
        ax.spines[side].set_visible(False)
    ax.set_title(title or f"t = {t}, H = {hidden}, p = {p:g}: the first {k} channels synced, "
                          f"{hidden - k} private per rank", fontsize=10)
    ax.legend(handles=[Patch(color=SYNCED_COLOR, label="synced: all-reduced, equal on every rank")]
              + [Patch(color=device_color(r), label=f"private to rank {r}") for r in range(t)],
              loc="upper center", bbox_to_anchor=(0.5, -0.18), ncol=min(t + 1, 3), fontsize=8, frameon=False)
    return ax
