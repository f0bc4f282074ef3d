"""Preflight: the depth slice of the chosen layout, judged against the analytic prediction."""

from __future__ import annotations

import copy
import json
from pathlib import Path

import pytest

from trainplan.calibration.gpu import check_gpu_records, load_gpu_records
from trainplan.io import read_json
from trainplan.launch import preflight as pf
from trainplan.model.arch import ModelSpec, resolve_model
from trainplan.model.base import ConfigError
from trainplan.model.hardware import GPUS, ClusterSpec
from trainplan.model.layout import Layout
from trainplan.model.training import TrainingSpec
from trainplan.proxy.torchrun import ALLOC_CONF, ALLOC_CONF_VARS

ROOT = Path(__file__).resolve().parents[3]

MODEL = resolve_model("llama2-13b")
CLUSTER = ClusterSpec(nodes=4, gpus_per_node=8, gpu="h100-sxm-80gb")
TRAINING = TrainingSpec(seq_len=4096, global_batch=256)
FSDP = Layout(dp=32, sharding="zero3", recompute="full", micro_batch=1)


# ------------------------------------------------------------------------------------------ the slice
@pytest.mark.parametrize("layout,world", [
    (FSDP, 8), (Layout(dp=16, tp=2, sp=True, sharding="hsdp", shard_group=8), 8),
    (Layout(dp=8, pp=4, sharding="zero1"), 8), (Layout(dp=16, cp=2, sharding="zero3"), 8), (FSDP, 2)])
def test_preflight_layout_fits_one_node_and_the_proxy_harness(layout, world):
    lay, notes = pf.preflight_layout(layout, world)
    assert lay.world_size == world and lay.pp == lay.cp == 1
    assert lay.sharding in ("none", "zero2", "zero3", "hsdp")
    assert lay.recompute == layout.recompute and lay.micro_batch == layout.micro_batch
    changed = (layout.pp > 1, layout.cp > 1, layout.sharding == "zero1", layout.sharding == "hsdp")
    assert len(notes) >= sum(changed)


def test_preflight_spec_is_a_valid_run_spec_at_production_width_on_cuda():
    from trainplan.proxy.schema import normalize_run_spec

    spec, _ = pf.preflight_spec(MODEL, CLUSTER, TRAINING, FSDP, device="cuda", layers=2)
    norm = normalize_run_spec(copy.deepcopy(spec))
    assert norm["model"]["hidden"] == MODEL.hidden and norm["model"]["ffn_hidden"] == MODEL.ffn_hidden
    assert norm["model"]["layers"] == 2 and norm["seq_len"] == TRAINING.seq_len
    assert norm["nproc_per_node"] == CLUSTER.gpus_per_node and norm["nnodes"] == 1
    assert norm["dtype"] == "bf16" and norm["family"] == "preflight"


def test_an_fp8_plan_is_preflighted_in_bf16_and_says_so():
    from dataclasses import replace

    spec, notes = pf.preflight_spec(MODEL, CLUSTER, replace(TRAINING, precision="fp8-tensorwise"), FSDP,
                                    device="cuda", layers=2)
    assert spec["dtype"] == "bf16" and any(n.startswith("fp8-tensorwise runs as bf16") for n in notes)
    assert pf.preflight_spec(MODEL, CLUSTER, TRAINING, FSDP, device="cuda")[0]["dtype"] == "bf16"
    assert pf.preflight_spec(MODEL, CLUSTER, replace(TRAINING, precision="fp32"), FSDP, device="cuda")[0]["dtype"] \
        == "fp32"


def test_preflight_spec_on_cpu_is_debug_size():
    from trainplan.proxy.schema import normalize_run_spec

    spec, notes = pf.preflight_spec(MODEL, CLUSTER, TRAINING, FSDP, device="cpu", layers=2)
    norm = normalize_run_spec(copy.deepcopy(spec))
    assert norm["model"]["hidden"] < 1024 and norm["nproc_per_node"] == 2 and norm["dtype"] == "fp32"
    assert any("not H100 speed" in n for n in notes)


def test_preflight_spec_rejects_bad_device_and_depth():
    with pytest.raises(ConfigError, match="device"):
        pf.preflight_spec(MODEL, CLUSTER, TRAINING, FSDP, device="tpu")
    with pytest.raises(ConfigError, match="layers"):
        pf.preflight_spec(MODEL, CLUSTER, TRAINING, FSDP, layers=0)


# -------------------------------------------------------------------------------------- evaluation
def record(device: str = "cpu", *, params=1000, grads=1000, optim=2000, act=500.0, status="ok",
           reserved=None, median=0.5) -> dict:
    spec, _ = pf.preflight_spec(MODEL, CLUSTER, TRAINING, FSDP, device=device, layers=2)
    state = {"params_bytes": params, "frozen_params_bytes": 0, "grads_bytes": grads, "optimizer_bytes": optim}
    return {"status": status, "message": "" if status == "ok" else "CUDA out of memory", "spec": spec,
            "timing": {"step_time_median_s": median},
            "memory": {"state_bytes_per_rank": [state, state], "saved_activations": {"mean_layer_bytes": act},
                       "cuda_max_reserved_bytes": reserved},
            "predicted": {"memory": {"breakdown_bytes": {"weights": 1000, "gradients": 1000, "optimizer": 2000},
                                     "activation_bytes_per_layer": 500.0}}}


def by_name(checks):
    return {c.name: c for c in checks}


def test_cpu_record_matching_prediction_passes_and_time_is_not_comparable():
    verdict, checks = pf.evaluate(record(), CLUSTER)
    assert verdict == "PASS"
    t = by_name(checks)["median step time s"]
    assert t.status == "NOT_COMPARABLE" and "not comparable on CPU" in t.note


@pytest.mark.parametrize("field,value,check", [("params", 1050, "weights bytes/rank"),
                                               ("optim", 1900, "optimizer bytes/rank"),
                                               ("act", 600.0, "saved activations bytes/layer")])
def test_measurement_outside_its_threshold_fails(field, value, check):
    verdict, checks = pf.evaluate(record(**{field: value}), CLUSTER)
    assert verdict == "FAIL" and by_name(checks)[check].status == "FAIL"


def test_measurement_inside_its_threshold_passes():
    verdict, _ = pf.evaluate(record(params=1015, act=540.0), CLUSTER)  # +1.5% < 2%, +8% < 10%
    assert verdict == "PASS"


def test_missing_prediction_fails_rather_than_passes():
    rec = record()
    del rec["predicted"]["memory"]["activation_bytes_per_layer"]
    verdict, checks = pf.evaluate(rec, CLUSTER)
    assert verdict == "FAIL" and by_name(checks)["saved activations bytes/layer"].status == "MISSING"


def test_oom_run_fails_with_its_message():
    verdict, checks = pf.evaluate(record(status="oom"), CLUSTER)
    assert verdict == "FAIL" and "out of memory" in checks[0].note


def test_cuda_record_is_judged_on_peak_memory_and_step_time():
    peak, time_s = pf._predicted_cuda(record("cuda"), CLUSTER, None)
    assert peak and time_s and peak > 0 and time_s > 0
    ok = record("cuda", reserved=int(peak * 1.05), median=time_s * 1.1)
    verdict, checks = pf.evaluate(ok, CLUSTER)
    c = by_name(checks)
    assert c["peak reserved bytes"].status == "PASS" and c["median step time s"].status == "PASS"
    slow = record("cuda", reserved=int(peak * 1.05), median=time_s * 1.5)
    assert by_name(pf.evaluate(slow, CLUSTER)[1])["median step time s"].status == "FAIL"
    big = record("cuda", reserved=int(CLUSTER.gpu.hbm_bytes * 0.95), median=time_s)
    assert by_name(pf.evaluate(big, CLUSTER)[1])["peak within headroom"].status == "FAIL"
    assert pf.evaluate(record("cuda", reserved=None), CLUSTER)[0] == "FAIL"


def test_headroom_is_judged_on_the_production_peak_at_the_slices_memory_error():
    """A 2-layer slice is far below any HBM limit; what it measures is the memory model's error. The production
    run's modelled peak × that error is held to the limit: 0.85 of HBM modelled and a slice 10% above its model
    is 0.935 of HBM, a FAIL at 90%, while the slice's own bytes pass."""
    peak, time_s = pf._predicted_cuda(record("cuda"), CLUSTER, None)
    prod = 0.85 * CLUSTER.gpu.hbm_bytes
    over = record("cuda", reserved=int(1.10 * peak), median=time_s)
    head = by_name(pf.evaluate(over, CLUSTER, production_peak=prod)[1])["peak within headroom"]
    assert head.status == "FAIL" and head.measured == pytest.approx(0.935 * CLUSTER.gpu.hbm_bytes, rel=1e-6)
    assert "production run's modelled peak" in head.note
    assert by_name(pf.evaluate(over, CLUSTER)[1])["peak within headroom"].status == "PASS"  # the slice alone
    exact = record("cuda", reserved=int(peak), median=time_s)
    assert by_name(pf.evaluate(exact, CLUSTER, production_peak=prod)[1])["peak within headroom"].status == "PASS"


def test_headroom_check_holds_the_studys_own_hbm_fraction():
    """The peak is judged against search.max_hbm_frac (the rule the search ranked by), not a fixed 90%."""
    _, time_s = pf._predicted_cuda(record("cuda"), CLUSTER, None)
    rec = record("cuda", reserved=int(CLUSTER.gpu.hbm_bytes * 0.85), median=time_s)
    assert by_name(pf.evaluate(rec, CLUSTER)[1])["peak within headroom"].status == "PASS"
    strict = by_name(pf.evaluate(rec, CLUSTER, max_hbm_frac=0.80)[1])["peak within headroom"]
    assert strict.status == "FAIL" and strict.predicted == pytest.approx(0.80 * CLUSTER.gpu.hbm_bytes)
    assert "80%" in strict.note


def test_report_prints_numbers_thresholds_and_verdict():
    verdict, checks = pf.evaluate(record(params=1050), CLUSTER)
    text = pf.format_report(verdict, checks, ["a note"])
    assert text.endswith("PREFLIGHT FAIL")
    assert "+5.0%" in text and "tol ±2%" in text and "note: a note" in text


# ------------------------------------------------------------------------------------ the real run
@pytest.mark.slow
@pytest.mark.timeout(300)
def test_cpu_preflight_runs_the_proxy_and_passes_against_the_analytic_prediction(tmp_path, monkeypatch):
    for var in ALLOC_CONF_VARS:  # the slice gets the production scripts' allocator setting, which its record names
        monkeypatch.delenv(var, raising=False)
    res = pf.run_preflight(MODEL, CLUSTER, TRAINING, FSDP, tmp_path, device="cpu", steps=3, warmup=1,
                           timeout_s=240)
    assert (tmp_path / "preflight_record.json").exists() and (tmp_path / "preflight.json").exists()
    checks = {c["name"]: c for c in res["checks"]}
    assert checks["weights bytes/rank"]["measured"] and checks["saved activations bytes/layer"]["measured"]
    assert checks["median step time s"]["status"] == "NOT_COMPARABLE"
    assert res["verdict"] == "PASS", res["checks"]
    rec = json.loads((tmp_path / "preflight_record.json").read_text())
    assert rec["environment"]["alloc_conf"] == ALLOC_CONF
    assert f"CUDA allocator settings: {ALLOC_CONF} (as the launch scripts)" in res["notes"]


def test_main_bad_summary_is_a_config_error(tmp_path, capsys):
    rc = pf.main(["--summary", str(tmp_path / "none.json"), "--config", "config/config.yaml",
                  "--out", str(tmp_path / "o")])
    err = capsys.readouterr().err
    assert rc == 2 and f"summary='{tmp_path / 'none.json'}': no such file" in err


@pytest.mark.parametrize(("flags", "says"), [
    (["--steps", "2", "--warmup", "5"], "--warmup=5: fewer than --steps=2"),
    (["--timeout-s", "-1"], "--timeout-s=-1: an integer ≥ 1"),
    (["--nproc", "0"], "--nproc=0: an integer ≥ 1"),
    (["--layers", "100"], "--layers=100: at most the model's 40 layers"),
])
def test_bad_run_flags_are_bad_input_before_anything_runs(tmp_path, capsys, flags, says):
    """A typo in the slice's flags exits 2 naming the flag; no proxy runs and no FAIL verdict is written."""
    summary = tmp_path / "summary.json"
    summary.write_text(json.dumps({"layout": FSDP.to_dict()}))
    rc = pf.main(["--summary", str(summary), "--config", "config/config.yaml", "--out", str(tmp_path / "o"), *flags])
    assert rc == 2 and says in capsys.readouterr().err and not (tmp_path / "o").exists()


def test_out_that_is_a_file_is_bad_input(tmp_path, capsys):
    summary, out = tmp_path / "summary.json", tmp_path / "afile"
    summary.write_text(json.dumps({"layout": FSDP.to_dict()}))
    out.write_text("x")
    rc = pf.main(["--summary", str(summary), "--config", "config/config.yaml", "--out", str(out)])
    assert rc == 2 and "--out=" in capsys.readouterr().err and out.read_text() == "x"


# ------------------------------------------------ agreement with the proxy comparison, every sharding
PRODUCTION = {
    "none": (Layout(dp=32, sharding="none"), None),
    "zero1": (Layout(dp=32, sharding="zero1"), None),
    "zero2": (Layout(dp=32, sharding="zero2"), None),  # the default study's recommendation
    "zero3": (FSDP, None),
    "hsdp": (Layout(dp=32, sharding="hsdp", shard_group=8), None),  # on 2 ranks: zero3 (noted)
    "hsdp-kept": (Layout(dp=32, sharding="hsdp", shard_group=2), 4),  # 4 ranks: HSDP 2×2 as proxied
}


def _harness_record(layout: Layout, nproc: int | None) -> dict:
    """A RECORD as ``proxy.record.assemble_record`` builds it, with per-rank state equal to the harness's exact
    closed form (``analytic.exact_state_bytes``; tests/integration/test_proxy_dist.py shows the real ranks measure exactly
    that for DDP, FSDP2, FSDP2 without reshard and HSDP) and saved activations equal to the analytic term."""
    from trainplan.proxy import analytic
    from trainplan.proxy.record import assemble_record
    from trainplan.proxy.schema import normalize_run_spec

    spec, _ = pf.preflight_spec(MODEL, CLUSTER, TRAINING, layout, device="cpu", nproc=nproc)
    spec = normalize_run_spec(spec)
    m, lay = ModelSpec.from_dict(spec["model"]), Layout.from_dict(spec["layout"])
    exact = analytic.exact_state_bytes(m, lay)
    act = analytic.analytic_memory(m, lay, spec["seq_len"], spec["global_batch"], "fp32", "full", 8, ["q", "v"],
                                  "cpu")["activation_bytes_per_layer"]
    ranks = [{"rank": r, "status": "ok", "state": exact, "exact_state": exact, "footprint_bytes": 0,
              "saved": {"mean_layer_bytes": act, "complete": True}, "loss": [5.0]}
             for r in range(spec["nproc_per_node"])]
    return assemble_record(spec, ranks, timed_out=False, returncode=0, wall_s=1.0)


@pytest.mark.parametrize("name", list(PRODUCTION))
def test_preflight_agrees_with_the_proxy_comparison_for_every_sharding(name):
    """What the harness measures passes the preflight, and the preflight's predicted state is the one
    ``aggregate`` compares the proxies with (ZeRO-2: sharded at rest, as FSDP2 holds it between steps)."""
    from trainplan.proxy.aggregate import record_row

    layout, nproc = PRODUCTION[name]
    rec = _harness_record(layout, nproc)
    verdict, checks = pf.evaluate(rec, CLUSTER)
    state = {c.name.split()[0]: c for c in checks if c.name.endswith("bytes/rank")}
    assert verdict == "PASS", pf.format_report(verdict, checks)
    assert {k: c.status for k, c in state.items()} == {"weights": "PASS", "gradients": "PASS", "optimizer": "PASS"}
    row = record_row(rec)
    assert sum(c.predicted for c in state.values()) == pytest.approx(row["state_bytes_pred"], rel=1e-12)
    assert row["state_bytes_rel_err"] == pytest.approx(0.0, abs=STATE_TOL)
    if name == "hsdp-kept":
        assert rec["spec"]["layout"]["sharding"] == "hsdp"


STATE_TOL = pf.STATE_REL_TOL


def test_zero2_weights_are_judged_sharded_at_rest_not_at_the_peak():
    rec = _harness_record(PRODUCTION["zero2"][0], None)
    bd = rec["predicted"]["memory"]["breakdown_bytes"]
    weights = by_name(pf.evaluate(rec, CLUSTER)[1])["weights bytes/rank"]
    assert weights.status == "PASS" and "at rest" in weights.note
    assert weights.predicted == pytest.approx(bd["weights"] / 2)  # ZeRO-2's peak holds the full weights


def test_record_without_at_rest_terms_falls_back_to_the_breakdown():
    _, checks = pf.evaluate(record(), CLUSTER)
    assert "memory_breakdown" in by_name(checks)["weights bytes/rank"].note


# -------------------------------------------------------------------------------------- the fallback
def _candidates(tmp_path):
    import pandas as pd

    df = pd.DataFrame([
        {"rank": 1, "feasible": True, "layout_text": "dp32 zero2", "tokens_per_s": 100.0,
         "tokens_per_s_per_gpu": 3.1, "mem_total_gib": 60.0, "headroom_frac": 0.2},
        {"rank": 2, "feasible": True, "layout_text": "dp32 zero3", "tokens_per_s": 95.0,
         "tokens_per_s_per_gpu": 3.0, "mem_total_gib": 30.0, "headroom_frac": 0.6},
        {"rank": 3, "feasible": False, "layout_text": "dp32 none", "tokens_per_s": 120.0,
         "tokens_per_s_per_gpu": 3.7, "mem_total_gib": 120.0, "headroom_frac": -0.5}])
    path = tmp_path / "analytic" / "candidates.csv"
    path.parent.mkdir(parents=True)
    df.to_csv(path, index=False)
    return path


def test_fallback_is_the_memos_memory_fallback(tmp_path):
    fb = pf.preflight_fallback(_candidates(tmp_path))
    assert fb["layout"] == "dp32 zero3" and fb["slower_frac"] == pytest.approx(0.05)
    line = pf.fallback_line(fb)
    assert "switch to dp32 zero3" in line and "rerun the preflight" in line and "no-go, re-plan" in line
    assert pf.preflight_fallback(tmp_path / "missing.csv") is None
    assert "no-go, re-plan" in pf.fallback_line(None)


def test_a_measured_memory_error_picks_what_fits_at_that_error(tmp_path):
    """A CUDA slice that reserved 1.3× its modelled peak: the fallback is the fastest other layout whose modelled
    peak × 1.3 is within 90% of usable HBM (the search's choice had it known the error), not the fixed margin."""
    import pandas as pd

    hbm = 80.0
    rows = [("dp32 zero2 mb2", 100.0, 66.0), ("dp32 zero2 mb1", 98.0, 56.0), ("dp32 zero3 mb1", 90.0, 40.0),
            ("dp32 zero3 rc=full", 70.0, 20.0)]
    path = tmp_path / "candidates.csv"
    pd.DataFrame([{"rank": i + 1, "feasible": True, "layout_text": t, "tokens_per_s": tps, "tokens_per_s_per_gpu": tps,
                   "mem_total_gib": m, "headroom_frac": 1 - m / hbm} for i, (t, tps, m) in enumerate(rows)]
                 ).to_csv(path, index=False)
    assert pf.preflight_fallback(path)["layout"] == "dp32 zero3 mb1"  # fixed margin: 0.175 + 0.15 headroom
    fb = pf.preflight_fallback(path, mem_ratio=1.2)  # 56 × 1.2 = 67.2 ≤ 72: the micro-batch 1 layout still fits
    assert fb["layout"] == "dp32 zero2 mb1" and fb["mem_expected_gib"] == pytest.approx(67.2)
    assert fb["slower_frac"] == pytest.approx(0.02)
    line = pf.fallback_line(fb)
    assert "reserved 1.20× its modelled peak" in line and "dp32 zero2 mb1 (56.0 GiB modelled, 67.2 GiB at ×1.20" in line
    assert pf.preflight_fallback(path, mem_ratio=1.5)["layout"] == "dp32 zero3 mb1"  # 56 × 1.5 = 84 > 72
    assert pf.preflight_fallback(path, mem_ratio=5.0) is None  # nothing fits: no-go, re-plan
    assert pf.preflight_fallback(path, mem_ratio=0.9) == pf.preflight_fallback(path)  # no excess: the fixed margin
    # a study that ranks at 80% of HBM re-plans at 80% too: 56 × 1.2 = 67.2 > 64, so the next layout that fits
    tight = pf.preflight_fallback(path, mem_ratio=1.2, max_hbm_frac=0.80)
    assert tight["layout"] == "dp32 zero3 mb1" and "within 80% of usable HBM" in pf.fallback_line(tight)


def test_memory_error_ratio_reads_the_cuda_peak_check():
    peak, time_s = pf._predicted_cuda(record("cuda"), CLUSTER, None)
    _, checks = pf.evaluate(record("cuda", reserved=int(1.3 * peak), median=time_s), CLUSTER)
    assert pf.memory_error_ratio(checks) == pytest.approx(1.3, rel=1e-6)
    assert pf.memory_error_ratio(pf.evaluate(record(), CLUSTER)[1]) is None  # CPU: no reserved memory


def test_failing_preflight_names_the_fallback(tmp_path, monkeypatch, capsys):
    cand = _candidates(tmp_path)
    summary = cand.parent / "summary.json"
    summary.write_text('{"layout": {"dp": 32, "sharding": "zero2"}}')
    verdict, checks = pf.evaluate(record(params=1200), CLUSTER)
    from dataclasses import asdict

    fake = {"verdict": verdict, "notes": [], "checks": [asdict(c) | {"rel_err": c.rel_err} for c in checks]}
    seen = {}

    def fake_run(*a, **kw):
        seen["out"] = a[4]
        return fake

    monkeypatch.setattr(pf, "run_preflight", fake_run)
    rc = pf.main(["--summary", str(summary), "--config", "config/config.yaml"])
    out = capsys.readouterr().out
    assert rc == 1 and "PREFLIGHT FAIL" in out and "FALLBACK: switch to dp32 zero3" in out
    assert seen["out"] == tmp_path / "preflight"  # default --out: results/preflight beside analytic/
    assert read_json(tmp_path / "preflight" / "preflight.json")["fallback"]["layout"] == "dp32 zero3"


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_default_study_recommendation_passes_its_own_preflight(tmp_path, capsys):
    """The issue's command on the default study: the analytic stage picks the layout, the CPU slice runs."""
    from trainplan.config import config_slice, load_config
    from trainplan.stages import analytic_model

    a = tmp_path / "analytic"
    analytic_model.run({}, {k: str(a / f"{k}.csv") for k in ("candidates", "families", "techniques")}
                              | {"summary": str(a / "summary.json")},
                              config_slice(load_config("config/config.yaml").raw, "analytic_model"))
    rc = pf.main(["--summary", str(a / "summary.json"), "--config", "config/config.yaml", "--steps", "3",
                  "--warmup", "1", "--timeout-s", "240"])
    out = capsys.readouterr().out
    assert rc == 0 and out.rstrip().endswith("PREFLIGHT PASS"), out
    assert read_json(tmp_path / "preflight" / "preflight.json")["verdict"] == "PASS"


def test_cuda_preflight_reports_the_attention_kernel_the_run_dispatched():
    """Read off the run's FLOP counter: cuDNN where the plan assumed FA2 is reported with the measured ratio, not
    judged (the verdict is the other checks'); the step-time prediction uses the kernel the run dispatched."""
    peak, time_fa2 = pf._predicted_cuda(record("cuda"), CLUSTER, None)
    rec = record("cuda", reserved=int(peak), median=time_fa2)
    rec["flops"] = {"by_op": {"aten._scaled_dot_product_cudnn_attention.default": 1.0, "aten.mm.default": 2.0}}
    verdict, checks = pf.evaluate(rec, CLUSTER, planned_attn_kernel="fa2")
    c = by_name(checks)["attention kernel"]
    assert c.status == "NOT_COMPARABLE" and "dispatched cudnn; the plan assumed training.attn_kernel: fa2" in c.note
    assert "1.70x" in c.note
    assert pf._predicted_cuda(rec, CLUSTER, None)[1] < time_fa2  # cuDNN attention: a faster predicted step
    same = by_name(pf.evaluate(rec, CLUSTER, planned_attn_kernel="cudnn")[1])["attention kernel"]
    assert same.status == "NOT_COMPARABLE" and "as planned" in same.note
    assert by_name(pf.evaluate(record("cuda", reserved=int(peak)), CLUSTER)[1])["attention kernel"].note.startswith(
        "no flash SDPA op")


def test_cuda_preflight_predicts_a_harness_run_as_the_gpu_check_does():
    """The committed H200 depth-L2 record (one GPU, bf16 by autocast, cuDNN attention) predicted by the preflight's
    own path equals the GPU check's prediction (calibration.gpu.record_specs): one convention for harness runs."""
    h200 = Path(__file__).resolve().parents[3] / "data" / "calibration" / "h200-2026-12-04"
    rec = read_json(h200 / "depth-L2.json")
    node = ClusterSpec(nodes=1, gpus_per_node=1, gpu=GPUS["h200-141gb"])
    peak, time_s = pf._predicted_cuda(rec, node, None)
    checked = check_gpu_records(load_gpu_records(h200)[0]).set_index("id").loc["depth-L2"]
    assert time_s == pytest.approx(checked["step_time_predicted_s"], rel=1e-12)
    assert checked["regime"] == "autocast" and checked["attn_kernel"] == "cudnn"


def test_a_lora_plan_preflights_its_own_adapters_and_is_predicted_as_lora():
    """A LoRA plan's slice runs the plan's rank and targets (not the harness's default r = 8 on q, v), and its CUDA
    record is predicted as that LoRA run: no base-weight gradients or optimizer states, less time than a full
    fine-tune of the same slice."""
    from trainplan.proxy.schema import normalize_run_spec

    lora = TrainingSpec(seq_len=4096, global_batch=256, finetune="lora", lora_rank=32, lora_targets=("q", "k", "v", "o"))
    spec, notes = pf.preflight_spec(MODEL, CLUSTER, lora, FSDP, device="cuda", layers=2)
    norm = normalize_run_spec(copy.deepcopy(spec))
    assert (norm["finetune"], norm["lora_rank"], norm["lora_targets"]) == ("lora", 32, ["q", "k", "v", "o"])
    qlora = TrainingSpec(seq_len=4096, global_batch=256, finetune="qlora", lora_rank=16)
    spec_q, notes_q = pf.preflight_spec(MODEL, CLUSTER, qlora, FSDP, device="cuda", layers=2)
    assert spec_q["finetune"] == "lora" and any("QLoRA runs as LoRA" in n for n in notes_q)

    h200 = Path(__file__).resolve().parents[3] / "data" / "calibration" / "h200-2026-12-04"
    rec = read_json(h200 / "depth-L2.json")
    node = ClusterSpec(nodes=1, gpus_per_node=1, gpu=GPUS["h200-141gb"])
    full_peak, full_time = pf._predicted_cuda(rec, node, None)
    as_lora = copy.deepcopy(rec)
    as_lora["spec"].update(finetune="lora", lora_rank=32, lora_targets=["q", "k", "v", "o"])
    peak, time_s = pf._predicted_cuda(as_lora, node, None)
    assert peak < full_peak and time_s < full_time
    r8 = copy.deepcopy(as_lora)
    r8["spec"].update(lora_rank=8)
    assert pf._predicted_cuda(r8, node, None)[0] < peak  # the rank enters the prediction


def test_the_fallback_says_how_to_switch_with_an_overlay_the_study_accepts():
    """The preflight said "switch to <layout>" with no way to do it but retyping the layout string into a config.
    Its fallback now carries the overlay that pins the layout, every field written out; loaded over the default
    config it plans exactly that layout."""
    import pandas as pd
    import yaml

    from trainplan.config import load_config, read_yaml
    from trainplan.report import memo

    cand = pd.read_csv(ROOT / "tests/fixtures/results_min/analytic/candidates.csv", low_memory=False)
    ok = cand[cand["feasible"].astype(bool)].sort_values("rank")
    row = ok[ok["sharding"] != ok["sharding"].iloc[0]].iloc[0]  # another sharding than the chosen one
    fb = memo.fallback_entry(row, ok.iloc[0])
    line = pf.fallback_line(fb)
    assert f"To switch: put `{fb['pin']}` in a config overlay" in line
    raw = read_yaml(ROOT / "config/config.yaml")
    raw["layout"] = yaml.safe_load(fb["pin"])["layout"]
    assert load_config(raw).layout.describe() == row["layout_text"]
    assert "pin" not in memo.fallback_entry(pd.Series({k: row[k] for k in ("layout_text", "tokens_per_s",
                                            "tokens_per_s_per_gpu", "mem_total_gib", "headroom_frac")}), ok.iloc[0])


@pytest.mark.parametrize(("overlay", "err", "switch"), [("config.yaml", 1.19, "dp16·tp2(sp)·pp1·cp1 zero2 rc=none mb=2"),
                                                         ("fp8.yaml", 1.12, "dp32·tp1·pp1·cp1 zero2 rc=none mb=1")])
def test_a_switch_that_is_check_2s_runner_up_names_what_check_2_measures_instead(tmp_path, overlay, err, switch,
                                                                                study):
    """In the default study (FSDP dp32 mb1) the switch at a measured ×1.19 is ZeRO-2×TP dp16·tp2 mb2, also the
    runner-up that page 1's check 2 measures when the first 50 steps run slow: after the switch there is nothing left
    for check 2 to measure. The
    memo names the next strategy at its p90 error (memo.switch_runner_up); the preflight, which measured the error,
    names it at that error, from the same rule (search.layouts.runner_up_row, the runner-up page 1 and the
    comparable-runs table name), and says so in its FALLBACK line. At an error where the switch is another layout
    than the runner-up, it says nothing of the kind. In the FP8 study the TP layouts run in bf16 under torchtitan:
    the runner-up from candidates.csv is the one page 1 names from families.csv (both on the launched speeds). It
    chooses FSDP mb2 (compile keeps no SiLU output), whose runner-up ZeRO-2 mb1 is the switch at ×1.12; at ×1.19
    the switch is FSDP mb1, not the runner-up."""
    from trainplan.launch.artifacts import launch_judge
    from trainplan.report import memo
    from trainplan.search.layouts import family_verdicts, runner_up_row

    cfg, df = study(overlay)
    m, c, t, eff = cfg.model, cfg.cluster, cfg.training, cfg.efficiency
    ok = df[df["feasible"]]
    path = tmp_path / "candidates.csv"
    ok.to_csv(path, index=False)
    judge = launch_judge(m, c, t, eff)
    fb = pf.preflight_fallback(path, mem_ratio=err, judge=judge)
    assert fb["layout"] == switch == runner_up_row(ok)["layout_text"]
    page1 = memo.runner_up(family_verdicts(df), {"tokens_per_s_per_gpu_p50": 1.0, "tokens_per_s_per_gpu_p10": 1.0})
    assert page1["layout"] == fb["layout"]
    assert fb["switch_is_runner_up"]
    two = memo.switch_runner_up(ok, ok.iloc[0].to_dict(), fb, judge)
    assert fb["second"]["layout"] == two["layout"] and fb["second"]["slower_frac"] == pytest.approx(two["slower_frac"])
    line = pf.fallback_line(fb)
    assert (f"This switch is the runner-up that day-1 check 2 would measure: after it, if the first 50 steps run below "
            f"its p10, measure {two['layout']} instead ({abs(two['slower_frac']):.1%} ") in line
    assert f"the next strategy that fits at ×{err:.2f}) and keep the faster." in line
    others = [pf.preflight_fallback(path, mem_ratio=r, judge=judge) for r in (1.0001, 1.6, 2.0)]
    others = [o for o in others if o and o["layout"] != fb["layout"]]  # another switch: no word of check 2
    assert others and all("switch_is_runner_up" not in o and "check 2" not in pf.fallback_line(o) for o in others)
