"""Lesson 14's real-text experiment (inference/experiment.py) on a tiny plan: the plain row is the
single-device GPT (the emulation at t = 4 equals it), SPD takes blocks in the sensitivity order
and its last row drops every block, the rows' bytes are the meter-checked formula, and the Pareto
frontier keeps exactly the rows nothing beats. The measurements themselves are not asserted."""
import math

import pytest

from tp_from_scratch.compare import tolerance
from tp_from_scratch.gpt.model import GPTConfig
from tp_from_scratch.inference import experiment
from tp_from_scratch.inference.models import forward_bytes

TINY = dict(experiment.QUICK, config=dict(vocab_size=256, seq_len=8, n_layers=2, hidden=16, n_heads=4, n_kv_heads=2,
                                          ffn=32, arch="gpt"), steps=2, batch=2, val_batches=1, calibration_batches=1,
            bits=(4,), groups=(8,), fractions=(0.5,))


@pytest.fixture(scope="module")
def results():
    return experiment.run(TINY, log=lambda *_: None)


def test_rows_follow_the_plan(results):
    rows, t = results["rows"], TINY["t"]
    config = GPTConfig(**TINY["config"])
    plain = rows[0]
    assert plain["technique"] == "plain TP"
    # plain TP's emulation at t = 4 is the single-device GPT, up to the order of its sums (float32)
    assert abs(plain["loss"] - results["single_device_loss"]) <= tolerance("float32", layers=config.n_layers)
    spd = [r for r in rows if r["technique"] == "SPD"]
    assert len(spd) == config.n_layers and spd[-1]["bytes_per_token"] == forward_bytes(
        config, t, 0, 1, 2, tuple(range(config.n_layers)))
    order = results["sensitivity_order"]
    for k, row in enumerate(spd, 1):
        assert row["setting"].endswith(str(tuple(sorted(order[:k])))), row["setting"]
    caat = next(r for r in rows if r["technique"] == "CAAT-Net")
    assert caat["bytes_per_token"] < plain["bytes_per_token"]
    for row in rows:
        assert math.isclose(row["perplexity"], math.exp(row["loss"]))
        assert set(row["decode_ms"]) == {"this CPU", "NVLink", "PCIe"}


def test_pareto_keeps_what_nothing_beats():
    rows = [{"perplexity": 2.0, "b": 10}, {"perplexity": 1.5, "b": 20}, {"perplexity": 2.5, "b": 15},
            {"perplexity": 1.5, "b": 20}]
    front = experiment.pareto(rows, lambda r: r["b"])
    assert front == [rows[0], rows[1], rows[3]]
