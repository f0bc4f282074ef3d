"""Which existing trainer runs the chosen layout, and its job config.

Two trainers, both someone else's engine:

* **torchtitan 0.3** (``torchrun -m torchtitan.train --module trainplan_torchtitan --config trainplan_job``):
  FSDP2/HSDP, TP (+SP) and async TP, PP schedules (1F1B, Interleaved1F1B), CP, full/selective activation
  checkpointing, torch.compile, DCP checkpoints with resume. torchtitan 0.3 has no TOML job files any more:
  a job is a Python ``config_registry`` function returning ``Trainer.Config``, plus ``--section.key`` overrides.
  We write one such module (:func:`torchtitan_job_module`): the model is torchtitan's own Llama 3 decoder
  built to this ModelSpec's exact shapes (parameter count checked against ``ModelSpec.n_params`` in tests).
  torchtitan 0.3's trainer needs an accelerator: on a CPU-only torch ``utils.device_type`` falls back to
  ``"cuda"`` and ``Trainer.__init__`` fails in ``torch.cuda.set_device`` — so on CPU we validate the module with
  torchtitan's own ``ConfigManager`` (and build its model on the meta device), and never run it.
* **Hugging Face Transformers under ``accelerate launch``** with the generated FSDP2 config, through
  :mod:`trainplan.train_entry` (random init from ``config.json`` or the checkpoint's weights): the model the
  proxies measure, the checkpoint-on-SIGTERM handling, and it runs (and is tested) on CPU with gloo.

:func:`choose_trainer` picks torchtitan when the layout needs what only torchtitan has (pp, tp, cp, compiled
kernels, async TP) and the model is a Llama-shaped decoder; otherwise Accelerate + Transformers.
"""

from __future__ import annotations

import json
import math
import pprint
from typing import Any

from trainplan.model.arch import ModelSpec, torchtitan_problems
from trainplan.model.hardware import ClusterSpec
from trainplan.model.layout import Layout, grad_accum, shard_degree, torchtitan_launch
from trainplan.model.memory import LOSS_CHUNKS, logits_bytes
from trainplan.model.training import TrainingSpec
from trainplan.train_entry import checkpoint_interval_s_from_cost

__all__ = ["TORCHTITAN_VERSION", "TORCHTITAN_MODULE", "TORCHTITAN_CONFIG_FN", "UNMODELLED_KINDS", "Deviation",
           "checkpoint_interval_steps", "choose_trainer", "deviations", "offload_note", "torchtitan_model_problems",
           "torchtitan_settings", "torchtitan_job_module", "total_steps"]

TORCHTITAN_VERSION = "0.3.0"
ATTN_KERNEL_NAMES = {"fa2": "FlashAttention-2", "cudnn": "cuDNN"}  # training.attn_kernel
TORCHTITAN_MODULE = "trainplan_torchtitan"  # the file written next to the sbatch script (on PYTHONPATH there)
TORCHTITAN_CONFIG_FN = "trainplan_job"
ROPE_THETA_LLAMA2 = 10000.0
PP_SCHEDULES = {"1f1b": "1F1B", "interleaved": "Interleaved1F1B"}  # torch.distributed.pipelining names


class Deviation(str):
    """A launch note saying the trainer runs something other than the planned layout (all-gather CP for Ulysses,
    FSDP2's whole-model CPU offload for an optimizer-only one, FlexAttention for SDPA, ...): the plan's prediction is
    not for what it runs. The manifest lists these for the trainer the sbatch runs and the memo prints them; other
    notes only explain a setting.

    It also says what runs instead, in the planner's own terms, so that the launch can be judged on it
    (:func:`trainplan.launch.artifacts.as_launched`): ``layout`` and ``training`` are field changes to the planned
    :class:`Layout` / :class:`TrainingSpec` (``{"sp": False}``: TP without SP), ``extra_bytes`` is memory per GPU
    the planner has no term for (torchtitan's gathered K/V), and ``unmodelled`` names what the model cannot say
    about it (``"memory"``, ``"step time"``): there the plan's figures stay, and the memo says so. ``memory_only``:
    the change moves the peak and nothing the step-time model reads (torchtitan's chunked loss), so the speed as
    launched does not name it. ``short`` is a
    few words for page 1 ("TP without SP"). ``cannot_run``: the trainer cannot run the layout at all (Accelerate
    has no pipeline parallelism): the study does not choose it (``launch.artifacts.plan_search``)."""

    short: str
    layout: dict[str, Any]
    training: dict[str, Any]
    extra_bytes: float
    unmodelled: tuple[str, ...]
    cannot_run: bool
    memory_only: bool

    def __new__(cls, text: str, *, short: str, layout: dict[str, Any] | None = None,
                training: dict[str, Any] | None = None, extra_bytes: float = 0.0,
                unmodelled: tuple[str, ...] = (), cannot_run: bool = False, memory_only: bool = False) -> Deviation:
        bad = [u for u in unmodelled if u not in UNMODELLED_KINDS]
        if bad:
            raise ValueError(f"Deviation unmodelled={bad!r}: each one of {UNMODELLED_KINDS}")
        obj = super().__new__(cls, text)
        obj.short = short
        obj.layout, obj.training = dict(layout or {}), dict(training or {})
        obj.extra_bytes, obj.unmodelled = float(extra_bytes), tuple(unmodelled)
        obj.cannot_run, obj.memory_only = bool(cannot_run), bool(memory_only)
        if obj.cannot_run and set(obj.unmodelled) != set(UNMODELLED_KINDS):
            raise ValueError("Deviation cannot_run: nothing about a run that cannot happen is modelled "
                             f"(unmodelled={UNMODELLED_KINDS})")
        return obj

    def __reduce__(self) -> tuple[Any, ...]:  # copy and pickle: the keywords, not only the text
        return (_deviation, (str(self), self.short, self.layout, self.training, self.extra_bytes, self.unmodelled,
                             self.cannot_run, self.memory_only))


UNMODELLED_KINDS = ("memory", "step time")


def _deviation(text: str, short: str, layout: dict[str, Any], training: dict[str, Any], extra_bytes: float,
               unmodelled: tuple[str, ...], cannot_run: bool = False, memory_only: bool = False) -> Deviation:
    """:class:`Deviation` from its fields, positionally (its ``__reduce__``)."""
    return Deviation(text, short=short, layout=layout, training=training, extra_bytes=extra_bytes,
                     unmodelled=unmodelled, cannot_run=cannot_run, memory_only=memory_only)


def deviations(notes: list[str]) -> list[str]:
    """The notes that are :class:`Deviation` s, as plain strings."""
    return [str(n) for n in notes if isinstance(n, Deviation)]


def offload_note(what: str, sharding: str) -> str:
    """FSDP2's CPUOffloadPolicy holds the sharded parameters, gradients and optimizer on the host: what the plan
    sizes for ZeRO-3/HSDP offload (memory.model_states), a deviation for ZeRO-1/2/DDP, planned as an optimizer-only
    offload (ZeRO-Offload) that keeps parameters and gradients on the GPU."""
    if sharding in ("zero3", "hsdp"):
        return (f"offload=cpu: {what} is FSDP2's CPUOffloadPolicy (parameters, gradients and optimizer on the host), "
                "as planned for sharding=" + sharding)
    return Deviation(f"offload=cpu: {what} is FSDP2's CPUOffloadPolicy (parameters, gradients and optimizer on the "
                     f"host); the plan costed sharding={sharding} with an optimizer-only offload (less host traffic, "
                     "more GPU memory)", short="whole-model CPU offload, not optimizer-only",
                     unmodelled=("memory", "step time"))


def total_steps(training: TrainingSpec) -> int:
    """Optimizer steps of the run: dataset tokens × epochs ÷ (global batch × sequence)."""
    return max(1, math.ceil(training.dataset_tokens * training.epochs / (training.global_batch * training.seq_len)))


def checkpoint_interval_steps(interval_s: float | None, step_time_s: float | None, *, default: int = 500) -> int:
    """The Young/Daly interval (cost.json ``checkpoint_interval_h`` in s) in whole steps of the predicted step time."""
    if not interval_s or not step_time_s or interval_s <= 0 or step_time_s <= 0:
        return default
    return max(1, round(interval_s / step_time_s))


def torchtitan_model_problems(model: ModelSpec, training: TrainingSpec) -> list[str]:
    """Why torchtitan's Llama 3 decoder cannot be this model / fine-tune exactly (empty: it can)."""
    return torchtitan_problems(model, training.finetune)


def choose_trainer(model: ModelSpec, training: TrainingSpec, layout: Layout) -> tuple[str, str]:
    """('torchtitan' | 'accelerate', why): which trainer the sbatch script runs for this layout. The choice is
    ``layout.torchtitan_launch`` (which the memory model reads too); this adds the reasons."""
    L = layout
    needs = [n for n, on in (("pp", L.pp > 1), ("tp", L.tp > 1), ("cp", L.cp > 1), ("async TP", L.tp_overlap),
                             ("compiled kernels", training.kernels == "compiled"),
                             ("FP8 rowwise", training.fp8 == "rowwise")) if on]
    if bool(torchtitan_launch(model, training, L)):
        named = [("cp (as torchtitan's all-gather CP; see deviations)" if n == "cp" else n) for n in needs]
        return "torchtitan", (f"the layout uses {', '.join(named)}, which torchtitan {TORCHTITAN_VERSION} runs "
                              "natively (Accelerate 1.x has no PP; its TP needs a transformers tp_plan)")
    titan_no = torchtitan_model_problems(model, training)
    if training.fp8 == "tensorwise" and not set(needs) - {"compiled kernels", "FP8 rowwise"}:
        return "accelerate", ("FP8 tensorwise: torchtitan 0.3's float8 converter has rowwise recipes only, so "
                              "Accelerate runs it (mixed_precision fp8, backend AO = torchao Float8 tensorwise)"
                              + ("; torch.compile through Accelerate's dynamo settings"
                                 if training.kernels == "compiled" else ""))
    if needs:
        return "accelerate", (f"the layout uses {', '.join(needs)} but torchtitan cannot build this model "
                              f"({'; '.join(titan_no)}); Accelerate + Transformers runs what it can express "
                              "(see the notes in accelerate_fsdp2.yaml)")
    return "accelerate", ("pure data parallelism (" + L.sharding + ") with eager kernels: Transformers' own model "
                          "under Accelerate FSDP2, through trainplan.train_entry (checkpoint on SIGTERM, per-step log)")


def torchtitan_settings(model: ModelSpec, cluster: ClusterSpec, training: TrainingSpec, layout: Layout, *,
                        ckpt_interval_steps: int = 500, steps: int | None = None,
                        checkpoint_async: bool = True) -> tuple[dict[str, Any], list[str]]:
    """The Trainer.Config fields (by section) for the layout, and notes on what is approximated or missing."""
    L, notes = layout, []
    ga = grad_accum(training, L)
    if L.sharding == "none":
        replicate, shard = L.dp, 1
    elif L.sharding == "hsdp":
        g = L.shard_group or shard_degree(L, cluster)
        shard = max(1, g // L.cp) if g % L.cp == 0 else 1
        replicate = max(1, L.dp // shard)
    else:
        replicate, shard = 1, L.dp
    if L.sharding in ("zero1", "zero2"):
        notes.append(Deviation(f"sharding={L.sharding}: torchtitan has FSDP2 only; fsdp_reshard_after_forward="
                               "'never' keeps the gathered parameters between forward and backward (ZeRO-2-like "
                               "memory)", short=f"FSDP2 for {'ZeRO-1' if L.sharding == 'zero1' else 'ZeRO-2'}", layout={"sharding": "zero2"}))
    par: dict[str, Any] = {
        "data_parallel_replicate_degree": replicate, "data_parallel_shard_degree": shard,
        "fsdp_reshard_after_forward": "always" if L.sharding in ("zero3", "hsdp") else "never",
        "tensor_parallel_degree": L.tp, "enable_sequence_parallel": bool(L.sp) if L.tp > 1 else True,
        "pipeline_parallel_degree": L.pp, "context_parallel_degree": L.cp,
    }
    if L.pp > 1:
        par["pipeline_parallel_schedule"] = PP_SCHEDULES[L.pp_schedule]
        par["pipeline_parallel_microbatch_size"] = L.micro_batch
        if L.pp_schedule == "interleaved" and L.vpp > 1:
            par["pipeline_parallel_layers_per_stage"] = max(1, model.layers // (L.pp * L.vpp))
            if model.layers % (L.pp * L.vpp):
                notes.append(f"layers={model.layers} not divisible by pp·vpp={L.pp * L.vpp}: torchtitan rounds "
                             "layers per stage (the last stage is lighter)")
    else:
        par["pipeline_parallel_schedule"] = "1F1B"
    if L.tp > 1 and not L.sp:
        notes.append("tp without sp: torchtitan's llama3 TP plan always shards the norms' sequence dim when "
                     "enable_sequence_parallel is true; set false here as planned")
    # torchtitan 0.3's language models attend only through masked backends, FlexAttention by default: its SDPA
    # backend is refused for them (models/common/config_utils.py, get_attention_config), since its dataloaders emit
    # per-document positions and every mask is block-causal
    planned = ("materialised (math) attention" if training.attn_impl == "math"
               else f"SDPA flash attention ({ATTN_KERNEL_NAMES[training.attn_kernel]})")
    notes.append(Deviation(f"attention: torchtitan {TORCHTITAN_VERSION} runs a language model's attention as "
                           "FlexAttention (Triton kernels Inductor generates) under block-causal masks, causal within each "
                           "document of the packed sequence (it refuses SDPA for language models), not the plan's "
                           f"{planned} over one causal mask. The step time keeps the plan's attention: per-document "
                           "masks only remove work, and FlexAttention's rate against the planned kernel is not "
                           "measured here (benchmarks/bench_flex_attention.py measures it on a GPU)",
                           short="FlexAttention with per-document masks"))
    if L.cp > 1:
        # its CP for FlexAttention all-gathers K and V over the CP group (distributed/context_parallel/api.py) instead
        # of rotating them in a ring: autograd keeps the gathered K, V of every layer, cp× the ring's local ones
        kv = 2 * layout.micro_batch * training.seq_len * (1 - 1 / L.cp) * model.kv_dim / L.tp * 2
        extra = kv * -(-model.layers // L.pp) / 2**30
        notes.append(Deviation(f"cp={L.cp} ({L.cp_kind} planned): torchtitan {TORCHTITAN_VERSION} runs CP for its "
                               "FlexAttention by all-gathering K and V over the CP group (no ring, no Ulysses); the "
                               f"gathered K, V that backward keeps add about {extra:.1f} GiB per GPU to the plan's "
                               "memory (bf16, every layer of the stage)",
                               short=f"all-gather CP, not {'Ulysses' if L.cp_kind == 'ulysses' else 'ring'} CP",
                               extra_bytes=extra * 2**30, unmodelled=("step time",)))
    # batch: without PP a rank processes micro_batch per forward, accumulating ga; with PP the local batch
    # is split into pipeline micro-batches of micro_batch
    local = L.micro_batch * ga if L.pp > 1 else L.micro_batch
    train: dict[str, Any] = {"local_batch_size": local, "global_batch_size": training.global_batch,
                             "seq_len": training.seq_len, "steps": int(steps or total_steps(training)),
                             "enable_cpu_offload": L.offload == "cpu",
                             "mixed_precision_param": "bfloat16" if training.half else "float32",
                             "disable_cuda_graphs": True}
    if L.offload == "cpu":
        notes.append(offload_note("torchtitan enable_cpu_offload", L.sharding))
    ac = {"none": None, "full": "full", "selective": "selective"}[L.recompute]
    compile_ = {"enable": training.kernels == "compiled" or L.tp_overlap,
                "enable_async_tensor_parallel": bool(L.tp_overlap)}
    if training.kernels == "fused":
        notes.append(Deviation("kernels=fused (Megatron/Transformer Engine kernels) has no torchtitan equivalent; "
                               "torch.compile is enabled as the nearest", short="torch.compile for fused kernels",
                               training={"kernels": "compiled"}))
        compile_["enable"] = True
    # keep the last two checkpoints (torchtitan keeps 10 by default: ~12 B/param each, 1.5 TB at 13B): the newest to
    # resume from, the one before it if the newest was cut short
    ckpt = {"enable": True, "interval": int(ckpt_interval_steps), "async_mode": "async" if checkpoint_async else "disabled",
            "last_save_model_only": False, "folder": "checkpoint", "keep_latest_k": 2}
    # FP8: torchtitan 0.3's Float8LinearConverter offers the rowwise recipes only (recipe_name rowwise |
    # rowwise_with_gw_hp); the output projection stays bf16 (filter_fqns), as the planner models it.
    float8 = None
    if training.fp8 == "rowwise":
        float8 = {"recipe_name": "rowwise", "filter_fqns": ["lm_head", "output"]}
    elif training.fp8 == "tensorwise":
        notes.append(Deviation("precision=fp8-tensorwise: torchtitan 0.3's float8 converter has only rowwise recipes; "
                               "this job runs bf16 (use the Accelerate launch, fp8_config backend AO = torchao "
                               "tensorwise)", short="bf16 for FP8 tensorwise", training={"precision": "bf16"}))
    # the job's loss is torchtitan's ChunkedLossWrapper (torchtitan_job_module), not the plan's Hugging Face loss (its
    # fused nn.RMSNorm the plan sizes already: memory.hf_norms)
    d = 2 if training.half else 4
    saved = logits_bytes(model, training.seq_len, L.micro_batch, L.tp, L.cp, d, "eager", "held") - logits_bytes(
        model, training.seq_len, L.micro_batch, L.tp, L.cp, d, "eager", "chunked")
    notes.append(Deviation(f"loss: torchtitan's ChunkedLossWrapper runs the output head, loss and backward over "
                           f"{LOSS_CHUNKS} chunks of the sequence in turn, holding one chunk's logits and an fp32 "
                           "gradient buffer of the hidden states, not the whole micro-batch's logits that the plan "
                           f"sizes (Hugging Face's loss): about {saved / 2**30:.1f} GiB less on the last pipeline stage",
                           short="chunked loss", training={"logits_at_backward": "chunked"}, memory_only=True))
    return {"parallelism": par, "training": train, "activation_checkpoint": ac, "compile": compile_,
            "checkpoint": ckpt, "float8": float8,
            "optimizer": {"implementation": training.optimizer_impl}}, notes


def torchtitan_job_module(model: ModelSpec, cluster: ClusterSpec, training: TrainingSpec, layout: Layout, *,
                          header: str, ckpt_interval_steps: int = 500, steps: int | None = None,
                          checkpoint_async: bool = True) -> str:
    """Python source of a torchtitan 0.3 ``config_registry`` module: ``trainplan_job() -> Trainer.Config``."""
    s, notes = torchtitan_settings(model, cluster, training, layout, ckpt_interval_steps=ckpt_interval_steps,
                                   steps=steps, checkpoint_async=checkpoint_async)
    shapes = {"dim": model.hidden, "n_layers": model.layers, "n_heads": model.heads, "n_kv_heads": model.kv_heads,
              "hidden_dim": model.ffn_hidden, "vocab_size": model.vocab, "max_seq_len": max(model.max_seq_len,
                                                                                             training.seq_len),
              "tied": bool(model.tied_embeddings), "rope_theta": ROPE_THETA_LLAMA2}
    note_lines = "".join(f"# NOTE: {n}\n" for n in notes)
    return f'''{header}
{note_lines}#
# A torchtitan {TORCHTITAN_VERSION} job (torchtitan 0.3 reads Python config functions, not TOML). Run on every node:
#   PYTHONPATH=<this directory> torchrun ... -m torchtitan.train --module {TORCHTITAN_MODULE} --config {TORCHTITAN_CONFIG_FN}
# Any field can still be overridden on the command line (--training.steps 50, --checkpoint.interval 10, ...).
# Environment: TRAINPLAN_HF_ASSETS (tokenizer + config; the base checkpoint for initial_load_path),
# TRAINPLAN_DUMP_FOLDER (outputs/ and checkpoint/ live there; resume is automatic from its latest step),
# TRAINPLAN_DATASET_PATH: the fine-tune data (a `datasets` folder or data files with a "text" column), registered
# below as torchtitan dataset "trainplan" (its text loader reads only registered names: c4, c4_test, c4_validation);
# TRAINPLAN_DATASET names another registered one instead.
"""trainplan's torchtitan job: torchtitan's Llama 3 decoder at this model's exact shapes + the planned layout."""

import os

from torchtitan.components.loss import ChunkedLossWrapper, CrossEntropyLoss
from torchtitan.components.quantization import Float8LinearConverter
from torchtitan.components.validate import Validator
from torchtitan.config import CompileConfig, ParallelismConfig, TrainingConfig
from torchtitan.distributed.activation_checkpoint import FullAC, SelectiveAC
from datasets import load_dataset
from torchtitan.hf_datasets import DatasetConfig
from torchtitan.hf_datasets import text_datasets
from torchtitan.hf_datasets.text_datasets import HuggingFaceTextDataLoader
from torchtitan.models.common import ComplexRoPE, Embedding, Linear, RMSNorm
from torchtitan.models.llama3 import Llama3Model, model_registry
from torchtitan.models.llama3 import _EMBEDDING_INIT, _NORM_INIT, _build_llama3_layers, _output_linear_init
from torchtitan.models.llama3.config_registry import llama3_8b
from torchtitan.protocols.model_spec import ModelSpec

SHAPES = {pprint.pformat(shapes, width=110, sort_dicts=True)}
SETTINGS = {pprint.pformat(s, width=110, sort_dicts=True)}


def llama_model(attn_backend: str = "flex") -> Llama3Model.Config:
    """torchtitan's Llama 3 decoder (llama3.model) at the planned model's shapes."""
    d, v = SHAPES["dim"], SHAPES["vocab_size"]
    return Llama3Model.Config(
        dim=d, vocab_size=v, enable_weight_tying=SHAPES["tied"],
        tok_embeddings=Embedding.Config(num_embeddings=v, embedding_dim=d, param_init=_EMBEDDING_INIT),
        norm=RMSNorm.Config(normalized_shape=d, param_init=_NORM_INIT),
        lm_head=Linear.Config(in_features=d, out_features=v, param_init=_output_linear_init(d)),
        layers=_build_llama3_layers(
            fuse_qkv=True, n_layers=SHAPES["n_layers"], dim=d, n_heads=SHAPES["n_heads"],
            n_kv_heads=SHAPES["n_kv_heads"], hidden_dim=SHAPES["hidden_dim"],
            rope=ComplexRoPE.Config(dim=d // SHAPES["n_heads"], max_seq_len=SHAPES["max_seq_len"],
                                    theta=SHAPES["rope_theta"], scaling="none"),
            attn_backend=attn_backend))


def {TORCHTITAN_CONFIG_FN}():
    cfg = llama3_8b()  # torchtitan's production recipe (AdamW, warmup/decay, chunked loss, metrics) ...
    base = model_registry("8B")
    model_cfg = llama_model()
    # torchao Float8 on the block linears (torchtitan's converter); TRAINPLAN_PRECISION=bf16: without it, the bf16
    # reference run of the FP8 day-1 loss check (the sbatch's day1-loss-parity mode)
    if SETTINGS.get("float8") and os.environ.get("TRAINPLAN_PRECISION", "fp8") != "bf16":
        conv = Float8LinearConverter.Config(model_compile_enabled=SETTINGS["compile"]["enable"], **SETTINGS["float8"])
        model_cfg = conv.build().convert(model_cfg)
    cfg.model_spec = ModelSpec(name="llama3", flavor={json.dumps("trainplan-" + model.name)}, model=model_cfg,
                               parallelize_fn=base.parallelize_fn, pipelining_fn=base.pipelining_fn,
                               post_optimizer_build_fn=base.post_optimizer_build_fn,
                               state_dict_adapter=base.state_dict_adapter)  # ... at our model's shapes
    cfg.loss = ChunkedLossWrapper.Config(loss_fn=CrossEntropyLoss.Config(global_vocab_size=SHAPES["vocab_size"]))
    cfg.hf_assets_path = os.environ.get("TRAINPLAN_HF_ASSETS", "./assets/hf/PLACEHOLDER")
    cfg.dump_folder = os.environ.get("TRAINPLAN_DUMP_FOLDER", "./outputs")
    # the fine-tune data as a registered dataset (torchtitan's loader refuses unregistered names)
    text_datasets.DATASETS["trainplan"] = DatasetConfig(
        path=os.environ.get("TRAINPLAN_DATASET_PATH", "PLACEHOLDER_DATASET_PATH"),
        loader=lambda path: load_dataset(path, split="train"), sample_processor=lambda sample: sample["text"])
    cfg.dataloader = HuggingFaceTextDataLoader.Config(dataset=os.environ.get("TRAINPLAN_DATASET", "trainplan"),
                                                      dataset_path=os.environ.get("TRAINPLAN_DATASET_PATH") or None)
    cfg.training = TrainingConfig(**SETTINGS["training"])
    cfg.parallelism = ParallelismConfig(**SETTINGS["parallelism"])
    cfg.activation_checkpoint = {{"full": FullAC.Config, "selective": SelectiveAC.Config}}.get(
        SETTINGS["activation_checkpoint"], lambda: None)()
    cfg.compile = CompileConfig(**SETTINGS["compile"])
    for k, v in SETTINGS["optimizer"].items():  # the AdamW kernels the planner timed (training.optimizer_impl)
        setattr(cfg.optimizer, k, v)
    for k, v in SETTINGS["checkpoint"].items():
        setattr(cfg.checkpoint, k, v)
    if os.environ.get("TRAINPLAN_HF_ASSETS") and os.environ.get("TRAINPLAN_INITIAL_LOAD_HF", "1") == "1":
        cfg.checkpoint.initial_load_path = os.environ["TRAINPLAN_HF_ASSETS"]  # fine-tune: start from HF weights
        cfg.checkpoint.initial_load_in_hf = True
    cfg.validator = Validator.Config(enable=False)
    cfg.metrics.log_freq = 1
    cfg.profiler.enable_profiling = False
    return cfg
'''




def interval_from_results(cost_json: str, summary_json: str | None = None) -> tuple[int, int]:
    """(checkpoint interval s, in steps of the summary's predicted step time) from the study's result files."""

    s = checkpoint_interval_s_from_cost(cost_json)
    step = None
    if summary_json:
        try:
            from pathlib import Path

            step = float(json.loads(Path(summary_json).read_text(encoding="utf-8"))["estimate"]["step_time_s"])
        except (OSError, KeyError, TypeError, ValueError):
            step = None
    return int(round(s)), checkpoint_interval_steps(s, step)


def main(argv: list[str] | None = None) -> int:
    """``python -m trainplan.launch.trainers COST_JSON [SUMMARY_JSON]``: print "interval_s interval_steps" (the sbatch
    script reads the study's cost.json at run time when the artifacts were written without it)."""
    import sys

    args = sys.argv[1:] if argv is None else argv
    if not args:
        print("usage: python -m trainplan.launch.trainers COST_JSON [SUMMARY_JSON]", file=sys.stderr)
        return 2
    try:
        s, n = interval_from_results(args[0], args[1] if len(args) > 1 else None)
    except (OSError, ValueError) as e:
        print(f"trainplan.launch.trainers: {e}", file=sys.stderr)
        return 2
    print(s, n)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
