"""The study through `--profile slurm` on a real one-node Slurm cluster started by the test."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "slurm"))
from cluster import PARTITION, available, local_slurm  # noqa: E402
from workflow_copy import copy_workflow, snakemake  # noqa: E402

from trainplan.config import load_config  # noqa: E402
from trainplan.launch.artifacts import bash_syntax_check, sbatch_test_only  # noqa: E402
from trainplan.provenance import study_hash  # noqa: E402
from trainplan.proxy.slurm_resources import proxy_job_resources  # noqa: E402

pytestmark = [pytest.mark.slurm, pytest.mark.slow]


@pytest.mark.skipif(available() is not None, reason=f"local Slurm: {available()}")
def test_study_runs_through_the_slurm_profile(tmp_path, monkeypatch):
    wf = copy_workflow(tmp_path / "wf")
    with local_slurm(tmp_path) as env:
        r = snakemake(
            wf, "--profile", "slurm", "--configfile", "config/tiny.yaml",
            # the only override: the test cluster's partition (the profile's one site value). No
            # --set-resources: what each proxy asks for is derived from its RUN_SPEC by the rule itself.
            "--default-resources", f"slurm_partition={PARTITION}",
            "--slurm-status-command", "squeue", "--slurm-init-seconds-before-status-checks", "1",
            "--slurm-keep-successful-logs", "--latency-wait", "5", "--jobs", "2",
            env=env, timeout=900)
        jobs = subprocess.run(["squeue", "-h", "-t", "all", "-o", "%k|%D|%C|%l|%m"], env=env, capture_output=True,
                              text=True).stdout.split()
        if r.returncode == 0:
            monkeypatch.setenv("SLURM_CONF", env["SLURM_CONF"])
            _check_sbatch_artifact(wf / "results" / "launch", tmp_path)  # while the cluster is up
    out = r.stdout + r.stderr
    assert r.returncode == 0, out[-5000:]
    assert (wf / "results" / "memo" / "design_memo.pdf").exists()
    logs = list((wf / ".snakemake" / "slurm_logs").rglob("*.log"))
    assert any("proxy_run" in str(p) for p in logs), (logs, jobs)
    # only the proxies were cluster jobs (every other rule is a localrule), each with its derived resources
    specs = {p["id"]: p for p in json.loads((wf / "results/proxies/proxy_set.json").read_text())["proxies"]}
    want = {f"rule_proxy_run_wildcards_{i}|{w['nodes']}|{w['cpus_per_task']}|{w['runtime']}:00|{w['mem_mb']}M"
            for i, w in ((i, proxy_job_resources(s)) for i, s in specs.items())}
    assert set(jobs) == want, (jobs, want)
    assert f"trainplan study hash: {study_hash(load_config([wf / 'config/config.yaml', wf / 'config/tiny.yaml']))}" in out


GRES_REJECTION = "sbatch: error: Invalid generic resource (gres) specification"


def _check_sbatch_artifact(launch: Path, tmp: Path) -> None:
    """``sbatch --test-only`` on the study's generated sbatch script, on the live test cluster.

    The script asks for GPUs (``--gpus-per-node``) and the test cluster has none (no GresTypes), so as
    written Slurm must reject it for exactly that reason and nothing else (no unknown option, no bad
    value); with the GPU request overridden on the command line (``--gpus-per-node=0``, which beats
    the #SBATCH line) every other directive must be accepted ("to start at"). A corrupted copy is the
    negative control: the same check reports its syntax error.
    """
    (script,) = sorted(launch.glob("sbatch_*.sh"))
    bash_syntax_check(script)
    r = sbatch_test_only(script, partition=PARTITION)
    errors = [ln for ln in r.stderr.splitlines() if "error" in ln.lower() or "unrecognized" in ln.lower()]
    assert r.returncode != 0 and errors == [GRES_REJECTION], (r.returncode, r.stdout, r.stderr)
    r = sbatch_test_only(script, partition=PARTITION, extra_args=["--gpus-per-node=0"])
    assert r.returncode == 0 and "to start at" in r.stderr and f"in partition {PARTITION}" in r.stderr, r.stderr
    bad = tmp / "corrupted_sbatch.sh"
    bad.write_text(script.read_text().replace("#SBATCH --nodes=", "#SBATCH --nodez="))
    r = sbatch_test_only(bad, partition=PARTITION, extra_args=["--gpus-per-node=0"])
    assert r.returncode != 0 and "to start at" not in r.stderr and "nodez" in r.stderr, r.stderr
