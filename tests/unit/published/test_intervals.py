"""published.intervals.memory_interval_factors: the memory interval as factors of its p50."""

import math

import pytest

from trainplan.published.intervals import memory_interval_factors


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
