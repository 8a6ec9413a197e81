"""Lesson 10's pictures: all-reduce time by size (measured and predicted), and a backward timeline."""
import numpy as np

from tp_from_scratch.overlap.algorithms import ALGORITHMS, predicted_seconds
from tp_from_scratch.plots import device_color

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
