"""`Efficiency`: the single frozen object of free parameters that calibration fits.

Every other analytic term is a formula; these are the numbers a formula cannot know (how close kernels
get to peak, how much communication hides behind compute, what the runtime costs in memory). Defaults
are documented with their source; ``[I]`` marks an informed assumption, later replaced by calibration;
``[F]`` marks a value fitted on the open published set (docs/timing-model.md §7).
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, fields, replace
from functools import cache
from importlib import resources
from typing import Any, ClassVar

from trainplan.model.base import ConfigError, GiB

__all__ = ["Efficiency", "generation_fits", "FITS_FILE"]

FITS_FILE = "efficiency_fits.json"


@cache
def generation_fits() -> dict[str, Any]:
    """``{generation: {"values": {field: value}, "stderr": {...}, "fitted_on": [...], ...}}`` from package data."""
    f = resources.files("trainplan").joinpath("data", FITS_FILE)
    if not f.is_file():
        return {}
    return json.loads(f.read_text(encoding="utf-8"))


@dataclass(frozen=True, kw_only=True)
class Efficiency:
    """Fractions of peak and overlap factors; SI units where a unit applies."""

    # The class defaults are the A100 generation's fit (``python -m trainplan.published.fit --fit``: scipy least squares
    # on log errors, each table weighted equally, within validate.FIT_BOUNDS, on the 32 in-scope throughput rows of
    # Narayanan 2021 T1 and T2 (PTD-P rows), Korthikanti 2022 T3/5 and torchtitan docs/performance.md 64×A100),
    # rounded; comm_bw_eff, which the A100 fit also fits, keeps the H100 value below. Each GPU generation has its own
    # fit in trainplan/data/efficiency_fits.json (values, standard errors, the tables it was fitted on,
    # leave-one-table-out errors); ``Efficiency.for_gpu(gpu)`` returns it, and that is what the planner uses.
    # half_dim is weakly identified on A100 (± 79 around 9.9).
    gemm_eff_max: float = 0.754  # [F]
    # Shape-aware GEMM efficiency = gemm_eff_max · d/(d + half) with d the smallest GEMM dimension; it bites
    # on the head-dim (96–160) batched GEMMs of materialised attention.
    gemm_eff_half_dim: float = 9.9  # [F]
    # Flash attention fwd+bwd fraction of peak; inside FA2's 34% (H100) – 73% (A100) (Dao 2023 §4.1).
    attn_eff: float = 0.636  # [F]
    # Flash attention efficiency rises with the work of one query row against the keys of one call, w = keys × head_dim
    # (seq_len/cp × head_dim): attn_eff · w/(w + attn_eff_half_work), the long-sequence ceiling being attn_eff (the
    # fixed cost of each query tile — loading Q, the last rescale, writing O — and the half-masked diagonal tiles of
    # causal attention amortised over the key loop; docs/timing-model.md §7.5). 0 = no shape term (A100: its flash rows
    # are all at 8k) [F on H100].
    attn_eff_half_work: float = 0.0
    # Fraction of HBM bandwidth reached by elementwise/norm/loss kernels (eager ops: small, many, strided).
    membound_eff: float = 0.558  # [F]
    # GPU time lost per kernel (launch gap, ramp-up and the last partial wave) [I: ~3 µs; the open tables, all
    # ≥ 1.7B parameters, cannot identify it: the H100 fit moves by < 0.1% between 0 and 8 µs]. Multiplied by the
    # kernels one block launches per pass, which the kernel class sets (timing.KERNELS_PER_BLOCK: eager 40 ≫
    # compiled 15 > fused 10): it is what makes small models launch-bound, and most so in eager PyTorch.
    kernel_overhead_s: float = 3e-6
    # The framework class as an explicit factor (timing.class_efficiency): PyTorch (eager / torch.compile) GEMMs,
    # BF16 and FP8, reach ``torch_gemm_rel`` of the fused stack's (Megatron / Transformer Engine: cuBLASLt with
    # fused epilogues) [F on H100, where every open PyTorch row ran on torchtitan's 500 W parts, so it is fitted
    # with their peak fixed at the middle of the stated bracket (validate.GEN_FIT); 1 on A100]. A separate factor
    # for the fused stack's attention (cuDNN vs FA2) fitted to 1.02: not kept.
    torch_gemm_rel: float = 1.0
    # FP8 GEMMs of the block linears (training.precision fp8-*), as a fraction of the dense FP8 peak (2 × BF16 on
    # Hopper), the same shape factor applied: tensorwise (cuBLAS scaled GEMM) and rowwise (CUTLASS rowwise-scaled
    # GEMM) recipes of torchao. Fitted on torchtitan's float8 rows (H100 generation fit: 0.79 / 0.35 in
    # efficiency_fits.json, which for_gpu returns); NeMo's FP8 tables are held out to check them. These class values
    # are placeholders for a GPU with no fit (FP8 needs Hopper, which has one) [F].
    fp8_gemm_eff_tensorwise: float = 0.55
    fp8_gemm_eff_rowwise: float = 0.40
    # Fraction of nccl-tests bus bandwidth reached inside a training step (message sizes, contention) [I]. Fitted on
    # A100 (the Megatron TP rows, all-reduces with no overlap, identify it: 1.0 ± 0.17, at its bound — the stated
    # A100 bus bandwidths are reached); this class value is H100's, where every open TP row overlaps its
    # collectives and the two cannot be separated (published.fit.GEN_FIT).
    comm_bw_eff: float = 0.80
    # Fraction of a strategy's communication that can hide behind compute (FSDP prefetch; DDP buckets) [I].
    fsdp_overlap: float = 0.90
    ddp_overlap: float = 0.90
    tp_overlap: float = 0.0  # TP/SP collectives sit on the critical path (no async TP)
    # With ``Layout.tp_overlap`` (torchtitan async TP, Megatron --tp-comm-overlap): the fraction of each TP
    # collective that the decomposed AG→GEMM / GEMM→RS pipeline hides behind its GEMM, capped by that GEMM's
    # time (timing.tp_comm_mb_s). Fitted on the vanilla/async pairs of torchtitan_asynctp_H100_202506 (the H100 fit
    # in efficiency_fits.json, 0.41, is what for_gpu returns; this class value is the placeholder without a fit) [F].
    tp_async_overlap: float = 0.7
    # Ring attention overlaps the K/V pass with the block's attention (Megatron/TE p2p ring, kernels=fused). PyTorch's
    # pass-KV CP (eager/compiled) is timed from its code instead: the all-gather hides behind one ring step only
    # (timing.cp_comm_mb_s). Not identifiable on the open rows (every CP row's exchange is hidden) [I].
    cp_overlap: float = 0.90
    pp_p2p_overlap: float = 0.50  # Megatron overlaps part of the stage-to-stage sends [I]
    # CUDA context + NCCL buffers + cuBLAS workspaces per GPU [I: ~1 GiB context, 1–2 GiB NCCL].
    runtime_overhead_bytes: float = 2.5 * GiB
    # Caching-allocator reserved/allocated excess, as a fraction of allocated bytes [I].
    alloc_frag_frac: float = 0.10
    # AdamW step in fp32 reads p, g, m, v (16 B) and writes p, m, v (12 B) + the bf16 copy (2 B) per param.
    optimizer_bytes_per_param_traffic: float = 30.0
    # CPU Adam throughput per GPU's shard when the optimizer is offloaded (ZeRO-Offload, Ren 2021 §5) [I].
    cpu_optimizer_params_per_s: float = 1.0e9
    source: str = "defaults"

    FITTABLE: ClassVar[tuple[str, ...]] = (
        "gemm_eff_max", "gemm_eff_half_dim", "attn_eff", "membound_eff", "kernel_overhead_s", "comm_bw_eff",
        "fsdp_overlap", "ddp_overlap", "runtime_overhead_bytes", "alloc_frag_frac",
    )
    _NONNEGATIVE: ClassVar[tuple[str, ...]] = ("runtime_overhead_bytes", "kernel_overhead_s", "attn_eff_half_work")
    _FRACTIONS: ClassVar[tuple[str, ...]] = (
        "gemm_eff_max", "attn_eff", "membound_eff", "comm_bw_eff", "fsdp_overlap", "ddp_overlap",
        "tp_overlap", "tp_async_overlap", "cp_overlap", "pp_p2p_overlap", "alloc_frag_frac",
        "fp8_gemm_eff_tensorwise", "fp8_gemm_eff_rowwise",
    )

    def __post_init__(self) -> None:
        for f in fields(self):
            v = getattr(self, f.name)
            if f.name == "source":
                if not isinstance(v, str):
                    raise ConfigError("efficiency.source", v, "must be a string")
                continue
            if isinstance(v, bool) or not isinstance(v, int | float):
                raise ConfigError("efficiency." + f.name, v, "must be a number")
            if f.name in self._FRACTIONS:
                lo_ok = v >= 0 if "overlap" in f.name or f.name == "alloc_frag_frac" else v > 0
                if not (lo_ok and v <= 1):
                    raise ConfigError("efficiency." + f.name, v, "must be a fraction in (0, 1]"
                                      if not ("overlap" in f.name or f.name == "alloc_frag_frac")
                                      else "must be a fraction in [0, 1]")
            elif f.name == "torch_gemm_rel":
                if not 0 < v <= 1:
                    raise ConfigError("efficiency." + f.name, v, "must be a fraction in (0, 1]")
            elif f.name in self._NONNEGATIVE:
                if v < 0:
                    raise ConfigError("efficiency." + f.name, v, "must be >= 0")
            elif not v > 0:
                raise ConfigError("efficiency." + f.name, v, "must be a positive number")

    @classmethod
    def for_gpu(cls, gpu: Any, **overrides: Any) -> Efficiency:
        """The Efficiency fitted on the published runs of ``gpu``'s generation (``GPUSpec.generation``), with
        ``overrides`` on top. The fitted values, their standard errors and the rows they were fitted on are in
        ``trainplan/data/efficiency_fits.json`` (``python -m trainplan.published.fit --fit`` writes it)."""
        gen = getattr(gpu, "generation", gpu)
        fit = generation_fits().get(str(gen))
        base = cls() if fit is None else cls(**fit["values"], source=f"fit:{gen}")
        return base.replace(**overrides) if overrides else base

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, d: dict[str, Any] | None) -> Efficiency:
        """An Efficiency from a dict of overrides (missing keys keep their defaults)."""
        d = dict(d or {})
        known = {f.name for f in fields(cls)}
        for k in d:
            if k not in known:
                raise ConfigError("efficiency." + str(k), d[k], "unknown key; valid: " + ", ".join(sorted(known)))
        return cls(**d)

    def replace(self, **kw: Any) -> Efficiency:
        for k in kw:
            if k not in {f.name for f in fields(self)}:
                raise ConfigError("efficiency." + k, kw[k], "unknown key; valid: " + ", ".join(
                    sorted(f.name for f in fields(self))))
        return replace(self, **kw)
