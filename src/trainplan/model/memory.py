"""Per-GPU memory: one pure function per term, each citing its formula (derivations: docs/analytic-model.md).

Every layout-dependent function is written with numpy broadcasting, so ``layout`` may be one
:class:`~trainplan.model.layout.Layout` (results are Python floats) or a :class:`~trainplan.model.layout.LayoutTable`
(results are arrays, one entry per row). Bytes everywhere. The analytic core: no torch.

:func:`memory_breakdown` returns the terms of the peak rank: the first pipeline stage (most micro-batches
in flight, the input embedding) or the last (LM head and logits), whichever totals more, row by row.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from trainplan.model.arch import ModelSpec
from trainplan.model.base import ConfigError
from trainplan.model.efficiency import Efficiency
from trainplan.model.flops import lora_dims
from trainplan.model.hardware import GPUSpec
from trainplan.model.layout import grad_accum, shard_degree, torchtitan_launch
from trainplan.model.training import NORM_IMPL_KINDS, TrainingSpec

MiB = 1024**2
TERMS = ("weights", "gradients", "optimizer", "activations", "logits", "buffers", "overhead", "total")
ATTN_IMPLS = ("flash", "math")
NORM_IMPLS = tuple(k for k in NORM_IMPL_KINDS if k != "auto")  # what a norm keeps, once resolved
CONVENTIONS = ("zero", "fsdp2")

DDP_BUCKET_BYTES = 25 * MiB  # torch DDP bucket_cap_mb default
# QLoRA NF4 (Dettmers 2023 §2): 4 bits + double-quantised absmax constants 8/64 + 32/(64·256) bits.
NF4_BYTES_PER_PARAM = (4 + 8 / 64 + 32 / (64 * 256)) / 8
FP32 = 4
LOSS_CHUNKS = 8  # torchtitan ChunkedLossWrapper.Config.num_chunks (components/loss.py), which the launch keeps


def _out(x: Any) -> Any:
    """A Python float for 0-d results, the array otherwise."""
    a = np.asarray(x, dtype=float)
    return a.item() if a.ndim == 0 else a


def _check(name: str, value: Any, allowed: tuple[str, ...]) -> None:
    bad = sorted({str(v) for v in np.atleast_1d(np.asarray(value))} - set(allowed))
    if bad:
        raise ConfigError(name, bad[0], "must be one of " + ", ".join(allowed))


def _zero_stage(sharding: Any) -> Any:
    """none→0, zero1→1, zero2→2, zero3/hsdp→3 (HSDP = ZeRO-3 inside the shard group)."""
    return np.select([sharding == "zero1", sharding == "zero2", (sharding == "zero3") | (sharding == "hsdp")],
                     [1, 2, 3], 0)


# ------------------------------------------------------------------------------ model-state bytes
def state_bytes_per_param(precision: str, optimizer: str, convention: str = "zero") -> tuple[int, int, int]:
    """(weights, gradients, optimizer) bytes per parameter: ZeRO 2+2+12 (Rajbhandari 2019 §3.1); FSDP2 4+4+8.

    FP8 recipes keep this layout: torchao casts the bf16 weights to FP8 per GEMM (transient copies), it does
    not store FP8 weights, so the model states are those of bf16 mixed precision."""
    if precision == "fp32":
        return FP32, FP32, (8 if optimizer == "adamw" else 0)  # Adam m, v; plain SGD keeps nothing
    if convention == "fsdp2":  # fp32 sharded params (the master) + fp32 grads + fp32 m, v
        return FP32, FP32, (8 if optimizer == "adamw" else 0)
    return 2, 2, (12 if optimizer == "adamw" else 4)  # bf16 params + bf16 grads + fp32 master (+ m, v)


def model_state_bytes(n_params: Any, shard: Any, zero_stage: Any, precision: str = "bf16",
                      optimizer: str = "adamw", convention: str = "zero") -> dict[str, Any]:
    """Model states per rank: ZeRO-1 shards the optimizer, ZeRO-2 + grads, ZeRO-3 + params (Rajbhandari 2019 Fig. 1)."""
    _check("precision", precision, ("bf16", "fp8-tensorwise", "fp8-rowwise", "fp32"))
    _check("optimizer", optimizer, ("adamw", "sgd"))
    _check("convention", convention, CONVENTIONS)
    w, g, o = state_bytes_per_param(precision, optimizer, convention)
    n, d, z = np.asarray(n_params, dtype=float), np.asarray(shard, dtype=float), np.asarray(zero_stage)
    return {"weights": _out(n * w / np.where(z >= 3, d, 1)),
            "gradients": _out(n * g / np.where(z >= 2, d, 1)),
            "optimizer": _out(n * o / np.where(z >= 1, d, 1))}


# --------------------------------------------------------------------------- parameters per rank
def _kv_shards(model: ModelSpec, tp: Any) -> Any:
    """TP ranks over which K/V heads are split; with tp > kv_heads each rank holds one replicated head."""
    return np.minimum(tp, model.kv_heads)


def layer_matmul_params_per_rank(model: ModelSpec, tp: Any = 1) -> Any:
    """Weight-matrix parameters of one block on one TP rank (column/row-parallel; Shoeybi 2019 §3)."""
    h, kv, f, q = model.hidden, model.kv_dim, model.ffn_hidden, model.q_dim  # q = heads·head_dim (Gemma: ≠ h)
    tp = np.asarray(tp, dtype=float)
    mlp = (3 if model.mlp == "swiglu" else 2) * h * f / tp
    return 2 * h * q / tp + 2 * h * kv / _kv_shards(model, tp) + mlp


def layer_other_params_per_rank(model: ModelSpec, tp: Any = 1) -> Any:
    """Norms (replicated under TP) and biases (column-parallel ones sharded) of one block on one TP rank."""
    h, kv, f, q = model.hidden, model.kv_dim, model.ffn_hidden, model.q_dim
    tp = np.asarray(tp, dtype=float)
    per_norm = model.params_per_norm_feature  # + Gemma 2/3 sandwich norms, Qwen3/Gemma 3 q/k norms
    head_wise = model.qk_norm_scope == "head"  # shared per-head q/k norm weights are replicated; the others split
    qk = model.qk_norm_features if head_wise or not model.qk_norm else q / tp + model.kv_dim / _kv_shards(model, tp)
    n = (model.norms_per_layer * h + qk) * per_norm + 0 * tp
    if model.qkv_bias:
        n = n + q / tp + 2 * kv / _kv_shards(model, tp)
    if model.o_bias:  # o and down biases sit after the all-reduce: replicated
        n = n + h
    if model.mlp_bias:
        n = n + (2 if model.mlp == "swiglu" else 1) * f / tp + h
    return n


def layer_params_per_rank(model: ModelSpec, tp: Any = 1) -> Any:
    """All parameters of one block on one TP rank."""
    return layer_matmul_params_per_rank(model, tp) + layer_other_params_per_rank(model, tp)


def _layers_per_stage(model: ModelSpec, pp: Any, vpp: Any = 1) -> Any:
    """Blocks on the busiest pipeline rank: ceil(L/(p·v))·v, as timing.busiest_stage_layers (uneven splits)."""
    chunks = np.asarray(pp, dtype=float) * np.asarray(vpp, dtype=float)
    return np.ceil(model.layers / chunks) * np.asarray(vpp, dtype=float)


def stage_params(model: ModelSpec, tp: Any = 1, pp: Any = 1, stage: str = "first", vpp: Any = 1) -> dict[str, Any]:
    """Parameters per rank of a pipeline stage, split into block matmuls and the rest (embeddings, norms).

    Vocab-parallel embedding and LM head (V·h/tp; Shoeybi 2019 §3) sit on the first and last stage; a
    tied matrix is held once when pp=1 and by both end stages when pp>1 (Megatron). Norms replicated.
    """
    _check("stage", stage, ("first", "last"))
    tp, pp = np.asarray(tp, dtype=float), np.asarray(pp, dtype=float)
    h, V = model.hidden, model.vocab
    n_layers = _layers_per_stage(model, pp, vpp)
    emb = V * h / tp
    pos = model.pos_params
    # the LM head's matrix (tied with the embedding: held once at pp=1) and its bias (vocab-parallel, GPT-J/Phi)
    head = np.where(pp > 1, emb, 0 if model.tied_embeddings else emb) + model.head_bias * V / tp
    pos = pos + model.n_params_embed_norm  # BLOOM's embedding LayerNorm sits with the embedding
    if stage == "first":
        ends = emb + pos + np.where(pp == 1, model.n_params_final_norm + head, 0)
    else:
        ends = head + model.n_params_final_norm + np.where(pp == 1, emb + pos, 0)
    return {"matmul": n_layers * layer_matmul_params_per_rank(model, tp),
            "other": n_layers * layer_other_params_per_rank(model, tp) + ends}


def lora_params_per_layer(model: ModelSpec, rank: int, targets: tuple[str, ...], tp: Any = 1) -> Any:
    """LoRA adapter parameters of one block on one TP rank: r·(in + out) per target (Hu 2021 §4.1), the (in, out)
    of ``flops.lora_dims``.

    Column-parallel targets shard B (r×out), row-parallel ones (o, down) shard A (in×r), as PEFT-on-Megatron does.
    With a GELU MLP, ``up`` is fc1, ``down`` is fc2 and ``gate`` does not exist (skipped).
    """
    tp = np.asarray(tp, dtype=float)
    dims = lora_dims(model)
    n = 0.0 * tp
    for t in targets:
        if t == "gate" and model.mlp != "swiglu":
            continue
        i, o = dims[t]
        if t in ("o", "down"):
            n = n + rank * i / tp + rank * o
        else:
            n = n + rank * i + rank * o / (_kv_shards(model, tp) if t in ("k", "v") else tp)
    return n


# -------------------------------------------------------------------------------- model states
def model_states(model: ModelSpec, training: TrainingSpec, layout: Any, cluster: Any = None,
                 stage: str = "first", *, on_device: bool = True) -> dict[str, Any]:
    """Weights, gradients and optimizer bytes on one rank of ``stage`` (ZeRO §3.1 / FSDP2 / LoRA / QLoRA);
    ``on_device=False``: before CPU offload takes its part off HBM (host_offload_bytes).

    Sharding: ZeRO-1/2 use the ZeRO paper's split (2+2+12 B/param), ZeRO-2's sharded gradients in fp32 (FSDP2's
    reduce dtype: 4/d), fused kernels' no-ZeRO/ZeRO-1 Megatron's whole fp32 main grads (6+12/d); ZeRO-3/HSDP use the FSDP2 split (fp32 sharded params + fp32 grads + fp32 m, v = 16/d
    B/param; the gathered bf16 units are ``buffers``).
    CPU offload removes the optimizer (with the fp32 master) from HBM; under FSDP2 it also moves the
    sharded params and grads (``CPUOffloadPolicy``). LoRA/QLoRA: the frozen base is weights only (bf16, or
    NF4 for QLoRA's block matmuls), sharded by ZeRO-3/HSDP; adapters carry the full state.
    """
    L = layout
    z = _zero_stage(L.sharding)
    d = shard_degree(L, cluster)
    p = stage_params(model, L.tp, L.pp, stage, L.vpp)
    conv_fsdp = z >= 3
    opt = training.optimizer
    if training.finetune == "full":
        n = p["matmul"] + p["other"]
        zs = model_state_bytes(n, d, z, training.precision, opt, "zero")
        fs = model_state_bytes(n, d, z, training.precision, opt, "fsdp2")
        st = {k: np.where(conv_fsdp, fs[k], zs[k]) for k in zs}
        # ZeRO-2 runs as FSDP2 without reshard after forward (torchtitan, Accelerate, train_entry): its sharded
        # gradients are in the fp32 reduce dtype, 4/d B/param, not the ZeRO paper's bf16 2/d (FSDPMemTracker agrees)
        st["gradients"] = np.where(z == 2, fs["gradients"], st["gradients"])
        if training.kernels == "fused" and training.half:
            # Megatron (the fused class's engine) accumulates and reduces bf16 grads in an fp32 main-grad buffer
            # that every rank holds whole, with or without its distributed optimizer: 6 + 12/d B/param for ZeRO-1,
            # 18 without sharding (SOURCES.md); it has no ZeRO-2, and ZeRO-3/HSDP stay FSDP2's split
            st["gradients"] = np.where(z <= 1, n * FP32, st["gradients"])
    else:
        adapters = _layers_per_stage(model, L.pp, L.vpp) * lora_params_per_layer(
            model, training.lora_rank, training.lora_targets, L.tp)
        zs = model_state_bytes(adapters, d, z, training.precision, opt, "zero")
        fs = model_state_bytes(adapters, d, z, training.precision, opt, "fsdp2")
        st = {k: np.where(conv_fsdp, fs[k], zs[k]) for k in zs}
        st["weights"] = st["weights"] + frozen_base_bytes(model, training, L.tp, L.pp, stage, L.vpp) / np.where(z >= 3, d, 1)
    if not on_device:
        return {k: _out(v) for k, v in st.items()}
    off = L.offload == "cpu"
    st["optimizer"] = np.where(off, 0.0, st["optimizer"])
    # FSDP2's CPUOffloadPolicy moves every sharded parameter, a LoRA/QLoRA run's frozen base included
    st["weights"] = np.where(off & conv_fsdp, 0.0, st["weights"])
    st["gradients"] = np.where(off & conv_fsdp, 0.0, st["gradients"])
    return {k: _out(v) for k, v in st.items()}


def host_offload_bytes(model: ModelSpec, training: TrainingSpec, layout: Any, cluster: Any = None) -> Any:
    """Host RAM one rank's CPU offload holds: the states ``model_states`` takes off HBM (optimizer with the fp32
    master; under FSDP2 also the sharded params and grads), on the heavier pipeline stage; 0 without offload.
    A node holds this for each of its ranks (search and estimate check it against ``cluster.host_mem_bytes``)."""
    out = []
    for stage in ("first", "last"):
        raw = model_states(model, training, layout, cluster, stage, on_device=False)
        dev = model_states(model, training, layout, cluster, stage)
        out.append(sum(np.asarray(raw[k], dtype=float) - np.asarray(dev[k], dtype=float) for k in raw))
    return _out(np.maximum(out[0], out[1]))


def host_ram_per_node(model: ModelSpec, training: TrainingSpec, layout: Any, cluster: Any) -> Any:
    """Host RAM a node's CPU offload holds: host_offload_bytes × the node's ranks."""
    return _out(np.asarray(host_offload_bytes(model, training, layout, cluster), dtype=float)
                * min(cluster.gpus_per_node, cluster.n_gpus))


def host_ram_problem(model: ModelSpec, cluster: Any, training: TrainingSpec, layout: Any,
                     max_frac: float) -> Any:
    """'' where the offloaded states of a node's ranks fit in ``max_frac`` of its host RAM, else the reason
    (an array of them for a table of layouts)."""
    ranks = min(cluster.gpus_per_node, cluster.n_gpus)
    per_node = np.asarray(host_ram_per_node(model, training, layout, cluster), dtype=float)
    cap = max_frac * cluster.host_mem_bytes
    msg = np.array([f"host RAM: CPU offload holds {x / 1e9:,.0f} GB per node ({ranks} ranks) > {max_frac:.0%} of "
                    f"{cluster.host_mem_bytes / 1e9:,.0f} GB (cluster.host_mem_GB)" if x > cap else ""
                    for x in np.atleast_1d(per_node)], dtype=object)
    return str(msg[0]) if np.ndim(per_node) == 0 else msg


def frozen_base_bytes(model: ModelSpec, training: TrainingSpec, tp: Any = 1, pp: Any = 1,
                      stage: str = "first", vpp: Any = 1) -> Any:
    """Frozen base of LoRA (bf16) or QLoRA (NF4 matmuls at 4.127 bit, Dettmers 2023 §2; rest bf16)."""
    p = stage_params(model, tp, pp, stage, vpp)
    half = 2 if training.half else FP32
    mat = NF4_BYTES_PER_PARAM if training.finetune == "qlora" else half
    return _out(p["matmul"] * mat + p["other"] * half)


# -------------------------------------------------------------------------------- activations
def resolve_sac_policy(training: TrainingSpec) -> str:
    """The selective-recompute policy in force: ``auto`` → Megatron's for fused kernels, else torchtitan's op SAC."""
    if training.sac_policy != "auto":
        return training.sac_policy
    return "attention" if training.kernels == "fused" else "torchtitan_op"


def resolve_norm_impl(training: TrainingSpec) -> str:
    """What a norm keeps, without a layout: the setting, or for ``auto`` one fused kernel (the harness's block on
    CUDA, torchtitan, Megatron/TE, Inductor). Where ``auto`` means Hugging Face's fp32-upcast RMSNorm instead is
    per layout: :func:`hf_norms`."""
    return training.norm_impl if training.norm_impl != "auto" else "fused"


def hf_norms(model: ModelSpec, training: TrainingSpec, layout: Any) -> Any:
    """Where ``norm_impl: auto`` sizes Hugging Face's fp32-upcast RMSNorm (docs/analytic-model.md §3): eager kernels,
    the kernel class's own block, on the layouts the launch runs with Hugging Face's model under Accelerate
    (:func:`layout.torchtitan_launch` false: pure data parallelism, or a model / fine-tune torchtitan's job cannot
    build). The rest run torchtitan's own fused ``nn.RMSNorm``."""
    on_titan = np.asarray(torchtitan_launch(model, training, layout), dtype=bool)
    if training.norm_impl != "auto" or training.kernels != "eager" or training.block_impl != "auto":
        return np.zeros_like(on_titan)
    return ~on_titan


# Whether the plan sizes Hugging Face's norms where :func:`hf_norms` says the Accelerate launch runs them (on since
# 2026-12-07; off: every norm sized fused, as before). On, the default study's ZeRO-2 dp32 mb1 grows 67.2 → 74.1 GiB,
# over its limit, and the study chooses FSDP dp32 mb1 (docs/analytic-model.md §3). Kept as a switch for comparisons.
SIZE_HF_NORMS = True


def _by_norm(fn: Any, model: ModelSpec, training: TrainingSpec, layout: Any) -> Any:
    """``fn(norm_impl)`` with the norm each layout's trainer runs (:func:`hf_norms`, where :data:`SIZE_HF_NORMS`)."""
    hf = hf_norms(model, training, layout) if SIZE_HF_NORMS else False
    if not np.any(hf):
        return fn(resolve_norm_impl(training))
    if np.all(hf):
        return fn("upcast")
    return _out(np.where(hf, fn("upcast"), fn(resolve_norm_impl(training))))


def resolve_sp_impl(training: TrainingSpec) -> str:
    """The SP implementation in force: ``auto`` → Megatron (shards kept) for fused kernels, else PyTorch DTensor."""
    if training.sp_impl != "auto":
        return training.sp_impl
    return "megatron" if training.kernels == "fused" else "pytorch"


def _norm_bytes(model: ModelSpec, d: int, norm_impl: str, frozen: bool) -> float:
    """One norm's saves per token: input (+ x·rstd when composite and the weight trains) + fp32 statistics.

    ``upcast`` (Hugging Face's LlamaRMSNorm: ``x.to(float32)``, its statistics, ``weight * normed.to(dtype)``): the fp32
    copy of the input (for the statistics' backward) + the normalized value in the compute dtype (for the weight's
    gradient, unless frozen) + rstd; on an fp32 stream (``d`` = 4) the copy is the input itself, as composite."""
    if model.norm == "layernorm":
        return model.hidden * d + 2 * FP32  # input; mean, rstd
    if norm_impl == "upcast":
        return model.hidden * (FP32 + (0 if frozen else d)) + FP32
    return (1 if norm_impl == "fused" or frozen else 2) * model.hidden * d + FP32


def _qk_norm_bytes(model: ModelSpec, d: int, norm_impl: str, frozen: bool, q_loc: Any, kv_loc: Any) -> Any:
    """The q and k norms' saves per token (Qwen3, Gemma 3, OLMo 2; 0 without): as a block norm, over the rank's q
    and k widths (the projection outputs they normalise), with fp32 statistics per head (scopes 'head' and
    'each_head') or one for each of q and k (scope 'full')."""
    if not model.qk_norm:
        return 0.0 * q_loc
    stats = (2 if model.norm == "layernorm" else 1) * FP32
    mult = 1 if model.norm == "layernorm" or norm_impl == "fused" or frozen else 2
    per = FP32 + (0 if frozen else d) if norm_impl == "upcast" and model.norm != "layernorm" else mult * d
    groups = 2.0 if model.qk_norm_scope == "full" else (q_loc + kv_loc) / model.head_dim
    return per * (q_loc + kv_loc) + groups * stats


def saved_activation_bytes_per_layer(model: ModelSpec, seq_len: int, micro_batch: int, tp: Any = 1,
                                     sp: Any = False, cp: Any = 1, recompute: Any = "none",
                                     dtype_bytes: int = 2, attn_impl: str = "flash",
                                     norm_impl: str = "fused", sac_policy: str = "attention",
                                     sp_impl: str = "megatron", lora_rank: int = 0,
                                     lora_targets: tuple[str, ...] = (), autocast: bool = False,
                                     compiled: bool = False) -> Any:
    """Bytes one Llama/GPT block saves for backward per micro-batch (derivation: docs/analytic-model.md §3).

    Counted per token (``s·b/cp`` tokens), in units of ``dtype_bytes`` unless marked fp32:

    * each of the ``norms_per_layer`` norms: its input ``h`` (+ ``h`` for x·rstd if ``norm_impl='composite'``,
      i.e. ``F.rms_norm`` on CPU, which decomposes, and the weight trains) + rstd (fp32; LayerNorm also the mean);
      q/k norms (``qk_norm``) the same over the q and k widths, one statistic per head (``qk_norm_scope='head'``)
      or one for each of q and k (``'full'``, OLMo 2);
    * the inputs of the QKV and MLP-in linears: ``h`` each (k/v/q share one saved input);
    * attention, ``attn_impl='flash'`` (CUDA flash and CPU ``_scaled_dot_product_flash_attention_for_cpu``):
      q ``h``, k, v ``kv_dim`` each, output ``h`` (the o-proj input is a view of it), logsumexp
      ``heads`` in fp32. ``'math'`` (the CPU fallback): scaled q, expanded k and v ``h`` each, the
      softmax probabilities ``heads·s``, and the o-proj input ``h`` (a copy);
    * SwiGLU: gate out, up out, SiLU out, down input ``4f``; GELU MLP: fc1 out, GELU out ``2f``. ``compiled``
      (Inductor): the SiLU output is recomputed from the gate output in backward, not kept (``3f``; measured on
      Hugging Face's block, whose norms compile to a fused norm's saves).

    RoPE saves only its cos/sin tables, shared by all layers (see :func:`rope_table_bytes`).
    TP divides heads, ``kv_dim`` (over ``min(tp, kv_heads)``) and ``f``; SP also divides the norm and
    linear-input parts (Korthikanti 2022 §4.2.2); ``sp_impl='pytorch'`` (DTensor) keeps the all-gathered
    QKV and MLP-in inputs instead (``+2h(1−1/tp)``). ``recompute='full'`` keeps only the layer input ``h``;
    ``'selective'`` keeps what ``sac_policy`` says (:data:`~trainplan.model.training.SAC_POLICIES`; §3.2).
    LoRA (``lora_rank > 0``): frozen linears keep no input (no weight gradient), each adapter keeps its
    input and its rank-``r`` intermediate, SwiGLU's down input is kept only if ``down`` is adapted.
    ``autocast`` (``torch.autocast`` over fp32 parameters, the harness on one rank: ``TrainingSpec.bf16_via``;
    §3.4): the residual stream is fp32, so the norms keep fp32 inputs (and the layer input under recompute is
    fp32); each linear casts the fp32 norm output it reads and keeps its own bf16 copy (q, k, v: three; gate, up:
    two; each adapter its own under LoRA), and each linear keeps the bf16 copy of its weight (plus the adapters'
    A and B) that the cast made, unless recompute drops it (:func:`autocast_weight_copy_bytes`).
    The proxy harness compares this with ``saved_tensors_hooks`` (unique storages, parameters excluded).
    """
    _check("attn_impl", attn_impl, ATTN_IMPLS)
    _check("norm_impl", norm_impl, NORM_IMPLS)
    _check("recompute", recompute, ("none", "selective", "full"))
    _check("sac_policy", sac_policy, SAC_KEEPS)
    _check("sp_impl", sp_impl, ("megatron", "pytorch"))
    tp, cp = np.asarray(tp, dtype=float), np.asarray(cp, dtype=float)
    sp = np.asarray(sp, dtype=bool)
    h, f, a, s, kv = model.hidden, model.ffn_hidden, model.heads, seq_len, model.kv_dim
    d = dtype_bytes
    lora = lora_rank > 0
    tg = set(lora_targets) if lora else set()
    swiglu = model.mlp == "swiglu"
    tokens = s * micro_batch / cp
    rep = np.where(sp, tp, 1.0)  # divisor of the parts TP leaves replicated
    # h_loc is the attention width per rank (q, SDPA output, o-proj input): heads·head_dim, ≠ h for Gemma
    h_loc, kv_loc, f_loc, a_loc = model.q_dim / tp, kv / _kv_shards(model, tp), f / tp, a / tp
    rd = FP32 if autocast else d  # the residual stream's dtype: fp32 under autocast (fp32 embedding output)
    norm = _norm_bytes(model, rd, norm_impl, lora) / rep
    norms = model.norms_per_layer * norm + _qk_norm_bytes(model, d, norm_impl, lora, h_loc, kv_loc)
    # A linear input saved for the weight gradient: SP shard (Megatron) or the gathered sequence (DTensor).
    lin_in = np.where(sp & (sp_impl == "pytorch"), h * d, h * d / rep)
    qkv_t = {"q", "k", "v"} if not lora else tg & {"q", "k", "v"}
    mlp_t = ({"gate", "up"} if not lora else tg & {"gate", "up"}) - ({"gate"} if not swiglu else set())
    # shared by the linears that read it, or under autocast one cast copy per reading linear (or adapter)
    qkv_in = lin_in * (len(qkv_t) if autocast else float(bool(qkv_t)))
    mlp_in = lin_in * (len(mlp_t) if autocast else float(bool(mlp_t)))
    if attn_impl == "flash":
        attn = (2 * h_loc + 2 * kv_loc) * d + a_loc * FP32
    else:
        attn = (4 * h_loc + a_loc * s) * d
    if swiglu:  # gate out, up out, SiLU out (compiled: recomputed from gate out); down input unless down is frozen
        mlp = (3 - (1 if compiled else 0) + (0 if lora and "down" not in tg else 1)) * f_loc * d
    else:  # fc1 out (GELU backward); GELU out (fc2 input) unless fc2 is frozen
        mlp = (1 + (0 if lora and "down" not in tg else 1)) * f_loc * d
    adapters = sum(1 for t in tg if swiglu or t != "gate") * lora_rank * d  # x·Aᵀ of each adapter
    none = norms + qkv_in + mlp_in + attn + mlp + adapters
    full = h * rd / rep
    selective = _sac_kept_per_token(model, d, tp, sp, attn_impl, sac_policy, h_loc, kv_loc, f_loc, a_loc,
                                    norms, qkv_in, mlp_in, mlp, rep, rd, compiled)
    per_token = np.select([recompute == "full", recompute == "selective"], [full, selective], none)
    weights = autocast_weight_copy_bytes(model, tp, lora_rank, tuple(lora_targets)) if autocast else 0.0
    return _out(tokens * per_token + np.where(recompute == "none", weights, 0.0))


def residual_bytes(training: TrainingSpec) -> int:
    """Bytes per element of the residual stream (embedding output, norm inputs, layer inputs, RoPE tables): fp32 under
    ``torch.autocast`` over fp32 weights (``TrainingSpec.autocast``), else the compute dtype."""
    return FP32 if training.autocast or not training.half else 2


def autocast_weight_copy_bytes(model: ModelSpec, tp: Any = 1, lora_rank: int = 0,
                               lora_targets: tuple[str, ...] = ()) -> Any:
    """The bf16 weight copies one block keeps for backward under ``torch.autocast`` over fp32 parameters: each linear's
    dgrad reads the cast it made in forward, frozen or not (2 B per matmul parameter on the rank), and each
    adapter's A and B. Not per token: the same at every sequence length. Recompute (full or op-level SAC) drops them
    with the rest of the block's saves and recasts in backward."""
    lora = lora_params_per_layer(model, lora_rank, lora_targets, tp) if lora_rank > 0 else 0.0
    return _out(2.0 * (layer_matmul_params_per_rank(model, tp) + lora))


SAC_KEEPS = ("attention", "torchtitan_op", "matmul")


def _sac_kept_per_token(model: ModelSpec, d: int, tp: Any, sp: Any, attn_impl: str, policy: str, h_loc: Any,
                        kv_loc: Any, f_loc: Any, a_loc: Any, norms: Any, qkv_in: Any, mlp_in: Any, mlp: Any,
                        rep: Any, residual_bytes: int | None = None, compiled: bool = False) -> Any:
    """Bytes per token a block keeps under selective recompute ``policy`` (docs/analytic-model.md §3.2).

    attention (Korthikanti 2022 §5): everything but the attention core's internals (keeps q, k, v and
    its output). torchtitan_op (``_apply_ac_to_transformer_block``, ``_save_list``, 9dec370): the block
    input, the outputs of the 1st, 3rd, 5th, 7th mm (wq, wv, w1, w2 for SwiGLU; wq, wv, fc1 for GELU),
    flash SDPA's output and logsumexp, and under SP the reduce-scatter outputs of wo and w2. matmul: the
    block input and every mm/addmm and SDPA output. Row-parallel mm outputs are partial sums of full
    width ``h`` on every TP rank.

    ``compiled`` (torch.compile of the checkpointed block): AOTAutograd's partitioner keeps only what the backward
    reads, so a MUST_SAVE output the backward never reads is not kept: the MLP's down projection (w2 / fc2), whose
    output (and, under SP, its reduce-scatter) only feeds the residual add. Measured on CPU
    (tests/unit/model/test_memory.py: under torchtitan's op SAC eager keeps h·δ per token more than compiled).
    """
    h = model.hidden
    swiglu = model.mlp == "swiglu"
    block_in = h * (residual_bytes or d) / rep  # fp32 under autocast
    sdpa = (h_loc * d + a_loc * FP32) if attn_impl == "flash" else 0.0 * h_loc
    if policy == "attention":
        return norms + qkv_in + mlp_in + (2 * h_loc + 2 * np.asarray(kv_loc)) * d + mlp
    if policy == "torchtitan_op":
        w2 = 0.0 if compiled else (h * d if swiglu else 0.0)  # w2's partial sum (the 7th mm)
        mms = (h_loc + kv_loc + f_loc) * d + w2  # wq, wv, w1 (+ w2)
        rs = np.where(np.asarray(sp, dtype=bool), (1 if compiled else 2) * h * d / tp, 0.0)  # reduce_scatter_tensor
        return block_in + mms + sdpa + rs
    mms = (h_loc + 2 * kv_loc + (2 if swiglu else 1) * f_loc) * d + (1 if compiled else 2) * h * d  # wo, w2
    return block_in + mms + sdpa


def rope_table_bytes(model: ModelSpec, seq_len: int, dtype_bytes: int = 2) -> float:
    """cos and sin tables (s × head_dim/2 each) saved once per forward and shared by all layers."""
    return float(seq_len * model.head_dim * dtype_bytes) if model.pos_embedding == "rope" else 0.0


def head_saved_bytes(model: ModelSpec, seq_len: int, micro_batch: int, tp: Any = 1, sp: Any = False,
                     cp: Any = 1, dtype_bytes: int = 2, norm_impl: str = "fused", sp_impl: str = "megatron",
                     frozen: bool = False, autocast: bool = False) -> Any:
    """Final norm + LM-head input saved for backward on the last stage (as a block's norm and linear input).

    ``sp_impl='pytorch'``: DTensor's Colwise LM head keeps the all-gathered input; ``frozen`` (LoRA): the
    frozen head keeps no input and the frozen norm no x·rstd. ``autocast``: the norm's input is fp32 and the head
    keeps the bf16 copy of its weight (V·h/tp, tied or not), as a block's linears do.
    """
    _check("norm_impl", norm_impl, NORM_IMPLS)
    _check("sp_impl", sp_impl, ("megatron", "pytorch"))
    tp, cp = np.asarray(tp, dtype=float), np.asarray(cp, dtype=float)
    sp = np.asarray(sp, dtype=bool)
    rep = np.where(sp, tp, 1.0)
    h, d = model.hidden, dtype_bytes
    lin_in = 0.0 if frozen else np.where(sp & (sp_impl == "pytorch"), h * d, h * d / rep)
    norm = _norm_bytes(model, FP32 if autocast else d, norm_impl, frozen) / rep
    weight = 2.0 * model.vocab * h / tp if autocast else 0.0
    return _out(seq_len * micro_batch / cp * (norm + lin_in) + weight)


def logits_bytes(model: ModelSpec, seq_len: int, micro_batch: int, tp: Any = 1, cp: Any = 1,
                 dtype_bytes: int = 2, kernels: str = "fused", at_backward: Any = "held") -> Any:
    """What the loss keeps alive at its backward peak, for the s·b·V/(tp·cp) logits of one micro-batch.

    ``kernels`` eager/compiled (PyTorch's ``F.cross_entropy(logits.float(), …)``: log_softmax saves its fp32
    output, and its backward holds nll_loss's fp32 gradient and its own fp32 result at once): 3 × 4 B per logit,
    + the logits in the compute dtype when the caller still holds them (``at_backward`` "held": Hugging Face's output,
    the proxy harness; "freed": torchtitan deletes them first). Measured on CPU by tests/unit/model/test_memory.py's
    dispatch-level tracker (14.0 B per logit held, 12.0 freed) and on our H200 records (max allocated 4.1–4.6 B per
    logit above the former 2 + 8 B).
    "chunked" (torchtitan's ``ChunkedLossWrapper``, :data:`LOSS_CHUNKS` chunks along the sequence, each chunk's head,
    loss and backward in turn): one chunk's held logits (δ + 12 B per logit of the chunk), that chunk's hidden-state
    gradient (δh per token of the chunk), the fp32 buffer those gradients accumulate into (4h per local token,
    ``GradAccumulator``; the hidden states are whole on every TP rank) and, for b > 1, the chunks' contiguous copies
    of the hidden states (δh per local token). Measured by the same tracker on torchtitan 0.3's own wrapper.
    ``fused`` (Megatron's vocab-parallel cross entropy, in place): the logits, an fp32 copy, its fp32 gradient."""
    tp, cp = np.asarray(tp, dtype=float), np.asarray(cp, dtype=float)
    mode = np.asarray(at_backward)
    local = seq_len * micro_batch / cp
    per_logit = 3 * FP32 + np.where(mode == "freed", 0.0, dtype_bytes)
    whole = local * model.vocab / tp * per_logit
    copies = np.asarray(micro_batch) > 1  # split along the sequence of [b, s, h]: contiguous copies unless b = 1
    chunked = (local / LOSS_CHUNKS * (model.vocab / tp * per_logit + dtype_bytes * model.hidden)
               + local * (FP32 + dtype_bytes * copies) * model.hidden)
    eager = np.where(mode == "chunked", chunked, whole)
    return _out(np.where(kernels == "fused", local * model.vocab / tp * (dtype_bytes + 2 * FP32), eager))


def embedding_saved_bytes(model: ModelSpec, seq_len: int, micro_batch: Any, cp: Any = 1, dtype_bytes: int = 2,
                          norm_impl: str = "fused", frozen: bool = False) -> Any:
    """What the embedding stage saves for backward per micro-batch on one CP rank: int64 token ids (b·s/cp) and, for
    a learned position table, its position ids (s/cp) — both only when the embeddings train (not ``frozen``) — and
    BLOOM's embedding LayerNorm, saved like a block norm (input and statistics) per local token."""
    local = seq_len / np.asarray(cp, dtype=float)
    ids = 0.0 if frozen else 8.0 * local * (np.asarray(micro_batch) + (model.pos_embedding == "learned"))
    norm = model.embed_norm * local * np.asarray(micro_batch) * _norm_bytes(model, dtype_bytes, norm_impl, frozen)
    return _out(ids + norm)


def model_saved_activation_bytes(model: ModelSpec, seq_len: int, micro_batch: int, dtype_bytes: int = 4,
                                 attn_impl: str = "flash", norm_impl: str = "composite",
                                 recompute: str = "none", lora_rank: int = 0,
                                 lora_targets: tuple[str, ...] = (), autocast: bool = False) -> float:
    """Everything a single-rank forward saves for backward, up to the logits (the CPU proxy's measurement).

    = token ids (int64, saved by a trainable embedding; + position ids for a learned table) + RoPE tables + the embedding's norm (BLOOM) + L × per-layer
    + final norm and LM-head input. The loss's own saves (log-probs) are in :func:`logits_bytes`, not here. LoRA: the
    frozen embedding saves no ids and the first block's input needs no gradient, so its first norm saves
    nothing (one norm less).
    """
    kw = dict(dtype_bytes=dtype_bytes, attn_impl=attn_impl, norm_impl=norm_impl, lora_rank=lora_rank,
              lora_targets=tuple(lora_targets), autocast=autocast)
    per_layer = saved_activation_bytes_per_layer(model, seq_len, micro_batch, recompute=recompute, **kw)
    lora = lora_rank > 0
    rd = FP32 if autocast else dtype_bytes  # the residual stream's dtype
    first_norm = seq_len * micro_batch * _norm_bytes(model, rd, norm_impl, True) if lora else 0.0
    return float(embedding_saved_bytes(model, seq_len, micro_batch, 1, rd, norm_impl, lora)
                 + rope_table_bytes(model, seq_len, rd) + model.layers * per_layer - first_norm
                 + head_saved_bytes(model, seq_len, micro_batch, dtype_bytes=dtype_bytes, norm_impl=norm_impl,
                                    frozen=lora, autocast=autocast))


def pipeline_in_flight(pp: Any, microbatches: Any, stage: str = "first") -> Any:
    """Micro-batches whose activations a stage holds under 1F1B: min(pp, m) on the first, 1 on the last (Narayanan 2021 §2.2)."""
    pp = np.asarray(pp, dtype=float)
    return _out(np.minimum(pp, microbatches) if stage == "first" else np.ones_like(pp))


def interleave_factor(pp: Any, vpp: Any, schedule: Any) -> Any:
    """Interleaved 1F1B stores 1 + (p−1)/(p·v) times the 1F1B activations (Korthikanti 2022 §4.2.3)."""
    pp, vpp = np.asarray(pp, dtype=float), np.asarray(vpp, dtype=float)
    return _out(np.where(schedule == "interleaved", 1 + (pp - 1) / (pp * vpp), 1.0))


def activation_kwargs(training: TrainingSpec, layout: Any, dtype_bytes: int | None = None,
                      norm_impl: str | None = None) -> dict[str, Any]:
    """Keyword arguments of :func:`saved_activation_bytes_per_layer` that a training setup and layout imply."""
    lora = training.finetune != "full"
    return dict(tp=layout.tp, sp=layout.sp, cp=layout.cp,
                dtype_bytes=dtype_bytes or (2 if training.half else FP32),
                attn_impl=training.attn_impl, norm_impl=norm_impl or resolve_norm_impl(training),
                sac_policy=resolve_sac_policy(training),
                sp_impl=resolve_sp_impl(training), lora_rank=training.lora_rank if lora else 0,
                lora_targets=tuple(training.lora_targets) if lora else (), autocast=training.autocast,
                compiled=training.kernels == "compiled")


def activation_bytes(model: ModelSpec, training: TrainingSpec, layout: Any, stage: str = "first",
                     dtype_bytes: int | None = None, norm_impl: str | None = None) -> Any:
    """Block activations on one rank: per-layer × L/pp × micro-batches in flight (× interleave), + recompute working set.
    ``norm_impl``: the one each layout's trainer runs (:func:`hf_norms`) unless given."""
    if norm_impl is None:
        return _by_norm(lambda n: activation_bytes(model, training, layout, stage, dtype_bytes, n), model, training,
                        layout)
    L = layout
    kw = activation_kwargs(training, L, dtype_bytes, norm_impl)
    norm_impl = kw["norm_impl"]
    d = kw["dtype_bytes"]
    per_layer = saved_activation_bytes_per_layer(model, training.seq_len, L.micro_batch, recompute=L.recompute, **kw)
    m = grad_accum(training, L)
    inflight = pipeline_in_flight(L.pp, m, stage)
    factor = interleave_factor(L.pp, L.vpp, L.pp_schedule) if stage == "first" else 1.0
    stored = np.asarray(per_layer) * _layers_per_stage(model, L.pp, L.vpp) * inflight * factor
    # Recompute rebuilds what it dropped, one layer at a time, during that layer's backward: the whole
    # layer (full) or what the SAC policy did not keep (selective) — the working set on top of what is stored.
    one_layer = np.asarray(saved_activation_bytes_per_layer(model, training.seq_len, L.micro_batch, **kw))
    work = np.where(L.recompute == "none", 0.0,
                    np.maximum(one_layer - np.where(L.recompute == "full", 0.0, per_layer), 0.0))
    rd = FP32 if training.autocast else d  # the embedding output, its norm and the RoPE tables: fp32 under autocast
    first_extra = (embedding_saved_bytes(model, training.seq_len, L.micro_batch, L.cp, rd, norm_impl,
                                         training.finetune != "full") + rope_table_bytes(model, training.seq_len, rd))
    return _out(stored + work + (first_extra * inflight if stage == "first" else 0.0))


# ----------------------------------------------------------------------------------- buffers
def buffer_bytes(model: ModelSpec, training: TrainingSpec, layout: Any, dtype_bytes: int | None = None) -> Any:
    """Transient collective buffers: FSDP 2 gathered units + fp32 reduce-scatter, DDP buckets, TP/PP staging
    (``stage_breakdown`` puts the optimizer step's temporaries here when the step is the peak).

    FSDP2/ZeRO-3: the root unit (embedding, LM head: FSDP2 keeps it gathered from forward through backward) + the
    current and the prefetched block unit unsharded in the compute dtype (torchtitan wraps one block per unit) + the
    fp32 reduce-scatter of one unit's grads. DDP/ZeRO-1/2: two 25 MiB gradient buckets in flight (torch DDP
    ``bucket_cap_mb``; at most the gradient bytes). TP: one full-sequence activation (SP all-gather / all-reduce staging). PP: send +
    recv of one stage-boundary activation. [I: sizes to be calibrated]
    """
    L = layout
    d = dtype_bytes or (2 if training.half else FP32)
    tp = np.asarray(L.tp, dtype=float)
    cp = np.asarray(L.cp, dtype=float)
    z = _zero_stage(L.sharding)
    mat, other = layer_matmul_params_per_rank(model, tp), layer_other_params_per_rank(model, tp)
    if training.finetune == "qlora":
        unit_bytes = mat * NF4_BYTES_PER_PARAM + other * d
    else:
        unit_bytes = (mat + other) * d
    block_bytes = unit_bytes
    unit_bytes = np.maximum(unit_bytes, model.vocab * model.hidden / tp * d)
    # the root unit (embedding, final norm, untied LM head) is not resharded after forward by FSDP2 (it would be
    # gathered again at once for backward), so it stays gathered beside the two block units in flight; under PP a
    # stage's root holds one of the two matrices (FSDPMemTracker, 13B widths: +0.61 GiB the terms missed)
    vh = model.vocab * model.hidden / tp * d
    root_bytes = vh * np.where((np.asarray(L.pp) == 1) & (not model.tied_embeddings), 2.0, 1.0)
    if training.finetune == "full":
        rs = np.maximum(mat + other, model.vocab * model.hidden / tp) * FP32
    else:
        rs = lora_params_per_layer(model, training.lora_rank, training.lora_targets, tp) * FP32
    fsdp = np.where(z >= 3, root_bytes + 2 * block_bytes + rs, 0.0)
    # FSDP2 under PyTorch pipelining (torchtitan): reshard_after_forward=False for every block of the stage,
    # and gradient sync only on the last micro-batch, so the whole stage stays gathered (compute dtype) and
    # its unsharded grads accumulate in the fp32 reduce dtype (FSDPParam.to_accumulated_grad_if_needed).
    if resolve_sp_impl(training) == "pytorch":
        n_stage = _layers_per_stage(model, L.pp, L.vpp) * (mat + other)
        trainable = n_stage if training.finetune == "full" else _layers_per_stage(model, L.pp, L.vpp) * (
            lora_params_per_layer(model, training.lora_rank, training.lora_targets, tp))
        stage_unsharded = np.where(training.finetune == "qlora", mat * NF4_BYTES_PER_PARAM + other * d,
                                   (mat + other) * d) * _layers_per_stage(model, L.pp, L.vpp) + trainable * FP32
        fsdp = np.where((z >= 3) & (np.asarray(L.pp) > 1), np.maximum(fsdp, stage_unsharded + unit_bytes), fsdp)
        # ZeRO-1/2 run as FSDP2 without reshard after forward (every launch path): under pipelining their gradient
        # sync waits for the last micro-batch too, so the stage's unsharded fp32 grads accumulate beside the
        # gathered bf16 stage that the weights term already holds (perform_reduce_grad once per step)
        fsdp = np.where(((z == 1) | (z == 2)) & (np.asarray(L.pp) > 1), trainable * FP32, fsdp)
    grads = model_states(model, training, L)["gradients"]  # a bucket never exceeds the grads it packs
    ddp = np.where((z < 3) & (L.dp * L.cp > 1), 2 * np.minimum(DDP_BUCKET_BYTES, grads), 0.0)
    act = training.seq_len * L.micro_batch / cp * model.hidden * d
    tpb = np.where(tp > 1, act, 0.0)
    ppb = np.where(np.asarray(L.pp) > 1, 2 * act / np.where(np.asarray(L.sp, dtype=bool), tp, 1.0), 0.0)
    return _out(fsdp + ddp + tpb + ppb)


def reserved_bytes(breakdown: dict[str, Any], eff: Any = None) -> Any:
    """What ``torch.cuda.max_memory_reserved`` reports: the total less the runtime overhead outside the caching
    allocator (``eff``'s; without one, Efficiency's default, the planner's)."""
    base = (eff or Efficiency()).runtime_overhead_bytes
    return _out(np.asarray(breakdown["total"], dtype=float) - base)


def overhead_bytes(dynamic_bytes: Any, eff: Any = None) -> Any:
    """Runtime overhead (CUDA context, NCCL, workspaces) + allocator fragmentation × dynamic peak [I: calibrated];
    ``eff``'s, or without one Efficiency's defaults (one copy of the assumption: the planner's)."""
    eff = eff or Efficiency()
    base, frag = eff.runtime_overhead_bytes, eff.alloc_frag_frac
    return _out(base + frag * np.asarray(dynamic_bytes, dtype=float))


def optimizer_step_temp_bytes(model: ModelSpec, training: TrainingSpec, layout: Any, cluster: Any = None,
                              stage: str = "first") -> Any:
    """Working memory of the optimizer step above the model states, on one rank of ``stage``.

    PyTorch's foreach AdamW (``torch.optim.adam._multi_tensor_adam``, the default on CUDA: the proxy harness) builds
    ``exp_avg_sq_sqrt = torch._foreach_sqrt(exp_avg_sqs)`` for every parameter it updates at once: one fp32 tensor
    per local trainable parameter, 4 B each, beside the states (grads included: they stay in ``p.grad``). The
    fused kernel (``fused=True``: production, torchtitan; Megatron's and DeepSpeed's fused Adam) and plain SGD
    allocate none; an optimizer offloaded to the CPU steps in host memory."""
    if training.optimizer != "adamw" or training.optimizer_impl != "foreach":
        return 0.0
    L = layout
    z = _zero_stage(L.sharding)
    if training.finetune == "full":
        p = stage_params(model, L.tp, L.pp, stage, L.vpp)
        n = p["matmul"] + p["other"]
    else:
        n = _layers_per_stage(model, L.pp, L.vpp) * lora_params_per_layer(model, training.lora_rank,
                                                                          training.lora_targets, L.tp)
    local = np.asarray(n, dtype=float) / np.where(z >= 1, np.asarray(shard_degree(L, cluster), dtype=float), 1.0)
    return _out(np.where(np.asarray(L.offload) == "cpu", 0.0, local * FP32))


# --------------------------------------------------------------------------------- breakdown
def stage_breakdown(model: ModelSpec, cluster: Any, training: TrainingSpec, layout: Any, eff: Any = None,
                    stage: str = "first") -> dict[str, Any]:
    """All terms for one rank of the ``stage`` pipeline stage (keys: :data:`TERMS`)."""
    L = layout
    out = dict(model_states(model, training, L, cluster, stage))
    out["activations"] = activation_bytes(model, training, L, stage)
    d = 2 if training.half else FP32
    last = np.asarray(L.pp) == 1 if stage == "first" else True
    head = _by_norm(lambda n: head_saved_bytes(model, training.seq_len, L.micro_batch, L.tp, L.sp, L.cp, d,
                                               norm_impl=n, sp_impl=resolve_sp_impl(training),
                                               frozen=training.finetune != "full", autocast=training.autocast),
                    model, training, L)
    lg = np.asarray(logits_bytes(model, training.seq_len, L.micro_batch, L.tp, L.cp, d, training.kernels,
                                 training.logits_at_backward)) + np.asarray(head)
    out["logits"] = _out(np.where(last, lg, 0.0))
    out["buffers"] = buffer_bytes(model, training, L)
    dynamic = np.asarray(out["activations"]) + np.asarray(out["logits"]) + np.asarray(out["buffers"])
    out["overhead"] = overhead_bytes(dynamic, eff)
    out["total"] = _out(sum(np.asarray(out[k]) for k in TERMS[:-1]))
    # The optimizer step is a second peak: activations, logits and gathered units are freed by then, the states
    # and the step's own working memory (foreach AdamW) are not. When it is the larger, the breakdown is that
    # moment's: the states, the step's temporaries as the transient ``buffers``, and their overhead.
    temp = np.asarray(optimizer_step_temp_bytes(model, training, L, cluster, stage))
    states = sum(np.asarray(out[k]) for k in ("weights", "gradients", "optimizer"))
    step_overhead = np.asarray(overhead_bytes(temp, eff))
    at_step = states + temp + step_overhead > np.asarray(out["total"])
    if np.any(at_step):
        for k in ("activations", "logits"):
            out[k] = _out(np.where(at_step, 0.0, out[k]))
        out["buffers"] = _out(np.where(at_step, temp, out["buffers"]))
        out["overhead"] = _out(np.where(at_step, step_overhead, out["overhead"]))
        out["total"] = _out(sum(np.asarray(out[k]) for k in TERMS[:-1]))
    return out


def memory_breakdown(model: ModelSpec, cluster: Any, training: TrainingSpec, layout: Any,
                     eff: Any = None) -> dict[str, Any]:
    """Per-GPU bytes of the peak rank (first or last pipeline stage, whichever is larger): :data:`TERMS`."""
    first = stage_breakdown(model, cluster, training, layout, eff, "first")
    last = stage_breakdown(model, cluster, training, layout, eff, "last")
    pick = np.asarray(first["total"]) >= np.asarray(last["total"])
    return {k: _out(np.where(pick, first[k], last[k])) for k in TERMS}


def headroom_frac(total_bytes: Any, gpu: GPUSpec) -> Any:
    """1 − total / usable HBM (negative = does not fit)."""
    return _out(1.0 - np.asarray(total_bytes, dtype=float) / gpu.hbm_bytes)


def fits(total_bytes: Any, gpu: GPUSpec, threshold: float = 0.9) -> Any:
    """The headroom verdict: peak ≤ ``threshold`` × usable HBM (DESIGN §1: 90%)."""
    if not 0 < threshold <= 1:
        raise ConfigError("threshold", threshold, "must be a fraction in (0, 1]")
    r = np.asarray(total_bytes, dtype=float) <= threshold * gpu.hbm_bytes
    return bool(r) if r.ndim == 0 else r


# ----------------------------------------------------------------- Korthikanti 2022 (GPT block)
def korthikanti_activation_items(s: float, b: float, h: float, a: float, t: float = 1, sp: bool = False,
                                 selective: bool = False) -> dict[str, float]:
    """Itemised bytes a GPT block saves, 16-bit activations, 1-byte dropout masks (Korthikanti 2022 §4.1).

    TP shards the attention and MLP internals; SP also shards the LayerNorm/dropout parts and the linear
    inputs (kept sharded, re-gathered in backward). Selective recompute drops the s²-sized items.
    """
    rep = t if sp else 1
    items = {
        "qkv_input": 2 * s * b * h / rep, "q_k": 4 * s * b * h / t, "softmax_out": 2 * a * s * s * b / t,
        "attn_dropout_mask": a * s * s * b / t, "attn_dropout_out": 2 * a * s * s * b / t, "v": 2 * s * b * h / t,
        "out_proj_input": 2 * s * b * h / t, "attn_out_dropout_mask": s * b * h / rep,
        "mlp_input": 2 * s * b * h / rep, "gelu_input": 8 * s * b * h / t, "gelu_output": 8 * s * b * h / t,
        "mlp_dropout_mask": s * b * h / rep, "layernorm_inputs": 4 * s * b * h / rep,
    }
    if selective:
        for k in ("softmax_out", "attn_dropout_mask", "attn_dropout_out"):
            items[k] = 0.0
    return items


def korthikanti_activation_bytes(s: float, b: float, h: float, a: float, t: float = 1, sp: bool = False,
                                 recompute: str = "none") -> float:
    """Per-layer activation bytes of a GPT block: the sum of the items, or 2sbh with full recompute (Table 2)."""
    _check("recompute", recompute, ("none", "selective", "full"))
    if recompute == "full":
        return 2.0 * s * b * h
    return float(sum(korthikanti_activation_items(s, b, h, a, t, sp, recompute == "selective").values()))
