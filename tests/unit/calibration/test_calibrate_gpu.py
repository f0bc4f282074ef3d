"""GPU-proxy calibration on SYNTHETIC CUDA records generated in this file from the analytic model.

The fixture below is not a measurement: each record's step times are ``timing.step_time`` under a known
``TRUE`` Efficiency times log-normal noise, and its max reserved bytes follow ``memory.reserved_bytes`` under
``TRUE``. The tests check that the fit recovers ``TRUE`` and that the production interval covers the truth.
"""

from __future__ import annotations

import json
import subprocess
from dataclasses import replace
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from trainplan.calibration.gpu import (
    TIME_PARAMS,
    analytic_record,
    calibrate_gpu,
    fit_gpu_memory,
    fit_gpu_time,
    gpu_for_device,
    gpu_records,
    load_gpu_records,
    memory_skip_reason,
    record_specs,
    time_params,
)
from trainplan.calibration.sources import OPEN_SET, stage_calibrate
from trainplan.model.arch import resolve_model
from trainplan.model.efficiency import Efficiency
from trainplan.model.hardware import ClusterSpec, resolve_gpu
from trainplan.model.layout import Layout
from trainplan.model.memory import memory_breakdown
from trainplan.model.timing import step_time
from trainplan.model.training import TrainingSpec
from trainplan.prediction.production import predict_production
from trainplan.proxy.aggregate import record_row
from trainplan.proxy.schema import RUN_DEFAULTS

ROOT = Path(__file__).resolve().parents[3]
TRUE = Efficiency().replace(gemm_eff_max=0.70, attn_eff=0.38, membound_eff=0.45, alloc_frag_frac=0.07)
NOISE = 0.02  # log-normal sigma of one step time
GPU = "NVIDIA H100 80GB HBM3"


def synthetic_record(id_: str, family: str, model, layout: Layout, *, seq: int = 4096, gb: int = 8,
                     rng: np.random.Generator, gpu: str = GPU) -> dict:
    """A records.csv row as proxy.aggregate writes it, with times and memory generated from TRUE."""
    r = {"id": id_, "family": family, "device": "cuda", "status": "ok", "model": model.name, "layers": model.layers,
         "hidden": model.hidden, "model_json": json.dumps(model.to_dict()), "layout_json": json.dumps(layout.to_dict()),
         "seq_len": seq, "global_batch": gb, "micro_batch": layout.micro_batch, "dp": layout.dp, "tp": layout.tp,
         "sharding": layout.sharding, "dtype": "bf16", "finetune": "full", "world_size": layout.world_size,
         "nnodes": 1, "gpu_name": gpu}
    t, _ = analytic_record(r, TRUE)
    steps = t * np.exp(rng.normal(0.0, NOISE, 12))
    bd = memory_breakdown(*record_specs(r)[:4], TRUE)
    return r | {"step_time_median_s": float(np.median(steps)), "step_times_json": json.dumps(steps.tolist()),
                "cuda_max_reserved_bytes": float(bd["total"]) - TRUE.runtime_overhead_bytes}


def synthetic_gpu_records(seed: int = 1, gpu: str = GPU) -> pd.DataFrame:
    """What scripts/device_proxies.sh runs on one GPU: depth slice, width ladder, sequence ladder."""
    rng = np.random.default_rng(seed)
    m, one = resolve_model("llama2-13b"), Layout(dp=1, sharding="none")
    rows = [synthetic_record(f"depth-L{L}", "depth", m.with_layers(L), one, rng=rng, gpu=gpu) for L in (1, 2, 3, 4)]
    rows += [synthetic_record(f"width-h{h}", "width", replace(m, hidden=h, layers=2, name=f"h{h}"), one, rng=rng, gpu=gpu)
             for h in (1280, 2560, 3840)]
    rows += [synthetic_record(f"seq-s{s}", "layout", replace(m, layers=2, max_seq_len=max(s, 4096)), one, seq=s,
                              gb=max(1, 8 * 4096 // s), rng=rng, gpu=gpu) for s in (1024, 2048, 8192, 16384)]
    return pd.DataFrame(rows)


def test_device_names_map_to_gpu_specs_and_unknown_falls_back_with_a_note():
    assert gpu_for_device("NVIDIA H100 80GB HBM3") == ("h100-sxm-80gb", "")
    assert gpu_for_device("NVIDIA H200") == ("h200-141gb", "")
    assert gpu_for_device("NVIDIA H100 PCIe")[0] == "h100-pcie-80gb"
    assert gpu_for_device("NVIDIA A100-SXM4-80GB") == ("a100-80gb", "")
    key, note = gpu_for_device("NVIDIA L4")
    assert key == "h100-sxm-80gb" and "unknown GPU" in note and "L4" in note


def test_analytic_record_rebuilds_the_run_and_matches_the_analytic_model():
    rec = synthetic_gpu_records().iloc[0]  # depth-L1
    m, c, t, lay, notes = record_specs(rec)
    assert (m.layers, m.hidden, m.ffn_hidden, c.n_gpus, c.gpu.name) == (1, 5120, 13824, 1, "h100-sxm-80gb")
    assert (t.seq_len, t.global_batch, t.precision, t.sac_policy) == (4096, 8, "bf16", "matmul") and not notes
    st, peak = analytic_record(rec, TRUE)
    assert st == step_time(m, c, t, lay, TRUE)["step_time_s"] > 0
    assert peak == memory_breakdown(m, c, t, lay, TRUE)["total"]
    slower = analytic_record(rec, TRUE.replace(gemm_eff_max=0.35))[0]
    # GEMM-bound: halving GEMM efficiency raises the step by over 40% (the rest: attention, elementwise ops and the
    # harness's autocast weight casts, which one rank in bf16 runs)
    assert t.bf16_via == "autocast" and slower > 1.4 * st


def test_fit_recovers_the_known_efficiency_from_noisy_synthetic_records():
    doc, why = calibrate_gpu(synthetic_gpu_records(), Efficiency(), {"bootstrap": 100, "seed": 0})
    assert doc is not None, why
    e = doc["efficiency"]
    assert doc["params"] == ["gemm_eff_max", "attn_eff", "membound_eff"]  # no scale-out ladder: no comm_bw_eff
    assert e.gemm_eff_max == pytest.approx(TRUE.gemm_eff_max, rel=0.05)
    assert e.attn_eff == pytest.approx(TRUE.attn_eff, rel=0.10)
    assert e.membound_eff == pytest.approx(TRUE.membound_eff, rel=0.10)
    assert e.alloc_frag_frac == pytest.approx(TRUE.alloc_frag_frac, abs=0.01)
    assert e.comm_bw_eff == Efficiency().comm_bw_eff  # untouched prior
    # defaults differ from TRUE, so recovering TRUE is not "keeping the start"
    assert abs(Efficiency().gemm_eff_max - TRUE.gemm_eff_max) > 0.05
    assert len(doc["throughput_rel_errors"]) == len(doc["per_record"]) == 11
    assert max(abs(x) for x in doc["throughput_rel_errors"]) < 5 * NOISE  # LOO error at the noise level
    s = pd.DataFrame(doc["samples"])
    assert len(s) == 100 and doc["bootstrap"] == "per-record timed step times"
    assert s["gemm_eff_max"].quantile(0.02) < TRUE.gemm_eff_max < s["gemm_eff_max"].quantile(0.98)
    assert "runtime_overhead_bytes" in " ".join(doc["notes"])  # not observable without nvidia-smi samples


def test_comm_bw_eff_is_fitted_only_with_a_scaleout_ladder_of_several_gpu_counts():
    rec = synthetic_gpu_records()
    assert "comm_bw_eff" not in time_params(rec)
    ladder = pd.DataFrame({"family": ["scaleout", "scaleout"], "world_size": [1, 4]})
    assert time_params(pd.concat([rec, ladder]))[-1] == "comm_bw_eff"
    assert "comm_bw_eff" not in time_params(pd.concat([rec, ladder.assign(world_size=1)]))


def test_three_records_with_reserved_bytes_skip_the_memory_fit_with_a_reason_instead_of_crashing():
    # 2 memory parameters: leave-one-out needs 4 records; with 3 the LOO residuals were empty and the
    # relative errors raised "operands could not be broadcast together with shapes (0,) (3,)"
    rec = synthetic_gpu_records()
    three, four = rec.iloc[[0, 4, 5]].reset_index(drop=True), rec.iloc[[0, 4, 5, 6]].reset_index(drop=True)
    assert fit_gpu_memory(three, TRUE) is None
    assert "3 CUDA records with max reserved bytes (need 4" in memory_skip_reason(three)
    doc, why = calibrate_gpu(three, Efficiency(), {"bootstrap": 10, "seed": 0})
    assert why == "" and doc["memory"] is None and doc["memory_params"] == []
    assert any("3 CUDA records with max reserved bytes" in n for n in doc["notes"])
    mem = fit_gpu_memory(four, TRUE)
    assert mem is not None and len(mem["reserved_rel_errors"]) == 4
    assert abs(mem["alloc_frag_frac"] - TRUE.alloc_frag_frac) < 0.01


def test_stage_picks_gpu_proxies_and_the_production_interval_covers_the_truth():
    from trainplan.published.fit import FIT_PARAMS

    rec = synthetic_gpu_records()
    cpu = pd.DataFrame([{"id": "depth-L1-cpu", "family": "depth", "device": "cpu", "status": "ok",
                         "step_time_median_s": 123.0}])  # a CPU time that must not enter the fit
    doc, heldout = stage_calibrate(pd.concat([rec, cpu], ignore_index=True), Efficiency(),
                                   {"source": "auto", "bootstrap": 100, "seed": 0, "gpu_records_dir": None})
    assert doc["source"] == "gpu-proxies" and doc["source_detail"].startswith(f"gpu-proxies (device: {GPU}")
    assert doc["gpu"]["n"] == 11 and (heldout["role"] == "held out").all()
    assert doc["efficiency_sources"]["gemm_eff_max"] == doc["source_detail"]
    # comm_bw_eff is not a GPU-proxy parameter (no scale-out ladder): it keeps the open-set fit of the class defaults'
    # generation (A100 fits it, published.fit.GEN_FIT), never the GPU fit's label
    assert doc["efficiency_sources"]["comm_bw_eff"] == OPEN_SET
    assert set(FIT_PARAMS) - set(doc["gpu"]["params"]) <= {"gemm_eff_half_dim", "comm_bw_eff"}
    assert doc["efficiency_sources"]["gemm_eff_half_dim"] == OPEN_SET
    assert doc["fits"]["gemm_eff_max"]["fitted_on"] == doc["source_detail"]

    model = resolve_model("llama2-13b")
    cluster = ClusterSpec(nodes=4, gpus_per_node=8, gpu=resolve_gpu("h100-sxm-80gb"))
    training = TrainingSpec(seq_len=4096, global_batch=256)
    layout = Layout(dp=32, sharding="zero3", recompute="selective", micro_batch=2)
    cand = pd.DataFrame([{**layout.to_dict(), "feasible": True, "rank": 1}])
    prod = predict_production(cand, model, cluster, training, doc, quantiles=(0.1, 0.9)).iloc[0]
    truth = step_time(model, cluster, training, layout, TRUE)["tokens_per_s_per_gpu"]
    assert prod["calibration_source"] == "gpu-proxies"
    assert prod["tokens_per_s_per_gpu_p10"] <= truth <= prod["tokens_per_s_per_gpu_p90"]
    # and the uncalibrated defaults would have missed it: the interval is informative, not just wide
    default = step_time(model, cluster, training, layout, Efficiency())["tokens_per_s_per_gpu"]
    assert not prod["tokens_per_s_per_gpu_p10"] <= default <= prod["tokens_per_s_per_gpu_p90"]


def test_only_cpu_records_keep_the_published_open_set(tmp_path):
    cpu = pd.DataFrame([{"id": f"depth-L{L}", "family": "depth", "device": "cpu", "status": "ok", "layers": L,
                         "step_time_median_s": 0.1 * L} for L in (1, 2, 3)])
    doc, _ = stage_calibrate(cpu, Efficiency(), {"source": "auto", "gpu_records_dir": str(tmp_path / "none")})
    assert doc["source"] == OPEN_SET and "gpu" not in doc and doc["efficiency"] == Efficiency().to_dict()


def test_gpu_records_that_cannot_be_rebuilt_fall_back_with_a_reason():
    rec = synthetic_gpu_records().drop(columns=["model_json"])  # and no heads column
    doc, _ = stage_calibrate(rec, Efficiency(), {"source": "auto", "gpu_records_dir": None})
    assert doc["source"] == OPEN_SET and "records.heads" in " ".join(doc["notes"])


def _record_json(row: pd.Series) -> dict:
    """A RECORD (docs/proxy-record.md) carrying one synthetic row, for the committed-records path."""
    steps = json.loads(row["step_times_json"])
    model, layout = json.loads(row["model_json"]), json.loads(row["layout_json"])
    return {"schema_version": 1, "id": row["id"], "family": row["family"], "status": "ok", "message": "",
            "spec": {"model": model, "layout": layout, "seq_len": int(row["seq_len"]),
                     "global_batch": int(row["global_batch"]), "finetune": "full", "device": "cuda", "dtype": "bf16",
                     "warmup": 2, "steps": len(steps) + 2, "nproc_per_node": 1, "nnodes": 1, "compile": False,
                     "lora_rank": 8, "lora_targets": ["q", "v"]},
            "layout_family": "DDP", "layout_describe": "dp1", "environment": {"device_name": row["gpu_name"],
                                                                               "world_size": 1, "backend": "nccl"},
            "timing": {"step_times_s": [9.0, 9.0] + steps, "step_time_median_s": row["step_time_median_s"]},
            "loss": [1.0], "flops": {}, "comm": {}, "params": {},
            "memory": {"cuda_max_reserved_bytes": int(row["cuda_max_reserved_bytes"])}, "predicted": {}}


def test_committed_gpu_records_are_picked_up_and_labelled_with_their_device(tmp_path):
    rec = synthetic_gpu_records(gpu="NVIDIA H200")
    for _, r in rec.iterrows():
        (tmp_path / f"{r['id']}.json").write_text(json.dumps(_record_json(r)))
    (tmp_path / "environment.json").write_text("{}")
    (tmp_path / "depth-L1.spec.json").write_text("{}")
    (tmp_path / "depth-L1.nvsmi.csv").write_text("1000\n70000\n69000\n")
    df, files = load_gpu_records(tmp_path)
    assert len(df) == len(files) == 11 and df["device_used_peak_bytes"].iloc[0] == 70000 * 1024**2
    row = df[df["id"] == "width-h1280"].iloc[0]
    assert json.loads(row["step_times_json"]) == json.loads(rec.set_index("id").loc["width-h1280", "step_times_json"])
    cpu = pd.DataFrame([{"id": "x", "family": "depth", "device": "cpu", "status": "ok"}])
    doc, _ = stage_calibrate(cpu, Efficiency(), {"source": "auto", "bootstrap": 20, "gpu_records_dir": str(tmp_path)})
    assert doc["source"] == "gpu-proxies"
    assert doc["source_detail"].startswith("gpu-proxies (device: NVIDIA H200; 11 runs, from ")
    assert any("h200-141gb" in n for n in doc["notes"]) and len(doc["gpu"]["records_files"]) == 11
    assert doc["efficiency"]["gemm_eff_max"] == pytest.approx(TRUE.gemm_eff_max, rel=0.05)


def test_aggregate_row_carries_what_rebuilding_the_specs_needs():
    r = _record_json(synthetic_gpu_records().iloc[0])
    r["spec"]["layout"] = Layout(dp=1, sharding="none").to_dict()
    row = record_row({**r, "memory": {**r["memory"], "state_bytes_per_rank": []}})
    assert {"heads", "kv_heads", "ffn_hidden", "vocab", "model_json", "layout_json", "gpu_name",
            "step_times_json"} <= set(row)
    assert len(json.loads(row["step_times_json"])) == 12  # the 2 warm-up steps dropped
    m, c, t, *_ = record_specs(pd.Series(row))
    assert (m.heads, m.ffn_hidden, c.gpu.name) == (40, 13824, "h100-sxm-80gb")
    assert t.optimizer_impl == row["optimizer_impl"] == "foreach"  # torch.optim.AdamW's default on CUDA
    # a hand-made row without the adapters' settings ran the harness's defaults (RUN_DEFAULTS: r = 8 on q, v)
    lora = {k: v for k, v in row.items() if k not in ("lora_rank", "lora_targets")}
    t = record_specs(pd.Series({**lora, "finetune": "lora"}))[2]
    assert (t.lora_rank, t.lora_targets) == (RUN_DEFAULTS["lora_rank"], tuple(RUN_DEFAULTS["lora_targets"]))
    assert (t.lora_rank, t.lora_targets) == (8, ("q", "v"))


def test_device_script_dry_run_lists_the_runs_and_runs_nothing(tmp_path):
    out = tmp_path / "gpu"
    p = subprocess.run(["bash", str(ROOT / "scripts" / "device_proxies.sh"), "--dry-run", "--out", str(out)],
                       capture_output=True, text=True, timeout=120, cwd=ROOT)
    assert p.returncode == 0, p.stderr
    lines = [ln.split() for ln in p.stdout.splitlines() if ln.startswith("  ")]
    ids = [ln[0] for ln in lines]
    assert {"depth-L1", "depth-L4", "width-h1280", "seq-s16384", "scaleout-n1"} <= set(ids)
    assert len(ids) == len(set(ids)) and "width-h5120" not in ids  # duplicate of depth-L2, run once
    assert all("cuda/bf16" in ln for ln in lines) and all("hidden=5120" in ln for ln in lines if ln[0].startswith("depth"))
    assert not out.exists()  # nothing ran, nothing written
    # the LoRA pair: depth-L2's shape again with the LoRA study's adapters (not deduplicated into depth-L2)
    lora = [ln for ln in lines if "lora" in ln]
    assert [ln[0] for ln in lora] == ["lora-L2-r16"]
    assert {"layers=2", "hidden=5120", "seq=4096", "gb=8"} <= set(lora[0]) and lora[0][-2:] == ["r16", "q,k,v,o"]
    assert all("lora" not in ln for ln in lines if ln[0] == "depth-L2")
    micro = [ln for ln in p.stdout.splitlines() if ln.startswith("microbench:")]
    # ring attention first: the measurement the held-out CP bias waits on (a budget cut leaves it measured); then
    # FlexAttention's rate, the one kernel every torchtitan launch runs that the plan does not time
    assert [ln.split()[2] for ln in micro] == ["benchmarks/bench_ring_attention.py", "benchmarks/bench_flex_attention.py",
                                               "benchmarks/bench_hbm_stream.py", "benchmarks/bench_bf16_step.py",
                                               "benchmarks/bench_optimizer_step.py"]
    assert all(f"{out}/microbench/" in ln and "not run" in ln for ln in micro)
    only = subprocess.run(["bash", str(ROOT / "scripts" / "device_proxies.sh"), "--dry-run", "--microbench",
                           "ring_attention"], capture_output=True, text=True, timeout=120, cwd=ROOT)
    assert only.returncode == 0, only.stderr
    assert [ln.split()[2] for ln in only.stdout.splitlines() if ln.startswith("microbench:")] == [
        "benchmarks/bench_ring_attention.py"]
    typo = subprocess.run(["bash", str(ROOT / "scripts" / "device_proxies.sh"), "--dry-run", "--microbench",
                           "ring_attention,ring"], capture_output=True, text=True, timeout=60, cwd=ROOT)
    assert typo.returncode == 2 and "'ring'" in typo.stderr and "ring_attention, flex_attention, hbm_stream" in typo.stderr
    quiet = subprocess.run(["bash", str(ROOT / "scripts" / "device_proxies.sh"), "--dry-run", "--no-microbench"],
                           capture_output=True, text=True, timeout=120, cwd=ROOT)
    assert quiet.returncode == 0 and "microbench:" not in quiet.stdout
    # --config overlays the GPU proxy settings (it does not replace them): the LoRA study's adapters, GPU shapes
    over = tmp_path / "r8.yaml"
    over.write_text("training:\n  lora_rank: 8\n  lora_targets: [q, v]\n")
    ov = subprocess.run(["bash", str(ROOT / "scripts" / "device_proxies.sh"), "--dry-run", "--no-microbench",
                         "--config", str(over)], capture_output=True, text=True, timeout=120, cwd=ROOT)
    assert ov.returncode == 0, ov.stderr
    ov_lines = [ln.split() for ln in ov.stdout.splitlines() if ln.startswith("  ")]
    assert len(ov_lines) == len(lines) and all("cuda/bf16" in ln for ln in ov_lines)
    assert [ln[-3:] for ln in ov_lines if "lora" in ln] == [["lora", "r8", "q,v"]]
    bad = subprocess.run(["bash", str(ROOT / "scripts" / "device_proxies.sh"), "--budget-s", "-5"],
                         capture_output=True, text=True, timeout=60, cwd=ROOT)
    assert bad.returncode == 2 and "--budget-s" in bad.stderr


def test_calibrate_stage_writes_the_gpu_source_and_hashes_the_committed_records(tmp_path):
    from trainplan.io import read_json
    from trainplan.provenance import read_sidecar
    from trainplan.stages import calibrate

    gdir = tmp_path / "gpu"
    gdir.mkdir()
    for _, r in synthetic_gpu_records().iterrows():
        (gdir / f"{r['id']}.json").write_text(json.dumps(_record_json(r)))
    records = tmp_path / "records.csv"
    pd.DataFrame([{"id": "x", "family": "depth", "device": "cpu", "status": "ok"}]).to_csv(records, index=False)
    out = {"calibration": str(tmp_path / "calibration.json"), "heldout": str(tmp_path / "heldout.csv")}
    from trainplan.config import config_slice, load_config

    cfg = config_slice(load_config(ROOT / "config" / "config.yaml").raw, "calibrate")
    cfg["calibration"] = {**cfg["calibration"], "bootstrap": 20, "gpu_records_dir": str(gdir)}
    calibrate.run({"records": str(records)}, out, cfg)
    doc = read_json(out["calibration"])
    assert doc["source"] == "gpu-proxies" and len(doc["efficiency_samples"]) == 20
    side = json.dumps(read_sidecar(out["calibration"]))
    assert "depth-L1.json" in side and doc["source_detail"] in side


def test_a_scaleout_ladder_of_one_gpu_count_leaves_comm_bw_eff_at_its_prior():
    """Eight GPUs every time: no change of GPU count to tell bandwidth from compute, so comm_bw_eff is not fitted."""
    ladder = pd.DataFrame({"family": ["scaleout", "scaleout"], "world_size": [8, 8]})
    assert "comm_bw_eff" not in time_params(pd.concat([synthetic_gpu_records(), ladder]))


def test_only_ok_cuda_runs_with_a_step_time_are_fitted():
    """An OOM or failed CUDA run is no evidence of step time, whatever figures it carries."""
    rec = synthetic_gpu_records().iloc[:4].copy()
    rec.loc[1, "status"] = "oom"
    rec.loc[2, "status"] = "error"
    assert gpu_records(rec)["id"].tolist() == ["depth-L1", "depth-L4"]


def test_a_run_slower_than_the_model_has_a_positive_throughput_error():
    """One record 30% slower than the others imply: the fit that leaves it out predicts ~30% more tokens/s than it
    measured, a throughput error (predicted/measured − 1) of about +0.3, the sign production applies."""
    rec = synthetic_gpu_records()
    rec.loc[0, "step_time_median_s"] *= 1.3
    t = fit_gpu_time(rec, Efficiency(), list(TIME_PARAMS), n_boot=5, seed=0)
    assert t["per_record"][0]["loo_throughput_rel_err"] == pytest.approx(0.3, abs=0.05)


def test_a_run_reserving_more_than_the_model_has_a_negative_memory_error():
    """One record reserving 20% more than the model predicts: its leave-one-out memory error (predicted/measured − 1)
    is about −1/6, which the memory interval turns into a p90 above the estimate."""
    rec = synthetic_gpu_records()
    rec.loc[0, "cuda_max_reserved_bytes"] *= 1.2
    mem = fit_gpu_memory(rec, TRUE)
    assert mem["reserved_rel_errors"][0] == pytest.approx(1 / 1.2 - 1, abs=0.03)


def test_runtime_overhead_comes_from_one_process_runs_only():
    """nvidia-smi sees every process on the GPU: only one-rank runs say what sits outside this run's allocator."""
    rec = synthetic_gpu_records()
    multi = rec.index[5:]
    rec["device_used_peak_bytes"] = rec["cuda_max_reserved_bytes"] + 2**30
    rec.loc[multi, "world_size"] = 8
    rec.loc[multi, "device_used_peak_bytes"] += 9 * 2**30
    mem = fit_gpu_memory(rec, TRUE)
    assert mem["runtime_overhead_n"] == 5 and mem["outside_allocator_bytes"] == pytest.approx(2**30)
