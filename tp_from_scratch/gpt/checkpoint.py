"""Sharded training checkpoints: atomic, checksummed, loadable at any TP degree.

Layout of a checkpoint root DIR (``--save DIR`` / ``--load DIR``):

    DIR/latest                         name of the newest complete checkpoint (one line)
    DIR/step_00000050-1a2b3c4d/
        model_tp00_of02.pt             TP rank 0's shard: model, optimizer state, RNG state
        model_tp01_of02.pt             TP rank 1's shard
        meta.json                      config, tp, step, the model description, shapes, dtypes,
                                       sha256 of every shard

Nothing is ever overwritten in place. Each save goes to a fresh directory; every file is
written to a temporary name, flushed to disk and renamed (``os.replace`` is atomic);
``meta.json`` is written only when every shard is on disk, and ``latest`` is switched last.
A process killed at any moment leaves ``latest`` pointing at the previous complete
checkpoint. Loading verifies the config and every shard's size and checksum.

A checkpoint says what model it holds (``model_description``): the architecture, and for a
partially synchronized GPT (p < 1) its sync fraction p and TP degree t, since its weights mean
another model than the GPT's (each rank's private channels are one stream's); and the command
that loads it, which a loader that cannot quotes. Sequence parallelism is not in it: it leaves
every weight's meaning alone, so a checkpoint moves freely between the trainers with and without it. Every loader (the trainers, generate, the
export here, convert) states the description it expects and a mismatch is refused naming
both sides; a loader that knows only the GPT expects ``GPT`` (the default).

Resharding: a checkpoint saved at tp=a is loaded at tp=b by gluing the a shards into
full tensors and cutting b new ones (``parallelize.shard_state_dict``); the optimizer state is
cut the same way, since AdamW's moments have their parameter's shape. How a model is cut
and glued is a Sharding (the GPT's by default); a later lesson's model passes its own, and
the rest of this file serves both. Every rank reads
all shards, which is fine for this course's sizes; a large model would read only the
slices it needs. All ranks must see the same filesystem (one machine, or a shared disk).

The same root may hold checkpoints in PyTorch's Distributed Checkpoint format instead
(``--save-format dcp``; gpt/dcp.py): DCP's ``.metadata`` and ``.distcp`` files beside a meta.json
of format DCP_FORMAT, staged in a hidden directory and renamed into place before ``latest`` moves.
Every reader here takes either format; a DCP one is read by DCP's planner (``load_shard``: this
rank's chunks only) after every file's size and sha256 are checked.
"""
import hashlib
import io
import json
import os
import shutil
import time
import uuid
from pathlib import Path

from contextlib import contextmanager

import torch
import torch.distributed as dist

from tp_from_scratch.gpt import dcp
from tp_from_scratch.gpt.model import GPTConfig
from tp_from_scratch.gpt.parallelize import shard_tensor, unshard_tensor

FORMAT = "tp_from_scratch checkpoint v1"
DCP_FORMAT = "tp_from_scratch DCP checkpoint v1"   # gpt/dcp.py's: PyTorch DCP files and this meta.json
SINGLE_FORMAT = "tp_from_scratch single-device state dict v1"
KEEP = 2  # complete checkpoints kept in a root; older ones are deleted after a save


class CheckpointError(RuntimeError, ValueError):
    """A checkpoint that cannot be used: missing, corrupt, truncated or for another model.

    Also a ValueError (bad input), so an entry point that reports ValueErrors as one line
    (generate, convert) reports it the same way."""


# ---------------------------------------------------------------------------------------
# Atomic files
# ---------------------------------------------------------------------------------------

def write_atomic(path, data):
    """Write ``data`` (bytes) to ``path`` so that readers see the old file or the whole new one.

    On any failure (a full disk, ``path`` a directory, an interrupt) the temporary file is
    removed and ``path`` is left as it was."""
    path = Path(path)
    tmp = path.with_name(f".{path.name}.tmp-{os.getpid()}-{uuid.uuid4().hex[:8]}")
    try:
        with open(tmp, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())  # the bytes are on disk before the name points at them
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    _fsync_dir(path.parent)


def _fsync_dir(directory):
    # makes the rename itself durable; not supported everywhere (e.g. Windows), so best effort
    try:
        fd = os.open(directory, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)


def sha256(data):
    return hashlib.sha256(data).hexdigest()


def _to_bytes(obj):
    buf = io.BytesIO()
    torch.save(obj, buf)
    return buf.getvalue()


# ---------------------------------------------------------------------------------------
# How a model's tensors are cut over the TP ranks and glued back
# ---------------------------------------------------------------------------------------

class GPTSharding:
    """The GPT's, read from its sharding plan (gpt.arch, through gpt.parallelize). A later lesson's
    model passes an object with the same three methods to the functions below."""

    def config_of(self, meta_config):
        """The config saved in a checkpoint (fields added since then take their defaults)."""
        return GPTConfig(**meta_config)

    def shard(self, name, full, tp, rank, config):
        """TP rank ``rank``'s piece of the full tensor ``name`` for a run of ``config``."""
        return shard_tensor(name, full, tp, rank, config)

    def unshard(self, name, pieces, meta):
        """The full tensor ``name`` from the saved pieces (rank order) of the checkpoint ``meta``."""
        return unshard_tensor(name, pieces, self.config_of(meta["config"]))


GPT_SHARDING = GPTSharding()


# ---------------------------------------------------------------------------------------
# What model a checkpoint holds
# ---------------------------------------------------------------------------------------

# what a loader that knows only the GPT expects (any architecture); a description's "command"
# (and "what", "lesson") say who can load a checkpoint, not what it holds
GPT = {"family": "gpt", "partial_sync": None}
IDENTITY = ("family", "arch", "partial_sync")
GPT_COMMAND = "python -m tp_from_scratch.gpt.train --load, gpt.generate --load or gpt.convert export"


def model_description(config, tp=None, sync_fraction=1.0, command=None):
    """The model a checkpoint of ``config`` holds: {"family", "arch", "partial_sync", "command"};
    partial_sync is {"sync_fraction": p, "tp": t} for a partially synchronized GPT, p < 1 (a function
    of t), else None; command: what loads it (default, for the ordinary GPT: Lesson 6's commands)."""
    partial = {"sync_fraction": float(sync_fraction), "tp": int(tp)} if sync_fraction < 1.0 else None
    command = command or (GPT_COMMAND if partial is None else None)
    return {"family": "gpt", "arch": config.arch, "partial_sync": partial, **({"command": command} if command else {})}


def description_of(meta):
    """The description in ``meta``; a checkpoint written before descriptions existed is
    described from its sync_fraction (the partial-sync trainer recorded it) and tp, and one written before
    another family existed holds a GPT."""
    if "model" in meta:
        return {"family": "gpt", **meta["model"]}
    p = float(meta.get("sync_fraction", 1.0))
    partial = {"sync_fraction": p, "tp": int(meta.get("tp", 1))} if p < 1.0 else None
    return {"family": "gpt", "arch": meta.get("config", {}).get("arch", "gpt"), "partial_sync": partial}


def describe(description):
    """``an ordinary GPT (--arch gpt2, ...)`` / ``a partially synchronized GPT (--sync-fraction 0.5 at --tp 2)``
    / another family's own words and the command that loads it, as its checkpoint records them."""
    if description.get("family", "gpt") != "gpt":
        what = description.get("what", f"a {description['family']} model")
        if "command" not in description:
            return what
        lesson = f"{description['lesson']}: " if "lesson" in description else ""
        return f"{what} ({lesson}{description['command']} can load it)"
    partial = description.get("partial_sync")
    arch = f"--arch {description['arch']}, " if "arch" in description else ""
    if partial is None:
        return f"an ordinary GPT ({arch}every activation synchronized)"
    return (f"a partially synchronized GPT ({arch}--sync-fraction {partial['sync_fraction']} "
            f"at --tp {partial['tp']})")


def check_description(meta, expected, where):
    """Raise a CheckpointError unless the model in ``meta`` is ``expected`` (every key of it that
    says what the model is: IDENTITY)."""
    saved = description_of(meta)
    if all(saved.get(k) == v for k, v in expected.items() if k in IDENTITY):
        return
    partial = saved.get("partial_sync")
    hint = ""
    if partial is not None:
        # an older checkpoint records no command: the loader of partially synchronized models knows its own
        command = saved.get("command") or (expected.get("command") if expected.get("partial_sync") else None)
        who = f"{command} --tp {partial['tp']} --sync-fraction {partial['sync_fraction']}" if command else \
            f"a run at --tp {partial['tp']} --sync-fraction {partial['sync_fraction']}"
        hint = (f": its ranks' private channels belong to {partial['tp']} streams, so only {who} can load it "
                f"(only p = 1 checkpoints reshard)")
    # an ordinary GPT that records its loaders says them (another family's description has them in its words)
    loaders = f", which {saved['command']} can load" if saved.get("family") == "gpt" and partial is None \
        and saved.get("command") else ""
    raise CheckpointError(f"checkpoint {where} holds {describe(saved)}{loaders}, but this run expects "
                          f"{describe(expected)}{hint}")


def check_resume(meta, where, steps, optimizer=None):
    """Raise a CheckpointError unless a run to ``steps`` with ``optimizer`` can resume from ``meta``:
    a resume never goes back (its saves would be labelled below the step they hold)."""
    if steps < meta["step"]:
        raise CheckpointError(f"--steps {steps} is below the checkpoint's step {meta['step']} "
                              f"({where}): a run continues up to --steps, so ask for {meta['step']} or more")
    saved_with = meta.get("optimizer")
    if optimizer and saved_with and saved_with != optimizer:
        raise CheckpointError(f"checkpoint {where} holds {saved_with} state, "
                              f"but this run uses --optimizer {optimizer}")


def check_resumable(root, config, description, steps, optimizer=None, sharding=GPT_SHARDING):
    """Everything a trainer checks of --load before any work: the model description, the config,
    the step and the optimizer (a checkpoint directory: from meta.json alone)."""
    if Path(root).is_file():
        meta = load_full(root, config, description, sharding)["meta"]
        where = root
    else:
        where, meta = read_metadata(root)
        check_description(meta, description, where)
        check_config(meta["config"], config, where, sharding)
    check_resume(meta, where, steps, optimizer)


# ---------------------------------------------------------------------------------------
# Optimizer state keyed by parameter name (so it can be resharded like the parameters)
# ---------------------------------------------------------------------------------------

def optimizer_state_by_name(model, optimizer):
    """{parameter name: {"exp_avg": ..., "step": ...}} for the parameters ``optimizer`` has state for."""
    state = {}
    for name, p in model.named_parameters():
        if p in optimizer.state:
            state[name] = {k: (v.detach().cpu().clone() if torch.is_tensor(v) else v)
                           for k, v in optimizer.state[p].items()}
    return state


def load_optimizer_state_by_name(model, optimizer, state):
    """Put ``state`` (as returned by optimizer_state_by_name, for this rank's shard) into ``optimizer``."""
    for name, p in model.named_parameters():
        if name in state:
            # moments go to the parameter's device and dtype; scalars such as AdamW's "step"
            # stay on the CPU, where the (non-capturable) optimizer keeps them
            optimizer.state[p] = {
                k: (v.to(device=p.device, dtype=p.dtype).clone() if torch.is_tensor(v) and v.shape == p.shape
                    else v.clone() if torch.is_tensor(v) else v)
                for k, v in state[name].items()
            }


def _is_moment(value):
    # moments have the parameter's shape and are cut like it; scalars ("step") are copied
    return torch.is_tensor(value) and value.ndim > 0


def shard_optimizer_state(state, tp, rank, config, sharding=GPT_SHARDING):
    """This TP rank's optimizer state from the full one ({parameter name: {key: value}})."""
    return {name: {k: sharding.shard(name, v, tp, rank, config) if _is_moment(v) else v for k, v in entries.items()}
            for name, entries in state.items()}


# ---------------------------------------------------------------------------------------
# Writing
# ---------------------------------------------------------------------------------------

def shard_filename(tp_rank, tp):
    return f"model_tp{tp_rank:02d}_of{tp:02d}.pt"


def new_checkpoint_name(step):
    """A fresh directory name for a save at ``step``: never the name of an existing one."""
    return f"step_{step:08d}-{uuid.uuid4().hex[:8]}"


def write_shard(root, name, tp_rank, tp, model_state, optimizer_state=None, rng_state=None):
    """Write one TP rank's shard atomically; return its record for the metadata."""
    directory = Path(root) / name
    directory.mkdir(parents=True, exist_ok=True)
    payload = {"model": {k: v.detach().cpu() for k, v in model_state.items()},
               "optimizer": optimizer_state or {}, "rng": rng_state}
    data = _to_bytes(payload)
    filename = shard_filename(tp_rank, tp)
    write_atomic(directory / filename, data)
    return {"file": filename, "tp_rank": tp_rank, "bytes": len(data), "sha256": sha256(data),
            "shapes": {k: list(v.shape) for k, v in model_state.items()},
            "dtypes": {k: str(v.dtype).replace("torch.", "") for k, v in model_state.items()}}


def commit(root, name, config, tp, step, shard_records, extra=None, keep=KEEP, description=None):
    """Write meta.json for a checkpoint whose shards are all on disk, then point ``latest`` at it.

    description: the model it holds (model_description; default: described from ``extra``'s
    sync_fraction, if any, so an older caller's metadata keeps its meaning)."""
    root = Path(root)
    records = sorted(shard_records, key=lambda r: r["tp_rank"])
    if [r["tp_rank"] for r in records] != list(range(tp)):
        raise CheckpointError(f"commit of {name}: expected shards of tp ranks 0..{tp - 1}, "
                              f"got {[r['tp_rank'] for r in records]}")
    meta = {"format": FORMAT, "step": step, "tp": tp, "config": config.to_dict(),
            "model": description or description_of({"tp": tp, "config": config.to_dict(), **(extra or {})}),
            "created": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
            "shards": records, **(extra or {})}
    write_atomic(root / name / "meta.json", json.dumps(meta, indent=1).encode())
    write_atomic(root / "latest", f"{name}\n".encode())
    _prune(root, keep)
    return meta


def _prune(root, keep):
    complete = sorted(p for p in root.glob("step_*") if (p / "meta.json").exists())
    current = (root / "latest").read_text().strip()
    for old in complete[:-keep]:
        if old.name != current:
            shutil.rmtree(old, ignore_errors=True)
    # directories of saves that never finished (a killed process) are garbage too, unless new;
    # a DCP save stages into .step_*.staging (gpt/dcp.py)
    for partial in [*root.glob("step_*"), *root.glob(".step_*.staging")]:
        if not (partial / "meta.json").exists() and partial.name.lstrip(".") < complete[-1].name:
            shutil.rmtree(partial, ignore_errors=True)


# ---------------------------------------------------------------------------------------
# Writing in PyTorch DCP's format (gpt/dcp.py): staged, then committed like the shards above
# ---------------------------------------------------------------------------------------

def staging_name(name):
    """Where a DCP save of checkpoint ``name`` is written before it is renamed into place."""
    return f".{name}.staging"


def commit_dcp(root, name, config, tp, step, extra=None, description=None, keep=KEEP):
    """Rank 0, once DCP has written the staging directory: meta.json (the description, the config
    and every file's size and sha256), the rename into place, then ``latest``. Before the rename
    no step_* directory exists; before ``latest`` the previous checkpoint is current."""
    root = Path(root)
    staging = root / staging_name(name)
    meta = {"format": DCP_FORMAT, "step": step, "tp": tp, "config": config.to_dict(),
            "model": description or description_of({"tp": tp, "config": config.to_dict(), **(extra or {})}),
            "created": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
            "files": dcp.file_records(staging), **(extra or {})}
    write_atomic(staging / "meta.json", json.dumps(meta, indent=1).encode())
    os.rename(staging, root / name)   # atomic: the directory appears whole
    _fsync_dir(root)
    write_atomic(root / "latest", f"{name}\n".encode())
    _prune(root, keep)
    return meta


def save_dcp(group, root, step, model_state, optimizer_state, config, tp, tp_rank, extra=None,
             description=None, sharding=GPT_SHARDING):
    """The trainers' --save-format dcp: every rank of the default group calls it with its TP
    ``group``, its pieces and its optimizer state by name; rank 0 commits (collective)."""
    names = [new_checkpoint_name(step) if dist.get_rank() == 0 else None]
    dist.broadcast_object_list(names, src=0)
    Path(root).mkdir(parents=True, exist_ok=True)
    dcp.save(group, Path(root) / staging_name(names[0]), step, model_state, optimizer_state, config, tp, tp_rank,
             {"config": config.to_dict(), **(extra or {})}, sharding)
    if dist.get_rank() == 0:
        commit_dcp(root, names[0], config, tp, step, extra, description)
    dist.barrier()


def write_dcp(root, model_state, optimizer_state, config, tp, step=0, extra=None, description=None,
              sharding=GPT_SHARDING):
    """A DCP checkpoint of FULL tensors (and optimizer state by name) as ``tp`` ranks save it, one
    file each, written in one process: a conversion, or a test's checkpoint. Returns its meta."""
    shapes = {k: tuple(v.shape) for k, v in model_state.items()}
    states = [dcp.rank_state({k: sharding.shard(k, v, tp, r, config) for k, v in model_state.items()},
                             shard_optimizer_state(optimizer_state, tp, r, config, sharding), step, shapes,
                             tp, r, config, sharding)
              for r in range(tp)]
    name = new_checkpoint_name(step)
    Path(root).mkdir(parents=True, exist_ok=True)
    dcp.save_ranks(Path(root) / staging_name(name), states)
    return commit_dcp(root, name, config, tp, step, extra, description)


@contextmanager
def dcp_errors():
    """gpt/dcp.py's DCPError as this file's CheckpointError (what every entry point reports in one line)."""
    try:
        yield
    except dcp.DCPError as e:
        raise CheckpointError(str(e)) from None


# ---------------------------------------------------------------------------------------
# Reading
# ---------------------------------------------------------------------------------------

def read_metadata(root):
    """(checkpoint directory, metadata dict) of the newest complete checkpoint in ``root``.

    ``root`` may also be one checkpoint directory (holding meta.json) itself: the course's, or a
    DCP directory the course wrote (.metadata beside meta.json; gpt/dcp.py). A DCP directory
    without meta.json (another tool's) is refused: its model, config and step are unknown.
    """
    root = Path(root)
    if (root / ".metadata").exists() and not (root / "meta.json").exists():
        raise CheckpointError(f"{root} is a PyTorch DCP checkpoint without tp_from_scratch's meta.json (written by "
                              f"another tool, or a save that never finished): its model, config and step are unknown")
    if (root / "meta.json").exists():
        directory = root
    elif (root / "latest").exists():
        directory = root / (root / "latest").read_text().strip()
    elif root.is_file():
        # a single-device file (export_single_device's): (the file, its metadata), which describes
        # an ordinary GPT and the commands that load it, so another model's loader can say what it is
        return root, _single_device_file(root)[0]
    elif root.exists():
        raise CheckpointError(f"no checkpoint in {root}: neither a 'latest' file nor meta.json")
    else:
        raise CheckpointError(f"no checkpoint at {root}: the path does not exist")
    path = directory / "meta.json"
    try:
        meta = json.loads(path.read_text())
    except FileNotFoundError:
        raise CheckpointError(f"checkpoint {directory} has no meta.json (an unfinished save?)") from None
    except (ValueError, UnicodeDecodeError) as e:
        raise CheckpointError(f"checkpoint metadata {path} is corrupt or truncated: {e}") from None
    if meta.get("format") not in (FORMAT, DCP_FORMAT):
        raise CheckpointError(f"{path} is not a {FORMAT!r} file (format {meta.get('format')!r})")
    return directory, meta


def check_config(meta_config, config, where, sharding=GPT_SHARDING):
    """Raise a CheckpointError listing every size in which the checkpoint and ``config`` differ."""
    ours, theirs = config.to_dict(), sharding.config_of(meta_config).to_dict()
    diffs = [f"{k}={theirs.get(k)!r} in the checkpoint, {v!r} in this run"
             for k, v in ours.items() if theirs.get(k) != v]
    if diffs:
        raise CheckpointError(f"checkpoint {where} was saved with a different model config: "
                              + "; ".join(diffs))


def read_shard(directory, record):
    """One shard's payload, after checking its size and sha256 against the metadata."""
    with dcp_errors():
        data = dcp.read_verified(Path(directory) / record["file"], record)
    return torch.load(io.BytesIO(data), map_location="cpu", weights_only=True)


def load_full(root, config=None, description=GPT, sharding=GPT_SHARDING):
    """The whole checkpoint glued to single-device form.

    Returns {"meta", "config", "step", "model": full state dict, "optimizer": full state by
    name (may be empty), "rng": [per saved TP rank]}. ``root`` may also be a file written
    by export_single_device (no optimizer state). ``description``: the model this loader
    expects (model_description; default any ordinary GPT): another one is refused, naming
    both, before anything else is read. With ``config``, a different model config is an error
    naming every difference. ``sharding``: how the model was cut (default the GPT's).
    """
    if Path(root).is_file():
        return _load_single_device(root, config, description)
    directory, meta = read_metadata(root)
    check_description(meta, description, directory)
    if config is not None:
        check_config(meta["config"], config, directory, sharding)
    if meta["format"] == DCP_FORMAT:   # full tensors assembled by DCP's planner from any t's chunks
        with dcp_errors():
            return {**dcp.load_full(directory, meta), "config": sharding.config_of(meta["config"])}
    payloads = [read_shard(directory, r) for r in meta["shards"]]

    def glue(name, pieces):
        return sharding.unshard(name, pieces, meta) if _is_moment(pieces[0]) else pieces[0]

    model = {k: glue(k, [p["model"][k] for p in payloads]) for k in payloads[0]["model"]}
    optimizer = {name: {k: glue(name, [p["optimizer"][name][k] for p in payloads]) for k in entries}
                 for name, entries in payloads[0]["optimizer"].items()}
    return {"meta": meta, "config": sharding.config_of(meta["config"]), "step": meta["step"],
            "model": model, "optimizer": optimizer, "rng": [p["rng"] for p in payloads]}


def load_shard(root, config, tp, rank, description=GPT, sharding=GPT_SHARDING):
    """This TP rank's model state, optimizer state and (same tp only) RNG state, and the step.
    A DCP checkpoint: DCP's planner reads exactly this rank's pieces, whatever t saved it."""
    if not Path(root).is_file():
        directory, meta = read_metadata(root)
        if meta["format"] == DCP_FORMAT:
            check_description(meta, description, directory)
            check_config(meta["config"], config, directory, sharding)
            with dcp_errors():
                return dcp.load_shard(directory, meta, config, tp, rank, sharding)
    full = load_full(root, config, description, sharding)
    model = {k: sharding.shard(k, v, tp, rank, config) for k, v in full["model"].items()}
    optimizer = shard_optimizer_state(full["optimizer"], tp, rank, config, sharding)
    rng = full["rng"][rank] if len(full["rng"]) == tp else None
    return {"step": full["step"], "model": model, "optimizer": optimizer, "rng": rng,
            "meta": full["meta"]}


# ---------------------------------------------------------------------------------------
# Single-device export / import
# ---------------------------------------------------------------------------------------

def export_single_device(root, path):
    """Write the newest checkpoint in ``root`` as one single-device state dict file (atomically)."""
    full = load_full(root)
    write_atomic(path, _to_bytes({"format": SINGLE_FORMAT, "config": full["config"].to_dict(),
                                  "step": full["step"], "model": full["model"]}))
    return full


def save_single_device(model, path, step=0):
    """Write a single-device GPT's state dict with its config, in the export format."""
    write_atomic(path, _to_bytes({"format": SINGLE_FORMAT, "config": model.config.to_dict(),
                                  "step": step, "model": model.state_dict()}))


def _single_device_file(path):
    """(metadata, the file's contents) of a single-device file; it always holds an ordinary GPT,
    which Lesson 6's commands load."""
    try:
        obj = torch.load(path, map_location="cpu", weights_only=True)
    except Exception as e:  # torch raises several types for a damaged zip
        raise CheckpointError(f"single-device state dict {path} is corrupt or truncated: {e}") from None
    if not isinstance(obj, dict) or obj.get("format") != SINGLE_FORMAT:
        raise CheckpointError(f"{path} is not a {SINGLE_FORMAT!r} file")
    config = obj["config"]
    meta = {"tp": 1, "step": obj["step"], "config": config,
            "model": {"arch": config.get("arch", "gpt"), "partial_sync": None, "command": GPT_COMMAND}}
    return meta, obj


def _load_single_device(path, config, description=GPT):
    meta, obj = _single_device_file(path)
    check_description(meta, description, path)
    if config is not None:
        check_config(obj["config"], config, path)
    return {"meta": meta, "config": GPT_SHARDING.config_of(obj["config"]),
            "step": obj["step"], "model": obj["model"], "optimizer": {}, "rng": [None]}


def main(argv=None):
    """python -m tp_from_scratch.gpt.checkpoint export CKPT_ROOT OUT.pt  |  info CKPT_ROOT"""
    import argparse
    parser = argparse.ArgumentParser(description="inspect or export tp_from_scratch checkpoints")
    sub = parser.add_subparsers(dest="cmd", required=True)
    ex = sub.add_parser("export", help="write the newest checkpoint as a single-device state dict")
    ex.add_argument("root")
    ex.add_argument("out")
    info = sub.add_parser("info", help="print a checkpoint's metadata after verifying every shard")
    info.add_argument("root")
    args = parser.parse_args(argv)
    try:
        if args.cmd == "export":
            full = export_single_device(args.root, args.out)
            print(f"wrote {args.out}: step {full['step']}, {len(full['model'])} tensors, "
                  f"from tp={full['meta']['tp']}")
        elif Path(args.root).is_file():   # a single-device file: reading it is loading it whole
            meta = read_metadata(args.root)[1]
            print(json.dumps({k: meta[k] for k in ("step", "tp", "config")}, indent=1))
            print(f"holds {describe(description_of(meta))}: a single-device file, read whole")
        else:   # any model: info reads every shard (size and sha256) and glues nothing
            directory, meta = read_metadata(args.root)
            if meta["format"] == DCP_FORMAT:
                with dcp_errors():
                    dcp.verify(directory, meta)
                checked = f"PyTorch DCP checkpoint: {len(meta['files'])} files verified (size and sha256)"
            else:
                for record in meta["shards"]:
                    read_shard(directory, record)
                checked = f"{len(meta['shards'])} shards verified (size and sha256)"
            print(json.dumps({k: meta[k] for k in ("step", "tp", "config")}, indent=1))
            print(f"holds {describe(description_of(meta))}")
            print(checked)
    except CheckpointError as e:
        parser.exit(1, f"error: {e}\n")


if __name__ == "__main__":
    main()
