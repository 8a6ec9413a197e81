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
   source and in its notebook, then launched from the repository root); where another test
   launches that very command (LAUNCHED_BY), the sample checks it is the same command instead of
   launching it a second time.
"""
import argparse
import ast
import importlib.util
import json
import os
import re
import runpy
import shlex
import subprocess
import sys
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
            while inline and end == len(line) and j + 1 < len(lines) and lines[j + 1].strip():
                j += 1   # an inline code span that a paragraph's line break cuts in two
                command += " " + lines[j].strip().split("`")[0]
                if "`" in lines[j]:
                    break
            while not inline and command.rstrip().endswith("\\") and j + 1 < len(lines):
                j += 1
                command = command.rstrip()[:-1] + " " + lines[j].strip()
            command = " ".join(command.split("  #")[0].split()).lstrip("(")
            command = command if command.endswith("...") else command.rstrip(".,;:")
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


# lesson -> (the test that launches the sampled command, the launcher call it makes, as written there)
LAUNCHED_BY = {
    "07_sequence_parallelism": ("tests/test_sequence_parallel.py",
                                'mpiexec_command(4, "tp_from_scratch.sequence_parallel.check")'),
    "08_partial_sync": ("tests/test_partial_sync.py", 'mpiexec_command(4, "tp_from_scratch.partial_sync.check")'),
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


def test_the_sampled_commands_another_test_launches_are_the_commands_printed():
    from tp_from_scratch.comm.launchers import mpiexec_command, torchrun_command
    for lesson, (test_file, call) in LAUNCHED_BY.items():
        assert call in (ROOT / test_file).read_text(), f"{test_file} no longer launches {call}: sample it here"
        launched = eval(call, {"mpiexec_command": mpiexec_command, "torchrun_command": torchrun_command})
        as_printed = [str(ROOT / word) if word.startswith(".venv/bin/") else word
                      for word in shlex.split(printed(lesson, SAMPLE[lesson]))]
        assert launched == as_printed, (lesson, launched, as_printed)


@pytest.mark.timeout(200)
def test_a_sample_of_the_lessons_commands_runs_as_printed():
    commands = {lesson: printed(lesson, piece) for lesson, piece in SAMPLE.items() if lesson not in LAUNCHED_BY}
    # at the same time: most of each is starting Python and importing torch
    with ThreadPoolExecutor(len(commands)) as pool:
        results = dict(zip(commands, pool.map(lambda c: run_command(shlex.split(c), timeout=180, cwd=ROOT),
                                              commands.values())))
    failed = [f"{lesson}: `{commands[lesson]}` exited {r.returncode}:\n{r.stdout[-1500:]}"
              for lesson, r in results.items() if r.returncode != 0]
    assert not failed, "\n\n".join(failed)


# ---------------------------------------------------------------------------------------
# 3. Every .venv/bin command shown anywhere (code blocks, sentences, any docstring) parsed by
#    its entry point's own argument parser and, behind options.parse_valid_args, its own
#    check of the flags (e.g. "--warmup 3 is more than --steps-per-round 2"). Parsed, not run:
#    running them all would take far longer than make test's budget, and the check of the
#    flags is where a printed command goes stale. A path the command reads that an earlier
#    command writes ("no such file or directory") is accepted; a template (ADAPTER, DIR,
#    [optional] parts, "...") is not a command and is left out.
# ---------------------------------------------------------------------------------------

TEMPLATE = re.compile(r"\[|<|\.\.\.|\bNN_|\b(ADAPTER|DIR|ROOT|PATH|NODE0|FILE)\b|`| -m$|\s-m\s+$|\bp$")
SHELL = re.compile(r"\s(\||>|&&|;|2>|#)\s.*$")
PROSE = re.compile(r'(\s\(.*|,\s.*|""")$')   # "(under torchrun)", ", 2 cores, ..." or a docstring's end


def all_docstrings(path):
    """Every docstring of a Python file (module, classes, functions), one text."""
    tree = ast.parse(path.read_text())
    nodes = [tree] + [n for n in ast.walk(tree) if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef))]
    return "\n".join(ast.get_docstring(n, clean=False) or "" for n in nodes)


def venv_commands():
    """{command: where it is shown} for every .venv/bin command of a module with flags."""
    texts = {**shown("lessons"), **shown("docs")}
    texts.update({p: all_docstrings(p) for folder in ("tp_from_scratch", "exercises", "examples")
                  for p in sorted((ROOT / folder).rglob("*.py"))})
    found = {}
    for path, text in texts.items():
        for command in commands_in(text):
            command = PROSE.sub("", SHELL.sub("", command))
            if command.startswith(VENV) and " -m " in command and not TEMPLATE.search(command) \
                    and " -m pytest" not in command and " -m pip " not in command:
                found.setdefault(command, str(path.relative_to(ROOT)))
    return found


def entry_point(command):
    """(module, argv, world size) of a .venv/bin/{python,torchrun,mpiexec} command line."""
    words = shlex.split(command)
    world = 1
    for flag in ("--nproc-per-node", "-n", "-np"):
        if flag in words[:words.index("-m")]:
            world = int(words[words.index(flag) + 1])
    if "--nnodes" in words[:words.index("-m")]:
        world *= int(words[words.index("--nnodes") + 1])
    k = words.index("-m")
    return words[k + 1], [os.path.expanduser(w) for w in words[k + 2:]], world


class Parsed(Exception):
    """Raised where the entry point's parser has run: args.problem is None or its message."""


def parse_only(module, argv, world, monkeypatch, capsys, launched=True):
    """None if ``module``'s own parser (and validate, behind parse_valid_args) accepts ``argv``
    on ``world`` ranks, else the message; nothing past the parser runs."""
    from tp_from_scratch.gpt import options
    original = argparse.ArgumentParser.parse_args

    def parse_args(self, args=None, namespace=None):
        ns = original(self, args, namespace)
        caller = sys._getframe(1)
        if caller.f_code is options.parse_valid_args.__code__:   # the world it is given, else the launcher's
            given = caller.f_locals.get("world")
            raise Parsed(caller.f_locals["validate_fn"](ns, world if given is None else given))
        raise Parsed(None)
    monkeypatch.setattr(argparse.ArgumentParser, "parse_args", parse_args)

    def no_process(*args, **kwargs):   # a module that starts work before reading its flags
        raise Parsed(f"{module} starts a process before (or without) parsing its flags")
    monkeypatch.setattr(subprocess.Popen, "__init__", no_process)
    monkeypatch.setattr(sys, "argv", [module, *argv])
    if launched:   # torchrun's (mpiexec's ranks read their world from MPI; the flags' check sees it so)
        monkeypatch.setenv("WORLD_SIZE", str(world))
        monkeypatch.setenv("RANK", "0")
    else:
        monkeypatch.delenv("WORLD_SIZE", raising=False)
    try:
        runpy.run_module(module, run_name="__main__", alter_sys=False)
    except Parsed as parsed:
        return parsed.args[0]
    except SystemExit as e:
        err = capsys.readouterr().err.strip().splitlines()
        return None if e.code in (0, None) else (err[-1] if err else f"exit status {e.code}")
    finally:
        monkeypatch.undo()
    return None


def takes_flags(module):
    """Does ``module`` (a package: its __main__) read a command line? A module without a parser
    would run whole in runpy: its commands are checked to pass no arguments instead."""
    spec = importlib.util.find_spec(module)
    path = Path(spec.origin)
    if path.name == "__init__.py":
        path = path.parent / "__main__.py"
    return bool(re.search(r"parse|import_module|argv", path.read_text()))


def test_the_parse_check_catches_a_stale_flag(monkeypatch, capsys):
    # issue 38's: docs/measured.md once printed this; bench train's own check refuses it
    module, argv, world = entry_point(".venv/bin/torchrun --standalone --nproc-per-node 2 -m tp_from_scratch.bench "
                                      "train --hidden 512 --seq-len 128 --rounds 3 --steps-per-round 2")
    assert "--warmup 3 is more than --steps-per-round 2" in parse_only(module, argv, world, monkeypatch, capsys)
    assert "unrecognized arguments: --no-such-flag" in parse_only("tp_from_scratch.gpt.train", ["--no-such-flag"], 1,
                                                                  monkeypatch, capsys)
    assert parse_only("tp_from_scratch.gpt.train", ["--steps", "3"], 1, monkeypatch, capsys) is None


@pytest.mark.timeout(600)
@pytest.mark.filterwarnings("ignore:.*found in sys.modules after import of package:RuntimeWarning")
def test_every_venv_command_shown_parses_with_its_own_parser(monkeypatch, capsys):
    commands = venv_commands()
    assert len(commands) > 100, f"only {len(commands)} commands found: is the extraction broken?"
    bad = []
    for command, where in commands.items():
        try:
            module, argv, world = entry_point(command)
        except ValueError as e:   # an unclosed quote, a --nproc-per-node that is not a number
            bad.append(f"{where}: {command}\n    -> {e}")
            continue
        if not takes_flags(module):
            problem = f"{module} reads no flags" if argv else None
        else:
            problem = parse_only(module, argv, world, monkeypatch, capsys, launched=not command.startswith(VENV + "python"))
            if problem and "starts a process" in problem and not argv:
                problem = None   # no flags to read: it starts its work at once, as printed
        if problem and not re.search(r"no such file or directory|does not exist|no CUDA device", problem):
            bad.append(f"{where}: {command}\n    -> {problem}")
    assert not bad, f"{len(bad)} commands shown do not parse:\n" + "\n".join(bad)
