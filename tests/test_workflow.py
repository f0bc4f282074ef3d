"""The Snakemake study: lint, parse-time config errors, a tiny end-to-end run, rerun semantics."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).parent / "slurm"))
from workflow_copy import ROOT, copy_workflow, planned_jobs, snakemake  # noqa: E402

from trainplan.provenance import config_hash, read_sidecar

TINY = ("--cores", "2", "--configfile", "config/tiny.yaml")
DOWNSTREAM_OF_COST = {"cost_and_risk", "figures", "memo", "all"}


def test_lint_passes():
    r = snakemake(ROOT, "--lint", "--configfile", "config/tiny.yaml", timeout=120)
    assert r.returncode == 0, r.stdout + r.stderr


def test_default_study_dry_run_plans_the_whole_dag(tmp_path):
    wf = copy_workflow(tmp_path)  # a fresh tree: the checkout's results/ may already be complete
    r = snakemake(wf, "-n", "--cores", "2", "--quiet", "rules", timeout=120)
    assert r.returncode == 0, r.stderr
    jobs = planned_jobs(r.stdout + r.stderr)
    assert {"analytic_model", "select_proxies", "aggregate", "calibrate", "fit_scaling", "predict_production",
            "cost_and_risk", "figures", "memo", "launch_artifacts"} <= set(jobs)


@pytest.mark.parametrize(("override", "key"), [
    ("cluster:\n  gpu: h1000\n", "cluster.gpu"),
    ("layout: {dp: 8}\n", "layout"),
    ("training:\n  global_batch: -4\n", "training.global_batch"),
    ("cost:\n  pricee: 3\n", "cost.pricee"),
])
def test_bad_config_fails_at_parse_time_and_runs_nothing(tmp_path, override, key):
    wf = copy_workflow(tmp_path)
    (wf / "bad.yaml").write_text(override)
    r = snakemake(wf, *TINY, "bad.yaml", timeout=120)
    assert r.returncode != 0
    assert f"Bad config: {key}" in r.stdout + r.stderr
    assert not (wf / "results").exists()


@pytest.mark.slow
def test_tiny_study_runs_end_to_end_and_reruns_only_what_changed(tmp_path):
    wf = copy_workflow(tmp_path)
    r = snakemake(wf, *TINY, timeout=600)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    res = wf / "results"
    pdf = res / "memo" / "design_memo.pdf"
    assert pdf.read_bytes()[:5] == b"%PDF-"
    ids = [p["id"] for p in json.loads((res / "proxies" / "proxy_set.json").read_text())["proxies"]]
    assert ids and all((res / "proxies" / "runs" / f"{i}.json").exists() for i in ids)
    for out in ["analytic/candidates.csv", "proxies/records.csv", "calibration/calibration.json",
                "prediction/production.json", "cost/cost.json", "memo/design_memo.pdf"]:
        sc = read_sidecar(res / out)
        assert sc["inputs"] or out.startswith("analytic"), out
    cost_slice = read_sidecar(res / "cost/cost.json")["config_slice"]
    assert set(cost_slice) == {"model", "cluster", "training", "layout", "search", "cost", "targets"}
    assert read_sidecar(res / "cost/cost.json")["config_hash"] == config_hash(cost_slice)

    # nothing changed: nothing to do
    r = snakemake(wf, *TINY, "-n", timeout=120)
    assert "Nothing to be done" in r.stdout + r.stderr
    # price only: cost and downstream
    (wf / "price.yaml").write_text("cost:\n  price_per_gpu_hour_usd: 4.0\n  price_range_usd: [2.0, 6.88]\n")
    r = snakemake(wf, *TINY, "price.yaml", "-n", "--quiet", "rules", timeout=120)
    assert set(planned_jobs(r.stdout + r.stderr)) == DOWNSTREAM_OF_COST, r.stdout
    # model: everything
    (wf / "model.yaml").write_text("model:\n  preset: debug-wide\n")
    r = snakemake(wf, *TINY, "model.yaml", "-n", "--quiet", "rules", timeout=120)
    assert {"analytic_model", "select_proxies", "aggregate", "calibrate", "fit_scaling", "predict_production",
            "cost_and_risk", "launch_artifacts", "memo"} <= set(planned_jobs(r.stdout + r.stderr))
    # --forcerun fit_scaling: exactly it and downstream
    r = snakemake(wf, *TINY, "--forcerun", "fit_scaling", "-n", "--quiet", "rules", timeout=120)
    assert set(planned_jobs(r.stdout + r.stderr)) == {"fit_scaling", "predict_production"} | DOWNSTREAM_OF_COST


@pytest.mark.slow
def test_the_slurm_profile_resolves_from_the_repo_root(tmp_path):
    """`--profile slurm` finds slurm/config.yaml (dry run: nothing is submitted)."""
    wf = copy_workflow(tmp_path)
    r = snakemake(wf, "--profile", "slurm", "--configfile", "config/tiny.yaml", "-n", timeout=120)
    assert r.returncode == 0, r.stderr[-3000:]
    assert "slurm" in (r.stdout + r.stderr).lower()
