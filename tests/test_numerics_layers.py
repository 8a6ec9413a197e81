"""Lesson 13's invariant layers and a whole GPT built from them, on simulated ranks.

Every output and every gradient at t = 2, 4, 8 must be bit for bit the t = 1 result (float32,
gaussian data: sums whose order shows). Against the single-device references (torch.nn.Linear,
F.cross_entropy, the GPT) they agree within the tolerance policy, not bitwise: the fixed tree is
one order, one device's BLAS another. Then the three ways to break it, each patched in for one
test, must break it: a ring all-reduce in place of the tree, a sequential sum inside a rank, and
the BLAS matmul at a shard of one row.
"""
import pytest
import torch
import torch.nn.functional as F

from tests.invariant_gpt import CONFIGS, check_gpt, gpt_outputs
from tp_from_scratch.comm import SPMDError, run_spmd
from tp_from_scratch.compare import assert_matches_reference, tolerance
from tp_from_scratch.gpt.arch import COLWISE, KV_COLWISE, REPLICATED, ROWWISE, VOCAB_PARALLEL
from tp_from_scratch.gpt.model import GPTConfig, init_gpt
from tp_from_scratch.nn import ColumnParallelLinear, RowParallelLinear, VocabParallelEmbedding
from tp_from_scratch.nn.mappings import all_gather, all_reduce
from tp_from_scratch.numerics import (INVARIANT_STYLES, InvariantColumnParallelLinear, InvariantRowParallelLinear,
                                      check, check_invariant, invariant_lm_head, tree)
from tp_from_scratch.numerics import cross_entropy as invariant_ce
from tp_from_scratch.numerics import layers as invariant_layers


@pytest.mark.parametrize("t", [1, 2, 4, 8])
def test_every_layer_output_and_gradient_equals_t1_bit_for_bit(t):
    # column, column with a KV head on t/2 ranks, row, LM head and cross-entropy (numerics.check)
    run_spmd(check.check_layers, t, timeout=60)


@pytest.mark.parametrize("t", [2, 4, 8])
def test_the_whole_gpt_equals_t1_bit_for_bit(t):
    # GPT-2 with 2 KV heads (at t = 8 each on 4 ranks), the GPT with 4, Llama: logits, loss, every gradient
    run_spmd(check_gpt, t, timeout=120)


@pytest.mark.parametrize("config", CONFIGS, ids=[c.arch for c in CONFIGS])
def test_the_invariant_gpt_at_t1_is_the_single_device_gpt_within_the_tolerance(config):
    logits, loss, grads = run_spmd(gpt_outputs, 1, config)[0]
    gpt = init_gpt(config, 0)
    gen = torch.Generator().manual_seed(1)
    idx, targets = (torch.randint(0, config.vocab_size, (2, 16), generator=gen) for _ in range(2))
    want_logits, want_loss = gpt(idx, targets)
    want_loss.backward()
    bound = tolerance(torch.float32, layers=config.n_layers)
    assert_matches_reference(logits, want_logits.detach(), name="logits", tol=bound)
    assert_matches_reference(loss, want_loss.detach(), name="loss", tol=bound)
    for name, p in gpt.named_parameters():
        assert_matches_reference(grads[name], p.grad, name=f"grad of {name}", tol=bound)


def single_device_layers(seed=0):
    gen = torch.Generator().manual_seed(seed)
    column, row = torch.nn.Linear(16, 24, dtype=torch.float64), torch.nn.Linear(24, 16, dtype=torch.float64)
    with torch.no_grad():
        for p in [*column.parameters(), *row.parameters()]:
            p.copy_(torch.randn(p.shape, generator=gen, dtype=torch.float64))
    return column, row, torch.randn(5, 16, generator=gen, dtype=torch.float64)


@pytest.mark.parametrize("t", [1, 2, 4, 8])
def test_column_then_row_equals_torch_nn_linear_within_the_tolerance(t):
    column, row, x = single_device_layers()
    xr = x.clone().requires_grad_()
    row(F.gelu(column(xr))).sum().backward()

    def rank(comm):
        c = InvariantColumnParallelLinear.from_linear(column, group=comm)
        r = InvariantRowParallelLinear.from_linear(row, group=comm)
        xt = x.clone().requires_grad_()
        y = r(F.gelu(c(xt)))
        y.sum().backward()
        grads = {"column.weight": c.weight.grad, "column.bias": c.bias.grad, "row.weight": r.weight.grad}
        return y.detach(), xt.grad, {k: all_gather(comm, g, 0 if k.startswith("column") else -1) for k, g in grads.items()}
    for rank, (y, dx, grads) in enumerate(run_spmd(rank, t)):
        assert_matches_reference(y, row(F.gelu(column(x))).detach(), name="output", rank=rank)
        assert_matches_reference(dx, xr.grad, name="dx", rank=rank)
        assert_matches_reference(grads["column.weight"], column.weight.grad, name="column dW", rank=rank)
        assert_matches_reference(grads["column.bias"], column.bias.grad, name="column db", rank=rank)
        assert_matches_reference(grads["row.weight"], row.weight.grad, name="row dW", rank=rank)


@pytest.mark.parametrize("t", [1, 2, 4])
def test_the_head_and_cross_entropy_equal_torch_within_the_tolerance(t):
    gen = torch.Generator().manual_seed(3)
    h, weight = torch.randn(12, 8, generator=gen, dtype=torch.float64), torch.randn(16, 8, generator=gen, dtype=torch.float64)
    target = torch.randint(0, 16, (12,), generator=gen)
    target[3] = -100                                         # ignored, as in F.cross_entropy
    hr, wr = h.clone().requires_grad_(), weight.clone().requires_grad_()
    want = F.cross_entropy(hr @ wr.t(), target)
    want.backward()

    def rank(comm):
        hx, wx = h.clone().requires_grad_(), weight.tensor_split(comm.world_size)[comm.rank].clone().requires_grad_()
        logits = invariant_lm_head(comm, hx, wx, 16)
        loss = invariant_ce.invariant_vocab_parallel_cross_entropy(comm, logits, target, vocab_start=comm.rank * 16 // t)
        loss.backward()
        return loss.detach(), hx.grad, all_gather(comm, wx.grad, 0)
    for rank, (loss, dh, dw) in enumerate(run_spmd(rank, t)):
        assert_matches_reference(loss, want.detach(), name="loss", rank=rank)
        assert_matches_reference(dh, hr.grad, name="dh", rank=rank)
        assert_matches_reference(dw, wr.grad, name="dE", rank=rank)


def test_the_style_table_covers_the_plan_and_the_layers_are_drop_ins():
    assert set(INVARIANT_STYLES) == {COLWISE, KV_COLWISE, ROWWISE, VOCAB_PARALLEL}  # REPLICATED: unchanged
    assert REPLICATED not in INVARIANT_STYLES
    assert INVARIANT_STYLES[VOCAB_PARALLEL] is VocabParallelEmbedding      # exact already: one row, t-1 zeros
    column, row, _ = single_device_layers()

    def rank(comm):
        pairs = [(InvariantColumnParallelLinear.from_linear(column, group=comm), ColumnParallelLinear.from_linear(column, group=comm)),
                 (InvariantRowParallelLinear.from_linear(row, group=comm), RowParallelLinear.from_linear(row, group=comm))]
        for mine, lessons in pairs:
            assert isinstance(mine, type(lessons))
            ours, theirs = mine.state_dict(), lessons.state_dict()
            assert list(ours) == list(theirs)
            for key in ours:
                assert_matches_reference(ours[key], theirs[key], name=key, rank=comm.rank, exact=True)
    run_spmd(rank, 4)


# ---------------------------------------------------------------------------------------
# Breaking it: each patched-in variant must make t = 8 differ from t = 1
# ---------------------------------------------------------------------------------------

def llama_logits_and_grads(group):
    logits, loss, grads = gpt_outputs(group, CONFIGS[2])
    return logits, grads


def differs_from_t1(t=8):
    """True when some logit or gradient of the invariant Llama at t differs from t = 1."""
    want_logits, want_grads = run_spmd(llama_logits_and_grads, 1)[0]
    got = run_spmd(llama_logits_and_grads, t)
    from tp_from_scratch.gpt.parallelize import shard_tensor
    for r, (logits, grads) in enumerate(got):
        if not torch.equal(logits, want_logits.tensor_split(t, -1)[r]):
            return True
        if any(not torch.equal(g, shard_tensor(n, want_grads[n], t, r, CONFIGS[2])) for n, g in grads.items()):
            return True
    return False


def test_unpatched_the_llama_check_does_not_differ():
    assert not differs_from_t1()


def test_a_ring_all_reduce_in_place_of_the_tree_breaks_the_equality(monkeypatch):
    def ring(group, leaves, n_leaves):
        return all_reduce(group, tree.local_tree_sum(leaves))  # Lesson 2's ring on a Comm
    monkeypatch.setattr(invariant_layers, "tree_all_reduce", ring)
    monkeypatch.setattr(invariant_ce, "tree_all_reduce", ring)
    assert differs_from_t1()


def test_a_sequential_sum_inside_a_rank_breaks_the_equality(monkeypatch):
    def sequential(leaves):
        total = leaves[0].clone() if hasattr(leaves, "clone") else leaves[0].copy()
        for leaf in leaves[1:]:
            total = total + leaf
        return total
    monkeypatch.setattr(tree, "local_tree_sum", sequential)
    assert differs_from_t1()


def test_the_blas_matmul_at_a_one_row_shard_breaks_the_equality(monkeypatch):
    # a vocabulary of 8 at t = 8: every rank's head holds ONE row of E
    gen = torch.Generator().manual_seed(4)
    h, weight = torch.randn(32, 64, generator=gen), torch.randn(8, 64, generator=gen)

    def logits(comm):
        return invariant_lm_head(comm, h, weight.tensor_split(comm.world_size)[comm.rank], 8)

    def gathered(t):
        return torch.cat(run_spmd(logits, t), -1)
    assert torch.equal(gathered(8), gathered(1))             # invariant_linear: the same bits
    monkeypatch.setattr(invariant_layers, "invariant_linear", lambda x, w, b=None: F.linear(x, w, b))
    assert not torch.equal(gathered(8), gathered(1))         # BLAS on (32, 64) x (64, 1): other bits


# ---------------------------------------------------------------------------------------
# What the tree cannot serve is refused by name
# ---------------------------------------------------------------------------------------

@pytest.mark.parametrize("t", [3, 6])
def test_a_t_that_does_not_divide_the_leaves_is_refused(t):
    with pytest.raises(SPMDError, match=f"tp={t} cannot serve the fixed reduction tree of 8 leaves"):
        run_spmd(lambda comm: InvariantRowParallelLinear(24, 8, group=comm), t)


def test_layer_sizes_and_options_the_tree_cannot_serve_are_refused():
    cases = [(lambda comm: InvariantColumnParallelLinear(8, 12, group=comm), "out_features 12 is not divisible by the 8"),
             (lambda comm: InvariantRowParallelLinear(12, 8, group=comm), "in_features 12 is not divisible by the 8"),
             (lambda comm: InvariantColumnParallelLinear(8, 16, group=comm, input_is_copied=True), "input_is_copied=False"),
             (lambda comm: InvariantColumnParallelLinear(8, 16, True, True, group=comm), "gather_output"),
             (lambda comm: invariant_lm_head(comm, torch.ones(2, 4), torch.ones(6, 4), 12), "vocab size 12"),
             (lambda comm: invariant_lm_head(comm, torch.ones(2, 4), torch.ones(3, 4), 16), "not this rank's 8"),
             (lambda comm: invariant_ce.invariant_vocab_parallel_cross_entropy(
                 comm, torch.ones(2, 6), torch.zeros(2, dtype=torch.long), vocab_start=0), "do not cut into")]
    for build, message in cases:
        with pytest.raises(SPMDError, match=message):
            run_spmd(build, 2)


@pytest.mark.parametrize("change,t,message", [
    (dict(hidden=36, n_heads=6, n_kv_heads=6), 2, "hidden size 36 is not divisible by the 8 leaves"),
    (dict(ffn=100), 2, "ffn size 100"),
    (dict(vocab_size=67), 2, "vocab size 67"),
    (dict(n_kv_heads=2), 4, "one query head per rank"),
    (dict(n_kv_heads=4, arch="llama"), 8, "with RoPE"),
    (dict(), 3, "tp=3"),
])
def test_check_invariant_names_what_the_tree_cannot_serve(change, t, message):
    config = GPTConfig(**{**dict(vocab_size=64, hidden=64, n_heads=8, n_kv_heads=8, ffn=256), **change})
    with pytest.raises(ValueError, match=message):
        check_invariant(config, t)
