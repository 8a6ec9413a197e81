"""Pictures for Lesson 7: where each activation of a block lives, and activation memory vs t."""
from tp_from_scratch.plots import draw_layouts

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


def draw_block_layouts(t=2, sequence_parallel=True):
    """One row per rank, one column per activation of a pre-LN block, (T rows, H or F columns),
    drawn by Lesson 3's plots.draw_layouts: each rank's own part in its device colour, a Partial
    tensor full-size and hatched, arrows naming the operation (and collective) between steps."""
    steps = SEQUENCE_PARALLEL_STEPS if sequence_parallel else TENSOR_PARALLEL_STEPS
    name = "tensor + sequence parallel" if sequence_parallel else "tensor parallel only"
    draw_layouts(steps, t, title=f"One pre-LN block, {name}, t = {t} "
                                 f"(rows: sequence T; columns: hidden H or ffn F)")


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
