"""Property tests: for random shapes, TP degrees and seeds, the parallel block equals the reference.

Hypothesis draws the sizes; the "ci" profile in tests/conftest.py makes the draws fixed
(derandomize=True), so CI runs the same handful of cases every time. Run
`pytest tests/test_layers_property.py --hypothesis-profile=dev` to search wider.
"""
import numpy as np
from hypothesis import given
from hypothesis import strategies as st

from tp_from_scratch.comm import run_spmd
from tp_from_scratch.compare import assert_all_match
from tp_from_scratch.layers import attention, block, check
from tp_from_scratch.layers.reference import BlockConfig, init_block_params
from tp_from_scratch.testing import rank_rng


@st.composite
def block_cases(draw):
    """(t, BlockConfig, batch, seq) with every size divisible as tensor parallelism needs."""
    t = draw(st.integers(1, 4))
    n_heads = t * draw(st.integers(1, 3))
    # KV heads: divisors of nh that are sharded (t divides them) or replicated (they divide t)
    kv_options = [n for n in range(1, n_heads + 1)
                  if n_heads % n == 0 and (n % t == 0 or t % n == 0)]
    n_kv_heads = draw(st.sampled_from(kv_options))
    head_size = draw(st.integers(1, 3))
    ffn = t * draw(st.integers(1, 4))
    config = BlockConfig(hidden=n_heads * head_size, n_heads=n_heads, n_kv_heads=n_kv_heads, ffn=ffn)
    return t, config, draw(st.integers(1, 2)), draw(st.integers(1, 5))


@given(block_cases(), st.integers(0, 2**16), st.sampled_from([np.float64, np.float32]))
def test_parallel_block_matches_reference_for_random_shapes(case, seed, dtype):
    t, config, batch, seq = case
    # outputs, dx, every gathered gradient, and 2 all-reduces each way, on every rank
    run_spmd(check.check_block, t, config, batch=batch, seq=seq, seed=seed, dtype=dtype)


@given(block_cases(), st.integers(0, 2**16))
def test_block_shard_gather_round_trip_is_exact_for_random_shapes(case, seed):
    t, config, _, _ = case
    params = init_block_params(rank_rng(seed), config)
    local = [block.shard_block_params(params, config, t, r) for r in range(t)]
    assert_all_match(block.gather_block_params(local, config), params, exact=True)


@given(st.integers(1, 6), st.integers(1, 8), st.integers(1, 8))
def test_kv_heads_are_placed_or_refused(t, groups, n_kv_heads):
    # any head counts: either every rank gets exactly the KV heads its query heads read,
    # or a ValueError names the quantity that does not split
    n_heads = n_kv_heads * groups
    try:
        placement = [attention.kv_heads_of_rank(n_heads, n_kv_heads, t, r) for r in range(t)]
    except ValueError as error:
        assert "heads" in str(error) and f"tp={t}" in str(error)
        assert n_heads % t or (n_kv_heads % t and t % n_kv_heads)
        return
    for r, (first, count) in enumerate(placement):
        needed = {j // groups for j in range(r * n_heads // t, (r + 1) * n_heads // t)}
        assert needed == set(range(first, first + count))
