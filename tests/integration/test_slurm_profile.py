"""The sbatch command the Slurm plugin would submit for proxy jobs, rendered by the plugin's own code.

`snakemake --profile slurm` runs for real (the study's Snakefile, profile and the installed
snakemake-executor-plugin-slurm); only `sbatch` on PATH is a stand-in that records its argv and refuses the
job, so nothing waits for a scheduler and no cluster (or root) is needed. The proxy jobs' resources come
from their RUN_SPECs (trainplan.proxy.slurm_resources), never from the profile: a GPU proxy asks for its GPUs per
node, CPUs per task for all its ranks and a wall time from its timeout; a CPU proxy asks for no GPU.
"""

from __future__ import annotations

import json
import os
import shlex
import stat
import sys
from pathlib import Path

import pytest
import yaml

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "slurm"))
from workflow_copy import ROOT, copy_workflow, snakemake  # noqa: E402

from trainplan.proxy.slurm_resources import (  # noqa: E402
    CPUS_PER_RANK,
    STARTUP_MIN,
    proxy_job_resources,
    restore_allocation_env,
)

BASE = {"family": "scaleout", "model": "debug", "layout": {"dp": 2, "sharding": "zero3"}, "seq_len": 64,
        "global_batch": 4, "steps": 4, "warmup": 1}
SPECS = [
    {**BASE, "id": "gpu-node", "device": "cuda", "dtype": "bf16", "nnodes": 1, "nproc_per_node": 8, "timeout_s": 1800},
    {**BASE, "id": "gpu-2nodes", "device": "cuda", "dtype": "bf16", "nnodes": 2, "nproc_per_node": 8, "timeout_s": 3600},
    {**BASE, "id": "cpu-2ranks", "device": "cpu", "nnodes": 1, "nproc_per_node": 2, "timeout_s": 120},
]

FAKE_SBATCH = """#!/bin/sh
# test stand-in: record the argv (NUL-separated) and refuse the job
printf '%s\\0' "$@" > "$SBATCH_RECORD_DIR/call.$$"
echo "sbatch: error: test stand-in, job not submitted" >&2
exit 1
"""


def _stub_bin(d: Path) -> Path:
    """sbatch records; the query tools the plugin may call (account guess, array limit) answer nothing."""
    d.mkdir()
    for name, text in {"sbatch": FAKE_SBATCH, **{t: "#!/bin/sh\nexit 0\n" for t in
                                                  ("sacct", "sacctmgr", "sshare", "scontrol", "squeue", "sinfo")}}.items():
        (d / name).write_text(text)
        (d / name).chmod(stat.S_IRWXU)
    return d


def _calls(record_dir: Path) -> dict[str, list[str]]:
    """{proxy id: sbatch argv} from the recorded calls (the id is in the plugin's --comment)."""
    out = {}
    for f in record_dir.glob("call.*"):
        argv = f.read_bytes().decode().split("\0")[:-1]
        comment = argv[argv.index("--comment") + 1]
        out[comment.removeprefix("rule_proxy_run_wildcards_")] = argv
    return out


def _opt(argv: list[str], name: str) -> str | None:
    """The value of ``name`` in either ``--name=value`` or ``--name value`` form (None if absent)."""
    for i, a in enumerate(argv):
        if a.startswith(name + "="):
            return a.split("=", 1)[1]
        if a == name:
            return argv[i + 1]
    return None


def test_proxy_resources_follow_the_run_spec():
    gpu, gpu2, cpu = (proxy_job_resources(s) for s in SPECS)
    assert gpu == {"nodes": 1, "tasks": 1, "tasks_per_gpu": 0, "cpus_per_task": 8 * CPUS_PER_RANK["cuda"],
                   "mem_mb": 256000, "runtime": 30 + STARTUP_MIN, "gres": "gpu:8", "mpi": ""}
    assert gpu2["nodes"] == gpu2["tasks"] == 2 and gpu2["gres"] == "gpu:8" and gpu2["mpi"] == "srun"
    assert cpu["gres"] == "" and cpu["cpus_per_task"] == 2 and cpu["runtime"] == 2 + STARTUP_MIN
    with pytest.raises(ValueError, match="device"):
        proxy_job_resources({**SPECS[0], "device": "tpu"})


def test_the_allocation_env_the_jobstep_strips_is_restored_from_scontrol(tmp_path, monkeypatch):
    bin_ = tmp_path / "bin"
    bin_.mkdir()
    (bin_ / "scontrol").write_text('#!/bin/sh\n[ "$*" = "show job -o 42" ] && '
                                   'echo "JobId=42 JobName=x NumNodes=2 NumCPUs=2 NodeList=tpn[1-2] BatchHost=tpn1"\n')
    (bin_ / "scontrol").chmod(stat.S_IRWXU)
    monkeypatch.setenv("PATH", f"{bin_}{os.pathsep}{os.environ['PATH']}")
    env = {"SLURM_JOB_ID": "42"}  # what the jobstep plugin leaves
    assert restore_allocation_env(env) == {"SLURM_JOB_NUM_NODES": "2", "SLURM_JOB_NODELIST": "tpn[1-2]"}
    assert env["SLURM_JOB_NUM_NODES"] == "2"
    assert restore_allocation_env({"PATH": "x"}) == {}  # not in a Slurm job: nothing to do
    full = {"SLURM_JOB_ID": "42", "SLURM_JOB_NUM_NODES": "1", "SLURM_JOB_NODELIST": "n1"}
    assert restore_allocation_env(full) == {} and full["SLURM_JOB_NUM_NODES"] == "1"  # already set: kept


def test_the_profile_holds_no_proxy_resources():
    """One source of truth: the profile carries site values only; the rule derives the rest."""
    prof = yaml.safe_load((ROOT / "slurm" / "config.yaml").read_text())
    assert "set-resources" not in prof
    assert set(prof["default-resources"]) <= {"slurm_partition", "slurm_account"}


def test_plugin_renders_the_sbatch_call_for_gpu_and_cpu_proxies(tmp_path):
    wf = copy_workflow(tmp_path / "wf")
    (wf / "results" / "proxies").mkdir(parents=True)
    (wf / "results" / "proxies" / "proxy_set.json").write_text(json.dumps({"proxies": SPECS}))
    rec = tmp_path / "calls"
    rec.mkdir()
    env = {"PATH": f"{_stub_bin(tmp_path / 'bin')}{os.pathsep}{os.environ['PATH']}", "SBATCH_RECORD_DIR": str(rec)}
    env = {**{k: v for k, v in os.environ.items() if not k.startswith("SLURM_")}, **env}
    targets = [f"results/proxies/runs/{s['id']}.json" for s in SPECS]
    r = snakemake(wf, *targets, "--profile", "slurm", "--configfile", "config/tiny.yaml",
                  "--allowed-rules", "proxy_run", "--retries", "0", "--keep-going",
                  "--slurm-init-seconds-before-status-checks", "1", env=env, timeout=300)
    calls = _calls(rec)
    print("\n".join("sbatch " + shlex.join(a for a in argv if not a.startswith("--wrap")) for argv in calls.values()))
    assert set(calls) == {s["id"] for s in SPECS}, (calls, (r.stdout + r.stderr)[-3000:])
    assert r.returncode != 0  # every submission was refused by the stand-in
    for spec in SPECS:
        argv, want = calls[spec["id"]], proxy_job_resources(spec)
        line = shlex.join(argv)
        assert _opt(argv, "-p") == "gpu", line  # the profile's partition: the one site value it holds
        assert _opt(argv, "--nodes") == str(spec["nnodes"]), line
        assert _opt(argv, "--cpus-per-task") == str(want["cpus_per_task"]), line
        assert _opt(argv, "-t") == str(want["runtime"]) == str(-(-spec["timeout_s"] // 60) + STARTUP_MIN), line
        assert _opt(argv, "--mem") == str(want["mem_mb"]), line
        assert _opt(argv, "--gpus") is None and _opt(argv, "--ntasks-per-gpu") is None, line
        if spec["device"] == "cuda":
            # GPUs per node, all ranks' CPUs on each node's one task
            assert _opt(argv, "--gres") == f"gpu:{spec['nproc_per_node']}", line
            assert _opt(argv, "--ntasks") == (None if spec["nnodes"] == 1 else str(spec["nnodes"])), line
        else:
            assert _opt(argv, "--gres") is None and _opt(argv, "--ntasks") == "1", line
        assert "--executor slurm-jobstep" in _opt(argv, "--wrap"), line
