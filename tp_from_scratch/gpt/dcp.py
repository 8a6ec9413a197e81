"""Checkpoints other tools read: PyTorch Distributed Checkpoint (DCP), cut by the course's plan.

``--save DIR --save-format dcp`` writes what torchtitan and FSDP2/DTensor code write
(``torch.distributed.checkpoint``), in the course's root layout (gpt/checkpoint.py stages,
checksums and commits it as it does its own format):

    DIR/latest                         name of the newest complete checkpoint (one line)
    DIR/step_00000050-1a2b3c4d/
        .metadata                      DCP's: every tensor's global size and where its chunks are
        __0_0.distcp, __1_0.distcp     one file per writing rank (DCP's)
        meta.json                      the course's: config, tp, step, the model description (with
                                       the command that loads it), sha256 and size of every file

The keys are the single-device model's ``state_dict()`` names (torchtitan's convention: the
model's tensors at the top level), AdamW's state under ``optimizer.state.<name>.<key>`` (the
names ``get_optimizer_state_dict(..., flatten_optimizer_state_dict=True)`` gives), and the step
under ``train_state.step``. Each rank stores its piece at its TRUE place in the full tensor:
``placement`` applies the model's Sharding (the plan's cut, whatever model a lesson trains) to a
tensor of positions and reads off which rows or columns the piece took, so the course's uneven
splits (numpy.array_split: 3, 3, 2, 2 rows of 10 at t = 4), KV heads held by several ranks and
stacked halves cut alike (two chunks on one rank) are each stored where they belong. DCP's
planner then reshards at load: a reader at any t asks for its own chunks (``load_shard``) and
DCP reads the overlaps. A plain ``DTensor.from_local(piece, shape=...)`` of an uneven piece
saves without complaint and fails only at load: DTensor assumes torch.chunk's split (3, 3, 3, 1);
tests/test_dcp_launched.py shows both.

What DCP itself does not keep, and the course's files do: the model description and the
checksums (meta.json holds them), the RNG state (not saved), and the optimizer's param_groups
(learning rate and betas come from the command line, as with the course's own format).

    Pieces                               one rank's pieces of a tensor, at their offsets (for DCP)
    placement(name, shape, tp, rank, ...)   where that rank's piece of ``name`` sits
    rank_state(...)                      one rank's DCP state dict, from its model and optimizer
    save(group, directory, ...)          a trainer rank's part of a save (collective)
    save_ranks(directory, states)        every rank's part, in one process
    load_full / load_shard               the whole state, or one rank's pieces at any t (no group)
"""
import hashlib
import warnings
from pathlib import Path

import torch
import torch.distributed as dist

OPTIMIZER, STEP = "optimizer.state.", "train_state.step"
MARKER = ".metadata"   # what makes a directory a DCP checkpoint


class DCPError(RuntimeError, ValueError):
    """A DCP directory that cannot be used (gpt/checkpoint.py reports it as a CheckpointError)."""


def torch_dcp():
    """torch.distributed.checkpoint, imported when a DCP checkpoint is first written or read, not
    with this file: it brings DTensor and sympy along, about 1.7 s of CPU that every rank of every
    launch would pay (gpt/checkpoint.py imports this file, and its own format never needs DCP)."""
    import torch.distributed.checkpoint as dcp   # with its api, metadata, planner and default_planner
    return dcp


# ---------------------------------------------------------------------------------------
# Where a rank's piece sits in the full tensor, read from the plan
# ---------------------------------------------------------------------------------------

def placement(name, shape, tp, rank, config, sharding):
    """[(offsets, axis, start, length)]: the runs of rank ``rank``'s piece of tensor ``name``
    (full shape ``shape``) in the full tensor, in the piece's order: ``length`` slices along
    ``axis`` from piece position ``start`` sit at ``offsets``. [(zeros, None, 0, 0)] when whole.

    The cut is the Sharding's own: it is applied to a tensor of positions, and the positions the
    piece holds say where it came from. A cut that is not a choice of slices along one axis
    (no plan of the course makes one) is refused, naming the tensor."""
    shape = tuple(shape)
    positions = torch.arange(int(torch.Size(shape).numel())).reshape(shape)
    piece = sharding.shard(name, positions, tp, rank, config)
    differ = [d for d in range(len(shape)) if piece.shape[d] != shape[d]]
    if not differ and torch.equal(piece, positions):
        return [(tuple([0] * len(shape)), None, 0, 0)]
    axis = differ[0] if len(differ) == 1 else None
    if axis is None:   # the same size on every axis but reordered, or cut along two axes
        raise ValueError(f"{name}: rank {rank}'s piece at tp={tp} is not a choice of slices along one axis")
    # the index along ``axis`` of each slice of the piece: the first position of the slice
    taken = (piece.movedim(axis, 0).reshape(piece.shape[axis], -1)[:, 0] // positions.stride(axis)) % shape[axis]
    if not torch.equal(piece, positions.index_select(axis, taken)):
        raise ValueError(f"{name}: rank {rank}'s piece at tp={tp} is not a choice of slices along one axis")
    runs, start = [], 0
    for i in range(1, len(taken) + 1):   # consecutive indices form one run (one DCP chunk)
        if i == len(taken) or taken[i] != taken[i - 1] + 1:
            offsets = [0] * len(shape)
            offsets[axis] = int(taken[start])
            runs.append((tuple(offsets), axis, start, i - start))
            start = i
    return runs


class Pieces(torch.Tensor):
    """One rank's pieces of a tensor of global ``size``, each at its offsets: what DCP's planner
    writes and fills at load (torch's _Checkpointable protocol: its three methods below). It holds
    no data of its own; any other operation on it is an error."""

    @staticmethod
    def __new__(cls, size, chunks, dtype):
        return torch.Tensor._make_wrapper_subclass(cls, torch.Size(size), dtype=dtype)

    def __init__(self, size, chunks, dtype):
        self.chunks = [(torch.Size(offsets), piece) for offsets, piece in chunks]   # [(offsets, tensor)]

    @classmethod
    def __torch_dispatch__(cls, func, types, args=(), kwargs=None):
        raise NotImplementedError(f"Pieces only describes chunks for DCP; {func} is not defined on it")

    def __create_write_items__(self, fqn, obj):
        planner, metadata = torch_dcp().planner, torch_dcp().metadata
        return [planner.WriteItem(index=metadata.MetadataIndex(fqn, offsets), type=planner.WriteItemType.SHARD,
                                  tensor_data=planner.TensorWriteData(
                                      chunk=metadata.ChunkStorageMetadata(offsets, piece.shape),
                                      properties=metadata.TensorProperties.create_from_tensor(piece),
                                      size=self.size()))
                for offsets, piece in self.chunks]

    def __create_chunk_list__(self):
        return [torch_dcp().metadata.ChunkStorageMetadata(offsets, piece.shape) for offsets, piece in self.chunks]

    def __get_tensor_shard__(self, index):
        return next(piece for offsets, piece in self.chunks if offsets == index.offset)


def pieces_of(name, local, shape, tp, rank, config, sharding):
    """Pieces of this rank's ``local`` piece of tensor ``name`` (full ``shape``), placed by the plan."""
    chunks = [(offsets, local if axis is None else local.narrow(axis, start, length).contiguous())
              for offsets, axis, start, length in placement(name, shape, tp, rank, config, sharding)]
    return Pieces(shape, chunks, local.dtype)


def empty_pieces(name, shape, dtype, tp, rank, config, sharding):
    """Pieces of zeros where rank ``rank`` at ``tp`` holds tensor ``name``: what a load fills."""
    runs = placement(name, shape, tp, rank, config, sharding)
    chunks = [(offsets, torch.zeros(shape if axis is None else [length if d == axis else n
                                                                for d, n in enumerate(shape)], dtype=dtype))
              for offsets, axis, start, length in runs]
    return Pieces(shape, chunks, dtype), runs


def glued(pieces, runs):
    """The rank's piece from the Pieces a load filled: its runs back to back along their axis."""
    tensors = [piece for _, piece in pieces.chunks]
    axis = runs[0][1]
    return tensors[0] if axis is None else torch.cat(tensors, dim=axis)


def full_shapes(local_shapes, meta, sharding):
    """{name: full shape} from every TP rank's piece shapes (rank order), glued by the Sharding
    on the meta device (no data): the shapes a DCP checkpoint records."""
    return {name: tuple(sharding.unshard(name, [torch.empty(s[name], device="meta") for s in local_shapes],
                                         meta).shape)
            for name in local_shapes[0]}


def rank_state(model_state, optimizer_state, step, shapes, tp, rank, config, sharding):
    """One rank's DCP state dict: its pieces of every weight and AdamW moment (placed by the plan,
    under the single-device names), the optimizer's scalars and the step as plain tensors."""
    def place(name, value):
        if torch.is_tensor(value) and value.ndim > 0:
            return pieces_of(name, value.detach().cpu().contiguous(), shapes[name], tp, rank, config, sharding)
        return value.detach().cpu().clone() if torch.is_tensor(value) else torch.tensor(value)
    state = {name: place(name, v) for name, v in model_state.items()}
    for name, entries in optimizer_state.items():
        state.update({f"{OPTIMIZER}{name}.{k}": place(name, v) for k, v in entries.items()})
    state[STEP] = torch.tensor(step)
    return state


# ---------------------------------------------------------------------------------------
# Writing (gpt/checkpoint.py stages, checksums and commits it, as its own format)
# ---------------------------------------------------------------------------------------

def file_records(directory):
    """{file: {"bytes", "sha256"}} of every file DCP wrote in ``directory``."""
    records = {}
    for path in sorted(Path(directory).iterdir()):
        data = path.read_bytes()
        records[path.name] = {"bytes": len(data), "sha256": hashlib.sha256(data).hexdigest()}
    return records


def save(group, directory, step, model_state, optimizer_state, config, tp, tp_rank, meta, sharding):
    """This rank's part of a trainer's DCP save into ``directory`` (collective over the default
    group: DP replicas too, DCP keeps one copy of identical chunks). ``group``: the TP group, over
    which the piece shapes are all-gathered; glued by the Sharding (with ``meta``: the config and
    the model's own entries), they are each tensor's full shape."""
    local = {k: tuple(v.shape) for k, v in model_state.items()}
    shapes = [None] * tp
    dist.all_gather_object(shapes, local, group=group)
    full = full_shapes(shapes, meta, sharding)
    torch_dcp().save(rank_state(model_state, optimizer_state, step, full, tp, tp_rank, config, sharding),
             checkpoint_id=directory)


def save_ranks(directory, states):
    """DCP's save of ``states`` (one state dict per rank, rank order) in ONE process: the steps
    dcp.save takes on each rank (local plan; the coordinator's global plan; each rank's writes;
    the coordinator's .metadata), with its collectives replaced by a loop."""
    dcp = torch_dcp()
    planners = [dcp.default_planner.DefaultSavePlanner() for _ in states]
    writers = [dcp.FileSystemWriter(directory) for _ in states]
    plans = []
    for rank, (state, planner, writer) in enumerate(zip(states, planners, writers)):
        planner.set_up_planner(state_dict=state, storage_meta=writer.storage_meta(), is_coordinator=rank == 0)
        writer.set_up_storage_writer(rank == 0, rank=rank, use_collectives=True)
        plans.append(writer.prepare_local_plan(planner.create_local_plan()))
    plans, metadata = planners[0].create_global_plan(plans)
    plans = writers[0].prepare_global_plan(plans)
    results = []
    for plan, planner, writer in zip(plans, planners, writers):
        written = writer.write_data(planner.finish_plan(plan), planner)
        written.wait()
        results.append(written.value())
    writers[0].finish(metadata=metadata, results=results)


# ---------------------------------------------------------------------------------------
# Reading: verified against meta.json's records, then DCP's planner, no process group
# ---------------------------------------------------------------------------------------

def verify(directory, meta):
    """Raise a DCPError unless every file meta.json lists has its size and sha256 ({} for another
    tool's directory: nothing to check)."""
    for file, record in meta.get("files", {}).items():
        read_verified(Path(directory) / file, record)


def read_verified(path, record):
    """The bytes of ``path``, after checking them against ``record`` ({"bytes", "sha256"}), or a
    DCPError naming the file: the one integrity check of both formats (checkpoint.read_shard too)."""
    try:
        data = Path(path).read_bytes()
    except FileNotFoundError:
        raise DCPError(f"checkpoint file {path} is missing") from None
    if len(data) != record["bytes"]:
        raise DCPError(f"checkpoint file {path} is truncated or corrupt: "
                       f"{len(data)} bytes, the metadata says {record['bytes']}")
    if hashlib.sha256(data).hexdigest() != record["sha256"]:
        raise DCPError(f"checkpoint file {path} is corrupt: its sha256 does not match the metadata")
    return data


def stored(directory):
    """{key: TensorStorageMetadata} of the tensors DCP recorded in ``directory``'s .metadata."""
    try:
        metadata = torch_dcp().FileSystemReader(directory).read_metadata()
    except Exception as e:   # a damaged pickle raises several types
        raise DCPError(f"DCP metadata {Path(directory) / MARKER} is unreadable: {e}") from None
    return {k: v for k, v in metadata.state_dict_metadata.items()
            if isinstance(v, torch_dcp().metadata.TensorStorageMetadata)}


def _load(state, directory):
    """dcp.load in this process alone (no_dist): every value of ``state`` filled in place."""
    dcp = torch_dcp()
    try:
        with warnings.catch_warnings():   # DCP's note that no process group is used: that is the point
            warnings.filterwarnings("ignore", message="torch.distributed is disabled")
            dcp.load(state, checkpoint_id=directory, no_dist=True)
    except (dcp.api.CheckpointException, RuntimeError, ValueError, KeyError) as e:
        first = str(e).strip().splitlines()
        raise DCPError(f"DCP checkpoint {directory} cannot be read for this model: "
                       f"{first[-1] if first else type(e).__name__}") from None


def split_state(state, meta, directory):
    """(step, model state, optimizer state by name) of a loaded DCP state dict. The step is
    DCP's train_state.step, else meta.json's (another tool's checkpoint may have neither: 0)."""
    state = dict(state)
    step = int(state.pop(STEP)) if STEP in state else int(meta.get("step", 0))
    if "step" in meta and step != meta["step"]:
        raise DCPError(f"checkpoint {directory}: meta.json says step {meta['step']}, DCP's {STEP} {step}")
    optimizer = {}
    for key in [k for k in state if k.startswith(OPTIMIZER)]:
        name, _, entry = key[len(OPTIMIZER):].rpartition(".")
        optimizer.setdefault(name, {})[entry] = state.pop(key)
    return step, state, optimizer


def load_full(directory, meta):
    """The whole DCP checkpoint in ``directory`` (described by meta.json's ``meta``, or {} for
    another tool's), in checkpoint.load_full's form: {"meta", "step", "model", "optimizer", "rng"}."""
    verify(directory, meta)
    state = {k: torch.empty(md.size, dtype=md.properties.dtype) for k, md in stored(directory).items()}
    _load(state, directory)
    step, model, optimizer = split_state(state, meta, directory)
    return {"meta": meta, "step": step, "model": model, "optimizer": optimizer, "rng": [None]}


def load_shard(directory, meta, config, tp, rank, sharding):
    """Rank ``rank``'s pieces at ``tp`` of every weight and moment, read by DCP's planner from
    whatever chunks were saved (any t, any tool): checkpoint.load_shard's form. No process group."""
    verify(directory, meta)
    state, runs = {}, {}
    for key, md in stored(directory).items():
        name = key[len(OPTIMIZER):].rpartition(".")[0] if key.startswith(OPTIMIZER) else key
        if len(md.size) == 0:   # scalars (the step, AdamW's step count): whole
            state[key] = torch.empty(md.size, dtype=md.properties.dtype)
        else:
            state[key], runs[key] = empty_pieces(name, md.size, md.properties.dtype, tp, rank, config, sharding)
    _load(state, directory)
    step, model, optimizer = split_state({k: glued(v, runs[k]) if k in runs else v for k, v in state.items()},
                                         meta, directory)
    return {"step": step, "model": model, "optimizer": optimizer, "rng": None, "meta": meta}
