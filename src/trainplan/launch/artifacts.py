"""Launch artifacts for the production run, generated from the chosen layout.

From a :class:`~trainplan.model.layout.Layout` (plus model, cluster and training specs) this writes, under one
output directory:

* ``sbatch_{nodes}x{gpus}.sh`` -- the Slurm batch script. It runs **one** existing trainer, the one
  :func:`trainplan.launch.trainers.choose_trainer` picks (torchtitan for pp/tp/cp/compiled layouts, else Accelerate +
  Transformers through :mod:`trainplan.train_entry`); ``#SBATCH --requeue`` and ``--signal=B:USR1@lead``: told to
  stop, it has the trainer checkpoint and requeues itself; ``TRAINPLAN_MODE=day1-throughput|day1-checkpoint``
  are the memo's day-1 checks; one ``srun`` task per node, rendezvous on the first host, NCCL settings each with a
  comment, placeholders marked ``PLACEHOLDER``;
* ``trainplan_torchtitan.py`` -- a torchtitan 0.3 job (``config_registry`` module; torchtitan's Llama 3 decoder
  at the model's shapes, the layout's parallelism, DCP checkpoints at the Young/Daly interval), when the model
  is one torchtitan's llama3 can build (the manifest says why not otherwise);
* ``accelerate_fsdp2.yaml`` -- an Accelerate (1.x) config: FSDP2, reshard-after-forward, auto-wrap of the
  decoder layer class, activation checkpointing, bf16, ``SHARDED_STATE_DICT`` (DCP), and HSDP/TP/CP through
  Accelerate's ``parallelism_config`` where it can express them (what it cannot is said in a comment);
* ``model_config.json`` -- the model as a transformers ``LlamaConfig`` (the entry point's random init);
* ``torchrun.sh`` -- the per-node ``torchrun`` command of the entry point with a c10d rendezvous;
* ``deepspeed_zero.json`` -- reference only, when the layout is DeepSpeed-expressible (pure DP + ZeRO 0-3);
* ``manifest.json`` -- the artifacts with a ``short`` flag (short ones are inlined in the memo), ``trainer``
  (chosen, why, ``deviations``: how what it runs differs from the planned layout, the launch lines, checkpoint
  interval) and ``day1`` (the day-1 checks as commands).

Every file's header carries the study hash. Config values reach shell text only through ``shlex.quote``;
comment text is stripped of line breaks so a value cannot escape its comment.
"""

from __future__ import annotations

import argparse
import json
import shlex
import subprocess
import sys
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, replace
from pathlib import Path, PurePosixPath
from typing import Any

import numpy as np
import yaml

from trainplan import __version__
from trainplan.config import load_config
from trainplan.cost.budget import duration_text
from trainplan.io import InputFileError, read_json, read_json_checked, write_json, write_text
from trainplan.launch.ingest import LOSS_PARITY_MAX_REL, LOSS_PARITY_STEPS
from trainplan.launch.trainers import (
    TORCHTITAN_CONFIG_FN,
    TORCHTITAN_MODULE,
    UNMODELLED_KINDS,
    Deviation,
    checkpoint_interval_steps,
    choose_trainer,
    deviations,
    offload_note,
    torchtitan_job_module,
    torchtitan_model_problems,
    torchtitan_settings,
    total_steps,
)
from trainplan.model import comm
from trainplan.model.arch import MODEL_PRESETS, ModelSpec, hf_config_dict, hf_unsupported_reason
from trainplan.model.base import ConfigError
from trainplan.model.hardware import ClusterSpec
from trainplan.model.layout import Layout, LayoutTable, check_layout, grad_accum
from trainplan.model.memory import memory_breakdown
from trainplan.model.timing import step_time
from trainplan.model.training import TrainingSpec
from trainplan.provenance import study_hash
from trainplan.proxy.torchrun import ALLOC_CONF
from trainplan.search.layouts import (
    LAUNCH_AS,
    LAUNCH_AS_MISFIT,
    LAUNCH_NO_RUN,
    LAUNCH_TPS_RATIO,
    LAUNCH_TPS_WHY,
    LAUNCH_UNTIMED,
    describe_rows,
    refit_as_launched,
    search,
)

__all__ = ["Artifact", "DEEPSPEED_DOCUMENTED_KEYS", "accelerate_config", "as_launched", "bash_syntax_check",
           "cannot_run_mask", "runs_as_mask", "deepspeed_config", "deepspeed_unsupported_reason", "entry_finetune", "launch_judge", "launched_peak", "launched_speed", "main", "peak_as_launched", "plan_search",
           "plan_deviations",
           "qlora_as_lora_note", "sbatch_name", "sbatch_script",
           "sbatch_test_only", "torchrun_command", "torchrun_script", "write_artifacts"]

DECODER_LAYER_CLS = "LlamaDecoderLayer"  # transformers' Llama block; FSDP2 wraps one unit per layer
DEFAULT_TRAIN_SCRIPT = None  # None: ``-m trainplan.train_entry`` (the thin entry point); or a script path
ENTRY_MODULE = "trainplan.train_entry"
RDZV_PORT = 29500  # torchrun's default c10d port
DAY1_THROUGHPUT_STEPS = 50  # the day-1 throughput job's steps (sbatch TRAINPLAN_MODE=day1-throughput; memo, manifest)
ACCELERATE_BF16_FILE = "accelerate_fsdp2_bf16.yaml"  # the FP8 day-1 loss check's bf16 reference run
LAUNCH_OPTIONS = frozenset({"job_name", "partition", "account", "time_limit_h", "master_port"})
SHORT_MAX_LINES = 45  # artifacts up to this many lines are inlined in the memo; longer ones attached

# Top-level and zero_optimization keys as documented at https://www.deepspeed.ai/docs/config-json/ and
# defined in deepspeed/runtime/constants.py and deepspeed/runtime/zero/config.py (DeepSpeed 0.19).
DEEPSPEED_DOCUMENTED_KEYS: dict[str, frozenset[str]] = {
    "": frozenset({"train_batch_size", "train_micro_batch_size_per_gpu", "gradient_accumulation_steps",
                   "bf16", "fp16", "zero_optimization", "gradient_clipping", "steps_per_print",
                   "wall_clock_breakdown", "optimizer", "scheduler", "activation_checkpointing",
                   "communication_data_type", "prescale_gradients", "zero_allow_untested_optimizer"}),
    "zero_optimization": frozenset({"stage", "overlap_comm", "contiguous_gradients", "reduce_bucket_size",
                                    "allgather_bucket_size", "reduce_scatter", "allgather_partitions",
                                    "stage3_prefetch_bucket_size", "stage3_param_persistence_threshold",
                                    "stage3_max_live_parameters", "stage3_max_reuse_distance",
                                    "stage3_gather_16bit_weights_on_model_save", "offload_optimizer",
                                    "offload_param", "sub_group_size"}),
    "offload_optimizer": frozenset({"device", "pin_memory", "nvme_path", "buffer_count", "fast_init"}),
    "bf16": frozenset({"enabled"}),
}


@dataclass(frozen=True)
class Artifact:
    """One generated file: its name, whether it is short enough to inline in the memo, what it is."""

    filename: str
    short: bool
    description: str


# ------------------------------------------------------------------------------------------ helpers
def _one_line(s: object) -> str:
    """Text safe inside a '#' comment: no line breaks or control characters."""
    return "".join(c if c.isprintable() else " " for c in str(s))


def _header(title: str, study_hash: str, model: ModelSpec, cluster: ClusterSpec, layout: Layout,
            notes: Sequence[str] = ()) -> str:
    lines = [f"trainplan launch artifact: {title}",
             f"study hash: {study_hash}",
             f"model {model.name} ({model.n_params:,} params) on {cluster.nodes} nodes x "
             f"{cluster.gpus_per_node} {cluster.gpu.name}",
             f"layout: {layout.describe()}",
             f"generated by trainplan {__version__}; change the config and regenerate rather than edit"]
    lines += [f"NOTE: {n}" for n in notes]
    return "\n".join("# " + _one_line(x) for x in lines)


def _check_hash(study_hash: str) -> str:
    if not isinstance(study_hash, str) or not study_hash or not all(c.isalnum() for c in study_hash):
        raise ConfigError("study_hash", study_hash, "a non-empty alphanumeric hash (e.g. provenance.config_hash)")
    return study_hash


def _slurm_word(v: object) -> bool:
    """A value safe on an #SBATCH line (Slurm parses those itself, not the shell)."""
    return isinstance(v, str) and bool(v) and all(c.isascii() and (c.isalnum() or c in "._-") for c in v)


def sbatch_name(cluster: ClusterSpec) -> str:
    """File name of the batch script: ``sbatch_{nodes}x{gpus_per_node}.sh``."""
    return f"sbatch_{cluster.nodes}x{cluster.gpus_per_node}.sh"


# ------------------------------------------------------------------------------------- Accelerate
def _accelerate_parts(cluster: ClusterSpec, training: TrainingSpec, layout: Layout
                      ) -> tuple[dict[str, Any], dict[str, Any], list[str]]:
    """(fsdp_config, parallelism_config, notes) for Accelerate 1.x; notes say what cannot be expressed."""
    L, notes = layout, []
    fsdp: dict[str, Any] = {
        "fsdp_version": 2,
        "fsdp_auto_wrap_policy": "TRANSFORMER_BASED_WRAP",
        "fsdp_transformer_layer_cls_to_wrap": DECODER_LAYER_CLS,
        "fsdp_reshard_after_forward": L.sharding in ("zero3", "hsdp"),
        "fsdp_activation_checkpointing": L.recompute != "none",
        "fsdp_offload_params": L.offload == "cpu",
        "fsdp_state_dict_type": "SHARDED_STATE_DICT",
        # Accelerate refuses torchao FP8 with FSDP2's cpu_ram_efficient_loading (1.16 Accelerator.__init__)
        "fsdp_cpu_ram_efficient_loading": not training.fp8,
        "fsdp_sync_module_states": True,
    }
    alone = L.dp * L.cp == 1  # one data-parallel rank: FSDP2 shards nothing, so it runs what was planned

    def mark(text: str) -> str:  # what FSDP2 runs for ZeRO-1 and DDP: ZeRO-2 (gradients and optimizer sharded)
        return text if alone else Deviation(text, short=f"FSDP2 ZeRO-2 for {'DDP' if L.sharding == 'none' else 'ZeRO-1'}",
                                            layout={"sharding": "zero2"})

    if L.sharding == "zero1":
        notes.append(mark("FSDP2 has no optimizer-only sharding (ZeRO-1); reshard_after_forward=false (ZeRO-2 "
                          "equivalent) is used, which holds no more memory than ZeRO-1"))
    if L.sharding == "none":
        notes.append(mark("the layout is unsharded DDP; FSDP2 is emitted with reshard_after_forward=false "
                          "(gradients and optimizer sharded), which holds less memory than DDP"
                          + ("; over one rank it shards nothing: the same as the plan" if alone else "")))
    if L.recompute == "selective":
        notes.append(Deviation("Accelerate's FSDP activation checkpointing recomputes whole decoder layers (full); "
                               "the planned selective recompute needs the model's own checkpoint wrapper",
                               short="full recompute for selective", layout={"recompute": "full"}))
    if L.offload == "cpu":
        notes.append(offload_note("fsdp_offload_params", L.sharding))
    if training.precision == "fp32":
        notes.append(f"training.precision={training.precision}: mixed_precision is 'no'")
    elif training.fp8 == "tensorwise":
        notes.append("training.precision=fp8-tensorwise: mixed_precision fp8 with fp8_config backend AO (torchao "
                     "Float8Linear, its default recipe is tensorwise dynamic scaling)")
    elif training.fp8 == "rowwise":
        notes.append(Deviation("training.precision=fp8-rowwise: Accelerate's config file cannot select torchao's "
                               "rowwise recipe (AO backend = tensorwise); the torchtitan job carries it (float8 "
                               "converter, rowwise); this config trains in bf16", short="bf16 for FP8 rowwise",
                               training={"precision": "bf16"}))
    par: dict[str, Any] = {}
    replicas = L.dp
    shard = L.dp
    if L.sharding == "hsdp":
        g = L.shard_group or cluster.gpus_per_node
        if g % L.cp:
            notes.append(Deviation(f"hsdp shard_group={g} is not a multiple of cp={L.cp}; Accelerate shards over "
                                   "dp_shard x cp, so the shard group is rounded to whole cp groups",
                                   short="HSDP shard group rounded to whole cp groups",
                                   unmodelled=("memory", "step time")))
        shard = max(1, g // L.cp)
        replicas = max(1, L.dp // shard)
    else:
        replicas = 1
    if L.sharding == "hsdp" or L.tp > 1 or L.cp > 1:
        par = {"parallelism_config_dp_replicate_size": replicas,
               "parallelism_config_dp_shard_size": shard,
               "parallelism_config_tp_size": L.tp,
               "parallelism_config_cp_size": L.cp}
        if L.cp > 1:
            par["parallelism_config_cp_comm_strategy"] = "allgather" if L.cp_kind == "ring" else "alltoall"
    if L.tp > 1:
        note = "TP in Accelerate uses the model's transformers tp_plan (needs a transformers model)"
        notes.append(Deviation(note + "; Megatron-style sequence parallelism is not configurable there, so TP "
                               "runs without SP", short="TP without SP", layout={"sp": False}) if L.sp else note)
    if L.cp > 1 and L.cp_kind == "ulysses":
        notes.append(Deviation("Ulysses CP exists in Accelerate only with the DeepSpeed backend; torch CP "
                               "(all-to-all rotation) is emitted instead", short="torch ring CP for Ulysses",
                               layout={"cp_kind": "ring"}))
    if L.pp > 1:
        notes.append(Deviation(f"pp={L.pp} is not expressible in Accelerate 1.x (no pipeline-parallel training "
                               "with FSDP2); use torchtitan or Megatron for this layout. The config covers dp/tp/cp "
                               "only", short=f"no pp={L.pp}: Accelerate cannot run it", unmodelled=("memory", "step time"),
                               cannot_run=True))
    return fsdp, par, notes


def plan_deviations(model: ModelSpec, cluster: ClusterSpec, training: TrainingSpec, layout: Layout,
                    trainer: str, *, sized: bool = True) -> list[Deviation]:
    """How what ``trainer`` (:func:`choose_trainer`'s pick) runs differs from the planned layout: its
    :class:`~trainplan.launch.trainers.Deviation` notes (empty when it runs the plan as planned). ``sized=False``:
    the QLoRA note without the memory figures in its text (two memory models per layout; :func:`launched_speed`
    needs only its field change)."""
    out = _trainer_deviations(model, cluster, training, layout, trainer)
    if trainer != "torchtitan" and training.finetune == "qlora":
        out.append(qlora_as_lora_note(model, cluster, training, layout) if sized else _qlora_as_lora(QLORA_AS_LORA))
    return out


def _trainer_deviations(model: ModelSpec, cluster: ClusterSpec, training: TrainingSpec, layout: Layout,
                        trainer: str) -> list[Deviation]:
    """:func:`plan_deviations` but for the fine-tune's (QLoRA as LoRA, the same for every layout, and the one that
    sizes memory): the trainer's own settings, all a layout's field changes come from."""
    if trainer == "torchtitan":
        return [n for n in torchtitan_settings(model, cluster, training, layout)[1] if isinstance(n, Deviation)]
    return [n for n in _accelerate_parts(cluster, training, layout)[2] if isinstance(n, Deviation)]


def as_launched(model: ModelSpec, cluster: ClusterSpec, training: TrainingSpec, layout: Layout, trainer: str,
                eff: Any = None, *, step: bool = True) -> dict[str, Any] | None:
    """What the launch runs, judged by the same models as the plan; None when it runs the plan as planned.

    The deviations' field changes applied to the planned layout and training give the run the planner can model;
    its peak memory (plus the bytes the planner has no term for) over the plan's is ``memory_ratio``, the plan's
    step time over its step time is ``throughput_ratio``. Ratios, not figures: the plan's p10/estimate/p90 come
    from the model's errors, and times a ratio they are the launch's (the memo's page 1, the day-1 thresholds,
    the preflight's headroom verdict). A ratio is None where a deviation has no model (``unmodelled``): the
    plan's figure stays and the caller says so. ``step=False`` sizes the memory only (``throughput_ratio`` stays None,
    not judged): the search's walk over the candidates (:func:`launched_peak`)."""
    devs = plan_deviations(model, cluster, training, layout, trainer)
    if not devs:
        return None
    unmodelled = sorted({u for d in devs for u in d.unmodelled}, key=UNMODELLED_KINDS.index)
    lay_changes = {k: v for d in devs for k, v in d.layout.items() if getattr(layout, k) != v}
    tr_changes = {k: v for d in devs for k, v in d.training.items() if getattr(training, k) != v}
    extra = sum(d.extra_bytes for d in devs)
    out: dict[str, Any] = {"trainer": trainer, "changes": [d.short for d in devs],
                           "layout_changes": lay_changes, "training_changes": tr_changes,
                           "extra_gib": extra / 2**30, "unmodelled": unmodelled, "layout": None,
                           "memory_ratio": None, "throughput_ratio": None,
                           "cannot_run": [d.short for d in devs if d.cannot_run]}
    try:
        run_layout, run_training = replace(layout, **lay_changes), replace(training, **tr_changes)
        check_layout(model, cluster, run_training, run_layout)
    except ConfigError as e:  # the changes make a layout the planner refuses: nothing about it is modelled
        out["unmodelled"] = list(UNMODELLED_KINDS)
        out["why_unmodelled"] = f"what runs is not a layout the planner accepts ({e})"
        return out
    out["layout"] = run_layout.describe()
    if "memory" not in unmodelled:
        planned = float(memory_breakdown(model, cluster, training, layout, eff)["total"])
        ran = float(memory_breakdown(model, cluster, run_training, run_layout, eff)["total"]) + extra
        out["memory_ratio"] = ran / planned
    if step and "step time" not in unmodelled:
        planned_s = float(step_time(model, cluster, training, layout, eff)["step_time_s"])
        ran_s = float(step_time(model, cluster, run_training, run_layout, eff)["step_time_s"])
        out["throughput_ratio"] = planned_s / ran_s
    return out


def launch_judge(model: ModelSpec, cluster: ClusterSpec, training: TrainingSpec,
                 eff: Any = None) -> Callable[..., dict[str, Any] | None]:
    """``judge(layout, step=True)``: :func:`as_launched` for any layout of the study, under the trainer the launch
    would pick for it (:func:`~trainplan.launch.trainers.choose_trainer`). What the day-1 switch is judged by
    (``report.memo.fit_fallback``): a layout the search names for the launch to run is sized as it runs."""

    def judge(layout: Layout, step: bool = True) -> dict[str, Any] | None:
        trainer = choose_trainer(model, training, layout)[0]
        return as_launched(model, cluster, training, layout, trainer, eff, step=step)

    return judge


def peak_as_launched(launched: Mapping[str, Any] | None, planned: float) -> float | None:
    """The modelled peak of what the launch runs, in ``planned``'s units, from the layout's :func:`as_launched`
    result (``launched``) and its planned peak: the plan's where it runs the plan (None result), None where the
    trainer cannot run it or what it runs has no memory model. The one "peak as launched" of the study: the search's
    refit (:func:`launched_peak`), page 1 and the day-1 switch (``report.memo``), the preflight's headroom verdict
    (``launch.preflight.production_peak_of``); each caller says what it does where it is None."""
    if launched is None:
        return float(planned)
    if launched["cannot_run"] or launched["memory_ratio"] is None:
        return None
    return float(planned) * float(launched["memory_ratio"])


def launched_peak(judge: Callable[..., dict[str, Any] | None]) -> Callable[[Any], tuple[float | None, str, bool]]:
    """``peak_of(row)`` for ``search.layouts.refit_as_launched``: :func:`peak_as_launched` (GiB) for a candidates
    row's layout (``judge``: :func:`launch_judge`; None where what runs has no memory model: the refit keeps the
    plan's verdict), a few words on how the launch differs, and whether the trainer can run it at all."""

    def peak_of(row: Any) -> tuple[float | None, str, bool]:
        a = judge(Layout.from_row(row), step=False)
        peak = peak_as_launched(a, float(row["mem_total_gib"]))
        if a is None:
            return peak, "", True
        if a["cannot_run"]:
            return None, f"{a['trainer']}: " + "; ".join(a["cannot_run"]), False
        return peak, f"{a['trainer']}: " + "; ".join(a["changes"]), True

    return peak_of


def cannot_run_mask(model: ModelSpec, training: TrainingSpec, df: Any) -> tuple[Any, str]:
    """(rows of ``df`` the launch cannot run, the trainer's words for why), decided per table without sizing a row:
    where torchtitan cannot build the model (a LoRA or QLoRA plan, a non-Llama block), the sbatch runs Accelerate,
    which has no pipeline parallelism, so every pp > 1 layout. The same verdict :func:`as_launched` reaches one
    layout at a time (its ``cannot_run``); :func:`plan_search` rules them out before its walk, so that a family of
    such layouts is not sized row by row."""
    titan_no = torchtitan_model_problems(model, training)
    mask = (df["pp"] > 1) if titan_no else (df["pp"] < 0)
    return mask, "accelerate: no pipeline parallelism in Accelerate (torchtitan cannot build this model: " + "; ".join(titan_no) + ")"


# the Layout fields a trainer's layout changes depend on (which trainer runs it, what it has no setting for)
_RENAME_FIELDS = ["dp", "tp", "pp", "cp", "sp", "cp_kind", "tp_overlap", "sharding", "recompute"]


def _group_reps(df: Any, fields: list[str]) -> tuple[Any, list[dict[str, Any]], list[Any]]:
    """(each row's group by ``fields``, numbered in order of first appearance; the first row of each group, in that
    order, as a dict; each group's row positions): the verdicts taken once per group of rows the trainers'
    deviations cannot tell apart. Dicts and position lists, not a Series and a mask per group: FP8's 5,500 groups
    over 33,000 rows cost 4 s that way."""
    groups = df.groupby(fields, sort=False, dropna=False).ngroup().to_numpy()
    reps = df.loc[df[fields].drop_duplicates().index].to_dict("records")
    order = np.argsort(groups, kind="stable")
    bounds = np.searchsorted(groups[order], np.arange(len(reps) + 1))
    return groups, reps, [order[bounds[g]:bounds[g + 1]] for g in range(len(reps))]


def runs_as_mask(model: ModelSpec, cluster: ClusterSpec, training: TrainingSpec, df: Any) -> tuple[Any, Any]:
    """(rows of ``df`` the launch runs as another row's layout, the reason of each): both trainers run ZeRO-1 as
    FSDP2's ZeRO-2 (reshard_after_forward off) and Accelerate runs DDP as ZeRO-2 too; Accelerate recomputes whole
    layers for selective, runs TP without SP and ring CP for Ulysses. Such a row is not what runs; the row it runs
    as is, so the row is ruled out (``launched as <layout> (trainer: changes)``) and the one that runs is ranked on
    its own figures. A renamed layout the search did not list keeps its row, judged as launched.

    The changes are the trainer's own deviations (:func:`plan_deviations`' ``layout``), taken once per combination
    of the fields they depend on (``_RENAME_FIELDS``; a test checks the verdict against :func:`as_launched` row by
    row), so the whole table costs a few hundred calls, not one per row. Only feasible rows are marked (the others
    are out already); the layout a row runs as may itself not fit (then its reason follows)."""
    groups, reps, _ = _group_reps(df, _RENAME_FIELDS)
    changes: dict[int, tuple[dict[str, Any], str]] = {}
    for g, rep in enumerate(reps):
        lay = Layout.from_row(rep)
        trainer = choose_trainer(model, training, lay)[0]
        devs = [d for d in _trainer_deviations(model, cluster, training, lay, trainer)
                if any(getattr(lay, k) != v for k, v in d.layout.items())]
        if devs:
            changes[g] = ({k: v for d in devs for k, v in d.layout.items()},
                          f"{trainer}: " + "; ".join(d.short for d in devs))
    mask = np.zeros(len(df), dtype=bool)
    why = np.full(len(df), "", dtype=object)
    renamed = np.isin(groups, list(changes)) & df["feasible"].to_numpy(dtype=bool)  # what the refit rules out
    if renamed.any():
        idx = np.flatnonzero(renamed)
        run = df.iloc[idx].copy()
        sub = groups[idx]
        for g, (ch, how) in changes.items():
            rows = sub == g
            for k, v in ch.items():
                run.loc[run.index[rows], k] = v
            why[idx[rows]] = how
        text = np.asarray(describe_rows(run), dtype=object)
        reason = dict(zip(df["layout_text"].astype(str), df["reason"].astype(str), strict=True))
        hit = np.array([t in reason for t in text], dtype=bool) & (text != df["layout_text"].to_numpy()[idx])
        mask[idx[hit]] = True
        # where the layout that runs does not fit itself (Accelerate's TP without SP holds more), its reason too
        why[idx[hit]] = [f"{LAUNCH_AS}{t} ({w})" + (f"{LAUNCH_AS_MISFIT}{reason[t]}" if reason[t] else "")
                         for t, w in zip(text[hit], why[idx[hit]], strict=True)]
    why[~mask] = ""
    return mask, why


# ... and those its training changes and step-time verdict depend on (offload: FSDP2's whole-model CPU offload;
# shard_group: Accelerate rounds an HSDP group to whole cp groups)
_SPEED_FIELDS = [*_RENAME_FIELDS, "offload", "shard_group"]


def launched_speed(model: ModelSpec, cluster: ClusterSpec, training: TrainingSpec, df: Any,
                   eff: Any = None) -> tuple[Any, Any, Any]:
    """(each row's modelled step time as planned over as launched, the trainer's words for what changes it, the
    short words of the launch's changes whose step time is not modelled, "" where none): the
    :func:`as_launched` ``throughput_ratio`` of every feasible row of ``df`` at once. 1.0 where the launch runs the
    plan (or changes nothing that moves the step time); NaN on rows that are not feasible or that run as a layout
    the planner refuses. Where a change has no step-time model (FSDP2's whole-model offload, torchtitan's all-gather
    CP), ``as_launched`` says nothing (None); here the ratio is that of the changes that are modelled (an FP8 CP plan
    that torchtitan trains in bf16 is at least as slow as bf16), and the words say which are not.

    Where the ratio is not 1, the trainer changes the training or the layout: torchtitan runs an FP8 tensorwise
    plan in bf16 (its float8 converter has rowwise recipes only) and fused kernels as torch.compile; Accelerate runs
    QLoRA as LoRA over a bf16 base and FP8 rowwise in bf16; Accelerate's layout renames (TP without SP, full
    recompute for selective, ...). The search ranks on the speed of what runs (``search.layouts.LAUNCH_TPS_RATIO``),
    so that an FP8 study does not list its TP layouts at an FP8 speed the torchtitan launch would not reach.

    The verdict is taken once per combination of the fields the deviations depend on (``_SPEED_FIELDS``); the step
    times of what runs, once per training change, over all its rows (the model is vectorised). A test checks the
    ratios against :func:`as_launched` row by row."""
    n = len(df)
    ratio = np.full(n, np.nan)
    why = np.full(n, "", dtype=object)
    untimed_words = np.full(n, "", dtype=object)
    feas = np.flatnonzero(df["feasible"].to_numpy(dtype=bool)) if "feasible" in df else np.arange(n)
    if not len(feas):
        return ratio, why, untimed_words
    sub = df.iloc[feas]
    groups, reps, members = _group_reps(sub, _SPEED_FIELDS)
    runs: dict[tuple[tuple[str, Any], ...], list[tuple[int, dict[str, Any]]]] = {}
    for g, rep in enumerate(reps):
        lay = Layout.from_row(rep)
        trainer = choose_trainer(model, training, lay)[0]
        devs = plan_deviations(model, cluster, training, lay, trainer, sized=False)
        rows = members[g]
        if any(d.cannot_run for d in devs):  # (ruled out: cannot_run_mask)
            continue
        devs = [d for d in devs if not d.memory_only]  # (no step-time term reads what they change)
        timed = [d for d in devs if "step time" not in d.unmodelled]
        untimed = [d.short for d in devs if d not in timed]
        untimed_words[feas[rows]] = "; ".join(untimed)
        lay_ch = {k: v for d in timed for k, v in d.layout.items() if getattr(lay, k) != v}
        tr_ch = {k: v for d in timed for k, v in d.training.items() if getattr(training, k) != v}
        ratio[feas[rows]] = 1.0
        if not lay_ch and not tr_ch:
            continue
        try:
            check_layout(model, cluster, replace(training, **tr_ch), replace(lay, **lay_ch))
        except ConfigError:  # what runs is not a layout the planner accepts (as_launched: nothing modelled)
            ratio[feas[rows]] = np.nan
            untimed_words[feas[rows]] = "; ".join(d.short for d in devs)
            continue
        moving = [d for d in timed if any(getattr(lay, k) != v for k, v in d.layout.items())
                  or any(getattr(training, k) != v for k, v in d.training.items())]
        why[feas[rows]] = (f"{trainer}: " + "; ".join(d.short for d in moving)
                           + (f" (step time not modelled for: {'; '.join(untimed)})" if untimed else ""))
        runs.setdefault(tuple(sorted(tr_ch.items())), []).append((g, lay_ch))
    for tr_ch, gs in runs.items():
        rows = np.sort(np.concatenate([members[g] for g, _ in gs]))
        run = {k: sub[k].to_numpy()[rows] for k in LayoutTable.FIELDS}  # (a copy: fancy indexing)
        for g, lay_ch in gs:
            at = np.searchsorted(rows, members[g])  # the group's rows within ``rows`` (both sorted)
            for k, v in lay_ch.items():
                run[k][at] = v
        table = LayoutTable(**run)
        ran_s = np.asarray(step_time(model, cluster, replace(training, **dict(tr_ch)), table, eff)["step_time_s"],
                           dtype=float)
        ratio[feas[rows]] = sub["step_time_s"].to_numpy(dtype=float)[rows] / ran_s
    return ratio, why, untimed_words


def plan_search(model: ModelSpec, cluster: ClusterSpec, training: TrainingSpec, eff: Any = None,
                options: dict[str, Any] | None = None, top: int = 10, *, mem_scale: float = 1.0) -> Any:
    """The search a study plans with (the analytic stage, ``trainplan plan``, the workflow's up-front check that a
    layout fits): ``search.layouts.search``, then ``refit_as_launched`` with what the launch runs for each layout
    (:func:`launch_judge`), so that no layout the launch could not run or fit is chosen, ranked in the production
    table's ``top`` rows, or named for a family or a technique (``refit_as_launched`` repeats until none is), and
    every layout is ranked on the speed of what runs (:func:`launched_speed`). ``mem_scale``: the memory model's error on every peak, planned and
    launched (the sensitivity's ``memory_x``)."""
    df = search(model, cluster, training, eff, options, mem_scale=mem_scale)
    df[LAUNCH_TPS_RATIO], df[LAUNCH_TPS_WHY], df[LAUNCH_UNTIMED] = launched_speed(model, cluster, training, df, eff)
    no_run, why = cannot_run_mask(model, training, df)
    ruled = [(no_run, f"{LAUNCH_NO_RUN}{why})"), runs_as_mask(model, cluster, training, df)]
    return refit_as_launched(df, launched_peak(launch_judge(model, cluster, training, eff)), cluster, options, top,
                             ruled, mem_scale=mem_scale)


def entry_finetune(training: TrainingSpec) -> str:
    """The fine-tune ``trainplan.train_entry`` runs for the plan's (``--finetune``): full, or LoRA through PEFT,
    also for QLoRA (:func:`qlora_as_lora_note`)."""
    return "full" if training.finetune == "full" else "lora"


QLORA_AS_LORA = "LoRA over a bf16 base for QLoRA (no NF4 path)"  # qlora_as_lora_note's few words


def qlora_as_lora_note(model: ModelSpec, cluster: ClusterSpec, training: TrainingSpec, layout: Layout
                       ) -> Deviation:
    """The deviation of a QLoRA plan under ``train_entry``: it trains the plan's adapters (rank, targets) over bf16
    base weights, since NF4 base weights need bitsandbytes 4-bit on CUDA under FSDP2, which it does not set up.
    What that costs, from the memory model: the layout's peak per GPU as LoRA against the plan's."""
    q = memory_breakdown(model, cluster, training, layout)["total"] / 2**30
    lo = memory_breakdown(model, cluster, replace(training, finetune="lora"), layout)["total"] / 2**30
    return _qlora_as_lora(f"finetune=qlora runs as LoRA (rank {training.lora_rank}, {'/'.join(training.lora_targets)}) "
                          "over bf16 base weights: the entry point has no NF4 (bitsandbytes 4-bit) path; modelled peak, "
                          f"this change alone, {lo:.1f} GiB/GPU against the plan's {q:.1f} GiB ({lo - q:+.1f} GiB), "
                          "no dequantisation time")


def _qlora_as_lora(text: str) -> Deviation:
    """The QLoRA-as-LoRA :class:`Deviation` with ``text``: LoRA over a bf16 base (``finetune`` → lora)."""
    return Deviation(text, short=QLORA_AS_LORA, training={"finetune": "lora"})


def accelerate_config(model: ModelSpec, cluster: ClusterSpec, training: TrainingSpec, layout: Layout, *,
                      study_hash: str) -> str:
    """The Accelerate YAML (with a commented header) for the layout on the whole cluster."""
    _check_hash(study_hash)
    fsdp, par, notes = _accelerate_parts(cluster, training, layout)
    cfg: dict[str, Any] = {
        "compute_environment": "LOCAL_MACHINE",
        "debug": False,
        "distributed_type": "FSDP",
        "downcast_bf16": "no",
        "enable_cpu_affinity": False,
        "fsdp_config": fsdp,
        "machine_rank": 0,  # overridden per node by --machine_rank in the sbatch script
        "main_training_function": "main",
        "mixed_precision": "fp8" if training.fp8 == "tensorwise" else ("bf16" if training.half else "no"),
        "num_machines": cluster.nodes,
        "num_processes": cluster.n_gpus,
        "rdzv_backend": "c10d",
        "same_network": True,
        "use_cpu": False,
    }
    if training.fp8 == "tensorwise":
        cfg["fp8_config"] = {"backend": "AO"}  # torchao Float8 (ACCELERATE_FP8_BACKEND=AO)
    if training.kernels == "compiled":  # torch.compile through Accelerate (dynamo_config → TorchDynamoPlugin)
        cfg["dynamo_config"] = {"dynamo_backend": "INDUCTOR"}
    if par:
        cfg["parallelism_config"] = par
    ga = grad_accum(training, layout)
    notes = [*notes, f"micro_batch={layout.micro_batch} sequences/rank, grad_accum={ga}, seq_len="
             f"{training.seq_len}: set in the training script (exported as TRAINPLAN_* by the sbatch script)"]
    head = _header("Accelerate config (FSDP2)", study_hash, model, cluster, layout, notes)
    return head + "\n" + yaml.safe_dump(cfg, sort_keys=True)


# -------------------------------------------------------------------------------------- DeepSpeed
def deepspeed_unsupported_reason(layout: Layout) -> str | None:
    """Why the layout has no DeepSpeed ZeRO equivalent (None = it has one)."""
    L = layout
    if L.tp > 1 or L.pp > 1 or L.cp > 1:
        return f"tp={L.tp}, pp={L.pp}, cp={L.cp}: DeepSpeed ZeRO alone is pure data parallelism"
    if L.sharding == "hsdp":
        return "hybrid sharding has no exact DeepSpeed ZeRO equivalent (ZeRO++ hpZ shards only a secondary copy)"
    return None


def deepspeed_config(model: ModelSpec, cluster: ClusterSpec, training: TrainingSpec, layout: Layout, *,
                     study_hash: str) -> dict[str, Any] | None:
    """A DeepSpeed ZeRO config dict for a pure-DP layout, or None if not expressible."""
    _check_hash(study_hash)
    if deepspeed_unsupported_reason(layout) is not None:
        return None
    stage = {"none": 0, "zero1": 1, "zero2": 2, "zero3": 3}[layout.sharding]
    h = model.hidden
    zero: dict[str, Any] = {"stage": stage, "overlap_comm": True, "contiguous_gradients": True,
                            # the values HF transformers' DeepSpeed integration derives for "auto":
                            # reduce bucket h^2, stage-3 prefetch 0.9 h^2, persistence threshold 10 h
                            "reduce_bucket_size": h * h}
    if stage == 3:
        zero |= {"stage3_prefetch_bucket_size": int(0.9 * h * h), "stage3_param_persistence_threshold": 10 * h,
                 "stage3_gather_16bit_weights_on_model_save": False}
    if layout.offload == "cpu":
        zero["offload_optimizer"] = {"device": "cpu", "pin_memory": True}
    cfg: dict[str, Any] = {
        "_comment": _header("DeepSpeed ZeRO config", study_hash, model, cluster, layout,
                            [("no activation checkpointing (recompute=none)" if layout.recompute == "none" else
                              f"activation checkpointing (recompute={layout.recompute}) is set on the model: "
                              "Transformers' gradient_checkpointing_enable(), not in this file")]
                            ).replace("# ", "").split("\n"),
        "train_batch_size": training.global_batch,
        "train_micro_batch_size_per_gpu": layout.micro_batch,
        "gradient_accumulation_steps": grad_accum(training, layout),
        "zero_optimization": zero,
        "steps_per_print": 10,
        "wall_clock_breakdown": False,
    }
    if training.half:
        cfg["bf16"] = {"enabled": True}
    return cfg


# ------------------------------------------------------------------------------- torchrun / sbatch
def torchrun_command(cluster: ClusterSpec, *, train_script: str | None = DEFAULT_TRAIN_SCRIPT,
                     train_args: Sequence[str] = ()) -> str:
    """The per-node torchrun command line (shell text): c10d rendezvous at $HEAD_NODE:$RDZV_PORT."""
    fixed = ["torchrun", f"--nnodes={cluster.nodes}", f"--nproc-per-node={cluster.gpus_per_node}",
             "--rdzv-backend=c10d"]
    tail = ["--max-restarts=0", *_script_argv(train_script), *map(str, train_args)]
    return " ".join([shlex.join(fixed), '--rdzv-endpoint="$HEAD_NODE:$RDZV_PORT"', '--rdzv-id="$RDZV_ID"',
                     shlex.join(tail)])


def _script_argv(train_script: str | None) -> list[str]:
    """The launcher's program arguments: ``-m trainplan.train_entry`` by default, else the given script."""
    return ["-m", ENTRY_MODULE] if not train_script else [str(train_script)]


def _template(name: str) -> Any:
    import jinja2

    env = jinja2.Environment(loader=jinja2.PackageLoader("trainplan", "templates"),
                             undefined=jinja2.StrictUndefined, keep_trailing_newline=True, autoescape=False)
    return env.get_template(name)


def torchrun_script(model: ModelSpec, cluster: ClusterSpec, layout: Layout, *, study_hash: str,
                    train_script: str | None = DEFAULT_TRAIN_SCRIPT, train_args: Sequence[str] = (),
                    master_port: int = RDZV_PORT) -> str:
    """A runnable torchrun.sh (header, HEAD_NODE guard, the torchrun command)."""
    _check_hash(study_hash)
    return _template("torchrun.sh.j2").render(
        header=_header("torchrun command (run on every node)", study_hash, model, cluster, layout),
        rdzv_port=int(master_port), rdzv_id=shlex.quote(f"trainplan-{study_hash[:12]}"), alloc_conf=ALLOC_CONF,
        command=torchrun_command(cluster, train_script=train_script, train_args=train_args))


def accelerate_node_command(cluster: ClusterSpec, *, train_script: str | None = None,
                            train_args: Sequence[str] = (), accelerate_file: str = "accelerate_fsdp2.yaml") -> str:
    """Per-node shell text: ``accelerate launch`` (the generated FSDP2 config) of the entry point, args "$@"."""
    return " ".join([
        "exec accelerate launch --config_file", '"$LAUNCH_DIR"/' + shlex.quote(accelerate_file),
        shlex.join(["--num_machines", str(cluster.nodes), "--num_processes", str(cluster.n_gpus)]),
        '--machine_rank "$SLURM_NODEID" --main_process_ip "$HEAD_NODE" --main_process_port "$RDZV_PORT"',
        "--rdzv_backend c10d", shlex.join([*_script_argv(train_script), *map(str, train_args)]), '"$@"'])


def torchtitan_node_command(cluster: ClusterSpec) -> str:
    """Per-node shell text: torchrun of ``torchtitan.train`` with the generated job module, args "$@"."""
    return " ".join([
        'export PYTHONPATH="$LAUNCH_DIR${PYTHONPATH:+:$PYTHONPATH}";',
        shlex.join(["exec", "torchrun", f"--nnodes={cluster.nodes}", f"--nproc-per-node={cluster.gpus_per_node}",
                    "--rdzv-backend=c10d"]),
        '--rdzv-endpoint="$HEAD_NODE:$RDZV_PORT" --rdzv-id="$SLURM_JOB_ID"',
        shlex.join(["--max-restarts=0", "-m", "torchtitan.train", "--module", TORCHTITAN_MODULE,
                    "--config", TORCHTITAN_CONFIG_FN]),
        # init_timeout covers start-up and the first step only; torchtitan then sets train_timeout (default 100 s)
        '--comm.init_timeout_seconds "$TRAINPLAN_COLLECTIVE_TIMEOUT_S"',
        '--comm.train_timeout_seconds "$TRAINPLAN_COLLECTIVE_TIMEOUT_S" "$@"'])


def sbatch_script(model: ModelSpec, cluster: ClusterSpec, training: TrainingSpec, layout: Layout, *,
                  study_hash: str, train_script: str | None = None, train_args: Sequence[str] = (),
                  time_limit_h: float = 72.0, collective_timeout_s: int = 1800, job_name: str = "trainplan",
                  partition: str | None = None, account: str | None = None, master_port: int = RDZV_PORT,
                  accelerate_file: str = "accelerate_fsdp2.yaml", checkpoint_interval_s: float | None = None,
                  step_time_s: float | None = None, min_tokens_per_s_per_gpu: float | None = None,
                  signal_lead_s: int = 300, gpu_directive: bool = True, checkpoint_async: bool = True,
                  fp8_parity: bool = True) -> str:
    """The Slurm batch script for nodes x gpus_per_node: runs the chosen trainer (:func:`trainers.choose_trainer`).
    ``checkpoint_async`` (cost.checkpoint_async, what the cost model charges): interval checkpoints written while
    training goes on.

    ``TRAINPLAN_MODE`` = train (resumes from the last checkpoint; requeues itself when told to stop),
    day1-throughput (DAY1_THROUGHPUT_STEPS; the step log becomes a record checked against ``min_tokens_per_s_per_gpu``),
    day1-checkpoint (save at step 5, stop, restore, continue). ``partition``/``account`` of None leave a
    disabled, marked PLACEHOLDER directive. ``train_args`` go to the accelerate line before the mode's own.
    """
    _check_hash(study_hash)
    if isinstance(time_limit_h, bool) or not (isinstance(time_limit_h, int | float) and 0 < time_limit_h <= 8760):
        raise ConfigError("launch.time_limit_h", time_limit_h, "a finite number of hours in (0, 8760]")
    if isinstance(master_port, bool) or not isinstance(master_port, int) or not 1024 <= master_port <= 65535:
        raise ConfigError("launch.master_port", master_port, "an integer port in 1024..65535")
    for key, val in (("job_name", job_name), ("partition", partition), ("account", account)):
        if val is not None and not _slurm_word(val):
            raise ConfigError(f"launch.{key}", val, "letters, digits, '.', '_' or '-' only (an #SBATCH value)")
    minutes = max(1, round(time_limit_h * 60))
    trainer, why = choose_trainer(model, training, layout)
    titan_no = torchtitan_model_problems(model, training)
    parity = fp8_check_trainers(training, titan_no)
    ckpt_steps = checkpoint_interval_steps(checkpoint_interval_s, step_time_s)
    lead = int(min(signal_lead_s, max(30, minutes * 60 // 4)))
    return _template("sbatch.sh.j2").render(
        header=_header(f"Slurm batch script ({cluster.nodes} x {cluster.gpus_per_node} GPUs)", study_hash,
                       model, cluster, layout, [f"{trainer} differs from the plan: {d}" for d in
                                                plan_deviations(model, cluster, training, layout, trainer)]),
        script_name=sbatch_name(cluster), job_name=f"{job_name}-{study_hash[:12]}", short_hash=study_hash[:12],
        partition=partition, account=account, gpus_per_node_directive=bool(gpu_directive),
        nodes=cluster.nodes, gpus_per_node=cluster.gpus_per_node, signal_lead_s=lead,
        time_limit=f"{minutes // 60:d}:{minutes % 60:02d}:00", collective_timeout_s=int(collective_timeout_s),
        seq_len=training.seq_len, micro_batch=layout.micro_batch, grad_accum=grad_accum(training, layout),
        reshard_after_forward=int(layout.sharding in ("zero3", "hsdp")),
        shard_group=int((layout.shard_group or cluster.gpus_per_node) if layout.sharding == "hsdp" else 0),
        activation_checkpointing=int(layout.recompute != "none"),
        peak_tflops=f"{cluster.gpu.peak_bf16_flops / 1e12:g}", optimizer_impl=training.optimizer_impl,
        finetune=entry_finetune(training), lora_rank=training.lora_rank, lora_targets=",".join(training.lora_targets),
        steps=total_steps(training),
        day1_steps=DAY1_THROUGHPUT_STEPS,
        ckpt_interval_s=int(round(checkpoint_interval_s)) if checkpoint_interval_s else 0,
        ckpt_interval_note=("" if checkpoint_interval_s else " (no cost.json given: 0 = every "
                            f"{ckpt_steps} steps)") + (f"; torchtitan: {ckpt_steps} steps of the predicted "
                                                       f"{step_time_s:.3g} s" if step_time_s else ""),
        ckpt_interval_steps=ckpt_steps,
        trainer=trainer, trainer_why=_one_line(why), torchtitan_ok=not titan_no,
        torchtitan_why=_one_line("; ".join(titan_no)).replace('"', "'"),
        min_tps=round(min_tokens_per_s_per_gpu or 0), rdzv_port=master_port, alloc_conf=ALLOC_CONF,
        own_entry=not train_script,  # the data guard knows what trainplan.train_entry reads, not a custom script
        fp8_accelerate=training.fp8 == "tensorwise", ckpt_async=int(bool(checkpoint_async)),
        # the FP8 day-1 loss check, for each trainer that runs FP8 for this plan; ``fp8_parity`` False leaves it out
        fp8_parity_accelerate=fp8_parity and parity["accelerate"],
        fp8_parity_torchtitan=fp8_parity and parity["torchtitan"],
        fp8_parity=fp8_parity and any(parity.values()), parity_steps=LOSS_PARITY_STEPS,
        accelerate_bf16_node_command=shlex.quote(accelerate_node_command(cluster, train_script=train_script,
                                                                         train_args=train_args,
                                                                         accelerate_file=ACCELERATE_BF16_FILE)),
        # what `trainplan ingest` needs for a torchtitan console log: the model (a preset by name, else this
        # folder's config.json), the layout, the shapes
        titan_model=_titan_model_ref(model, None), titan_layout=_layout_arg(layout), global_batch=training.global_batch,
        accelerate_node_command=shlex.quote(accelerate_node_command(cluster, train_script=train_script,
                                                                    train_args=train_args,
                                                                    accelerate_file=accelerate_file)),
        torchtitan_node_command=shlex.quote(torchtitan_node_command(cluster)))


def bash_syntax_check(path: str | Path) -> None:
    """Raise ConfigError if ``bash -n`` rejects the script."""
    r = subprocess.run(["bash", "-n", str(path)], capture_output=True, text=True, timeout=30, check=False)
    if r.returncode:
        raise ConfigError("script", str(path), f"bash -n failed: {r.stderr.strip()}")


def sbatch_test_only(path: str | Path, *, partition: str | None = None, account: str | None = None,
                     extra_args: Sequence[str] = (), timeout_s: float = 60) -> subprocess.CompletedProcess:
    """Run ``sbatch --test-only`` on a generated script (command-line options override #SBATCH lines).

    Returns the CompletedProcess; Slurm prints its verdict on stderr ("Job ... to start at ...").
    """
    cmd = ["sbatch", "--test-only"]
    if partition:
        cmd.append(f"--partition={partition}")
    if account:
        cmd.append(f"--account={account}")
    cmd += [*map(str, extra_args), str(path)]
    return subprocess.run(cmd, capture_output=True, text=True, timeout=timeout_s, check=False)


# ------------------------------------------------------------------------------------------ write
def all_gpus_busbw(cluster: ClusterSpec) -> dict[str, Any]:
    """The NCCL bus bandwidth the plan assumes for one collective over every GPU of the job (``comm.group_link``'s
    rail model: across nodes each rank's rail carries its share, so the group gets ``inter_busbw_GBps`` × rails
    per node, capped at the intra-node busbw): what nccl-tests' all_reduce_perf over all nodes must reach.
    ``inter_busbw_GBps`` itself is per rail (one GPU per node), not this figure."""
    bw = float(comm.group_link(cluster, cluster.n_gpus, 1)[0]) / 1e9
    intra, inter = cluster.intra_busbw_Bps / 1e9, cluster.inter_busbw_Bps / 1e9
    if cluster.nodes <= 1:
        why = f"the plan's collectives inside the node (cluster.intra_busbw_GBps {intra:g})"
    else:
        rails = cluster.nics_per_node
        why = (f"what the plan assumes for a collective over all {cluster.n_gpus} GPUs, min(cluster.intra_busbw_GBps "
               f"{intra:g}, cluster.inter_busbw_GBps {inter:g} per rail × {rails:g} rails per node)")
    return {"busbw_GBps": round(bw, 1), "why": why}


def _config_args(config_path: str | Sequence[str]) -> str:
    """``--config`` arguments: one path, or several deep-merged in order (a variant overlay after its base)."""
    paths = [config_path] if isinstance(config_path, str | Path) else list(config_path)
    return " ".join(shlex.quote(str(p)) for p in paths)


def day1_commands(cluster: ClusterSpec, *, trainer: str, summary_path: str = "results/analytic/summary.json",
                  config_path: str | Sequence[str] = "config/config.yaml",
                  min_tokens_per_s_per_gpu: float | None = None,
                  checkpoint_interval_s: float | None = None, study_hash: str | None = None,
                  titan_ingest: str = "", fp8_parity: bool = False) -> list[dict[str, Any]]:
    """The memo's day-1 go/no-go checks as commands: [{check, command, passes_when}] (manifest.json ``day1``; the
    nccl-tests check also carries its threshold, ``min_busbw_GBps``). The sbatch commands run in the study's launch
    folder (beside ``summary_path``'s analytic/), as the script says; the others from the project root, so the
    paths into the launch folder name it. ``titan_ingest``: the flags ``trainplan ingest`` needs for a torchtitan
    console log (model, layout, shapes), which has no record of them. ``fp8_parity``: the trainer runs FP8
    (:func:`runs_fp8`), so the loss check against bf16 (the sbatch's day1-loss-parity mode) is listed."""
    sb = sbatch_name(cluster)
    tps = f"{min_tokens_per_s_per_gpu:,.0f}" if min_tokens_per_s_per_gpu else "the p10 prediction"
    launch_dir = _launch_dir(summary_path)
    run = (f"{launch_dir}/run-{study_hash[:12]}" if study_hash  # the sbatch's TRAINPLAN_RUN_DIR
           else f"{launch_dir}/run-<study hash[:12]>")
    if trainer == "accelerate":
        record = f"trainplan ingest {run}/day1-throughput-<job>/steps.jsonl"
        resume = "(`trainplan ingest --check-resume` on its step log)"
    else:  # torchtitan writes no steps.jsonl: its console log (%x-%j.out in the launch folder) is the record
        record = f"trainplan ingest {launch_dir}/<job name>-<job>.out --format torchtitan {titan_ingest}".rstrip()
        resume = ("(`trainplan ingest --check-resume --format torchtitan` on its console log: the second launch "
                  "loaded step-5 and trained on to step 10)")
    busbw = all_gpus_busbw(cluster)
    out = [
        {"check": "one-node preflight",
         "command": f"trainplan preflight --summary {shlex.quote(summary_path)} --config {_config_args(config_path)} "
                    "--device cuda",
         "passes_when": "exit 0 (PASS): state and activation bytes, peak reserved memory and step time within "
                        "tolerance of the plan, and the production peak at the slice's measured memory error "
                        "within search.max_hbm_frac of usable HBM (the memo's check 1); a FAIL names the layout "
                        "to switch to"},
        {"check": f"first {DAY1_THROUGHPUT_STEPS} steps on all GPUs",
         "command": f"sbatch --export=ALL,TRAINPLAN_MODE=day1-throughput {sb}",
         "passes_when": f"the job exits 0: it ends with `trainplan ingest {run}/day1-throughput-<job>/steps.jsonl "
                        f"--min-tokens-per-s-per-gpu {round(min_tokens_per_s_per_gpu or 0)}` (median tokens/s/GPU "
                        f">= {tps}, losses finite)" if trainer == "accelerate" else
                        f"the job exits 0: it ends with `{record} --min-tokens-per-s-per-gpu "
                        f"{round(min_tokens_per_s_per_gpu or 0)}` on its console log (median tokens/s/GPU >= {tps}, "
                        "losses finite)"},
        {"check": "nccl-tests all-reduce across all nodes" if cluster.nodes > 1 else "nccl-tests all-reduce on the node",
         # one MPI job of one GPU per rank (nccl-tests built with MPI=1): without --mpi each task is its own 1-GPU test
         "command": f"srun --mpi=pmix --nodes={cluster.nodes} --ntasks-per-node={cluster.gpus_per_node} "
                    f"--gpus-per-node={cluster.gpus_per_node} all_reduce_perf -b 1G -e 8G -f 2 -g 1",
         "passes_when": f"busbw at 8 GB >= {busbw['busbw_GBps']:g} GB/s: {busbw['why']} (nccl-tests built with "
                        "MPI=1; --mpi=pmi2 where Slurm has no PMIx; the header must say nranks "
                        f"{cluster.n_gpus})",
         "min_busbw_GBps": busbw["busbw_GBps"], "why": busbw["why"], "nodes": cluster.nodes},
        {"check": "save and restore one sharded (DCP) checkpoint",
         "command": f"sbatch --export=ALL,TRAINPLAN_MODE=day1-checkpoint {sb}",
         "passes_when": "the job exits 0: a checkpoint at step 5, a fresh launch restores it and reaches step 10 "
                        + resume},
        {"check": "measurements flow back",
         "command": f"{record} --out data/calibration/gpu/day1-production.json",
         "passes_when": "the record is written; rerun the study: calibrate fits the efficiencies to it"},
    ]
    if fp8_parity:
        limits = {"steps": LOSS_PARITY_STEPS, "window_steps": LOSS_PARITY_STEPS // 4, "max_loss_rel": LOSS_PARITY_MAX_REL}
        par = f"{run}/day1-loss-parity-<job>"
        logs = (f"{par}/fp8.jsonl --loss-parity {par}/bf16.jsonl" if trainer == "accelerate" else
                f"{par}/fp8.out --format torchtitan --loss-parity {par}/bf16.out")
        ref = (f"bf16 ({ACCELERATE_BF16_FILE})" if trainer == "accelerate" else
               "bf16 (the job module without its float8 converter: TRAINPLAN_PRECISION=bf16)")
        out.insert(4, {"check": "FP8 loss parity", **limits,
                       "command": f"sbatch --export=ALL,TRAINPLAN_MODE=day1-loss-parity {sb}",
                       "passes_when": f"the job exits 0: {LOSS_PARITY_STEPS} steps in FP8, then {LOSS_PARITY_STEPS} in "
                                      f"{ref} from the same weights and data, each to the last step, ending with "
                                      f"`trainplan ingest {logs} --min-steps {LOSS_PARITY_STEPS}` (mean loss over the "
                                      f"last {LOSS_PARITY_STEPS // 4} steps within {LOSS_PARITY_MAX_REL:.0%} of bf16's)"})
    if cluster.n_gpus == 1:  # one GPU: no collective for nccl-tests to measure
        out = [d for d in out if "min_busbw_GBps" not in d]
    if checkpoint_interval_s:
        ckpt = next(d for d in out if d["check"].startswith("save and restore"))
        ckpt["passes_when"] += f"; production checkpoints every {duration_text(checkpoint_interval_s / 3600)} (Young/Daly)"
    return out


def runs_fp8(training: TrainingSpec, trainer: str) -> bool:
    """Whether ``trainer`` runs this plan's GEMMs in FP8 (then the FP8 day-1 loss check applies): Accelerate runs
    tensorwise (mixed_precision fp8, torchao AO; its config cannot select rowwise, which it runs in bf16), torchtitan
    0.3 rowwise (its float8 converter has no tensorwise recipe)."""
    return training.fp8 == ("tensorwise" if trainer == "accelerate" else "rowwise")


def fp8_check_trainers(training: TrainingSpec, titan_no: Sequence[str]) -> dict[str, bool]:
    """Per trainer, whether the FP8 day-1 loss check applies: it runs FP8 (:func:`runs_fp8`) and, for torchtitan,
    can build the model (``titan_no``: :func:`~trainplan.launch.trainers.torchtitan_model_problems`). The sbatch
    gets a day1-loss-parity branch for each, the manifest the check for the trainer it runs."""
    return {"accelerate": runs_fp8(training, "accelerate"),
            "torchtitan": runs_fp8(training, "torchtitan") and not titan_no}


def titan_ingest_flags(model: ModelSpec, training: TrainingSpec, layout: Layout, cluster: ClusterSpec,
                       summary_path: str) -> str:
    """``trainplan ingest`` flags for a torchtitan console log of this plan: the model (a preset name, else the launch
    folder's model_config.json), the layout as JSON, the shapes and the world size."""
    return (f"--model {_titan_model_ref(model, _launch_dir(summary_path))} --layout {_layout_arg(layout)} "
            f"--seq-len {training.seq_len} --global-batch {training.global_batch} --world-size {cluster.n_gpus}")


def _launch_dir(summary_path: str) -> str:
    """The study's launch folder, beside the analytic/ folder of ``summary_path``."""
    return str(PurePosixPath(summary_path).parent.parent / "launch")


def _titan_model_ref(model: ModelSpec, launch_dir: str | None) -> str:
    """``--model`` for ``trainplan ingest`` (shell-quoted): a preset by name, else the launch folder's model_config.json
    (``launch_dir`` None: the sbatch's own ``$LAUNCH_DIR``, left for the shell to expand)."""
    if MODEL_PRESETS.get(model.name) == model:
        return shlex.quote(model.name)
    return '"$LAUNCH_DIR/model_config.json"' if launch_dir is None else shlex.quote(f"{launch_dir}/model_config.json")


def _layout_arg(layout: Layout) -> str:
    """``--layout`` for ``trainplan ingest``: the layout as shell-quoted JSON."""
    return shlex.quote(json.dumps(layout.to_dict(), sort_keys=True))


STUDY_CONFIG_NAME = "study_config.yaml"  # the resolved config the workflow writes beside the launch files


def write_artifacts(model: ModelSpec, cluster: ClusterSpec, training: TrainingSpec, layout: Layout,
                    out_dir: str | Path, *, study_hash: str, train_script: str | None = DEFAULT_TRAIN_SCRIPT,
                    train_args: Sequence[str] = (), options: Mapping[str, Any] | None = None,
                    checkpoint_interval_s: float | None = None, step_time_s: float | None = None,
                    checkpoint_async: bool = True,
                    min_tokens_per_s_per_gpu: float | None = None, summary_path: str = "results/analytic/summary.json",
                    config_path: str | Sequence[str] = "config/config.yaml",
                    study_config: Mapping[str, Any] | None = None, eff: Any = None) -> list[tuple[str, bool]]:
    """Write every artifact (atomically) plus manifest.json; return [(filename, short?), ...].

    ``summary_path`` and ``config_path`` are what the day-1 preflight command names. ``study_config`` (the study's
    resolved config, the workflow's): written as ``study_config.yaml`` beside the scripts, and the preflight command
    reads it, so a variant study (results/lora) preflights its own layout, not the default study's.

    ``options`` is the config's ``launch`` section: job_name, partition, account, time_limit_h, master_port.
    ``checkpoint_interval_s`` (cost.json's Young/Daly ``checkpoint_interval_h`` × 3600) and ``step_time_s`` (the
    chosen layout's predicted step time) set the checkpoint interval; ``min_tokens_per_s_per_gpu`` (the p10
    prediction) is the day-1 throughput threshold. Both are the plan's: where the trainer runs something else
    (:func:`as_launched`, with the study's efficiency ``eff``), the threshold and the step time are scaled by its
    modelled throughput ratio, and the manifest's ``trainer.as_launched`` carries the ratios for the memo.
    """
    out = Path(out_dir)
    opts = dict(options or {})
    unknown = sorted(set(opts) - LAUNCH_OPTIONS)
    if unknown:
        raise ConfigError("launch." + unknown[0], opts[unknown[0]], "valid: " + ", ".join(sorted(LAUNCH_OPTIONS)))
    kw = {"study_hash": study_hash, "train_script": train_script, "train_args": train_args}
    trainer, why = choose_trainer(model, training, layout)
    titan_no = torchtitan_model_problems(model, training)
    launched = as_launched(model, cluster, training, layout, trainer, eff)
    ratio = (launched or {}).get("throughput_ratio")
    if launched is not None:
        launched["plan_min_tokens_per_s_per_gpu"] = min_tokens_per_s_per_gpu
    if ratio:  # judge the day-1 run on what it runs
        min_tokens_per_s_per_gpu = min_tokens_per_s_per_gpu * ratio if min_tokens_per_s_per_gpu else None
        if trainer == "torchtitan":  # its step time sets torchtitan's checkpoint interval in steps (Accelerate's is
            step_time_s = step_time_s / ratio if step_time_s else None  # in seconds; the torchtitan job as planned)
    ckpt_steps = checkpoint_interval_steps(checkpoint_interval_s, step_time_s)
    parity = fp8_check_trainers(training, titan_no)[trainer]
    texts: dict[str, tuple[str, str]] = {
        "accelerate_fsdp2.yaml": (accelerate_config(model, cluster, training, layout, study_hash=study_hash),
                                  "Accelerate FSDP2 config"),
        "torchrun.sh": (torchrun_script(model, cluster, layout, master_port=opts.get("master_port", RDZV_PORT), **kw),
                        "torchrun command, one per node"),
        sbatch_name(cluster): (sbatch_script(model, cluster, training, layout, checkpoint_interval_s=checkpoint_interval_s,
                                             step_time_s=step_time_s, min_tokens_per_s_per_gpu=min_tokens_per_s_per_gpu,
                                             checkpoint_async=checkpoint_async,
                                             **opts, **kw),
                               f"Slurm batch script (runs {trainer}; requeue on USR1/TERM; day-1 modes)"),
    }
    if runs_fp8(training, "accelerate"):  # the loss check's bf16 reference (also for TRAINPLAN_TRAINER=accelerate)
        texts[ACCELERATE_BF16_FILE] = (
            accelerate_config(model, cluster, replace(training, precision="bf16"), layout, study_hash=study_hash),
            "Accelerate FSDP2 config in bf16: the FP8 day-1 loss check's reference run")
    hf_why = hf_unsupported_reason(model)
    if hf_why is None:
        hf = {"_comment": _one_line(f"trainplan launch artifact: transformers LlamaConfig of {model.name}; "
                                    f"study hash: {study_hash}"), **hf_config_dict(model)}
        texts["model_config.json"] = (json.dumps(hf, indent=2, ensure_ascii=False) + "\n",
                                      "Hugging Face config.json of the model (random init; or point "
                                      "TRAINPLAN_MODEL_CONFIG at the checkpoint directory)")
    settings: dict[str, Any] | None = None
    if not titan_no:
        settings, _ = torchtitan_settings(model, cluster, training, layout, ckpt_interval_steps=ckpt_steps,
                                          checkpoint_async=checkpoint_async)
        head = _header(f"torchtitan job module ({TORCHTITAN_MODULE}.{TORCHTITAN_CONFIG_FN})", study_hash, model,
                       cluster, layout)
        texts[f"{TORCHTITAN_MODULE}.py"] = (torchtitan_job_module(model, cluster, training, layout, header=head,
                                                                  ckpt_interval_steps=ckpt_steps,
                                                                  checkpoint_async=checkpoint_async),
                                            "torchtitan 0.3 job (config_registry module)")
    if study_config is not None:
        texts[STUDY_CONFIG_NAME] = (
            f"# trainplan launch artifact: the study's resolved config (defaults filled)\n# study hash: {study_hash}\n"
            "# what `trainplan preflight` / `trainplan launch --config` read for this study\n"
            + yaml.safe_dump(dict(study_config), sort_keys=False, allow_unicode=True),
            "the study's resolved config (trainplan preflight --config)")
        config_path = str(out / STUDY_CONFIG_NAME)
    ds = deepspeed_config(model, cluster, training, layout, study_hash=study_hash)
    if ds is not None:
        texts["deepspeed_zero.json"] = (json.dumps(ds, indent=2, ensure_ascii=False) + "\n", "DeepSpeed ZeRO config (reference only)")
    arts: list[Artifact] = []
    for name, (text, what) in texts.items():
        p = write_text(out / name, text)
        if name.endswith(".sh"):
            p.chmod(0o755)
        arts.append(Artifact(name, text.count("\n") <= SHORT_MAX_LINES, what))
    write_json(out / "manifest.json", {
        "study_hash": study_hash, "layout": layout.to_dict(),
        "trainer": {"chosen": trainer, "why": why,
                    "deviations": deviations(plan_deviations(model, cluster, training, layout, trainer)),
                    "as_launched": launched,
                    "torchtitan": "written" if not titan_no else "; ".join(titan_no),
                    "torchtitan_parallelism": settings["parallelism"] if settings else None,
                    "hf_model_config": "written" if hf_why is None else hf_why,
                    "accelerate_line": accelerate_node_command(cluster, train_script=train_script,
                                                               train_args=train_args),
                    "torchtitan_line": torchtitan_node_command(cluster) if not titan_no else None,
                    "checkpoint_interval_s": checkpoint_interval_s, "checkpoint_interval_steps": ckpt_steps,
                    "total_steps": total_steps(training)},
        "deepspeed": ("written (reference only: no launch line uses it; the sbatch script runs "
                      f"{trainer})") if ds is not None else deepspeed_unsupported_reason(layout),
        "day1": day1_commands(cluster, trainer=trainer, summary_path=summary_path, config_path=config_path,
                              min_tokens_per_s_per_gpu=min_tokens_per_s_per_gpu,
                              checkpoint_interval_s=checkpoint_interval_s, study_hash=study_hash,
                              titan_ingest=titan_ingest_flags(model, training, layout, cluster, summary_path),
                              fp8_parity=parity),
        "artifacts": [{"filename": a.filename, "short": a.short, "description": a.description} for a in arts]})
    return [(a.filename, a.short) for a in arts]


# -------------------------------------------------------------------------------------------- CLI
def load_inputs(summary: str, config: str | Sequence[str]) -> tuple[Any, ModelSpec, ClusterSpec, TrainingSpec, Layout]:
    """(StudyConfig, model, cluster, training, chosen layout) from a config (or configs deep-merged in order) and an
    analytic summary.json; the launch and preflight CLIs share it."""

    cfg = load_config(config if isinstance(config, str | Path) else list(config))
    try:
        doc = read_json_checked(summary)
        layout_d = doc["layout"]
        if not isinstance(layout_d, dict):
            raise TypeError(layout_d)
    except FileNotFoundError:
        raise ConfigError("summary", summary, "no such file; run the analytic_model rule first") from None
    except (KeyError, TypeError, IndexError, InputFileError):
        raise ConfigError("summary", summary, "a summary.json with a 'layout' object") from None
    if doc.get("status", "ok") != "ok":
        raise ConfigError("summary.status", doc.get("status"), "'ok': the study found no layout to launch")
    if "dp" not in layout_d:  # tp, pp, cp default to 1; a missing dp would silently become 1 too
        raise ConfigError("summary.layout", layout_d, "needs its data-parallel degree dp")
    try:
        layout = Layout.from_dict(layout_d)
        # the summary must be this config's: a stale one (another cluster, model or batch) is refused, not launched
        check_layout(cfg.model, cfg.cluster, cfg.training, layout)
    except ConfigError as e:
        raise ConfigError(f"summary.layout ({e.key})", e.value, f"{e.valid}; is {summary} the summary of this "
                          "config? (rerun the study after changing the config)") from None
    return cfg, cfg.model, cfg.cluster, cfg.training, layout


def study_hash_of(cfg: Any) -> str:
    """The study hash (``provenance.study_hash``: the one definition, also used by the memo and the workflow)."""

    return study_hash(cfg)


def _plan_numbers(summary: str, cost: str | None, production: str | None) -> dict[str, float | None]:
    """checkpoint_interval_s (cost.json), step_time_s (summary's estimate), min tokens/s/GPU (production p10)."""
    results = Path(summary).resolve().parent.parent

    def num(path: Path | None, *keys: str) -> float | None:
        if path is None or not path.is_file():
            return None
        try:
            v: Any = read_json(path)
            for k in keys:
                v = v[k]
        except (KeyError, TypeError, ValueError, OSError):
            return None
        return float(v) if isinstance(v, int | float) and not isinstance(v, bool) and v > 0 else None

    h = num(Path(cost) if cost else results / "cost" / "cost.json", "checkpoint_interval_h")
    tps = num(Path(production) if production else results / "prediction" / "production.json",
              "chosen", "tokens_per_s_per_gpu_p10")
    # the study's own files are optional (the script then reads them at run time); a file named on purpose is not
    if cost and h is None:
        raise ConfigError("cost", cost, "a cost.json with checkpoint_interval_h > 0 (the cost_and_risk rule's)")
    if production and tps is None:
        raise ConfigError("production", production,
                          "a production.json with chosen.tokens_per_s_per_gpu_p10 > 0 (the predict_production rule's)")
    return {"checkpoint_interval_s": h * 3600 if h else None,
            "step_time_s": num(Path(summary), "estimate", "step_time_s"), "min_tokens_per_s_per_gpu": tps}


def main(argv: Sequence[str] | None = None) -> int:
    """``trainplan launch``: write the launch artifacts for the chosen layout."""
    ap = argparse.ArgumentParser(
        prog="trainplan launch", description=__doc__.split("\n\n")[0],
        epilog="example: trainplan launch --summary results/analytic/summary.json --config config/config.yaml "
               "--out results/launch", formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--summary", required=True, help="analytic summary.json (its 'layout' is used)")
    ap.add_argument("--config", required=True, nargs="+",
                    help="the study config (model, cluster, training); several files are deep-merged in order (a "
                         "variant overlay after config/config.yaml), or the study's launch/study_config.yaml")
    ap.add_argument("--out", required=True, help="output directory")
    ap.add_argument("--study-hash", help="hash for the headers (default: config_hash of the config)")
    ap.add_argument("--train-script", default=DEFAULT_TRAIN_SCRIPT,
                    help="training script for accelerate launch / torchrun (default: -m trainplan.train_entry)")
    ap.add_argument("--time-limit-h", type=float, help="Slurm --time in hours (default: config launch.time_limit_h)")
    ap.add_argument("--cost", help="cost.json (Young/Daly checkpoint_interval_h; default: cost/cost.json beside "
                    "the summary's analytic/ directory, if present)")
    ap.add_argument("--production", help="production.json (p10 tokens/s/GPU for the day-1 check; default: "
                    "prediction/production.json beside analytic/, if present)")
    a = ap.parse_args(argv)
    try:
        cfg, model, cluster, training, layout = load_inputs(a.summary, a.config)
        h = a.study_hash or study_hash_of(cfg)
        opts = {k: v for k, v in dict(getattr(cfg, "launch", None) or {}).items() if k in LAUNCH_OPTIONS}
        if a.time_limit_h is not None:
            opts["time_limit_h"] = a.time_limit_h
        extra = _plan_numbers(a.summary, a.cost, a.production)
        arts = write_artifacts(model, cluster, training, layout, a.out, study_hash=h,
                               train_script=a.train_script, options=opts, summary_path=a.summary,
                               config_path=a.config, eff=cfg.efficiency if not isinstance(cfg.efficiency, dict)
                               else None, **extra)
        for name, _ in arts:
            if name.endswith(".sh"):
                bash_syntax_check(Path(a.out) / name)
    except ConfigError as e:
        print(f"trainplan launch: {e}", file=sys.stderr)
        return 2
    except OSError as e:  # --out not writable, a file, ...
        print(f"trainplan launch: out={a.out!r}: cannot write: {e.strerror or e}", file=sys.stderr)
        return 2
    for name, short in arts:
        print(f"{Path(a.out) / name}  ({'inline' if short else 'attach'})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
