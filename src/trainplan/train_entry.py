"""A thin training entry point on existing engines, for the layouts torchtitan cannot run (and for CPU tests).

Everything that trains is someone else's code: the model is Hugging Face Transformers'
``AutoModelForCausalLM`` (random init from a ``config.json``, or the weights of a checkpoint directory), the
sharding is torch FSDP2 (``fully_shard`` per decoder layer, then the root), checkpoints are
``torch.distributed.checkpoint`` (DCP, sharded, resharding on load) through ``get_state_dict`` /
``set_state_dict``; LoRA adapters (``--finetune lora``) are Hugging Face PEFT's. This module only adds what a
production job needs around them:

* the data: a **tokenized dataset** = a flat array of token ids, either ``.npy`` (any integer dtype, its
  header says which) or a raw ``.bin`` of little-endian ``uint16`` (``--token-dtype uint32`` for vocabularies
  above 65 535). Sample ``i`` of the run is ``tokens[o : o + seq_len]`` with ``o = (i * seq_len) mod
  (n - seq_len)``; step ``s``, micro-batch ``m``, data-parallel rank ``r`` reads samples
  ``((s * grad_accum + m) * dp + r) * micro_batch + j``. The order is a function of the step alone, so a
  resumed run reads exactly what the uninterrupted run would have;
* checkpointing every ``--ckpt-interval-steps`` steps or ``--ckpt-interval-s`` seconds, or at the Young/Daly
  interval of ``--cost-json`` (``cost.json``'s ``checkpoint_interval_h``), into ``<ckpt-dir>/step-N``; the
  finished one is named in ``<ckpt-dir>/latest`` (written last, atomically), so a kill mid-save resumes from the
  previous one. Interval checkpoints are asynchronous (``--ckpt-async 1``, default: ``dcp.async_save`` over a
  gloo group; training goes on while they are written, as ``cost.checkpoint_async`` costs it); stop and final ones
  synchronous. A restart with the same ``--ckpt-dir`` resumes from ``latest`` automatically;
* **SIGTERM / SIGUSR1** (Slurm preemption, ``--signal``, ``scancel``) or a ``--stop-file`` appearing: every rank
  agrees (all-reduce) at the next step boundary, saves a checkpoint and exits 0 without writing ``DONE``; the
  sbatch script then requeues the job (``scontrol requeue``). On reaching ``--steps`` it writes
  ``<ckpt-dir>/DONE``. The save is certain on the stop file and on USR1, which the sbatch gets minutes before the
  time limit; a TERM from Slurm reaches torchrun's agent too, which kills the workers 30 s later, so a stop save
  longer than that is cut off and the run resumes from the previous ``latest``;
* a per-step **JSON-lines log** (rank 0): ``{"event": "step", "step", "loss", "lr", "tokens", "step_time_s",
  "tokens_per_s_per_gpu", "mfu", "peak_mem_bytes", "peak_mem_kind", ...}`` after one ``{"event": "start", ...}``
  line describing the run (model, world, layout, device); ``trainplan ingest`` turns it into a calibration
  record.

Every option can also come from the ``TRAINPLAN_*`` environment variables the generated sbatch script exports
(command-line flags win). Run it with ``torchrun`` (or ``accelerate launch``, which starts the same workers)::

    torchrun --nproc-per-node 2 -m trainplan.train_entry --model-config config.json --data tokens.npy \\
        --seq-len 128 --micro-batch 2 --grad-accum 1 --steps 20 --ckpt-dir ckpt --step-log steps.jsonl
"""

from __future__ import annotations

import argparse
import json
import math
import os
import resource
import signal
import sys
import time
from collections.abc import Sequence
from datetime import timedelta
from pathlib import Path
from typing import Any

import numpy as np

from trainplan.model.arch import resolve_model
from trainplan.model.base import ConfigError
from trainplan.model.flops import model_flops_per_token

EXIT_PREEMPTED = 0  # a clean stop on a signal: the checkpoint is written, the sbatch script requeues
ENV_PREFIX = "TRAINPLAN_"

# option name -> (type, default); each also read from TRAINPLAN_<NAME upper> when not on the command line
OPTIONS: dict[str, tuple[Any, Any]] = {
    "model_config": (str, None), "data": (str, None), "token_dtype": (str, "uint16"),
    "seq_len": (int, None), "micro_batch": (int, 1), "grad_accum": (int, 1), "steps": (int, None),
    "lr": (float, 3e-4), "warmup_steps": (int, 0), "weight_decay": (float, 0.0), "max_norm": (float, 1.0),
    "seed": (int, 0), "ckpt_dir": (str, None), "ckpt_interval_steps": (int, 0), "ckpt_interval_s": (float, 0.0),
    "cost_json": (str, None), "stop_file": (str, None), "step_log": (str, None), "device": (str, "auto"),
    "dtype": (str, "auto"), "reshard_after_forward": (int, 1), "activation_checkpointing": (int, 0),
    "shard_group": (int, 0),
    "peak_tflops": (float, 0.0), "collective_timeout_s": (int, 1800), "max_steps_this_run": (int, 0),
    "sleep_per_step_s": (float, 0.0), "optimizer_impl": (str, "fused"),
    "finetune": (str, "full"), "lora_rank": (int, 16), "lora_targets": (str, "q,k,v,o"),
    "ckpt_async": (int, 1),
}
# training.finetune values this entry point trains: full, or LoRA adapters through Hugging Face PEFT. QLoRA's NF4 base
# weights need bitsandbytes on CUDA under FSDP2, which it does not set up: refused before anything starts.
FINETUNES = ("full", "lora")
# trainplan's LoRA target names (training.LORA_TARGETS) → the Llama-family projection names PEFT matches
HF_LORA_MODULES = {"q": "q_proj", "k": "k_proj", "v": "v_proj", "o": "o_proj",
                   "gate": "gate_proj", "up": "up_proj", "down": "down_proj"}
# torch.optim.AdamW's kernels (training.optimizer_impl, which the planner times): fused (torchtitan's default; runs on
# CUDA and, in torch 2.13, on CPU with FSDP2's DTensor parameters) or foreach (PyTorch's multi-tensor ops).
OPTIMIZER_IMPLS = {"fused": {"fused": True}, "foreach": {"foreach": True}}


# -------------------------------------------------------------------------------------------- data
def load_tokens(path: str | Path, token_dtype: str = "uint16") -> np.ndarray:
    """The token ids of the dataset, memory-mapped (``.npy``: its own dtype; ``.bin``: ``token_dtype``)."""
    p = Path(path)
    if p.suffix == ".npy":
        arr = np.load(p, mmap_mode="r")
    else:
        if token_dtype not in ("uint16", "uint32", "int32", "int64"):
            raise ValueError(f"token_dtype={token_dtype!r}: one of uint16, uint32, int32, int64")
        arr = np.memmap(p, dtype=np.dtype(token_dtype).newbyteorder("<"), mode="r")
    if arr.ndim != 1 or not np.issubdtype(arr.dtype, np.integer):
        raise ValueError(f"{p}: a flat integer array of token ids is needed, got {arr.dtype} {arr.shape}")
    return arr


def write_tokens(path: str | Path, tokens: np.ndarray) -> Path:
    """Write a tokenized dataset in the documented format (``.npy`` keeps the dtype; ``.bin`` raw LE)."""
    p = Path(path)
    p.parent.mkdir(parents=True, exist_ok=True)
    if p.suffix == ".npy":
        np.save(p, tokens)
    else:
        np.ascontiguousarray(tokens).astype(tokens.dtype.newbyteorder("<")).tofile(p)
    return p


def batch_for(tokens: np.ndarray, *, step: int, micro: int, grad_accum: int, dp: int, dp_rank: int,
              micro_batch: int, seq_len: int) -> np.ndarray:
    """The (micro_batch, seq_len) int64 token ids of one micro-batch (see the module docstring)."""
    n = len(tokens)
    if n <= seq_len:
        raise ValueError(f"dataset has {n} tokens, fewer than seq_len+1={seq_len + 1}")
    span = n - seq_len
    first = ((step * grad_accum + micro) * dp + dp_rank) * micro_batch
    rows = [np.asarray(tokens[o:o + seq_len], dtype=np.int64)
            for o in (((first + j) * seq_len) % span for j in range(micro_batch))]
    return np.stack(rows)


# --------------------------------------------------------------------------------------- options
def parse_args(argv: Sequence[str] | None = None, env: dict[str, str] | None = None) -> argparse.Namespace:
    """Command line over ``TRAINPLAN_*`` environment over defaults."""
    env = dict(os.environ if env is None else env)
    ap = argparse.ArgumentParser(prog="python -m trainplan.train_entry",
                                 description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    for name, (typ, _) in OPTIONS.items():
        ap.add_argument("--" + name.replace("_", "-"), dest=name, type=typ, default=None,
                        help=f"(env {ENV_PREFIX}{name.upper()})")
    a = ap.parse_args(argv)
    for name, (typ, default) in OPTIONS.items():
        if getattr(a, name) is None:
            raw = env.get(ENV_PREFIX + name.upper())
            setattr(a, name, typ(raw) if raw not in (None, "") else default)
    missing = [n for n in ("model_config", "data", "seq_len", "steps") if getattr(a, n) is None]
    if missing:
        ap.error("missing: " + ", ".join("--" + m.replace("_", "-") for m in missing))
    if a.optimizer_impl not in OPTIMIZER_IMPLS:
        ap.error(f"--optimizer-impl={a.optimizer_impl!r}: one of {', '.join(OPTIMIZER_IMPLS)}")
    if a.finetune not in FINETUNES:
        ap.error(f"--finetune={a.finetune!r}: one of {', '.join(FINETUNES)} (qlora: its NF4 base weights need "
                 "bitsandbytes on CUDA, which this entry point does not set up)")
    targets = [t.strip() for t in a.lora_targets.split(",") if t.strip()]
    if a.finetune == "lora" and (not targets or any(t not in HF_LORA_MODULES for t in targets)
                                 or len(set(targets)) != len(targets)):
        ap.error(f"--lora-targets={a.lora_targets!r}: comma-separated, each at most once, of "
                 + ", ".join(HF_LORA_MODULES))
    if a.finetune == "lora" and a.lora_rank < 1:
        ap.error(f"--lora-rank={a.lora_rank}: a positive integer")
    if a.cost_json and not a.ckpt_interval_s and not a.ckpt_interval_steps:
        a.ckpt_interval_s = checkpoint_interval_s_from_cost(a.cost_json)
    return a


def checkpoint_interval_s_from_cost(path: str | Path) -> float:
    """Young/Daly checkpoint interval of a ``cost.json`` (``checkpoint_interval_h``), in seconds."""
    doc = json.loads(Path(path).read_text())
    h = doc.get("checkpoint_interval_h")
    if isinstance(h, dict):  # {p10, p50, p90}
        h = h.get("p50")
    if not isinstance(h, int | float) or not h > 0:
        raise ValueError(f"{path}: no positive checkpoint_interval_h")
    return float(h) * 3600.0


# ------------------------------------------------------------------------------------------ model
def hf_config(path: str | Path) -> Any:
    """The transformers config of a ``config.json`` file or a checkpoint directory holding one."""
    from transformers import AutoConfig

    return AutoConfig.from_pretrained(str(path))


def accelerate_fsdp_plugin(bf16: bool) -> Any:
    """Accelerate's FSDP2 plugin as the YAML configures it (read from the environment ``accelerate launch`` sets),
    with fp32 gradient reduction under bf16: left unset, Accelerate 1.16 reduces in the parameter dtype
    (``FullyShardedDataParallelPlugin.set_mixed_precision``), where the plan, torchtitan and the torchrun path reduce
    fp32 (``MixedPrecisionPolicy(reduce_dtype=float32)``). None without bf16."""
    if not bf16:
        return None
    import torch
    from accelerate.utils import FullyShardedDataParallelPlugin

    return FullyShardedDataParallelPlugin(mixed_precision_policy={"param_dtype": torch.bfloat16,
                                                                  "reduce_dtype": torch.float32})


def build_hf_model(path: str | Path, *, seed: int = 0, dtype: Any = None) -> Any:
    """``AutoModelForCausalLM``: the checkpoint's weights when the directory has them, else a seeded random init."""
    import torch
    from transformers import AutoModelForCausalLM

    p = Path(path)
    has_weights = p.is_dir() and any(p.glob("*.safetensors")) or (p.is_dir() and any(p.glob("pytorch_model*.bin")))
    if has_weights:
        return AutoModelForCausalLM.from_pretrained(str(p), dtype=dtype or torch.float32)
    cfg = hf_config(p)
    torch.manual_seed(seed)
    m = AutoModelForCausalLM.from_config(cfg, dtype=dtype or torch.float32)
    return m


def decoder_layers(model: Any) -> list[Any]:
    """The decoder blocks of a transformers causal LM (``model.model.layers`` for Llama/Mistral/Qwen2), also inside
    a PEFT wrapper."""
    if hasattr(model, "get_base_model"):  # peft.PeftModel
        model = model.get_base_model()
    base = getattr(model, "model", None) or getattr(model, "transformer", None) or model
    layers = getattr(base, "layers", None) or getattr(base, "h", None)
    if layers is None:
        raise ValueError(f"{type(model).__name__}: no decoder layer list (model.layers / transformer.h)")
    return list(layers)


def model_spec_of(path: str | Path) -> Any:
    """trainplan's ModelSpec of the same config (for model FLOPs per token, i.e. MFU), or None."""

    p = Path(path)
    try:
        return resolve_model(str(p / "config.json" if p.is_dir() else p))
    except (ConfigError, OSError, KeyError, TypeError, ValueError):
        return None


# ----------------------------------------------------------------------------------------- train
class _Stop:
    """Set by SIGTERM/SIGUSR1; polled at step boundaries (a handler must not run collectives)."""

    def __init__(self) -> None:
        self.signal: int | None = None

    def __call__(self, signum: int, frame: Any) -> None:
        self.signal = signum


def _peak_mem(device: Any) -> tuple[int, str]:
    import torch

    if device.type == "cuda":
        return int(torch.cuda.max_memory_reserved(device)), "cuda_max_reserved"
    # Linux ru_maxrss is KiB: the process's peak resident set (weights, optimizer, activations, allocator)
    return int(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss) * 1024, "cpu_max_rss"


def _write_atomic(path: Path, text: str) -> None:
    tmp = path.with_name(path.name + f".tmp{os.getpid()}")
    tmp.write_text(text)
    os.replace(tmp, path)


def latest_checkpoint(ckpt_dir: str | Path | None) -> Path | None:
    """The finished checkpoint ``<ckpt_dir>/latest`` names, or None."""
    if not ckpt_dir:
        return None
    f = Path(ckpt_dir) / "latest"
    if not f.is_file():
        return None
    p = Path(ckpt_dir) / f.read_text().strip()
    return p if p.is_dir() else None


# transformers' RMSNorm classes that compute w · (x·rsqrt(mean(x²) + ε)) in fp32 and cast back (Gemma's 1 + w is
# another formula and is left alone)
HF_RMSNORMS = ("LlamaRMSNorm", "MistralRMSNorm", "Qwen2RMSNorm", "Qwen3RMSNorm")


def fused_rms_norms(model: Any) -> int:
    """Swap transformers' eager RMSNorm (``HF_RMSNORMS``) for ``torch.nn.RMSNorm`` (same weight and ε); returns how
    many. The eager module upcasts to fp32 in separate ops and saves its fp32 input and x·rstd for backward (6h + 4
    bytes per token per norm in bf16, measured with saved_tensors_hooks); ``F.rms_norm``'s fused CUDA kernel saves
    the input and rstd (2h + 4): what the plan sizes (memory.saved_activation_bytes_per_layer, norm_impl "fused")
    and what our H200 records measured for the proxy harness, which uses it. 13B, seq 4096: ~6 GiB per GPU."""
    import torch

    swapped = 0
    for name, mod in list(model.named_modules()):
        if type(mod).__name__ not in HF_RMSNORMS:
            continue
        w = mod.weight
        new = torch.nn.RMSNorm(tuple(w.shape), eps=float(getattr(mod, "variance_epsilon", 1e-6)), device=w.device,
                               dtype=w.dtype)
        with torch.no_grad():
            new.weight.copy_(w)
        parent_name, _, attr = name.rpartition(".")
        setattr(model.get_submodule(parent_name) if parent_name else model, attr, new)
        swapped += 1
    return swapped


def add_lora(model: Any, rank: int, targets: str | Sequence[str]) -> Any:
    """The model with Hugging Face PEFT LoRA adapters (Hu et al. 2021) on the named projections of every decoder
    layer: rank ``rank``, α = 2·rank (the scale 2 trainplan's proxies and plan use), no dropout; base weights frozen.
    Applied before FSDP2, which shards frozen base weights and trainable adapters in the same units."""
    from peft import LoraConfig, get_peft_model

    names = [HF_LORA_MODULES[t.strip()] for t in (targets.split(",") if isinstance(targets, str) else targets)
             if t.strip()]
    return get_peft_model(model, LoraConfig(r=rank, lora_alpha=2 * rank, lora_dropout=0.0, target_modules=names))


def micro_backward(model: Any, ids: Any, grad_accum: int, accelerator: Any = None) -> Any:
    """Forward and backward of one micro-batch (loss scaled by 1/grad_accum); returns its scaled loss, detached.

    FSDP2 reduce-scatters the gradients after *every* micro-batch, so each rank only ever holds its gradient shard:
    the plan's memory (sharded gradients) and time (ZeRO-2: one reduce-scatter per micro-batch,
    ``timing.dp_comm_step_s``). Switching gradient sync off for all but the last micro-batch
    (``set_requires_gradient_sync(False)``) would save those reductions but keep the *unsharded* fp32 gradients
    of the whole model on every rank (52 GB for a 13B model), which the plan does not have room for."""
    out = model(input_ids=ids, labels=ids)
    loss = out.loss / grad_accum
    if accelerator is not None:
        accelerator.backward(loss)
    else:
        loss.backward()
    return loss.detach()


def train(a: argparse.Namespace) -> int:
    """Run (or resume) the job described by the parsed options; return the exit code."""
    import torch
    import torch.distributed as dist
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.state_dict import get_state_dict, set_state_dict
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard

    stop = _Stop()
    signal.signal(signal.SIGTERM, stop)
    signal.signal(signal.SIGUSR1, stop)

    use_cuda = a.device == "cuda" or (a.device == "auto" and torch.cuda.is_available())
    local_rank = int(os.environ.get("LOCAL_RANK", "0"))
    if use_cuda:
        torch.cuda.set_device(local_rank)
    device = torch.device("cuda", local_rank) if use_cuda else torch.device("cpu")
    if not dist.is_initialized():
        dist.init_process_group("nccl" if use_cuda else "gloo", timeout=timedelta(seconds=a.collective_timeout_s))
    rank, world = dist.get_rank(), dist.get_world_size()
    g = a.shard_group if 0 < a.shard_group < world and world % a.shard_group == 0 else world
    # HSDP (the layout's shard_group): shard inside groups of g ranks, replicate across them (2-D mesh)
    mesh = init_device_mesh(device.type, (world // g, g), mesh_dim_names=("replicate", "shard")) if g < world \
        else init_device_mesh(device.type, (world,))
    bf16 = a.dtype == "bf16" or (a.dtype == "auto" and use_cuda)

    model = build_hf_model(a.model_config, seed=a.seed).to(device)
    norms_swapped = fused_rms_norms(model)
    if a.finetune == "lora":
        model = add_lora(model, a.lora_rank, a.lora_targets)
    accelerator = None
    warnings: list[str] = []
    if os.environ.get("ACCELERATE_USE_FSDP", "").lower() == "true":
        # started by `accelerate launch --config_file accelerate_fsdp2.yaml`: Accelerate applies the config's
        # FSDP2 plugin (per-LlamaDecoderLayer fully_shard, activation checkpointing, mixed precision, HSDP/TP/CP)
        from accelerate import Accelerator
        from accelerate.utils import DistributedType

        accelerator = Accelerator(fsdp_plugin=accelerate_fsdp_plugin(bf16) if use_cuda else None)
        if accelerator.distributed_type != DistributedType.FSDP and world > 1:
            # measured (accelerate 1.16, CPU): the FSDP config resolves to DistributedType.NO on CPU — no sharding
            # and no gradient synchronisation, every rank trains its own copy. Refuse that; shard with FSDP2 here.
            warnings.append(f"accelerate resolved the FSDP config to {accelerator.distributed_type} on "
                            f"{device.type} (no sharding, no gradient sync); torch FSDP2 applied directly instead")
            accelerator = None
    if accelerator is not None:
        opt = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=a.lr,
                                weight_decay=a.weight_decay,
                                **OPTIMIZER_IMPLS[a.optimizer_impl])
        model, opt = accelerator.prepare(model, opt)
        engine = "transformers AutoModelForCausalLM + Accelerate FSDP2 (accelerate_fsdp2.yaml) + DCP"
    else:
        if a.activation_checkpointing:
            model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
        mp = MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.float32) if bf16 \
            else MixedPrecisionPolicy()
        for layer in decoder_layers(model):
            fully_shard(layer, mesh=mesh, reshard_after_forward=bool(a.reshard_after_forward), mp_policy=mp)
        fully_shard(model, mesh=mesh, reshard_after_forward=bool(a.reshard_after_forward), mp_policy=mp)
        opt = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=a.lr,
                                weight_decay=a.weight_decay,
                                **OPTIMIZER_IMPLS[a.optimizer_impl])
        engine = "transformers AutoModelForCausalLM + torch FSDP2 (fully_shard) + DCP"
    # what actually got sharded: FSDP2 turns parameters into DTensors (Accelerate's FSDP on CPU does not)
    sharded = any(type(p).__name__ == "DTensor" for p in model.parameters())
    local_params = sum((p.to_local() if hasattr(p, "to_local") else p).numel() for p in model.parameters())
    sched = torch.optim.lr_scheduler.LambdaLR(
        opt, lambda s: min(1.0, (s + 1) / a.warmup_steps) if a.warmup_steps > 0 else 1.0)
    n_params = sum(p.numel() for p in model.parameters())  # global (DTensor numel is the full size)
    n_trainable = sum(p.numel() for p in model.parameters() if p.requires_grad)

    start_step = 0
    resumed_from = latest_checkpoint(a.ckpt_dir)
    if resumed_from is not None:
        msd, osd = get_state_dict(model, opt)
        state = {"model": msd, "optim": osd, "trainer": {"step": 0}, "sched": sched.state_dict()}
        dcp.load(state, checkpoint_id=str(resumed_from))
        set_state_dict(model, opt, model_state_dict=state["model"], optim_state_dict=state["optim"])
        sched.load_state_dict(state["sched"])
        start_step = int(state["trainer"]["step"])

    def state(step: int) -> dict[str, Any]:
        msd, osd = get_state_dict(model, opt)
        return {"model": msd, "optim": osd, "trainer": {"step": step}, "sched": sched.state_dict()}

    def publish(path: Path) -> None:  # every rank's shards are written: name it the one to resume from
        dist.barrier()
        if rank == 0:
            _write_atomic(Path(a.ckpt_dir) / "latest", path.name + "\n")
        dist.barrier()

    def save(step: int) -> Path:
        path = Path(a.ckpt_dir) / f"step-{step}"
        dcp.save(state(step), checkpoint_id=str(path))
        publish(path)
        return path

    # Interval checkpoints are asynchronous (cost.checkpoint_async, what the plan costs): dcp.async_save stages the
    # state to host memory, training goes on while a thread writes it over its own gloo group, and ``latest`` names
    # it once every rank's write is done (agreed each step). Stop and final saves are synchronous.
    ckpt_pg = dist.new_group(backend="gloo") if (a.ckpt_dir and a.ckpt_async) else None
    pending: dict[str, Any] = {}

    def finish_pending() -> None:
        if pending:
            pending["future"].result()
            publish(pending["path"])
            emit({"event": "checkpoint", "step": pending["step"], "path": str(pending["path"]),
                  "save_s": pending["stall_s"], "write_s": time.perf_counter() - pending["t0"], "async": True,
                  "reason": "interval", "time": time.time()})
            pending.clear()

    tokens = load_tokens(a.data, a.token_dtype)
    spec = model_spec_of(a.model_config)

    flops_tok = model_flops_per_token(spec, a.seq_len) if spec is not None else None
    log = open(a.step_log, "a", encoding="utf-8") if (a.step_log and rank == 0) else None  # noqa: SIM115

    def emit(rec: dict[str, Any]) -> None:
        if log is not None:
            log.write(json.dumps(rec, sort_keys=True) + "\n")
            log.flush()

    emit({"event": "start", "time": time.time(), "start_step": start_step, "steps": a.steps,
          "resumed_from": str(resumed_from) if resumed_from else None, "world_size": world,
          "nnodes": int(os.environ.get("GROUP_WORLD_SIZE", os.environ.get("SLURM_NNODES", "1")) or 1),
          "device": device.type, "device_name": torch.cuda.get_device_name(device) if use_cuda else "cpu",
          "backend": dist.get_backend(), "dtype": "bf16" if bf16 else "fp32", "model_config": str(a.model_config),
          "model_spec": spec.to_dict() if spec is not None and hasattr(spec, "to_dict") else None,
          "n_params": n_params, "trainable_params": n_trainable, "finetune": a.finetune,
          "rms_norms_fused": norms_swapped,
          "lora": {"rank": a.lora_rank, "targets": a.lora_targets} if a.finetune == "lora" else None,
          "optimizer_impl": a.optimizer_impl, "seq_len": a.seq_len,
          "micro_batch": a.micro_batch, "grad_accum": a.grad_accum,
          "global_batch": a.micro_batch * a.grad_accum * world,
          "layout": {"dp": world, "tp": 1, "pp": 1, "cp": 1,
                     "sharding": "hsdp" if g < world else ("zero3" if a.reshard_after_forward else "zero2"),
                     "shard_group": g if g < world else None,
                     "recompute": "full" if a.activation_checkpointing else "none", "micro_batch": a.micro_batch},
          "engine": engine, "sharded": sharded, "local_params_rank0": local_params,
          "wrapped_as": type(model).__name__, "warnings": warnings,
          "accelerate_distributed_type": str(accelerator.distributed_type) if accelerator is not None else None,
          "torch_version": torch.__version__,
          "ckpt_interval_steps": a.ckpt_interval_steps, "ckpt_interval_s": a.ckpt_interval_s})

    last_ckpt_t = time.time()
    step = start_step
    exit_code = 0
    steps_this_run = 0
    model.train()
    while step < a.steps:
        t0 = time.perf_counter()
        if use_cuda:
            torch.cuda.reset_peak_memory_stats(device)
        loss_sum = torch.zeros((), device=device)
        for m in range(a.grad_accum):
            ids = torch.from_numpy(batch_for(tokens, step=step, micro=m, grad_accum=a.grad_accum, dp=world,
                                             dp_rank=rank, micro_batch=a.micro_batch, seq_len=a.seq_len)).to(device)
            loss_sum += micro_backward(model, ids, a.grad_accum, accelerator)
        gnorm = torch.nn.utils.clip_grad_norm_(model.parameters(), a.max_norm) if a.max_norm > 0 else None
        opt.step()
        sched.step()
        opt.zero_grad(set_to_none=True)
        dist.all_reduce(loss_sum)
        loss = float(loss_sum) / world
        if a.sleep_per_step_s:
            time.sleep(a.sleep_per_step_s)
        if use_cuda:
            torch.cuda.synchronize(device)
        dt = time.perf_counter() - t0
        step += 1
        steps_this_run += 1
        toks = a.micro_batch * a.grad_accum * world * a.seq_len
        tps_gpu = toks / dt / world
        peak, kind = _peak_mem(device)
        peak_t = torch.tensor([peak], dtype=torch.int64, device=device)
        dist.all_reduce(peak_t, op=dist.ReduceOp.MAX)
        mfu = (flops_tok * tps_gpu / (a.peak_tflops * 1e12)) if (flops_tok and a.peak_tflops > 0) else None
        emit({"event": "step", "step": step, "loss": loss, "lr": sched.get_last_lr()[0], "tokens": toks,
              "step_time_s": dt, "tokens_per_s_per_gpu": tps_gpu, "mfu": mfu, "peak_mem_bytes": int(peak_t),
              "peak_mem_kind": kind, "grad_norm": float(gnorm.full_tensor() if hasattr(gnorm, "full_tensor")
                                                         else gnorm) if gnorm is not None else None,
              "time": time.time()})
        # one agreed decision per step: stop (signal / stop file / per-run cap), checkpoint (interval)
        want_stop = stop.signal is not None or bool(a.stop_file and Path(a.stop_file).exists()) \
            or bool(a.max_steps_this_run and steps_this_run >= a.max_steps_this_run)
        due = bool(a.ckpt_dir) and step < a.steps and (
            (a.ckpt_interval_steps > 0 and step % a.ckpt_interval_steps == 0)
            or (a.ckpt_interval_s > 0 and time.time() - last_ckpt_t >= a.ckpt_interval_s))
        writing = bool(pending) and not pending["future"].done()
        flags = torch.tensor([int(want_stop), int(due), int(writing)], device=device)
        dist.all_reduce(flags, op=dist.ReduceOp.MAX)
        want_stop, due, writing = bool(flags[0]), bool(flags[1]), bool(flags[2])
        if pending and not writing:  # every rank's async write has finished
            finish_pending()
        if a.ckpt_dir and (due or want_stop or step == a.steps):
            finish_pending()  # one write at a time; a stop or final save follows the interval one
            t1 = time.perf_counter()
            final = want_stop or step == a.steps
            if ckpt_pg is not None and not final:
                path = Path(a.ckpt_dir) / f"step-{step}"
                fut = dcp.async_save(state(step), checkpoint_id=str(path), process_group=ckpt_pg)
                pending.update(future=fut, path=path, step=step, t0=t1, stall_s=time.perf_counter() - t1)
            else:
                path = save(step)
                emit({"event": "checkpoint", "step": step, "path": str(path), "save_s": time.perf_counter() - t1,
                      "reason": "stop" if want_stop else "final", "async": False, "time": time.time()})
            last_ckpt_t = time.time()
        if want_stop and step < a.steps:
            emit({"event": "stop", "step": step, "signal": stop.signal, "time": time.time()})
            exit_code = EXIT_PREEMPTED
            break
    finish_pending()  # (only without a stop or final save, which waited for it already)
    if step >= a.steps:
        if a.ckpt_dir and rank == 0:
            _write_atomic(Path(a.ckpt_dir) / "DONE", f"{step}\n")
        emit({"event": "done", "step": step, "time": time.time()})
    if log is not None:
        log.close()
    dist.barrier()
    dist.destroy_process_group()
    return exit_code


def main(argv: Sequence[str] | None = None) -> int:
    a = parse_args(argv)
    if a.ckpt_dir:
        Path(a.ckpt_dir).mkdir(parents=True, exist_ok=True)
    if not math.isfinite(a.lr) or a.lr <= 0:
        print("train_entry: --lr must be positive", file=sys.stderr)
        return 2
    return train(a)


if __name__ == "__main__":
    sys.exit(main())
