"""Tornado table: one assumption at a time, ranked; a layout flip is detected through the search callable."""

from __future__ import annotations

import pytest

from trainplan.cost import budget as C
from trainplan.cost.sensitivity import TORNADO_COLUMNS, cost_evaluator, default_ranges, tornado
from trainplan.model.base import ConfigError

pytestmark = pytest.mark.timeout(60)


def _rank(a):
    """A toy search: TP wins when the inter-node network is slow, FSDP otherwise."""
    bw = a.get("inter_busbw_GBps", 46.0)
    return ("fsdp", 3600.0) if bw >= 30 else ("tp8+fsdp", 3000.0 + 10 * bw)


def _setup():
    inputs = C.CostInputs()
    ev = cost_evaluator(_rank, n_gpus=32, n_params=13e9, d2h_Bps=50e9, inputs=inputs)
    base, ranges = default_ranges(inputs, dataset_tokens=10e9, efficiency_x=(0.85, 1.1),
                                  inter_busbw_GBps=(46.0, 12.0, 50.0))
    return tornado(base, ranges, ev)


def test_tornado_columns_and_flip_first():
    df = _setup()
    assert tuple(df.columns) == TORNADO_COLUMNS
    assert df.iloc[0]["assumption"] == "inter_busbw_GBps" and df.iloc[0]["flips"]
    assert not df[df["assumption"] != "inter_busbw_GBps"]["flips"].any()
    rest = df[~df["flips"]]["swing_usd"].tolist()
    assert rest == sorted(rest, reverse=True)


def test_price_moves_cost_proportionally_and_never_the_layout():
    row = _setup().set_index("assumption").loc["price_per_gpu_hour_usd"]
    assert row["cost_high"] / row["cost_low"] == pytest.approx(6.88 / 2.0)
    assert row["layout_low"] == row["layout_high"] == row["layout_base"]


def test_dataset_size_scales_cost_almost_linearly():
    row = _setup().set_index("assumption").loc["dataset_tokens"]
    # 0.5× → 2× the tokens: 4× the training time; fixed start-up keeps the cost ratio just under 4.
    assert 3.5 < row["cost_high"] / row["cost_low"] < 4.0


def test_every_assumption_the_cost_draws_vary_has_a_tornado_row():
    """The cost table's draws vary throughput, price, failures, checkpoint bandwidth and size, evaluation share,
    start-up and restart: each is a tornado row, moved across the same range, each moving the cost its way."""
    df = _setup().set_index("assumption")
    inputs = C.CostInputs()
    for key, field, scale in (("eval_overhead_frac", "eval_frac", 1.0), ("startup_h", "startup_s", C.HOUR),
                              ("restart_h", "restart_s", C.HOUR), ("checkpoint_bytes_per_param", "bytes_per_param", 1.0)):
        row = df.loc[key]
        assert (row["low"], row["high"]) == tuple(x / scale for x in getattr(inputs, field + "_range")), key
        assert row["base"] == getattr(inputs, field) / scale
        assert row["cost_low"] <= row["cost_base"] <= row["cost_high"] and row["cost_low"] < row["cost_high"], key
    assert df.loc["eval_overhead_frac", "swing_usd"] > df.loc["restart_h", "swing_usd"]  # 5% of 17 h vs a rare restart


def test_unknown_assumption_is_a_config_error():
    with pytest.raises(ConfigError, match="sensitivity.nope"):
        tornado({"a": 1}, {"nope": (0, 1)}, lambda a: (0.0, "x"))


def test_efficiency_and_failure_rate_rows_move_the_cost_their_way():
    """efficiency_x scales the winner's throughput (slower = dearer); failure_rate_x scales the failure rate."""
    df = _setup().set_index("assumption")
    eff = df.loc["efficiency_x"]  # (0.85, 1.1)
    assert eff["cost_low"] > eff["cost_base"] > eff["cost_high"]
    fail = df.loc["failure_rate_x"]  # (0.5, 3.0)
    assert fail["cost_low"] < fail["cost_base"] < fail["cost_high"]
