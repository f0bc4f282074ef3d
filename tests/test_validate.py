"""Predicted vs published tables (data/, citations in src/trainplan/data/SOURCES.md), one named tolerance each.

The tolerances record what the default Efficiency reaches today (one Efficiency for every row, no per-row
tuning); the project's target is 10% MAPE for throughput and 10% for torchtitan's reserved memory.
"""

import pytest

from trainplan.efficiency import Efficiency
from trainplan.validate import mape_table, validate_all

# Narayanan 2021 Table 1 (TFLOP/s per GPU, the paper's formula)
MEGATRON_T1_MAPE_TOL_PCT = 20.0
# Korthikanti 2022 Tables 3/5 (iteration time, full recompute and TP+SP+selective)
KORTHIKANTI_MAPE_TOL_PCT = 10.0
# torchtitan docs/performance.md, 64×A100 FSDP (tokens/s/GPU)
TORCHTITAN_A100_MAPE_TOL_PCT = 40.0
# torchtitan H100 2024-12, eager bf16 rows (tokens/s/GPU) and peak reserved memory
TORCHTITAN_H100_TPS_MAPE_TOL_PCT = 100.0
# Memory: memory.py's selective-recompute activations over-predict the seq-8192 rows (~137 vs 82 GiB);
# this guards the current level until that term is fixed (target: 10%).
TORCHTITAN_H100_MEM_MAPE_TOL_PCT = 80.0


@pytest.fixture(scope="module")
def mape():
    m = mape_table(validate_all(Efficiency()))
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


def test_unmodelled_rows_are_shown_but_excluded():
    df = validate_all(Efficiency())
    fp8 = df[df["note"].str.contains("float8|Float8", regex=True)]
    assert len(fp8) > 0 and not fp8["in_mape"].any()
