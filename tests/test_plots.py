"""The pictures tell the truth: each block is drawn in the colour of the device that holds it."""
import matplotlib

matplotlib.use("Agg")  # no display in tests
import matplotlib.pyplot as plt
import pytest
from matplotlib.colors import to_hex

from tp_from_scratch.plots import EMPTY_COLOR, device_color, draw_matrix, draw_split_matmul, memory_bars


def blocks(drawn):
    """(owner, colour, x, y, width, height) of each drawn block."""
    return [(o, to_hex(r.get_facecolor(), keep_alpha=False), r.get_x(), r.get_y(), r.get_width(), r.get_height())
            for o, r in drawn]


def test_column_split_draws_one_coloured_column_block_per_device():
    _, ax = plt.subplots()
    drawn = blocks(draw_matrix(ax, (8, 12), split_axis=1, world_size=4))
    # device i: columns 3i..3i+3, all 8 rows, in its own colour
    assert drawn == [(i, device_color(i), 3 * i, 0, 3, 8) for i in range(4)]
    plt.close("all")


def test_uneven_row_split_follows_array_split_and_one_device_view_pales_the_others():
    _, ax = plt.subplots()
    drawn = blocks(draw_matrix(ax, (5, 4), split_axis=0, world_size=2, rank=1))
    # array_split: rows 0..2 on device 0, rows 3..4 on device 1 (row 0 drawn at the top)
    assert drawn == [(0, EMPTY_COLOR, 0, 2, 4, 3), (1, device_color(1), 0, 0, 4, 2)]
    plt.close("all")


def test_bad_split_axis_and_mismatched_bars_are_refused():
    _, ax = plt.subplots()
    with pytest.raises(ValueError, match="split_axis must be 0, 1 or None"):
        draw_matrix(ax, (2, 2), split_axis=2, world_size=2)
    with pytest.raises(ValueError, match="part 'X' has 1 values for 2 bars"):
        memory_bars(ax, {"W": [1, 2], "X": [1]})
    with pytest.raises(ValueError, match="split must be"):
        draw_split_matmul("diagonal", 2)
    plt.close("all")


def test_memory_bars_stack_the_parts():
    _, ax = plt.subplots()
    w, x = memory_bars(ax, {"W": [2**20, 2**21], "X": [2**20, 0]}, unit="MiB", capacity=3 * 2**20)
    assert [b.get_height() for b in w] == [1, 2] and [b.get_y() for b in x] == [1, 2]
    plt.close("all")


def test_split_matmul_figure_has_one_row_per_device():
    fig = draw_split_matmul("row", 3, shape=(2, 6, 3))
    assert len(fig.axes) == 3 * 5  # X @ W = Y per device
    plt.close(fig)


def test_layouts_split_rows_for_the_sequence_and_columns_for_hidden(monkeypatch):
    # draw_layouts (Lessons 3, 4 and 7): Sharded(seq) cuts rows, Sharded / Sharded(hidden) columns
    from tp_from_scratch import plots
    calls = []
    monkeypatch.setattr(plots, "draw_matrix", lambda ax, shape, axis, t, **kw: calls.append(axis))
    monkeypatch.setattr(plots.plt, "show", lambda: None)
    plots.draw_layouts([("x", "Sharded(seq)", "g", (4, 3)), ("h", "Sharded(hidden)", "", (4, 3)),
                        ("p", "Partial", "", (4, 3)), ("w", "Sharded", "", (4, 3))], t=2)
    assert calls == [0, 0, 1, 1, None, None, 1, 1]  # one call per rank and step
    with pytest.raises(ValueError, match=r"unknown layout\(s\) \['Sharded\(rows\)'\]"):
        plots.draw_layouts([("x", "Sharded(rows)", "", (4, 3))], t=2)
    plt.close("all")
