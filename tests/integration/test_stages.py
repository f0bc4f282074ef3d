"""The stage glue, without Snakemake: real package functions on small inputs, memo-facing shapes."""

from __future__ import annotations

import shlex
from dataclasses import replace
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from trainplan.calibration.scaling import stage_fit_scaling
from trainplan.calibration.sources import OPEN_SET, stage_calibrate
from trainplan.config import config_slice, load_config
from trainplan.cost.budget import CostInputs, stage_cost_and_risk
from trainplan.cost.sensitivity import stage_sensitivity
from trainplan.io import read_json, write_json
from trainplan.launch.artifacts import load_inputs
from trainplan.model.base import ConfigError
from trainplan.model.efficiency import Efficiency
from trainplan.model.hardware import resolve_gpu
from trainplan.model.timing import attention_kernel_rel
from trainplan.provenance import study_hash
from trainplan.proxy.aggregate import METRICS, aggregate, rel_err
from trainplan.proxy.record import assemble_record
from trainplan.proxy.schema import normalize_run_spec
from trainplan.proxy.select import cpu_model
from trainplan.stages import analytic_model, launch_artifacts

ROOT = Path(__file__).resolve().parents[2]
TINY = [ROOT / "config" / "config.yaml", ROOT / "config" / "tiny.yaml"]
DEFAULT = ROOT / "config" / "config.yaml"


def synthetic_records(model) -> pd.DataFrame:
    """CPU records whose bytes follow the analytic parameter counts exactly (what a correct harness measures)."""
    rows = []
    for L in (1, 2, 3, 4):
        p = cpu_model(model, 64, L, 128).n_params
        rows.append({"id": f"depth-L{L}", "family": "depth", "device": "cpu", "status": "ok", "layers": L,
                     "hidden": 64, "world_size": 2, "params_meas": p, "state_bytes_meas": 16 * p / 2,
                     "flops_per_step_meas": 1e6 * (3 + 2 * L), "comm_bytes_meas": 4e5 * L + 1e4})
    for h in (64, 128, 192, 256):
        p = cpu_model(model, h, 2, 128).n_params
        rows.append({"id": f"width-h{h}", "family": "width", "device": "cpu", "status": "ok", "layers": 2,
                     "hidden": h, "world_size": 2, "params_meas": p, "state_bytes_meas": 8 * p})
    p = cpu_model(model, 64, 2, 128).n_params
    for n in (1, 2):
        rows.append({"id": f"scaleout-n{n}", "family": "scaleout", "device": "cpu", "status": "ok", "layers": 2,
                     "hidden": 64, "world_size": n, "params_meas": p, "state_bytes_meas": 16 * p / n})
    df = pd.DataFrame(rows)
    df["state_bytes_pred"], df["saved_act_bytes_pred"], df["saved_act_bytes_meas"] = (
        df["state_bytes_meas"], 1000.0, 1010.0)
    return df


def test_records_have_one_pred_meas_rel_err_triple_per_compared_metric(tmp_path):
    """records.csv names each compared metric m once: m_pred, m_meas, m_rel_err = m_pred / m_meas − 1."""
    from trainplan.model.arch import ModelSpec
    from trainplan.model.layout import Layout
    from trainplan.proxy import analytic

    spec = normalize_run_spec({"id": "r", "model": "debug", "layout": {"dp": 2}, "seq_len": 64, "global_batch": 4,
                               "steps": 3, "warmup": 1, "nproc_per_node": 2})
    exact = analytic.exact_state_bytes(ModelSpec.from_dict(spec["model"]), Layout.from_dict(spec["layout"]))
    ranks = [{"rank": r, "status": "ok", "state": exact, "exact_state": exact, "footprint_bytes": 0,
              "saved": {"mean_layer_bytes": 1000.0, "complete": True}, "loss": [5.5, 5.4, 5.3],
              "comm": {"all_reduce": {"calls": 2, "bytes": 300}, "broadcast": {"calls": 1, "bytes": 20}},
              "environment": {"world_size": 2, "backend": "gloo", "hostname": "h"}} for r in range(2)]
    write_json(tmp_path / "r.json", assemble_record(spec, ranks, timed_out=False, returncode=0, wall_s=1.0))
    df = aggregate([tmp_path / "r.json"])
    compared = [c for c in df.columns if c.endswith(("_pred", "_meas", "_rel_err"))]
    assert compared == [f"{m}_{k}" for m in METRICS for k in ("pred", "meas", "rel_err")] + ["comm_bytes_meas"]
    row = df.iloc[0]
    for m in METRICS:
        p, q = row[f"{m}_pred"], row[f"{m}_meas"]
        if pd.isna(p) or pd.isna(q):  # nothing measured (here: no FLOP counter in these ranks): no error
            assert pd.isna(row[f"{m}_rel_err"]), m
        else:
            assert row[f"{m}_rel_err"] == pytest.approx(p / q - 1.0), m
    assert row["saved_act_bytes_meas"] == 1000.0 and row["state_bytes_exact_rel_err"] == 0.0
    assert row["state_bytes_meas"] == row["state_bytes_exact_meas"] == sum(exact.values())
    assert row["loss_step0"] == row["loss0"] == 5.5 and row["comm_bytes_meas"] == 320
    assert rel_err(11, 10) == pytest.approx(0.1) and rel_err(9, 10) == pytest.approx(-0.1)  # over-prediction > 0
    assert rel_err(1, 0) is None and rel_err(None, 1) is None and rel_err(1, np.nan) is None


def test_scaling_fits_extrapolate_bytes_to_the_production_point():
    c = load_config(DEFAULT)
    doc = stage_fit_scaling(synthetic_records(c.model), c.model, c.cluster.n_gpus, {"bootstrap": 50, "seed": 0})
    fits = doc["fits"]
    assert {"depth: params", "width: params", "scale-out: state bytes/rank"} <= set(fits)
    d = fits["depth: params"]
    assert d["x_target"] == 40 and d["y_target"] == pytest.approx(d["analytic_target"], rel=1e-9)
    assert d["r2"] == pytest.approx(1.0) and d["n"] == 4
    w = fits["width: params"]
    # a·h² + b·h misses the FFN width's rounding to a multiple (SwiGLU 8/3·h): a few % at 20× the ladder
    assert w["x_target"] == 5120 and abs(w["rel_err_vs_analytic"]) < 0.05
    s = fits["scale-out: state bytes/rank"]
    assert s["x_target"] == 32 and s["y_target"] == pytest.approx(s["y"][0] / 32)
    assert "time" not in " ".join(fits) and "no timing is fitted" in doc["evidence"]
    kinds = {(r["fit"], r["kind"]) for r in doc["curves"]}
    assert ("depth: params", "measured") in kinds and ("depth: params", "fit") in kinds


def test_scaling_fits_say_why_they_were_skipped():
    c = load_config(DEFAULT)
    rec = synthetic_records(c.model)
    rec = rec[~((rec["family"] == "depth") & (rec["layers"] > 2))]
    doc = stage_fit_scaling(rec, c.model, c.cluster.n_gpus, {"bootstrap": 20})
    assert "depth: params" not in doc["fits"]
    assert "2 distinct layers values, need 3" in doc["skipped"]["depth: params"]


def test_cpu_records_never_calibrate_time():
    c = load_config(DEFAULT)
    doc, heldout = stage_calibrate(synthetic_records(c.model), c.efficiency, {"source": "auto"})
    h100 = Efficiency.for_gpu(c.cluster.gpu)
    assert doc["source"] == OPEN_SET and doc["efficiency"] == h100.to_dict() and doc["generation"] == "h100"
    assert set(heldout.columns) >= {"table", "metric", "n", "mape", "role"}
    roles = dict(zip(heldout["table"] + ":" + heldout["metric"], heldout["role"], strict=True))
    assert roles["torchtitan_h100:tokens_per_s_per_gpu"] == "fit"
    assert roles["megatron2021_t1:tflops_per_gpu"] == "other generation"
    # NeMo's TE FP8 tables: scored, never fitted (the memo's published-data check says so, as validate does)
    assert roles["nemo2407_h100:tokens_per_s_per_gpu"] == roles["nemo_longseq_h100:tflops_per_gpu"] == "never fitted"
    assert (heldout["mape"] < 1.0).all()  # fractions, not percent
    # the interval rests on the H100 leave-one-table-out errors, per family class
    assert len(doc["loo_relative_errors"]) >= 20 and doc["memory_relative_errors"]
    assert set(doc["heldout_errors_by_family"]) >= {"FSDP/ZeRO", "TP", "PP"}
    assert doc["heldout_coverage"]["measured"] >= 0.75
    assert doc["fits"]["gemm_eff_max"]["value"] == h100.gemm_eff_max
    a100, _ = stage_calibrate(synthetic_records(c.model), Efficiency(), {"source": "auto"})
    assert a100["efficiency"] == Efficiency().to_dict()


def test_overriding_a_fitted_efficiency_field_makes_the_source_defaults():
    doc, _ = stage_calibrate(pd.DataFrame(), Efficiency().replace(gemm_eff_max=0.6), {"source": "auto"})
    assert doc["source"] == "defaults" and doc["efficiency"]["gemm_eff_max"] == 0.6


def test_gpu_records_without_a_predictor_are_not_claimed_as_calibration():
    c = load_config(DEFAULT)
    rec = synthetic_records(c.model).assign(device="cuda:0")
    doc, _ = stage_calibrate(rec, Efficiency(), {"source": "auto"})
    assert doc["source"] == OPEN_SET and doc["notes"]


def chosen(p10: float, p50: float, p90: float) -> dict:
    return {"layout": "x", "tokens_per_s_per_gpu_p10": p10, "tokens_per_s_per_gpu_p50": p50,
            "tokens_per_s_per_gpu_p90": p90}


def test_cost_doc_has_the_memo_shape_and_overheads_add_up():
    c = load_config(DEFAULT)
    doc, inputs = stage_cost_and_risk({"chosen": chosen(4000, 5000, 5500), "source": OPEN_SET},
                                      n_params=13e9, n_gpus=32, total_tokens=10e9, d2h_Bps=50e9,
                                      cost_cfg=c.cost, targets=c.targets)
    for k in ("train_hours", "wallclock_hours", "gpu_hours", "dollars"):
        assert doc[k]["p10"] <= doc[k]["p50"] <= doc[k]["p90"]
    pt = doc["detail"]["point"]
    assert sum(doc["overheads_hours"].values()) == pytest.approx(pt["wall_h"] - pt["train_h"])
    assert doc["price_per_gpu_hour"] == {"default": 3.0, "low": 2.0, "high": 6.88}
    names = {t["name"]: t for t in doc["targets"]}
    assert set(names) == {"wall-clock", "cost", "tokens/s per GPU"}
    assert names["tokens/s per GPU"]["pass"] is (names["tokens/s per GPU"]["verdict"] == "pass")
    assert doc["ask"]["gpu_hours"] == doc["gpu_hours"]["p90"]
    # the risks table's chance of at least one interruption: Poisson with the expected count
    lam = doc["expected_interruptions"]
    assert lam > 0 and doc["p_any_interruption"] == pytest.approx(1 - np.exp(-lam)) and doc["p_any_interruption"] < lam
    assert doc["dollars_price_range"]["low"] < doc["dollars"]["p50"] < doc["dollars_price_range"]["high"]


def test_cost_without_a_feasible_layout_is_a_config_error():
    with pytest.raises(ConfigError, match="prediction.chosen"):
        stage_cost_and_risk({"chosen": None}, n_params=1e9, n_gpus=8, total_tokens=1e9, d2h_Bps=50e9,
                            cost_cfg={"price_per_gpu_hour_usd": 3.0}, targets={})


def test_sensitivity_reranks_layouts_and_flags_flips():
    c = load_config(TINY)
    sens = stage_sensitivity(chosen(900, 1000, 1100), model=c.model, cluster=c.cluster, training=c.training,
                             eff=c.efficiency, options=dict(c.search), inputs=CostInputs.from_config(c.cost),
                             inter_busbw_GBps=c.raw["cluster"]["inter_busbw_GBps"])
    assert {"parameter", "unit", "base_value", "low_value", "high_value", "metric", "metric_base", "metric_low",
            "metric_high", "changes_recommendation"} <= set(sens.columns)
    row = sens.set_index("parameter")
    assert not row.loc["price_per_gpu_hour_usd", "changes_recommendation"]  # price never re-ranks layouts
    assert row.loc["price_per_gpu_hour_usd", "metric_high"] > row.loc["price_per_gpu_hour_usd", "metric_low"]
    flips = sens["changes_recommendation"] == (
        (sens["layout_low"] != sens["layout_base"]) | (sens["layout_high"] != sens["layout_base"]))
    assert flips.all()


def test_analytic_then_launch_stages_write_real_outputs(tmp_path):
    c = load_config(TINY)
    out = {"candidates": tmp_path / "a/candidates.csv", "families": tmp_path / "a/families.csv",
           "summary": tmp_path / "a/summary.json"}
    analytic_model.run({}, out, config_slice(c.raw, "analytic_model"))
    summary = read_json(out["summary"])
    assert summary["layout"] and summary["model"]["n_params"] == c.model.n_params
    assert summary["flops_per_token"] > 0 and "status" in summary and summary["status"] == "ok"
    man = tmp_path / "launch/manifest.json"
    launch_artifacts.run({"summary": out["summary"]}, {"manifest": man}, config_slice(c.raw, "launch_artifacts"))
    doc = read_json(man)
    assert doc["layout"] == summary["layout"]
    assert all((man.parent / a["filename"]).exists() for a in doc["artifacts"])
    assert (man.parent / "manifest.json.provenance.json").exists()
    # the day-1 preflight reads this study's summary and its resolved config (it named results/analytic/summary.json
    # and config/config.yaml whatever the study: a variant's memo told the user to preflight the default's layout)
    cmd = shlex.split(next(d["command"] for d in doc["day1"] if d["check"] == "one-node preflight"))
    summary_arg, config_arg = cmd[cmd.index("--summary") + 1], cmd[cmd.index("--config") + 1]
    assert summary_arg == str(out["summary"]) and config_arg == str(man.parent / "study_config.yaml")
    cfg, model, cluster, training, layout = load_inputs(summary_arg, config_arg)
    assert layout.to_dict() == summary["layout"] and study_hash(cfg.raw) == study_hash(c.raw) and cfg.raw == c.raw


def test_sensitivity_shows_the_other_attention_kernel_on_hopper():
    """On H100/H200 with flash attention the tornado moves attention to the measured cuDNN rate (fa2 → cudnn): it
    can only speed the run up, so the cost at high is lower; off Hopper there is no such row."""
    c = load_config(TINY)
    kw = dict(model=c.model, training=c.training, eff=c.efficiency, options=dict(c.search),
              inputs=CostInputs.from_config(c.cost), inter_busbw_GBps=c.raw["cluster"]["inter_busbw_GBps"])
    assert c.cluster.gpu.generation == "h100" and c.training.attn_kernel == "fa2"
    row = stage_sensitivity(chosen(900, 1000, 1100), cluster=c.cluster, **kw).set_index("parameter")
    assert row.loc["attention_rate_x", "high_value"] == attention_kernel_rel("cudnn")
    assert row.loc["attention_rate_x", "metric_high"] < row.loc["attention_rate_x", "metric_base"]
    a100 = replace(c.cluster, gpu=resolve_gpu("a100-80gb"))
    assert "attention_rate_x" not in set(stage_sensitivity(chosen(900, 1000, 1100), cluster=a100, **kw)["parameter"])


def test_sensitivity_moves_memory_across_its_interval():
    """memory_x spans the chosen layout's memory p10/p50 … p90/p50; a factor under which nothing fits costs
    nothing (NaN, not the $10¹⁵ of a zero-throughput run) and flags a flip; no memory interval, no row."""
    c = load_config(TINY)
    kw = dict(model=c.model, cluster=c.cluster, training=c.training, eff=c.efficiency, options=dict(c.search),
              inputs=CostInputs.from_config(c.cost), inter_busbw_GBps=c.raw["cluster"]["inter_busbw_GBps"])
    mem = {"mem_total_gib_p10": 9.0, "mem_total_gib_p50": 10.0, "mem_total_gib_p90": 1e5}
    row = stage_sensitivity(chosen(900, 1000, 1100) | mem, **kw).set_index("parameter").loc["memory_x"]
    assert (row["low_value"], row["base_value"], row["high_value"]) == pytest.approx((0.9, 1.0, 1e4))
    assert row["unit"] == "× modelled peak memory"
    assert row["layout_high"] == "no feasible layout" and np.isnan(row["metric_high"])
    assert row["changes_recommendation"] and np.isfinite(row["metric_low"]) and np.isfinite(row["metric_base"])
    assert "memory_x" not in set(stage_sensitivity(chosen(900, 1000, 1100), **kw)["parameter"])
