"""``verify model``: hold a whole tensor-parallel model to its single-device self.

    .venv/bin/python -m tp_from_scratch.verify model --hf DIR [--tp-plan auto]
    .venv/bin/python -m tp_from_scratch.verify model --entry examples/dtensor_model.py:tiny_lm
    .venv/bin/python -m tp_from_scratch.verify model --ours gpt,llama,deepseek
    .venv/bin/python -m tp_from_scratch.verify model --zoo          # transformers' TP, 8 tiny configs
    .venv/bin/torchrun --standalone --nproc-per-node 2 -m tp_from_scratch.verify model --hf DIR --tp-plan auto

Every source runs at each launch of --t (default 2,3,4,2of4: t ranks, and two TP groups of 2 on
4 processes, each group on its own data) and dtype. Each configuration ends in one verdict:
refused at load (the library's message), crashed (the phase, the module running, the message),
differs (the first divergence: verify/locator.py), equal. The command starts and supervises the
processes itself (verify/model_worker.py), one world per world size; under torchrun rank 0
supervises a world of WORLD_SIZE and the other ranks leave at once.

Exit status: 0 every configuration equal, 1 one refused, crashed or differs, 2 could not run
(bad input, refused in one line before any process starts), 3 nothing checked.
"""
import argparse
import importlib.util
import json
import os
import signal
import sys
import tempfile
import time
from datetime import timedelta
from pathlib import Path

import torch

from tp_from_scratch.verify.report import busy
from tp_from_scratch.verify.supervisor import PROGRESS, start_workers
from tp_from_scratch.verify.worker import FINISHED, RESTART

COULD_NOT_RUN, NOTHING_CHECKED, SOME_FAIL, ALL_EQUAL = 2, 3, 1, 0
SCHEMA = "tp_from_scratch.verify.model/1"
OURS = ("gpt", "gpt2", "llama", "deepseek", "deepseek-etp")
VERDICTS = ("equal", "differs", "crashed", "refused at load", "stuck", "not offered")


class Refused(Exception):
    """Bad input: one line, exit 2 (3 for t = 1: nothing to check), before any process starts."""

    def __init__(self, message, code=COULD_NOT_RUN):
        super().__init__(message)
        self.code = code


def parser():
    p = argparse.ArgumentParser(prog="python -m tp_from_scratch.verify model", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--hf", action="append", default=[], metavar="DIR",
                   help="a save_pretrained directory, run through transformers' own TP (repeatable)")
    p.add_argument("--tp-plan", default="auto", help="transformers' tp_plan: auto, or a JSON file of rules")
    p.add_argument("--entry", action="append", default=[], metavar="MODULE:FUNCTION",
                   help="FUNCTION(mesh, dtype) -> (reference, parallel): your model and its DTensor plan")
    p.add_argument("--ours", default="", help=f"comma-separated, of {', '.join(OURS)}")
    p.add_argument("--zoo", action="store_true", help="transformers' TP on the config zoo (verify/zoo.py)")
    p.add_argument("--t", default=None, help="launches: t, or TofW (TP groups of T on W processes); "
                   "default 2,3,4,2of4 (under torchrun: its WORLD_SIZE)")
    p.add_argument("--dtypes", default="float64,float32")
    p.add_argument("--seed", type=int, default=0, help="seed of the weights and ids (default 0; printed)")
    p.add_argument("--timeout", type=float, default=180.0,
                   help="seconds one configuration may take before its ranks are reported stuck")
    p.add_argument("--json", help="write every configuration's record here")
    return p


def _launches(text):
    default = os.environ.get("WORLD_SIZE", "2") if "RANK" in os.environ else "2,3,4,2of4"
    if text is not None and not text.strip():
        raise Refused(f"--t {text!r}: no launch given (e.g. --t 3 or --t 2,2of4)")
    out = []
    for entry in (text or default).split(","):
        group, _, world = entry.partition("of")
        try:
            group, world = int(group), int(world or group)
        except ValueError:
            raise Refused(f"--t {text!r}: expected entries such as 3 or 2of4") from None
        if group < 1 or world % group:
            raise Refused(f"--t {entry}: TP groups of {group} do not tile {world} processes")
        out.append((world, group))
    return out, text is not None


def _check_entry(spec):
    where, _, name = spec.rpartition(":")
    if not where or not name:
        raise Refused(f"--entry {spec!r}: expected module:function or file.py:function")
    if where.endswith(".py"):
        if not os.path.isfile(where):
            raise Refused(f"--entry {spec}: no file {where}")
        source = Path(where).read_text()
        if f"def {name}" not in source and f"{name} =" not in source:
            raise Refused(f"--entry {spec}: {where} defines no {name}")
        return
    try:
        found = importlib.util.find_spec(where)
    except (ImportError, ValueError):
        found = None
    if found is None:
        raise Refused(f"--entry {spec}: no module {where} (run from your project's root or set PYTHONPATH)")
    from tp_from_scratch.verify.models import load_entry
    try:
        load_entry(spec)
    except AttributeError:
        raise Refused(f"--entry {spec}: {where} has no {name}") from None


def _check_hf(directory, plan):
    path = Path(directory)
    if not path.is_dir():
        raise Refused(f"--hf {directory}: not a directory")
    if not (path / "config.json").is_file():
        raise Refused(f"--hf {directory}: not a model directory (no config.json)")
    if not any(path.glob("*.safetensors")) and not any(path.glob("*.bin")):
        raise Refused(f"--hf {directory}: no weights (*.safetensors or *.bin) beside its config.json")
    if plan != "auto" and not os.path.isfile(plan):
        raise Refused(f"--tp-plan {plan}: neither auto nor a JSON file")


def ours_problem(name, t):
    """Why this course's model ``name`` cannot run at t, or ''."""
    from tp_from_scratch.verify.models import ours_gpt_config
    try:
        if name.startswith("deepseek"):
            from tp_from_scratch.deepseek.check import tiny_model_config
            from tp_from_scratch.deepseek.model import check_config
            check_config(tiny_model_config(), t, "expert tensor parallel" if name.endswith("etp")
                         else "experts on all tokens")
        else:
            ours_gpt_config(name, t).validate(t)
    except ValueError as error:
        return str(error)
    return ""


def plan_configurations(args):
    """[(label, source)] and [(world, group)], validated; Refused on bad input."""
    launches, explicit = _launches(args.t)
    if any(g == 1 for _, g in launches):
        raise Refused(f"--t {args.t}: nothing checked at t = 1 (one rank has no collective and no shard); "
                      "use t >= 2", NOTHING_CHECKED)
    dtypes = args.dtypes.split(",")
    bad = [d for d in dtypes if not isinstance(getattr(torch, d, None), torch.dtype)]
    if bad:
        raise Refused(f"--dtypes: {', '.join(bad)} is not a torch dtype (e.g. float64,float32)")
    for directory in args.hf:
        _check_hf(directory, args.tp_plan)
    for spec in args.entry:
        _check_entry(spec)
    ours = [o for o in args.ours.split(",") if o]
    for name in ours:
        if name not in OURS:
            raise Refused(f"--ours {name}: expected one of {', '.join(OURS)}")
    if args.json and not os.path.isdir(os.path.dirname(os.path.abspath(args.json))):
        raise Refused(f"--json {args.json}: its folder does not exist")
    if args.timeout <= 0:
        raise Refused(f"--timeout {args.timeout}: must be positive")
    sources = [(f"hf:{d}", f"hf:{d}::{args.tp_plan}") for d in args.hf]
    sources += [(f"entry:{e}", f"entry:{e}") for e in args.entry]
    sources += [(f"ours:{o}", f"ours:{o}") for o in ours]
    if explicit:
        for label, source in sources:
            if source.startswith("ours:"):
                for world, g in launches:
                    problem = ours_problem(source[5:], g)
                    if problem:
                        raise Refused(f"--t {g}: {label} cannot take t = {g}: {problem}")
    return sources, launches, dtypes


def _refuse(code, message):
    print(f"verify model: {message}", file=sys.stderr)
    return code


def configurations(sources, launches, dtypes):
    """Every (label, source, world, group, dtype), and a 'not offered' record for each that
    the source cannot take (transformers' TP spans the whole world; ours names its limits)."""
    items, skipped = [], []
    for label, source in sources:
        for world, g in launches:
            reason = ""
            if source.startswith("hf:") and world != g:
                reason = ("transformers 5.24 applies tp_plan over the whole world (tp_size = WORLD_SIZE / "
                          "the other parallel sizes): a TP group inside a larger world comes only with FSDP")
            elif source.startswith("ours:"):
                reason = ours_problem(source[5:], g)
            for dtype in dtypes:
                entry = dict(label=label, source=source, world=world, group=g, dtype=dtype)
                (skipped if reason else items).append(dict(entry, reason=reason) if reason else entry)
    return items, skipped


# ---------------------------------------------------------------------------------------
# Supervision: one world of processes per world size
# ---------------------------------------------------------------------------------------

def _spawn(world, items_file, store_port, launch, after, args, logs):
    argv = ["--store", f"127.0.0.1:{store_port}", "--launch", launch, "--items", items_file,
            "--shared", logs / "shared", "--after", after, "--seed", args.seed, "--timeout", args.timeout]
    return start_workers("tp_from_scratch.verify.model_worker", world, argv, logs, launch,
                         HF_HUB_OFFLINE="1", TOKENIZERS_PARALLELISM="false")


def _end(procs):
    for p in procs:
        if p.poll() is None:
            os.killpg(p.pid, signal.SIGKILL)
    for p in procs:
        p.wait()


def _watch(procs, store, launch, stall, tick=None):
    last, moved = None, time.monotonic()
    while True:
        if tick is not None:
            tick(store.add(f"{launch}/progress", 0))
        codes = [p.poll() for p in procs]
        if all(c is not None for c in codes):
            return codes
        if any(c not in (None, FINISHED) for c in codes):
            time.sleep(0.5)   # the others leave by themselves (RESTART) or are stuck
            codes = [p.poll() for p in procs]
            _end(procs)
            return ["ended" if c is None else c for c in codes]
        now = store.add(f"{launch}/progress", 0), [store.get(f"{launch}/at/{r}") if store.check(
            [f"{launch}/at/{r}"]) else b"" for r in range(len(procs))]
        if now != last:
            last, moved = now, time.monotonic()
        elif time.monotonic() - moved > stall:
            _end(procs)
            return ["ended"] * len(procs)
        time.sleep(0.2)


def _tail(logs, launch, rank, lines=4):
    path = logs / f"{launch.replace('/', '_')}_rank{rank}.log"
    text = path.read_text(errors="replace").strip().splitlines() if path.exists() else []
    return " | ".join(line.strip() for line in text[-lines:])


def run_world(world, items, args):
    """{item index: [every rank's record]} for the items of one world, restarting past a stuck one."""
    import torch.distributed as dist
    store = dist.TCPStore("127.0.0.1", 0, is_master=True, wait_for_workers=False, timeout=timedelta(seconds=30))
    results, after = {}, -1
    with tempfile.TemporaryDirectory(prefix="verify_model_") as tmp:
        logs = Path(tmp)
        items_file = str(logs / "items.json")
        Path(items_file).write_text(json.dumps(items))
        said = [time.monotonic() + PROGRESS]

        def tick(published):   # every rank publishes each configuration's record
            if time.monotonic() > said[0]:
                said[0] = time.monotonic() + PROGRESS
                print(f"verify model: {world} processes: {after + 1 + published // world} of {len(items)} "
                      "configurations done", file=sys.stderr, flush=True)
        for attempt in range(len(items) + 1):
            launch = f"w{world}/{attempt}"
            procs = _spawn(world, items_file, store.port, launch, after, args, logs)
            codes = _watch(procs, store, launch, args.timeout + 60, tick)
            for i in range(after + 1, len(items)):
                keys = [f"{launch}/done/{i}/{r}" for r in range(world)]
                if all(store.check([k]) for k in keys):
                    results[i] = [json.loads(store.get(k)) for k in keys]
            if all(c == FINISHED for c in codes) and len(results) == len(items):
                return results
            done = [i for i in results if i > after]
            stuck = max(done, default=after) + 1
            if stuck >= len(items):   # every item has its records; the exit was after the last
                return results
            if done and all(c == RESTART for c in codes):   # out of step after a complete item
                after = max(done)
                continue
            if not done and after == -1 and not any(store.check([f"{launch}/at/{r}"]) for r in range(world)):
                tails = "; ".join(f"rank {r}: {_tail(logs, launch, r)}" for r in range(world))
                raise Refused(f"the {world} worker processes never started a configuration: {tails}")
            states = []
            for r in range(world):
                key = f"{launch}/done/{stuck}/{r}"
                at = store.get(f"{launch}/at/{r}").decode() if store.check([f"{launch}/at/{r}"]) else ""
                if store.check([key]):
                    rec = json.loads(store.get(key))
                    states.append(dict(rec, rank=r))
                else:
                    phase = at.split(" ", 1)[1] if at.startswith(f"{stuck} ") else "start-up"
                    how = ("ended by the supervisor; " + busy(args.timeout, "--timeout") if codes[r] == "ended"
                           else f"exited with code {codes[r]}")
                    states.append(dict(verdict="stuck", phase=phase, where="", divergence="", checks=[], rank=r,
                                       group_index=-1, message=f"rank {r} did not finish ({how}) in its {phase}: "
                                       f"{_tail(logs, launch, r, 2)}"))
            results[stuck] = states
            after = stuck
    return results


# ---------------------------------------------------------------------------------------
# The report
# ---------------------------------------------------------------------------------------

_WORST = ("stuck", "crashed", "refused at load", "differs", "equal", "idle")


def merge(item, records):
    """One configuration's verdict over its ranks: the worst, with the lowest such rank's message."""
    live = [r for r in records if r["verdict"] != "idle"]
    worst = min(live, key=lambda r: (_WORST.index(r["verdict"]), r["rank"]))
    ranks = {str(r["rank"]): r["verdict"] + (f" in {r['phase']}" if r["phase"] and r["verdict"] != "equal" else "")
             for r in live}
    errors = {c["name"]: c["error"] for c in worst["checks"]}
    return dict(item, verdict=worst["verdict"], phase=worst["phase"], where=worst["where"],
                message=worst["message"], divergence=worst["divergence"], ranks=ranks,
                checks=worst["checks"], errors=errors)


def _launch_name(row):
    return str(row["group"]) if row["world"] == row["group"] else f"{row['group']}of{row['world']}"


def _verdict_text(row):
    if row["verdict"] == "equal":
        worst = max((c["error"] for c in row["checks"] if c["bound"]), default=0.0)
        return f"equal ({worst:.0e})" if worst else "equal (bitwise)"
    return row["verdict"]


def table(rows, dtypes):
    """One line per source and launch, a column per dtype; under it, what went wrong, once."""
    width = max([6] + [len(r["label"]) for r in rows])
    head = f"{'source':<{width}} {'t':>4}  " + "  ".join(f"{d:<18}" for d in dtypes)
    lines = [head, "-" * len(head)]
    by_key = {}
    for r in rows:
        by_key.setdefault((r["label"], _launch_name(r)), {})[r["dtype"]] = r
    for (label, launch), per in by_key.items():
        lines.append(f"{label:<{width}} {launch:>4}  " + "  ".join(
            f"{_verdict_text(per[d]) if d in per else '-':<18}" for d in dtypes))
        told = set()
        for d in dtypes:
            r = per.get(d)
            if r is None or r["verdict"] == "equal":
                continue
            said = []
            if r["verdict"] == "not offered":
                said.append(f"not offered: {r['message']}")
            elif r["verdict"] in ("crashed", "stuck"):
                said.append(f"{r['verdict']} in {r['phase']}" + (f" in {r['where']}" if r["where"] else "")
                            + f": {r['message']}")
            elif r["verdict"] == "refused at load":
                said.append(f"refused at load: {r['message']}")
            elif r["message"]:
                said.append(r["message"])
            if r["divergence"]:
                said.append(r["divergence"])
            for s in said:
                if s not in told:
                    told.add(s)
                    lines.append(f"    {d}: {s}" if len(dtypes) > 1 else f"    {s}")
    return "\n".join(lines)


def _finite(value):
    """inf and nan as null: JSON has no such numbers."""
    if isinstance(value, float) and (value != value or value in (float("inf"), -float("inf"))):
        return None
    if isinstance(value, dict):
        return {k: _finite(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_finite(v) for v in value]
    return value


def counts(rows):
    return {v: sum(r["verdict"] == v for r in rows) for v in VERDICTS}


def exit_status(rows):
    ran = [r for r in rows if r["verdict"] != "not offered"]
    if not ran:
        return NOTHING_CHECKED
    return ALL_EQUAL if all(r["verdict"] == "equal" for r in ran) else SOME_FAIL


def main(argv=None):
    args = parser().parse_args(argv)
    if "RANK" in os.environ and os.environ["RANK"] != "0":
        return 0   # under torchrun: rank 0 supervises its own world
    try:
        sources, launches, dtypes = plan_configurations(args)
        zoo_dir = None
        if args.zoo:
            from tp_from_scratch.verify import zoo
            zoo_dir = tempfile.mkdtemp(prefix="verify_zoo_")
            sources += [(f"zoo:{name}", f"hf:{path}::{args.tp_plan}") for name, path in zoo.write(zoo_dir)]
        if not sources:
            raise Refused("nothing to check: give --hf DIR, --entry MODULE:FUNCTION, --ours NAMES or --zoo")
    except Refused as refused:
        return _refuse(refused.code, str(refused))
    items, skipped = configurations(sources, launches, dtypes)
    print(f"verify model: {len(sources)} source(s), t = {args.t or ','.join(str(g) if w == g else f'{g}of{w}' for w, g in launches)}; "
          f"dtypes {', '.join(dtypes)}; seed {args.seed} (--seed {args.seed} reproduces)", flush=True)
    rows = [dict(s, verdict="not offered", phase="", where="", message=s["reason"], divergence="", ranks={},
                 checks=[], errors={}) for s in skipped]
    started = time.monotonic()
    try:
        for world in sorted({it["world"] for it in items}):
            mine = [it for it in items if it["world"] == world]
            results = run_world(world, mine, args)
            rows += [merge(it, results[i]) for i, it in enumerate(mine) if i in results]
    except Refused as refused:
        return _refuse(COULD_NOT_RUN, str(refused))
    order = {s[0]: k for k, s in enumerate(sources)}
    rows.sort(key=lambda r: (order[r["label"]], r["world"], r["group"], dtypes.index(r["dtype"])))
    print(table(rows, dtypes))
    total = counts(rows)
    print(", ".join(f"{n} {v}" for v, n in total.items() if n) + f"  ({time.monotonic() - started:.0f} s)")
    if args.json:
        with open(args.json, "w") as out:
            json.dump(dict(schema=SCHEMA, run=dict(command=sys.argv, seed=args.seed, dtypes=dtypes,
                                                   launches=[f"{g}of{w}" if w != g else str(g) for w, g in launches],
                                                   torch=torch.__version__),
                           counts=total, configurations=_finite(rows)), out, indent=1, default=str)
    if zoo_dir:
        import shutil
        shutil.rmtree(zoo_dir, ignore_errors=True)
    return exit_status(rows)


if __name__ == "__main__":
    sys.exit(main())
