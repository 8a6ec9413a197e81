"""Every command the course shows runs as printed from the repository root.

A learner copies commands out of the lessons, the docs and the module docstrings into a shell
at the repository root, without activating anything. So every launcher must be the venv's:
``.venv/bin/torchrun --standalone ...``, ``.venv/bin/mpiexec -n 4 .venv/bin/python -m ...``,
``.venv/bin/python -m pytest ...``, ``.venv/bin/jupyter ...``. A bare ``torchrun``, ``mpiexec``,
``python``, ``pytest`` or ``jupyter`` is "No such file or directory", or the system Python
without torch. torchrun must also choose its rendezvous (``--standalone``, or ``--nnodes`` /
``--rdzv-...`` for several nodes): without it, it takes a fixed default port.

1. Extraction: every command shown in lessons/src/*.py, in the notebooks (cells and outputs),
   in README.md, CONTRIBUTING.md, STYLE.md and docs/*.md, and in the module docstrings of tp_from_scratch/
   and of the exercise stubs, checked for bare launchers.
2. A sample, one short command per lesson 6-13, run exactly as printed (found in the lesson's
   source and in its notebook, then launched from the repository root).
"""
import ast
import json
import re
import shlex
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from tp_from_scratch.comm.launchers import run_command

ROOT = Path(__file__).resolve().parents[1]
LAUNCHERS = ("torchrun", "mpiexec", "python", "python3", "pytest", "jupyter")
VENV = ".venv/bin/"


def takes_arguments(launcher, following):
    """Is ``launcher following`` a command line (not prose such as "pytest markers")?"""
    if launcher in ("torchrun", "mpiexec"):
        return following.startswith("-")
    if launcher in ("python", "python3"):
        return following.startswith("-") or following.endswith(".py")
    if launcher == "pytest":
        return following.startswith("-") or following.endswith(".py") or \
            following.split("/")[0] in ("tests", "exercises", "lessons")
    return following in ("nbconvert", "lab", "notebook", "execute", "kernelspec")


def commands_in(text):
    """Every command line in ``text``: from a launcher to the end of its line or inline code span,
    backslash continuations joined."""
    lines = text.splitlines()
    found = []
    for i, line in enumerate(lines):
        for m in re.finditer(r"(?<![\w./-])(?:[\w.$()-]*/)*(torchrun|mpiexec|python3?|pytest|jupyter)"
                             r"[ \t]+([^\s`\"']+)", line):
            if line[:m.start()].endswith("-m ") or not takes_arguments(m.group(1), m.group(2)):
                continue   # "python -m pytest": pytest is a module there, the python is checked
            if found and found[-1][1] == i and m.start() < found[-1][2]:
                continue   # inside the previous command (mpiexec ... python -m ...)
            inline = line[:m.start()].count("`") % 2 == 1
            end = line.index("`", m.start()) if inline and "`" in line[m.start():] else len(line)
            command, j = line[m.start():end], i
            while not inline and command.rstrip().endswith("\\") and j + 1 < len(lines):
                j += 1
                command = command.rstrip()[:-1] + " " + lines[j].strip()
            command = " ".join(command.split("  #")[0].split()).rstrip(".,;:").lstrip("(")
            if command.count(")") > command.count("("):   # "(run `...`)" or "(... ex07)"
                command = command[:command.rindex(")")]
            found.append((command, i, end))
    return [c for c, _, _ in found]


def problems_of(command):
    """What keeps ``command`` from running as printed from the repository root ([] if nothing)."""
    problems = []
    words = command.split()
    for k, word in enumerate(words[:-1]):
        base = word.rsplit("/", 1)[-1]
        if base not in LAUNCHERS or not takes_arguments(base, words[k + 1]):
            continue
        if k > 0 and words[k - 1] == "-m":
            continue
        if base == "pytest" or base == "python3":
            problems.append(f"'{word}': write .venv/bin/python -m pytest / .venv/bin/python")
        elif not (word == VENV + base or word.endswith("/" + VENV + base)):   # a printed absolute path too
            problems.append(f"'{word}' is not the venv's launcher {VENV + base}")
        if base == "torchrun" and not re.search(r"--standalone|--nnodes|--rdzv", command):
            problems.append("torchrun without --standalone (or --nnodes / --rdzv-endpoint)")
    return problems


def module_docstring(path):
    return ast.get_docstring(ast.parse(path.read_text()), clean=False) or ""


def notebook_texts(path):
    for cell in json.loads(path.read_text())["cells"]:
        yield "".join(cell["source"])
        for output in cell.get("outputs", []):
            yield "".join(output.get("text", "")) + "".join(output.get("data", {}).get("text/plain", ""))


def shown(area):
    """{file: text shown to the reader} for one area of the repository."""
    if area == "lessons":
        texts = {p: p.read_text() for p in sorted((ROOT / "lessons" / "src").glob("*.py"))}
        texts.update({p: "\n".join(notebook_texts(p)) for p in sorted((ROOT / "lessons").glob("*.ipynb"))})
        return texts
    if area == "docs":
        return {p: p.read_text() for p in [ROOT / "README.md", ROOT / "CONTRIBUTING.md", ROOT / "STYLE.md",
                                           *sorted((ROOT / "docs").glob("*.md"))] if p.exists()}
    if area == "library docstrings":
        return {p: module_docstring(p) for p in sorted((ROOT / "tp_from_scratch").rglob("*.py"))}
    return {p: module_docstring(p) for p in sorted((ROOT / "exercises").glob("ex*.py"))}


def test_the_extraction_finds_commands_and_their_problems():
    text = ("Run `torchrun --nproc-per-node 2 -m m` and pytest markers, then\n"
            "    mpiexec -n 4 python -m tp_from_scratch.x --a 1 \\\n        --b 2   # a comment\n"
            "    .venv/bin/python -m pytest exercises -m ex07\n")
    assert commands_in(text) == ["torchrun --nproc-per-node 2 -m m",
                                 "mpiexec -n 4 python -m tp_from_scratch.x --a 1 --b 2",
                                 ".venv/bin/python -m pytest exercises -m ex07"]
    assert len(problems_of("torchrun --nproc-per-node 2 -m m")) == 2
    assert len(problems_of("mpiexec -n 4 python -m tp_from_scratch.x")) == 2
    assert problems_of("pytest exercises -m ex07") and problems_of("python3 -m x")
    assert problems_of(".venv/bin/torchrun --nproc-per-node 2 -m m") == [
        "torchrun without --standalone (or --nnodes / --rdzv-endpoint)"]
    for good in (".venv/bin/torchrun --standalone --nproc-per-node 2 -m m",
                 ".venv/bin/mpiexec -n 4 .venv/bin/python -m m", ".venv/bin/python -m pytest tests -q",
                 ".venv/bin/jupyter nbconvert --execute x.ipynb", ".venv/bin/python lessons/src/07_x.py"):
        assert problems_of(good) == [], good


@pytest.mark.parametrize("area", ["lessons", "library docstrings", "exercise stubs", "docs"])
def test_every_command_shown_uses_the_venvs_launchers(area):
    texts = shown(area)
    assert texts, f"nothing found to check in {area}"
    bad = [f"{path.relative_to(ROOT)}: {command}  <- {'; '.join(problems)}"
           for path, text in texts.items() for command in commands_in(text)
           for problems in [problems_of(command)] if problems]
    assert not bad, f"{len(bad)} commands in {area} do not run as printed from the repository root:\n" + \
        "\n".join(sorted(set(bad)))


# one short command per lesson 6-13, picked by a piece of it; run exactly as the lesson prints it
SAMPLE = {
    "06_training": "-m tp_from_scratch.gpt.train --steps 3",
    "07_sequence_parallelism": "-m tp_from_scratch.sequence_parallel.check",
    "08_partial_sync": "-m tp_from_scratch.partial_sync.check",
    "09_when_tp_pays": "--hidden 3072 --heads 32 --layers 72",
    "10_overlap": "-m tp_from_scratch.overlap.check",
    "11_parallelisms": "-m tp_from_scratch.parallelisms.check zero",
    "12_deepseek_v3_moe": "-m tp_from_scratch.deepseek.planner --tp 8 --ep 64",
    "13_tp_numerics": "-m tp_from_scratch.numerics.check",
}


def printed(lesson, piece):
    """The one command of ``lesson`` containing ``piece``, the same in its source and notebook."""
    source = [c for c in commands_in((ROOT / "lessons" / "src" / f"{lesson}.py").read_text()) if piece in c]
    notebook = [c for text in notebook_texts(ROOT / "lessons" / f"{lesson}.ipynb")
                for c in commands_in(text) if piece in c]
    assert source, f"lessons/src/{lesson}.py shows no command with {piece!r}"
    assert sorted(set(source)) == sorted(set(notebook)), \
        f"{lesson}: the notebook shows {notebook}, its source {source}: regenerate the notebook"
    assert len(set(source)) == 1, f"{lesson}: several commands with {piece!r}: {source}"
    return source[0]


@pytest.mark.timeout(200)
def test_a_sample_of_the_lessons_commands_runs_as_printed():
    commands = {lesson: printed(lesson, piece) for lesson, piece in SAMPLE.items()}
    # at the same time: most of each is starting Python and importing torch
    with ThreadPoolExecutor(len(commands)) as pool:
        results = dict(zip(commands, pool.map(lambda c: run_command(shlex.split(c), timeout=180, cwd=ROOT),
                                              commands.values())))
    failed = [f"{lesson}: `{commands[lesson]}` exited {r.returncode}:\n{r.stdout[-1500:]}"
              for lesson, r in results.items() if r.returncode != 0]
    assert not failed, "\n\n".join(failed)
