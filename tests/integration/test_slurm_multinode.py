"""A 2-node proxy submitted by the Slurm executor plugin itself, on a real (emulated) 2-node cluster.

Two slurmd daemons on this machine give two real Slurm nodes (tests/slurm/cluster.py, ``nodes=2``). The
study's own ``proxy_run`` rule runs under ``--profile slurm``: its resources come from the RUN_SPEC
(``nnodes: 2`` → ``--nodes=2``, trainplan.proxy.slurm_resources), the plugin writes the sbatch call, and inside
the allocation the jobstep plugin's ``srun`` wrapper starts the job; the proxy launcher then takes its
multi-node path (one ``srun`` task per node, c10d rendezvous at the first node's NodeAddr). No hand-written
sbatch. The record says on which Slurm nodes the ranks ran, and its per-rank state bytes must still equal
the analytic prediction exactly.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "slurm"))
from cluster import EMULATED_PREFIX, PARTITION, available, local_slurm  # noqa: E402
from workflow_copy import copy_workflow, snakemake  # noqa: E402

from trainplan.proxy.slurm_resources import proxy_job_resources  # noqa: E402

pytestmark = [pytest.mark.slurm, pytest.mark.slow]

SPEC = {"id": "two-node-fsdp", "family": "scaleout", "model": "debug", "nnodes": 2, "nproc_per_node": 1,
        "layout": {"dp": 2, "sharding": "zero3"}, "seq_len": 64, "global_batch": 4, "steps": 6, "warmup": 1,
        "timeout_s": 240, "device": "cpu"}


@pytest.mark.skipif(available() is not None, reason=f"local Slurm: {available()}")
def test_proxy_spans_two_slurm_nodes_through_the_plugin(tmp_path):
    wf = copy_workflow(tmp_path / "wf")
    res = wf / "results"
    (res / "proxies").mkdir(parents=True)
    (res / "proxies" / "proxy_set.json").write_text(json.dumps({"proxies": [SPEC]}))
    rec = res / "proxies" / "runs" / f"{SPEC['id']}.json"
    with local_slurm(tmp_path, nodes=2) as env:
        nodes = subprocess.run(["sinfo", "-h", "-N", "-o", "%N"], env=env, capture_output=True, text=True).stdout.split()
        assert sorted(nodes) == [f"{EMULATED_PREFIX}1", f"{EMULATED_PREFIX}2"]
        r = snakemake(
            wf, str(rec.relative_to(wf)), "--profile", "slurm", "--configfile", "config/tiny.yaml",
            "--allowed-rules", "proxy_run",  # the proxy set above stands in for select_proxies
            "--default-resources", f"slurm_partition={PARTITION}",  # the only site value; the rest is derived
            "--slurm-status-command", "squeue", "--slurm-init-seconds-before-status-checks", "1",
            "--slurm-keep-successful-logs", "--latency-wait", "5", "--retries", "0", "--verbose",
            env=env, timeout=400)
        jobs = subprocess.run(["squeue", "-h", "-t", "all", "-o", "%k|%D|%C|%l"], env=env, capture_output=True,
                              text=True).stdout.split()
    out = r.stdout + r.stderr
    slurm_logs = "\n".join(p.read_text() for p in (wf / ".snakemake" / "slurm_logs").rglob("*.log"))
    assert r.returncode == 0, out[-4000:] + slurm_logs[-4000:]
    # what the plugin submitted: the derived resources, not a hand-written script
    want = proxy_job_resources(SPEC)
    calls = [ln for ln in out.splitlines() if "sbatch call:" in ln]
    assert len(calls) == 1, calls
    assert f"--nodes={want['nodes']}" in calls[0] and "--ntasks=2" in calls[0], calls[0]
    assert f"--cpus-per-task={want['cpus_per_task']}" in calls[0] and "--gres" not in calls[0], calls[0]
    assert f"-t {want['runtime']}" in calls[0], calls[0]
    assert jobs == [f"rule_proxy_run_wildcards_{SPEC['id']}|2|2|{want['runtime']}:00"], jobs
    # inside the allocation: the jobstep plugin runs the job in the batch step (mpi: no `srun -n1` wrapper,
    # which would confine it to one node); the launcher's own srun then spans both nodes (slurm_nodes below)
    step = [ln for ln in slurm_logs.splitlines() if "The call for this job is:" in ln]
    assert step and "-m snakemake" in step[0] and "srun -n1" not in step[0], step
    r = json.loads(rec.read_text())
    assert r["status"] == "ok", (r["message"], slurm_logs[-4000:])
    env_ = r["environment"]
    assert env_["world_size"] == 2 and env_["backend"] == "gloo"
    assert env_["slurm_nodes"] == [f"{EMULATED_PREFIX}1", f"{EMULATED_PREFIX}2"]  # one rank per Slurm node
    exact = r["predicted"]["exact_state_bytes"]
    for rank in r["memory"]["state_bytes_per_rank"]:
        assert {k: rank[k] for k in exact} == exact
    assert r["comm"]["all_gather_into_tensor"]["calls"] > 0 and r["comm"]["reduce_scatter_tensor"]["calls"] > 0
    assert r["loss"][-1] < r["loss"][0]
    steps = (res / "logs" / "proxy_run" / f"{SPEC['id']}.steps.log").read_text()
    assert f"step {SPEC['steps']}/{SPEC['steps']}" in steps, steps  # rank 0's per-step progress, across srun
