"""Apply a :class:`~trainplan.model.layout.Layout` to the proxy model, torchtitan style.

One :func:`parallelize` calls one ``apply_*`` per technique in a fixed order — the order matters:

1. tensor parallelism (DTensor ``parallelize_module``) — must see plain ``nn.Linear`` modules;
2. activation checkpointing — wraps whole blocks (full) or saves only matmul/attention outputs
   (selective, op-level SAC), around the TP-split block;
3. ``torch.compile`` per block — compiles the checkpointed, TP-split block;
4. data parallelism last: FSDP2 ``fully_shard`` (zero3; zero2 = ``reshard_after_forward=False``; hsdp on
   a 2-D mesh) per block then the root, or DDP for ``sharding='none'``.

ZeRO-1 has no FSDP2 equivalent and is refused with a ConfigError; so are PP and CP (not proxied).
"""

from __future__ import annotations

import os
from functools import partial
from typing import Any

import torch
from torch import nn
from torch.distributed.device_mesh import DeviceMesh, init_device_mesh

from trainplan.model.base import ConfigError
from trainplan.model.layout import Layout


def mesh_dims(layout: Layout) -> dict[str, int]:
    """Named mesh dimensions for a layout (size-1 dims dropped), outermost first."""
    if layout.pp > 1 or layout.cp > 1:
        raise ConfigError("layout", layout.describe(), "proxies support dp and tp (pp=cp=1)")
    if layout.sharding == "zero1":
        raise ConfigError("layout.sharding", "zero1", "proxies support none, zero2, zero3, hsdp (FSDP2 has no ZeRO-1)")
    dims: dict[str, int] = {}
    if layout.sharding == "hsdp":
        g = layout.shard_group or layout.dp
        if layout.dp % g:
            raise ConfigError("layout.shard_group", g, f"must divide dp={layout.dp}")
        dims["dp_replicate"], dims["dp_shard"] = layout.dp // g, g
    elif layout.sharding == "none":
        dims["dp_replicate"] = layout.dp
    else:
        dims["dp_shard"] = layout.dp
    dims["tp"] = layout.tp
    return dims


def build_mesh(layout: Layout, device_type: str) -> DeviceMesh:
    """A DeviceMesh whose dims are :func:`mesh_dims` (HSDP and TP×FSDP give 2-D or 3-D meshes)."""
    dims = mesh_dims(layout)
    return init_device_mesh(device_type, tuple(dims.values()), mesh_dim_names=tuple(dims))


# ------------------------------------------------------------------------------------ 1. tensor par.
def apply_tp(model: nn.Module, tp_mesh: DeviceMesh, sp: bool) -> None:
    """Megatron TP on DTensor: column-split q/k/v/w1/w3, row-split wo/w2; with SP, norms run on seq shards."""
    from torch.distributed.tensor import Replicate, Shard
    from torch.distributed.tensor.parallel import (
        ColwiseParallel,
        PrepareModuleInput,
        PrepareModuleOutput,
        RowwiseParallel,
        SequenceParallel,
        parallelize_module,
    )

    if hasattr(model, "hf"):
        raise ConfigError("layout.tp", "hf model", "TP proxies run the harness's own model; the Hugging Face model's "
                          "TP is transformers' tp_plan (Accelerate), not wired into the harness")
    seq = Shard(1) if sp else Replicate()
    root_plan: dict[str, Any] = {
        "tok_embeddings": RowwiseParallel(input_layouts=Replicate(), output_layouts=seq),
        "output": ColwiseParallel(input_layouts=seq, output_layouts=Replicate(), use_local_output=True),
    }
    if sp:
        if getattr(model, "pos_embeddings", None) is not None:
            # learned positions: the table stays whole on every TP rank (Megatron's convention, as memory.stage_params
            # counts it); its output is cut to the rank's sequence shard, the layout of the token embedding's output
            # it is added to (the backward all-gathers the gradient, so every rank's copy gets the full one)
            root_plan["pos_embeddings"] = PrepareModuleOutput(output_layouts=Replicate(), desired_output_layouts=seq,
                                                              use_local_output=True)
        root_plan["norm"] = SequenceParallel()
        if getattr(model, "embed_norm", None) is not None:  # BLOOM's embedding LayerNorm runs on the seq shards too
            root_plan["embed_norm"] = SequenceParallel(use_local_output=True)  # the residual stream is local
    if getattr(model, "output", None) is None:
        raise ConfigError("model.tied_embeddings", True, "TP proxies need untied embeddings")
    parallelize_module(model, tp_mesh, root_plan)
    for block in model.layers.values():
        plan: dict[str, Any] = {
            "attention.wq": ColwiseParallel(), "attention.wk": ColwiseParallel(), "attention.wv": ColwiseParallel(),
            "attention.wo": RowwiseParallel(output_layouts=seq),
            "feed_forward.w1": ColwiseParallel(), "feed_forward.w2": RowwiseParallel(output_layouts=seq),
        }
        if hasattr(block.feed_forward, "w3"):  # the gated MLP's up projection (a GELU MLP has none)
            plan["feed_forward.w3"] = ColwiseParallel()
        if sp:
            plan.update({
                "attention_norm": SequenceParallel(), "ffn_norm": SequenceParallel(),
                "attention": PrepareModuleInput(input_layouts=(Shard(1), None, None),
                                                desired_input_layouts=(Replicate(), None, None)),
                "feed_forward": PrepareModuleInput(input_layouts=(Shard(1),), desired_input_layouts=(Replicate(),)),
            })
        parallelize_module(block, tp_mesh, plan)


# ---------------------------------------------------------------------------- 2. act. checkpointing
SAVE_OPS = {torch.ops.aten.mm.default, torch.ops.aten.addmm.default,
             torch.ops.aten._scaled_dot_product_flash_attention.default,
             torch.ops.aten._scaled_dot_product_efficient_attention.default}
if hasattr(torch.ops.aten, "_scaled_dot_product_flash_attention_for_cpu"):
    SAVE_OPS.add(torch.ops.aten._scaled_dot_product_flash_attention_for_cpu.default)


def _sac_policy(ctx: Any, op: Any, *args: Any, **kwargs: Any) -> Any:
    from torch.utils.checkpoint import CheckpointPolicy

    return CheckpointPolicy.MUST_SAVE if op in SAVE_OPS else CheckpointPolicy.PREFER_RECOMPUTE


def apply_ac(model: nn.Module, mode: str) -> None:
    """Checkpoint every block: 'full' keeps only block inputs; 'selective' keeps matmul/attention outputs."""
    if mode == "none":
        return
    from torch.distributed.algorithms._checkpoint.checkpoint_wrapper import checkpoint_wrapper

    kw: dict[str, Any] = {"preserve_rng_state": False}
    if mode == "selective":
        from torch.utils.checkpoint import create_selective_checkpoint_contexts

        kw["context_fn"] = partial(create_selective_checkpoint_contexts, _sac_policy)
    for name, block in list(model.layers.named_children()):  # ModuleDict (own model) or ModuleList (HF)
        model.layers.register_module(name, checkpoint_wrapper(block, **kw))


# ------------------------------------------------------------------------------------------ 3. compile
def apply_compile(model: nn.Module) -> None:
    """torch.compile each block separately (repeated blocks share one compiled graph). ``TRAINPLAN_COMPILE_BACKEND``
    (default ``inductor``) picks dynamo's backend: the tests use ``eager`` (dynamo traces, no code generation)."""
    backend = os.environ.get("TRAINPLAN_COMPILE_BACKEND", "inductor")
    for name, block in list(model.layers.named_children()):
        model.layers.register_module(name, torch.compile(block, fullgraph=False, backend=backend))


# ---------------------------------------------------------------------------------- 4. data parallel
def apply_fsdp(model: nn.Module, dp_mesh: DeviceMesh, *, reshard_after_forward: bool, bf16: bool) -> None:
    """FSDP2 per block, then the root (embeddings, final norm, output)."""
    from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard

    mp = MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.float32) if bf16 else MixedPrecisionPolicy()
    for _, block in model.layers.named_children():  # ModuleDict (own model) or ModuleList (HF)
        fully_shard(block, mesh=dp_mesh, reshard_after_forward=reshard_after_forward, mp_policy=mp)
    fully_shard(model, mesh=dp_mesh, reshard_after_forward=reshard_after_forward, mp_policy=mp)


def apply_ddp(model: nn.Module, dp_mesh: DeviceMesh, device: torch.device) -> nn.Module:
    """Classic DDP (bucketed all-reduce overlapping backward)."""
    from torch.nn.parallel import DistributedDataParallel

    ids = [device.index] if device.type == "cuda" else None
    return DistributedDataParallel(model, device_ids=ids, process_group=dp_mesh.get_group())


def parallelize(model: nn.Module, layout: Layout, mesh: DeviceMesh | None, *, device: torch.device,
                bf16: bool = False, compile: bool = False) -> nn.Module:
    """Apply TP → activation checkpointing → compile → FSDP/DDP, in that order; returns the model to train."""
    dims = mesh_dims(layout)
    if mesh is None and (layout.world_size > 1):
        raise ConfigError("layout", layout.describe(), "needs a device mesh (world size > 1)")
    if layout.tp > 1:  # 1
        assert mesh is not None
        apply_tp(model, mesh["tp"], layout.sp)
    apply_ac(model, layout.recompute)  # 2
    if compile:  # 3
        apply_compile(model)
    if mesh is None or layout.dp == 1:  # 4
        return model
    if layout.sharding == "none":
        if layout.tp > 1:
            raise ConfigError("layout.sharding", "none", "with tp > 1 use zero3 or hsdp (FSDP2 composes with TP)")
        return apply_ddp(model, mesh["dp_replicate"], device)
    dp_names = tuple(n for n in ("dp_replicate", "dp_shard") if n in dims)
    dp_mesh = mesh[dp_names] if len(dp_names) > 1 else mesh[dp_names[0]]
    apply_fsdp(model, dp_mesh, reshard_after_forward=layout.sharding != "zero2", bf16=bf16)
    return model
