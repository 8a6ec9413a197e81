"""Every notebook in lessons/ holds exactly the cells its generator in lessons/src/ writes.

The generators are the source of truth (`.venv/bin/python lessons/src/NN_x.py` writes the
unexecuted notebook, nbconvert then executes it): a notebook edited by hand, or a generator
edited without regenerating its notebook, fails here. Cell types and sources are compared;
outputs, execution counts and metadata are not (they change on every execution).
"""
import runpy
import sys
import types
from pathlib import Path

import nbformat
import pytest

LESSONS = Path(__file__).resolve().parents[1] / "lessons"
SOURCES = sorted(p for p in (LESSONS / "src").glob("[0-9][0-9]_*.py"))


def generated_cells(source, monkeypatch):
    """The cells ``source`` would write, and the path it would write them to (nothing is written)."""
    written = []
    shim = types.ModuleType("lesson_notebook")
    shim.write_notebook = lambda cells, path: written.append((cells, Path(path)))
    monkeypatch.setitem(sys.modules, "lesson_notebook", shim)
    runpy.run_path(str(source), run_name="__main__")
    assert len(written) == 1, f"{source.name} wrote {len(written)} notebooks, expected 1"
    return written[0]


def first_difference(have, want):
    """Where a notebook cell (type, source) first differs from the generator's, in words."""
    if have[0] != want[0]:
        return f"a {have[0]} cell where the generator writes a {want[0]} cell"
    have_lines, want_lines = have[1].splitlines(), want[1].splitlines()
    for number, (a, b) in enumerate(zip(have_lines, want_lines), 1):
        if a != b:
            return f"line {number} reads {a!r}, the generator writes {b!r}"
    return f"{len(have_lines)} lines where the generator writes {len(want_lines)}"


def cell_texts(cells):
    return [(cell["cell_type"], "".join(cell["source"])) for cell in cells]


def test_every_notebook_has_a_generator():
    notebooks = {p.stem for p in LESSONS.glob("*.ipynb")}
    generators = {p.stem for p in SOURCES}
    assert notebooks == generators, (
        f"notebooks without a generator: {sorted(notebooks - generators)}; "
        f"generators without a notebook: {sorted(generators - notebooks)}")


@pytest.mark.parametrize("source", SOURCES, ids=[p.stem for p in SOURCES])
def test_notebook_cells_equal_its_generators(source, monkeypatch):
    cells, path = generated_cells(source, monkeypatch)
    assert path.resolve() == (LESSONS / f"{source.stem}.ipynb").resolve(), f"{source.name} writes {path}"
    expected = cell_texts(cells)
    got = cell_texts(nbformat.read(path, as_version=4).cells)
    regenerate = (f"regenerate and re-execute it: .venv/bin/python lessons/src/{source.name} && "
                  f".venv/bin/jupyter nbconvert --to notebook --execute --inplace lessons/{path.name}")
    for index, (want, have) in enumerate(zip(expected, got)):
        assert have == want, (
            f"lessons/{path.name} cell {index} differs from lessons/src/{source.name}: "
            f"{first_difference(have, want)}; {regenerate}")
    assert len(got) == len(expected), (
        f"lessons/{path.name} has {len(got)} cells, lessons/src/{source.name} writes {len(expected)}; {regenerate}")
