"""make site: the course as a static website, built offline from the committed, executed notebooks.

    .venv/bin/python website/build.py                   # -> site/index.html
    .venv/bin/python website/build.py --out /tmp/site   # anywhere else

It lays out a Sphinx source tree (in runs/site-build/ unless --work says otherwise), runs Sphinx
there with conf.py beside this file, and copies the HTML to --out. The tree holds:

    index.md            the landing page: README.md with the course map (plots.draw_course_map) under its intro
    lessons/*.ipynb     the notebooks as committed (nothing re-executed), each with a last cell
                        linking its exercise and the commands that grade it
    docs/*.md           every page in docs/, whatever is there at build time
    *.md                the other top-level pages (CONTRIBUTING.md, ...), which the README links to
    exercises/*.md      a page per exercise of tools/grading.py's EXERCISES: the stub and how to grade it
    api/*.md            autodoc of each lesson's packages (tests/test_layout.py's map), shared support,
                        the verify contract

Nothing is downloaded: MathJax comes from the sphinx-mathjax-offline package (requirements-site.txt).
"""
import argparse
import ast
import importlib.util
import io
import json
import os
import pkgutil
import re
import shutil
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))  # run as a script from anywhere: the package and course.py importable

import matplotlib  # noqa: E402

matplotlib.use("Agg")  # the course map is drawn without a display
import matplotlib.pyplot as plt  # noqa: E402

from tp_from_scratch.plots import draw_course_map  # noqa: E402
from tp_from_scratch.tools.grading import EXERCISES  # noqa: E402
from tests.test_layout import LESSON as LESSON_OF_COMPONENT  # noqa: E402
from website.course import LESSONS  # noqa: E402

PACKAGE = REPO / "tp_from_scratch"
VERIFY_CONTRACT = ("verify", "verify.adapter")   # of the tooling, only the contract a library fills in


def lesson_notebooks():
    """{lesson number: notebook path}, from the file names lessons/NN_*.ipynb."""
    return {int(p.name[:2]): p for p in sorted((REPO / "lessons").glob("[0-9][0-9]_*.ipynb"))}


def lesson_of_exercise(exercise_id):
    """The lesson an exercise belongs to: 'ex05a' -> 5 (ids are ex + the lesson's two digits + a letter)."""
    return int(exercise_id[2:4])


class SourceTree:
    """The staged Sphinx sources: files written only when they change (so a rebuild re-reads only
    those pages), and files of an earlier build that were not written again removed by prune()."""

    def __init__(self, root):
        self.root, self.written = Path(root), set()

    def write(self, relative, content):
        path = self.root / relative
        path.parent.mkdir(parents=True, exist_ok=True)
        data = content.encode() if isinstance(content, str) else content
        if not path.exists() or path.read_bytes() != data:
            path.write_bytes(data)
        self.written.add(path)

    def prune(self):
        for path in self.root.rglob("*"):
            if path.is_file() and path not in self.written:
                path.unlink()


def grade_commands(exercise_id, stem):
    """The two ways to grade one exercise, as typed at the repository's root."""
    return (f"make grade EX={exercise_id}\n"
            f"# or the same through pytest, with its full messages:\n"
            f".venv/bin/python -m pytest exercises/test_{stem}.py -x\n")


def exercise_cell(exercises):
    """A notebook markdown cell linking this lesson's exercises and the commands that grade them."""
    lines = ["## Grade your exercise" + ("s" if len(exercises) > 1 else ""), ""]
    for exercise_id, stem in exercises:
        lines += [f"[Exercise {exercise_id}](../exercises/{stem}.md): edit `exercises/{stem}.py`, then",
                  "", "```bash", grade_commands(exercise_id, stem).rstrip(), "```", ""]
    return {"cell_type": "markdown", "id": "grade-your-exercise", "metadata": {}, "source": "\n".join(lines)}


def stage_lessons(src, exercises_by_lesson):
    for number, notebook in lesson_notebooks().items():
        nb = json.loads(notebook.read_text())
        if exercises_by_lesson.get(number):
            nb["cells"].append(exercise_cell(exercises_by_lesson[number]))
        src.write(Path("lessons") / notebook.name, json.dumps(nb, indent=1))


def exercise_title(stub):
    """'Exercise 1: split a matmul ... (lessons/01_split_matmul.ipynb).' -> 'split a matmul ...'.

    The title is the docstring's whole first paragraph, however many lines it is wrapped over."""
    docstring = ast.get_docstring(ast.parse(stub.read_text())) or stub.stem
    first = " ".join(docstring.split("\n\n")[0].split())
    return re.sub(r"\s*\(lessons/[^)]*\)\.?$", "", first.split(":", 1)[-1]).strip()


def stage_exercises(src):
    """A page per exercise; returns {lesson number: [(id, stem)]}."""
    by_lesson, notebooks = {}, lesson_notebooks()
    for exercise_id, (stem, _) in EXERCISES.items():
        lesson = lesson_of_exercise(exercise_id)
        by_lesson.setdefault(lesson, []).append((exercise_id, stem))
        stub = REPO / "exercises" / f"{stem}.py"
        lesson_link = (f"[Lesson {lesson}](../lessons/{notebooks[lesson].name})" if lesson in notebooks
                       else f"Lesson {lesson}")
        page = (f"# Exercise {exercise_id}: {exercise_title(stub)}\n\n"
                f"From {lesson_link}. Edit `exercises/{stem}.py` (below) in your clone, then grade it "
                f"from the repository's root:\n\n```bash\n{grade_commands(exercise_id, stem)}```\n\n"
                f"`make grade` with no `EX=` grades every exercise and prints a summary.\n\n"
                f"```{{literalinclude}} {os.path.relpath(stub, src.root / 'exercises')}\n:language: python\n"
                f":class: exercise-stub\n```\n")   # site.css wraps its instructions on a phone too
        src.write(f"exercises/{stem}.md", page)
    return by_lesson


def modules_of(component):
    """'layers' -> ['tp_from_scratch.layers', 'tp_from_scratch.layers.attention', ...]; 'compare' -> [it]."""
    name, path = f"tp_from_scratch.{component}", PACKAGE / component.replace(".", "/")
    if not path.is_dir():
        return [name] if path.with_suffix(".py").exists() else []
    return [name] + [f"{name}.{m.name}" for m in pkgutil.iter_modules([str(path)])
                     if not m.name.startswith("_")]


def api_page(title, intro, modules):
    parts = [f"# {title}\n\n{intro}\n"]
    for module in modules:
        # :ignore-module-all: a package's __all__ re-exports what its modules define: document each once, there
        parts.append(f"## `{module}`\n\n```{{eval-rst}}\n.. automodule:: {module}\n   :members:\n"
                     f"   :ignore-module-all:\n```\n")
    return "\n".join(parts)


def imported_modules(notebook):
    """The tp_from_scratch modules a notebook's code cells import ('from tp_from_scratch.layers
    import reference' names both tp_from_scratch.layers and tp_from_scratch.layers.reference)."""
    found = set()
    for cell in json.loads(notebook.read_text())["cells"]:
        if cell["cell_type"] != "code":
            continue
        try:
            tree = ast.parse("".join(cell["source"]))
        except SyntaxError:   # a cell with a shell or magic line: it imports nothing of the library
            continue
        for node in ast.walk(tree):
            if isinstance(node, ast.ImportFrom) and (node.module or "").startswith("tp_from_scratch"):
                found |= {node.module} | {f"{node.module}.{alias.name}" for alias in node.names}
            elif isinstance(node, ast.Import):
                found |= {alias.name for alias in node.names if alias.name.startswith("tp_from_scratch")}
    return found


def api_modules_by_lesson():
    """{lesson: its modules}. A package is its lesson's (tests/test_layout.py's LESSON map, the one
    place that says which package is which lesson's); a lesson without a package of its own (Lesson 4
    teaches attention and the block in Lesson 3's layers/) takes that package's modules its notebook
    is the first to import."""
    by_lesson = {}
    for component, lesson in sorted(LESSON_OF_COMPONENT.items()):
        if component != "__init__":
            by_lesson.setdefault(lesson, []).extend(modules_of(component))
    imports = {number: imported_modules(path) for number, path in lesson_notebooks().items()}
    with_package = set(by_lesson)
    for lesson, modules in list(by_lesson.items()):
        for module in list(modules):
            first = min((n for n, found in imports.items() if module in found and n >= lesson), default=None)
            if first is not None and first not in with_package:
                modules.remove(module)
                by_lesson.setdefault(first, []).append(module)
    for number in imports:   # a lesson whose new modules all sit in an earlier lesson's package
        if number not in by_lesson:
            by_lesson[number] = []
    return by_lesson


def stage_api(src):
    """A page per lesson with its modules (api_modules_by_lesson), shared support first, the verify contract last."""
    by_lesson = api_modules_by_lesson()
    titles = {number: (title, teaches) for number, title, teaches, _ in LESSONS}
    pages = [("support", "Shared support", "What every lesson uses: the comparison helper and its tolerance "
              "policy, rank-distinct test data, the pictures.", by_lesson.pop(0, []))]
    for number, modules in sorted(by_lesson.items()):
        title, teaches = titles.get(number, ("", ""))
        pages.append((f"lesson_{number:02d}", f"API of Lesson {number}: {title}".rstrip(": "),
                      f"The library of Lesson {number}" + (f": {teaches}." if teaches else ".")
                      + ("" if modules else " It adds no module of its own: it uses the earlier lessons' API."),
                      modules))
    pages.append(("verify", "The verify adapter contract", "How another tensor-parallel library plugs into "
                  "the conformance suite (`python -m tp_from_scratch.verify`): the Adapter it fills in.",
                  [f"tp_from_scratch.{c}" for c in VERIFY_CONTRACT]))
    for name, title, intro, modules in pages:
        src.write(f"api/{name}.md", api_page(title, intro, modules))
    index = ["# API", "", "The library's public functions and classes, from their docstrings, lesson by lesson.", "",
             "```{toctree}", ":maxdepth: 1", ""] + [f"{name}" for name, *_ in pages] + ["```", ""]
    src.write("api/index.md", "\n".join(index))


def stage_index(src):
    """README.md as the landing page, with the course map and the lessons' links under its intro."""
    fig, _ = draw_course_map(LESSONS)
    svg = io.BytesIO()
    fig.savefig(svg, format="svg", metadata={"Date": None})  # no date: the same map is the same file
    plt.close(fig)
    src.write("_static/course_map.svg", svg.getvalue())
    notebooks = lesson_notebooks()
    links = " · ".join(f"[{n} {title}](lessons/{notebooks[n].name})" for n, title, *_ in LESSONS if n in notebooks)
    course_map = ("## The course map\n\n"
                  "```{figure} _static/course_map.svg\n:alt: the lessons as a graph, each below the lessons it "
                  "builds on\n:width: 100%\n\nEach lesson with the parallelism it teaches; an arrow points from "
                  "a lesson to one that builds on it.\n```\n\n" + links + "\n\n")
    readme = (REPO / "README.md").read_text()
    at = readme.find("\n## ")  # after the intro, before the first section
    at = len(readme) if at < 0 else at + 1
    sidebar = [("Lessons", ["lessons/*"]), ("Docs", ["docs/*"] if list((REPO / "docs").glob("*.md")) else []),
               ("Exercises", ["exercises/*"]), ("Reference", ["api/index"]),
               ("Project", [p.stem for p in project_pages()])]
    toctrees = "".join(  # the sidebar; a section with no page yet (docs/ in a young clone) has no entry
        f"\n```{{toctree}}\n:hidden:\n:caption: {caption}\n:glob:\n\n" + "\n".join(entries) + "\n```\n"
        for caption, entries in sidebar if entries)
    src.write("index.md", readme[:at] + course_map + readme[at:] + toctrees)


def project_pages():
    """The repository's own top-level pages (CONTRIBUTING.md, ...), which README.md and docs/ link to."""
    return [p for p in sorted(REPO.glob("*.md")) if p.name != "README.md"]


def stage_docs(src):
    """docs/*.md, whatever is there, and the top-level pages beside README.md, at the same relative places."""
    for page in sorted((REPO / "docs").glob("*.md")):
        src.write(f"docs/{page.name}", page.read_bytes())
    for page in project_pages():
        src.write(page.name, page.read_bytes())


def stage(root):
    """Lay out the whole source tree in ``root``; files an earlier build left there and this one did not write, go."""
    src = SourceTree(root)
    stage_index(src)
    stage_lessons(src, stage_exercises(src))
    stage_docs(src)
    stage_api(src)
    src.prune()


def build(out, work, quiet=True):
    """Stage the sources in ``work``/src, build the HTML in ``work``/html, and mirror it into ``out``.

    Sphinx builds next to its doctrees and myst-nb's jupyter_execute/ (which myst-nb puts beside
    the HTML folder), all inside ``work``, so a rebuild re-reads only what changed and nothing
    lands in the repository but ``out``. Returns Sphinx's exit status.
    """
    from sphinx.cmd.build import build_main

    work, out = Path(work).resolve(), Path(out).resolve()
    stage(work / "src")
    html = work / "html"
    status = build_main((["-q"] if quiet else []) + ["-b", "html", "-c", str(Path(__file__).parent),
                                                      "-d", str(work / "doctrees"), str(work / "src"), str(html)])
    if status == 0 and out != html:
        shutil.rmtree(out, ignore_errors=True)
        shutil.copytree(html, out)
    return status


SITE_PACKAGES = ("sphinx", "myst_nb", "sphinx_book_theme", "sphinx_copybutton")


def refusal(out, work):
    """Why this build must not start (one line), or None: missing packages, or an --out it would wipe wrongly."""
    missing = [name for name in SITE_PACKAGES if importlib.util.find_spec(name) is None]
    if missing:
        return f"missing {', '.join(missing)}: .venv/bin/pip install -r requirements-site.txt (make site does it)"
    if out == work / "html":
        return None
    if out in (REPO, *REPO.parents) or out == work or (out.exists() and not out.is_dir()):
        return f"--out {out}: not a folder this build may replace with the site"
    if out.is_dir() and any(out.iterdir()) and not (out / ".buildinfo").exists():
        return f"--out {out}: holds files that are not a site built here (no .buildinfo); give a new or empty folder"
    return None


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", default=str(REPO / "site"), help="where the HTML goes (default: site/)")
    parser.add_argument("--work", default=str(REPO / "runs" / "site-build"),
                        help="where the staged sources and Sphinx's doctrees go (kept out of --out)")
    args = parser.parse_args(argv)
    problem = refusal(Path(args.out).resolve(), Path(args.work).resolve())
    if problem:
        parser.error(problem)
    start = time.perf_counter()
    status = build(args.out, args.work)
    if status == 0:
        print(f"site built in {time.perf_counter() - start:.1f} s: {Path(args.out) / 'index.html'}\n"
              f"(search shows page excerpts when served: .venv/bin/python -m http.server -d {args.out} -b 127.0.0.1)")
    return status


if __name__ == "__main__":
    sys.exit(main())
