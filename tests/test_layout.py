"""The folders tell the course: each lesson's package imports only earlier lessons.

A learner reads the package floor by floor. This test reads every module's imports (also
those inside functions) and fails when a lesson imports a later lesson, tooling, a
benchmark, a demo or the test suite, or when the top level grows past eight modules.
"""
import ast
from pathlib import Path

PACKAGE = Path(__file__).resolve().parent.parent / "tp_from_scratch"

# Every top-level module or package of tp_from_scratch, with the lesson it belongs to.
# Shared support (floor 0) may import only shared support and Lesson 1's sharding.
LESSON = {
    "__init__": 0, "compare": 0, "testing": 0, "plots": 0,
    "sharding": 1, "matmul": 1,                 # Lesson 1: split a matmul
    "comm": 2, "collectives": 2,                # Lesson 2: collectives from send/recv
    "layers": 3,                                # Lessons 3-4: MLP, attention, block in numpy
    "nn": 5,                                    # Lesson 5: the same with torch autograd
    "gpt": 6,                                   # Lesson 6: train a GPT (and Lesson 9's planner)
    "sequence_parallel": 7,                     # Lesson 7: sequence parallelism
    "partial_sync": 8,                          # Lesson 8: partially synchronized activations
    "overlap": 10,                              # Lesson 10: hiding and shrinking communication
    "parallelisms": 11,                         # Lesson 11: TP beside DDP, ZeRO and pipelines
    "deepseek": 12,                             # Lesson 12: DeepSeek-V3, TP meets mixture-of-experts
}
TOOLING = {"tools", "bench", "demos", "verify"}  # may import any lesson; no lesson imports them
MAX_TOP_LEVEL_MODULES = 8


def top_level_of(path):
    """'gpt' for tp_from_scratch/gpt/model.py, 'compare' for tp_from_scratch/compare.py."""
    parts = path.relative_to(PACKAGE).parts
    return parts[0] if len(parts) > 1 else Path(parts[0]).stem


def imported_components(path):
    """The tp_from_scratch components (and 'tests') that ``path`` imports, with line numbers."""
    tree = ast.parse(path.read_text(), filename=str(path))
    package_parts = path.relative_to(PACKAGE.parent).with_suffix("").parts[:-1]
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            if node.level:  # relative: resolve against this module's package
                base = list(package_parts[:len(package_parts) - node.level + 1])
                module = ".".join(base + ([node.module] if node.module else []))
            else:
                module = node.module or ""
            names = [module] if node.module or node.level else []
            if module == "tp_from_scratch":  # from tp_from_scratch import collectives, ...
                names = [f"tp_from_scratch.{alias.name}" for alias in node.names]
        else:
            continue
        for name in names:
            parts = name.split(".")
            if parts[0] == "tests":
                found.append(("tests", node.lineno))
            elif parts[0] == "tp_from_scratch" and len(parts) > 1:
                found.append((parts[1], node.lineno))
    return found


def modules():
    return sorted(p for p in PACKAGE.rglob("*.py") if "__pycache__" not in p.parts)


def test_every_top_level_component_has_its_place_in_the_course():
    components = {top_level_of(p) for p in modules()}
    unknown = components - set(LESSON) - TOOLING
    assert not unknown, (f"{sorted(unknown)}: add each new module or package to LESSON (its lesson "
                         f"number) or TOOLING in tests/test_layout.py")


def test_the_top_level_holds_at_most_eight_modules():
    top = sorted(p.name for p in PACKAGE.glob("*.py"))
    assert len(top) <= MAX_TOP_LEVEL_MODULES, f"{len(top)} modules at the top level: {top}"


def test_no_lesson_imports_a_later_lesson_tooling_or_tests():
    problems = []
    for path in modules():
        here = top_level_of(path)
        if here in TOOLING:
            continue
        for target, line in imported_components(path):
            where = f"{path.relative_to(PACKAGE.parent)}:{line}"
            if target == "tests" or target in TOOLING:
                problems.append(f"{where} imports {target} (tooling/tests) from lesson code")
            elif LESSON.get(target, 99) > LESSON[here] and not (LESSON[here] == 0 and target == "sharding"):
                problems.append(f"{where}: {here} (lesson {LESSON[here]}) imports {target} "
                                f"(lesson {LESSON.get(target, '?')})")
    assert not problems, "\n".join(problems)


def test_the_scan_sees_imports_inside_functions(tmp_path):
    # the check must not be blind to the late imports the code uses to stay light
    sample = PACKAGE / "gpt" / "train.py"
    assert ("comm", ) in {(t,) for t, _ in imported_components(sample)}
    assert any(t == "plots" for t, _ in imported_components(sample))  # imported inside report()
