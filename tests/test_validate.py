"""Predicted vs published tables (data/, citations in src/trainplan/data/SOURCES.md), one named tolerance each.

The tolerances record what the default Efficiency reaches today (one Efficiency for every row, no per-row
tuning; the defaults are the joint fit of docs/timing-model.md §7), with a little margin; the project's
target is 10% MAPE for throughput and 10% for torchtitan's reserved memory.
"""

import numpy as np
import pytest

from trainplan.efficiency import Efficiency
from trainplan.validate import FIT_PARAMS, FIT_TABLES, _fit_residuals, fit_defaults, mape_table, validate_all

# Narayanan 2021 Table 1 (TFLOP/s per GPU, the paper's formula): reached 3.7% (target 10%)
MEGATRON_T1_MAPE_TOL_PCT = 5.0
# Korthikanti 2022 Tables 3/5 (iteration time, full recompute and TP+SP+selective): reached 3.8% (target 10%)
KORTHIKANTI_MAPE_TOL_PCT = 5.0
# torchtitan docs/performance.md, 64×A100 FSDP (tokens/s/GPU): reached 2.6% (target 10%)
TORCHTITAN_A100_MAPE_TOL_PCT = 5.0
# torchtitan 500 W H100s (benchmarks 2024-12 bf16 eager + compile rows, docs 405B bf16 row), held out of the
# fit: reached 24.6%, all over-predicted (the power cap is not modelled; target 10%)
TORCHTITAN_H100_TPS_MAPE_TOL_PCT = 27.0
# Memory vs torchtitan's peak reserved GiB (the two eager seq-8192 FSDP rows in scope): reached 6.3%, both
# under-predicted (target 10%, which is this tolerance).
TORCHTITAN_H100_MEM_MAPE_TOL_PCT = 10.0


@pytest.fixture(scope="module")
def rows():
    return validate_all(Efficiency())


@pytest.fixture(scope="module")
def mape(rows):
    m = mape_table(rows)
    return {(r.table, r.metric): r.mape_pct for r in m.itertuples()}


def test_megatron2021_table1(mape):
    assert mape[("megatron2021_t1", "tflops_per_gpu")] <= MEGATRON_T1_MAPE_TOL_PCT


def test_korthikanti2022_tables3_5(mape):
    assert mape[("korthikanti2022_t3_5", "iter_time_s")] <= KORTHIKANTI_MAPE_TOL_PCT


def test_torchtitan_a100(mape):
    assert mape[("torchtitan_a100", "tokens_per_s_per_gpu")] <= TORCHTITAN_A100_MAPE_TOL_PCT


def test_torchtitan_h100(mape):
    assert mape[("torchtitan_h100", "tokens_per_s_per_gpu")] <= TORCHTITAN_H100_TPS_MAPE_TOL_PCT
    assert mape[("torchtitan_h100", "memory_gib")] <= TORCHTITAN_H100_MEM_MAPE_TOL_PCT


# At the bottom of the bracket torchtitan states for its 500 W parts (H100 NVL's 835 TFLOP/s) the H100 MAPE
# falls from 24.6% to 12.1% and stays over-predicted: the unknown peak explains about half of the gap.
TORCHTITAN_H100_AT_NVL_PEAK_MAPE_TOL_PCT = 14.0


def test_h100_peak_bracket_rescores_only_the_500w_rows(rows, mape):
    from trainplan.validate import H100_NVL_PEAK_BF16

    low = validate_all(Efficiency(), h100_peak_flops=H100_NVL_PEAK_BF16)
    m = {(r.table, r.metric): r for r in mape_table(low).itertuples()}
    h = m[("torchtitan_h100", "tokens_per_s_per_gpu")]
    assert h.mape_pct <= TORCHTITAN_H100_AT_NVL_PEAK_MAPE_TOL_PCT < mape[("torchtitan_h100", "tokens_per_s_per_gpu")]
    assert h.bias_pct > 0  # still optimistic at the lowest stated peak: the residual is not only the cap
    a100 = ~low["table"].eq("torchtitan_h100")
    assert np.array_equal(low.loc[a100, "predicted"].to_numpy(), rows.loc[a100, "predicted"].to_numpy())


def test_h100_peak_outside_the_stated_bracket_is_refused():
    from trainplan.specs import ConfigError

    with pytest.raises(ConfigError, match="h100_peak_tflops.*835"):
        validate_all(Efficiency(), h100_peak_flops=700e12)


def test_unmodelled_rows_are_shown_but_excluded(rows):
    df = rows
    fp8 = df[df["note"].str.contains("float8|Float8", regex=True)]
    assert len(fp8) > 0 and not fp8["in_mape"].any()


def test_compile_rows_are_modelled_and_slower_than_published_less_than_eager_gap(rows):
    tps = rows[(rows["table"] == "torchtitan_h100") & (rows["metric"] == "tokens_per_s_per_gpu")]
    t1 = tps[tps["row"].str.startswith("T1 ")]
    eager, compiled = t1.iloc[0], t1.iloc[1]  # same layout, compile off / on (benchmarks table 1)
    assert eager["in_mape"] and compiled["in_mape"]
    assert compiled["predicted"] > eager["predicted"]  # fused elementwise ops move fewer bytes


def test_405b_pipeline_rows_are_evaluated_with_uneven_stages(rows):
    pp = rows[rows["row"].str.contains("405b") & rows["row"].str.contains("pp8")]
    assert len(pp) >= 8 and np.isfinite(pp["predicted"]).all() and (pp["predicted"] > 0).all()


def test_defaults_are_the_documented_fit():
    """The shipped defaults must stay the joint fit of FIT_PARAMS on FIT_TABLES (refit when physics changes)."""
    fitted, _ = fit_defaults()
    at_defaults = float(np.sum(_fit_residuals(Efficiency(), FIT_TABLES) ** 2))
    at_fit = float(np.sum(_fit_residuals(fitted, FIT_TABLES) ** 2))
    assert at_defaults <= 1.10 * at_fit + 1e-4, {p: getattr(fitted, p) for p in FIT_PARAMS}


# Leave-one-table-out error (an Efficiency refitted without the table predicts it). Reached on the open set:
# Megatron 4.3%, Korthikanti 5.4%, torchtitan A100 11.7%, torchtitan 500 W H100 24.9%; the target is
# 10%. These tolerances guard that level; a change to the physics that worsens generalisation fails here.
HELDOUT_MAPE_TOL_PCT = {"megatron2021_t1": 8.0, "korthikanti2022_t3_5": 8.0, "torchtitan_a100": 15.0,
                        "torchtitan_h100": 30.0}


@pytest.mark.slow
def test_leave_one_table_out_error_per_table(capsys):
    from trainplan.cli import main
    from trainplan.validate import heldout_tables

    df = heldout_tables()
    assert set(df["held_out"]) == set(HELDOUT_MAPE_TOL_PCT)
    for _, r in df.iterrows():
        assert r["held_out"] not in r["fit_on"].split("+")
        assert r["heldout_mape_pct"] <= HELDOUT_MAPE_TOL_PCT[r["held_out"]], r.to_dict()
    assert main(["validate", "--heldout"]) == 0
    out = capsys.readouterr().out
    assert all(t in out for t in HELDOUT_MAPE_TOL_PCT)
