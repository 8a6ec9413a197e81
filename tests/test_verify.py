"""tp_from_scratch.verify, proven on implementations whose verdict we know.

* our own tp_from_scratch.nn and Lesson 7's SP layers pass every check: on simulated ranks at
  t = 2, 3, 4, and in worker processes in two TP groups of 2 on 4 processes (t = 2, 3, 4 and
  2of4 in processes, both dtypes: docs/verify.md, measured by hand);
* PyTorch DTensor and Megatron-Core run through the same suite; every row they FAIL is a
  bug documented in docs/verify.md, every other failure is an XFAIL the adapter declared;
* broken adapters (tests/verify_adapters.py) FAIL exactly the check aimed at them: one per
  kind of input (non-contiguous, bias=False, uneven gather_output, two passes, a strict
  subgroup, random shapes, t = 3), one per input variant of the sequence-parallel checks
  (uneven T, non-contiguous, 4-D, two passes), and the picotron bug patterns;
* an adapter that deadlocks, raises on one rank, skips a collective on one rank or fails to
  import on one rank costs one named row, while every other adapter of the same
  launch keeps its full results;
* a correct cross-entropy that fuses two all-reduces passes the collectives check;
* the exit status tells all-pass (0), some FAIL (1), could-not-run (2), nothing checked (3).

Processes are launched twice for the whole module (python -m tp_from_scratch.verify): ours,
the libraries, the from-scratch adapter of docs/verify.md and the group-ignoring one in two TP
groups of 2 on 4 processes (--t 2of4, float64); that adapter and the broken ones at t = 3.
"""
import dataclasses
import functools
import importlib.util
import json
import os
import re
import sys
import threading
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F

from tests import verify_adapters
from tests.verify_adapters import FUSED_CROSS_ENTROPY, INPUT_TARGETS, MODE_TARGETS, TARGETS, exercise_adapter
from tp_from_scratch.comm import run_spmd
from tp_from_scratch.comm.launchers import run_command, subprocess_env
from tp_from_scratch.nn.linear import RowParallelLinear
from tp_from_scratch.nn.mappings import reduce_from_tp_region
from tp_from_scratch.testing import rank_rng
from tp_from_scratch.tools.grading import load_implementation
from tp_from_scratch.verify import exit_status, merge, run_suite, summary, table, write_json
from tp_from_scratch.verify.report import xpasses
from tp_from_scratch.verify.worker import out_of_step
from tp_from_scratch.verify.__main__ import main as verify_main
from tp_from_scratch.verify.adapter import FEATURES, Adapter
from tp_from_scratch.verify.ours import ADAPTER as OURS

REPO = Path(__file__).resolve().parent.parent
# the Exercise 5(a) known-wrong mappings (found by name: the exercise ids may be renamed)
KNOWN_WRONG = next(iter(sorted((REPO / "tests" / "known_wrong").glob("ex05*autograd_mappings"))))
MEGATRON = REPO / "examples" / "megatron_core_adapter.py"
PICOTRON = REPO / "examples" / "picotron_adapter.py"
HAS_MEGATRON = importlib.util.find_spec("megatron") is not None
HAS_PICOTRON = (Path(os.path.expanduser(os.environ.get("PICOTRON", "~/picotron"))) / "picotron").is_dir()

# the check each known-wrong Exercise 5a implementation must FAIL
KNOWN_WRONG_TARGETS = {
    "f_all_reduces_in_forward": ("f", "forward"),
    "g_without_all_reduce": ("g", "forward"),
    "row_bias_on_every_rank": ("row", "forward"),
    "scatter_backward_keeps_own_chunk": ("scatter", "grad input"),
    "f_backward_writes_into_grad": ("f", "inputs untouched"),
    "from_linear_shares_storage": ("row", "inputs untouched"),
    "scatter_returns_a_view": ("scatter", "fresh output"),
    "bias_free_layer_gets_a_zero_bias": ("column", "bias=False"),
}

# The bugs the suite finds in PyTorch 2.13's DTensor TP (docs/verify.md): the embedding's
# weight gradient comes back as a whole (V, H) tensor placed Replicate on every rank, not as
# the Shard(0) block the weight is (its values are right).
DTENSOR_FAILS = {("embedding", check) for check in
                 ("grad weight", "AdamW step", "1-D ids", "3-D ids", "padding_idx",
                  "non-contiguous ids", "two passes (accumulate)", "random shapes",
                  "two forwards, then backwards")}
# ... and loss_parallel raises under torch.inference_mode() ("aten.cross_entropy_loss.default got
# mixed torch.Tensor and DTensor"; torch.no_grad() is fine): an ERROR, loud
DTENSOR_ERRORS = {("cross-entropy", "no_grad / inference_mode forward")}

# ... and in Megatron-Core 0.16.1 (everything else it fails is declared in its adapter):
# g returns a non-contiguous input unreduced; the cross-entropy .view()s its logits
MEGATRON_FAILS = {("g", "non-contiguous input"), ("cross-entropy", "non-contiguous logits")}

BROKEN = ([f"tests.verify_adapters:{name}" for name in (*TARGETS, *INPUT_TARGETS)]  # F_G_WORLD passes here
          + ["tests.verify_adapters:HANGS_ON_RANK_1", "tests.verify_adapters:RAISES_ON_RANK_1",
             "tests.verify_adapters:SKIPS_COLLECTIVE", "tests/verify_rank1_import.py:ADAPTER",
             "tests.verify_adapters:OUT_OF_STEP_ALWAYS", "tests.verify_adapters:FUSED_CROSS_ENTROPY"])


def failed(rows, adapter=None):
    return {(r["component"], r["check"]) for r in rows
            if r["status"] in ("FAIL", "ERROR") and adapter in (None, r["adapter"])}


def status(rows, adapter, component, check):
    return {r["status"] for r in rows
            if (r["adapter"], r["component"], r["check"]) == (adapter, component, check)}


def _simulated(adapter, t, dtypes=(torch.float64, torch.float32)):
    return merge(run_spmd(run_suite, t, adapter, dtypes=dtypes, exclusive=threading.Lock()))


# --- simulated ranks ------------------------------------------------------------------------

@pytest.mark.parametrize("t", [2, 3, 4])   # and t = 2 in processes, in two groups of 2 on 4
def test_our_layers_pass_every_check_on_simulated_ranks(t):
    rows = _simulated(OURS, t)
    # every check ran and passed: nothing skipped, nothing missing, both dtypes
    assert {r["status"] for r in rows} == {"PASS"}, table([r for r in rows if r["status"] != "PASS"])
    assert len(rows) > 200 and {r["dtype"] for r in rows} == {"float64", "float32"}


def _load(path):
    spec = importlib.util.spec_from_file_location(f"known_wrong_{path.stem}", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_each_known_wrong_exercise_fails_its_targeted_check_through_the_adapter_api():
    # a file wrong only at t = 1 (named *_at_t1) is the graders' business: this suite runs t = 2
    paths = sorted(p for p in KNOWN_WRONG.glob("*.py") if not p.stem.endswith("_at_t1"))
    untargeted = {p.stem for p in paths} - set(KNOWN_WRONG_TARGETS)
    assert not untargeted and len(paths) >= 4, f"give {sorted(untargeted)} a target in KNOWN_WRONG_TARGETS"
    # the adapter itself is right: the reference passes every check it reaches
    reference = exercise_adapter(load_implementation(KNOWN_WRONG.name.split("_")[0], "reference"),
                                 "reference")
    rows = _simulated(reference, 2, (torch.float64,))
    assert not failed(rows), table(rows)
    for path in paths:
        rows = _simulated(exercise_adapter(_load(path), path.stem), 2, (torch.float64,))
        assert status(rows, path.stem, *KNOWN_WRONG_TARGETS[path.stem]) == {"FAIL"}, \
            f"{path.stem} passed {KNOWN_WRONG_TARGETS[path.stem]}:\n{table(rows)}"


# the check each known-wrong Exercise 5b cross-entropy must FAIL (masks_target_in_place writes
# into the caller's targets only where some are ignore_index: the ignore_index case sees it)
KNOWN_WRONG_CE = REPO / "tests" / "known_wrong" / "ex05b_vocab_parallel_cross_entropy"
KNOWN_WRONG_CE_TARGETS = {
    "gathers_full_logits": "collectives",
    "ignore_index_not_masked": "ignore_index",
    "masks_target_in_place": "ignore_index",
    "no_max_subtraction": "large logits (x1000)",
    "sum_exp_not_all_reduced": "forward",
    "target_not_masked": "forward",
}


def cross_entropy_adapter(module, name, **fields):
    """An adapter providing only an exercise-style vocab_parallel_cross_entropy."""
    def loss(group, local_logits, target, ignore_index, vocab_start):
        return module.vocab_parallel_cross_entropy(group, local_logits, target, ignore_index,
                                                   vocab_start=vocab_start)
    return Adapter(name=name, cross_entropy=loss, supports=frozenset(FEATURES), **fields)


def _known_wrong_ce_dir():
    # the exercise rename (ex06 -> ex05b) may move this folder; follow it
    return next((p for p in sorted((REPO / "tests" / "known_wrong").glob("*cross_entropy*"))), KNOWN_WRONG_CE)


def test_each_known_wrong_cross_entropy_fails_its_targeted_check_through_the_adapter_api():
    paths = sorted(_known_wrong_ce_dir().glob("*.py"))
    untargeted = {p.stem for p in paths} - set(KNOWN_WRONG_CE_TARGETS)
    assert not untargeted and len(paths) >= 4, f"give {sorted(untargeted)} a target in KNOWN_WRONG_CE_TARGETS"
    for path in paths:
        rows = _simulated(cross_entropy_adapter(_load(path), path.stem), 2, (torch.float64,))
        target = KNOWN_WRONG_CE_TARGETS[path.stem]
        assert status(rows, path.stem, "cross-entropy", target) == {"FAIL"}, \
            f"{path.stem} passed {target}:\n{table(rows)}"


@pytest.mark.parametrize("t", [2, 3])
def test_a_correct_cross_entropy_that_fuses_two_all_reduces_passes(t):
    rows = _simulated(FUSED_CROSS_ENTROPY, t, (torch.float64,))
    mine = [r for r in rows if r["component"] == "cross-entropy"]
    assert {r["status"] for r in mine} == {"PASS"}, table(mine)
    # Megatron makes 3: fewer calls, same bytes, PASS (the no_grad row runs three forwards)
    assert {r["forward"] for r in mine if not r["check"].startswith("no_grad")} == {2}


def _init_adapter(per_rank_seed):
    """Our column layer, default-initialised; with per_rank_seed each rank draws its shard with
    a seed of its own (so the full weight depends on t: what the init check must catch)."""
    from tp_from_scratch.nn.linear import ColumnParallelLinear
    from tp_from_scratch.nn.mappings import tp_rank

    def default_init(group, kind, n_in, n_out, dtype):
        if per_rank_seed:
            torch.manual_seed(1000 + tp_rank(group))
        return ColumnParallelLinear(n_in, n_out, group=group, dtype=dtype)
    return Adapter(name=f"init per rank {per_rank_seed}", default_init=default_init, supports=FEATURES)


def test_default_init_asks_for_the_same_full_weight_at_every_t():
    assert status(_simulated(_init_adapter(False), 2, (torch.float32,)),
                  "init per rank False", "column", "default init") == {"PASS"}
    rows = _simulated(_init_adapter(True), 2, (torch.float32,))
    assert status(rows, "init per rank True", "column", "default init") == {"FAIL"}, table(rows)
    assert {r["severity"] for r in rows if r["status"] == "FAIL"} == {"convention"}


def test_an_exception_is_an_error_row_with_the_library_file_and_line():
    def column(group, linear, gather_output=False):
        raise KeyError("no such layer")  # this line is named in the row
    rows = _simulated(Adapter(name="raises", column=column, supports=FEATURES), 2, (torch.float64,))
    errors = [r for r in rows if r["status"] == "ERROR"]
    assert errors and all("KeyError: 'no such layer' (at tests/test_verify.py:" in r["detail"]
                          for r in errors), table(errors)
    assert "raise KeyError" in errors[0]["traceback"]  # kept for --verbose and the JSON


def test_expected_failures_read_xfail_with_their_reason_and_need_one():
    path = KNOWN_WRONG / "scatter_returns_a_view.py"
    base = exercise_adapter(_load(path), "declared")
    base.expected_failures = {"scatter/*": "returns a view by design"}  # every scatter row
    rows = _simulated(base, 2, (torch.float64,))
    assert status(rows, "declared", "scatter", "fresh output") == {"XFAIL"}
    row = next(r for r in rows if r["check"] == "fresh output" and r["component"] == "scatter")
    assert row["detail"].startswith("expected (FAIL): returns a view by design")
    assert exit_status(rows) == 0  # an expected failure does not fail the run
    with pytest.raises(ValueError, match="needs a 'component/check' pattern and a reason"):
        Adapter(name="x", expected_failures={"scatter/fresh output": ""})


def test_an_adapter_written_for_the_old_api_keeps_working_and_claims_nothing_new():
    old = Adapter(name="old", f=OURS.f, g=OURS.g, supports={"comm", "uneven"})
    assert old.expected_failures == {} and old.sp_gather is None and old.sp_block is None
    rows = _simulated(old, 2, (torch.float64,))
    assert {r["status"] for r in rows if r["component"] in ("f", "g")} == {"PASS"}
    assert {r["status"] for r in rows if r["component"] not in ("f", "g")} == {"NOT PROVIDED"}


def _row(status, check="forward"):
    return dict(adapter="a", component="c", check=check, dtype="float64", t=2, status=status,
                severity="value", detail="", error=None, bound=None, forward=None, backward=None,
                inputs="", traceback="")


def test_exit_status_tells_pass_fail_and_nothing_checked():
    assert exit_status([_row("PASS"), _row("SKIP"), _row("XFAIL")]) == 0
    assert exit_status([_row("PASS"), _row("FAIL")]) == 1
    assert exit_status([_row("PASS"), _row("ERROR")]) == 1
    assert exit_status([_row("NOT PROVIDED"), _row("SKIP")]) == 3  # nothing checked is never a pass
    assert exit_status([]) == 3


def test_the_command_refuses_t_1_bad_arguments_and_a_missing_gpu_before_any_work(capsys, tmp_path):
    out = tmp_path / "x.json"
    assert verify_main(["tp_from_scratch.verify.ours:ADAPTER", "--t", "1", "--json", str(out)]) == 3
    assert "nothing checked at t = 1" in capsys.readouterr().err
    assert verify_main(["tp_from_scratch.verify.ours:ADAPTER", "--dtypes", "float65"]) == 2
    assert "--dtypes: float65 is not a torch dtype" in capsys.readouterr().err
    assert verify_main(["nowhere/mylib.py:ADAPTER"]) == 2
    assert "adapter 'nowhere/mylib.py:ADAPTER': no file nowhere/mylib.py" in capsys.readouterr().err
    assert verify_main(["mylib"]) == 2 and "expected module:NAME" in capsys.readouterr().err
    if torch.cuda.device_count() < 4:
        assert verify_main(["tp_from_scratch.verify.ours:ADAPTER", "--device", "cuda"]) == 3
        assert "--device cuda: SKIP" in capsys.readouterr().err
    assert not out.exists()


@pytest.mark.parametrize("statuses, code", [(("PASS", "XFAIL", "SKIP"), 0), (("PASS", "FAIL"), 1),
                                             (("NOT PROVIDED", "SKIP"), 3)])
def test_the_command_exits_with_the_status_of_its_rows(monkeypatch, tmp_path, capsys, statuses, code):
    # the launches replaced by rows of known statuses: main's printing, JSON and exit status
    import tp_from_scratch.verify.__main__ as command
    monkeypatch.setattr(command, "run_world", lambda config, world, t, declared=None: [
        dict(_row(s), t=t, world=world) for s in statuses])
    out = tmp_path / "rows.json"
    assert command.main(["x:ADAPTER", "--t", "2", "--json", str(out)]) == code
    assert "nothing checked" in capsys.readouterr().out or code != 3
    assert [r["status"] for r in json.loads(out.read_text())["rows"]] == list(statuses)


def test_the_json_has_a_schema_run_metadata_and_every_row_whole(tmp_path):
    rows = _simulated(exercise_adapter(_load(KNOWN_WRONG / "g_without_all_reduce.py"), "g"), 2,
                      (torch.float64,))
    write_json(rows, tmp_path / "out.json", dict(seed=5, t=[2], device="cpu"))
    document = json.loads((tmp_path / "out.json").read_text())
    assert document["schema"] == "tp_from_scratch.verify/3" and document["run"]["seed"] == 5
    longest = max(len(r["detail"]) for r in rows)
    assert max(len(r["detail"]) for r in document["rows"]) == longest > 200  # nothing truncated
    assert all(set(r["ranks"]) == {"0", "1"} for r in document["rows"])  # each rank's state


# --- issue 38: what a model does outside one forward-backward, and telling the truth ----------

@pytest.mark.parametrize("name", list(MODE_TARGETS))
def test_each_contract_3_bug_fails_its_new_check_and_nothing_else(name):
    # a layer keeping its input for dW, one skipping its all-reduce without grad, an SP block
    # gathering in reversed order: each passed every check there was before
    adapter = getattr(verify_adapters, name)
    rows = _simulated(adapter, 2, (torch.float64,))
    component, check = MODE_TARGETS[name]
    assert status(rows, adapter.name, component, check) == {"FAIL"}, table(rows)
    assert failed(rows, adapter.name) == {(component, check)}, table([r for r in rows if r["status"] == "FAIL"])
    row = next(r for r in rows if (r["component"], r["check"]) == (component, check))
    assert row["detail"].startswith("rank 0: FAIL: (a check new in contract 3") and row["since"] == 3


def _declaring(expected, contract=None):
    """The no-grad bug (a wrong value in its no_grad row) with these expected failures."""
    return dataclasses.replace(verify_adapters.ROW_NO_GRAD_SKIPS_REDUCE, name="declared",
                               expected_failures=expected, contract=contract)


def test_an_expected_failure_covers_its_check_not_the_row_and_one_that_passes_is_xpass():
    # "row/forward" expects the forward to fail: the no_grad row's wrong value is not covered
    rows = _simulated(_declaring({"row/forward": "a forward we think fails"}), 2, (torch.float64,))
    assert status(rows, "declared", "row", "no_grad / inference_mode forward") == {"FAIL"}
    assert exit_status(rows) == 1
    # the forward passes everywhere: the expectation is reported as an XPASS (exit status unchanged)
    declared = {"declared": dict(contract=3, patterns={"row/forward": "a forward we think fails"})}
    assert xpasses(rows, declared) == [dict(adapter="declared", pattern="row/forward",
                                            reason="a forward we think fails")]
    assert "XPASS declared: expected_failures['row/forward']" in summary(rows, None, declared)
    # the check that does fail, declared: XFAIL (in that row only), and no XPASS
    expected = {"row/*/no-grad forward": "partial sums without grad, on purpose"}
    rows = _simulated(_declaring(expected), 2, (torch.float64,))
    assert status(rows, "declared", "row", "no_grad / inference_mode forward") == {"XFAIL"}
    assert not xpasses(rows, {"declared": dict(contract=3, patterns=expected)}) and exit_status(rows) == 0


def test_an_adapter_of_an_older_contract_runs_unchanged_and_is_told_what_changed():
    # contract 2: a "component/row" pattern still covers the whole row; the token-order check,
    # which needs a contract-3 block (block.mix), reads SKIP with what it needs
    old = dataclasses.replace(OURS, name="ours, contract 2", contract=2,
                              expected_failures={"row/no_grad*": "a whole row, as before"})
    rows = _simulated(old, 2, (torch.float64,))
    token = [r for r in rows if (r["component"], r["check"]) == ("sp block", "token order")]
    assert [r["status"] for r in token] == ["SKIP"] and "block.mix" in token[0]["detail"]
    assert not failed(rows)
    # contract 3 (the default): the same "component/row" pattern names no check, and the row
    # that it meant says so, with the pattern to write instead
    rows = _simulated(_declaring({"row/no_grad*": "a whole row"}), 2, (torch.float64,))
    row = next(r for r in rows if (r["component"], r["check"]) == ("row", "no_grad / inference_mode forward"))
    assert row["status"] == "FAIL" and "names this row, not a check: since contract 3" in row["detail"]
    assert "'row/no_grad / inference_mode forward/no-grad forward'" in row["detail"]
    with pytest.raises(ValueError, match="contract 9: this suite knows 1 to 3"):
        Adapter(name="x", contract=9)


def test_out_of_step_is_judged_per_tp_group():
    record = lambda group, calls, message="": dict(group=group, calls=calls, message=message, raised=False)  # noqa: E731
    # two groups on different data making different numbers of calls, each in step with itself
    assert not out_of_step([record(0, [1, 0]), record(0, [1, 0]), record(1, [2, 0]), record(1, [2, 0])])
    assert out_of_step([record(0, [1, 0]), record(0, [2, 0]), record(1, [2, 0]), record(1, [2, 0])])
    assert out_of_step([record(0, [1, 0]), record(0, [1, 0], "RuntimeError: Gloo timed out")])


def test_the_raising_rank_comes_before_the_ranks_that_timed_out():
    timeout = "RuntimeError: [gloo] Timed out waiting 10000ms for recv operation to complete"
    per_rank = [[dict(_row(status), detail=detail)] for status, detail in
                (("ERROR", timeout), ("ERROR", "ValueError: rank 1 cannot take it (at mylib.py:3)"),
                 ("ERROR", timeout))]
    detail = merge(per_rank)[0]["detail"]
    assert detail.startswith("rank 1: ERROR: ValueError"), detail
    assert detail.index("ranks 0, 2: ERROR: RuntimeError: [gloo]") > 0


def test_a_stuck_rank_is_told_the_machine_may_be_busy():
    from tp_from_scratch.verify.supervisor import _state
    said = _state("ended", "0.2.0.5 forward", "")
    assert said.startswith("did not finish: stuck in 0.2.0.5 forward") and "machine too busy" in said
    assert "(--check-timeout 10)" in said and "rerun with a larger --check-timeout" in said and "load average" in said


def test_the_default_seed_is_fixed_and_printed_and_an_empty_t_cannot_run(monkeypatch, capsys):
    import tp_from_scratch.verify.__main__ as command
    seen = []
    monkeypatch.setattr(command, "run_world", lambda config, world, t, declared=None: seen.append(config.seed)
                        or [dict(_row("PASS"), t=t, world=world)])
    assert command.main(["x:ADAPTER", "--t", "2"]) == 0 and seen == [0]
    assert "seed 0 (--seed 0 reproduces)" in capsys.readouterr().out
    assert command.main(["x:ADAPTER", "--t", "2", "--seed", "7"]) == 0 and seen == [0, 7]
    capsys.readouterr()
    assert command.main(["x:ADAPTER", "--t", ""]) == 2 and seen == [0, 7]   # nothing launched
    assert "--t '': no launch given" in capsys.readouterr().err


def test_the_summary_puts_failures_first_and_the_table_can_show_them_alone():
    rows = [dict(_row("PASS"), check="a"), dict(_row("FAIL"), check="b", detail="wrong"),
            dict(_row("NOT PROVIDED"), check="c"), dict(_row("NOT PROVIDED"), check="d")]
    text = summary(rows)
    assert text.index("value failures (1 rows)") < text.index("adapter") < text.index("1 FAIL")
    only = table(rows, failures_only=True).splitlines()
    assert len(only) == 3 and " b " in only[2] and "FAIL" in only[2]
    assert "(2 checks)" in table(rows)   # a component's NOT PROVIDED rows: one line


# --- processes: python -m tp_from_scratch.verify --------------------------------------------

def result_text(launch):
    return launch[0].stdout


def _launch(args, tmp_path, name):
    out = tmp_path / f"{name}.json"
    env = subprocess_env(PICOTRON=os.environ.get("PICOTRON", "~/picotron"))
    result = run_command([sys.executable, "-m", "tp_from_scratch.verify", *args,
                          "--seed", "3", "--json", out], timeout=500, cwd=REPO, env=env)
    assert out.exists(), result.stdout[-4000:]
    return result, json.loads(out.read_text())


@pytest.fixture(scope="module")
def launched(tmp_path_factory):
    """launched(name): (the command's result, the JSON document), each launch once per module."""
    tmp, done = tmp_path_factory.mktemp("verify"), {}
    libraries = ["tp_from_scratch.verify.ours:ADAPTER", "tp_from_scratch.verify.dtensor:ADAPTER"]
    libraries += [f"{MEGATRON}:ADAPTER"] if HAS_MEGATRON else []
    libraries += [f"{PICOTRON}:ADAPTER", f"{PICOTRON}:ASYNC_ADAPTER"] if HAS_PICOTRON else []
    # docs/verify.md's complete from-scratch adapter, exactly as printed there
    doc = (REPO / "docs" / "verify.md").read_text()
    (tmp / "mytp.py").write_text(doc.split("```python\n", 1)[1].split("```", 1)[0])
    mytp = f"{tmp / 'mytp.py'}:ADAPTER"
    launches = {
        # two TP groups of 2 on 4 processes, different data in each
        # (float64 only: the float32 rows fail alike, docs/verify.md; ours runs both simulated)
        "libraries": [*libraries, "tests.verify_adapters:F_G_WORLD", "tests.verify_adapters:GROUP_1_EXTRA_CALL",
                      mytp, "--t", "2of4", "--dtypes", "float64"],
        # a check timeout of 5 s: the hanging and the collective-skipping adapters cost 5-10 s;
        # one fresh start per adapter: the always-out-of-step one is given up at its second
        "broken": [*BROKEN, mytp, "--t", "3", "--dtypes", "float64", "--check-timeout", "5",
                   "--restarts", "1"],
    }

    def get(name):
        if name not in done:
            done[name] = _launch(launches[name], tmp, name)
        return done[name]
    return get


@functools.lru_cache
def _our_row_count(dtypes):
    return len(_simulated(OURS, 2, dtypes))  # the same rows at every t


def _ours_complete(rows, t, dtypes):
    """Ours: every row PASS, as many as on simulated ranks (nothing lost to a broken neighbour)."""
    ours = [r for r in rows if r["adapter"] == OURS.name and r["t"] == t]
    assert {r["status"] for r in ours} == {"PASS"}, table([r for r in ours if r["status"] != "PASS"])
    assert len(ours) == _our_row_count(dtypes), len(ours)


@pytest.mark.slow
@pytest.mark.timeout(600)
def test_libraries_in_two_tp_groups_fail_only_their_documented_bugs(launched):
    result, document = launched("libraries")
    rows = document["rows"]
    _ours_complete(rows, 2, (torch.float64,))
    mytp = [r for r in rows if r["adapter"] == "mytp" and r["status"] not in ("NOT PROVIDED", "SKIP")]
    assert mytp and {r["status"] for r in mytp} == {"PASS"}, table(mytp)
    assert failed(rows, "pytorch DTensor") == DTENSOR_FAILS | DTENSOR_ERRORS, table(
        [r for r in rows if r["adapter"] == "pytorch DTensor" and r["status"] in ("FAIL", "ERROR")])
    # its embedding's gradient: right values, placed Replicate: a placement (memory) defect
    assert {r["severity"] for r in rows if r["adapter"] == "pytorch DTensor" and r["status"] == "FAIL"} \
        == {"placement"}
    assert "placement failures" in result.stdout and "error failures" in result.stdout
    # two TP groups making different numbers of calls, each in step with itself: no fresh start,
    # every value right (its collectives rows count the extra call: a convention FAIL, truly)
    extra = [r for r in rows if r["adapter"] == verify_adapters.GROUP_1_EXTRA_CALL.name
             and r["status"] not in ("NOT PROVIDED", "SKIP")]
    assert extra and not any(r["check"] == "ranks in step" for r in extra), table(extra)
    assert {r["status"] for r in extra if r["check"] != "collectives"} == {"PASS"}, table(extra)
    assert result.returncode == 1  # DTensor's FAIL rows
    assert "max error" in result.stdout and "value failures" in result.stdout  # table, summary
    assert document["run"]["seed"] == 3 and document["run"]["versions"]["torch"]
    if HAS_MEGATRON:
        mine = [r for r in rows if r["adapter"].startswith("megatron-core")]
        assert mine and failed(mine) == MEGATRON_FAILS, table(
            [r for r in mine if r["status"] in ("FAIL", "ERROR")])
        xfails = [r for r in mine if r["status"] == "XFAIL"]
        assert xfails and all(r["detail"].startswith("expected (") for r in xfails)
        # what it does right: the layers' values, steps, counts, and its init at every t
        for check in ("forward", "grad input", "grad weight", "grad bias", "SGD step",
                      "AdamW step", "collectives", "default init", "bias=False",
                      "two passes (accumulate)", "non-contiguous input", "random shapes"):
            for component in ("column", "row"):
                assert status(mine, mine[0]["adapter"], component, check) == {"PASS"}, (component, check)
    if HAS_PICOTRON:  # its two bugs FAIL; what it does on purpose is declared XFAIL
        mine = [r for r in rows if r["adapter"].startswith("picotron")]
        assert failed(mine, "picotron") == {("embedding", "padding_idx")}, table(mine)
        async_bug = {("column", "2-D input"), ("column", "4-D input")}  # and random shapes not 3-D
        assert async_bug <= failed(mine, "picotron async column") <= async_bug | {("column", "random shapes")}


@pytest.mark.slow
@pytest.mark.timeout(600)
def test_each_bug_fails_the_check_aimed_at_it_and_nothing_else(launched):
    result, document = launched("broken")
    rows = document["rows"]
    assert result.returncode == 1
    for name, (component, check) in TARGETS.items():   # the picotron patterns, at t = 3
        adapter = getattr(verify_adapters, name).name
        assert status(rows, adapter, component, check) & {"FAIL", "ERROR"}, name
        assert {c for c, _ in failed(rows, adapter)} == {component}, (name, failed(rows, adapter))
    _, libraries = launched("libraries")
    for name, (component, check, launch) in INPUT_TARGETS.items():
        adapter = getattr(verify_adapters, name).name
        mine = [r for r in (rows if launch == "t3" else libraries["rows"]) if r["adapter"] == adapter]
        assert status(mine, adapter, component, check) & {"FAIL", "ERROR"}, (name, table(mine))
        # each bug is invisible to the checks there were before: the fixed 3-D, even,
        # contiguous, one-pass, bias=True cases, on a TP group that is the world
        before = {"forward", "grad input", "grad weight", "grad bias", "SGD step", "AdamW step"}
        assert name in ("F_G_WORLD", "SCATTER_POW2_MASK") or not {k for _, k in failed(mine)} & before, \
            (name, failed(mine))
    # the world-wide f/g are right when the group is the world (t = 3), wrong in 2 groups of 2
    assert not failed(rows, verify_adapters.F_G_WORLD.name)


@pytest.mark.slow
@pytest.mark.timeout(600)
def test_a_rank_that_hangs_raises_or_skips_costs_one_named_row(launched):
    _, document = launched("broken")
    rows = document["rows"]
    at3 = [r for r in rows if r["t"] == 3]
    hang = [r for r in at3 if r["adapter"] == "bug: g hangs on rank 1" and r["status"] == "ERROR"]
    assert [r["check"] for r in hang] == ["2-D input"], table(hang)
    assert "rank 1: did not finish: stuck in" in hang[0]["detail"]
    raised = [r for r in at3 if r["adapter"] == "bug: row raises on rank 1" and r["status"] == "ERROR"]
    assert [r["check"] for r in raised] == ["4-D input"], table(raised)
    assert raised[0]["ranks"]["0"] == "PASS" and raised[0]["ranks"]["2"] == "PASS"
    assert raised[0]["ranks"]["1"].startswith(
        "ERROR: ValueError: rank 1 cannot take a 4-D input (at tests/verify_adapters.py:")
    skipped = [r for r in at3 if r["adapter"] == "bug: g skipped on rank 1" and r["status"] == "ERROR"]
    assert {r["check"] for r in skipped} == {"4-D input", "ranks in step"}, table(skipped)
    # the rank-1 import error, at once, and the adapter's checks skipped on every rank
    load = [r for r in rows if r["adapter"] == "tests/verify_rank1_import.py:ADAPTER"]
    assert {(r["check"], r["status"]) for r in load} == {("load", "ERROR")}, table(load)
    assert "rank 1: ERROR: RuntimeError: adapter import failed on rank 1 only (at " in load[0]["detail"]
    # an adapter out of step in every check costs its --restarts (1) fresh starts, then its own
    # remaining rows only: one row says so
    always = [r for r in at3 if r["adapter"] == verify_adapters.OUT_OF_STEP_ALWAYS.name]
    gave_up = [r for r in always if "gave up on this adapter after 2 fresh starts" in r["detail"]]
    assert len(gave_up) == 1 and "--restarts 1" in gave_up[0]["detail"], table(always)
    assert sum(r["check"] == "ranks in step" for r in always) == 2, table(always)
    # the stuck rank's row says what a timeout may mean; the progress was printed as it ran
    assert "machine too busy" in hang[0]["detail"] and "--check-timeout" in hang[0]["detail"]
    assert "checks done; now tests.verify_adapters" in result_text(launched("broken"))
    # the rest of the launch lost nothing: the correct adapters launched with the broken ones
    # (after every broken one) have every row they reach, passing (docs/verify.md's mytp:
    # column, row, f, g)
    for name, components in ((FUSED_CROSS_ENTROPY.name, 1), ("mytp", 4)):
        mine = [r for r in rows if r["adapter"] == name and r["status"] not in ("NOT PROVIDED", "SKIP")]
        assert {r["status"] for r in mine} == {"PASS"}, table(mine)
        assert len({r["component"] for r in mine}) == components and len(mine) > 10 * components


# --- issue 38 audit: what the contract-3 claims lacked a test for ------------------------------

class _RowInferenceModeSkipsReduce(RowParallelLinear):
    """Reduces under torch.no_grad() but not under torch.inference_mode() (a generation path
    that checks the one and not the other): only the inference_mode forward can see it."""

    def forward(self, x):
        partial = F.linear(x, self.weight)
        y = partial if torch.is_inference_mode_enabled() else reduce_from_tp_region(self.group, partial)
        return y if self.bias is None else y + self.bias


def test_the_no_grad_check_runs_inference_mode_apart_from_no_grad():
    adapter = dataclasses.replace(verify_adapters.ROW_NO_GRAD_SKIPS_REDUCE, name="bug: row skips under inference_mode",
                                  row=lambda group, linear, input_is_parallel=True:
                                  _RowInferenceModeSkipsReduce.from_linear(linear, group=group))
    rows = _simulated(adapter, 2, (torch.float64,))
    assert failed(rows, adapter.name) == {("row", "no_grad / inference_mode forward")}, table(rows)
    row = next(r for r in rows if r["check"] == "no_grad / inference_mode forward" and r["component"] == "row")
    assert "no-grad Y under torch.inference_mode()" in row["detail"], row["detail"]
    assert "no-grad Y under torch.no_grad()" not in row["detail"], row["detail"]   # that forward is right


class _Placed:
    """A stand-in for a DTensor: a local tensor and its placements."""

    def __init__(self, local, placements):
        self.local, self.placements = local, placements

    def to_local(self):
        return self.local


def test_a_gradient_with_right_values_placed_whole_is_a_placement_failure_listed_after_value_ones():
    # DTensor's embedding gradient: the whole (V, H) on every rank where its (V/t, H) block was
    # expected. The values are right: a memory and placement defect, not a wrong value
    from tp_from_scratch.verify.recorder import Recorder
    from tp_from_scratch.verify.suite import _severity
    whole = torch.tensor(rank_rng(38, 0).standard_normal((6, 4)))
    recorder = Recorder(None)
    recorder.match(_Placed(whole, ("Replicate()",)), whole[3:], name="grad weight", rank=1)
    recorder.match(_Placed(whole + 1e-3, ("Replicate()",)), whole[3:], name="grad weight", rank=1)  # wrong too
    placed, wrong = recorder.entries
    assert not placed.ok and _severity(placed) == "placement" and "its values are right" in placed.why, placed
    assert not wrong.ok and _severity(wrong) == "value", wrong
    rows = [dict(_row("FAIL"), severity="placement", check="grad weight"), dict(_row("FAIL"), check="forward")]
    text = summary(rows)
    assert text.index("value failures (1 rows)") < text.index("placement failures (1 rows)"), text


def test_every_check_new_in_this_contract_is_named_in_the_docs_with_its_contract():
    # an adapter author reads what changed in docs/verify.md: each check a contract added is
    # listed there by its name and contract, and the table of contracts reaches this one
    from tp_from_scratch.verify.adapter import CONTRACT
    from tp_from_scratch.verify.suite import all_cases
    doc = (REPO / "docs" / "verify.md").read_text()
    assert f"\n| {CONTRACT} | " in doc and f"**contract {CONTRACT}**" in doc
    new = {(c.check, c.since) for c in all_cases(2, 0, frozenset(FEATURES)) if c.since}
    assert {since for _, since in new} == {CONTRACT} and len(new) >= 3, new
    for check, since in sorted(new):   # "**token order** (sp block; contract 3)"
        assert re.search(re.escape(f"**{check}**") + rf" \([^)]*contract {since}\)", doc), check


def test_progress_lines_say_how_far_and_which_adapter_while_it_runs(monkeypatch):
    # one line every PROGRESS seconds while the workers run, not only the table at the end
    # (the launched tests see these lines too: test_a_rank_that_hangs_raises_or_skips_costs_one_named_row)
    from tp_from_scratch.verify import supervisor

    class Store:   # the supervisor's key-value store, holding where rank 0 is
        def check(self, keys):
            return keys == ["L/at/0"]

        def get(self, key):
            return b"1.2.0.5 forward"   # adapter 1, its checks (stage 2), dtype 0, item 5
    monkeypatch.setattr(supervisor, "PROGRESS", 0.0)
    lines = []
    config = supervisor.Config(adapters=["a.py:ADAPTER", "b.py:ADAPTER"], dtypes=["float64"], progress=lines.append)
    progress = supervisor._Progress(config, "3", 3, {1: "adapter b"})
    progress.tick(Store(), "L", published=9)
    assert lines == ["verify: t = 3: 3 checks done; now adapter b float64"], lines
