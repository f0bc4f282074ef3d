"""The sbatch script's day-1 modes, run for real on CPU (srun/scontrol faked: one node, this machine), and the
torchtitan launch line it builds, parsed by torchtitan's own ConfigManager."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from trainplan import train_entry
from trainplan.launch import artifacts as launch
from trainplan.model.arch import MODEL_PRESETS, resolve_model
from trainplan.model.hardware import ClusterSpec
from trainplan.model.layout import Layout
from trainplan.model.training import TrainingSpec

HASH = "abc123def456"


def _fake_bin(bin_dir: Path, name: str, body: str) -> None:
    p = bin_dir / name
    p.write_text("#!/usr/bin/env bash\n" + body + "\n")
    p.chmod(0o755)


def _env(tmp: Path, out: Path, **extra: str) -> dict[str, str]:
    bin_dir = tmp / "bin"
    bin_dir.mkdir(exist_ok=True)
    _fake_bin(bin_dir, "scontrol", 'if [ "$1" = show ]; then echo localhost; else echo "scontrol $*" >> '
              + str(tmp / "scontrol.log") + "; fi")
    _fake_bin(bin_dir, "srun", 'while [[ "$1" == --* ]]; do shift; done; SLURM_NODEID=0 exec "$@"')
    return {"PATH": f"{bin_dir}:{Path(sys.executable).parent}:{os.environ['PATH']}", "HOME": str(tmp),
            "SLURM_JOB_NODELIST": "localhost", "SLURM_JOB_ID": "42", "SLURM_SUBMIT_DIR": str(out),
            "NCCL_IB_HCA": "none", "NCCL_SOCKET_IFNAME": "lo", "OMP_NUM_THREADS": "1", "RDZV_PORT": "29533",
            **extra}


def _write(tmp: Path, layout: Layout, model=MODEL_PRESETS["debug"], gpus: int = 2) -> Path:
    out = tmp / "launch"
    cluster = ClusterSpec(nodes=1, gpus_per_node=gpus, gpu="h100-sxm-80gb")
    training = TrainingSpec(seq_len=32, global_batch=8, dataset_tokens=20 * 8 * 32)
    launch.write_artifacts(model, cluster, training, layout, out, study_hash=HASH, min_tokens_per_s_per_gpu=1.0)
    return out


def _tokens(tmp: Path) -> Path:
    rng = np.random.default_rng(0)
    return train_entry.write_tokens(tmp / "tokens.npy", rng.integers(0, 256, 20_000).astype(np.uint16))


@pytest.mark.slow
@pytest.mark.parametrize("mode", ["day1-checkpoint", "day1-throughput"])
def test_day1_modes_run_the_entry_point_and_judge_it(tmp_path, mode):
    out = _write(tmp_path, Layout(dp=2, sharding="zero3", micro_batch=2))
    env = _env(tmp_path, out, TRAINPLAN_MODE=mode, TRAINPLAN_DATA=str(_tokens(tmp_path)))
    r = subprocess.run(["bash", str(out / "sbatch_1x2.sh")], env=env, cwd=out, capture_output=True, text=True,
                       timeout=400)
    assert r.returncode == 0, (r.stdout + r.stderr)[-4000:]
    run = out / f"run-{HASH}" / f"{mode}-42"
    steps = [json.loads(x) for x in (run / "steps.jsonl").read_text().splitlines()]
    if mode == "day1-checkpoint":
        assert "checkpoint restore PASS: restored at step 5" in r.stdout
        assert [e["start_step"] for e in steps if e["event"] == "start"] == [0, 5]
        assert max(e["step"] for e in steps if e["event"] == "step") == 10
    else:
        assert "throughput PASS" in r.stdout and (run / "day1_record.json").exists()
        assert sum(e["event"] == "step" for e in steps) == 50
    assert not (tmp_path / "scontrol.log").exists()  # day-1 runs never requeue


def test_torchtitan_launch_line_parses_in_torchtitans_config_manager(tmp_path):
    """The sbatch's torchtitan node command, run with a fake torchrun: its module arguments (the job module, the
    step/interval/timeout overrides the script adds) are what torchtitan.train would parse."""
    pytest.importorskip("torchtitan")
    try:
        from torchtitan.config.manager import ConfigManager
        from torchtitan.models.llama3 import config_registry  # noqa: F401
    except ImportError as e:
        pytest.skip(f"torchtitan's llama3 registry does not import here: {e}")
    model = resolve_model("llama2-7b")
    out = _write(tmp_path, Layout(dp=1, tp=2, sp=True, sharding="zero3", micro_batch=1), model=model)
    assert json.loads((out / "manifest.json").read_text())["trainer"]["chosen"] == "torchtitan"
    # the study's cost.json and summary.json beside launch/ (results/cost, results/analytic): read at run time
    (tmp_path / "cost").mkdir()
    (tmp_path / "cost" / "cost.json").write_text(json.dumps({"checkpoint_interval_h": 0.5}))
    (tmp_path / "analytic").mkdir()
    (tmp_path / "analytic" / "summary.json").write_text(json.dumps({"estimate": {"step_time_s": 6.0}}))
    rec = tmp_path / "argv"
    (tmp_path / "hf").mkdir()
    env = _env(tmp_path, out, TRAINPLAN_MODE="train", TRAINPLAN_HF_ASSETS=str(tmp_path / "hf"))
    _fake_bin(tmp_path / "bin", "torchrun", f'printf "%s\\0" "$@" > {rec}; echo "PYTHONPATH=$PYTHONPATH" >> '
              f'{tmp_path / "pp"}')
    r = subprocess.run(["bash", str(out / "sbatch_1x2.sh")], env=env, cwd=out, capture_output=True, text=True,
                       timeout=60)
    argv = rec.read_bytes().decode().split("\0")[:-1]
    assert argv[argv.index("-m") + 1] == "torchtitan.train"
    assert str(out) in (tmp_path / "pp").read_text()  # the job module's directory is importable
    titan_args = argv[argv.index("-m") + 2:]
    sys.path.insert(0, str(out))
    try:
        cfg = ConfigManager().parse_args(titan_args)
    finally:
        sys.path.remove(str(out))
        sys.modules.pop("trainplan_torchtitan", None)
    assert cfg.training.steps == 20 and cfg.parallelism.tensor_parallel_degree == 2
    assert cfg.comm.init_timeout_seconds == 1800 and cfg.comm.train_timeout_seconds == 1800  # not torchtitan's 100 s
    assert cfg.checkpoint.interval == 300 and "checkpoint every 1800 s" in r.stdout  # 0.5 h / 6 s per step
    # the fake trainer wrote no checkpoint and was not told to stop: no requeue, exit 0
    assert r.returncode == 0 and not (tmp_path / "scontrol.log").exists()
