"""Lesson 10's pictures: all-reduce time by size (measured and predicted), a backward timeline,
and the collective-matmul loops step by step (drawn from a real run on simulated ranks)."""
import numpy as np

from tp_from_scratch.overlap.algorithms import ALGORITHMS, predicted_seconds
from tp_from_scratch.plots import decode, device_color, draw_holdings, tagged_blocks

COLORS = {name: device_color(i) for i, name in enumerate([*ALGORITHMS, "native"])}
PIECES = {"dX matmul": 0, "start all-reduce": 1, "all-reduce (blocking)": 1, "dW, db matmul": 2,
          "wait all-reduce": 3}


def fit_alpha_beta_gamma(rows, p, names=("recursive_doubling", "ring", "rabenseifner")):
    """Least-squares alpha (s per message), beta (s per byte sent), gamma (s per byte added).

    Each algorithm's critical path has a known number of message rounds, bytes sent and
    bytes added (its formula with one of alpha, beta, gamma set to 1 and the others to 0),
    so the measured times are linear in (alpha, beta, gamma). Errors are weighted relative
    to the time, so 8 bytes count as much as 64 MiB.
    """
    a, b = [], []
    for row in rows:
        for name in names:
            unit = [predicted_seconds(name, p, row["size"], *one) for one in ((1, 0, 0), (0, 1, 0), (0, 0, 1))]
            weight = 1 / row[f"{name}_min_time_us"]
            a.append([u * weight for u in unit])
            b.append(row[f"{name}_min_time_us"] * 1e-6 * weight)
    solution, *_ = np.linalg.lstsq(np.array(a), np.array(b), rcond=None)
    return tuple(max(float(v), floor) for v, floor in zip(solution, (1e-9, 1e-15, 0.0)))


def algorithm_times(ax, rows, p, alpha=None, beta=None, gamma=0.0, title=None):
    """Measured fastest-call time by size for each algorithm and native (solid), and the
    alpha-beta-gamma prediction (dashed) when alpha and beta are given."""
    sizes = np.array([row["size"] for row in rows])
    for name in [*ALGORITHMS, "native"]:
        ax.loglog(sizes, [row[f"{name}_min_time_us"] for row in rows], "o-", ms=3,
                  color=COLORS[name], label=name)
        if alpha is not None and name in ALGORITHMS:
            ax.loglog(sizes, [predicted_seconds(name, p, n, alpha, beta, gamma) * 1e6 for n in sizes], "--",
                      color=COLORS[name], lw=1)
    ax.set(xlabel="bytes", ylabel="microseconds (fastest call)", title=title)
    ax.legend(fontsize=7)


def backward_timeline(ax, timelines, title=None):
    """One row per variant: the pieces of backward on the time axis (ms).

    timelines: {label: [(what, start ms, stop ms), ...]} as bench overlap's JSON keeps them.
    """
    for y, (label, events) in enumerate(timelines.items()):
        for what, start, stop in events:
            ax.barh(y, stop - start, left=start, color=device_color(PIECES.get(what, 4)),
                    edgecolor="black", lw=0.5)
            if stop - start > 0.04 * max(e[2] for e in events):
                ax.text((start + stop) / 2, y, what, ha="center", va="center", fontsize=7)
    ax.set_yticks(range(len(timelines)), list(timelines))
    ax.invert_yaxis()
    ax.set(xlabel="ms from the start of backward", title=title)


class _RecordingLink:
    """A CommLink that also notes the tagged value of every chunk it sends."""

    def __init__(self, link):
        self.link, self.rank, self.world_size, self.sent = link, link.rank, link.world_size, []

    def send(self, chunk, dst):
        self.sent.append(float(chunk.reshape(-1)[0]))
        self.link.send(chunk, dst)

    def recv(self, src, out):
        return self.link.recv(src, out)

    def finish(self):
        self.link.finish()


def trace_collective_matmul(p):
    """Run both collective-matmul loops on p simulated ranks with one tagged position per chunk
    (plots.tagged_blocks: the value says whose chunk it is and which ranks' products it sums)
    and a 1x1 identity weight. Returns, per rank, {"all-gather": (multiplied, sent),
    "reduce-scatter": (multiplied, partial after each step)}: what the real loops did."""
    from tp_from_scratch.comm import run_spmd
    from tp_from_scratch.overlap.collective_matmul import (CommLink, all_gather_matmul_loop,
                                                           matmul_reduce_scatter_loop)

    def rank_fn(comm):
        multiplied = []

        def matmul(piece):  # the identity: the product keeps the chunk's tag
            multiplied.append(float(piece.reshape(-1)[0]))
            return piece.copy()
        link = _RecordingLink(CommLink(comm))
        own = np.full((1, 1, 1), tagged_blocks(comm.rank, p)[comm.rank])  # chunk r of rank r's x
        all_gather_matmul_loop(link, own, lambda c: np.empty((1, 1, 1)), matmul)
        gather = (multiplied[:], link.sent[:])
        multiplied.clear()
        link.sent.clear()
        x = tagged_blocks(comm.rank, p).reshape(1, p, 1)  # chunk c of rank r's Partial product
        result = matmul_reduce_scatter_loop(link, np.array_split(x, p, axis=1), matmul)
        return {"all-gather": gather, "reduce-scatter": (multiplied[:], link.sent + [float(result.reshape(-1)[0])])}
    return run_spmd(rank_fn, p)


def draw_collective_matmul(p=3):
    """The two collective-matmul loops step by step, from a real run (trace_collective_matmul).

    Top row, all-gather -> matmul: the output rows (T chunks) each rank has computed so far;
    outlined in red, the chunk multiplied at this step, which is also the one on its way to
    the next rank. Bottom row, matmul -> reduce-scatter: the partial sum each rank holds after
    the step (grey darkens as more ranks are summed in; 'Σc' is complete); outlined in red,
    the chunk just multiplied and added, sent on at the next step. Returns the figure.
    """
    import matplotlib.pyplot as plt
    traces = trace_collective_matmul(p)
    fig, axes = plt.subplots(2, p, figsize=(3.1 * p + 0.8, 2 * (0.5 * p + 0.8)), squeeze=False)
    for step in range(p):
        holdings, edges = [[None] * p for _ in range(p)], {}
        for rank, trace in enumerate(traces):
            for value in trace["all-gather"][0][:step + 1]:
                holdings[rank][decode(value, p)[0]] = value
            edges[rank, decode(trace["all-gather"][0][step], p)[0]] = "red"
        what = "multiply the red chunk,\nsend it to rank r+1 meanwhile" if step < p - 1 else "multiply the\nlast chunk received"
        draw_holdings(axes[0][step], holdings, p, f"step {step}: {what}", p, edges)
        holdings, edges = [[None] * p for _ in range(p)], {}
        for rank, trace in enumerate(traces):
            value = trace["reduce-scatter"][1][step]
            holdings[rank][decode(value, p)[0]] = value
            edges[rank, decode(value, p)[0]] = "red"
        what = ("multiply chunk r-1" if step == 0 else "multiply, add the\npartial from r-1") + (
            ", send it" if step < p - 1 else ":\nchunk r is complete")
        draw_holdings(axes[1][step], holdings, p, f"step {step}: {what}", p, edges)
    fig.tight_layout()
    fig.subplots_adjust(left=0.06)
    for row, label in enumerate(("all-gather -> matmul\n(output rows computed)",
                                 "matmul -> reduce-scatter\n(partial sum held)")):
        box = axes[row][0].get_position()
        fig.text(0.015, (box.y0 + box.y1) / 2, label, rotation=90, ha="center", va="center", fontsize=9,
                 fontweight="bold")
    return fig
