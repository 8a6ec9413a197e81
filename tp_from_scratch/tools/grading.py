"""Which implementation the exercise graders test, chosen by the TP_IMPL environment variable.

    TP_IMPL unset         the learner's files in exercises/
    TP_IMPL=reference     the library's own functions
    TP_IMPL=/some/dir     files of the same names in that directory (an instructor
                          grading a submission)

An exercise is a stub file ``exercises/exNN_<name>.py`` whose public functions and
classes raise NotImplementedError. The graders ``exercises/test_exNN_<name>.py`` call
them through the ``impl`` fixture, which returns a namespace built by
:func:`load_implementation`.
"""
import ast
import importlib
import importlib.util
import os
import types
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
EXERCISE_DIR = REPO / "exercises"

# exercise id (ex + its lesson's number, a letter where a lesson has two) -> (file stem in exercises/, library modules that hold the reference versions)
EXERCISES = {
    "ex01": ("ex01_split_matmul", ["tp_from_scratch.sharding", "tp_from_scratch.matmul"]),
    "ex02": ("ex02_ring_collectives", ["tp_from_scratch.collectives"]),
    "ex03": ("ex03_parallel_mlp", ["tp_from_scratch.layers.mappings", "tp_from_scratch.layers.linear",
                                   "tp_from_scratch.layers.mlp"]),
    "ex04": ("ex04_parallel_attention", ["tp_from_scratch.layers.attention"]),
    "ex05a": ("ex05a_autograd_mappings", ["tp_from_scratch.nn.mappings", "tp_from_scratch.nn.linear"]),
    "ex05b": ("ex05b_vocab_parallel_cross_entropy", ["tp_from_scratch.nn.cross_entropy"]),
    "ex06": ("ex06_training_step", ["tp_from_scratch.gpt.step"]),
    "ex07": ("ex07_sequence_parallel", ["tp_from_scratch.sequence_parallel.mappings",
                                        "tp_from_scratch.sequence_parallel.layernorm"]),
    "ex08": ("ex08_partial_sync", ["tp_from_scratch.partial_sync.autograd"]),
    "ex10": ("ex10_recursive_halving_doubling", ["tp_from_scratch.overlap.algorithms"]),
    "ex11": ("ex11_one_f_one_b", ["tp_from_scratch.parallelisms.schedules"]),
    "ex12": ("ex12_moe_dispatch", ["tp_from_scratch.collectives", "tp_from_scratch.deepseek.dispatch"]),
    "ex13": ("ex13_tree_reduction", ["tp_from_scratch.numerics.tree"]),
    "ex14": ("ex14_sharded_sampling", ["tp_from_scratch.inference.sampling"]),
}


def exercise_id_of(filename):
    """'test_ex03_parallel_mlp.py' or 'ex03_parallel_mlp' -> 'ex03'."""
    stem = Path(filename).stem.removeprefix("test_")
    return stem.split("_", 1)[0]


def public_names(stub_path):
    """Names of the top-level functions and classes a stub file asks the learner to write."""
    tree = ast.parse(Path(stub_path).read_text())
    return [
        node.name
        for node in tree.body
        if isinstance(node, (ast.FunctionDef, ast.ClassDef)) and not node.name.startswith("_")
    ]


def _load_file(path, module_name):
    if not path.exists():
        raise FileNotFoundError(f"no file {path} to grade (TP_IMPL={os.environ.get('TP_IMPL')!r})")
    spec = importlib.util.spec_from_file_location(module_name, path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _reference(exercise_id, names):
    stem, modules = EXERCISES[exercise_id]
    found = {}
    for module_name in modules:
        module = importlib.import_module(module_name)
        found.update({n: getattr(module, n) for n in names if hasattr(module, n) and n not in found})
    missing = [n for n in names if n not in found]
    if missing:
        raise LookupError(f"{exercise_id}: no reference for {missing} in {modules}")
    return types.SimpleNamespace(**found)


def load_implementation(exercise_id, impl=None):
    """A namespace with the exercise's functions, from the place TP_IMPL (or ``impl``) names."""
    stem, _ = EXERCISES[exercise_id]
    impl = os.environ.get("TP_IMPL", "") if impl is None else impl
    names = public_names(EXERCISE_DIR / f"{stem}.py")
    if impl == "reference":
        return _reference(exercise_id, names)
    directory = Path(impl) if impl else EXERCISE_DIR
    module = _load_file(directory / f"{stem}.py", f"graded_{stem}")
    missing = [n for n in names if not hasattr(module, n)]
    if missing:
        raise AttributeError(f"{directory / stem}.py does not define {missing}")
    return types.SimpleNamespace(**{n: getattr(module, n) for n in names})


def run_graded(fn, world_size, *args, timeout=20.0):
    """run_spmd for graders: short timeout, and the failing rank's own error, learner's line first.

    A stub's NotImplementedError stays one, so an unfinished exercise reads "not yet" in the
    grade summary. Any other exception raised on a rank (a wrong value, a wrong shape on
    rank 2) stays an SPMDError (``.error`` is the rank's exception), but with a one-part
    message ("rank 2 failed: ValueError: ...") and the rank's own traceback stripped of the
    simulator's frames, so pytest shows the grader's and the learner's lines only. A
    deadlock, a timeout or mismatched collectives keep the simulator's full message, which
    says where each rank stopped.
    """
    __tracebackhide__ = True  # pytest: start the traceback at the caller's line
    from tp_from_scratch.comm import SPMDError, run_spmd  # the comm package is lesson 2's
    from tp_from_scratch.comm.errors import CommError

    try:
        return run_spmd(fn, world_size, *args, timeout=timeout)
    except SPMDError as error:
        rank_error = error.error
        if isinstance(rank_error, NotImplementedError):
            raise NotImplementedError(str(error)) from None
        if rank_error is None or isinstance(rank_error, CommError):
            raise error.with_traceback(None) from None
        short = SPMDError(f"rank {error.rank} failed: {type(rank_error).__name__}: {rank_error}",
                          rank=error.rank, error=rank_error, traceback=error.traceback)
        raise short.with_traceback(_without_simulator_frames(rank_error.__traceback__)) from None


def _without_simulator_frames(tb):
    """The traceback from the first frame that is not the simulator's own (tp_from_scratch/comm/)."""
    comm_dir = str(Path(__file__).resolve().parents[1] / "comm")
    while tb is not None and tb.tb_frame.f_code.co_filename.startswith(comm_dir):
        tb = tb.tb_next
    return tb


def _storage_key(x):
    """(kind, start address) of the memory behind an array or tensor; None for other objects."""
    if hasattr(x, "untyped_storage"):  # a torch tensor: views share one storage
        return ("torch", x.untyped_storage().data_ptr())
    return None


def assert_not_aliased(result, inputs, name, rank=None):
    """Fail if ``result`` shares memory with any of ``inputs`` (a view, or the input returned as is).

    A caller who later writes into the result would silently change its input. Arrays and
    tensors only; anything else (None, a tuple of results) is looked into one level deep.
    """
    import numpy as np

    __tracebackhide__ = True
    where = name if rank is None else f"{name} on rank {rank}"
    results = result if isinstance(result, (list, tuple)) else [result]
    for got in results:
        for given in inputs:
            if isinstance(got, np.ndarray) and isinstance(given, np.ndarray):
                shared = np.may_share_memory(got, given)
            elif _storage_key(got) is not None and _storage_key(got) == _storage_key(given):
                shared = got.untyped_storage().nbytes() > 0
            else:
                shared = False
            fix = ("a new tensor (tensor.clone(), or an nn.Parameter of a clone)" if _storage_key(got)
                   else "a new array (np.copy / np.concatenate)")
            assert not shared, (
                f"{where} shares memory with an input (the input itself, or a view of it): return {fix}, "
                f"or writing into the result changes the caller's data")


def expected_calls(t, calls):
    """The collective calls a rank must make; at t = 1 skipping them is accepted too.

    With one rank a sum or gather over the group is its input itself, so an implementation
    may skip the collective (Megatron-LM does) or call it (the library does): both pass.
    """
    return [calls, {}] if t == 1 else [calls]


def collective_calls(comm, reset=False):
    """{collective name: calls} this rank entered since the meter's last reset (then reset if asked)."""
    calls = {name: t.calls for name, t in comm.meter.by_collective.items() if t.calls}
    if reset:
        comm.meter.reset()
    return calls
