"""FP8 as a planned technique (training.precision fp8-tensorwise | fp8-rowwise): what it changes in the step time,
where it is refused, how it validates against the open FP8 rows, and what the memo's technique table says."""

from dataclasses import replace

import numpy as np
import pytest

from trainplan.model.arch import resolve_model
from trainplan.model.base import ConfigError
from trainplan.model.efficiency import Efficiency
from trainplan.model.hardware import ClusterSpec, resolve_gpu
from trainplan.model.layout import Layout, check_layout
from trainplan.model.timing import fp8_cast_bytes_mb, step_time
from trainplan.model.training import TrainingSpec

H100 = ClusterSpec(nodes=4, gpus_per_node=8, gpu=resolve_gpu("h100-sxm-80gb"))
A100 = ClusterSpec(nodes=4, gpus_per_node=8, gpu=resolve_gpu("a100-80gb"))
M = resolve_model("llama2-13b")
T = TrainingSpec(seq_len=4096, global_batch=256, kernels="compiled")
LAY = Layout(dp=32, sharding="zero3")


def test_fp8_is_refused_on_a100_with_the_key_and_the_valid_gpus():
    with pytest.raises(ConfigError, match=r"training\.precision.*a100-80gb has no FP8.*h100-sxm-80gb"):
        check_layout(M, A100, replace(T, precision="fp8-tensorwise"), LAY)
    with pytest.raises(ConfigError, match="no FP8"):
        step_time(M, A100, replace(T, precision="fp8-rowwise"), LAY)


def test_cli_precision_flag_and_a100_refusal(capsys):
    from trainplan.cli import main

    args = ["estimate", "--model", "llama2-13b", "--gpus", "32", "--seq-len", "4096", "--global-batch", "256",
            "--kernels", "compiled", "--json"]
    assert main(args + ["--precision", "fp8-tensorwise"]) == 0
    assert main(args + ["--gpu", "a100-80gb", "--precision", "fp8-tensorwise"]) == 2
    err = capsys.readouterr().err
    assert "training.precision" in err and "Traceback" not in err


def test_fp8_speeds_up_gemms_and_keeps_memory():
    from trainplan.model import memory

    eff = Efficiency.for_gpu(H100.gpu)
    b = step_time(M, H100, T, LAY, eff)
    t = step_time(M, H100, replace(T, precision="fp8-tensorwise"), LAY, eff)
    assert t["step_time_s"] < b["step_time_s"]
    assert memory.memory_breakdown(M, H100, replace(T, precision="fp8-tensorwise"), LAY, eff)["total"] == \
        memory.memory_breakdown(M, H100, T, LAY, eff)["total"]
    # at infinite FP8 GEMM speed the step still pays attention, norms, the bf16 output layer and the casts
    inf = step_time(M, H100, replace(T, precision="fp8-tensorwise"), LAY, eff.replace(fp8_gemm_eff_tensorwise=0.9))
    assert inf["step_time_s"] > 0.3 * b["step_time_s"]


def test_rowwise_casts_more_than_tensorwise_and_fsdp_fp8_gather_skips_weight_casts():
    tw = replace(T, precision="fp8-tensorwise")
    rw = replace(T, precision="fp8-rowwise")
    f_tw, b_tw = fp8_cast_bytes_mb(M, tw, 4096.0, np.asarray(1), 1.0)
    f_rw, b_rw = fp8_cast_bytes_mb(M, rw, 4096.0, np.asarray(1), 1.0)
    assert b_rw > b_tw
    f0, _ = fp8_cast_bytes_mb(M, tw, 4096.0, np.asarray(1), 0.0)
    assert f0 < f_tw


@pytest.fixture(scope="module")
def rows():
    from trainplan.published.tables import validate_all

    return validate_all()


def test_fp8_rows_are_scored_and_nemo_is_held_out(rows):
    from trainplan.published.fit import GEN_FIT

    fp8 = rows[rows["precision"].astype(str).str.startswith("fp8") & (rows["metric"] != "memory_gib")]
    assert {"torchtitan_h100", "torchtitan_asynctp_h100", "nemo2407_h100"} <= set(fp8["table"])
    assert "nemo2407_h100" not in GEN_FIT["h100"]["tables"]  # never fitted on: a held-out check
    nemo = rows[rows["table"] == "nemo2407_h100"]
    assert len(nemo) >= 14 and nemo["in_mape"].all()
    assert not nemo["row"].str.contains("Nemotron").any()  # squared-ReLU MLP: not modelled, not scored


# Held-out NeMo 24.07 FP8 tokens/s/GPU: MAPE reached (see the closing note of the FP8 issue); torchtitan FP8/bf16
# speed-up ratios: every pair within this many percent of the published ratio.
NEMO_MAPE_TOL_PCT = 18.0  # reached 16.5%, all under-predicted (TE's FP8 stack beats the torchtitan-fitted efficiency)
FP8_RATIO_TOL_PCT = 12.0  # reached: every pair within ±10.7%


def test_nemo_fp8_held_out_mape(rows):
    nemo = rows[rows["table"] == "nemo2407_h100"]
    assert nemo["err_pct"].abs().mean() <= NEMO_MAPE_TOL_PCT


def test_fp8_speedup_ratios_against_the_published_pairs(rows):
    from trainplan.published.fit import fp8_speedups

    r = fp8_speedups(rows)
    assert len(r) >= 6 and {"fp8-tensorwise", "fp8-rowwise"} <= set(r["recipe"])
    assert (r["err_pct"].abs() <= FP8_RATIO_TOL_PCT).all(), r.to_string()
    # rowwise is slower than tensorwise on the 8B async-TP rows, as published
    rw = r[(r["recipe"] == "fp8-rowwise") & (r["model"] == "llama3-8b")]
    tw = r[(r["recipe"] == "fp8-tensorwise") & (r["model"] == "llama3-8b")]
    assert (rw["predicted_ratio"].to_numpy() < tw["predicted_ratio"].to_numpy()).all()


def test_technique_table_gets_fp8_rows_for_the_chosen_layout_and_keeps_bf16():
    from trainplan.search.layouts import fp8_technique_rows, technique_verdicts

    eff = Efficiency.for_gpu(H100.gpu)
    extra = fp8_technique_rows(M, H100, T, LAY, eff)
    assert [r["technique"].split(" (")[0] for r in extra] == ["FP8 matmuls", "FP8 matmuls"]
    assert not any(r["used_by_best"] for r in extra)  # bf16 unless the study opts in
    assert all("day-1" in r["note"] and "loss" in r["note"] for r in extra)
    import pandas as pd

    tech = technique_verdicts(pd.DataFrame(columns=["feasible", "tokens_per_s", "layout_text", "sp", "cp", "offload",
                                                    "recompute", "pp_schedule", "micro_batch", "tp_overlap"]),
                              extra)
    assert tech["technique"].str.startswith("FP8").sum() == 2
    assert fp8_technique_rows(M, A100, T, LAY, Efficiency()) == []
