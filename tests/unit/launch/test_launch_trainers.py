"""The trainer the sbatch runs: torchtitan 0.3's own config parser accepts the generated job module (and builds
the same model), transformers builds the same model from model_config.json, the manifest names the trainer
and the day-1 commands."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

from trainplan.launch import artifacts as launch
from trainplan.launch import trainers
from trainplan.model.arch import resolve_model
from trainplan.model.hardware import ClusterSpec
from trainplan.model.layout import Layout, LayoutTable
from trainplan.model.training import TrainingSpec

MODEL = resolve_model("llama2-13b")
CLUSTER = ClusterSpec(nodes=4, gpus_per_node=8, gpu="h100-sxm-80gb")
TRAINING = TrainingSpec(seq_len=4096, global_batch=256)
HASH = "0123456789abcdef"
LAYOUTS = {
    "fsdp": Layout(dp=32, sharding="zero3", recompute="full", micro_batch=1),
    "hsdp_tp": Layout(dp=16, tp=2, sp=True, sharding="hsdp", shard_group=8, recompute="selective", micro_batch=1),
    "pp_interleaved": Layout(dp=8, pp=4, pp_schedule="interleaved", vpp=2, sharding="zero1", micro_batch=1),
    "cp": Layout(dp=16, cp=2, sharding="zero3", micro_batch=1),
    "ddp": Layout(dp=32, sharding="none", micro_batch=1),
}


def _parse_titan(out: Path, *overrides: str):
    pytest.importorskip("torchtitan")
    try:  # torchtitan 0.3's model registry imports triton, even on a CPU-only torch
        from torchtitan.config.manager import ConfigManager
        from torchtitan.models.llama3 import config_registry  # noqa: F401
    except ImportError as e:
        pytest.skip(f"torchtitan's llama3 registry does not import here: {e}")

    sys.path.insert(0, str(out))
    try:
        sys.modules.pop(trainers.TORCHTITAN_MODULE, None)
        return ConfigManager().parse_args(["--module", trainers.TORCHTITAN_MODULE, "--config",
                                           trainers.TORCHTITAN_CONFIG_FN, *overrides])
    finally:
        sys.path.remove(str(out))
        sys.modules.pop(trainers.TORCHTITAN_MODULE, None)


@pytest.mark.parametrize("name", list(LAYOUTS))
def test_torchtitan_config_manager_accepts_the_job_and_its_degrees_cover_the_cluster(tmp_path, name):
    layout = LAYOUTS[name]
    launch.write_artifacts(MODEL, CLUSTER, TRAINING, layout, tmp_path, study_hash=HASH,
                           checkpoint_interval_s=1.6 * 3600, step_time_s=12.0)
    cfg = _parse_titan(tmp_path, "--training.steps", "50")  # a CLI override on top, as the sbatch passes
    from torchtitan.distributed.parallel_dims import ParallelDims

    p = cfg.parallelism
    assert cfg.training.steps == 50 and cfg.training.seq_len == 4096 and cfg.training.global_batch_size == 256
    assert (p.tensor_parallel_degree, p.pipeline_parallel_degree, p.context_parallel_degree) == (
        layout.tp, layout.pp, layout.cp)
    dims = ParallelDims.from_config(p, CLUSTER.n_gpus)  # torchtitan's own world-size check
    assert dims.dp_replicate * dims.dp_shard * dims.cp * dims.tp * dims.pp == CLUSTER.n_gpus
    assert cfg.checkpoint.enable and cfg.checkpoint.interval == 480  # Young/Daly 1.6 h / 12 s per step
    assert cfg.optimizer.implementation == TRAINING.optimizer_impl == "fused"  # the AdamW kernels the plan timed
    if layout.sharding == "hsdp":
        assert (p.data_parallel_replicate_degree, p.data_parallel_shard_degree) == (2, 8)  # dp 16, groups of 8
    if layout.sharding == "none":
        assert (p.data_parallel_replicate_degree, p.data_parallel_shard_degree) == (32, 1)
    if layout.pp > 1:
        assert p.pipeline_parallel_schedule == "Interleaved1F1B" and p.pipeline_parallel_layers_per_stage == 5
        # the local batch is split into pipeline micro-batches: 256 / dp 8 = 32 of micro_batch 1
        assert cfg.training.local_batch_size == 32 and p.pipeline_parallel_microbatch_size == 1
    else:
        assert cfg.training.local_batch_size == layout.micro_batch
    ac = type(cfg.activation_checkpoint).__qualname__ if cfg.activation_checkpoint is not None else None
    assert ac == {"full": "FullAC.Config", "selective": "SelectiveAC.Config", "none": None}[layout.recompute]


def test_torchtitan_builds_the_planned_model_exactly(tmp_path):
    import torch

    launch.write_artifacts(MODEL, CLUSTER, TRAINING, LAYOUTS["pp_interleaved"], tmp_path, study_hash=HASH)
    cfg = _parse_titan(tmp_path)
    with torch.device("meta"):
        m = cfg.model_spec.model.build()
    assert sum(p.numel() for p in m.parameters()) == MODEL.n_params  # 13,015,864,320


def test_transformers_builds_the_same_model_from_model_config_json(tmp_path):
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM

    launch.write_artifacts(MODEL, CLUSTER, TRAINING, LAYOUTS["fsdp"], tmp_path, study_hash=HASH)
    cfg = AutoConfig.from_pretrained(str(tmp_path / "model_config.json"))
    with torch.device("meta"):
        m = AutoModelForCausalLM.from_config(cfg)
    assert type(m).__name__ == "LlamaForCausalLM"
    assert sum(p.numel() for p in m.parameters()) == MODEL.n_params
    assert resolve_model(str(tmp_path / "model_config.json")).n_params == MODEL.n_params


@pytest.mark.parametrize("name,trainer", [("fsdp", "accelerate"), ("ddp", "accelerate"), ("hsdp_tp", "torchtitan"),
                                          ("pp_interleaved", "torchtitan"), ("cp", "torchtitan")])
def test_manifest_names_the_trainer_the_sbatch_runs_and_the_day1_commands(tmp_path, name, trainer):
    launch.write_artifacts(MODEL, CLUSTER, TRAINING, LAYOUTS[name], tmp_path, study_hash=HASH,
                           min_tokens_per_s_per_gpu=4960.6)
    man = json.loads((tmp_path / "manifest.json").read_text())
    assert man["trainer"]["chosen"] == trainer and man["trainer"]["why"]
    sb = (tmp_path / "sbatch_4x8.sh").read_text()
    assert f'TRAINPLAN_TRAINER="${{TRAINPLAN_TRAINER:-{trainer}}}"' in sb
    assert "#SBATCH --requeue" in sb and "#SBATCH --signal=B:USR1@" in sb and 'scontrol requeue "$SLURM_JOB_ID"' in sb
    checks = {d["check"]: d["command"] for d in man["day1"]}
    assert checks["one-node preflight"].startswith("trainplan preflight ")
    assert checks["first 50 steps on all GPUs"] == "sbatch --export=ALL,TRAINPLAN_MODE=day1-throughput sbatch_4x8.sh"
    assert "TRAINPLAN_MODE=day1-checkpoint" in checks["save and restore one sharded (DCP) checkpoint"]
    # the p10 4,960.6 rounded, as the memo prints it; where the trainer deviates, times what runs' throughput ratio
    ratio = ((man["trainer"]["as_launched"] or {}).get("throughput_ratio") or 1.0)
    assert f"--min-tokens-per-s-per-gpu {round(4960.6 * ratio)}" in sb
    # DDP runs as FSDP2 ZeRO-2 (slower); the PP layout's ZeRO-1 runs as FSDP2 ZeRO-2 too, which under pipelining
    # gathers and reduces exactly as its ZeRO-1 (timing.fsdp_pipelined): the same speed
    assert (ratio != 1.0) == (name == "ddp")
    if "deepspeed_zero.json" in {a["filename"] for a in man["artifacts"]}:
        assert "reference only" in man["deepspeed"]


@pytest.mark.parametrize("name,layout,expect", [
    # what Accelerate runs as planned: no deviation listed; torchtitan's job attends with FlexAttention under
    # per-document masks (it refuses SDPA for language models) and runs its chunked loss, not the Hugging Face loss
    # the plan sizes, for every layout
    ("fsdp", LAYOUTS["fsdp"], []),
    ("hsdp tp", LAYOUTS["hsdp_tp"], ["attention: torchtitan 0.3.0 runs", "loss: torchtitan's ChunkedLossWrapper"]),
    # torchtitan 0.3 runs CP for its FlexAttention as a K/V all-gather, ring or Ulysses planned
    # (distributed/context_parallel/api.py); FSDP2's CPUOffloadPolicy is what the plan sizes for ZeRO-3 offload
    ("cp ring", LAYOUTS["cp"], ["attention:", "cp=2 (ring planned)", "loss:"]),
    ("ulysses offload", Layout(dp=16, tp=2, sp=True, cp=2, cp_kind="ulysses", sharding="zero3", offload="cpu",
                               micro_batch=1), ["attention:", "cp=2 (ulysses planned)", "loss:"]),
    # ZeRO-2 offload was planned optimizer-only (ZeRO-Offload); torchtitan moves parameters and gradients too
    ("zero2 offload", Layout(dp=16, tp=2, sp=True, sharding="zero2", offload="cpu", micro_batch=1),
     ["sharding=zero2", "attention:", "offload=cpu", "loss:"]),
    # Accelerate: the same for a pure data-parallel ZeRO-3 offload (as planned) and ZeRO-1 (not)
    ("fsdp offload", Layout(dp=32, sharding="zero3", offload="cpu", micro_batch=1), []),
    ("zero1 offload", Layout(dp=32, sharding="zero1", offload="cpu", micro_batch=1),
     ["no optimizer-only sharding", "offload=cpu"]),
    # Accelerate: selective recompute runs as full, DDP as FSDP2 without resharding
    ("selective", Layout(dp=32, sharding="zero3", recompute="selective", micro_batch=1), ["selective recompute"]),
    ("ddp", LAYOUTS["ddp"], ["unsharded DDP"]),
])
def test_manifest_and_sbatch_list_how_the_launch_differs_from_the_plan(tmp_path, name, layout, expect):
    launch.write_artifacts(MODEL, CLUSTER, TRAINING, layout, tmp_path, study_hash=HASH)
    man = json.loads((tmp_path / "manifest.json").read_text())
    got = man["trainer"]["deviations"]
    assert len(got) == len(expect) and all(e in g for e, g in zip(expect, got, strict=True)), got
    head = [ln for ln in (tmp_path / "sbatch_4x8.sh").read_text().splitlines() if ln.startswith("# NOTE:")]
    assert head == [f"# NOTE: {man['trainer']['chosen']} differs from the plan: {g}" for g in got]
    assert got == launch.plan_deviations(MODEL, CLUSTER, TRAINING, layout, man["trainer"]["chosen"])
    # the trainer's one-line reason does not call a Ulysses plan native
    assert ("all-gather CP; see deviations" in man["trainer"]["why"]) == (layout.cp > 1 and man["trainer"]["chosen"]
                                                                          == "torchtitan")


def test_only_deviations_are_listed_not_notes_that_explain_a_setting():
    # torchtitan's layers-per-stage rounding and TP without SP are notes, not deviations; ZeRO-2 on torchtitan is one,
    # and so are its FlexAttention and its chunked loss
    lay = Layout(dp=4, tp=2, pp=4, pp_schedule="interleaved", vpp=3, sharding="zero2", micro_batch=1)
    _, notes = trainers.torchtitan_settings(MODEL, CLUSTER, TRAINING, lay)
    assert any("not divisible" in n for n in notes)
    assert trainers.deviations(notes) == [n for n in notes if n.startswith(("sharding=zero2", "attention:", "loss:"))]
    assert len(trainers.deviations(notes)) == 3
    assert all(type(d) is str for d in trainers.deviations(notes))  # plain strings, JSON-ready
    # Accelerate: TP alone needs a tp_plan (a note); TP with SP runs without SP (a deviation)
    no_sp = launch._accelerate_parts(CLUSTER, TRAINING, Layout(dp=16, tp=2, sharding="zero3", micro_batch=1))[2]
    with_sp = launch._accelerate_parts(CLUSTER, TRAINING, Layout(dp=16, tp=2, sp=True, sharding="zero3",
                                                                 micro_batch=1))[2]
    assert trainers.deviations(no_sp) == [] and any("tp_plan" in n for n in no_sp)
    assert len(trainers.deviations(with_sp)) == 1 and "without SP" in trainers.deviations(with_sp)[0]


def test_layouts_torchtitan_cannot_build_say_why(tmp_path):
    from dataclasses import replace

    gelu = replace(MODEL, mlp="gelu", norm="layernorm", name="neox-like")
    launch.write_artifacts(gelu, CLUSTER, TRAINING, LAYOUTS["hsdp_tp"], tmp_path, study_hash=HASH)
    man = json.loads((tmp_path / "manifest.json").read_text())
    assert not (tmp_path / "trainplan_torchtitan.py").exists() and "SwiGLU" in man["trainer"]["torchtitan"]
    assert man["trainer"]["chosen"] == "accelerate" and "cannot build this model" in man["trainer"]["why"]
    assert "mlp=gelu" in man["trainer"]["hf_model_config"] and not (tmp_path / "model_config.json").exists()
    sb = (tmp_path / "sbatch_4x8.sh").read_text()
    assert "no torchtitan job for this layout" in sb


def test_checkpoint_interval_and_steps():
    assert trainers.checkpoint_interval_steps(5760.0, 12.0) == 480
    assert trainers.checkpoint_interval_steps(None, 12.0) == 500  # no cost.json: torchtitan's default
    assert trainers.total_steps(TRAINING) == 9537  # 10e9 tokens / (256 x 4096)


def test_torchtitan_trainer_cannot_start_on_a_cpu_only_torch():
    """Why the torchtitan path is validated by its parser and not run here: its device falls back to cuda."""
    import torch

    pytest.importorskip("torchtitan")
    if torch.cuda.is_available():
        pytest.skip("a CUDA build: torchtitan can run")
    from torchtitan.tools import utils

    assert utils.device_type == "cuda"  # no accelerator → 'cuda' anyway (tools/utils.get_device_info)
    with pytest.raises((AttributeError, AssertionError, RuntimeError)):
        utils.device_module.set_device(torch.device("cuda", 0))  # what Trainer.__init__ does first


def test_day1_ingest_runs_from_the_project_root_and_reads_what_the_trainer_writes(tmp_path):
    """The flow-back command writes data/calibration/gpu/ (project root) and so names the study's launch folder for
    its input (it named the run folder relative to the launch folder); a torchtitan job writes no steps.jsonl, so its
    command ingests the console log with the flags such a log lacks."""
    from trainplan.launch.artifacts import day1_commands

    acc = day1_commands(CLUSTER, trainer="accelerate", summary_path="results/lora/analytic/summary.json",
                        study_hash=HASH)
    back = next(d for d in acc if d["check"] == "measurements flow back")["command"]
    assert back.startswith(f"trainplan ingest results/lora/launch/run-{HASH[:12]}/day1-throughput-<job>/steps.jsonl")
    assert back.endswith("--out data/calibration/gpu/day1-production.json")
    seq8k = Layout(dp=16, cp=2, sharding="zero2", micro_batch=1)
    launch.write_artifacts(MODEL, CLUSTER, TRAINING, seq8k, tmp_path, study_hash=HASH,
                           summary_path="results/seq8k/analytic/summary.json")
    man = json.loads((tmp_path / "manifest.json").read_text())
    assert man["trainer"]["chosen"] == "torchtitan"
    back = next(d for d in man["day1"] if d["check"] == "measurements flow back")["command"]
    assert back.startswith("trainplan ingest results/seq8k/launch/<job name>-<job>.out --format torchtitan --model ")
    assert f"--seq-len {TRAINING.seq_len} --global-batch {TRAINING.global_batch} --world-size 32" in back
    assert '"cp": 2' in back and "steps.jsonl" not in json.dumps(man["day1"])


def test_the_plan_sizes_the_norms_of_the_trainer_that_runs_each_layout():
    """memory.hf_norms (Hugging Face's fp32-upcast RMSNorm, eager kernels) is true exactly where choose_trainer picks
    Accelerate: pure data parallelism, a fine-tune or model torchtitan's job cannot build (LoRA; biased linears), and
    not FP8 rowwise (torchtitan). Elsewhere torchtitan runs its own fused nn.RMSNorm and the plan sizes that. Both
    read layout.torchtitan_launch; the trainer each case should get is written out here, from the launch's rules."""
    from dataclasses import replace

    from trainplan.model import memory

    biased = replace(resolve_model("llama2-13b"), name="biased", bias="all")
    layouts = [Layout(dp=32, sharding=s, micro_batch=1) for s in ("none", "zero2", "zero3")] + [
        Layout(dp=16, tp=2, sp=True, sharding="zero2", micro_batch=1),
        Layout(dp=16, tp=2, sp=True, tp_overlap=True, sharding="zero3", micro_batch=1),
        Layout(dp=8, pp=4, sharding="zero1", micro_batch=1), Layout(dp=16, cp=2, sharding="zero3", micro_batch=1)]
    table = LayoutTable.from_layouts(layouts)
    seen = set()
    for model in (MODEL, biased):
        for extra in ({}, {"finetune": "lora"}, {"precision": "fp8-rowwise"}, {"precision": "fp8-tensorwise"},
                      {"kernels": "compiled"}, {"precision": "fp8-tensorwise", "kernels": "compiled"},
                      {"kernels": "fused"}):
            t = replace(TRAINING, **extra)
            buildable = model is MODEL and t.finetune == "full"
            for i, lay in enumerate(layouts):
                parallel = lay.tp > 1 or lay.pp > 1 or lay.cp > 1
                titan = buildable and (parallel or (t.fp8 != "tensorwise" and t.kernels == "compiled")
                                       or t.fp8 == "rowwise")
                assert trainers.choose_trainer(model, t, lay)[0] == ("torchtitan" if titan else "accelerate"), \
                    (model.name, extra, lay.describe())
                hf = bool(memory.hf_norms(model, t, lay))
                assert hf == (not titan and t.kernels == "eager"), (model.name, extra, lay.describe())
                assert bool(memory.hf_norms(model, t, table)[i]) == hf  # vectorised over the search's table alike
                seen.add(hf)
    assert seen == {True, False}


@pytest.mark.parametrize("attn,named", [({"attn_kernel": "fa2"}, "SDPA flash attention (FlashAttention-2)"),
                                        ({"attn_kernel": "cudnn"}, "SDPA flash attention (cuDNN)"),
                                        ({"attn_impl": "math"}, "materialised (math) attention")])
def test_torchtitan_launches_say_they_attend_with_flex_attention(attn, named):
    """torchtitan 0.3 refuses SDPA for language models (get_attention_config), so every torchtitan launch runs
    FlexAttention under per-document masks: a deviation naming the plan's own attention, timed as the plan (no field
    changes, nothing unmodelled: masks only remove work, and FlexAttention's rate is the GPU benchmark's to measure).
    An Accelerate launch (Transformers' SDPA, one causal mask) lists none."""
    from dataclasses import replace

    tr = replace(TRAINING, **attn)
    titan = trainers.torchtitan_settings(MODEL, CLUSTER, tr, LAYOUTS["hsdp_tp"])[1]
    att = [d for d in titan if isinstance(d, trainers.Deviation) and d.startswith("attention:")]
    assert len(att) == 1 and att[0].short == "FlexAttention with per-document masks"
    assert f"not the plan's {named} over one causal mask" in att[0]
    assert (att[0].layout, att[0].training, att[0].unmodelled, att[0].extra_bytes) == ({}, {}, (), 0.0)
    assert not att[0].memory_only and not att[0].cannot_run
    ran = launch.as_launched(MODEL, CLUSTER, tr, LAYOUTS["hsdp_tp"], "torchtitan")
    assert "FlexAttention with per-document masks" in ran["changes"] and "step time" not in ran["unmodelled"]
    assert ran["throughput_ratio"] == pytest.approx(1.0)
    assert trainers.choose_trainer(MODEL, tr, LAYOUTS["fsdp"])[0] == "accelerate"
    assert not any("FlexAttention" in d for d in launch.plan_deviations(MODEL, CLUSTER, tr, LAYOUTS["fsdp"], "accelerate"))
