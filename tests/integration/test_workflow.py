"""The Snakemake study: lint, parse-time config errors, a tiny end-to-end run, rerun semantics."""

from __future__ import annotations

import importlib.metadata
import json
import re
import sys
from pathlib import Path

import pytest
import yaml
from pypdf import PdfReader

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "slurm"))
from workflow_copy import ROOT, clone_study, copy_workflow, planned_jobs, snakemake  # noqa: E402

from trainplan.config import load_config
from trainplan.provenance import config_hash, read_sidecar, study_hash

TINY = ("--cores", "2", "--configfile", "config/tiny.yaml")
DOWNSTREAM_OF_COST = {"cost_and_risk", "figures", "memo", "all"}
# launch files print the study hash (a hash of the whole config), so any config change rewrites them
DOWNSTREAM_OF_PRICE = DOWNSTREAM_OF_COST | {"launch_artifacts"}


def test_a_yaml_1_2_number_is_read_as_trainplan_plan_reads_it(tmp_path):
    """`dataset_tokens: 1e10` is a string to YAML 1.1 (Snakemake's loader), a number to the project's: the dry run
    plans the study (it stopped at a raw jsonschema error while `trainplan plan` accepted the same overlay)."""
    wf = copy_workflow(tmp_path)
    (wf / "e10.yaml").write_text("training:\n  dataset_tokens: 1e10\n")
    r = snakemake(wf, "-n", "--quiet", "rules", *TINY, "e10.yaml", timeout=120)
    assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-2000:]


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
    # Snakemake's own YAML loader lets the second key win: the project's strict reader refuses it, as `plan` does
    ("training:\n  seq_len: 4096\n  seq_len: 2048\n", "configfile"),
    # no layout fits (every one OOM) or none is left to size: refused before the proxies run, not by cost_and_risk
    ("model: {preset: llama2-70b}\nsearch: {offloads: [none]}\n", "search='"),
    ("search: {shardings: [none], offloads: [cpu]}\n", "search='0 layouts'"),
    ("model: {preset: llama2-70b}\nlayout: {dp: 2, sharding: none}\n", "layout='dp2"),
    # GPU proxies with the venv's CPU-only torch: every proxy job would fail on the GPU nodes after queueing
    # multi-node proxies under the local executor: refused in onstart (the executor is unknown at parse time),
    # before select_proxies or any proxy starts
    ("cluster: {nodes: 2}\nproxies: {nnodes: 2}\n", "proxies.nnodes=2: 1 for a local run"),
    pytest.param("proxies: {device: cuda}\n", "proxies.device='cuda'", marks=pytest.mark.skipif(
        "+cpu" not in importlib.metadata.version("torch"), reason="this venv's torch is not the CPU-only build")),
])
def test_bad_config_fails_at_parse_time_and_runs_nothing(tmp_path, override, key):
    wf = copy_workflow(tmp_path)
    (wf / "bad.yaml").write_text(override)
    r = snakemake(wf, *TINY, "bad.yaml", timeout=120)
    assert r.returncode != 0
    assert f"Bad config: {key}" in r.stdout + r.stderr
    assert not (wf / "results").exists()


@pytest.mark.slow
def test_tiny_study_runs_end_to_end_and_reruns_only_what_changed(tiny_study, tmp_path):
    done, r = tiny_study  # the session's one end-to-end run (tests/integration/conftest.py)
    wf = clone_study(done, tmp_path / "wf")  # the dry runs below edit files: on a copy, the shared tree stays as run
    # a clean run prints no Python warnings (pandas' DtypeWarning on candidates.csv once did, from two stages)
    assert not re.findall(r"\w+Warning: .*", r.stdout + r.stderr), re.findall(r"\w+Warning: .*", r.stdout + r.stderr)
    res = wf / "results"
    pdf = res / "memo" / "design_memo.pdf"
    assert pdf.read_bytes()[:5] == b"%PDF-"
    ids = [p["id"] for p in json.loads((res / "proxies" / "proxy_set.json").read_text())["proxies"]]
    assert ids and all((res / "proxies" / "runs" / f"{i}.json").exists() for i in ids)
    for out in ["analytic/candidates.csv", "proxies/records.csv", "calibration/calibration.json",
                "prediction/production.json", "cost/cost.json", "memo/design_memo.pdf"]:
        sc = read_sidecar(res / out)
        assert sc["inputs"] or out.startswith("analytic"), out
    # one study hash: the launch files' headers, the memo (footer, PDF identifier) and the run's first line
    h = study_hash(load_config([wf / "config/config.yaml", wf / "config/tiny.yaml"]))
    assert f"trainplan study hash: {h}" in r.stderr
    for f in (res / "launch").iterdir():
        if f.suffix in (".sh", ".yaml"):
            assert f"study hash: {h}" in f.read_text(), f.name
    assert h[:12] in "".join(pg.extract_text() for pg in PdfReader(pdf).pages[:2])
    # benchmark: TSVs of the expensive rules, inputs of the memo
    bench = {str(p.relative_to(res / "benchmarks")) for p in (res / "benchmarks").rglob("*.tsv")}
    assert bench == {"analytic_model.tsv", "calibrate.tsv", "cost_and_risk.tsv", "figures.tsv",
                     *(f"proxy_run/{i}.tsv" for i in ids)}, bench
    memo_inputs = " ".join(i["path"] for i in read_sidecar(pdf)["inputs"])
    assert all(f"benchmarks/{b}" in memo_inputs for b in bench), memo_inputs
    # per-step progress of every proxy, in its own log
    for i in ids:
        steps = (res / "logs" / "proxy_run" / f"{i}.steps.log").read_text()
        assert "step 3/3 (timed) loss" in steps and "ETA" in steps, steps
    cost_slice = read_sidecar(res / "cost/cost.json")["config_slice"]
    assert set(cost_slice) == {"model", "cluster", "training", "layout", "search", "cost", "targets"}
    assert read_sidecar(res / "cost/cost.json")["config_hash"] == config_hash(cost_slice)

    # nothing changed: nothing to do
    r = snakemake(wf, *TINY, "-n", timeout=120)
    assert "Nothing to be done" in r.stdout + r.stderr
    # price only: cost and downstream
    (wf / "price.yaml").write_text("cost:\n  price_per_gpu_hour_usd: 4.0\n  price_range_usd: [2.0, 6.88]\n")
    r = snakemake(wf, *TINY, "price.yaml", "-n", "--quiet", "rules", timeout=120)
    assert set(planned_jobs(r.stdout + r.stderr)) == DOWNSTREAM_OF_PRICE, r.stdout
    # model: everything
    (wf / "model.yaml").write_text("model:\n  preset: debug-wide\n")
    r = snakemake(wf, *TINY, "model.yaml", "-n", "--quiet", "rules", timeout=120)
    assert {"analytic_model", "select_proxies", "aggregate", "calibrate", "fit_scaling", "predict_production",
            "cost_and_risk", "launch_artifacts", "memo"} <= set(planned_jobs(r.stdout + r.stderr))
    # --forcerun fit_scaling: exactly it and downstream
    r = snakemake(wf, *TINY, "--forcerun", "fit_scaling", "-n", "--quiet", "rules", timeout=120)
    # (launch_artifacts reads production.json: the predicted step time and the day-1 throughput threshold)
    assert set(planned_jobs(r.stdout + r.stderr)) == {"fit_scaling", "predict_production", "launch_artifacts"} \
        | DOWNSTREAM_OF_COST
    # a pinned layout: analytic_model and everything downstream of it (the candidates change), launch included
    (wf / "pin_fsdp.yaml").write_text(yaml.safe_dump({"layout": PIN_FSDP}))
    r = snakemake(wf, *TINY, "pin_fsdp.yaml", "-n", "--quiet", "rules", timeout=120)
    pinned = set(planned_jobs(r.stdout + r.stderr))
    r = snakemake(wf, *TINY, "--forcerun", "analytic_model", "-n", "--quiet", "rules", timeout=120)
    assert pinned == set(planned_jobs(r.stdout + r.stderr)), r.stdout
    assert {"analytic_model", "launch_artifacts", "memo"} <= pinned
    # the memo's stylesheet only: the memo alone (its template and CSS are inputs of the rule)
    css = wf / "report" / "templates" / "memo.css"
    css.write_text(css.read_text() + "\n/* edited */\n")
    r = snakemake(wf, *TINY, "-n", "--quiet", "rules", timeout=120)
    assert set(planned_jobs(r.stdout + r.stderr)) == {"memo", "all"}, r.stdout


PIN_FSDP = {"dp": 2, "tp": 1, "sharding": "zero3", "micro_batch": 1}
PIN_TP = {"dp": 1, "tp": 2, "sp": True, "sharding": "none", "micro_batch": 1}


def _launch_for(wf: Path, pin: dict) -> dict[str, str]:
    """Pin ``pin`` and let Snakemake (re)build results/launch/: analytic_model, launch_artifacts and what the launch
    files read (cost.json's checkpoint interval, production.json's step time and p10), never the report."""
    name = f"pin_{'_'.join(f'{k}{v}' for k, v in pin.items())}.yaml"
    (wf / name).write_text(yaml.safe_dump({"layout": pin}))
    r = snakemake(wf, "results/launch/manifest.json", *TINY, name, timeout=300)  # target first: --configfile is variadic
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    jobs = planned_jobs(r.stdout + r.stderr)
    assert {"analytic_model", "launch_artifacts"} <= set(jobs) and not {"memo", "figures"} & set(jobs), jobs
    d = wf / "results" / "launch"
    return {p.name: p.read_text() for p in d.iterdir() if p.is_file() and not p.name.endswith(".provenance.json")}


def _code_lines(text: str) -> list[str]:
    return [line for line in text.splitlines() if line.strip() and not line.lstrip().startswith("#")]


@pytest.mark.slow
def test_pinning_a_different_layout_changes_the_launch_artifacts(tiny_study, tmp_path):
    wf = clone_study(tiny_study[0], tmp_path / "wf")  # a finished study: each pin reruns analytic_model and its readers
    a, b = _launch_for(wf, PIN_FSDP), _launch_for(wf, PIN_TP)
    for pin, files in ((PIN_FSDP, a), (PIN_TP, b)):
        layout = json.loads(files["manifest.json"])["layout"]
        assert {k: layout[k] for k in pin} == pin, layout
    sbatch = sorted(n for n in a if n.startswith("sbatch_"))
    assert sbatch and sbatch == sorted(n for n in b if n.startswith("sbatch_"))  # same cluster, same name
    # not just the header comment: the settings themselves differ
    assert yaml.safe_load(a["accelerate_fsdp2.yaml"]) != yaml.safe_load(b["accelerate_fsdp2.yaml"])
    assert _code_lines(a[sbatch[0]]) != _code_lines(b[sbatch[0]])


@pytest.mark.slow
def test_the_slurm_profile_resolves_from_the_repo_root(tmp_path):
    """`--profile slurm` finds slurm/config.yaml (dry run: nothing is submitted)."""
    wf = copy_workflow(tmp_path)
    r = snakemake(wf, "--profile", "slurm", "--configfile", "config/tiny.yaml", "-n", timeout=120)
    assert r.returncode == 0, r.stderr[-3000:]
    assert "slurm" in (r.stdout + r.stderr).lower()
