"""DeepSeek-V3's checkpoints (issue 27 item 4): Lesson 6's files with Lesson 12's cut.

A checkpoint written by t ranks in one layout, glued back, is the single-device model trained
the same steps, optimizer state included, and cuts again for any other t and layout; Lesson 6's
loaders refuse it naming Lesson 12's commands, Lesson 12's loaders refuse a GPT's, and
contradicting size flags, impossible data and a resume that goes back are named before any
work. Everything here runs in-process (run_spmd's simulated ranks); the torchrun commands
are in tests/test_deepseek_train.py."""
import pytest
import torch

from tp_from_scratch.comm import run_spmd
from tp_from_scratch.compare import assert_matches_reference, tolerance
from tp_from_scratch.deepseek import checkpoint as ds_ckpt
from tp_from_scratch.deepseek import train as ds_train
from tp_from_scratch.deepseek.arch import shard, unshard
from tp_from_scratch.deepseek.model import MODEL_LAYOUTS
from tp_from_scratch.gpt import checkpoint as ckpt
from tp_from_scratch.gpt import train as gpt_train
from tp_from_scratch.gpt.data import global_batch

STEPS = 3
# SGD with momentum: its buffer is optimizer state to glue, and its step keeps the plain growth rule
ARGV = ["--tp", 2, "--layout", "ep", "--dtype", "float64", "--steps", STEPS, "--optimizer", "sgd",
        "--batch-size", 4, "--experts", 4]


@pytest.mark.parametrize("query_latent", [True, False])
def test_every_tensor_cut_in_any_layout_glues_back_whole(query_latent):
    opts = ds_train.parse(ARGV)
    config = ds_train.model_config(opts)
    if not query_latent:   # q_lora_rank=None: q_proj instead of q_a_proj, its norm and q_b_proj
        config.q_lora_rank = None
    g = torch.Generator().manual_seed(7)
    full = {k: torch.randn(v.shape, generator=g, dtype=torch.float64)   # every entry distinct
            for k, v in ds_train.init_model(config, 0, torch.float64).model.state_dict().items()}
    for layout in MODEL_LAYOUTS:
        for t in (1, 2, 4):
            for name, value in full.items():
                pieces = [shard(name, value, layout, t, r) for r in range(t)]
                assert torch.equal(unshard(name, pieces, layout), value), (name, layout, t)


def _trained_ranks(comm):
    """One rank of the trainer's run of ARGV: its model and optimizer state after STEPS steps."""
    opts = ds_train.parse(ARGV)
    config = ds_train.model_config(opts)
    hooks = ds_train.hooks_for(opts, config)
    model = hooks.parallelize(ds_train.init_model(config, opts.seed, opts.torch_dtype), comm)
    optimizer = gpt_train.make_optimizer(model.parameters(), opts)
    list(gpt_train.steps_on_comm(opts, config, model, optimizer, hooks.after_backward))
    return model.state_dict(), ckpt.optimizer_state_by_name(model, optimizer)


def _single_device():
    """The single-device model and optimizer after the same STEPS steps on the whole batch."""
    opts = ds_train.parse(ARGV)
    config = ds_train.model_config(opts)
    model = ds_train.init_model(config, opts.seed, opts.torch_dtype)
    optimizer = gpt_train.make_optimizer(model.parameters(), opts)
    for step in range(STEPS):
        x, y = global_batch(step, opts.batch_size, config.seq_len, config.vocab_size, opts.seed, opts.data)
        gpt_train.train_step(model, optimizer, x, y)
    return model, optimizer


@pytest.fixture(scope="module")
def saved(tmp_path_factory):
    """The checkpoint two expert-parallel ranks write, as deepseek.train --save writes it."""
    root = tmp_path_factory.mktemp("ds") / "ckpt"
    opts = ds_train.parse(ARGV)
    config = ds_train.model_config(opts)
    name = ckpt.new_checkpoint_name(STEPS)
    records = [ckpt.write_shard(root, name, r, 2, model, optimizer)
               for r, (model, optimizer) in enumerate(run_spmd(_trained_ranks, 2))]
    ckpt.commit(root, name, config, 2, STEPS, records, {"optimizer": "sgd", "layout": "expert parallel"},
                description=ds_ckpt.DESCRIPTION)
    return root


def test_a_checkpoint_glued_back_is_the_single_device_model_and_optimizer(saved):
    model, optimizer = _single_device()
    loaded = ds_ckpt.load(saved)
    bound = tolerance("float64", layers=2, steps=STEPS)
    assert set(loaded["model"]) == set(model.state_dict())
    for name, value in model.state_dict().items():
        assert_matches_reference(loaded["model"][name], value, name=f"trained {name}", tol=bound)
    expected = ckpt.optimizer_state_by_name(model, optimizer)
    assert set(loaded["optimizer"]) == set(expected)
    for name, entries in expected.items():
        assert_matches_reference(loaded["optimizer"][name]["momentum_buffer"], entries["momentum_buffer"],
                                 name=f"momentum of {name}", tol=bound)


@pytest.mark.parametrize("layout, t", [("expert tensor parallel", 4), ("experts on all tokens", 2),
                                       ("expert parallel", 4)])
def test_a_checkpoint_cuts_for_another_t_and_layout(saved, layout, t):
    loaded = ds_ckpt.load(saved)
    config = loaded["config"]
    for r in range(t):
        local = ckpt.load_shard(saved, config, t, r, ds_ckpt.DESCRIPTION, ds_ckpt.DeepSeekSharding(layout))
        for name, value in loaded["model"].items():
            expected = shard(ds_ckpt._ours(name), value, layout, t, r)
            assert torch.equal(local["model"][name], expected), (name, layout, t, r)
        for name, entries in local["optimizer"].items():
            expected = shard(ds_ckpt._ours(name), loaded["optimizer"][name]["momentum_buffer"], layout, t, r)
            assert torch.equal(entries["momentum_buffer"], expected), (name, layout, t, r)


def test_the_trainer_resumes_with_the_checkpoints_sizes_and_names_what_contradicts_them(saved):
    # no size flag: the checkpoint's model (4 experts), at another t and layout
    assert ds_train.validate(ds_train.parse(["--load", saved, "--tp", 4, "--steps", 5, "--optimizer", "sgd",
                                             "--batch-size", 4]), 4) is None
    config = ds_train.model_config(ds_train.parse(["--load", saved]))
    assert config.n_routed_experts == 4 and config.to_dict() == ds_ckpt.load(saved)["meta"]["config"]
    for argv, message in [
        (["--experts", 2], "--experts 2 contradicts the checkpoint's n_routed_experts=4"),
        (["--experts", 8], "--experts 8 contradicts the checkpoint's n_routed_experts=4"),   # the default, given
        (["--hidden", 64], "--hidden 64 contradicts the checkpoint's hidden_size=32"),
        (["--data", "text"], "--data text needs 256 token ids (bytes), but the checkpoint's vocab_size is 64"),
        (["--steps", 2], "--steps 2 is below the checkpoint's step 3"),
        (["--optimizer", "adamw"], "holds sgd state, but this run uses --optimizer adamw"),
    ]:
        base = ["--load", saved, "--tp", 2, "--steps", 5, "--optimizer", "sgd", "--batch-size", 4]
        opts = ds_train.parse(base + argv)
        assert message in (ds_train.validate(opts, 2) or ""), argv


def test_lesson_6_loaders_refuse_a_deepseek_checkpoint_naming_lesson_12(saved, tmp_path, capsys):
    from tp_from_scratch.gpt import convert, generate
    lesson_12 = "holds a DeepSeek-V3 model (Lesson 12: python -m tp_from_scratch.deepseek.train"
    with pytest.raises(ckpt.CheckpointError, match=lesson_12.replace("(", r"\(")):
        ckpt.load_full(saved)
    assert lesson_12 in gpt_train.validate(gpt_train.parse(["--load", saved, "--steps", 9]), 1)
    for main, argv in [(convert.main, ["export", str(saved), "--out", str(tmp_path / "hf")]),
                       (ckpt.main, ["export", str(saved), str(tmp_path / "x.pt")]),
                       (generate.main, ["--load", str(saved), "--prompt", "1,2"])]:
        with pytest.raises(SystemExit) as exit_:
            main(argv)
        assert exit_.value.code == 1
        assert lesson_12 in capsys.readouterr().err, argv
    assert not (tmp_path / "hf").exists() and not (tmp_path / "x.pt").exists()
    ckpt.main(["info", str(saved)])   # info reads any model's shards
    assert "2 shards verified" in capsys.readouterr().out


def test_lesson_12_loaders_refuse_a_gpt_checkpoint(tmp_path, capsys):
    from tests.test_checkpoint_model import save
    from tp_from_scratch.deepseek import convert, generate
    gpt = save(tmp_path / "gpt")
    with pytest.raises(ckpt.CheckpointError, match="holds an ordinary GPT .* but this run expects a DeepSeek-V3"):
        ds_ckpt.load(gpt)
    assert "holds an ordinary GPT" in ds_train.validate(ds_train.parse(["--load", gpt, "--steps", 9]), 1)
    for main, argv in [(convert.main, ["export", str(gpt), "--out", str(tmp_path / "hf")]),
                       (generate.main, ["--load", str(gpt), "--prompt", "1,2"])]:
        with pytest.raises(SystemExit) as exit_:
            main(argv)
        assert exit_.value.code == 1
        assert "holds an ordinary GPT" in capsys.readouterr().err, argv


def test_import_from_transformers_files_and_export_back(tmp_path, capsys):
    # transformers' files -> a checkpoint cut for 2 expert-parallel ranks -> the model at other t
    # and layouts computes transformers' logits; the trainer takes its sizes; export gives back
    # the same tensors transformers reads
    from safetensors.torch import load_file
    from tests.hf_models import deepseek_v3
    from tp_from_scratch.deepseek import convert
    hf = deepseek_v3(seed=61)
    hf.save_pretrained(tmp_path / "hf")
    convert.main(["import", str(tmp_path / "hf"), "--out", str(tmp_path / "ours"), "--tp", "2", "--layout", "ep",
                  "--dtype", "float64"])
    assert "2 shard(s), layout expert parallel" in capsys.readouterr().out
    ids = torch.randint(0, hf.config.vocab_size, (2, 7), generator=torch.Generator().manual_seed(62))
    expected = hf(ids).logits.detach()
    for layout, t in [("expert tensor parallel", 2), ("experts on all tokens", 4)]:
        def logits(comm, layout=layout):
            return convert.load_model(tmp_path / "ours", group=comm, layout=layout)[0](ids).detach()
        for r, got in enumerate(run_spmd(logits, t)):
            assert_matches_reference(got, expected, name=f"logits of the imported model ({layout})", rank=r)
    opts = ds_train.parse(["--load", tmp_path / "ours", "--tp", 2, "--steps", 1, "--batch-size", 2])
    assert ds_train.validate(opts, 2) is None
    assert ds_train.model_config(opts).n_group == hf.config.n_group == 4
    convert.main(["export", str(tmp_path / "ours"), "--out", str(tmp_path / "back")])
    original, back = load_file(tmp_path / "hf" / "model.safetensors"), load_file(tmp_path / "back" / "model.safetensors")
    assert set(back) == set(original)
    for name, value in original.items():
        assert torch.equal(back[name], value), name


def test_what_the_import_cannot_map_is_named_before_anything_is_written(tmp_path, capsys):
    from tests.hf_models import deepseek_v3
    from tp_from_scratch.deepseek import convert
    deepseek_v3(seed=63).save_pretrained(tmp_path / "hf")
    for argv, message in [(["--tp", "3"], "num_attention_heads"),
                          (["--tp", "3", "--layout", "ep"], "n_routed_experts"),
                          (["--tp", "0"], "--tp")]:
        with pytest.raises(SystemExit) as exit_:
            convert.main(["import", str(tmp_path / "hf"), "--out", str(tmp_path / "ours"), *argv])
        assert exit_.value.code in (1, 2)
        assert message in capsys.readouterr().err, argv
        assert not (tmp_path / "ours").exists()


def test_the_import_cuts_for_each_layout_what_that_layout_can_cut(tmp_path, capsys):
    # E = 6 experts over 4 ranks: whole experts cannot be dealt out, but expert TP splits each
    # expert's F = 12 columns, so the same files import for etp and are refused for ep, naming E
    from tests.hf_models import deepseek_v3
    from tp_from_scratch.deepseek import convert
    hf = deepseek_v3(seed=64, n_routed_experts=6, n_group=2, topk_group=1)
    hf.save_pretrained(tmp_path / "hf")
    with pytest.raises(SystemExit):
        convert.main(["import", str(tmp_path / "hf"), "--out", str(tmp_path / "ep"), "--tp", "4", "--layout", "ep"])
    assert "n_routed_experts (for expert parallelism)" in capsys.readouterr().err
    assert not (tmp_path / "ep").exists()
    convert.main(["import", str(tmp_path / "hf"), "--out", str(tmp_path / "etp"), "--tp", "4", "--layout", "etp",
                  "--dtype", "float64"])
    ids = torch.randint(0, hf.config.vocab_size, (2, 5), generator=torch.Generator().manual_seed(65))
    got = run_spmd(lambda comm: convert.load_model(tmp_path / "etp", group=comm)[0](ids).detach(), 1)[0]
    assert_matches_reference(got, hf(ids).logits.detach(), name="logits of the etp-cut import, glued back")
