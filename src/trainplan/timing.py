"""Time per optimizer step: per-op roofline compute, exposed communication, bubble, optimizer, offload.

One pure function per term, each citing its formula; all broadcast over numpy arrays so ``layout`` may
be a :class:`~trainplan.specs.Layout` or a :class:`~trainplan.specs.LayoutTable` (no Python branching
on layout fields). Times are per rank of the slowest pipeline stage (the last: it holds the logits).

Conventions: T = micro_batch·seq_len/cp tokens per rank per micro-batch; GEMM backward = 2× forward
(dgrad + wgrad; LoRA/QLoRA freeze the base weights, so only dgrad); flash attention backward = 2.5×
forward (5 vs 2 GEMMs, Dao 2023 FlashAttention-2 §3); causal attention does half of the 4·T·s·h FLOPs.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from trainplan import comm, flops
from trainplan.efficiency import Efficiency
from trainplan.specs import (
    ClusterSpec,
    Layout,
    LayoutTable,
    ModelSpec,
    TrainingSpec,
    grad_accum,
    shard_degree,
)

__all__ = ["step_time", "gemm_eff", "TIMING_KEYS"]

Array = Any
LayoutLike = Layout | LayoutTable

# Wire formats (bytes per element). FSDP2 MixedPrecisionPolicy(param_dtype=bf16, reduce_dtype=fp32) as
# torchtitan configures it; Megatron --accumulate-allreduce-grads-in-fp32 likewise reduces fp32 grads.
PARAM_COMM_BYTES = {"full": 2.0, "lora": 2.0, "qlora": 0.5}  # QLoRA all-gathers NF4 weights (Dettmers 2023)
GRAD_REDUCE_BYTES = 4.0
DDP_BUCKET_BYTES = 25 * 1024**2  # torch DDP default bucket_cap_mb=25 (the last bucket is exposed)
ATTN_BWD_FACTOR = 2.5

TIMING_KEYS = ("compute_s", "tp_comm_s", "cp_comm_s", "fsdp_comm_s", "dp_comm_s", "pp_p2p_s",
               "comm_exposed_s", "bubble_s", "optimizer_s", "offload_s", "step_time_s", "tokens_per_s",
               "tokens_per_s_per_gpu", "mfu", "hfu")


def gemm_eff(m: Array, n: Array, k: Array, eff: Efficiency) -> Array:
    """Shape-aware GEMM efficiency: max·d/(d+half), d = smallest dimension (wave quantisation, [I])."""
    d = np.minimum(np.minimum(m, n), k)
    return eff.gemm_eff_max * d / (d + eff.gemm_eff_half_dim)


def _gemm_s(m: Array, n: Array, k: Array, peak: float, eff: Efficiency) -> Array:
    """One GEMM's time: 2·M·N·K FLOPs at the shape-aware efficiency (roofline, compute-bound)."""
    return 2.0 * m * n * k / (peak * gemm_eff(m, n, k, eff))


def layer_gemm_fwd_s(model: ModelSpec, tokens: Array, tp: Array, peak: float, eff: Efficiency) -> Array:
    """Forward GEMMs of one block after Megatron TP splitting (QKV/up column-, O/down row-parallel)."""
    h, f, kv = model.hidden, model.ffn_hidden, model.kv_dim
    up = (2 if model.mlp == "swiglu" else 1) * f
    return (_gemm_s(tokens, (h + 2 * kv) / tp, h, peak, eff) + _gemm_s(tokens, h, h / tp, peak, eff)
            + _gemm_s(tokens, up / tp, h, peak, eff) + _gemm_s(tokens, h, f / tp, peak, eff))


def attn_fwd_s(model: ModelSpec, tokens: Array, seq_len: int, tp: Array, peak: float, eff: Efficiency) -> Array:
    """Causal attention core forward: 2·T·s·h/t FLOPs (half of 4·T·s·h; Dao 2023) at attn_eff."""
    return 2.0 * tokens * seq_len * model.hidden / tp / (peak * eff.attn_eff)


def layer_membound_fwd_s(model: ModelSpec, tokens: Array, tp: Array, sp: Array, hbm_Bps: float,
                         eff: Efficiency, act_bytes: float) -> Array:
    """Norms, residual adds, activation, RoPE: bytes moved / (HBM bw·membound_eff) (roofline, Williams 2009)."""
    h, f, kv = model.hidden, model.ffn_hidden, model.kv_dim
    e = act_bytes / 2.0
    replicated = 20.0 * h * e / np.where(sp, tp, 1)  # 2 norms (r+w), 2 residual adds (2r+w), bf16
    split = ((6.0 if model.mlp == "swiglu" else 4.0) * f + (4.0 * (h + kv) if model.pos_embedding == "rope" else 0.0)) * e / tp
    return tokens * (replicated + split) / (hbm_Bps * eff.membound_eff)


def logits_s(model: ModelSpec, tokens: Array, tp: Array, peak: float, hbm_Bps: float, eff: Efficiency,
             wgrad: float) -> Array:
    """Output projection (fwd + dgrad + wgrad) and fp32 cross-entropy over V/t (16 B per logit moved)."""
    g = _gemm_s(tokens, model.vocab / tp, model.hidden, peak, eff)
    loss = tokens * model.vocab / tp * 16.0 / (hbm_Bps * eff.membound_eff)
    return g * (2.0 + wgrad) + loss


def tp_comm_mb_s(model: ModelSpec, cluster: ClusterSpec, tokens: Array, layout: LayoutLike, layers: Array,
                 eff: Efficiency, act_bytes: float) -> Array:
    """TP/SP: 2 all-reduces (or AG+RS pairs) per block forward, 2 backward, 2 more if fully recomputed
    (Narayanan 2021 §3.2; Korthikanti 2022 §4.2.2); on the critical path (1 − tp_overlap)."""
    tp = np.asarray(layout.tp)
    bw, lat = comm.group_link(cluster, tp, 1)
    one = comm.all_reduce_s(tokens * model.hidden * act_bytes, tp, bw, lat, eff)
    n = 4 + np.where(layout.recompute == "full", 2, 0)
    return layers * n * one * (1.0 - eff.tp_overlap)


def cp_comm_mb_s(model: ModelSpec, cluster: ClusterSpec, tokens: Array, layout: LayoutLike, layers: Array,
                 attn_layer_s: Array, eff: Efficiency, act_bytes: float) -> Array:
    """CP: ring passes K,V (c−1 hops fwd, K,V and dK,dV bwd; Liu 2023 Ring Attention) overlapped with the
    block's attention; Ulysses does 4 all-to-alls fwd and 4 bwd on the critical path (Jacobs 2023)."""
    cp, tp = np.asarray(layout.cp), np.asarray(layout.tp)
    bw, lat = comm.group_link(cluster, cp, tp)
    kv_chunk = tokens * 2 * model.kv_dim / tp * act_bytes
    ring = 3.0 * comm.all_gather_s(cp * kv_chunk, cp, bw, lat, eff)
    ring = np.maximum(0.0, ring - eff.cp_overlap * attn_layer_s)
    a2a_bytes = tokens * (2 * model.hidden + 2 * model.kv_dim) / tp * act_bytes
    uly = (2.0 + np.where(layout.recompute == "full", 1.0, 0.0)) * comm.all_to_all_s(a2a_bytes, cp, bw, lat, eff)
    return layers * np.where(cp > 1, np.where(layout.cp_kind == "ring", ring, uly), 0.0)


def fsdp_comm_mb_s(model: ModelSpec, cluster: ClusterSpec, training: TrainingSpec, layout: LayoutLike,
                   shard: Array, compute_mb: Array, eff: Efficiency) -> Array:
    """ZeRO-3/FSDP per micro-batch: all-gather fwd + bwd, reduce-scatter grads (Rajbhandari 2019 §5: 3Ψ);
    prefetch hides fsdp_overlap of it behind compute; the first unit's all-gather is exposed."""
    tp, pp = np.asarray(layout.tp), np.asarray(layout.pp)
    unit = model.n_params_per_layer / tp
    units = model.n_params / (tp * pp) / unit
    bw, lat = comm.group_link(cluster, shard, tp)
    pbytes = PARAM_COMM_BYTES[training.finetune]
    ag = comm.all_gather_s(unit * pbytes, shard, bw, lat, eff)
    rs = comm.reduce_scatter_s(unit * GRAD_REDUCE_BYTES * _trainable_frac(model, training), shard, bw, lat, eff)
    replicas = layout.dp * layout.cp // np.maximum(shard, 1)
    rbw, rlat = comm.group_link(cluster, replicas, tp * shard)
    ar = comm.all_reduce_s(unit * GRAD_REDUCE_BYTES * _trainable_frac(model, training) / shard, replicas, rbw, rlat, eff)
    total = units * (2.0 * ag + rs + ar)
    exposed = ag + np.maximum(0.0, total - eff.fsdp_overlap * compute_mb)
    return np.where(np.isin(layout.sharding, ("zero3", "hsdp")), exposed, 0.0)


def dp_comm_step_s(model: ModelSpec, cluster: ClusterSpec, training: TrainingSpec, layout: LayoutLike,
                   bwd_mb: Array, eff: Efficiency) -> Array:
    """DDP all-reduce (or ZeRO-1/2 reduce-scatter + param all-gather) once per step; buckets overlap the
    last micro-batch's backward except the last bucket (Li 2020, PyTorch DDP §3.2.3)."""
    tp, pp = np.asarray(layout.tp), np.asarray(layout.pp)
    n = layout.dp * layout.cp
    bw, lat = comm.group_link(cluster, n, tp)
    grad_bytes = model.n_params / (tp * pp) * GRAD_REDUCE_BYTES * _trainable_frac(model, training)
    ar = comm.all_reduce_s(grad_bytes, n, bw, lat, eff)
    rs = comm.reduce_scatter_s(grad_bytes, n, bw, lat, eff)
    ag = comm.all_gather_s(grad_bytes / GRAD_REDUCE_BYTES * 2.0, n, bw, lat, eff)
    reduce = np.where(layout.sharding == "none", ar, rs)
    frac_last = np.minimum(1.0, DDP_BUCKET_BYTES / np.maximum(grad_bytes, 1.0))
    exposed = reduce * frac_last + np.maximum(0.0, reduce * (1 - frac_last) - eff.ddp_overlap * bwd_mb)
    exposed = exposed + np.where(layout.sharding == "none", 0.0, ag)
    return np.where(np.isin(layout.sharding, ("none", "zero1", "zero2")), exposed, 0.0)


def pp_p2p_mb_s(model: ModelSpec, cluster: ClusterSpec, tokens: Array, layout: LayoutLike, eff: Efficiency,
                act_bytes: float) -> Array:
    """Stage-to-stage activation send fwd + grad send bwd per micro-batch (×v interleaved; Narayanan 2021 §2.2)."""
    tp = np.asarray(layout.tp)
    nbytes = tokens * model.hidden * act_bytes / np.where(layout.sp, tp, 1)
    crosses = tp * layout.cp * layout.dp >= cluster.gpus_per_node
    one = comm.p2p_s(nbytes, crosses, cluster, eff)
    return np.where(layout.pp > 1, 2.0 * layout.vpp * one * (1.0 - eff.pp_p2p_overlap), 0.0)


def bubble_s(pp: Array, vpp: Array, m: Array, per_mb_s: Array) -> Array:
    """Pipeline bubble: (p−1)/(v·m) of the ideal m·τ (Narayanan 2021 §2.2.1–2.2.2)."""
    return (pp - 1) / (vpp * m) * (m * per_mb_s)


def optimizer_s(local_params: Array, hbm_Bps: float, eff: Efficiency) -> Array:
    """AdamW step, memory-bound over the local shard: params·bytes touched / (HBM bw·membound_eff)."""
    return local_params * eff.optimizer_bytes_per_param_traffic / (hbm_Bps * eff.membound_eff)


def offload_s(local_params: Array, cluster: ClusterSpec, eff: Efficiency) -> Array:
    """CPU optimizer: fp32 grads D2H + bf16 params H2D over PCIe, plus CPU Adam (Ren 2021, ZeRO-Offload §4)."""
    pcie = local_params * (GRAD_REDUCE_BYTES + 2.0) / cluster.host_to_device_Bps
    return pcie + local_params / eff.cpu_optimizer_params_per_s


def _trainable_frac(model: ModelSpec, training: TrainingSpec) -> float:
    """Trainable / total parameters: 1 for full fine-tuning; LoRA adds r·(in+out) per target (Hu 2021)."""
    if training.finetune == "full":
        return 1.0
    h, f, kv = model.hidden, model.ffn_hidden, model.kv_dim
    dims = {"q": (h, h), "k": (h, kv), "v": (h, kv), "o": (h, h), "gate": (h, f), "up": (h, f), "down": (f, h)}
    lora = model.layers * training.lora_rank * sum(sum(dims[t]) for t in training.lora_targets)
    return lora / model.n_params


def step_time(model: ModelSpec, cluster: ClusterSpec, training: TrainingSpec, layout: LayoutLike,
              eff: Efficiency | None = None) -> dict[str, Array]:
    """Seconds per optimizer step and its breakdown, tokens/s, MFU and HFU (keys: TIMING_KEYS)."""
    eff = eff or Efficiency()
    gpu = cluster.gpu
    peak, hbm = gpu.peak_bf16_flops, gpu.hbm_bw_Bps
    act = 2.0 if training.precision == "bf16" else 4.0
    s = training.seq_len
    tp, pp, cp = np.asarray(layout.tp), np.asarray(layout.pp), np.asarray(layout.cp)
    sp, vpp = np.asarray(layout.sp, dtype=bool), np.asarray(layout.vpp)
    rc = np.asarray(layout.recompute)
    m = np.asarray(grad_accum(training, layout))
    tokens = layout.micro_batch * s / cp
    layers = model.layers / pp
    wgrad = 1.0 if training.finetune == "full" else 0.0

    g = layer_gemm_fwd_s(model, tokens, tp, peak, eff)
    a = attn_fwd_s(model, tokens, s, tp, peak, eff)
    e = layer_membound_fwd_s(model, tokens, tp, sp, hbm, eff, act)
    fwd = g + a + e
    bwd = g * (1.0 + wgrad) + a * ATTN_BWD_FACTOR + 2.0 * e
    redo = np.where(rc == "full", fwd, np.where(rc == "selective", a, 0.0))
    compute_mb = layers * (fwd + bwd + redo) + logits_s(model, tokens, tp, peak, hbm, eff, wgrad)

    tp_mb = tp_comm_mb_s(model, cluster, tokens, layout, layers, eff, act)
    cp_mb = cp_comm_mb_s(model, cluster, tokens, layout, layers, a * (1 + ATTN_BWD_FACTOR), eff, act)
    shard = np.asarray(shard_degree(layout, cluster))
    fsdp_mb = fsdp_comm_mb_s(model, cluster, training, layout, shard, compute_mb, eff)
    p2p_mb = pp_p2p_mb_s(model, cluster, tokens, layout, eff, act)
    dp = dp_comm_step_s(model, cluster, training, layout, layers * bwd, eff)

    per_mb = compute_mb + tp_mb + cp_mb
    bubble = bubble_s(pp, vpp, m, per_mb)
    stage_params = model.n_params / (tp * pp)
    local = stage_params * _trainable_frac(model, training) / np.where(layout.sharding == "none", 1, shard)
    cpu = np.asarray(layout.offload) == "cpu"
    opt = np.where(cpu, 0.0, optimizer_s(local, hbm, eff))
    off = np.where(cpu, offload_s(local, cluster, eff), 0.0)

    compute = m * compute_mb
    exposed = m * (tp_mb + cp_mb + fsdp_mb + p2p_mb) + dp
    step = compute + exposed + bubble + opt + off
    tok_s = training.tokens_per_step / step
    n = cluster.n_gpus
    mfu = flops.model_flops_per_token(model, s) * tok_s / (n * peak)
    hw = {k: flops.hardware_flops_per_token(model, s, k) for k in ("none", "selective", "full")}
    hfu = np.where(rc == "full", hw["full"], np.where(rc == "selective", hw["selective"], hw["none"])) * tok_s / (n * peak)
    out = {"compute_s": compute, "tp_comm_s": m * tp_mb, "cp_comm_s": m * cp_mb, "fsdp_comm_s": m * fsdp_mb,
           "dp_comm_s": dp, "pp_p2p_s": m * p2p_mb, "comm_exposed_s": exposed, "bubble_s": bubble,
           "optimizer_s": opt, "offload_s": off, "step_time_s": step, "tokens_per_s": tok_s,
           "tokens_per_s_per_gpu": tok_s / n, "mfu": mfu, "hfu": hfu}
    if isinstance(layout, Layout):
        return {k: float(np.asarray(v)) for k, v in out.items()}
    return {k: np.broadcast_to(np.asarray(v, dtype=float), (len(layout),)).copy() for k, v in out.items()}
