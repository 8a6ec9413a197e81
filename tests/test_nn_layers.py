"""tp_from_scratch.nn layers against their single-device torch twins, on in-process ranks.

Each test runs one check of tp_from_scratch.nn.check on t simulated ranks (run_spmd, the
from-scratch collectives), in float64 and float32. A check compares the output, the input
gradient, the weight and bias gradients and the parameters after one optimizer step with
torch.nn.Linear / nn.Embedding / F.cross_entropy, through assert_matches_reference.
t = 3 and the sizes 10 and 13 exercise uneven splits. The same checks run on real
processes in test_nn_torchrun.py.
"""
import pytest
import torch

from tp_from_scratch.comm import run_spmd
from tp_from_scratch.nn.check import all_checks, check_default_init

CHECKS = {name: (check, kwargs) for name, check, kwargs in all_checks()}


@pytest.mark.parametrize("t", [1, 2, 3, 4])
@pytest.mark.parametrize("name", list(CHECKS))
def test_layer_equals_single_device(name, t):
    check, kwargs = CHECKS[name]
    for dtype in (torch.float64, torch.float32):
        run_spmd(check, t, dtype, 7, timeout=60, **kwargs)


@pytest.mark.parametrize("dtype", [torch.float64, torch.float32], ids=["float64", "float32"])
def test_default_init_with_the_same_seed_is_the_single_device_layer(dtype):
    # one simulated rank: threads share torch's default RNG (torchrun checks t = 2 and 4)
    run_spmd(check_default_init, 1, dtype, 3)
