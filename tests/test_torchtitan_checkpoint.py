"""torchtitan's own checkpoint code loads a course DCP checkpoint (issue 37), where torchtitan is
installed (0.3.0 beside torch 2.13.0; docs/running.md says how); skipped otherwise.

The course's writer saves a Llama at t = 2 in DCP's format; torchtitan's CheckpointManager
(torchtitan/components/checkpointer/dcp.py) loads it as its trainer's first load does, from
``initial_load_path``, model only: dcp.load of its ModelWrapper's state_dict, then
load_state_dict. Into the course's single-device GPT every tensor comes back bitwise. torchtitan's
own Llama 3 names its modules otherwise (tok_embeddings, layers.N.attention.qkv_linear.wq, ...),
so the same load into it fails at the first name; torchtitan maps names only from Hugging Face's
(Llama3StateDictAdapter.from_hf), so the loaded weights reach its Llama through the course's own
Hugging Face names (gpt/convert.py's to_hf) and that adapter, and its logits equal the course's.
A full load (model and optimizer) finds AdamW's moments under torchtitan's names and fails, as it
must, on the param groups, which the course does not write. Each reference is computed here,
from what the course saved.
"""
import importlib.util

import pytest
import torch

pytest.importorskip("torchtitan", reason="torchtitan is not installed (docs/running.md says how)")
pytest.importorskip("triton", reason="torchtitan's models import triton, not installed (docs/running.md says how)")

from torch.distributed.checkpoint.api import CheckpointException  # noqa: E402
from torchtitan.components.checkpoint import CheckpointManager  # noqa: E402
from torchtitan.components.optimizer.optimizer import OptimizersContainer, ParamGroupConfig  # noqa: E402
from torchtitan.models.llama3.state_dict_adapter import Llama3StateDictAdapter  # noqa: E402

from tests.test_dcp import trained  # noqa: E402
from tests.test_verify_model import REPO  # noqa: E402
from tp_from_scratch.compare import assert_matches_reference, tolerance  # noqa: E402
from tp_from_scratch.gpt import checkpoint as ckpt  # noqa: E402
from tp_from_scratch.gpt import dcp  # noqa: E402
from tp_from_scratch.gpt.convert import to_hf  # noqa: E402
from tp_from_scratch.gpt.model import GPTConfig, init_gpt  # noqa: E402
from tp_from_scratch.testing import rank_rng  # noqa: E402
from tp_from_scratch.verify.models import randomize  # noqa: E402

# torchtitan's Llama builder sets its RMSNorm's eps to 1e-5 (the course's llama default is 1e-6)
LLAMA = GPTConfig(arch="llama", vocab_size=11, seq_len=8, n_layers=2, hidden=16, n_heads=4, n_kv_heads=2, ffn=24,
                  tie_embeddings=False, norm_eps=1e-5)


def titan_llama(config):
    """torchtitan's Llama 3 of ``config``'s sizes, float64 parameters, built as
    examples/torchtitan_llama.py builds it (its attention on CPU: SDPA)."""
    spec = importlib.util.spec_from_file_location("torchtitan_llama", REPO / "examples" / "torchtitan_llama.py")
    example = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(example)
    titan_config = example._config(config.hidden, config.n_heads, config.n_kv_heads, config.ffn,
                                   config.vocab_size, config.n_layers)
    model = titan_config.build()
    model.init_states(buffer_device=torch.device("cpu"))
    for p in model.parameters():   # the RoPE table stays complex
        p.data = p.data.to(torch.float64)
    return model, titan_config


def stored_names(root):
    """The tensor names the course's checkpoint in ``root`` holds."""
    return dcp.stored(ckpt.read_metadata(root / "course")[0])


def titan_load(folder, step_directory, model, optimizers=None):
    """torchtitan's CheckpointManager, as its trainer builds it for a first load from another
    run's checkpoint: an empty folder of its own, ``initial_load_path``, the model only (with
    ``optimizers``: the model and them, no dataloader nor learning-rate schedule)."""
    config = CheckpointManager.Config(enable=True, folder=str(folder), initial_load_path=str(step_directory),
                                      initial_load_model_only=optimizers is None,
                                      exclude_from_loading=[] if optimizers is None else ["dataloader", "lr_scheduler"])
    manager = CheckpointManager(config, dataloader=None, model_parts=[model], optimizers=optimizers,
                                lr_schedulers=None, states={}, sd_adapter=None)
    try:
        return manager.load()
    finally:
        manager.close()


@pytest.fixture(scope="module")
def saved(tmp_path_factory):
    """(root, the saved model): a random Llama written by the course at t = 2 in DCP's format."""
    root = tmp_path_factory.mktemp("titan")
    model = randomize(init_gpt(LLAMA, 1, torch.float64), seed=1)
    ckpt.write_dcp(root / "course", model.state_dict(), {}, LLAMA, tp=2, step=3)
    return root, model


def test_torchtitans_checkpoint_manager_loads_a_course_checkpoint_bitwise(saved):
    root, model = saved
    loaded = init_gpt(LLAMA, 2, torch.float64)   # other weights: a load that did nothing is seen
    assert not torch.equal(loaded.state_dict()["wte.weight"], model.state_dict()["wte.weight"])
    assert titan_load(root / "titan-gpt", ckpt.read_metadata(root / "course")[0], loaded) is True
    want, got = model.state_dict(), loaded.state_dict()
    assert set(got) == set(want)
    for name, value in want.items():
        assert_matches_reference(got[name], value, name=f"{name} loaded by torchtitan", exact=True)


def test_torchtitans_own_llama_does_not_find_the_courses_names(saved):
    # DCP's planner asks for the model's own keys (default_planner.py: "Missing key in checkpoint
    # state_dict"); of torchtitan's names the course's checkpoint holds only lm_head.weight
    root, _ = saved
    titan, _ = titan_llama(LLAMA)
    assert set(titan.state_dict()) & set(stored_names(root)) == {"lm_head.weight"}
    with pytest.raises(CheckpointException,   # a BaseException, not an Exception
                       match=r"Missing key in checkpoint state_dict: (tok_embeddings|layers|norm)\."):
        titan_load(root / "titan-llama", ckpt.read_metadata(root / "course")[0], titan)


def test_the_weights_torchtitan_loaded_run_in_its_llama_with_the_courses_logits(saved):
    # names through the course's Hugging Face export, then torchtitan's own adapter (which also
    # reorders q and k rows from rotate-half RoPE to its interleaved complex RoPE)
    root, model = saved
    loaded = init_gpt(LLAMA, 2, torch.float64)
    titan_load(root / "titan-logits", ckpt.read_metadata(root / "course")[0], loaded)
    titan, titan_config = titan_llama(LLAMA)
    titan.load_state_dict(Llama3StateDictAdapter(titan_config, None).from_hf(to_hf(loaded.state_dict(), LLAMA)),
                          strict=True)
    tokens = torch.from_numpy(rank_rng(0).integers(0, LLAMA.vocab_size, size=(2, LLAMA.seq_len)))
    with torch.no_grad():
        expected = model.eval()(tokens)[0]
        got = titan.eval()(tokens)
    # torchtitan's ComplexRoPE turns q and k in float32 (query.float(), models/common/rope.py),
    # whatever the model's dtype: the float32 policy
    assert_matches_reference(got, expected, name="torchtitan Llama logits", tol=tolerance("float32", layers=2))


def test_torchtitans_optimizer_names_the_moments_as_the_course_but_wants_param_groups_too(tmp_path):
    # torchtitan's OptimizersContainer (AdamW) keys its state as the course's DCP writer does,
    # optimizer.state.<name>.<key>; its full load also asks for every parameter's param group
    # (optimizer.param_groups.<name>.<lr, betas, ...>), which the course takes from the command line
    model_state, optimizer_state = trained(LLAMA, seed=3)
    ckpt.write_dcp(tmp_path / "course", model_state, optimizer_state, LLAMA, tp=2, step=5)
    model = init_gpt(LLAMA, 2, torch.float64)
    optimizers = OptimizersContainer(OptimizersContainer.Config(
        param_groups=[ParamGroupConfig(pattern=".*", optimizer_name="AdamW", optimizer_kwargs={"lr": 1e-2})],
        implementation="for-loop"), model_parts=[model])
    theirs = {f"optimizer.{k}" for k in optimizers.state_dict()}
    ours = {k for k in stored_names(tmp_path) if k.startswith(dcp.OPTIMIZER)}
    assert {k for k in theirs if k.startswith(dcp.OPTIMIZER)} == ours
    assert {k for k in theirs - ours if not k.startswith("optimizer.param_groups.")} == set()
    with pytest.raises(CheckpointException, match=r"Missing key in checkpoint state_dict: optimizer\.param_groups\."):
        titan_load(tmp_path / "titan-full", ckpt.read_metadata(tmp_path / "course")[0], model, optimizers)
