"""Time per optimizer step: per-op roofline compute, exposed communication, bubble, optimizer, offload.

One pure function per term, each citing its formula; all broadcast over numpy arrays so ``layout`` may
be a :class:`~trainplan.model.layout.Layout` or a :class:`~trainplan.model.layout.LayoutTable` (no Python branching
on layout fields). Times are per rank of the slowest pipeline stage (the last: it holds the logits).

Conventions: T = micro_batch·seq_len/cp tokens per rank per micro-batch; GEMM backward = 2× forward
(dgrad + wgrad; LoRA/QLoRA freeze the base weights, so only dgrad); flash attention backward = 2.5×
forward (5 vs 2 GEMMs, Dao 2023 FlashAttention-2 §3); causal attention does half of the 4·T·s·h FLOPs.
``training.kernels`` (eager | compiled | fused) sets the bytes the non-GEMM ops move and what selective
recompute reruns; ``training.attn_impl`` (flash | math) whether the s×s scores are materialised. The
kernel-by-kernel byte counts and the fit of the Efficiency defaults are derived in docs/timing-model.md.
"""

from __future__ import annotations

import functools
import json
from typing import Any

import numpy as np

from trainplan import pkgdata
from trainplan.model import comm, flops
from trainplan.model.arch import ModelSpec
from trainplan.model.efficiency import Efficiency
from trainplan.model.hardware import ClusterSpec
from trainplan.model.layout import Layout, LayoutTable, check_precision, grad_accum, shard_degree
from trainplan.model.memory import (
    FP32,
    NF4_BYTES_PER_PARAM,
    layer_matmul_params_per_rank,
    model_states,
    resolve_sp_impl,
)
from trainplan.model.training import TrainingSpec

__all__ = ["step_time", "gemm_eff", "attn_eff_at", "TIMING_KEYS", "COMPUTE_PARTS"]

Array = Any
LayoutLike = Layout | LayoutTable

# Wire formats (bytes per element). FSDP2 MixedPrecisionPolicy(param_dtype=bf16, reduce_dtype=fp32) as
# torchtitan configures it; Megatron --accumulate-allreduce-grads-in-fp32 likewise reduces fp32 grads.
PARAM_COMM_BYTES = {"full": 2.0, "lora": 2.0, "qlora": 0.5}  # QLoRA all-gathers NF4 weights (Dettmers 2023)
GRAD_REDUCE_BYTES = 4.0
DDP_BUCKET_BYTES = 25 * 1024**2  # torch DDP default bucket_cap_mb=25 (the last bucket is exposed)
ATTN_BWD_FACTOR = 2.5
# Backward of an elementwise/norm op reads its saved input(s) and the incoming gradient and writes the input
# gradient: about twice the forward traffic (docs/timing-model.md §2) [I].
MEMBOUND_BWD_FACTOR = 2.0

# Kernels one transformer block launches per forward pass, by kernel class [I, counted in the block code]:
# eager torchtitan/HF Llama: 7 GEMMs + RMSNorm (6 ops) ×2 + complex RoPE (~8) + repeat_kv copies (~4) + SDPA + SiLU·mul
# (2) + residual adds (2) + views/casts (~6) ≈ 40; torch.compile fuses the pointwise chains (≈ 7 GEMMs + SDPA + ~7
# Triton kernels = 15); Megatron/TE: fused QKV and gate/up GEMMs, fused norm, RoPE, bias-act, bias-dropout-add
# (≈ 4 GEMMs + attention + ~5 fused kernels = 10). Backward launches about twice as many.
KERNELS_PER_BLOCK = {"eager": 40.0, "compiled": 15.0, "fused": 10.0}
KERNEL_BWD_FACTOR = 2.0
FP8_PEAK_FACTOR = 2.0  # dense FP8 / dense BF16 on Hopper (NVIDIA H100 datasheet: 1,979 / 989 TFLOP/s)

TIMING_KEYS = ("compute_s", "tp_comm_s", "cp_comm_s", "fsdp_comm_s", "dp_comm_s", "pp_p2p_s",
               "comm_exposed_s", "bubble_s", "optimizer_s", "offload_s", "step_time_s", "tokens_per_s",
               "tokens_per_s_per_gpu", "mfu", "hfu")
# The terms that add up to step_time_s, in the order the memo's figure stacks them and `trainplan estimate` prints them.
STEP_PARTS = {"compute_s": "compute", "comm_exposed_s": "exposed comm", "bubble_s": "pipeline bubble",
              "optimizer_s": "optimizer step", "offload_s": "CPU offload"}  # key → what it is
# Parts of compute_s per step (each already inside it; not to be added to the other terms): the recompute, FSDP2's
# all-gather copy-out on the compute stream, the ring-attention merges and QLoRA's dequantisation. They say *why* a
# layout computes longer than another (search.layouts names the part that grows most).
COMPUTE_PARTS = {"recompute_s": "recompute", "fsdp_copy_s": "FSDP all-gather copies on the compute stream",
                 "ring_merge_s": "ring-attention merges", "dequant_s": "QLoRA dequantisation"}  # key → what it is


FSDP2_SHARDINGS = ("zero3", "hsdp")  # the shardings FSDP2 (fully_shard) runs: parameters gathered per layer


def _isin(x: Array, options: tuple[str, ...]) -> Array:
    """``np.isin(x, options)``, answered in Python for one layout (a str): numpy's call costs ~20 µs, and a
    published-table refit makes six per row and evaluation."""
    return x in options if isinstance(x, str) else np.isin(x, options)


def class_efficiency(eff: Efficiency, kernels: str) -> Efficiency:
    """The Efficiency a kernel class runs at: PyTorch (eager/compiled) GEMMs, BF16 and FP8, at ``torch_gemm_rel``
    of the fused (Megatron/TE) stack's."""
    if kernels == "fused" or eff.torch_gemm_rel == 1:
        return eff
    r = eff.torch_gemm_rel
    return eff.replace(gemm_eff_max=eff.gemm_eff_max * r, fp8_gemm_eff_tensorwise=eff.fp8_gemm_eff_tensorwise * r,
                       fp8_gemm_eff_rowwise=eff.fp8_gemm_eff_rowwise * r)


def gemm_eff(m: Array, n: Array, k: Array, eff: Efficiency) -> Array:
    """Shape-aware GEMM efficiency: max·d/(d+half), d = smallest dimension (wave quantisation, [I])."""
    d = np.minimum(np.minimum(m, n), k)
    return eff.gemm_eff_max * d / (d + eff.gemm_eff_half_dim)


def _gemm_s(m: Array, n: Array, k: Array, peak: float, eff: Efficiency) -> Array:
    """One GEMM's time: 2·M·N·K FLOPs at the shape-aware efficiency (roofline, compute-bound)."""
    return 2.0 * m * n * k / (peak * gemm_eff(m, n, k, eff))


def block_gemm_widths(model: ModelSpec, kernels: str, tp: Array = 1) -> list[tuple[Array, Array]]:
    """(N, K) on one TP rank of each forward GEMM of one block (M = tokens): the output width and the reduction
    width after Megatron TP splitting (q, k, v, gate, up column-parallel: N/tp; o, down row-parallel: K/tp; K and V
    over min(tp, kv_heads) ranks, one replicated head each beyond, as memory.layer_matmul_params_per_rank).
    torchtitan/HF Llama (eager/compiled) run separate q, k, v and gate, up projections, so under GQA and TP the K/V
    GEMMs are the narrowest of the block (Llama-3 8B at tp8: 1024/8 = 128 columns); Megatron/TE (fused) runs one
    QKV and one gate·up GEMM (docs/timing-model.md §7.6)."""
    h, f, kv, qd = model.hidden, model.ffn_hidden, model.kv_dim, model.heads * model.head_dim  # qd ≠ h: Gemma
    tp = np.asarray(tp, dtype=float)
    kv_rank = kv / np.minimum(tp, model.kv_heads)
    n_in = 2 if model.mlp == "swiglu" else 1  # gate and up, or the one up projection
    if kernels == "fused":
        return [(qd / tp + 2.0 * kv_rank, h), (h, qd / tp), (n_in * f / tp, h), (h, f / tp)]
    return [(qd / tp, h), (kv_rank, h), (kv_rank, h), (h, qd / tp)] + [(f / tp, h)] * n_in + [(h, f / tp)]


def layer_gemm_fwd_s(model: ModelSpec, tokens: Array, tp: Array, peak: float, eff: Efficiency,
                     kernels: str = "fused") -> Array:
    """Forward GEMMs of one block, each at the efficiency of its own per-rank shape (block_gemm_widths); the
    backward's dgrad and wgrad GEMMs have the same three dimensions, so the same efficiency."""
    return sum(_gemm_s(tokens, n, k, peak, eff) for n, k in block_gemm_widths(model, kernels, tp))


def fp8_linear_dims(model: ModelSpec, kernels: str) -> tuple[list[float], list[float]]:
    """(input widths, output widths) of the block linears each FP8 cast acts on, before TP splitting. torchao
    converts every nn.Linear of the block, each casting its own input: torchtitan/HF Llama have separate q, k, v
    and gate, up projections (eager/compiled); Megatron/TE fuses QKV and gate·up into one linear each (fused)."""
    h, f, kv, qd = model.hidden, model.ffn_hidden, model.kv_dim, model.heads * model.head_dim
    swiglu = model.mlp == "swiglu"
    if kernels == "fused":
        return [h, qd, h, f], [qd + 2 * kv, h, (2 if swiglu else 1) * f, h]
    ins = [h, h, h, qd] + ([h, h] if swiglu else [h]) + [f]
    outs = [qd, kv, kv, h] + ([f, f] if swiglu else [f]) + [h]
    return ins, outs


# HBM bytes per element of FP8 casting work (dynamic scaling: an amax pass reads the bf16 tensor, the cast reads it
# again and writes 1 byte; a transposed FP8 copy reads 1, writes 1) [derived: torchao float8 tensorwise/rowwise,
# under torch.compile, which fuses each chain into two kernels].
FP8_CAST_BYTES = 5.0
FP8_TRANSPOSE_BYTES = 2.0
# The same chains in eager mode, one kernel per op [derived: torchao.float8 float8_utils.tensor_to_amax,
# _ToFloat8ConstrFunc, to_fp8_saturated]: amax = max(abs(x)) (abs: read 2, write 2; max: read 2), then
# x.to(float32) (2 + 4), / scale (4 + 4), clamp (4 + 4), .to(float8) (4 + 1): 33 B per element.
FP8_CAST_BYTES_EAGER = 6.0 + 6.0 + 8.0 + 8.0 + 5.0


def te_fp8(training: TrainingSpec) -> bool:
    """FP8 through Transformer Engine: the fused (Megatron / TE) kernel class with per-tensor scaling, which TE
    runs as delayed scaling; the other classes (and rowwise anywhere) cast as torchao's dynamic recipes do."""
    return training.kernels == "fused" and training.fp8 == "tensorwise"


def fp8_cast_bytes_mb(model: ModelSpec, training: TrainingSpec, tokens: Array, tp: Array,
                      weight_cast: Array) -> tuple[Array, Array]:
    """HBM bytes of one block's FP8 casts per micro-batch, (forward, backward). Tensorwise: cast each linear
    input (fwd) and output gradient (bwd), transposed FP8 copies of both for wgrad, and each weight (cast +
    transposed copy) unless FSDP all-gathers it already in FP8 (``weight_cast`` = 0). Rowwise: scales per row
    along each GEMM's reduction axis, so the backward re-quantises the saved bf16 input along the other axis and
    the output gradient along both (no transposed copies), and FSDP all-gathers bf16 weights. Eager mode runs each
    cast as its unfused op chain (``FP8_CAST_BYTES_EAGER``)."""
    ins, outs = fp8_linear_dims(model, training.kernels)
    x_in, x_out = tokens * sum(ins) / tp, tokens * sum(outs) / tp
    w = layer_matmul_params_per_rank(model, tp) * weight_cast
    c = FP8_CAST_BYTES_EAGER if training.kernels == "eager" else FP8_CAST_BYTES
    if training.fp8 == "rowwise":
        return c * x_in + c * w, 2.0 * c * x_out + c * x_in + c * w
    return c * x_in + (c + FP8_TRANSPOSE_BYTES) * w, c * x_out + FP8_TRANSPOSE_BYTES * (x_in + x_out)


# Transformer Engine's FP8 (kernels=fused, tensorwise: TE's per-tensor delayed scaling, as NeMo / Megatron run it),
# HBM bytes per element [derived: TE 1.x LayerNormLinear / LayerNormMLP / Linear]. Delayed scaling takes each scale
# from the amax history of earlier steps and records the new amax inside the cast kernel, so no amax pass; TE's
# cast-transpose kernel reads bf16 once and writes the FP8 copy and, where the weight gradient needs it, its
# transpose (2 + 1 + 1); the norm before QKV and FC1 and the MLP activation before FC2 write their outputs in FP8
# themselves, leaving only the transposed copy for wgrad (read 1, write 1); weights are cast and transposed with
# the step's first micro-batch and reused by the others (``is_first_microbatch``).
TE_CAST_TRANSPOSE_BYTES = 4.0
TE_CAST_BYTES = 3.0


def te_fp8_cast_bytes(model: ModelSpec, training: TrainingSpec, tokens: Array,
                      tp: Array) -> tuple[Array, Array, Array]:
    """HBM bytes of one block's FP8 casts under Transformer Engine: (forward per micro-batch, backward per
    micro-batch, weights per step). Forward: a cast(-transpose) of the attention output feeding the out projection
    (the other three linears take FP8 from the norm or activation kernel before them); backward: a
    cast(-transpose) of every output gradient and, for wgrad, the transposed FP8 copies of the norm- and
    activation-fused inputs (full fine-tuning only: frozen weights need no wgrad, so no transposes of their
    inputs or gradients); per step: each weight cast with its transpose (dgrad reads it), once."""
    full = training.finetune == "full"
    ins, outs = fp8_linear_dims(model, "fused")  # in: [h, q, h, f]; out: [qkv, h, (2)f, h]
    fused_in = tokens * (ins[0] + ins[2] + ins[3]) / tp
    proj_in, x_out = tokens * ins[1] / tp, tokens * sum(outs) / tp
    cast = TE_CAST_TRANSPOSE_BYTES if full else TE_CAST_BYTES
    bwd = cast * x_out + (FP8_TRANSPOSE_BYTES * fused_in if full else 0.0)
    return cast * proj_in, bwd, TE_CAST_TRANSPOSE_BYTES * layer_matmul_params_per_rank(model, tp)


# Our own kernel timings (benchmarks/bench_attention_backends.py on one H200, 2026-12-04; package data, copied from
# data/calibration/h200-2026-12-04/microbench/attention_backends.json): causal SDPA, forward+backward, per backend.
ATTENTION_BACKENDS_FILE = "h200_attention_backends_20261204.json"
_BACKEND_OF = {"fa2": "flash (FA2)", "cudnn": "cudnn"}


@functools.cache
def attention_kernel_rel(kernel: str) -> float:
    """Training-rate ratio of ``kernel``'s causal attention to FlashAttention-2's at the same shapes: the median over
    the measured sequence lengths (1k–16k; cuDNN/FA2 1.69–1.74) of our H200 timings. ``attn_eff`` was fitted on
    FA2-era runs and matches FA2 alone (docs/timing-model.md §7.9), so another kernel scales it by this ratio. The
    published Transformer Engine rows ran 2024's cuDNN attention, slower than this measurement's: they keep the
    fitted rate (§7.7)."""
    if kernel == "fa2":
        return 1.0
    rows = json.loads(pkgdata.path(f"{pkgdata.DATA}/{ATTENTION_BACKENDS_FILE}").read_text())["rows"]
    rate = {(r["backend"], r["seq"]): r["train_tflops"] for r in rows if "train_tflops" in r}
    ratios = [rate[(_BACKEND_OF[kernel], s)] / rate[(_BACKEND_OF["fa2"], s)]
              for (b, s) in rate if b == _BACKEND_OF[kernel] and (_BACKEND_OF["fa2"], s) in rate]
    if not ratios:
        raise ValueError(f"{ATTENTION_BACKENDS_FILE}: no {kernel} and FA2 timings at a common sequence length")
    return float(np.median(ratios))


# Our own HBM stream rates (benchmarks/bench_hbm_stream.py on one H200, 2026-12-04; package data, copied from
# data/calibration/h200-2026-12-04b/microbench/hbm_stream.json): each weight-sized streaming kernel's bandwidth as a
# fraction of the spec HBM bandwidth, timed on one Llama-2-13B block's weights (317 M elements, so a call's ~8 µs of
# latency is under 2% of it).
HBM_STREAM_FILE = "h200_hbm_stream_20261204.json"


@functools.cache
def stream_frac(kernel: str) -> float:
    """Measured fraction of spec HBM bandwidth that ``kernel`` (a ``bench_hbm_stream`` kernel name, e.g.
    ``cast_fp32_to_bf16``) streams at on Hopper: a hardware fact of the generation, like the measured GEMM ceiling,
    not a fit (docs/timing-model.md §7.11)."""
    rows = json.loads(pkgdata.path(f"{pkgdata.DATA}/{HBM_STREAM_FILE}").read_text())["results"]
    frac = {r["kernel"]: float(r["frac_of_spec"]) for r in rows}
    if kernel not in frac:
        raise ValueError(f"{HBM_STREAM_FILE}: no timing of {kernel!r}; measured: {', '.join(sorted(frac))}")
    return frac[kernel]


def attn_eff_at(keys: Array, head_dim: int, eff: Efficiency) -> Array:
    """Flash attention fraction of peak for calls of ``keys`` keys per query row: attn_eff · w/(w + half), w = keys ·
    head_dim (docs/timing-model.md §7.5); attn_eff itself when ``attn_eff_half_work`` is 0."""
    w = np.asarray(keys, dtype=float) * head_dim
    return eff.attn_eff * w / (w + eff.attn_eff_half_work)


def attn_keys_per_call(seq_len: int, layout: LayoutLike) -> Array:
    """Keys per query row of one flash-attention call: a ring-CP step sees one chunk (s/cp); Ulysses all-to-alls
    the heads, so each rank attends over the whole sequence (heads/cp) in one call: s (docs/timing-model.md §7.5)."""
    cp = np.asarray(layout.cp, dtype=float)
    return np.where(np.asarray(layout.cp_kind) == "ulysses", float(seq_len), seq_len / cp)


def attn_fwd_s(model: ModelSpec, tokens: Array, seq_len: int, tp: Array, peak: float, eff: Efficiency,
               cp: Array = 1) -> Array:
    """Causal attention core forward: 2·T·s·h/t FLOPs (half of 4·T·s·h; Dao 2023) at attn_eff_at(s/cp, head_dim):
    under ring CP each call (ring step) sees the s/cp keys of one chunk (Ulysses: pass cp=1, one call over s keys)."""
    return (2.0 * tokens * seq_len * model.heads * model.head_dim / tp
            / (peak * attn_eff_at(seq_len / np.asarray(cp), model.head_dim, eff)))


def norm_bytes_per_elem(model: ModelSpec, kernels: str, e: float) -> float:
    """HBM bytes per element of one norm, forward (kernel-by-kernel count, docs/timing-model.md §2)."""
    if kernels == "eager" and model.norm == "rmsnorm":
        # x.float() (e r, 4 w) · pow(2) (4 r, 4 w) · mean (4 r) · x*rsqrt (4 r, 4 w) · type_as (4 r, e w) · ×w (e r, e w)
        return 28.0 + 4.0 * e
    return 2.0 * e  # one fused kernel (apex/TE/Inductor; nn.LayerNorm is one native kernel): read x, write y


def membound_bytes_fwd(model: ModelSpec, kernels: str, tp: Array, sp: Array, e: float, impl: str = "auto",
                       autocast: bool = False) -> Array:
    """HBM bytes per token of one block's non-GEMM ops, forward (docs/timing-model.md §2; Williams 2009 roofline).

    ``replicated`` ops run on all h features on every TP rank unless SP splits them; ``split`` ops act on
    the TP-split q/k/v/FFN activations. ``impl='harness'``: the proxy harness's own block code (one-kernel
    F.rms_norm, real interleaved RoPE, no GQA copy); ``autocast``: its residual stream is fp32 (norms read and write
    4 B, the adds write 4 B; eager: each linear casts the fp32 norm output it reads, RoPE's fp32 tables make q, k
    fp32 until SDPA casts them back; compiled: Inductor fuses the casts into the norm and RoPE kernels)
    (docs/timing-model.md §7.13).
    """
    h, f, kv, q = model.hidden, model.ffn_hidden, model.kv_dim, model.q_dim
    eager = kernels == "eager"
    harness = impl == "harness"
    r = float(FP32) if autocast else e  # the residual stream's bytes (memory.residual_bytes)
    residual = 2.0 * r + e if autocast else 3.0 * e  # x + y: read 2, write 1 (Megatron/Inductor fuse it: same traffic)
    if autocast and not eager:  # compiled (or fused): one kernel reads the fp32 input and writes the bf16 cast
        norm = r + e
    else:
        norm = 2.0 * r if harness else norm_bytes_per_elem(model, kernels, r)
    # autocast, eager: each linear that reads a norm output casts it to bf16 apart: q, k, v and gate, up (or up)
    casts = AUTOCAST_CAST_BYTES * (3 + (2 if model.mlp == "swiglu" else 1)) if autocast and eager else 0.0
    replicated = model.norms_per_layer * norm + 2.0 * residual + casts  # 2 norms (Gemma 2/3 sandwich: 4; Falcon: 1)
    if model.mlp == "swiglu":
        act = 5.0 * e if eager else 3.0 * e  # silu (r, w) then ·up (2 r, w) | one fused kernel (2 r, w)
    else:
        act = 2.0 * e  # (bias-)GELU: read, write
    rope = 0.0
    if model.pos_embedding == "rope":
        # eager complex RoPE per q/k element: .float() (e r, 4 w) · complex mul (4 r, 4 w) · type_as (4 r, e w).
        # "compiled" keeps that count: Inductor does not generate code for complex ops and falls back to the eager
        # kernels (pytorch/pytorch#98155; the warning torchtitan#15 reports for this very RoPE), so only a fused
        # real-valued RoPE kernel (Megatron/TE, "fused") reads and writes each element once.
        rope = (16.0 + 2.0 * e if kernels in ("eager", "compiled") else 2.0 * e) * (q + kv)
        if harness:  # real-valued: 4 muls over the halves (e r, e_out w), sub, add, stack | one Inductor kernel
            out = r  # the cos/sin tables take the residual stream's dtype: fp32 under autocast
            sdpa_cast = AUTOCAST_CAST_BYTES if autocast else 0.0  # SDPA casts the fp32 q, k back to bf16
            rope = (2.0 * e + 7.0 * out + sdpa_cast if eager else 2.0 * e) * (q + kv)
    # GQA: eager/compiled torchtitan and HF materialise repeat_kv for SDPA (k and v: read kv, write q's width)
    gqa = 2.0 * e * (kv + q) if (kv < q and kernels != "fused" and not harness) else 0.0
    qk_norm = norm * (q + kv) if model.qk_norm else 0.0  # q/k norms (Qwen3, Gemma 3 per head; OLMo 2 whole)
    split = act * f + rope + gqa + qk_norm
    return replicated * h / np.where(sp, tp, 1) + split / tp


def layer_membound_fwd_s(model: ModelSpec, tokens: Array, tp: Array, sp: Array, hbm_Bps: float,
                         eff: Efficiency, act_bytes: float, kernels: str = "fused", impl: str = "auto",
                         autocast: bool = False) -> Array:
    """Norms, residual adds, activation, RoPE, GQA copies: bytes moved / (HBM bw·membound_eff) (roofline)."""
    return (tokens * membound_bytes_fwd(model, kernels, tp, sp, act_bytes, impl, autocast)
            / (hbm_Bps * eff.membound_eff))


def attn_math_bytes_per_score(act_bytes: float) -> tuple[float, float]:
    """Materialised attention, HBM bytes per score element (fwd, bwd): fused scale-mask-softmax (r, w) + dropout
    (r, w, 1-byte mask); backward dropout (r, mask, w) + softmax (2 r, w) (Megatron-LM 2021 kernels; §3)."""
    e = act_bytes
    return 4.0 * e + 1.0, 5.0 * e + 1.0


def attn_math_fwd_s(model: ModelSpec, tokens: Array, seq_len: int, tp: Array, peak: float, hbm_Bps: float,
                    eff: Efficiency, act_bytes: float) -> tuple[Array, Array]:
    """Unfused attention (no flash): QKᵀ and PV batched GEMMs over the full s×s (4·T·s·h/t FLOPs) at the
    head-dim-limited GEMM efficiency, plus softmax/dropout traffic over T·(a/t)·s scores (Korthikanti 2022 §4).
    Returns (forward s, backward s)."""
    d = model.head_dim
    g = 4.0 * tokens * seq_len * model.heads * d / tp / (peak * gemm_eff(seq_len, seq_len, d, eff))
    scores = tokens * (model.heads / tp) * seq_len
    fb, bb = attn_math_bytes_per_score(act_bytes)
    bw = hbm_Bps * eff.membound_eff
    return g + scores * fb / bw, 2.0 * g + scores * bb / bw


def loss_bytes_per_logit(kernels: str) -> float:
    """Cross-entropy traffic per logit, fwd+bwd (§4): eager fp32 upcast chain 40 B; fused/compiled 16 B."""
    # eager: .float() (2 r, 4 w) · log_softmax (2 passes 8 r, 4 w) · nll bwd (4 w) ·
    #        log_softmax bwd (8 r, 4 w) · back to bf16 (4 r, 2 w) = 40
    return 40.0 if kernels == "eager" else 16.0


def fsdp_copy_bytes_per_param(training: TrainingSpec) -> tuple[float, float]:
    """FSDP2 per parameter per micro-batch (§5): (copy-out of each all-gather, fwd and bwd, read + write
    the gathered dtype, on the compute stream; reduce-scatter copy-in with the fp32 reduce cast, read bf16 +
    write fp32, on the reduce-scatter stream) (torch ``_fsdp_collectives`` foreach_all_gather_copy_out, foreach_reduce)."""
    p = PARAM_COMM_BYTES[training.finetune]
    return 2.0 * 2.0 * p, (2.0 + GRAD_REDUCE_BYTES) * _trainable_frac_full(training)


def logits_s(model: ModelSpec, tokens: Array, tp: Array, peak: float, hbm_Bps: float, eff: Efficiency,
             wgrad: float, kernels: str = "fused") -> Array:
    """Output projection (fwd + dgrad + wgrad) and cross-entropy over V/t (loss_bytes_per_logit)."""
    g = _gemm_s(tokens, model.vocab / tp, model.hidden, peak, eff)
    loss = tokens * model.vocab / tp * loss_bytes_per_logit(kernels) / (hbm_Bps * eff.membound_eff)
    return g * (2.0 + wgrad) + loss


def tp_comm_mb_s(model: ModelSpec, cluster: ClusterSpec, tokens: Array, layout: LayoutLike, layers: Array,
                 eff: Efficiency, act_bytes: float, gemm_fwd_s: Array = 0.0) -> Array:
    """TP/SP: 2 all-reduces (or AG+RS pairs) per block forward, 2 backward, 2 more if fully recomputed
    (Narayanan 2021 §3.2; Korthikanti 2022 §4.2.2); on the critical path (1 − tp_overlap). With
    ``layout.tp_overlap`` (async TP / --tp-comm-overlap) each pass hides ``tp_async_overlap`` of its collectives
    behind that pass's GEMMs, never more than the GEMM time (forward g, backward 2g: dgrad + wgrad)."""
    tp = np.asarray(layout.tp)
    bw, lat = comm.group_link(cluster, tp, 1)
    one = comm.all_reduce_s(tokens * model.hidden * act_bytes, tp, bw, lat, eff) * (1.0 - eff.tp_overlap)
    pass_comm = 2.0 * one
    on = np.asarray(layout.tp_overlap, dtype=bool) & (tp > 1)
    a = eff.tp_async_overlap
    fwd = pass_comm - np.where(on, np.minimum(a * pass_comm, gemm_fwd_s), 0.0)
    bwd = pass_comm - np.where(on, np.minimum(a * pass_comm, 2.0 * gemm_fwd_s), 0.0)
    return layers * (fwd + bwd + np.where(layout.recompute == "full", fwd, 0.0))


def ring_kv_width(model: ModelSpec, kernels: str) -> int:
    """Width (features per token, before TP) of the K and V that ring attention passes: PyTorch's context
    parallel wraps SDPA, and torchtitan/HF call SDPA after ``repeat_kv``, so eager/compiled runs pass the
    GQA-repeated K, V (q width); Megatron/TE and Meta's CP pass the kv_dim-wide GQA tensors (fused)."""
    return model.kv_dim if kernels == "fused" else model.heads * model.head_dim


# PyTorch ring attention (torch.distributed.tensor.experimental._attention, torch 2.6: the CP torchtitan runs;
# docs/timing-model.md §7.4): HBM bytes per local token of the ops around the flash kernels, per element of the
# local q width (Q) or of each of K and V (KV), e = activation bytes. Counted on the last CP rank (every ring step
# uses its full q), which the others wait for at the next collective [derived from the code].
def ring_overhead_bytes(cp: Array, q_width: Array, kv_width: Array, e: float) -> tuple[Array, Array]:
    """(forward, backward) HBM bytes per local token and block of PyTorch's ring attention beyond the flash kernels
    (zero at cp = 1). Forward: K, V made contiguous and concatenated for the all-gather (2e per element, once + once
    per step but the last); the first step's output upcast to fp32 (e + 4); each later step's online-softmax merge
    in fp32, ``out − σ(lse_b − lse)·(out − out_b)`` as four kernels (upcast e + 4, difference 12, product 8,
    subtraction 12); the final cast back (4 + e). Backward: fp32 zero buffers for dQ, dK, dV (4); K, V contiguous
    and concatenated per step (2e); dK, dV accumulated in fp32 (first step 4 + e + 4, later steps a half-chunk add
    plus the ``torch.cat`` of _partial_update: 13) and concatenated for the ring send (8) every step, the first
    send copying dK, dV out of ``zeros_like(key)`` buffers that keep the transposed K, V's strides (8); dQ
    accumulated (4 + e + 4) every step; the final casts of dQ, dK, dV (4 + e). Checked op by op against torch's own
    ring on CPU (tests/unit/model/test_ring_traffic.py: within 4%; the rest is the lse's own few bytes)."""
    cp = np.asarray(cp, dtype=float)
    kv = 2.0 * np.asarray(kv_width, dtype=float)  # K and V
    q = np.asarray(q_width, dtype=float)
    fwd = kv * 2.0 * e * cp + q * (2.0 * (e + 4.0) + (cp - 1.0) * (e + 36.0))
    bwd = (kv * (4.0 + 2.0 * e * cp + (8.0 + e) + 13.0 * (cp - 1.0) + 8.0 * cp + 8.0 + (4.0 + e))
           + q * (4.0 + (8.0 + e) * cp + (4.0 + e)))
    ring = cp > 1
    return np.where(ring, fwd, 0.0), np.where(ring, bwd, 0.0)


def ring_overhead_mb_s(model: ModelSpec, training: TrainingSpec, tokens: Array, layout: LayoutLike, layers: Array,
                       hbm_Bps: float, eff: Efficiency, act_bytes: float) -> Array:
    """PyTorch ring attention's merge/accumulate traffic per micro-batch (ring_overhead_bytes) over the stage's
    blocks, at ``membound_eff`` of HBM bandwidth; full recompute reruns the forward ring. Only the PyTorch kernel
    classes (eager/compiled): Transformer Engine fuses the output correction, Meta's all-gather CP has none."""
    if training.kernels == "fused":
        return 0.0
    tp, cp = np.asarray(layout.tp), np.asarray(layout.cp)
    on = (cp > 1) & (np.asarray(layout.cp_kind) == "ring")
    q = model.heads * model.head_dim / tp
    f, b = ring_overhead_bytes(cp, q, ring_kv_width(model, training.kernels) / tp, act_bytes)
    passes = f * (1.0 + np.where(np.asarray(layout.recompute) == "full", 1.0, 0.0)) + b
    return np.where(on, layers * tokens * passes / (hbm_Bps * eff.membound_eff), 0.0)


def cp_comm_mb_s(model: ModelSpec, cluster: ClusterSpec, tokens: Array, layout: LayoutLike, layers: Array,
                 attn_layer_s: Array, eff: Efficiency, act_bytes: float, kernels: str = "fused") -> Array:
    """CP: ring passes K,V (c−1 hops fwd, K,V and dK,dV bwd; Liu 2023 Ring Attention) overlapped with the
    block's attention; Ulysses does 4 all-to-alls fwd and 4 bwd on the critical path (Jacobs 2023).
    Eager/compiled (PyTorch CP) pass the GQA-repeated K, V (ring_kv_width)."""
    cp, tp = np.asarray(layout.cp), np.asarray(layout.tp)
    bw, lat = comm.group_link(cluster, cp, tp)
    kv_chunk = tokens * 2 * ring_kv_width(model, kernels) / tp * act_bytes
    ag = comm.all_gather_s(cp * kv_chunk, cp, bw, lat, eff)
    ring = np.maximum(0.0, 3.0 * ag - eff.cp_overlap * attn_layer_s)
    if kernels != "fused":
        # PyTorch pass-KV (torch 2.6 _AllGatherRotater): one all-gather of K, V per pass, launched with the first ring
        # step and awaited before the second, so it hides behind one step's attention only; the backward sends the
        # fp32 dK, dV one hop per step (overlapped with the next step; the last one exposed).
        step_f = attn_layer_s / (1.0 + ATTN_BWD_FACTOR) / np.maximum(cp, 1)
        step_b = step_f * ATTN_BWD_FACTOR
        hop = lat + kv_chunk / act_bytes * GRAD_REDUCE_BYTES / (bw * eff.comm_bw_eff)  # fp32 dK, dV
        fwd = np.maximum(0.0, ag - step_f)
        ring = (fwd * (1.0 + np.where(layout.recompute == "full", 1.0, 0.0)) + np.maximum(0.0, ag - step_b)
                + (cp - 1) * np.maximum(0.0, hop - step_b) + hop)
    a2a_bytes = tokens * (2 * model.hidden + 2 * model.kv_dim) / tp * act_bytes
    uly = (2.0 + np.where(layout.recompute == "full", 1.0, 0.0)) * comm.all_to_all_s(a2a_bytes, cp, bw, lat, eff)
    return layers * np.where(cp > 1, np.where(layout.cp_kind == "ring", ring, uly), 0.0)


def _fsdp_unit_comm_s(model: ModelSpec, cluster: ClusterSpec, training: TrainingSpec, layout: LayoutLike,
                      shard: Array, eff: Efficiency) -> tuple[Array, Array, Array, Array]:
    """(units on the rank's stage, all-gather, reduce-scatter, HSDP replica all-reduce) seconds per FSDP2 unit:
    one block's parameters over the shard group, its fp32 gradient shard over the replicas."""
    tp, pp = np.asarray(layout.tp), np.asarray(layout.pp)
    unit = model.n_params_per_layer / tp
    units = model.n_params / (tp * pp) / unit
    bw, lat = comm.group_link(cluster, shard, tp)
    pbytes = PARAM_COMM_BYTES[training.finetune]
    if training.fp8 == "tensorwise" and training.finetune == "full":
        # torchao enable_fsdp_float8_all_gather: the block linears' weights travel in FP8 (1 byte), the rest bf16
        mat = layer_matmul_params_per_rank(model, 1) / model.n_params_per_layer
        pbytes = 1.0 * mat + pbytes * (1.0 - mat)
    ag = comm.all_gather_s(unit * pbytes, shard, bw, lat, eff)
    rs = comm.reduce_scatter_s(unit * GRAD_REDUCE_BYTES * _trainable_frac(model, training), shard, bw, lat, eff)
    replicas = layout.dp * layout.cp // np.maximum(shard, 1)
    rbw, rlat = comm.group_link(cluster, replicas, tp * shard)
    ar = comm.all_reduce_s(unit * GRAD_REDUCE_BYTES * _trainable_frac(model, training) / shard, replicas, rbw, rlat, eff)
    return units, ag, rs, ar


def fsdp_pipelined(training: TrainingSpec, layout: LayoutLike) -> Array:
    """FSDP2 (ZeRO-3/HSDP) or ZeRO-1/2 on FSDP2 under PyTorch pipelining: the stage's parameters stay gathered
    for the whole step and its gradients are reduced once, after its last backward. torchtitan shards a PP stage
    with ``reshard_after_forward=False``; the schedule runs every backward with ``set_reshard_after_backward(False)``
    and ``set_requires_gradient_sync(False)``, then ``PipelineStage.perform_reduce_grad`` (torch 2.13; in 2024 the
    same post-backward inside ``backward_maybe_with_nosync``'s last backward) runs every unit's post-backward at
    once. ``memory.buffer_bytes`` holds the gathered stage accordingly. Megatron (fused kernels) is not this path."""
    return ((np.asarray(layout.pp) > 1) & (resolve_sp_impl(training) == "pytorch")
            & _isin(layout.sharding, ("zero1", "zero2") + FSDP2_SHARDINGS))


def fsdp_comm_mb_s(model: ModelSpec, cluster: ClusterSpec, training: TrainingSpec, layout: LayoutLike,
                   shard: Array, compute_mb: Array, eff: Efficiency, side_s: Array = 0.0,
                   pcie_s: tuple[Array, Array] = (0.0, 0.0)) -> Array:
    """ZeRO-3/FSDP per micro-batch: all-gather fwd + bwd, reduce-scatter grads (Rajbhandari 2019 §5: 3Ψ);
    prefetch hides fsdp_overlap of it behind compute; the first unit's all-gather is exposed. ``pcie_s``: CPU
    offload's (H2D, D2H) copies (``fsdp_offload_pcie_mb_s``), on copy engines beside NCCL, each hidden the same way;
    the first unit's H2D precedes its all-gather. Pipelined (``fsdp_pipelined``): ``fsdp_comm_pipelined_step_s``."""
    units, ag, rs, ar = _fsdp_unit_comm_s(model, cluster, training, layout, shard, eff)
    total = units * (2.0 * ag + rs + ar) + side_s  # side_s: work on the comm streams (FSDP2 RS copy-in)
    h2d, d2h = pcie_s
    total = np.maximum(total, np.maximum(h2d, d2h))
    exposed = ag + np.asarray(h2d) / (2.0 * units) + np.maximum(0.0, total - eff.fsdp_overlap * compute_mb)
    return np.where(_isin(layout.sharding, FSDP2_SHARDINGS), exposed, 0.0)


# torch 2.13's multi-stage pipelining runtime (ScheduleInterleaved1F1B lowered by ``_add_unshard_reshard``) keeps at
# most this many of a rank's virtual stages gathered; the rest it reshards and gathers again as the schedule cycles.
PP_MAX_ACTIVE_STAGES = 3


def pipelined_stage_passes(pp: Array, vpp: Array, m: Array) -> Array:
    """How many times per step a pipelined FSDP2 rank gathers its whole stage: 1 while its v virtual stages fit in
    ``PP_MAX_ACTIVE_STAGES`` (1F1B, interleaved v ≤ 3); beyond, the virtual-stage all-gathers of the busiest rank
    over v. Closed form of torch 2.13's lowering, R = max(1, m // p) rounds: 2v − 3 gathers in one round,
    2(v − 3)·R + 7 in more (``test_timing``: equal to torch's own count for p ≤ 8, v ≤ 8, up to 16 rounds)."""
    v = np.asarray(vpp, dtype=float)
    r = np.maximum(1, np.asarray(m) // np.asarray(pp))
    gathers = np.where(v <= PP_MAX_ACTIVE_STAGES, v, np.where(r == 1, 2.0 * v - 3.0, 2.0 * (v - 3.0) * r + 7.0))
    return gathers / v


def fsdp_comm_pipelined_step_s(model: ModelSpec, cluster: ClusterSpec, training: TrainingSpec, layout: LayoutLike,
                               shard: Array, fwd_mb: Array, eff: Efficiency, side_s: Array = 0.0,
                               pcie_s: tuple[Array, Array] = (0.0, 0.0), passes: Array = 1.0,
                               step_compute: Array = 0.0) -> Array:
    """FSDP2 ZeRO-3/HSDP under PyTorch pipelining (``fsdp_pipelined``), per step: each unit is all-gathered once,
    prefetched behind the first micro-batch's forward ``fwd_mb`` (the first unit's exposed), and reduce-scattered
    once (HSDP: then all-reduced over the replicas) after the stage's last backward, where no compute is left
    to hide it. With more virtual stages than the runtime keeps gathered the stage is gathered ``passes`` times
    (``pipelined_stage_passes``); the later gathers are prefetched behind the rest of the step's compute
    ``step_compute``. ``side_s``: the reduce-scatter copy-in; ``pcie_s``: CPU offload's (H2D, D2H) copies, H2D with
    every gather."""
    units, ag, rs, ar = _fsdp_unit_comm_s(model, cluster, training, layout, shard, eff)
    h2d, d2h = pcie_s
    gather = np.maximum(units * ag, h2d)
    again = (np.asarray(passes) - 1.0) * gather
    exposed = (ag + np.asarray(h2d) / units + np.maximum(0.0, gather - eff.fsdp_overlap * fwd_mb)
               + np.maximum(0.0, again - eff.fsdp_overlap * np.maximum(0.0, step_compute - fwd_mb))
               + np.maximum(units * (rs + ar) + side_s, d2h))
    return np.where(_isin(layout.sharding, FSDP2_SHARDINGS), exposed, 0.0)


def dp_comm_step_s(model: ModelSpec, cluster: ClusterSpec, training: TrainingSpec, layout: LayoutLike,
                   bwd_mb: Array, eff: Efficiency, m: Array = 1, fwd_mb: Array = 0.0, passes: Array = 1.0,
                   step_compute: Array = 0.0) -> Array:
    """DDP all-reduce (or ZeRO-1 reduce-scatter + param all-gather) once per step; buckets overlap the
    last micro-batch's backward except the last bucket (Li 2020, PyTorch DDP §3.2.3). ZeRO-2 keeps only a
    gradient shard, so it must reduce-scatter after *every* micro-batch's backward (Rajbhandari 2019 §5.2;
    DeepSpeed stage 2, FSDP2 reshard_after_forward=False): m reductions, each overlapping one backward.
    ZeRO-1/2 gather the updated parameters once per step; gathered per layer and prefetched (FSDP2
    reshard_after_forward=False, Megatron --overlap-param-gather), all but the first layer's gather hide behind
    the first micro-batch's forward ``fwd_mb`` (fsdp_overlap); a pipelined stage interleaved over more virtual
    stages than the runtime keeps gathered is gathered ``passes`` times (``pipelined_stage_passes``), the later
    ones behind the rest of the step's compute ``step_compute``."""
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
    # under PyTorch pipelining the FSDP2-run ZeRO-1/2 reduce once, after the stage's last backward (fsdp_pipelined)
    exposed = np.where(fsdp_pipelined(training, layout), reduce, exposed * np.where(layout.sharding == "zero2", m, 1))
    ag_exposed = (ag / np.maximum(1.0, model.layers / pp) + np.maximum(0.0, ag - eff.fsdp_overlap * fwd_mb)
                  + np.maximum(0.0, (np.asarray(passes) - 1.0) * ag
                               - eff.fsdp_overlap * np.maximum(0.0, step_compute - fwd_mb)))
    exposed = exposed + np.where(layout.sharding == "none", 0.0, ag_exposed)
    return np.where(_isin(layout.sharding, ("none", "zero1", "zero2")), exposed, 0.0)


def pp_p2p_mb_s(model: ModelSpec, cluster: ClusterSpec, tokens: Array, layout: LayoutLike, eff: Efficiency,
                act_bytes: float) -> Array:
    """Stage-to-stage activation send fwd + grad send bwd per micro-batch (×v interleaved; Narayanan 2021 §2.2)."""
    tp = np.asarray(layout.tp)
    nbytes = tokens * model.hidden * act_bytes / np.where(layout.sp, tp, 1)
    crosses = tp * layout.cp * layout.dp >= cluster.gpus_per_node
    one = comm.p2p_s(nbytes, crosses, cluster, eff)
    return np.where(layout.pp > 1, 2.0 * layout.vpp * one * (1.0 - eff.pp_p2p_overlap), 0.0)


def busiest_stage_layers(n_layers: int, pp: Array, vpp: Array) -> Array:
    """Layers on the busiest pipeline rank: ceil(L/(p·v))·v (torchtitan splits unevenly; Megatron needs p·v | L)."""
    return np.ceil(n_layers / (pp * vpp)) * vpp


def selective_redo_s(g: Array, a: Array, e: Array, kernels: str) -> Array:
    """Selective recompute per block: Megatron reruns the attention core (Korthikanti 2022 §5); torchtitan's
    op-level SAC (eager/compiled) saves every second matmul and SDPA, so reruns half the GEMMs and every
    elementwise op (torchtitan ``_apply_ac_to_transformer_block``, ``_save_list``)."""
    return a if kernels == "fused" else 0.5 * g + e


def fsdp_copy_mb_s(model: ModelSpec, training: TrainingSpec, layout: LayoutLike, hbm_Bps: float,
                   eff: Efficiency, stream: int = 0) -> Array:
    """FSDP2 copy-out (stream 0, compute) or reduce-scatter copy-in (stream 1) per micro-batch over the rank's
    stage at HBM speed (fsdp_copy_bytes_per_param)."""
    params = model.n_params / (np.asarray(layout.tp) * np.asarray(layout.pp))
    t = params * fsdp_copy_bytes_per_param(training)[stream] / (hbm_Bps * eff.membound_eff)
    return np.where(_isin(layout.sharding, FSDP2_SHARDINGS), t, 0.0)


def qlora_dequant_passes(recompute: Array, kernels: str) -> Array:
    """NF4 → bf16 dequantisations of each block weight per micro-batch: forward, backward (dgrad needs the
    weight again; bitsandbytes ``MatMul4Bit`` dequantises in both), plus the recompute: full reruns the forward,
    op-level SAC (eager/compiled) half the matmuls, Megatron-style selective none (selective_redo_s)."""
    sel = 0.0 if kernels == "fused" else 0.5
    return 2.0 + np.where(recompute == "full", 1.0, np.where(recompute == "selective", sel, 0.0))


def qlora_dequant_mb_s(model: ModelSpec, training: TrainingSpec, layout: LayoutLike, layers: Array,
                       hbm_Bps: float, eff: Efficiency, act_bytes: float) -> Array:
    """QLoRA's dequantisation per micro-batch, memory-bound: each pass reads the NF4 block weights with their
    double-quantised constants (4.127 bit, Dettmers 2023 §2) and writes them in the compute dtype (§8)."""
    if training.finetune != "qlora":
        return 0.0
    params = layers * layer_matmul_params_per_rank(model, np.asarray(layout.tp))
    passes = qlora_dequant_passes(np.asarray(layout.recompute), training.kernels)
    return passes * params * (NF4_BYTES_PER_PARAM + act_bytes) / (hbm_Bps * eff.membound_eff)


# HBM passes over a LoRA target's output width per token in its epilogue: PEFT's ``result + lora_B(lora_A(x)) *
# scaling`` runs the scale (read 1, write 1) and the add (read 2, write 1) as separate eager kernels; compiled or
# fused, one kernel reads the two outputs and writes one [derived: peft.tuners.lora.layer.Linear.forward].
LORA_EPILOGUE_PASSES = {"eager": 5.0, "compiled": 3.0, "fused": 0.0}
# Backward passes (over the output width, over the input width) per token: the scale's backward (2 out, eager), B's
# dgrad and wgrad reading the output gradient (2 out), A's dgrad writing the input gradient (1 in), its sum with the
# base layer's input gradient (read 2, write 1 in), A's wgrad re-reading x (1 in); compiled, the scale and the sum
# fuse into the neighbouring kernels' epilogues.
LORA_BWD_PASSES = {"eager": (4.0, 5.0), "compiled": (2.0, 3.0), "fused": (0.0, 0.0)}
# The fused class (Megatron/NeMo) is charged its adapters' FLOPs only: NeMo 24.07's LoRA rows already run ~17% faster
# than the model predicts without any adapter cost (docs/timing-model.md §8), so their bytes are left uncharged
# until a measurement says what NeMo's adapters cost.


def lora_adapter_s(model: ModelSpec, training: TrainingSpec, tokens: Array, tp: Array, peak: float,
                   hbm_Bps: float, eff: Efficiency, act_bytes: float) -> tuple[Array, Array]:
    """(forward, backward) of one block's LoRA adapters on one TP rank. Forward, per target: x·A (tokens × in × r)
    and (x·A)·B (tokens × r × out), each at its roofline — the FLOPs at the shape-aware GEMM efficiency (r the small
    dimension) or the bytes (A re-reads the target's input, B writes its output) at the memory-bound rate, whichever
    is slower — then the epilogue's passes over the output (LORA_EPILOGUE_PASSES). Backward: the dgrad and wgrad
    GEMMs' FLOPs (2 × the forward's) or LORA_BWD_PASSES' bytes, whichever is slower. Tiny at r = 16 in FLOPs, not in
    bytes. Column-parallel targets split their output over TP, row-parallel ones their input."""
    if training.finetune == "full":
        return 0.0, 0.0
    r = float(training.lora_rank)
    tp = np.asarray(tp, dtype=float)
    out_split = {"q": tp, "k": np.minimum(tp, model.kv_heads), "v": np.minimum(tp, model.kv_heads), "gate": tp,
                 "up": tp}  # column-parallel targets split their output; o and down (row-parallel) their input
    shapes = {t: (i if t in out_split else i / tp, o / out_split[t] if t in out_split else o)
              for t, (i, o) in flops.lora_dims(model).items()}
    h = model.hidden
    targets = [t for t in training.lora_targets if t != "gate" or model.mlp == "swiglu"]
    adapters = [shapes[t] for t in targets]
    if training.kernels == "fused":  # Megatron/NeMo fuse QKV and gate·up: one adapter each (NeMo's LoRA docs)
        adapters = [shapes[t] for t in targets if t in ("o", "down")]
        for group in (("q", "k", "v"), ("gate", "up")):
            if any(t in targets for t in group):
                adapters.append((h, sum(shapes[t][1] for t in group if t in targets)))
    bw = hbm_Bps * eff.membound_eff
    p_out, p_in = LORA_BWD_PASSES[training.kernels]
    io = 0.0 if training.kernels == "fused" else 1.0  # the fused class: FLOPs only (LORA_BWD_PASSES' note)
    fwd = bwd = 0.0 * tp
    for i, o in adapters:
        fa, fb = _gemm_s(tokens, r, i, peak, eff), _gemm_s(tokens, o, r, peak, eff)
        a = np.maximum(fa, io * tokens * (i + r) * act_bytes / bw)
        b = np.maximum(fb, io * tokens * (r + o) * act_bytes / bw)
        fwd = fwd + a + b + LORA_EPILOGUE_PASSES[training.kernels] * tokens * o * act_bytes / bw
        bwd = bwd + np.maximum(2.0 * (fa + fb), tokens * (p_out * o + p_in * i) * act_bytes / bw)
    return fwd, bwd


# torch.autocast over fp32 parameters (``TrainingSpec.bf16_via='autocast'``, the proxy harness on one rank), bytes per
# weight: the forward cast fp32 → bf16 (read 4, write 2), redone by recompute; the cast's backward turns the bf16 weight
# gradient into fp32 (read 2, write 4); AccumulateGrad adds it into ``.grad`` from the second micro-batch of a step on
# (read 4 + 4, write 4; the first micro-batch's gradient is stolen, no copy) (docs/timing-model.md §7.10).
AUTOCAST_CAST_BYTES = 6.0
AUTOCAST_ACCUM_BYTES = 12.0


def autocast_cast_s(model: ModelSpec, training: TrainingSpec, layout: LayoutLike, layers: Array, hbm_Bps: float,
                    eff: Efficiency, measured: bool = False) -> tuple[Array, Array]:
    """(per micro-batch, per step) seconds of autocast's weight casts on the rank's stage: every block linear and the LM
    head, each micro-batch (``AUTOCAST_CAST_BYTES``, ``AUTOCAST_ACCUM_BYTES``). Zero unless ``training.autocast``.
    Frozen weights (LoRA) are cast in forward only. Each is one weight-sized kernel: with ``measured`` (Hopper) it
    streams at the rate measured for that kernel (``stream_frac``: the forward cast, its backward, the accumulate);
    otherwise at ``membound_eff``, the published-run fit's rate for elementwise work."""
    if not training.autocast:
        return 0.0, 0.0
    tp = np.asarray(layout.tp, dtype=float)
    block = layers * layer_matmul_params_per_rank(model, tp)
    head = np.where(np.asarray(layout.pp) == 1, model.vocab * model.hidden / tp, 0.0)  # on the last stage
    redo = np.where(np.asarray(layout.recompute) == "none", 0.0, 1.0)
    train = 1.0 if training.finetune == "full" else 0.0
    if measured:
        down, up, add = (hbm_Bps * stream_frac(k) for k in ("cast_fp32_to_bf16", "cast_bf16_to_fp32", "add_fp32_inplace"))
    else:
        down = up = add = hbm_Bps * eff.membound_eff
    cast = AUTOCAST_CAST_BYTES
    per_mb = (block + head) * cast * (1.0 / down + train / up) + block * cast * redo / down
    m = np.asarray(grad_accum(training, layout))
    per_step = (m - 1) * (block + head) * AUTOCAST_ACCUM_BYTES * train / add
    return per_mb, per_step


def bubble_s(pp: Array, vpp: Array, m: Array, per_mb_s: Array) -> Array:
    """Pipeline bubble: (p−1)/(v·m) of the ideal m·τ (Narayanan 2021 §2.2.1–2.2.2)."""
    return (pp - 1) / (vpp * m) * (m * per_mb_s)


# What one AdamW step must move per fp32 parameter: p, g, m, v read (16 B), p, m, v written (12 B); the kernels
# benchmarks/bench_hbm_stream.py times (adamw_fused, adamw_foreach) move exactly these. The rest of
# Efficiency.optimizer_bytes_per_param_traffic is the bf16 copy of the updated weights, a separate cast.
ADAMW_STEP_BYTES = 28.0
OPTIMIZER_STREAM = {"fused": "adamw_fused", "foreach": "adamw_foreach"}  # training.optimizer_impl → its timing


def optimizer_s(local_params: Array, hbm_Bps: float, eff: Efficiency, impl: str = "fused",
                measured: bool = False) -> Array:
    """Optimizer step, memory-bound over the local shard: params · bytes touched / HBM rate. With ``measured``
    (Hopper) the AdamW update (``ADAMW_STEP_BYTES``) streams at the rate measured for ``impl``'s kernels
    (``stream_frac``: fused or foreach, docs/timing-model.md §7.14) and the bf16 weight copy at ``membound_eff``;
    otherwise all of ``optimizer_bytes_per_param_traffic`` at ``membound_eff``, the published-run fit's rate."""
    rest = hbm_Bps * eff.membound_eff
    if not measured:
        return local_params * eff.optimizer_bytes_per_param_traffic / rest
    copy = max(0.0, eff.optimizer_bytes_per_param_traffic - ADAMW_STEP_BYTES)
    return local_params * (ADAMW_STEP_BYTES / (hbm_Bps * stream_frac(OPTIMIZER_STREAM[impl])) + copy / rest)


# FSDP2's offload accumulates each micro-batch after the first into the host gradient (torch ``foreach_reduce``:
# ``grad += new_sharded_grad`` on CPU tensors, in the post-backward hook): two reads and one write of the gradient's
# bytes, on the CPU thread that launches the backward, so nothing hides it.
HOST_ADD_BYTES_PER_GRAD_BYTE = 3.0


def host_add_s(grad_bytes: Array, eff: Efficiency) -> Array:
    """Seconds of one CPU ``+=`` over ``grad_bytes`` of host gradient. Its rate is CPU Adam's byte rate,
    ``cpu_optimizer_params_per_s`` × ``ADAMW_STEP_BYTES`` (28 GB/s per GPU's shard by default): both stream the same
    host memory [I: the add's own rate was never measured]."""
    return HOST_ADD_BYTES_PER_GRAD_BYTE * np.asarray(grad_bytes, dtype=float) / (
        eff.cpu_optimizer_params_per_s * ADAMW_STEP_BYTES)


def offload_s(local_params: Array, cluster: ClusterSpec, eff: Efficiency, fsdp: Array = False,
              sync_d2h_s: Array = 0.0) -> Array:
    """CPU optimizer once per step. ZeRO-Offload (ZeRO-1/2, optimizer-only): fp32 grads D2H + bf16 params H2D over
    PCIe, plus CPU Adam (Ren 2021, ZeRO-Offload §4). FSDP2's ``CPUOffloadPolicy`` (ZeRO-3/HSDP, ``fsdp``) moves its
    traffic per micro-batch instead (``fsdp_offload_pcie_mb_s``): here CPU Adam plus ``sync_d2h_s``, what the
    accumulating micro-batches do synchronously (each one's gradient copy and its CPU add, ``host_add_s``)."""
    pcie = np.where(fsdp, sync_d2h_s, local_params * (GRAD_REDUCE_BYTES + 2.0) / cluster.host_to_device_Bps)
    return pcie + local_params / eff.cpu_optimizer_params_per_s


def fsdp_offload_pcie_mb_s(model: ModelSpec, training: TrainingSpec, layout: LayoutLike,
                           cluster: ClusterSpec) -> tuple[Array, Array]:
    """(H2D, D2H) seconds per micro-batch of FSDP2's ``CPUOffloadPolicy`` (ZeRO-3/HSDP with ``offload=cpu``; 0
    elsewhere), the last pipeline stage's rank. Every all-gather first copies the rank's sharded parameters to the
    GPU in their stored dtype (fp32 master; a LoRA/QLoRA frozen base as bf16/NF4), forward and backward: twice per
    micro-batch (torch ``FSDPParam.all_gather_inputs``, on the all-gather copy-in stream). Each micro-batch's
    reduce-scattered fp32 gradient shard is copied to the host (``foreach_reduce``). The bytes are the states
    ``memory.model_states`` keeps on the host; PCIe is full duplex, each direction at ``host_to_device_Bps``."""
    on = (np.asarray(layout.offload) == "cpu") & _isin(layout.sharding, FSDP2_SHARDINGS)
    if np.ndim(on) == 0 and not on:  # one layout that keeps its states on the GPU: no host states to size
        return np.zeros(()), np.zeros(())
    host = model_states(model, training, layout, cluster, "last", on_device=False)
    bw = cluster.host_to_device_Bps
    return (np.where(on, 2.0 * np.asarray(host["weights"], dtype=float) / bw, 0.0),
            np.where(on, np.asarray(host["gradients"], dtype=float) / bw, 0.0))


def _trainable_frac_full(training: TrainingSpec) -> float:
    """1 when the base weights train (their gradients are reduce-scattered), 0 for LoRA/QLoRA (adapters only)."""
    return 1.0 if training.finetune == "full" else 0.0


def _trainable_frac(model: ModelSpec, training: TrainingSpec) -> float:
    """Trainable / total parameters: 1 for full fine-tuning; LoRA adds r·(in+out) per target (Hu 2021)."""
    if training.finetune == "full":
        return 1.0
    return flops.adapter_params(model, training.lora_rank, training.lora_targets) / model.n_params


def step_time(model: ModelSpec, cluster: ClusterSpec, training: TrainingSpec, layout: LayoutLike,
              eff: Efficiency | None = None) -> dict[str, Array]:
    """Seconds per optimizer step and its breakdown, tokens/s, MFU and HFU (keys: TIMING_KEYS)."""
    eff = eff or Efficiency.for_gpu(cluster.gpu)
    gpu = cluster.gpu
    peak, hbm = gpu.peak_bf16_flops, gpu.hbm_bw_Bps
    eff = class_efficiency(eff, training.kernels)
    if training.attn_kernel != "fa2":
        eff = eff.replace(attn_eff=min(1.0, eff.attn_eff * attention_kernel_rel(training.attn_kernel)))
    act = 2.0 if training.half else 4.0
    s = training.seq_len
    tp, pp, cp = np.asarray(layout.tp), np.asarray(layout.pp), np.asarray(layout.cp)
    sp, vpp = np.asarray(layout.sp, dtype=bool), np.asarray(layout.vpp)
    rc = np.asarray(layout.recompute)
    m = np.asarray(grad_accum(training, layout))
    tokens = layout.micro_batch * s / cp
    layers = busiest_stage_layers(model.layers, pp, vpp)
    wgrad = 1.0 if training.finetune == "full" else 0.0
    kernels = training.kernels

    if training.fp8:  # the block linears in FP8 at 2 × the BF16 peak; attention, norms and the output stay bf16
        check_precision(cluster, training)
        fp8_eff = eff.replace(gemm_eff_max=getattr(eff, f"fp8_gemm_eff_{training.fp8}"))
        g = layer_gemm_fwd_s(model, tokens, tp, FP8_PEAK_FACTOR * peak, fp8_eff, kernels)
        if te_fp8(training):
            cf, cb, cw = te_fp8_cast_bytes(model, training, tokens, tp)
            fp8_weight_step = layers * cw / (hbm * eff.membound_eff)
        else:
            fsdp_fp8_gather = (training.fp8 == "tensorwise") & _isin(layout.sharding, FSDP2_SHARDINGS)
            cf, cb = fp8_cast_bytes_mb(model, training, tokens, tp, np.where(fsdp_fp8_gather, 0.0, 1.0))
            fp8_weight_step = 0.0
        cast_f, cast_b = cf / (hbm * eff.membound_eff), cb / (hbm * eff.membound_eff)
    else:
        g = layer_gemm_fwd_s(model, tokens, tp, peak, eff, kernels)
        cast_f = cast_b = fp8_weight_step = 0.0
    e = layer_membound_fwd_s(model, tokens, tp, sp, hbm, eff, act, kernels, training.block_impl, training.autocast)
    if training.attn_impl == "math":
        a, a_bwd = attn_math_fwd_s(model, tokens, s, tp, peak, hbm, eff, act)
    else:
        a = attn_fwd_s(model, tokens, s, tp, peak, eff, s / attn_keys_per_call(s, layout))
        a_bwd = a * ATTN_BWD_FACTOR
    k0 = KERNELS_PER_BLOCK[kernels] * eff.kernel_overhead_s
    lora_f, lora_b = lora_adapter_s(model, training, tokens, tp, peak, hbm, eff, act)
    fwd = g + a + e + k0 + cast_f + lora_f
    bwd = g * (1.0 + wgrad) + a_bwd + MEMBOUND_BWD_FACTOR * e + KERNEL_BWD_FACTOR * k0 + cast_b + lora_b
    redo = np.where(rc == "full", fwd, np.where(rc == "selective", selective_redo_s(g, a, e, kernels), 0.0))
    shard = np.asarray(shard_degree(layout, cluster))
    # pipelined FSDP2 (fsdp_pipelined): the stage gathered `passes` times per step (once unless interleaved over more
    # virtual stages than the runtime keeps gathered), one copy-out each (half the per-micro-batch pair)
    piped = fsdp_pipelined(training, layout)
    passes = np.where(piped, pipelined_stage_passes(pp, vpp, m), 0.0)
    copy_all = fsdp_copy_mb_s(model, training, layout, hbm, eff)
    copy, copy_once = np.where(piped, 0.0, copy_all), 0.5 * copy_all * passes
    dequant = qlora_dequant_mb_s(model, training, layout, layers, hbm, eff, act)
    ring = ring_overhead_mb_s(model, training, tokens, layout, layers, hbm, eff, act)
    cast_mb, accum_step = autocast_cast_s(model, training, layout, layers, hbm, eff, measured=gpu.generation == "h100")
    compute_mb = (layers * (fwd + bwd + redo) + logits_s(model, tokens, tp, peak, hbm, eff, wgrad, kernels) + copy
                  + dequant + ring + cast_mb)

    tp_mb = tp_comm_mb_s(model, cluster, tokens, layout, layers, eff, act, g)
    cp_mb = cp_comm_mb_s(model, cluster, tokens, layout, layers, a + a_bwd, eff, act, kernels)
    rs_copy = fsdp_copy_mb_s(model, training, layout, hbm, eff, stream=1)
    pcie = fsdp_offload_pcie_mb_s(model, training, layout, cluster)
    fsdp_mb = np.where(piped, 0.0, fsdp_comm_mb_s(model, cluster, training, layout, shard, compute_mb, eff, rs_copy, pcie))
    fsdp_once = np.where(piped, fsdp_comm_pipelined_step_s(model, cluster, training, layout, shard, layers * fwd, eff,
                                                           rs_copy, (0.5 * np.asarray(pcie[0]), pcie[1]), passes,
                                                           m * compute_mb), 0.0)
    p2p_mb = pp_p2p_mb_s(model, cluster, tokens, layout, eff, act)
    dp = dp_comm_step_s(model, cluster, training, layout, layers * bwd, eff, m, layers * fwd, np.maximum(passes, 1.0),
                        m * compute_mb)

    per_mb = compute_mb + tp_mb + cp_mb
    bubble = bubble_s(pp, vpp, m, per_mb)
    stage_params = model.n_params / (tp * pp)
    local = stage_params * _trainable_frac(model, training) / np.where(layout.sharding == "none", 1, shard)
    cpu = np.asarray(layout.offload) == "cpu"
    opt = np.where(cpu, 0.0, optimizer_s(local, hbm, eff, training.optimizer_impl,
                                         measured=gpu.generation == "h100" and training.optimizer == "adamw"))
    # FSDP2 offload: micro-batches after the first accumulate into a host gradient, so their D2H copies block
    # (torch foreach_reduce: non_blocking only without a gradient to add to) and the add runs on the CPU thread
    # (host_add_s; pcie[1] × the PCIe rate is the gradient's bytes). Under pipelining FSDP2 reduces once per step
    # (schedules' perform_reduce_grad): nothing to accumulate.
    fsdp2 = _isin(layout.sharding, FSDP2_SHARDINGS)
    sync_d2h = np.where(pp > 1, 0.0, (m - 1) * (pcie[1] + host_add_s(pcie[1] * cluster.host_to_device_Bps, eff)))
    off = np.where(cpu, offload_s(local, cluster, eff, fsdp2, sync_d2h), 0.0)

    compute = m * compute_mb + accum_step + fp8_weight_step + copy_once
    exposed = m * (tp_mb + cp_mb + fsdp_mb + p2p_mb) + fsdp_once + dp
    step = compute + exposed + bubble + opt + off
    tok_s = training.tokens_per_step / step
    n = cluster.n_gpus
    f_tok = flops.train_flops_per_token(model, training)
    mfu = f_tok * tok_s / (n * peak)
    hw = {k: f_tok + flops.recompute_flops_per_token(model, s, k) for k in ("none", "selective", "full")}
    hfu = np.where(rc == "full", hw["full"], np.where(rc == "selective", hw["selective"], hw["none"])) * tok_s / (n * peak)
    out = {"compute_s": compute, "tp_comm_s": m * tp_mb, "cp_comm_s": m * cp_mb, "fsdp_comm_s": m * fsdp_mb + fsdp_once,
           "dp_comm_s": dp, "pp_p2p_s": m * p2p_mb, "comm_exposed_s": exposed, "bubble_s": bubble,
           "optimizer_s": opt, "offload_s": off, "step_time_s": step, "tokens_per_s": tok_s,
           "tokens_per_s_per_gpu": tok_s / n, "mfu": mfu, "hfu": hfu,
           "recompute_s": m * layers * redo, "fsdp_copy_s": m * copy + copy_once, "ring_merge_s": m * ring, "dequant_s": m * dequant}
    if isinstance(layout, Layout):
        return {k: float(np.asarray(v)) for k, v in out.items()}
    return {k: np.broadcast_to(np.asarray(v, dtype=float), (len(layout),)).copy() for k, v in out.items()}
