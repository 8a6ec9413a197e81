"""Pictures for Lesson 7: where each activation of a block lives, and activation memory vs t."""
import matplotlib.pyplot as plt
from matplotlib.patches import FancyArrowPatch

from tp_from_scratch.plots import draw_matrix

# One block, left to right: (label, layout, operation into the next step, (rows T, cols)).
# Layouts: "Replicated", "Sharded(seq)" (rows split), "Sharded(hidden)" (columns split), "Partial".
_T, _H, _F = 8, 6, 12
TENSOR_PARALLEL_STEPS = [
    ("x", "Replicated", "LayerNorm", (_T, _H)),
    ("ln1(x)", "Replicated", "f: identity", (_T, _H)),
    ("attention\n(local heads)", "Sharded(hidden)", "o", (_T, _H)),
    ("o output", "Partial", "g: all-reduce", (_T, _H)),
    ("x + attn", "Replicated", "LayerNorm, f", (_T, _H)),
    ("GeLU(fc)", "Sharded(hidden)", "proj", (_T, _F)),
    ("proj output", "Partial", "g: all-reduce", (_T, _H)),
    ("y", "Replicated", "", (_T, _H)),
]
SEQUENCE_PARALLEL_STEPS = [
    ("x", "Sharded(seq)", "LayerNorm", (_T, _H)),
    ("ln1(x)", "Sharded(seq)", "g: all-gather T", (_T, _H)),
    ("ln1(x)\ngathered", "Replicated", "q, k, v,\nattention", (_T, _H)),
    ("attention\n(local heads)", "Sharded(hidden)", "o", (_T, _H)),
    ("o output", "Partial", "g-bar: reduce-\nscatter T", (_T, _H)),
    ("x + attn", "Sharded(seq)", "LayerNorm,\ng: all-gather", (_T, _H)),
    ("GeLU(fc)", "Sharded(hidden)", "proj", (_T, _F)),
    ("proj output", "Partial", "g-bar: reduce-\nscatter T", (_T, _H)),
    ("y", "Sharded(seq)", "", (_T, _H)),
]
_SPLIT = {"Replicated": None, "Partial": None, "Sharded(seq)": 0, "Sharded(hidden)": 1}


def draw_block_layouts(t=2, sequence_parallel=True):
    """One row per rank, one column per activation of a pre-LN block, (T rows, H or F columns).

    Each rank's own part is in its device colour (tp_from_scratch.plots); a Partial tensor is
    full-size and hatched. Arrows name the operation, and the collective, between two steps.
    Returns the figure.
    """
    steps = SEQUENCE_PARALLEL_STEPS if sequence_parallel else TENSOR_PARALLEL_STEPS
    widths = [shape[1] for *_, shape in steps]
    fig, axes = plt.subplots(t, len(steps), figsize=(1.2 * len(steps) + 0.12 * sum(widths), 1.1 * t + 1.4),
                             gridspec_kw={"width_ratios": widths, "wspace": 1.0}, squeeze=False)
    for col, (label, layout, _, shape) in enumerate(steps):
        for rank in range(t):
            ax = axes[rank][col]
            draw_matrix(ax, shape, _SPLIT[layout], t, rank=rank, partial=layout == "Partial")
            ax.set_title(label if rank == 0 else "", fontsize=8)
            if col == 0:
                ax.text(-0.2, 0.5, f"rank {rank}", transform=ax.transAxes, ha="right", va="center", fontsize=9)
        axes[-1][col].text(0.5, -0.2, layout, transform=axes[-1][col].transAxes, ha="center", va="top",
                           fontsize=8, fontweight="bold")
    fig.canvas.draw()  # fix the axes positions, then draw the arrows between the columns
    y = (axes[0][0].get_position().y1 + axes[-1][0].get_position().y0) / 2
    for col, (_, _, arrow, _) in enumerate(steps[:-1]):
        left, right = axes[0][col].get_position(), axes[0][col + 1].get_position()
        fig.patches.append(FancyArrowPatch((left.x1 + 0.004, y), (right.x0 - 0.004, y), transform=fig.transFigure,
                                           arrowstyle="->", mutation_scale=12, lw=1.3))
        fig.text((left.x1 + right.x0) / 2, y + 0.02, arrow, ha="center", va="bottom", fontsize=7, color="crimson")
    name = "tensor + sequence parallel" if sequence_parallel else "tensor parallel only"
    fig.suptitle(f"One pre-LN block, {name}, t = {t} (rows: sequence T; columns: hidden H or ffn F)", y=1.02)
    return fig


def plot_activation_memory(ax, ts, measured, predicted, unit="KiB"):
    """Activation bytes per rank per block vs t: measured (markers) and predicted (lines).

    measured, predicted: {label: [bytes for each t]}, e.g. "TP" and "TP+SP".
    """
    scale = {"B": 1, "KiB": 2**10, "MiB": 2**20}[unit]
    for i, label in enumerate(measured):
        ax.plot(ts, [b / scale for b in predicted[label]], "-", color=f"C{i}", label=f"{label}: formula")
        ax.plot(ts, [b / scale for b in measured[label]], "o", color=f"C{i}", label=f"{label}: measured")
    ax.set_xscale("log", base=2)
    ax.set_xticks(ts, [str(t) for t in ts])
    ax.set_xlabel("TP degree t")
    ax.set_ylabel(f"saved for backward per block per rank ({unit})")
    ax.set_ylim(bottom=0)
    ax.legend(fontsize=8)
    ax.grid(alpha=0.3)
