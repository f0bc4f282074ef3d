"""published.intervals: the throughput interval (its error pools, the predictive bounds) and the memory interval as
factors of its p50."""

import math

import numpy as np
import pytest
from scipy import stats

from trainplan.model.layout import Layout
from trainplan.published import intervals
from trainplan.published.intervals import (
    error_pool,
    family_class,
    heldout_errors_by_family,
    interval_bounds,
    memory_interval_factors,
)


def test_memory_factors_are_the_interval_over_its_median():
    lo, hi = memory_interval_factors({"mem_total_gib_p10": 60.0, "mem_total_gib_p50": 66.0, "mem_total_gib_p90": 77.0})
    assert lo == pytest.approx(60 / 66) and hi == pytest.approx(77 / 66)


@pytest.mark.parametrize("q", [
    {"mem_total_gib_p50": 66.0, "mem_total_gib_p90": 77.0},  # no p10
    {"mem_total_gib_p10": 66.0, "mem_total_gib_p50": 66.0, "mem_total_gib_p90": 66.0},  # no spread
    {"mem_total_gib_p10": 60.0, "mem_total_gib_p50": math.nan, "mem_total_gib_p90": 77.0},
    {"mem_total_gib_p10": 60.0, "mem_total_gib_p50": 0.0, "mem_total_gib_p90": 77.0},
    {"mem_total_gib_p10": "60", "mem_total_gib_p50": 66.0, "mem_total_gib_p90": 77.0},
])
def test_no_factors_without_a_whole_positive_interval(q):
    assert memory_interval_factors(q) is None


def test_interval_bounds_are_the_student_t_predictive_interval_of_the_log_errors():
    """p10/p90 of the measured value: log(1 + e) of the pool centred on its mean, a new row Student-t with n − 1
    degrees of freedom scaled by sd·sqrt(1 + 1/n); measured = predicted·exp(−le), so a model that errs fast
    (e > 0) gives an interval below its prediction."""
    e = np.array([0.02, 0.10, -0.04, 0.06])
    le = np.log1p(e)
    half = le.std(ddof=1) * np.sqrt(1 + 1 / len(e)) * stats.t.ppf(0.9, len(e) - 1)
    lo, hi = interval_bounds(1000.0, e)
    assert lo == pytest.approx(1000.0 * np.exp(-(le.mean() + half)), rel=1e-12)
    assert hi == pytest.approx(1000.0 * np.exp(-(le.mean() - half)), rel=1e-12)


def test_one_error_gives_the_point_not_a_nan_interval():
    """A single held-out error has no spread to build an interval on: the interval is the prediction itself."""
    assert interval_bounds(1000.0, [0.05]) == (1000.0, 1000.0)


def test_a_family_with_three_held_out_errors_uses_its_own_pool():
    """MIN_FAMILY_ROWS = 3 errors are enough for a family's own interval; fewer fall back to every family's."""
    errors = {"TP": [0.1, 0.12, 0.08], "PP": [-0.2, -0.3]}
    assert error_pool(errors, "TP").tolist() == [0.1, 0.12, 0.08]
    assert sorted(error_pool(errors, "PP").tolist()) == [-0.3, -0.2, 0.08, 0.1, 0.12]


def test_time_metric_rows_join_the_pool_as_throughput_errors(monkeypatch):
    """A published step time (A100's PP and TP rows) is inverted before it joins the pool: predicting a 10% longer
    step is a throughput error of 1/1.1 − 1, the same sign as predicting 10% fewer tokens/s."""
    fits = {"a100": {"heldout": [{"family": "PP", "metric": "iter_time_s", "published": 10.0, "predicted": 11.0},
                                 {"family": "PP", "metric": "tokens_per_s_per_gpu", "published": 100.0,
                                  "predicted": 90.0}]}}
    monkeypatch.setattr(intervals, "generation_fits", lambda: fits)
    got = heldout_errors_by_family("a100")["PP"]
    assert got == pytest.approx([1 / 1.1 - 1, -0.1], rel=1e-12)


def test_a_layout_with_cp_and_pp_draws_on_the_cp_family():
    """CP comes first in the bias classes (then PP, then TP, else FSDP/ZeRO)."""
    assert family_class(Layout(dp=2, tp=2, pp=2, cp=2)) == "CP"
    assert family_class(Layout(dp=4, tp=2, pp=2)) == "PP"
