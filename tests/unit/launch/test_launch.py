"""Launch artifacts: Accelerate's own loader accepts them, bash accepts the scripts, layouts change them."""

from __future__ import annotations

import json
import os
import shlex
import subprocess
from dataclasses import replace
from pathlib import Path

import pytest
import yaml

from trainplan.launch import artifacts as launch
from trainplan.launch import trainers
from trainplan.model.arch import resolve_model
from trainplan.model.base import ConfigError
from trainplan.model.hardware import ClusterSpec, resolve_gpu
from trainplan.model.layout import Layout
from trainplan.model.memory import memory_breakdown
from trainplan.model.training import TrainingSpec

MODEL = resolve_model("llama2-13b")
CLUSTER = ClusterSpec(nodes=4, gpus_per_node=8, gpu="h100-sxm-80gb")
TRAINING = TrainingSpec(seq_len=4096, global_batch=256)
HASH = "0123456789abcdef"

FSDP = Layout(dp=32, sharding="zero3", recompute="full", micro_batch=1)
HSDP_TP = Layout(dp=16, tp=2, sp=True, sharding="hsdp", shard_group=8, recompute="selective", micro_batch=1)
ZERO2_OFFLOAD = Layout(dp=32, sharding="zero2", offload="cpu", micro_batch=2)
PP = Layout(dp=8, pp=4, sharding="zero1", micro_batch=1)
CP = Layout(dp=16, cp=2, sharding="zero3", micro_batch=1)
ALL = {"fsdp": FSDP, "hsdp_tp": HSDP_TP, "zero2_offload": ZERO2_OFFLOAD, "pp": PP, "cp": CP}


def write(tmp_path: Path, layout: Layout, **kw) -> tuple[Path, list[tuple[str, bool]]]:
    out = tmp_path / "launch"
    return out, launch.write_artifacts(MODEL, CLUSTER, TRAINING, layout, out, study_hash=HASH, **kw)


def accelerate_env(config_file: Path) -> dict[str, str]:
    """What `accelerate launch --config_file F` would export to the workers (Accelerate's own code path)."""
    from accelerate.commands.launch import _validate_launch_command, launch_command_parser
    from accelerate.utils.launch import prepare_multi_gpu_env

    args = launch_command_parser().parse_args(["--config_file", str(config_file), "train.py"])
    args, _, _ = _validate_launch_command(args)
    return prepare_multi_gpu_env(args)


@pytest.mark.parametrize("name", list(ALL))
def test_accelerate_config_loads_in_accelerates_loader(tmp_path, name):
    from accelerate.commands.config.config_args import ClusterConfig, load_config_from_file
    from accelerate.utils import DistributedType

    out, _ = write(tmp_path, ALL[name])
    cfg = load_config_from_file(str(out / "accelerate_fsdp2.yaml"))
    assert isinstance(cfg, ClusterConfig)
    assert cfg.distributed_type == DistributedType.FSDP
    assert cfg.num_processes == CLUSTER.n_gpus and cfg.num_machines == CLUSTER.nodes
    assert cfg.mixed_precision == "bf16"
    assert cfg.fsdp_config["fsdp_version"] == 2
    assert cfg.fsdp_config["fsdp_state_dict_type"] == "SHARDED_STATE_DICT"
    assert cfg.fsdp_config["fsdp_transformer_layer_cls_to_wrap"] == "LlamaDecoderLayer"
    assert ClusterConfig.from_yaml_file(str(out / "accelerate_fsdp2.yaml")).fsdp_config == cfg.fsdp_config


@pytest.mark.parametrize("name", list(ALL))
def test_accelerate_launch_turns_config_into_valid_fsdp2_plugin(tmp_path, name, monkeypatch):
    from accelerate.parallelism_config import ParallelismConfig
    from accelerate.utils import FullyShardedDataParallelPlugin

    layout = ALL[name]
    out, _ = write(tmp_path, layout)
    env = accelerate_env(out / "accelerate_fsdp2.yaml")
    for k, v in env.items():
        monkeypatch.setenv(k, v)
    plugin = FullyShardedDataParallelPlugin()  # reads FSDP_* from the environment, validates values
    assert plugin.fsdp_version == 2
    assert plugin.reshard_after_forward is (layout.sharding in ("zero3", "hsdp"))
    assert plugin.activation_checkpointing is (layout.recompute != "none")
    from torch.distributed.fsdp import CPUOffloadPolicy

    assert isinstance(plugin.cpu_offload, CPUOffloadPolicy) is (layout.offload == "cpu")
    assert plugin.transformer_cls_names_to_wrap == ["LlamaDecoderLayer"]
    if env.get("ACCELERATE_USE_PARALLELISM_CONFIG") == "true":
        # tp_handler given so the check does not need transformers installed
        pc = ParallelismConfig(tp_handler=object() if layout.tp > 1 else None)
        assert pc.total_size * layout.pp == CLUSTER.n_gpus
        assert pc.tp_size == layout.tp and pc.cp_size == layout.cp
        if layout.sharding == "hsdp":
            assert pc.dp_shard_size * layout.cp == layout.shard_group
    else:
        assert layout.tp == layout.cp == 1 and layout.sharding != "hsdp"


def test_unexpressible_dimensions_are_explained_in_comments(tmp_path):
    out, _ = write(tmp_path, PP)
    text = (out / "accelerate_fsdp2.yaml").read_text()
    assert "pp=4 is not expressible in Accelerate" in text
    assert "ZeRO-1" in text
    out, _ = write(tmp_path, HSDP_TP)
    text = (out / "accelerate_fsdp2.yaml").read_text()
    assert "selective recompute" in text and "sequence parallelism" in text


@pytest.mark.parametrize("name", list(ALL))
def test_scripts_pass_bash_n(tmp_path, name):
    out, arts = write(tmp_path, ALL[name])
    scripts = [f for f, _ in arts if f.endswith(".sh")]
    assert set(scripts) == {"torchrun.sh", "sbatch_4x8.sh"}
    for s in scripts:
        launch.bash_syntax_check(out / s)
        assert os.access(out / s, os.X_OK)


def test_bash_syntax_check_rejects_broken_script(tmp_path):
    bad = tmp_path / "bad.sh"
    bad.write_text("if then fi\n")
    with pytest.raises(ConfigError, match="bash -n"):
        launch.bash_syntax_check(bad)


def test_sbatch_has_one_task_per_node_rendezvous_and_commented_nccl_settings(tmp_path):
    out, _ = write(tmp_path, FSDP)
    text = (out / "sbatch_4x8.sh").read_text()
    assert "#SBATCH --nodes=4\n" in text and "#SBATCH --gpus-per-node=8\n" in text
    assert "#SBATCH --ntasks-per-node=1\n" in text
    assert "scontrol show hostnames" in text and "--rdzv_backend c10d" in text
    lines = text.splitlines()
    for var in ("NCCL_DEBUG=WARN", "TORCH_NCCL_ASYNC_ERROR_HANDLING=1", "NCCL_IB_HCA=",
                "NCCL_SOCKET_IFNAME=", "TORCH_NCCL_HEARTBEAT_TIMEOUT_SEC="):
        i = next(i for i, ln in enumerate(lines) if ln.startswith("export " + var))
        while lines[i - 1].startswith("export "):  # a group of related exports shares one comment
            i -= 1
        assert lines[i - 1].startswith("#"), f"{var} has no comment above it"
    for placeholder in ("PLACEHOLDER_PARTITION", "PLACEHOLDER_ACCOUNT", "PLACEHOLDER_IB_HCAS", "PLACEHOLDER_IFNAME"):
        assert placeholder in text
    assert "TRAINPLAN_GRAD_ACCUM=8" in text  # 256 / (32 * 1)
    assert "export TRAINPLAN_OPTIMIZER_IMPL=fused " in text  # the AdamW kernels the plan timed


@pytest.mark.parametrize("script", ["sbatch_4x8.sh", "torchrun.sh"])
def test_scripts_set_the_expandable_segments_allocator_unless_the_operator_set_one(tmp_path, script):
    """Both scripts export PYTORCH_ALLOC_CONF=expandable_segments:True (what the preflight's slice runs with,
    allocator_env) before anything starts, and keep an operator's own setting under either of torch's names."""
    from trainplan.proxy.torchrun import ALLOC_CONF, allocator_env

    out, _ = write(tmp_path, FSDP)
    lines = (out / script).read_text().splitlines()
    (line,) = [ln for ln in lines if "PYTORCH_ALLOC_CONF=" in ln]
    assert lines.index(line) < next(i for i, ln in enumerate(lines) if ln.startswith("exec ") or "srun" in ln)
    base = {k: v for k, v in os.environ.items() if k not in ("PYTORCH_ALLOC_CONF", "PYTORCH_CUDA_ALLOC_CONF")}
    for given, expect in (({}, ALLOC_CONF), ({"PYTORCH_ALLOC_CONF": "max_split_size_mb:64"}, "max_split_size_mb:64"),
                          ({"PYTORCH_CUDA_ALLOC_CONF": "backend:cudaMallocAsync"}, "unset"),
                          ({"PYTORCH_ALLOC_CONF": ""}, ALLOC_CONF)):
        r = subprocess.run(["bash", "-c", f'set -euo pipefail\n{line}\necho "${{PYTORCH_ALLOC_CONF-unset}}"'],
                           env={**base, **given}, capture_output=True, text=True, timeout=30)
        assert (r.returncode, r.stdout.strip()) == (0, expect), (given, r.stderr)
        assert allocator_env({**base, **given}).get("PYTORCH_ALLOC_CONF", "unset") == expect, given


def test_the_optimizer_implementation_reaches_the_trainer(tmp_path):
    """training.optimizer_impl is exported to train_entry (TRAINPLAN_OPTIMIZER_IMPL) and set as torchtitan's
    optimizer.implementation, so the launch runs the kernels the step time was computed for."""
    out = tmp_path / "launch"
    launch.write_artifacts(MODEL, CLUSTER, replace(TRAINING, optimizer_impl="foreach"), FSDP, out, study_hash=HASH)
    assert "export TRAINPLAN_OPTIMIZER_IMPL=foreach " in (out / "sbatch_4x8.sh").read_text()
    assert "'optimizer': {'implementation': 'foreach'}" in (out / "trainplan_torchtitan.py").read_text()


def test_the_fine_tune_reaches_the_trainer(tmp_path):
    """The sbatch exports the plan's fine-tune to train_entry: full without adapter settings; LoRA with its rank and
    targets; QLoRA as LoRA (train_entry has no NF4 path), which the manifest's deviations say with what it costs in
    memory, from the memory model."""
    def sbatch(training, name):
        out = tmp_path / name
        launch.write_artifacts(MODEL, CLUSTER, training, FSDP, out, study_hash=HASH)
        return (out / "sbatch_4x8.sh").read_text(), json.loads((out / "manifest.json").read_text())["trainer"]

    full, _ = sbatch(TRAINING, "full")
    assert "export TRAINPLAN_FINETUNE=full " in full and "TRAINPLAN_LORA_RANK" not in full
    lora, man = sbatch(replace(TRAINING, finetune="lora", lora_rank=8, lora_targets=("q", "v")), "lora")
    assert "export TRAINPLAN_FINETUNE=lora " in lora
    assert "export TRAINPLAN_LORA_RANK=8 TRAINPLAN_LORA_TARGETS=q,v\n" in lora
    assert not any("qlora" in d for d in man["deviations"])
    ql_training = replace(TRAINING, finetune="qlora", lora_rank=64, lora_targets=("q", "k", "v", "o", "gate", "up",
                                                                                   "down"))
    qlora, man = sbatch(ql_training, "qlora")
    assert "export TRAINPLAN_FINETUNE=lora " in qlora and "TRAINPLAN_LORA_TARGETS=q,k,v,o,gate,up,down" in qlora
    note = next(d for d in man["deviations"] if d.startswith("finetune=qlora runs as LoRA"))
    as_lora = memory_breakdown(MODEL, CLUSTER, replace(ql_training, finetune="lora"), FSDP)["total"] / 2**30
    planned = memory_breakdown(MODEL, CLUSTER, ql_training, FSDP)["total"] / 2**30
    assert as_lora > planned and f"{as_lora:.1f} GiB/GPU against the plan's {planned:.1f} GiB" in note
    assert note in qlora  # the script's header says it too


def test_sbatch_refuses_to_run_with_placeholders(tmp_path):
    """Run the script's body up to the placeholder guard: it must stop with exit 2, not start NCCL on a bogus HCA."""
    out, _ = write(tmp_path, FSDP)
    env = {k: v for k, v in os.environ.items() if not k.startswith("NCCL_")}
    r = subprocess.run(["bash", str(out / "sbatch_4x8.sh")], env=env, capture_output=True, text=True, timeout=30)
    assert r.returncode == 2 and "PLACEHOLDER" in r.stderr


@pytest.mark.parametrize(("trainer", "says"), [("accelerate", "TRAINPLAN_DATA=PLACEHOLDER_TOKENS.npy: no such file"),
                                              ("torchtitan", "TRAINPLAN_HF_ASSETS=(empty): not a directory")])
def test_sbatch_refuses_to_start_without_its_inputs(tmp_path, trainer, says):
    """The NCCL values set but no dataset (accelerate) or no HF assets (torchtitan): exit 2 before any node starts."""
    out, _ = write(tmp_path, FSDP)
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (bin_dir / "scontrol").write_text("#!/bin/sh\necho localhost\n")
    (bin_dir / "srun").write_text("#!/bin/sh\necho srun must not run >&2; exit 99\n")
    for f in bin_dir.iterdir():
        f.chmod(0o755)
    env = {"PATH": f"{bin_dir}:{os.environ['PATH']}", "HOME": str(tmp_path), "SLURM_JOB_NODELIST": "n1",
           "SLURM_JOB_ID": "1", "SLURM_SUBMIT_DIR": str(out), "NCCL_IB_HCA": "mlx5_0", "NCCL_SOCKET_IFNAME": "eth0",
           "TRAINPLAN_TRAINER": trainer}
    r = subprocess.run(["bash", str(out / "sbatch_4x8.sh")], env=env, cwd=out, capture_output=True, text=True,
                       timeout=30)
    assert r.returncode == 2 and says in r.stderr and "srun must not run" not in r.stderr


def test_every_file_header_carries_the_study_hash(tmp_path):
    out, arts = write(tmp_path, FSDP)
    assert {f for f, _ in arts} == {"accelerate_fsdp2.yaml", "torchrun.sh", "sbatch_4x8.sh", "deepspeed_zero.json",
                                    "model_config.json", "trainplan_torchtitan.py"}
    for f, _ in arts:
        head = "\n".join((out / f).read_text().splitlines()[:4])
        assert f"study hash: {HASH}" in head, f
    manifest = json.loads((out / "manifest.json").read_text())
    assert manifest["study_hash"] == HASH
    assert [(a["filename"], a["short"]) for a in manifest["artifacts"]] == arts


def test_short_flag_follows_length(tmp_path):
    out, arts = write(tmp_path, FSDP)
    for f, short in arts:
        assert short is ((out / f).read_text().count("\n") <= launch.SHORT_MAX_LINES)
    assert dict(arts)["sbatch_4x8.sh"] is False and dict(arts)["torchrun.sh"] is True


def test_layout_change_changes_the_artifacts(tmp_path):
    a_dir, _ = write(tmp_path / "a", FSDP)
    b_dir, _ = write(tmp_path / "b", HSDP_TP)
    a = (a_dir / "accelerate_fsdp2.yaml").read_text()
    b = (b_dir / "accelerate_fsdp2.yaml").read_text()
    assert a != b and "parallelism_config_tp_size: 2" in b and "parallelism_config" not in a
    assert (a_dir / "deepspeed_zero.json").exists() and not (b_dir / "deepspeed_zero.json").exists()
    c_dir, _ = write(tmp_path / "c", Layout(dp=32, sharding="zero3", recompute="none", micro_batch=2))
    c = (c_dir / "sbatch_4x8.sh").read_text()
    assert "TRAINPLAN_GRAD_ACCUM=4" in c and "TRAINPLAN_MICRO_BATCH=2" in c
    assert "fsdp_activation_checkpointing: false" in (c_dir / "accelerate_fsdp2.yaml").read_text()


def test_cluster_shape_changes_sbatch_and_torchrun(tmp_path):
    cluster = ClusterSpec(nodes=2, gpus_per_node=8, gpu="h100-sxm-80gb")
    arts = launch.write_artifacts(MODEL, cluster, TRAINING, Layout(dp=16), tmp_path, study_hash=HASH)
    assert "sbatch_2x8.sh" in dict(arts)
    assert "--nnodes=2 --nproc-per-node=8" in (tmp_path / "torchrun.sh").read_text()
    assert "--num_processes 16" in (tmp_path / "sbatch_2x8.sh").read_text()


HOSTILE = "train.py; rm -rf / #$(touch pwned)\n`id`"


def _fake_bin(bin_dir: Path, name: str, body: str) -> None:
    p = bin_dir / name
    p.write_text("#!/usr/bin/env bash\n" + body + "\n")
    p.chmod(0o755)


def _nul_args(path: Path) -> list[str]:
    return path.read_bytes().decode().split("\0")[:-1]


def test_config_values_reach_the_shell_only_quoted(tmp_path):
    """Run both scripts for real, with fake torchrun/srun/scontrol/accelerate that record their argv."""
    out, _ = write(tmp_path, FSDP, train_script=HOSTILE, train_args=["--name", "a b'c"])
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    rec = tmp_path / "argv"
    dump = f'printf "%s\\0" "$@" > {shlex.quote(str(rec))}'
    _fake_bin(bin_dir, "torchrun", dump)
    _fake_bin(bin_dir, "accelerate", dump)
    _fake_bin(bin_dir, "scontrol", "echo node-a; echo node-b")
    _fake_bin(bin_dir, "srun", 'while [[ "$1" == --* ]]; do shift; done; SLURM_NODEID=3 exec "$@"')
    env = {"PATH": f"{bin_dir}:{os.environ['PATH']}", "HOME": str(tmp_path), "HEAD_NODE": "node-a",
           "SLURM_JOB_NODELIST": "node-[a-b]", "SLURM_JOB_ID": "7", "SLURM_SUBMIT_DIR": str(out),
           "NCCL_IB_HCA": "mlx5_0", "NCCL_SOCKET_IFNAME": "eth0"}

    r = subprocess.run(["bash", str(out / "torchrun.sh")], env=env, cwd=tmp_path, capture_output=True, text=True,
                       timeout=30)
    assert r.returncode == 0, r.stderr
    argv = _nul_args(rec)
    assert argv[-3:] == [HOSTILE, "--name", "a b'c"]
    assert "--rdzv-endpoint=node-a:29500" in argv and "--rdzv-backend=c10d" in argv

    rec.unlink()
    r = subprocess.run(["bash", str(out / "sbatch_4x8.sh")], env=env, cwd=tmp_path, capture_output=True,
                       text=True, timeout=30)
    assert r.returncode == 0, r.stderr
    argv = _nul_args(rec)
    assert argv[0] == "launch" and argv[-5:-2] == [HOSTILE, "--name", "a b'c"]
    assert argv[-2:] == ["--steps", str(trainers.total_steps(TRAINING))]  # the mode's own arguments, last
    assert argv[argv.index("--machine_rank") + 1] == "3"  # expanded on the node, not on the batch host
    assert argv[argv.index("--main_process_ip") + 1] == "node-a"  # first host of the allocation
    assert argv[argv.index("--config_file") + 1] == str(out / "accelerate_fsdp2.yaml")
    assert not list(tmp_path.glob("pwned")) and not (out / "pwned").exists()


def test_hostile_model_name_cannot_escape_a_comment(tmp_path):
    from dataclasses import replace

    model = replace(MODEL, name="x\nrm -rf /tmp/should-not-run")
    launch.write_artifacts(model, CLUSTER, TRAINING, FSDP, tmp_path, study_hash=HASH)
    for f in ("torchrun.sh", "sbatch_4x8.sh", "accelerate_fsdp2.yaml", "trainplan_torchtitan.py"):
        assert not any(ln.startswith("rm ") for ln in (tmp_path / f).read_text().splitlines())


def test_bad_study_hash_and_time_limit_raise_config_error(tmp_path):
    with pytest.raises(ConfigError, match="study_hash"):
        launch.write_artifacts(MODEL, CLUSTER, TRAINING, FSDP, tmp_path, study_hash="a b; rm")
    with pytest.raises(ConfigError, match="time_limit_h"):
        launch.sbatch_script(MODEL, CLUSTER, TRAINING, FSDP, study_hash=HASH, time_limit_h=-1)


# --------------------------------------------------------------------------------------- DeepSpeed
@pytest.mark.parametrize("layout,stage", [(Layout(dp=32, sharding="none"), 0), (Layout(dp=32, sharding="zero1"), 1),
                                          (ZERO2_OFFLOAD, 2), (FSDP, 3)])
def test_deepspeed_config_keys_are_documented_and_batch_is_consistent(layout, stage):
    cfg = launch.deepspeed_config(MODEL, CLUSTER, TRAINING, layout, study_hash=HASH)
    assert cfg is not None
    docs = launch.DEEPSPEED_DOCUMENTED_KEYS
    assert {k for k in cfg if not k.startswith("_")} <= docs[""]
    assert set(cfg["zero_optimization"]) <= docs["zero_optimization"]
    assert cfg["zero_optimization"]["stage"] == stage
    assert cfg["train_batch_size"] == (cfg["train_micro_batch_size_per_gpu"] * cfg["gradient_accumulation_steps"]
                                       * layout.dp)
    if layout.offload == "cpu":
        assert set(cfg["zero_optimization"]["offload_optimizer"]) <= docs["offload_optimizer"]
        assert cfg["zero_optimization"]["offload_optimizer"]["device"] == "cpu"


@pytest.mark.parametrize("layout", [HSDP_TP, PP, CP])
def test_deepspeed_not_written_for_layouts_it_cannot_express(layout):
    assert launch.deepspeed_config(MODEL, CLUSTER, TRAINING, layout, study_hash=HASH) is None
    assert launch.deepspeed_unsupported_reason(layout)


@pytest.mark.parametrize("layout", [FSDP, ZERO2_OFFLOAD])
def test_deepspeed_config_validates_against_deepspeed(layout, monkeypatch):
    pytest.importorskip("deepspeed", reason="deepspeed is not installed (optional); documented-key check above")
    import deepspeed.runtime.config as ds_config

    class DataParallel:  # the mpu DeepSpeed asks for the data-parallel world size
        def get_data_parallel_world_size(self) -> int:
            return layout.dp

    monkeypatch.setattr(ds_config.dist, "get_rank", lambda *a, **k: 0)
    cfg = launch.deepspeed_config(MODEL, CLUSTER, TRAINING, layout, study_hash=HASH)
    parsed = ds_config.DeepSpeedConfig(cfg, mpu=DataParallel())
    assert parsed.zero_optimization_stage == cfg["zero_optimization"]["stage"]
    assert parsed.train_batch_size == TRAINING.global_batch


# -------------------------------------------------------------------------------------------- CLI
def test_main_reports_missing_summary_as_config_error(tmp_path, capsys):
    pytest.importorskip("trainplan.config", reason="config loader not written yet")
    rc = launch.main(["--summary", str(tmp_path / "nope.json"), "--config", "config/config.yaml",
                      "--out", str(tmp_path / "o")])
    assert rc == 2 and "summary" in capsys.readouterr().err


def test_sbatch_test_only_builds_an_override_command(tmp_path, monkeypatch):
    seen = {}

    def fake_run(cmd, **kw):
        seen["cmd"] = cmd
        return subprocess.CompletedProcess(cmd, 0, "", "sbatch: Job 1 to start at now")

    monkeypatch.setattr(launch.subprocess, "run", fake_run)
    launch.sbatch_test_only(tmp_path / "s.sh", partition="debug", account="lab")
    assert seen["cmd"] == ["sbatch", "--test-only", "--partition=debug", "--account=lab", str(tmp_path / "s.sh")]


def test_config_launch_options_fill_the_directives(tmp_path):
    opts = {"job_name": "llama2-13b-fft", "partition": "h100", "account": "lab-7", "time_limit_h": 36.5,
            "master_port": 29611}
    launch.write_artifacts(MODEL, CLUSTER, TRAINING, FSDP, tmp_path, study_hash=HASH, options=opts)
    text = (tmp_path / "sbatch_4x8.sh").read_text()
    assert "#SBATCH --partition=h100\n" in text and "#SBATCH --account=lab-7\n" in text
    assert "PLACEHOLDER_PARTITION" not in text and "PLACEHOLDER_ACCOUNT" not in text
    assert f"#SBATCH --job-name=llama2-13b-fft-{HASH[:12]}\n" in text and "#SBATCH --time=36:30:00\n" in text
    assert 'RDZV_PORT="${RDZV_PORT:-29611}"' in text and "29611" in (tmp_path / "torchrun.sh").read_text()
    launch.bash_syntax_check(tmp_path / "sbatch_4x8.sh")


@pytest.mark.parametrize("opts,key", [({"partition": "gpu; rm -rf /"}, "launch.partition"),
                                      ({"master_port": 80}, "launch.master_port"),
                                      ({"nodes": 3}, "launch.nodes")])
def test_bad_launch_options_name_the_key(tmp_path, opts, key):
    with pytest.raises(ConfigError) as e:
        launch.write_artifacts(MODEL, CLUSTER, TRAINING, FSDP, tmp_path, study_hash=HASH, options=opts)
    assert e.value.key == key


def test_main_writes_artifacts_from_the_study_config(tmp_path, capsys):
    from trainplan.config import load_config
    from trainplan.provenance import config_hash

    cfg = load_config("config/config.yaml")
    summary = tmp_path / "summary.json"
    summary.write_text(json.dumps({"layout": FSDP.to_dict()}))
    rc = launch.main(["--summary", str(summary), "--config", "config/config.yaml", "--out", str(tmp_path / "o")])
    assert rc == 0, capsys.readouterr().err
    text = (tmp_path / "o" / launch.sbatch_name(cfg.cluster)).read_text()
    assert f"study hash: {config_hash(cfg.raw)}" in text
    assert f"--job-name={cfg.launch['job_name']}-" in text
    assert "accelerate_fsdp2.yaml" in capsys.readouterr().out


@pytest.mark.parametrize(("doc", "says"), [
    ({"layout": {**FSDP.to_dict(), "dp": 7}}, "dp·tp·pp·cp = 7·1·1·1 = 7, but the cluster has 32 GPUs"),
    ({"layout": {k: v for k, v in FSDP.to_dict().items() if k != "dp"}}, "needs its data-parallel degree dp"),
    ({"status": "no feasible layout", "layout": FSDP.to_dict()}, "summary.status='no feasible layout'"),
])
def test_a_summary_that_is_not_this_configs_is_refused(tmp_path, capsys, doc, says):
    """launch and preflight share load_inputs: a stale or hand-edited summary (another GPU count, a missing degree,
    no feasible layout) is a config error naming it, and nothing is written."""
    from trainplan.launch import preflight as pf

    summary = tmp_path / "summary.json"
    summary.write_text(json.dumps(doc))
    rc = launch.main(["--summary", str(summary), "--config", "config/config.yaml", "--out", str(tmp_path / "o")])
    assert rc == 2 and says in capsys.readouterr().err and not (tmp_path / "o").exists()
    rc = pf.main(["--summary", str(summary), "--config", "config/config.yaml", "--out", str(tmp_path / "p")])
    assert rc == 2 and says in capsys.readouterr().err and not (tmp_path / "p").exists()


def test_a_cost_or_production_file_named_on_purpose_must_be_usable(tmp_path, capsys):
    """The study's own cost.json/production.json are optional (the script reads them at run time); one passed with
    --cost/--production that holds no interval or throughput is bad input, not silently ignored."""
    summary, empty, listed = tmp_path / "summary.json", tmp_path / "empty.json", tmp_path / "list.json"
    summary.write_text(json.dumps({"layout": FSDP.to_dict()}))
    empty.write_text("{}")
    listed.write_text("[1, 2]")
    base = ["--summary", str(summary), "--config", "config/config.yaml", "--out", str(tmp_path / "o")]
    assert launch.main([*base, "--cost", str(empty)]) == 2
    assert "cost=" in capsys.readouterr().err and not (tmp_path / "o").exists()
    assert launch.main([*base, "--production", str(listed)]) == 2
    assert "production=" in capsys.readouterr().err
    assert launch.main(base) == 0  # neither named: the optional study files are looked up, and absent here


def test_main_takes_a_variant_overlay_after_its_base(tmp_path, capsys):
    """`trainplan launch --config config/config.yaml config/lora.yaml` merges them in order, as the study does
    (config/lora.yaml alone has no model); the day-1 preflight command names both, in that order."""
    from trainplan.config import load_config
    from trainplan.provenance import config_hash

    lora = load_config(["config/config.yaml", "config/lora.yaml"])
    summary = tmp_path / "summary.json"
    summary.write_text(json.dumps({"layout": FSDP.to_dict()}))
    argv = ["--summary", str(summary), "--config", "config/config.yaml", "config/lora.yaml", "--out", str(tmp_path / "o")]
    assert launch.main(argv) == 0, capsys.readouterr().err
    assert f"study hash: {config_hash(lora.raw)}" in (tmp_path / "o" / launch.sbatch_name(lora.cluster)).read_text()
    man = json.loads((tmp_path / "o" / "manifest.json").read_text())
    assert "--config config/config.yaml config/lora.yaml --device cuda" in man["day1"][0]["command"]
    capsys.readouterr()
    assert launch.main(["--summary", str(summary), "--config", "config/lora.yaml", "--out", str(tmp_path / "p")]) == 2
    assert "model=None" in capsys.readouterr().err


def test_qlora_deviation_quotes_the_plans_own_memory():
    """The QLoRA-as-LoRA note compares with the plan's modelled peak: the planner's Efficiency (memory_breakdown
    without one fell back to its own 4 GiB / 0.05 overhead assumptions: '70.0 GiB' where the plan says 71.6)."""
    from trainplan.model.efficiency import Efficiency

    m, c = resolve_model("llama2-13b"), ClusterSpec(nodes=4, gpus_per_node=8, gpu=resolve_gpu("h100-sxm-80gb"))
    t = TrainingSpec(seq_len=4096, global_batch=256, finetune="qlora")
    lay = Layout(dp=32, sharding="zero3", micro_batch=2)
    plan = memory_breakdown(m, c, t, lay, Efficiency.for_gpu(c.gpu))["total"] / 2**30
    assert f"against the plan's {plan:.1f} GiB" in launch.qlora_as_lora_note(m, c, t, lay)


def test_fp8_accelerate_config_is_one_accelerate_accepts():
    """Accelerate 1.16 refuses torchao FP8 with FSDP2's cpu_ram_efficient_loading (Accelerator.__init__ raises), so
    an FP8 plan's YAML turns it off; the bf16 plan keeps it (rank 0 loads, the others get the shards)."""
    import yaml

    m = resolve_model("llama2-13b")
    lay = Layout(dp=32, sharding="zero2")
    for precision, loading in (("fp8-tensorwise", False), ("bf16", True)):
        t = TrainingSpec(seq_len=4096, global_batch=256, precision=precision, kernels="compiled")
        cfg = yaml.safe_load(launch.accelerate_config(m, CLUSTER, t, lay, study_hash="abc123def456"))
        assert cfg["fsdp_config"]["fsdp_cpu_ram_efficient_loading"] is loading
        assert ("fp8_config" in cfg) is (precision != "bf16")
    text = launch.sbatch_script(m, CLUSTER, TrainingSpec(seq_len=4096, global_batch=256, precision="fp8-tensorwise"),
                                lay, study_hash="abc123def456")
    assert 'python -c "import torchao"' in text and "trainplan[fp8]" in text


def test_checkpoint_async_reaches_both_trainers():
    """cost.checkpoint_async (what the cost model charges) is what runs: train_entry's TRAINPLAN_CKPT_ASYNC and
    torchtitan's checkpoint.async_mode."""
    m, lay = resolve_model("llama2-13b"), Layout(dp=32, sharding="zero2")
    t = TrainingSpec(seq_len=4096, global_batch=256)
    for on in (True, False):
        sb = launch.sbatch_script(m, CLUSTER, t, lay, study_hash="abc123def456", checkpoint_async=on)
        assert f"export TRAINPLAN_CKPT_ASYNC={int(on)} " in sb
        settings, _ = trainers.torchtitan_settings(m, CLUSTER, t, lay, checkpoint_async=on)
        assert settings["checkpoint"]["async_mode"] == ("async" if on else "disabled")


def test_cost_and_production_files_set_the_checkpoint_interval_and_the_day1_threshold(tmp_path, capsys):
    """--cost's Young/Daly interval (hours) becomes seconds and, over the summary's predicted step time, the
    torchtitan checkpoint interval in steps in the manifest and the sbatch; --production's p10 (not its p90) is the
    tokens/s/GPU the day-1 throughput job must reach."""
    summary, cost, prod = tmp_path / "summary.json", tmp_path / "cost.json", tmp_path / "production.json"
    summary.write_text(json.dumps({"layout": FSDP.to_dict(), "estimate": {"step_time_s": 12.0}}))
    cost.write_text(json.dumps({"checkpoint_interval_h": 1.6}))
    prod.write_text(json.dumps({"chosen": {"tokens_per_s_per_gpu_p10": 4200.4, "tokens_per_s_per_gpu_p50": 4600.0,
                                           "tokens_per_s_per_gpu_p90": 5000.0}}))
    out = tmp_path / "o"
    rc = launch.main(["--summary", str(summary), "--config", "config/config.yaml", "--out", str(out),
                      "--cost", str(cost), "--production", str(prod)])
    assert rc == 0, capsys.readouterr().err
    trainer = json.loads((out / "manifest.json").read_text())["trainer"]
    assert trainer["checkpoint_interval_s"] == pytest.approx(5760.0) and trainer["checkpoint_interval_steps"] == 480
    sb = next(out.glob("sbatch_*.sh")).read_text()
    assert "CKPT_INTERVAL_S=5760\n" in sb and "CKPT_INTERVAL_STEPS=480\n" in sb
    assert "--min-tokens-per-s-per-gpu 4200 " in sb


def test_day1_nccl_threshold_is_the_bus_bandwidth_across_all_nodes():
    """What nccl-tests over every GPU must reach is what the plan assumes for that group: each node's rails (25 GB/s
    × 4 NICs), not one node's NVLink busbw, which a slower fabric could never show."""
    c = ClusterSpec(nodes=4, gpus_per_node=8, gpu="h100-sxm-80gb", nics_per_node=4, inter_busbw_Bps=25e9)
    assert launch.all_gpus_busbw(c)["busbw_GBps"] == 100.0


def test_stop_signal_comes_at_most_a_quarter_of_a_short_time_limit_early():
    """A 6-minute job is told to stop 90 s before its limit (a quarter of it), not the default 300 s."""
    sb = launch.sbatch_script(MODEL, CLUSTER, TRAINING, FSDP, study_hash=HASH, time_limit_h=0.1)
    assert "#SBATCH --signal=B:USR1@90\n" in sb


def test_hsdp_with_cp_shards_over_the_planned_group_in_accelerate():
    """HSDP over 8-GPU shard groups with cp=2: Accelerate shards over dp_shard × cp, so dp_shard is 4 (the group
    stays 8 GPUs, one node), with 4 replicas, and the degrees cover the 32 GPUs."""
    lay = Layout(dp=16, cp=2, sharding="hsdp", shard_group=8, micro_batch=1)
    text = launch.accelerate_config(MODEL, CLUSTER, TRAINING, lay, study_hash=HASH)
    par = yaml.safe_load(text)["parallelism_config"]
    assert (par["parallelism_config_dp_shard_size"], par["parallelism_config_dp_replicate_size"]) == (4, 4)
    assert par["parallelism_config_dp_shard_size"] * par["parallelism_config_cp_size"] == 8


def test_an_fp8_launch_scripts_its_loss_check_against_bf16(tmp_path):
    """The FP8 memo named a day-1 loss check (200 steps within 1% of bf16) that no command ran. Under Accelerate the
    sbatch gets a day1-loss-parity mode with a bf16 config beside the FP8 one (the same FSDP2 settings, Accelerate's
    own loader reads both); the manifest lists the check with its limits. Without FP8 none of it is written."""
    from accelerate.commands.config.config_args import load_config_from_file

    from trainplan.launch.ingest import LOSS_PARITY_MAX_REL, LOSS_PARITY_STEPS

    fp8 = replace(TRAINING, precision="fp8-tensorwise")
    lay = Layout(dp=32, sharding="zero2", micro_batch=1)
    out = tmp_path / "fp8"
    launch.write_artifacts(MODEL, CLUSTER, fp8, lay, out, study_hash=HASH, min_tokens_per_s_per_gpu=7000.0)
    main, ref = load_config_from_file(str(out / "accelerate_fsdp2.yaml")), \
        load_config_from_file(str(out / launch.ACCELERATE_BF16_FILE))
    assert str(main.mixed_precision) == "fp8" and str(ref.mixed_precision) == "bf16"
    assert main.fsdp_config == {**ref.fsdp_config, "fsdp_cpu_ram_efficient_loading": False}
    sb = (out / "sbatch_4x8.sh").read_text()
    launch.bash_syntax_check(out / "sbatch_4x8.sh")
    assert "day1-loss-parity)" in sb and f"STEPS={LOSS_PARITY_STEPS}" in sb
    assert f"ACCELERATE_NODE_BF16='exec accelerate launch --config_file \"$LAUNCH_DIR\"/{launch.ACCELERATE_BF16_FILE}" in sb
    man = json.loads((out / "manifest.json").read_text())
    check = next(d for d in man["day1"] if d["check"] == "FP8 loss parity")
    assert check["command"] == "sbatch --export=ALL,TRAINPLAN_MODE=day1-loss-parity sbatch_4x8.sh"
    assert (check["steps"], check["max_loss_rel"]) == (LOSS_PARITY_STEPS, LOSS_PARITY_MAX_REL)
    assert "--loss-parity" in check["passes_when"]
    assert [d["check"] for d in man["day1"]].index("FP8 loss parity") == 4  # after the checkpoint check
    out = tmp_path / "bf16"
    launch.write_artifacts(MODEL, CLUSTER, TRAINING, lay, out, study_hash=HASH)
    assert not (out / launch.ACCELERATE_BF16_FILE).exists()
    assert "day1-loss-parity" not in (out / "sbatch_4x8.sh").read_text()
    assert not any(d["check"] == "FP8 loss parity" for d in json.loads((out / "manifest.json").read_text())["day1"])
    # FP8 rowwise runs under torchtitan (its float8 converter): the same mode, the job module without the converter
    # as the reference (TRAINPLAN_PRECISION=bf16), no bf16 Accelerate config
    rowwise = replace(TRAINING, precision="fp8-rowwise")
    out = tmp_path / "rowwise"
    launch.write_artifacts(MODEL, CLUSTER, rowwise, lay, out, study_hash=HASH)
    man = json.loads((out / "manifest.json").read_text())
    assert man["trainer"]["chosen"] == "torchtitan" and not (out / launch.ACCELERATE_BF16_FILE).exists()
    check = next(d for d in man["day1"] if d["check"] == "FP8 loss parity")
    assert "--format torchtitan --loss-parity" in check["passes_when"] and "TRAINPLAN_PRECISION=bf16" in check["passes_when"]
    sb = (out / "sbatch_4x8.sh").read_text()
    assert "day1-loss-parity)" in sb and 'TRAINPLAN_PRECISION="$PREC"' in sb
    assert 'os.environ.get("TRAINPLAN_PRECISION", "fp8") != "bf16"' in (out / "trainplan_torchtitan.py").read_text()
    # FP8 tensorwise with TP runs under torchtitan, which has no tensorwise recipe: it trains bf16, so no FP8 check
    # (it would compare bf16 with bf16)
    tp = Layout(dp=16, tp=2, sp=True, sharding="zero2", micro_batch=1)
    out = tmp_path / "tensorwise-tp"
    launch.write_artifacts(MODEL, CLUSTER, fp8, tp, out, study_hash=HASH)
    man = json.loads((out / "manifest.json").read_text())
    assert man["trainer"]["chosen"] == "torchtitan" and not launch.runs_fp8(fp8, "torchtitan")
    assert not any(d["check"] == "FP8 loss parity" for d in man["day1"])
    sb = (out / "sbatch_4x8.sh").read_text()  # TRAINPLAN_TRAINER=accelerate still runs it in FP8: its mode stays
    assert "accelerate) ;;" in sb and "torchtitan) ;;" not in sb
