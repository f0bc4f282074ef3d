"""The study through `--profile slurm` on a real one-node Slurm cluster started by the test."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).parent / "slurm"))
from cluster import available, local_slurm  # noqa: E402
from workflow_copy import copy_workflow, snakemake  # noqa: E402

pytestmark = [pytest.mark.slurm, pytest.mark.slow]


@pytest.mark.skipif(available() is not None, reason=f"local Slurm: {available()}")
def test_study_runs_through_the_slurm_profile(tmp_path):
    wf = copy_workflow(tmp_path / "wf")
    with local_slurm(tmp_path) as env:
        r = snakemake(
            wf, "--profile", "slurm", "--configfile", "config/tiny.yaml",
            # test override of the machine-specific values: CPU partition, no GPUs, small memory
            "--default-resources", "slurm_partition=cpu", "runtime=10", "mem_mb=500", "cpus_per_task=1",
            "--set-resources", "proxy_run:nodes=1", "proxy_run:mem_mb=1000", "proxy_run:runtime=10",
            "proxy_run:cpus_per_task=2",
            "--slurm-status-command", "squeue", "--slurm-init-seconds-before-status-checks", "1",
            "--slurm-keep-successful-logs", "--slurm-no-account", "--latency-wait", "5", "--jobs", "2",
            env=env, timeout=900)
        jobs = subprocess.run(["squeue", "-h", "-t", "all", "-o", "%j"], env=env, capture_output=True, text=True)
    out = r.stdout + r.stderr
    assert r.returncode == 0, out[-5000:]
    assert (wf / "results" / "memo" / "design_memo.pdf").exists()
    logs = list((wf / ".snakemake" / "slurm_logs").rglob("*.log"))
    assert any("proxy_run" in str(p) for p in logs), (logs, jobs.stdout)
