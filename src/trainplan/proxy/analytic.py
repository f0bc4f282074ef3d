"""The analytic figures a proxy record carries next to its measurements.

Two sources, both recorded: ``exact`` — closed forms for *this* proxy's sharding (per-rank shard sizes,
TP replicating norm weights), derived from ``ModelSpec`` counts; and ``analytic`` — the planner's own
terms (``trainplan.model.memory`` / ``trainplan.model.flops``), or ``None`` where a term is not available yet.
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any

from trainplan.model import flops, memory
from trainplan.model.arch import ModelSpec
from trainplan.model.efficiency import Efficiency
from trainplan.model.hardware import ClusterSpec
from trainplan.model.layout import Layout, shard_degree
from trainplan.model.training import TrainingSpec
from trainplan.proxy.schema import uses_autocast

ADAM_STATES = 2  # exp_avg, exp_avg_sq (Kingma & Ba 2015); ZeRO's "12Ψ" = fp32 master + these two


def _tp_local_params(spec: ModelSpec, tp: int) -> int:
    """Parameters per TP rank (Megatron TP as the harness's DTensor plan lays it out: matrices and the column-parallel
    biases split, norms, row-parallel biases and a learned position table replicated): the memory model's own
    per-rank count (tests/integration/test_proxy_tp_variants.py checks the harness holds exactly this)."""
    per_rank = memory.stage_params(spec, tp, 1, "first")
    return int(round(float(per_rank["matmul"] + per_rank["other"])))


def replicated_embedding_grad_bytes(spec: ModelSpec, layout: Layout, param_bytes: int = 4) -> int:
    """DTensor's backward of the row-sharded (RowwiseParallel) token embedding returns a Replicate gradient: V·h on
    every TP rank, not V·h/tp, held until zero_grad. Without FSDP (dp = 1) that is what a rank keeps; FSDP
    (dp > 1) reduce-scatters it to its shard. The bytes beyond the V·h/tp shard."""
    if layout.tp == 1 or layout.dp > 1:
        return 0
    return spec.vocab * spec.hidden * (layout.tp - 1) // layout.tp * param_bytes


def exact_state_bytes(spec: ModelSpec, layout: Layout, *, param_bytes: int = 4,
                      trainable_params: int | None = None) -> dict[str, int]:
    """Per-rank bytes of params, grads and Adam states, ZeRO-3/DDP/HSDP shards (Rajbhandari 2019, §5)."""
    shard = shard_degree(layout)
    if layout.sharding == "none":
        shard = 1
    base = _tp_local_params(spec, layout.tp)
    train = base if trainable_params is None else trainable_params // layout.tp  # LoRA: adapters only
    frozen = 0 if trainable_params is None else base
    emb = replicated_embedding_grad_bytes(spec, layout, param_bytes) if trainable_params is None else 0
    return {"params_bytes": train * param_bytes // shard, "frozen_params_bytes": frozen * param_bytes // shard,
            "grads_bytes": train * param_bytes // shard + emb, "optimizer_bytes": ADAM_STATES * train * 4 // shard}


def analytic_memory(spec: ModelSpec, layout: Layout, seq_len: int, global_batch: int, dtype: str,
                    finetune: str, lora_rank: int, lora_targets: list[str],
                    device: str = "cpu") -> dict[str, Any] | None:
    """``trainplan.model.memory.memory_breakdown`` and the per-layer activation term, if that module exists."""
    out: dict[str, Any] = {"source": "trainplan.model.memory"}
    cluster = ClusterSpec(nodes=1, gpus_per_node=layout.world_size, gpu="h100-sxm-80gb")
    training = TrainingSpec(seq_len=seq_len, global_batch=global_batch, precision="bf16" if dtype == "bf16" else "fp32",
                            finetune=finetune, lora_rank=lora_rank,
                            lora_targets=tuple(lora_targets) or ("q", "k", "v", "o"),
                            bf16_via="autocast" if uses_autocast(layout, dtype) else "bf16_params",
                            # the harness's torch.optim.AdamW defaults: foreach on CUDA (its step's temporaries are
                            # sized, memory.optimizer_step_temp_bytes), the per-parameter loop on CPU (none to speak of)
                            optimizer_impl="foreach" if device != "cpu" else "fused")
    try:

        out["breakdown_bytes"] = memory.memory_breakdown(spec, cluster, training, layout, Efficiency())
        # The harness measures state between steps. FSDP2's ZeRO-2 (reshard_after_forward=False) holds the
        # unsharded parameters only inside forward/backward; at rest it is sharded like ZeRO-3, so the state
        # it is compared with is the ZeRO-3 (FSDP2) split. The peak (breakdown_bytes) keeps ZeRO-2's.
        rest = replace(layout, sharding="zero3") if layout.sharding == "zero2" else layout
        at_rest = memory.model_states(spec, training, rest, cluster)
        out["state_at_rest_bytes"] = {k: float(at_rest[k]) for k in ("weights", "gradients", "optimizer")}
    except Exception as e:  # noqa: BLE001 - record, never crash the proxy over an analytic gap
        out["breakdown_error"] = f"{type(e).__name__}: {e}"
    # CPU: F.rms_norm decomposes (saves x and x·rstd); SDPA runs the CPU flash kernel (saves out + lse).
    norm_impl = "composite" if device == "cpu" else "fused"
    d = 2 if dtype == "bf16" else 4
    out["norm_impl"], out["attn_impl"] = norm_impl, "flash"
    # The proxies run DTensor SP (gathered linear inputs kept) and the harness's SAC policy, which saves every
    # mm/addmm and SDPA output (trainplan.proxy.parallelize.SAVE_OPS) → sac_policy "matmul".
    lora = finetune != "full"
    out["sp_impl"], out["sac_policy"] = "pytorch", "matmul"
    ac = training.autocast  # one rank or dp = 1 in bf16: fp32 residual stream, bf16 weight copies saved
    out["bf16_via"] = training.bf16_via
    try:
        out["activation_bytes_per_layer"] = float(memory.saved_activation_bytes_per_layer(
            spec, seq_len, layout.micro_batch, layout.tp, layout.sp, layout.cp, layout.recompute, d, "flash",
            norm_impl, sac_policy="matmul", sp_impl="pytorch", lora_rank=lora_rank if lora else 0,
            lora_targets=tuple(lora_targets) if lora else (), autocast=ac))
        out["rope_table_bytes"] = float(memory.rope_table_bytes(spec, seq_len, memory.residual_bytes(training)))
        out["head_saved_bytes"] = float(memory.head_saved_bytes(spec, seq_len, layout.micro_batch, layout.tp,
                                                                layout.sp, layout.cp, d, norm_impl,
                                                                sp_impl="pytorch", frozen=lora, autocast=ac))
        out["logits_bytes"] = float(memory.logits_bytes(spec, seq_len, layout.micro_batch, layout.tp, layout.cp, d,
                                                        "eager", "held"))  # the harness keeps its logits
    except Exception as e:  # noqa: BLE001
        out["activation_error"] = f"{type(e).__name__}: {e}"
    return out


def analytic_flops(spec: ModelSpec, seq_len: int, micro_batch: int, accum: int, tp: int,
                   recompute: str = "none", *, finetune: str = "full", lora_rank: int = 0,
                   lora_targets: tuple[str, ...] | list[str] = ()) -> dict[str, Any] | None:
    """Model FLOPs per rank per step: ``flops.model_train_step_flops`` (LoRA: ``lora_train_step_flops``) × micro-batches ÷ tp.

    Hardware FLOPs add what the proxies' non-reentrant checkpoint recomputes (full: every block matmul but
    the last, and the attention core; selective with the harness's save-every-matmul policy: none).
    """
    if finetune != "full":
        per_mb = float(flops.lora_train_step_flops(spec, seq_len, micro_batch, lora_rank, tuple(lora_targets)))
        source = "trainplan.model.flops.lora_train_step_flops"
    else:
        per_mb = float(flops.model_train_step_flops(spec, seq_len, micro_batch))
        source = "trainplan.model.flops.model_train_step_flops"
    tokens = seq_len * micro_batch * accum
    extra = float(flops.recompute_flops_per_token(spec, seq_len, recompute, policy="matmul",
                                                  checkpoint_impl="non_reentrant")) * tokens / tp
    return {"source": source, "model_flops_per_rank_step": per_mb * accum / tp,
            "hardware_flops_per_rank_step": per_mb * accum / tp + extra,
            "model_flops_per_token": float(flops.model_flops_per_token(spec, seq_len))}
