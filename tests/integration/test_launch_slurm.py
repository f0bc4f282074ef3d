"""The generated sbatch script on the real one-node Slurm (CPU, gloo, debug model): it runs the chosen trainer
(accelerate launch of trainplan.train_entry), is told to stop (USR1, as --signal=B:USR1@lead would before the time
limit), checkpoints, requeues itself, and the requeued job resumes and finishes with the uninterrupted losses."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "slurm"))
from cluster import PARTITION, available, local_slurm  # noqa: E402

from trainplan import train_entry  # noqa: E402
from trainplan.launch import artifacts as launch
from trainplan.model.arch import MODEL_PRESETS
from trainplan.model.hardware import ClusterSpec
from trainplan.model.layout import Layout
from trainplan.model.training import TrainingSpec

pytestmark = [pytest.mark.slurm, pytest.mark.slow]
SEQ, GB, STEPS = 32, 8, 20


def _events(p: Path) -> list[dict]:
    return [json.loads(x) for x in p.read_text().splitlines() if x.strip()] if p.exists() else []


def _squeue(env: dict, job: str) -> tuple[str, str]:
    """The job's state and reason as squeue prints them ("", "" once it has left the queue; "?" when squeue fails)."""
    r = subprocess.run(["squeue", "-h", "-j", job, "-o", "%T|%r"], env=env, capture_output=True, text=True, timeout=30)
    if r.returncode != 0:
        return "?", r.stderr.strip()
    state, _, reason = r.stdout.strip().partition("|")
    return state, reason


def _slurm_view(env: dict, job: str, slurm_dir: Path) -> str:
    """What Slurm itself says, for a failure message: the job, drained nodes, the daemons' last log lines."""
    parts = []
    for cmd in (["scontrol", "show", "job", job], ["sinfo", "-R"], ["sinfo", "-N", "-o", "%N %t %E"]):
        r = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=30)
        parts.append(f"$ {' '.join(cmd)}\n{r.stdout}{r.stderr}")
    for log in sorted(slurm_dir.glob("slurm*.log")):
        parts.append(f"--- {log.name} (last 25 lines)\n" + "\n".join(log.read_text().splitlines()[-25:]))
    return "\n".join(parts)


@pytest.mark.skipif(available() is not None, reason=f"local Slurm: {available()}")
def test_sbatch_stops_checkpoints_requeues_and_resumes(tmp_path):
    model = MODEL_PRESETS["debug"]
    cluster = ClusterSpec(nodes=1, gpus_per_node=2, gpu="h100-sxm-80gb")
    training = TrainingSpec(seq_len=SEQ, global_batch=GB, dataset_tokens=STEPS * GB * SEQ)
    layout = Layout(dp=2, sharding="zero3", micro_batch=2)
    out = tmp_path / "launch"
    launch.write_artifacts(model, cluster, training, layout, out, study_hash="abc123def456",
                           options={"partition": PARTITION, "time_limit_h": 0.25})
    # the test cluster has no GPUs: the same script without the --gpus-per-node directive
    (out / "sbatch_1x2.sh").write_text(launch.sbatch_script(
        model, cluster, training, layout, study_hash="abc123def456", partition=PARTITION, time_limit_h=0.25,
        gpu_directive=False))
    rng = np.random.default_rng(0)
    x = np.empty(20_000, np.uint16)
    x[0] = 1
    for t in range(len(x) - 1):
        x[t + 1] = (int(x[t]) * 5 + 3 + int(rng.integers(0, 2))) % 256
    train_entry.write_tokens(tmp_path / "tokens.npy", x)
    venv_bin = str(Path(sys.executable).parent)
    export = ",".join(["ALL", "NCCL_IB_HCA=none", "NCCL_SOCKET_IFNAME=lo", "OMP_NUM_THREADS=1",
                       f"TRAINPLAN_DATA={tmp_path / 'tokens.npy'}", "TRAINPLAN_SLEEP_PER_STEP_S=0.5",
                       "TRAINPLAN_ALLOW_RANDOM_INIT=1",  # a debug model from its config.json: no base weights
                       f"PATH={venv_bin}:{os.environ['PATH']}"])
    with local_slurm(tmp_path) as env:
        r = subprocess.run(["sbatch", "--parsable", f"--export={export}", "sbatch_1x2.sh"], cwd=out, env=env,
                           capture_output=True, text=True, timeout=60)
        assert r.returncode == 0, r.stderr
        job = r.stdout.strip().split(";")[0]
        log = out / "run-abc123def456" / "steps.jsonl"
        deadline = time.time() + 240
        while time.time() < deadline and not any(e.get("step", 0) >= 6 for e in _events(log) if e["event"] == "step"):
            time.sleep(1)
        # what Slurm does `lead` seconds before the time limit (--signal=B:USR1@lead): signal the batch shell
        subprocess.run(["scancel", "--signal=USR1", "--batch", job], env=env, check=True, timeout=30)
        deadline = time.time() + 400
        actions: list[str] = []
        pending_since = None
        while time.time() < deadline and not (out / "run-abc123def456" / "checkpoints" / "DONE").exists():
            state, reason = _squeue(env, job)
            stopped = any(e["event"] == "stop" for e in _events(log))
            if not state and stopped:
                break  # the job has left the queue without finishing: no use waiting for DONE
            pending_since = (pending_since or time.time()) if state == "PENDING" else None
            held = "held" in reason.lower()
            if stopped and pending_since and (held or (reason == "BeginTime" and time.time() - pending_since >= 2)):
                # Slurm holds a requeued batch job until its credential has expired (BeginTime; 121-155 s here),
                # which was most of this test's time: make it eligible now, as an operator would, once it has
                # been pending a poll (a relaunch in the second its old credential was revoked is refused). A
                # job whose relaunch failed is held instead ("launch failed requeued held"): release it. Asked on
                # every poll while the job waits for either reason. The requeue itself is the script's.
                cmd = (["scontrol", "release", job] if held
                       else ["scontrol", "update", f"JobId={job}", "StartTime=now"])
                r = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=30)
                actions.append(f"{time.strftime('%H:%M:%S')} {reason}: {' '.join(cmd[1:])} -> rc {r.returncode} "
                               f"{r.stderr.strip()}")
            time.sleep(2)
        while time.time() < deadline and _squeue(env, job)[0]:
            time.sleep(1)
        slurm_out = "\n".join(p.read_text() for p in out.glob("*.out"))
        done = (out / "run-abc123def456" / "checkpoints" / "DONE").exists()
        assert done, (f"{slurm_out[-3000:]}\n--- what the test asked of Slurm\n" + "\n".join(actions[-10:]) + "\n"
                      + _slurm_view(env, job, tmp_path / "slurm"))
    ev = _events(log)
    starts = [e for e in ev if e["event"] == "start"]
    stops = [e for e in ev if e["event"] == "stop"]
    assert len(starts) == 2 and len(stops) == 1, slurm_out[-4000:]
    assert starts[1]["start_step"] == stops[0]["step"] >= 6  # the requeued job resumed where the first stopped
    assert "requeueing job" in slurm_out and "restarts 1" in slurm_out
    losses = {e["step"]: e["loss"] for e in ev if e["event"] == "step"}
    assert sorted(losses) == list(range(1, STEPS + 1))
    assert losses[STEPS] < losses[1]
