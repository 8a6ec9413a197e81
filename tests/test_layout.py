"""The folders tell the course: each module imports only its own lesson and earlier ones.

A learner reads the package floor by floor. This test reads the imports of every module of
the library (also those inside functions), of every exercise and of every lesson source, and
fails when one imports a later lesson, tooling (from lesson code), or the test suite; when the
top level grows past eight modules; or when the library's imports form a cycle. It reads the
words too: no module of a lesson names a later lesson, its package or its architecture.
It also proves that the things the course writes once are defined once: the sharding plans and
the architecture presets, the ring all-reduce's byte formula, Korthikanti's activation formula,
the torch <-> numpy bridge, the training step, the mesh, the model-size flags and the start
and end of a torch process group; that each role has one file name (check.py, figures.py); and that
every file and module the README, CONTRIBUTING, docs/ and the lessons name in backticks exists.
"""
import ast
import fnmatch
import functools
import re
import subprocess
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PACKAGE = ROOT / "tp_from_scratch"

# Every top-level module or package of tp_from_scratch, with the lesson it belongs to.
# Shared support (floor 0) may import only shared support and Lesson 1's sharding.
LESSON = {
    "__init__": 0, "compare": 0, "testing": 0, "plots": 0,
    "sharding": 1, "matmul": 1,                 # Lesson 1: split a matmul
    "comm": 2, "collectives": 2,                # Lesson 2: collectives from send/recv
    "layers": 3,                                # Lessons 3-4: MLP, attention, block in numpy
    "nn": 5,                                    # Lesson 5: the same with torch autograd
    "gpt": 6,                                   # Lesson 6: train a GPT
    "sequence_parallel": 7,                     # Lesson 7: sequence parallelism
    "partial_sync": 8,                          # Lesson 8: partially synchronized activations
    "cost": 9,                                  # Lesson 9: when TP pays (the planner)
    "overlap": 10,                              # Lesson 10: hiding and shrinking communication
    "parallelisms": 11,                         # Lesson 11: TP beside DDP, ZeRO and pipelines
    "deepseek": 12,                             # Lesson 12: DeepSeek-V3, TP meets mixture-of-experts
    "numerics": 13,                             # Lesson 13: bitwise at every t, clipping, the doubling backward
    "inference": 14,                            # Lesson 14: TP at inference time
}
TOOLING = {"tools", "bench", "demos", "verify"}  # may import any lesson; no lesson imports them
MAX_TOP_LEVEL_MODULES = 8
LAST_LESSON = {"layers": 4}   # a package that spans lessons: its last one
# a module that serves a later lesson than its package's counts as that lesson's (none now: each
# lesson's code lives in its own package)
MODULE_LESSON = {}


# ---------------------------------------------------------------------------------------
# Reading the imports
# ---------------------------------------------------------------------------------------

def library_modules():
    return sorted(p for p in PACKAGE.rglob("*.py") if "__pycache__" not in p.parts)


def dotted(path):
    """'tp_from_scratch.gpt.model' for tp_from_scratch/gpt/model.py; a package's __init__ is the package."""
    parts = list(path.relative_to(ROOT).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


MODULES = {dotted(p): p for p in library_modules()}


def resolve(name):
    """The library module that importing ``name`` runs: itself, or its longest existing prefix."""
    parts = name.split(".")
    while parts and ".".join(parts) not in MODULES:
        parts.pop()
    return ".".join(parts) if parts else None


@functools.lru_cache(maxsize=None)
def source(path):
    return path.read_text()


@functools.lru_cache(maxsize=None)
def tree_of(path):
    return ast.parse(source(path), filename=str(path))


def _top_level_statements(tree):
    """Statements run when the module is imported: the body, and inside top-level if / try."""
    todo, out = list(tree.body), []
    while todo:
        node = todo.pop(0)
        out.append(node)
        if isinstance(node, (ast.If, ast.Try)):
            todo += node.body + node.orelse + getattr(node, "finalbody", [])
            todo += [s for h in getattr(node, "handlers", []) for s in h.body]
    return out


def imports(path, module_level_only=False):
    """[(imported name, line)]: 'tp_from_scratch.x.y' for library modules (a name imported from a
    package is its submodule when there is one), 'tests...' for the test suite."""
    tree = tree_of(path)
    nodes = _top_level_statements(tree) if module_level_only else ast.walk(tree)
    here = dotted(path) if path.is_relative_to(PACKAGE) else ""
    package = here if path.name == "__init__.py" else here.rpartition(".")[0]
    found = []
    for node in nodes:
        if isinstance(node, ast.Import):
            found += [(alias.name, node.lineno) for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:  # relative: resolve against this module's package
                up = package.split(".")[:len(package.split(".")) - node.level + 1]
                base = ".".join(up + ([node.module] if node.module else []))
            for alias in node.names:
                sub = f"{base}.{alias.name}"
                found.append((sub if sub in MODULES else base, node.lineno))
    return [(n, line) for n, line in found if n.split(".")[0] in ("tp_from_scratch", "tests")]


def component(name):
    """'gpt' for tp_from_scratch.gpt.model, 'compare' for tp_from_scratch.compare, 'tests' for tests.x."""
    parts = name.split(".")
    if parts[0] == "tests":
        return "tests"
    return parts[1] if len(parts) > 1 else "__init__"


def lesson_of(name):
    """The lesson of a module: its own entry in MODULE_LESSON, else its package's."""
    module = resolve(name) or name
    return MODULE_LESSON.get(module, LESSON.get(component(name), 99))


# ---------------------------------------------------------------------------------------
# The library's layout
# ---------------------------------------------------------------------------------------

def test_every_top_level_component_has_its_place_in_the_course():
    unknown = {component(m) for m in MODULES} - set(LESSON) - TOOLING
    assert not unknown, (f"{sorted(unknown)}: add each new module or package to LESSON (its lesson "
                         f"number) or TOOLING in tests/test_layout.py")


def test_the_top_level_holds_at_most_eight_modules():
    top = sorted(p.name for p in PACKAGE.glob("*.py"))
    assert len(top) <= MAX_TOP_LEVEL_MODULES, f"{len(top)} modules at the top level: {top}"


def problems_of(path, lesson, tooling_allowed):
    """Each import of ``path`` that reaches past ``lesson``, into tooling (unless allowed) or tests."""
    problems = []
    for name, line in imports(path):
        target = resolve(name) or name
        where = f"{path.relative_to(ROOT)}:{line}"
        if component(target) == "tests":
            problems.append(f"{where} imports the test suite ({name})")
        elif component(target) in TOOLING:
            if not tooling_allowed:
                problems.append(f"{where} imports {target} (tooling) from lesson code")
        elif lesson_of(target) > lesson and not (lesson == 0 and component(target) == "sharding"):
            problems.append(f"{where} (lesson {lesson}) imports {target} (lesson {lesson_of(target)})")
    return problems


def test_no_module_imports_a_later_lesson_tooling_or_tests():
    problems = []
    for name, path in MODULES.items():
        if component(name) not in TOOLING:
            problems += problems_of(path, lesson_of(name), tooling_allowed=False)
    assert not problems, "\n".join(problems)


def test_exercises_and_lesson_sources_import_only_their_lesson_and_earlier():
    # exNN_... and test_exNN_... belong to lesson NN (ex05a, ex05b: Lesson 5); NN_name.py is lesson NN
    problems = []
    for path in sorted((ROOT / "exercises").glob("*.py")) + sorted((ROOT / "lessons" / "src").glob("*.py")):
        number = re.match(r"(?:test_)?ex(\d\d)|(\d\d)_", path.name)
        if number:
            problems += problems_of(path, int(number.group(1) or number.group(2)), tooling_allowed=True)
    assert not problems, "\n".join(problems)


def cycles(edges):
    """Every strongly connected component of more than one module (or a module importing itself)."""
    index, low, stack, on_stack, found = {}, {}, [], set(), []

    def visit(v):  # Tarjan's algorithm
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in edges.get(v, ()):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                component.append(w)
                if w == v:
                    break
            if len(component) > 1 or v in edges.get(v, ()):
                found.append(sorted(component))

    for v in sorted(edges):
        if v not in index:
            visit(v)
    return found


def import_edges(module_level_only):
    return {name: {resolve(n) for n, _ in imports(path, module_level_only)} - {None, name}
            for name, path in MODULES.items()}


def test_no_import_cycle_among_the_librarys_modules():
    # at module level (what runs on import), and even counting the imports inside functions:
    # no two modules lean on each other (bench train and bench sequence_parallel once did)
    for module_level_only in (True, False):
        found = cycles(import_edges(module_level_only))
        assert not found, "import cycles: " + "; ".join(" <-> ".join(c) for c in found)


def test_the_scan_sees_late_imports_and_cycles():
    # the checks must not be blind to the late imports the code uses to stay light, nor to a cycle
    late = {name for name, _ in imports(PACKAGE / "cost" / "calibrate.py")}
    assert "tp_from_scratch.comm.launchers" in late  # imported inside calibrate()
    assert "tp_from_scratch.comm.launchers" not in {
        name for name, _ in imports(PACKAGE / "cost" / "calibrate.py", module_level_only=True)}
    assert cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]
    assert problems_of(PACKAGE / "cost" / "planner.py", 6, tooling_allowed=False)  # cost is Lesson 9
    # per module: a module marked as a later lesson's is later for whoever imports it
    MODULE_LESSON["tp_from_scratch.gpt.hooks"] = 12
    try:
        assert any("imports tp_from_scratch.gpt.hooks (lesson 12)" in p
                   for p in problems_of(PACKAGE / "gpt" / "train.py", 6, tooling_allowed=False))
    finally:
        del MODULE_LESSON["tp_from_scratch.gpt.hooks"]
    # the words: a later package as a module path, a later architecture, a later lesson's number
    assert {"tp_from_scratch.deepseek", "DeepSeek", "Lesson 12"} <= set(
        later_names_in("from tp_from_scratch.deepseek import x  # DeepSeek-V3, see Lesson 12", 6))
    assert later_names_in("partial_sync.train and cost/planner.py; the cost of a step", 6) == ["partial_sync.t", "cost/"]
    assert later_names_in("Lessons 3-4 and 5; Lesson 2; the sync_fraction's partial_sync key", 3) == ["Lessons 3-4 and 5"]


def test_the_single_device_gpt_imports_no_parallel_layer():
    # gpt/model.py is the reference, nn.Linear and nn.Embedding only; the TP GPT is the plan
    # applied to it (gpt/parallelize.py). So the model file imports nothing of Lesson 5's parallel
    # layers, mappings or collectives (tp_from_scratch.nn), not even inside a function
    def parallel(path):
        return [f"{path.relative_to(ROOT)}:{line} imports {name}" for name, line in imports(path)
                if component(resolve(name) or name) == "nn"]

    assert not parallel(PACKAGE / "gpt" / "model.py"), parallel(PACKAGE / "gpt" / "model.py")
    assert parallel(PACKAGE / "gpt" / "parallelize.py")  # the scan sees the layers where they are used


# ---------------------------------------------------------------------------------------
# One thing in one place
# ---------------------------------------------------------------------------------------

def definitions(name):
    """Where the library defines ``name`` at module level: a function, a class or an assignment."""
    found = []
    for module, path in MODULES.items():
        for node in tree_of(path).body:
            if isinstance(node, (ast.FunctionDef, ast.ClassDef)) and node.name == name:
                found.append(module)
            elif isinstance(node, ast.Assign) and any(getattr(t, "id", None) == name for t in node.targets):
                found.append(module)
    return found


ONCE = {  # what is written once, and where
    "train_step": "tp_from_scratch.gpt.step",                  # THE training step
    "Comparison": "tp_from_scratch.gpt.train",                 # THE --equal-steps verdict
    "setup_mesh": "tp_from_scratch.gpt.mesh",                  # the one mesh builder (pp = 1: Lesson 6's)
    "add_model_flags": "tp_from_scratch.gpt.options",          # the model-size flags
    "torch_main": "tp_from_scratch.comm.launch",               # a torch entry point's start and end
    # the sharding plan per architecture: the GPT's, and Lesson 12's per MoE layout in the same styles
    "PLANS": ("tp_from_scratch.deepseek.arch", "tp_from_scratch.gpt.arch"),
    "ARCHS": "tp_from_scratch.gpt.arch",                       # the architecture presets
    "shard_axis": "tp_from_scratch.gpt.arch",
    "ring_all_reduce_bytes": "tp_from_scratch.collectives",    # beside the ring it describes
    "korthikanti_bytes": "tp_from_scratch.sequence_parallel.memory",
    "tensor_to_numpy": "tp_from_scratch.nn.collectives",       # the torch <-> numpy bridge
    "numpy_to_tensor": "tp_from_scratch.nn.collectives",
}
# names the old copies had: none may come back
GONE = ("ARCH_FIELDS", "_COLUMN", "_ROW", "_VOCAB", "_KV", "_REPLICATED_SUFFIXES", "_to_numpy", "_from_numpy",
        "_as_numpy", "setup_mesh3d", "Mesh3D", "run_and_exit", "train_once", "differs_too_early", "FAMILIES",
        "RUN_FIELDS")


def test_each_plan_preset_formula_and_bridge_is_defined_once():
    for name, home in ONCE.items():
        homes = sorted(home) if isinstance(home, tuple) else [home]
        assert sorted(definitions(name)) == homes, f"{name} defined in {definitions(name)}, expected only in {homes}"
    for name in GONE:
        assert not definitions(name), f"{name} is back in {definitions(name)}: use {sorted(ONCE)}"
        used = [m for m, p in MODULES.items() if re.search(rf"(?<![\w.]){name}\b", source(p))]
        assert not used, f"{used} still use {name}, which is gone: use {sorted(ONCE)}"


def test_formulas_are_not_retyped():
    # Korthikanti's terms and the ring's 2N - chunk - chunk appear in their one definition only
    patterns = {"24 / t": "tp_from_scratch.sequence_parallel.memory",
                "34 +": "tp_from_scratch.sequence_parallel.memory",
                "(rank + 1) % world_size]": "tp_from_scratch.collectives"}
    for text, home in patterns.items():
        where = [m for m, p in MODULES.items() if text in source(p)]
        assert where == [home], f"{text!r} written in {where}; it belongs in {home} only"
    # bfloat16 crosses to numpy in one place (its rule: as float32); compare.to_numpy only reads
    # a result for the tolerance policy (floor 0, below torch's layers), it sends nothing
    crossing = [m for m, p in MODULES.items() if m != "tp_from_scratch.compare"
                and re.search(r"bfloat16.*\.numpy\(\)|view\(torch\.int16\)", source(p))]
    assert crossing == ["tp_from_scratch.nn.collectives"], crossing


def test_lessons_from_6_on_train_through_the_one_step():
    # from Lesson 6 on a notebook that trains calls gpt.step.train_step; a loop of its own
    # (zero_grad; loss.backward(); optimizer.step()) is the training step written twice
    loops = [f"{path.relative_to(ROOT)}:{number}: {line.strip()}"
             for path in sorted((ROOT / "lessons" / "src").glob("[0-9][0-9]_*.py")) if int(path.name[:2]) >= 6
             for number, line in enumerate(path.read_text().splitlines(), 1)
             if re.search(r"\bopt(?:imizer)?\.step\(\)", line)]
    assert not loops, "\n".join(loops) + "\n: call tp_from_scratch.gpt.step.train_step"



# ---------------------------------------------------------------------------------------
# Earlier lessons never name later ones
# ---------------------------------------------------------------------------------------

LATER_ARCHITECTURES = {12: "deepseek"}   # a later lesson's model, by name (deepseek_v3, DeepSeek-V3, ...)


def later_names_in(text, lesson):
    """What ``text`` of a module of ``lesson`` names of a later lesson: its package (as a module
    path: tp_from_scratch.cost, cost/planner.py, partial_sync.train), its architecture, or
    "Lesson N" itself."""
    found = []
    for package, n in LESSON.items():
        if n > lesson and package not in ("__init__",):
            found += [m.group(0) for m in re.finditer(rf"tp_from_scratch[./]{package}\b|(?<![\w.]){package}(?:\.[a-z_]|/)",
                                                       text)]
    for n, name in LATER_ARCHITECTURES.items():
        if n > lesson:
            found += [m.group(0) for m in re.finditer(name, text, re.IGNORECASE)]
    for m in re.finditer(r"\bLessons? (\d+(?:\s*(?:-|–|,|and|or|to)\s*\d+)*)", text):
        if any(int(k) > lesson for k in re.findall(r"\d+", m.group(1))):
            found.append(m.group(0))
    return found


def test_no_module_of_a_lesson_names_a_later_lesson():
    # the words, not only the imports: a module of Lesson 6 that says "Lesson 12" or names
    # deepseek_v3 makes the earlier lesson depend on the later one (shared support, floor 0,
    # serves every lesson; tooling may name any)
    problems = []
    for name, path in MODULES.items():
        lesson = lesson_of(name)
        if component(name) in TOOLING or not 1 <= lesson < max(LESSON.values()):
            continue
        last = max(lesson, LAST_LESSON.get(component(name), lesson))
        for number, line in enumerate(source(path).splitlines(), 1):
            named = later_names_in(line, last)
            if named:
                problems.append(f"{path.relative_to(ROOT)}:{number} (lesson {lesson}) names {named}: {line.strip()}")
    assert not problems, "\n".join(problems)


# ---------------------------------------------------------------------------------------
# Plumbing once: the torch process group, the model-size flags; one name per role
# ---------------------------------------------------------------------------------------

def calls_of(path, function):
    """Lines where ``path`` calls ``function`` (a name or an attribute of that name)."""
    return [node.lineno for node in ast.walk(tree_of(path)) if isinstance(node, ast.Call)
            and getattr(node.func, "id", getattr(node.func, "attr", None)) == function]


# where a process group may start and end: its one constructor, the torch entry point's door
# (comm.launch.torch_main; spmd_main's finish) and the Comm door (TorchComm());
# verify's workers are started and restarted by its supervisors, around a store of their own
PROCESS_GROUP_DOORS = {"tp_from_scratch.comm.process_group", "tp_from_scratch.comm.launch",
                       "tp_from_scratch.comm.torch_comm", "tp_from_scratch.verify.worker",
                       "tp_from_scratch.verify.model_worker"}


def test_a_torch_process_group_starts_and_ends_in_one_place():
    for function in ("init_process_group", "destroy_process_group"):
        where = sorted(m for m, p in MODULES.items() if calls_of(p, function))
        assert set(where) <= PROCESS_GROUP_DOORS, (
            f"{function} called in {sorted(set(where) - PROCESS_GROUP_DOORS)}: a torch entry point runs "
            f"through tp_from_scratch.comm.launch.torch_main")
    assert calls_of(PACKAGE / "comm" / "launch.py", "init_process_group")   # the scan sees the door


def test_the_model_size_flags_are_declared_once():
    from tp_from_scratch.gpt.options import MODEL_FLAGS
    assert {"--hidden", "--layers", "--heads", "--kv-heads", "--vocab-size", "--seq-len"} <= set(MODEL_FLAGS)
    problems = []
    for name, path in MODULES.items():
        for flag in MODEL_FLAGS:
            if re.search(rf"""add_argument\(\s*["']{flag}["']""", source(path)):
                problems.append(f"{path.relative_to(ROOT)} declares {flag}: use gpt.options.add_model_flags")
        if "._actions" in source(path):   # argparse's private list: re-default with set_defaults
            problems.append(f"{path.relative_to(ROOT)} edits a parser's ._actions")
    assert not problems, "\n".join(problems)


def test_each_role_has_one_file_name():
    # checks in check.py, figures in figures.py, "plan" for sharding plans only
    names = {p.relative_to(PACKAGE).as_posix() for p in library_modules()}
    wrong = sorted(n for n in names if re.search(r"(^|/)(checks|check_\w+|figures_\w+|diagram|pictures|plan)\.py$", n))
    assert not wrong, f"{wrong}: checks go in check.py, figures in figures.py, planners in planner.py"
    plans = sorted(n for n in names if "plan" in n.rsplit("/", 1)[-1])
    assert all(n.endswith(("dtensor_plan.py", "planner.py")) for n in plans), plans


def test_the_switch_to_make_test_slow_is_read_in_one_place():
    # tests/slow.py reads TP_TEST_SLOW; every other test file imports SLOW or only_in_test_slow from
    # it, and the Makefile's test-slow runs the files that import it (so none is left out of both)
    readers = sorted(p.name for p in (ROOT / "tests").glob("*.py")
                     if re.search(r"""(environ|getenv)\W*(get\W*)?["']TP_TEST_SLOW""", p.read_text()))
    assert readers == ["slow.py"], f"{readers} read TP_TEST_SLOW: import SLOW or only_in_test_slow from tests.slow"
    makefile = (ROOT / "Makefile").read_text()
    assert "grep -l '^from tests.slow import' tests/test_*.py" in makefile
    assert "TP_TEST_SLOW=1 $(PY) -m pytest $(SLOW_TESTS)" in makefile


# named in backticks, in another project's repository (Lesson 1, Lesson 8, Lesson 14, docs/running.md cite them)
EXTERNAL = ("torch/", "torchtitan/", "components/", "megatron/", "blogs/", "examples/llama/")
GENERATED = ("runs/", "site/")   # what the commands write (make demo's runs/demo/loss.png): not in a fresh clone
NAMED_FILE = re.compile(r"`([\w.-]+/[\w./*-]+\.(?:py|md|json|ipynb|txt|sh|svg|png))`")   # from the root or the package
NAMED_MODULE = re.compile(r"`(tp_from_scratch(?:\.\w+)+)`")


def tracked_files():
    """The repository's files as a fresh clone has them (git ls-files); without git, those on disk."""
    try:
        out = subprocess.run(["git", "ls-files"], cwd=ROOT, capture_output=True, text=True, timeout=60)
    except (OSError, subprocess.TimeoutExpired):
        out = None
    if out is not None and out.returncode == 0 and out.stdout.strip():
        return out.stdout.splitlines()
    return [p.relative_to(ROOT).as_posix() for p in ROOT.rglob("*") if p.is_file() and ".venv" not in p.parts]


def module_or_attribute_exists(dotted_name):
    """tp_from_scratch.a.b names a module or package, or a top-level name defined in module tp_from_scratch.a."""
    path = ROOT.joinpath(*dotted_name.split("."))
    if path.with_suffix(".py").exists() or (path / "__init__.py").exists() or path.is_dir():
        return True
    parent = path.parent.with_suffix(".py")
    name = path.name
    return parent.exists() and re.search(rf"^(def|class) {name}\b|^{name}\s*[:=]", source(parent), re.M) is not None


def test_every_file_and_module_the_docs_and_lessons_name_exists():
    """README, CONTRIBUTING, docs/ and the lessons' sources name files (from the repository root,
    or inside the package: `gpt/optim.py`) and modules (`tp_from_scratch.gpt.data`, or a name
    in one) in backticks; each must exist (a file name may be a glob), so a renamed file cannot
    leave a reader a dead pointer (docs/concepts.md named exercises/test_ex10_training_step.py for
    Exercise 6's graders). Paths in other projects' repositories (EXTERNAL), outside this one
    (../), what the commands write (GENERATED) and the NN_ templates are left out; a path inside
    a longer backticked command is not read. Checked against the files git tracks, as a fresh
    clone has them."""
    texts = [ROOT / "README.md", ROOT / "CONTRIBUTING.md", *sorted((ROOT / "docs").glob("*.md")),
             *sorted((ROOT / "lessons" / "src").glob("*.py"))]
    files, modules = set(), set()
    for path in texts:
        text, where = path.read_text(), path.relative_to(ROOT).as_posix()
        files |= {(where, m.group(1)) for m in NAMED_FILE.finditer(text)}
        modules |= {(where, m.group(1)) for m in NAMED_MODULE.finditer(text)}
    assert len(files) > 100 and len(modules) > 10, (
        f"only {len(files)} file and {len(modules)} module names found: the patterns no longer read the docs")
    tracked = tracked_files()

    def exists(name):
        return any(fnmatch.fnmatch(f, pattern) for pattern in (name, f"tp_from_scratch/{name}") for f in tracked)

    missing = sorted((where, name) for where, name in files
                     if "NN_" not in name and not name.startswith(EXTERNAL + GENERATED + ("../",)) and not exists(name))
    missing += sorted((where, name) for where, name in modules if not module_or_attribute_exists(name))
    assert not missing, "named but not in the repository:\n" + "\n".join(f"{w}: {n}" for w, n in missing)
