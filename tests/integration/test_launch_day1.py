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


def test_torchtitan_launch_line_parses_in_torchtitans_config_manager(tmp_path, monkeypatch):
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
    (tmp_path / "data.jsonl").write_text('{"text": "a"}\n')
    env = _env(tmp_path, out, TRAINPLAN_MODE="train", TRAINPLAN_HF_ASSETS=str(tmp_path / "hf"))
    # the fine-tune data is required: without it the script stops before the nodes start
    r = subprocess.run(["bash", str(out / "sbatch_1x2.sh")], env=env, cwd=out, capture_output=True, text=True,
                       timeout=60)
    assert r.returncode == 2 and "TRAINPLAN_DATASET_PATH=(empty)" in r.stderr, r.stderr
    env["TRAINPLAN_DATASET_PATH"] = str(tmp_path / "data.jsonl")
    _fake_bin(tmp_path / "bin", "torchrun", f'printf "%s\\0" "$@" > {rec}; echo "PYTHONPATH=$PYTHONPATH" >> '
              f'{tmp_path / "pp"}')
    r = subprocess.run(["bash", str(out / "sbatch_1x2.sh")], env=env, cwd=out, capture_output=True, text=True,
                       timeout=60)
    argv = rec.read_bytes().decode().split("\0")[:-1]
    assert argv[argv.index("-m") + 1] == "torchtitan.train"
    assert str(out) in (tmp_path / "pp").read_text()  # the job module's directory is importable
    titan_args = argv[argv.index("-m") + 2:]
    sys.path.insert(0, str(out))
    monkeypatch.setenv("TRAINPLAN_DATASET_PATH", env["TRAINPLAN_DATASET_PATH"])  # as the job's nodes have it
    try:
        cfg = ConfigManager().parse_args(titan_args)
    finally:
        sys.path.remove(str(out))
        sys.modules.pop("trainplan_torchtitan", None)
    assert cfg.training.steps == 20 and cfg.parallelism.tensor_parallel_degree == 2
    # the fine-tune data, registered under a name torchtitan's text loader accepts (it knows only c4's otherwise)
    from torchtitan.hf_datasets.text_datasets import DATASETS
    assert cfg.dataloader.dataset == "trainplan" and DATASETS["trainplan"].path.endswith("data.jsonl")
    assert cfg.comm.init_timeout_seconds == 1800 and cfg.comm.train_timeout_seconds == 1800  # not torchtitan's 100 s
    assert cfg.checkpoint.interval == 300 and "checkpoint every 1800 s" in r.stdout  # 0.5 h / 6 s per step
    # the fake trainer wrote no checkpoint and was not told to stop: no requeue, exit 0
    assert r.returncode == 0 and not (tmp_path / "scontrol.log").exists()


def test_a_training_run_without_base_weights_stops_before_the_nodes_start(tmp_path):
    """The sbatch's default TRAINPLAN_MODEL_CONFIG is the launch folder's config.json, from which train_entry builds a
    randomly initialised model: a 'fine-tune' from random weights. The train mode refuses it (exit 2, saying what to
    export) unless TRAINPLAN_ALLOW_RANDOM_INIT=1; a checkpoint directory with safetensors passes the guard."""
    out = _write(tmp_path, Layout(dp=2, sharding="zero3", micro_batch=2))
    sb = str(out / "sbatch_1x2.sh")
    env = _env(tmp_path, out, TRAINPLAN_MODE="train", TRAINPLAN_DATA=str(_tokens(tmp_path)))
    _fake_bin(tmp_path / "bin", "srun", "exit 0")  # the guard must stop the job before srun
    r = subprocess.run(["bash", sb], env=env, cwd=out, capture_output=True, text=True, timeout=60)
    assert r.returncode == 2 and "no *.safetensors there" in r.stderr, r.stdout + r.stderr
    ckpt = tmp_path / "base"
    ckpt.mkdir()
    (ckpt / "config.json").write_text("{}")
    (ckpt / "model.safetensors").write_bytes(b"")
    for extra in ({"TRAINPLAN_ALLOW_RANDOM_INIT": "1"}, {"TRAINPLAN_MODEL_CONFIG": str(ckpt)}):
        r = subprocess.run(["bash", sb], env={**env, **extra}, cwd=out, capture_output=True, text=True, timeout=60)
        assert "safetensors" not in r.stderr, r.stderr
    assert "#SBATCH --mem=0" in Path(sb).read_text() and '--cpus-per-task="${SLURM_CPUS_ON_NODE:-1}"' in Path(sb).read_text()


def test_torchtitan_day1_jobs_judge_the_console_log(tmp_path):
    """Under torchtitan there is no steps.jsonl: the day-1 throughput job ingests its own console log (%x-%j.out) with
    the model, layout and shapes the log lacks, and passes or fails on the p10; the checkpoint job checks that the
    second launch loaded step-5 and went on."""
    model = resolve_model("llama2-7b")
    out = _write(tmp_path, Layout(dp=1, tp=2, sp=True, sharding="zero3", micro_batch=1), model=model)
    (tmp_path / "hf").mkdir()
    (tmp_path / "data.jsonl").write_text('{"text": "a"}\n')
    log = out / "j-42.out"

    def run(mode: str, lines: list[str]) -> subprocess.CompletedProcess:
        log.write_text("\n".join(lines) + "\n")
        env = _env(tmp_path, out, TRAINPLAN_MODE=mode, TRAINPLAN_HF_ASSETS=str(tmp_path / "hf"),
                   TRAINPLAN_DATASET_PATH=str(tmp_path / "data.jsonl"), SLURM_JOB_NAME="j")
        _fake_bin(tmp_path / "bin", "torchrun", "exit 0")  # the trainer "ran"; its console is the log above
        return subprocess.run(["bash", str(out / "sbatch_1x2.sh")], env=env, cwd=out, capture_output=True, text=True,
                              timeout=120)

    def steps(rng, tps: str) -> list[str]:
        return [f"[rank0]:[titan] - root - INFO - step: {i}  loss:  {8 - 0.01 * i:.4f}  grad_norm:  1.0  "
                f"memory: 20.00GiB(25.0%)  tps: {tps}  tflops: 1.0  mfu: 1.00%" for i in rng]

    r = run("day1-throughput", steps(range(1, 51), "9,000"))
    assert r.returncode == 0 and "throughput PASS" in r.stdout, (r.stdout + r.stderr)[-3000:]
    assert (out / "run-abc123def456" / "day1-throughput-42" / "day1_record.json").exists()
    r = run("day1-throughput", ["no step logged"])  # a job whose trainer logged nothing does not pass
    assert r.returncode != 0 and "no step" in r.stderr
    load = "[rank0]:[titan] - root - INFO - Loading the checkpoint from /x/checkpoint/step-5."
    r = run("day1-checkpoint", [*steps(range(1, 6), "9,000"), load, *steps(range(6, 11), "9,000")])
    assert r.returncode == 0 and "checkpoint restore PASS: restored at step 5" in r.stdout, r.stdout + r.stderr
    r = run("day1-checkpoint", steps(range(1, 11), "9,000"))
    assert r.returncode != 0 and "checkpoint restore FAIL" in r.stdout


def _titan_line(i: int, loss: float) -> str:
    return f"step: {i}  loss: {loss:.5f}  memory: 30.00GiB(40%)  tps: 1,000  tflops: 100  mfu: 30.00%"


@pytest.mark.parametrize(("trainer", "fp8_drift", "passes"), [("accelerate", 1.002, True), ("accelerate", 1.03, False),
                                                              ("torchtitan", 1.002, True), ("torchtitan", 1.03, False)])
def test_the_fp8_loss_parity_mode_runs_fp8_then_bf16_and_judges_them(tmp_path, trainer, fp8_drift, passes):
    """The sbatch's day1-loss-parity mode: the FP8 run and then the bf16 run (Accelerate: its bf16 config; torchtitan:
    the job module with TRAINPLAN_PRECISION=bf16), each with its own step log and checkpoint folder, then
    `trainplan ingest --loss-parity --min-steps`. FP8 does not run on a CPU, so the trainer here (`accelerate`, or
    `torchrun` for torchtitan) is a stand-in that writes what the real one would log (its loss curve scaled by
    ``fp8_drift`` in the FP8 run); the script's control flow and the verdict are real."""
    from trainplan.launch.ingest import LOSS_PARITY_STEPS

    out = tmp_path / "launch"
    cluster = ClusterSpec(nodes=1, gpus_per_node=2, gpu="h100-sxm-80gb")
    model = MODEL_PRESETS["debug"] if trainer == "accelerate" else resolve_model("llama2-7b")
    precision = "fp8-tensorwise" if trainer == "accelerate" else "fp8-rowwise"
    training = TrainingSpec(seq_len=32, global_batch=8, dataset_tokens=20 * 8 * 32, precision=precision)
    launch.write_artifacts(model, cluster, training, Layout(dp=2, sharding="zero2"), out, study_hash=HASH,
                           min_tokens_per_s_per_gpu=1.0)
    assert json.loads((out / "manifest.json").read_text())["trainer"]["chosen"] == trainer
    argv_log = tmp_path / "trainer.argv"
    env = _env(tmp_path, out, TRAINPLAN_MODE="day1-loss-parity", TRAINPLAN_DATA=str(_tokens(tmp_path)))
    curve = (f"(2.0 + 3.0 * math.exp(-i / 80)) * ({fp8_drift} if fp8 else 1.0)")
    if trainer == "accelerate":
        env["TRAINPLAN_ALLOW_RANDOM_INIT"] = "1"  # like train, the mode wants the base weights
        _fake_bin(tmp_path / "bin", "accelerate", f"""echo "$* | $TRAINPLAN_STEP_LOG | $TRAINPLAN_CKPT_DIR" >> {argv_log}
python - "$@" <<'PY'
import json, math, os, sys
fp8 = "accelerate_fsdp2.yaml" in " ".join(sys.argv)
steps = int(sys.argv[sys.argv.index("--steps") + 1])
with open(os.environ["TRAINPLAN_STEP_LOG"], "a") as f:
    for i in range(1, steps + 1):
        f.write(json.dumps({{"event": "step", "step": i, "loss": {curve}}}) + "\\n")
PY""")
        shim = tmp_path / "pyshim" / "torchao"  # the FP8 guard imports torchao; the stand-in never uses it
        shim.mkdir(parents=True)
        (shim / "__init__.py").write_text("")
        env["PYTHONPATH"] = str(shim.parent)
    else:
        (tmp_path / "hf").mkdir()
        (tmp_path / "data.jsonl").write_text('{"text": "a"}\n')
        env.update(TRAINPLAN_HF_ASSETS=str(tmp_path / "hf"), TRAINPLAN_DATASET_PATH=str(tmp_path / "data.jsonl"))
        _fake_bin(tmp_path / "bin", "torchrun", f"""echo "$* | $TRAINPLAN_PRECISION | $TRAINPLAN_DUMP_FOLDER" >> {argv_log}
python - "$@" <<'PY'
import math, os, sys
fp8 = os.environ.get("TRAINPLAN_PRECISION", "fp8") != "bf16"
steps = int(sys.argv[sys.argv.index("--training.steps") + 1])
for i in range(1, steps + 1):
    loss = {curve}
    print(f"step: {{i}}  loss: {{loss:.5f}}  memory: 30.00GiB(40%)  tps: 1,000  tflops: 100  mfu: 30.00%")
PY""")
    r = subprocess.run(["bash", str(out / "sbatch_1x2.sh")], env=env, cwd=out, capture_output=True, text=True,
                       timeout=120)
    runs = argv_log.read_text().splitlines()
    assert len(runs) == 2, r.stdout + r.stderr
    run = out / f"run-{HASH}" / "day1-loss-parity-42"
    if trainer == "accelerate":
        assert "--config_file " + str(out / "accelerate_fsdp2.yaml") in runs[0] and str(run / "fp8.jsonl") in runs[0]
        assert str(out / launch.ACCELERATE_BF16_FILE) in runs[1] and str(run / "bf16.jsonl") in runs[1]
        assert f"--steps {LOSS_PARITY_STEPS}" in runs[0] and "fp8-checkpoints" in runs[0] and "bf16-checkpoints" in runs[1]
    else:
        assert runs[0].endswith(f"| fp8 | {run / 'fp8'}") and runs[1].endswith(f"| bf16 | {run / 'bf16'}")
        assert f"--training.steps {LOSS_PARITY_STEPS}" in runs[0]
        assert (run / "fp8.out").exists() and (run / "bf16.out").exists()
    assert (r.returncode == 0) == passes, r.stdout + r.stderr
    assert ("loss parity PASS" if passes else "loss parity FAIL") in r.stdout


def test_a_loss_parity_run_cut_short_fails_the_check(tmp_path):
    """A stop request (USR1 near the time limit) during the FP8 run: train_entry saves and exits 0, but the check did
    not run its steps; the job says so and exits non-zero instead of comparing a shorter window or starting bf16."""
    out = tmp_path / "launch"
    cluster = ClusterSpec(nodes=1, gpus_per_node=2, gpu="h100-sxm-80gb")
    training = TrainingSpec(seq_len=32, global_batch=8, dataset_tokens=20 * 8 * 32, precision="fp8-tensorwise")
    launch.write_artifacts(MODEL_PRESETS["debug"], cluster, training, Layout(dp=2, sharding="zero2"), out,
                           study_hash=HASH, min_tokens_per_s_per_gpu=1.0)
    env = _env(tmp_path, out, TRAINPLAN_MODE="day1-loss-parity", TRAINPLAN_DATA=str(_tokens(tmp_path)),
               TRAINPLAN_ALLOW_RANDOM_INIT="1")
    calls = tmp_path / "calls"
    # the stand-in trainer: 20 steps, then a stop arrives (the file the sbatch's USR1 trap touches)
    _fake_bin(tmp_path / "bin", "accelerate", f"""echo x >> {calls}
for i in $(seq 1 20); do echo '{{"event": "step", "step": '$i', "loss": 2.0}}' >> "$TRAINPLAN_STEP_LOG"; done
touch "$TRAINPLAN_STOP_FILE"
""")
    shim = tmp_path / "pyshim" / "torchao"
    shim.mkdir(parents=True)
    (shim / "__init__.py").write_text("")
    env["PYTHONPATH"] = str(shim.parent)
    r = subprocess.run(["bash", str(out / "sbatch_1x2.sh")], env=env, cwd=out, capture_output=True, text=True,
                       timeout=120)
    assert r.returncode != 0 and "stop requested before the bf16 run: the loss check did not finish" in r.stderr
    assert len(calls.read_text().splitlines()) == 1  # bf16 never started
