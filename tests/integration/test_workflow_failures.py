"""Failing proxies through real Snakemake on the tiny study: an OOM is a result, any other failure is retried.

Both tests copy the workflow into a temp dir (tests/slurm/workflow_copy.py) and first build only the proxy
set (analytic_model + select_proxies), so the proxy ids and memory limits they use come from the study
itself, never retyped.
"""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

import pandas as pd
import pytest
import yaml

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "slurm"))
from workflow_copy import clone_study, copy_workflow, planned_jobs, snakemake  # noqa: E402

from trainplan.model.arch import ModelSpec
from trainplan.model.layout import Layout
from trainplan.provenance import read_sidecar  # noqa: E402
from trainplan.proxy import analytic  # noqa: E402
from trainplan.proxy.schema import normalize_run_spec, validate_record  # noqa: E402

pytestmark = pytest.mark.slow

TINY = ("--cores", "2", "--configfile", "config/tiny.yaml")
RETRIES = 1


def _proxy_set(wf: Path, *configfiles: str) -> list[dict]:
    """Build results/proxies/proxy_set.json (analytic_model + select_proxies only) and return its RUN_SPECs."""
    r = snakemake(wf, "results/proxies/proxy_set.json", *TINY, *configfiles, timeout=300)  # targets first: --configfile is variadic
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    return json.loads((wf / "results" / "proxies" / "proxy_set.json").read_text())["proxies"]


def _error_blocks(out: str) -> list[str]:
    """Snakemake's 'Error in rule X:' blocks (up to the next blank-line-separated section)."""
    return [m.group(0) for m in re.finditer(r"Error in rule \w+:\n(?:    .*\n)+", out)]


def _state_bytes(spec: dict) -> int:
    """Per-rank exact state bytes of a RUN_SPEC: the harness's pre-allocation memory check."""
    s = normalize_run_spec(spec)
    return sum(analytic.exact_state_bytes(ModelSpec.from_dict(s["model"]), Layout.from_dict(s["layout"])).values())


def test_a_failing_proxy_is_retried_then_reported_and_leaves_no_partial_record(tmp_path):
    wf = copy_workflow(tmp_path)
    ids = [p["id"] for p in _proxy_set(wf)]
    assert len(ids) >= 2, ids
    bad, good = ids[0], ids[1:]

    r = snakemake(wf, "results/proxies/records.csv", "--retries", str(RETRIES), "--keep-going", *TINY,
                  env={"TRAINPLAN_PROXY_FAIL_IDS": bad}, timeout=600)
    out = r.stdout + r.stderr
    assert r.returncode != 0, out[-3000:]
    # tried 1 + RETRIES times, each failure reported with the rule and the proxy id
    blocks = _error_blocks(out)
    assert len(blocks) == 1 + RETRIES, blocks
    for b in blocks:
        assert b.startswith("Error in rule proxy_run:"), b
        assert f"output: results/proxies/runs/{bad}.json" in b, b
    assert out.count("Trying to restart job") == RETRIES, out[-3000:]
    assert f"TRAINPLAN_PROXY_FAIL_IDS test hook: proxy {bad} fails" in out  # the cause, from the ranks
    assert f"proxy {bad}: `trainplan proxy` exited 1" in out
    smk_log = "\n".join(p.read_text() for p in (wf / ".snakemake" / "log").glob("*.snakemake.log"))
    assert smk_log.count("Trying to restart job") == RETRIES
    job_log = (wf / "results" / "logs" / "proxy_run" / f"{bad}.log").read_text()
    assert f"proxy {bad}: `trainplan proxy` exited 1" in job_log

    runs = wf / "results" / "proxies" / "runs"
    # no partial record, sidecar or launcher work dir of the failed id
    assert sorted(p.name for p in runs.iterdir() if bad in p.name) == []
    # the other proxies ran (--keep-going) and their records are complete and valid
    for i in good:
        rec = json.loads((runs / f"{i}.json").read_text())
        validate_record(rec)
        assert rec["status"] == "ok", rec["message"]
        assert read_sidecar(runs / f"{i}.json")["rule"] == "proxy_run"
    assert not (wf / "results" / "proxies" / "records.csv").exists()

    # without the fault, a rerun does only the failed proxy and what depends on it
    r = snakemake(wf, "results/proxies/records.csv", "-n", "--quiet", "rules", *TINY, timeout=120)
    assert planned_jobs(r.stdout + r.stderr) == {"proxy_run": 1, "aggregate": 1}, r.stdout + r.stderr


def test_an_oom_proxy_is_a_result_and_the_study_completes(tmp_path):
    wf = copy_workflow(tmp_path)
    # two depth slices far apart (1 and 8 layers), so a limit can sit between their footprints
    (wf / "depth.yaml").write_text(yaml.safe_dump({"proxies": {"families": ["depth"], "depth_layers": [1, 8]}}))
    specs = _proxy_set(wf, "depth.yaml")
    state = {p["id"]: _state_bytes(p) for p in specs}
    big = max(state, key=state.get)
    assert 2 * sorted(state.values())[-2] < state[big], state  # one proxy clearly the largest
    # the tightest limit the largest proxy exceeds before allocating: the others keep the most room
    (wf / "oom.yaml").write_text(yaml.safe_dump({"proxies": {"mem_limit_bytes": state[big] - 1}}))

    r = snakemake(wf, *TINY, "depth.yaml", "oom.yaml", timeout=900)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    assert "Error in rule" not in r.stdout + r.stderr  # an OOM is a result: no job failed, nothing retried
    res = wf / "results"
    recs = {p["id"]: json.loads((res / "proxies" / "runs" / f"{p['id']}.json").read_text()) for p in specs}
    for rec in recs.values():
        validate_record(rec)
    assert recs[big]["status"] == "oom"
    assert "mem_limit_bytes" in recs[big]["message"]
    assert {i: rec["status"] for i, rec in recs.items() if i != big} == {i: "ok" for i in recs if i != big}

    table = pd.read_csv(res / "proxies" / "records.csv")
    assert dict(zip(table["id"], table["status"], strict=True)) == {i: rec["status"] for i, rec in recs.items()}
    # the memo lists the OOM run in its proxy table (pdftotext of the real PDF)
    text = subprocess.run(["pdftotext", "-layout", str(res / "memo" / "design_memo.pdf"), "-"],
                          capture_output=True, text=True, check=True).stdout
    assert re.search(rf"{re.escape(big)}\s.*\boom\b", text), text[-3000:]
    assert "1 oom" in text


def test_corrupted_results_fail_by_name_and_the_rerun_rebuilds_them(tiny_study, tmp_path):
    """records.csv cut at a row boundary, then a run JSON cut in half: each fails the rule that reads it with
    the file's path, is removed, and the next run redoes exactly what it takes (issue 13, item 4)."""
    wf = clone_study(tiny_study[0], tmp_path / "wf")  # the session's finished tiny study, on a copy
    target = "results/calibration/scaling.json"  # aggregate + fit_scaling: the cheapest readers of the records
    r = snakemake(wf, target, "-n", *TINY, timeout=120)
    assert "Nothing to be done" in r.stdout + r.stderr, r.stdout[-3000:]  # the copy is as up to date as the run
    res = wf / "results" / "proxies"
    ids = [p["id"] for p in json.loads((res / "proxy_set.json").read_text())["proxies"]]
    assert len(ids) >= 2, ids

    csv = res / "records.csv"
    lines = csv.read_text().splitlines(keepends=True)
    csv.write_text("".join(lines[:2]))  # header + 1 row: a readable table, cut at a row boundary
    r = snakemake(wf, target, *TINY, timeout=300)
    out = r.stdout + r.stderr
    assert r.returncode != 0, out[-3000:]
    assert f"results/proxies/records.csv: 1 rows but aggregate wrote {len(ids)}" in out, out[-3000:]
    assert not csv.exists()

    bad = res / "runs" / f"{ids[0]}.json"
    text = bad.read_text()
    bad.write_text(text[: len(text) // 2])
    r = snakemake(wf, target, *TINY, timeout=300)
    out = r.stdout + r.stderr
    assert r.returncode != 0 and "Error in rule aggregate" in out, out[-3000:]
    assert f"results/proxies/runs/{ids[0]}.json: not valid JSON" in out, out[-3000:]
    assert not bad.exists() and not (res / "runs" / f"{ids[0]}.json.provenance.json").exists()

    r = snakemake(wf, target, "-n", "--quiet", "rules", *TINY, timeout=120)
    assert planned_jobs(r.stdout + r.stderr) == {"proxy_run": 1, "aggregate": 1, "fit_scaling": 1}, r.stdout
    r = snakemake(wf, target, *TINY, timeout=600)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    assert list(pd.read_csv(csv)["id"]) == ids
