"""Predicted vs published: the analytic model against Megatron, Korthikanti and torchtitan tables.

One :class:`Efficiency` for every row (no per-row tuning). Each published table is read from the package
data (``trainplan/data/``, citations in its SOURCES.md) and turned into (model, cluster, training, layout)
with the facts the source states; what a source does not state is a named assumption below.
Rows the model cannot speak to (float8, async TP) are shown but left out of the MAPE; torch.compile rows
are modelled with ``kernels="compiled"`` (docs/timing-model.md).
"""

from __future__ import annotations

from dataclasses import replace
from importlib import resources
from typing import Any

import numpy as np
import pandas as pd

from trainplan.model import flops, memory, timing
from trainplan.model.arch import ModelSpec, resolve_model
from trainplan.model.base import ConfigError, GiB
from trainplan.model.efficiency import Efficiency, generation_fits
from trainplan.model.hardware import ClusterSpec, GPUSpec, resolve_gpu
from trainplan.model.layout import Layout, layout_problems
from trainplan.model.training import TrainingSpec

__all__ = ["validate_all", "family_bias", "fp8_speedups", "comparable_runs", "interval_coverage", "interval_bounds", "error_pool", "predictive_error_draws", "heldout_rows", "fit_generation", "write_fits", "GEN_FIT", "mape_table", "load_table", "fit_defaults", "TABLES", "FIT_TABLES", "FIT_PARAMS"]

TABLES = ("megatron2021_t1", "korthikanti2022_t3_5", "torchtitan_a100", "torchtitan_h100", "torchtitan_asynctp_h100",
          "megatron2024_h100", "llama3_405b_h100", "nemo2407_h100")
# The GPU generation each table ran on: its rows are predicted with (and fit) that generation's Efficiency.
TABLE_GENERATION = {"megatron2021_t1": "a100", "korthikanti2022_t3_5": "a100", "torchtitan_a100": "a100",
                    "torchtitan_h100": "h100", "torchtitan_asynctp_h100": "h100", "megatron2024_h100": "h100",
                    "llama3_405b_h100": "h100", "nemo2407_h100": "h100"}

# --- clusters the sources ran on --------------------------------------------------------------------------
# Selene (Narayanan 2021 §5.1): DGX A100 nodes, NVLink3/NVSwitch, 8 × 200 Gb/s HDR InfiniBand per node.
# Bus bandwidths [I]: 8×A100 NVLink3 ring ≈ 230 GB/s (300 GB/s each way × the ~0.77 nccl-tests reaches
# on H100's 450); per-rail HDR ≈ 23 GB/s (200 Gb/s line rate × 0.92, the ratio 46/50 seen on 400G, SOURCES).
A100_INTRA_BUSBW_Bps = 230e9
HDR_RAIL_BUSBW_Bps = 23e9
# torchtitan's H100s (benchmarks/llama3_h100_202412): 96 GB HBM2e, 500 W parts; torchtitan computes MFU
# against 989 TFLOP/s, so that is the peak here. Usable HBM 95 GiB and 2.4 TB/s HBM2e bandwidth are [I].
H100_96GB_500W = GPUSpec(name="h100-96gb-500w", peak_bf16_flops=989e12, hbm_bytes=int(95 * GiB), hbm_bw_Bps=2.4e12,
                         source="torchtitan llama3_h100_202412 (96 GB HBM2e, 500 W); bandwidth [I]")
# The TorchTitan paper (arXiv 2410.06511, H100 experiments) says these parts' true peak lies between H100 NVL and
# H100 SXM and is not known. NVL: 835 TFLOP/s dense BF16 (NVIDIA H100 NVL datasheet: 1,671 with sparsity).
# ``validate_all(h100_peak_flops=...)`` / ``trainplan validate --h100-peak-tflops`` scores the rows at another
# value in that bracket: a sensitivity check on the hardware, not a fit.
H100_NVL_PEAK_BF16 = 835e12
ROCE_RAIL_BUSBW_Bps = 46e9  # 400 Gb/s per GPU rail (SOURCES: nccl-tests #290, #309); Meta's RoCE fabric [I]
# Micro-batch for Narayanan 2021 Table 1 is not published: 1 sequence (the paper's §5.x default for PP) [I].
MEGATRON_T1_MICRO_BATCH = 1
# torchtitan splits each rank's local batch into micro-batches of 1 under PP (pipeline_parallel_microbatch_size).
TORCHTITAN_PP_MICRO_BATCH = 1
# Memory rows: torchtitan at 9dec370 (the benchmark's commit) splits the local batch into
# ``pipeline_parallel_microbatches or pp`` micro-batches (torchtitan/parallelisms/pipeline_llama.py), so a
# micro-batch holds local_batch/pp sequences (405B T5: 32/8 = 4). The timing rows keep the value above.
GPT_VOCAB = 51200  # both Megatron papers: V = 51,200 (SOURCES.md)
GPT_SEQ = 2048
# Kernels per framework (TrainingSpec.kernels / attn_impl; docs/timing-model.md): Megatron-LM 2021/2022
# ran hand-fused kernels (fused LayerNorm, bias-GeLU, bias-dropout-add, scale-mask-softmax) and
# materialised attention (flash attention postdates both papers); torchtitan without compile runs PyTorch
# eager ops with SDPA flash attention; torchtitan with compile is Inductor-fused.
MEGATRON_KERNELS = {"kernels": "fused", "attn_impl": "math"}
TORCHTITAN_EAGER = {"kernels": "eager", "attn_impl": "flash"}
TORCHTITAN_COMPILED = {"kernels": "compiled", "attn_impl": "flash"}
# The fitted hardware parameter of torchtitan's 500 W parts: their sustained peak as a fraction of 989 TFLOP/s,
# bounded by the bracket the TorchTitan paper states (H100 NVL 835 – SXM 989).
TT500_PARAM = "h100_500w_peak_frac"


def load_table(name: str) -> pd.DataFrame:
    """A CSV from the package data folder (trainplan/data)."""
    with resources.files("trainplan").joinpath("data", name).open("r", encoding="utf-8") as f:
        return pd.read_csv(f)


def _gpt(layers: int, hidden: int, heads: int, name: str) -> ModelSpec:
    """Megatron GPT: LayerNorm, GELU 4h MLP, biases, learned positions, tied embeddings (Narayanan 2021 §5)."""
    return ModelSpec(name=name, layers=int(layers), hidden=int(hidden), heads=int(heads), vocab=GPT_VOCAB,
                     mlp="gelu", norm="layernorm", bias="all", pos_embedding="learned", tied_embeddings=True,
                     max_seq_len=GPT_SEQ)


def _cluster(n_gpus: int, gpu: GPUSpec, intra: float, inter: float) -> ClusterSpec:
    return ClusterSpec(nodes=max(1, int(n_gpus) // 8), gpus_per_node=min(8, int(n_gpus)), gpu=gpu,
                       intra_busbw_Bps=intra, inter_busbw_Bps=inter)


def family_class(layout: Layout) -> str:
    """The bias class of a layout: CP if it uses CP, else PP, else TP, else FSDP/ZeRO (data parallel only)."""
    return "CP" if layout.cp > 1 else "PP" if layout.pp > 1 else "TP" if layout.tp > 1 else "FSDP/ZeRO"


def _row(table: str, label: str, metric: str, published: float, predicted: float, in_mape: bool, note: str,
         layout: Layout | None = None, kernels: str = "", model: ModelSpec | None = None,
         n_gpus: int = 0, seq_len: int = 0, mfu: float = float("nan")) -> dict:
    return {"table": table, "row": label, "metric": metric, "published": float(published),
            "predicted": float(predicted), "err_pct": 100.0 * (predicted - published) / published,
            "in_mape": bool(in_mape), "note": note, "generation": TABLE_GENERATION.get(table, ""),
            "family": family_class(layout) if layout is not None else "", "kernels": kernels,
            "model": model.name if model is not None else "", "params_b": model.n_params / 1e9 if model else float("nan"),
            "n_gpus": int(n_gpus), "seq_len": int(seq_len), "pred_mfu": float(mfu),
            "layout": layout.describe() if layout is not None else ""}


def _note(model: ModelSpec, cluster: ClusterSpec, training: TrainingSpec, layout: Layout, extra: str = "") -> str:
    why = layout_problems(model, cluster, training, layout)
    return "; ".join([x for x in [extra, *(["planner would reject: " + why[0]] if why else [])] if x])


def _predict(table: str, label: str, metric: str, published: float, m: ModelSpec, c: ClusterSpec, t: TrainingSpec,
             lay: Layout, eff: Efficiency, *, in_mape: bool = True, extra: str = "",
             convert: Any = None) -> dict:
    """One published row vs the model: ``convert(timing dict) -> value in the published metric``."""
    tim = timing.step_time(m, c, t, lay, eff)
    pred = convert(tim) if convert is not None else tim["tokens_per_s_per_gpu"]
    row = _row(table, label, metric, published, pred, in_mape, _note(m, c, t, lay, extra), lay, t.kernels, m,
               c.n_gpus, t.seq_len, tim["mfu"])
    row["precision"] = t.precision
    row["peak_tflops"] = c.gpu.peak_bf16_flops / 1e12
    return row


def megatron2021_t1(eff: Efficiency) -> list[dict]:
    """Narayanan 2021 Table 1: TFLOP/s per GPU with the paper's F = 96·B·s·l·h²·(1 + s/6h + V/16lh)."""
    rows = []
    a100 = resolve_gpu("a100-80gb")
    for r in load_table("megatron_narayanan2021_table1_weak_scaling_A100.csv").itertuples():
        m = _gpt(r.num_layers, r.hidden_size, r.attention_heads, f"gpt-{r.params_billion}B")
        c = _cluster(r.num_gpus, a100, A100_INTRA_BUSBW_Bps, HDR_RAIL_BUSBW_Bps)
        t = TrainingSpec(seq_len=GPT_SEQ, global_batch=int(r.global_batch_size), **MEGATRON_KERNELS)
        dp = int(r.num_gpus) // (r.tensor_mp * r.pipeline_mp)
        lay = Layout(dp=dp, tp=int(r.tensor_mp), pp=int(r.pipeline_mp), sharding="none", recompute="full",
                     micro_batch=MEGATRON_T1_MICRO_BATCH)
        f = flops.narayanan_flops_per_iteration(t.global_batch, GPT_SEQ, m.layers, m.hidden, GPT_VOCAB)
        rows.append(_predict("megatron2021_t1", f"{r.params_billion}B {lay.describe()}", "tflops_per_gpu",
                             r.tflops_per_gpu, m, c, t, lay, eff,
                             convert=lambda tim, f=f, c=c: f / (tim["step_time_s"] * c.n_gpus) / 1e12))
    return rows


def korthikanti2022_t3_5(eff: Efficiency) -> list[dict]:
    """Korthikanti 2022 Tables 3/5: iteration time with full recompute, and with TP+SP+selective recompute."""
    rows = []
    a100 = resolve_gpu("a100-80gb")
    for r in load_table("korthikanti2022_tables3_5_A100.csv").itertuples():
        m = _gpt(r.num_layers, r.hidden_size, r.attention_heads, f"gpt-{r.model}")
        c = _cluster(r.num_gpus, a100, A100_INTRA_BUSBW_Bps, HDR_RAIL_BUSBW_Bps)
        t = TrainingSpec(seq_len=int(r.seq_len), global_batch=int(r.global_batch_size), **MEGATRON_KERNELS)
        dp = int(r.num_gpus) // (r.tp * r.pp)
        for col, sp, rc in (("iter_time_full_recompute_s", False, "full"),
                            ("iter_time_sp_plus_selective_s", True, "selective")):
            lay = Layout(dp=dp, tp=int(r.tp), pp=int(r.pp), sp=sp, sharding="none", recompute=rc,
                         micro_batch=int(r.micro_batch_size))
            rows.append(_predict("korthikanti2022_t3_5", f"{r.model} {lay.describe()}", "iter_time_s",
                                 getattr(r, col), m, c, t, lay, eff, convert=lambda tim: tim["step_time_s"]))
    return rows


def _ac(name: Any) -> str:
    """torchtitan activation_ckpt → our recompute (selective layer/op both → 'selective', a simplification)."""
    s = str(name)
    return "full" if s == "full" else ("none" if s in ("no", "none", "nan") else "selective")


def _h100_part(peak_flops: float | None) -> GPUSpec:
    """torchtitan's 500 W H100, at the SXM peak or at ``peak_flops`` (FLOP/s) from the stated bracket."""
    if peak_flops is None:
        return H100_96GB_500W
    lo, hi = H100_NVL_PEAK_BF16, H100_96GB_500W.peak_bf16_flops
    if not lo <= peak_flops <= hi:
        raise ConfigError("h100_peak_tflops", peak_flops / 1e12,
                          f"must lie in the bracket torchtitan states for its 500 W H100s: {lo / 1e12:g}–{hi / 1e12:g}")
    return replace(H100_96GB_500W, peak_bf16_flops=float(peak_flops))


def _tt_peak(h100_peak_flops: float | None) -> float | None:
    """The 500 W parts' peak: the argument, else the fitted clock fraction × 989 (efficiency_fits.json)."""
    if h100_peak_flops is not None:
        return h100_peak_flops
    frac = generation_fits().get("h100", {}).get("hardware", {}).get(TT500_PARAM)
    return None if frac is None else float(frac) * H100_96GB_500W.peak_bf16_flops


def torchtitan_h100(eff: Efficiency, h100_peak_flops: float | None = None) -> list[dict]:
    """torchtitan H100 (2024-12): tokens/s/GPU and peak reserved GiB; float8 / async-TP rows not modelled here
    (async TP is scored on its own table; float8 is issue FP8)."""
    part = _h100_part(h100_peak_flops)
    rows = []
    for r in load_table("torchtitan_h100_202412.csv").itertuples():
        m = resolve_model(r.model.lower())
        seq = int(str(r.seq_len).rstrip("*"))
        c = _cluster(r.num_gpus, part, 360e9, ROCE_RAIL_BUSBW_Bps)
        gb = int(r.local_batch) * int(r.fsdp)
        compiled = r.compile == "yes"
        t = TrainingSpec(seq_len=seq, global_batch=gb, precision="fp8-tensorwise" if r.float8 == "yes" else "bf16",
                         **(TORCHTITAN_COMPILED if compiled else TORCHTITAN_EAGER))
        interleaved = str(r.pp_schedule).startswith("Interleaved")
        lay = Layout(dp=int(r.fsdp), tp=int(r.tp), pp=int(r.pp), cp=int(r.cp), sp=int(r.tp) > 1,
                     pp_schedule="interleaved" if interleaved else "1f1b", vpp=2 if interleaved else 1,
                     tp_overlap=r.async_tp == "yes" and int(r.tp) > 1, sharding="zero3",
                     recompute=_ac(r.activation_ckpt),
                     micro_batch=TORCHTITAN_PP_MICRO_BATCH if int(r.pp) > 1 else int(r.local_batch))
        unmodelled: list[str] = []
        ok = not unmodelled
        extra = ("not modelled: " + ", ".join(unmodelled)) if unmodelled else ""
        # memory.py has no compile variant (Inductor saves fewer activations): compile rows' memory is shown only
        mem_ok = ok and not compiled and r.float8 != "yes"
        label = f"T{r.table} {m.name} {lay.describe()}"
        rows.append(_predict("torchtitan_h100", label, "tokens_per_s_per_gpu", r.tps_per_gpu, m, c, t, lay, eff,
                             in_mape=ok, extra=extra))
        # torchtitan logs torch.cuda max reserved: the caching allocator only (no CUDA context / NCCL).
        lay_mem = replace(lay, micro_batch=int(r.local_batch) // int(r.pp)) if int(r.pp) > 1 else lay
        mem = memory.reserved_bytes(memory.memory_breakdown(m, c, t, lay_mem, eff), eff)
        mem_note = _note(m, c, t, lay, extra if not ok else ("memory under compile not modelled" if compiled else ""))
        rows.append(_row("torchtitan_h100", label, "memory_gib", r.memory_gib, mem / GiB, mem_ok, mem_note, lay,
                         t.kernels, m, c.n_gpus, seq))
    return rows


def torchtitan_asynctp_h100(eff: Efficiency, h100_peak_flops: float | None = None) -> list[dict]:
    """torchtitan async-TP benchmark (2025-06, the same 500 W parts): vanilla and async TP, bf16 rows; float8
    rows shown, not scored (FP8 is not modelled). torch.compile on (async TP needs it), seq 8192."""
    part = _h100_part(h100_peak_flops)
    names = {"Llama3-70B": "llama3-70b", "Llama3-8B": "llama3-8b"}
    rows = []
    for r in load_table("torchtitan_asynctp_H100_202506.csv").itertuples():
        m = resolve_model(names[r.model])
        c = _cluster(r.gpus, part, 360e9, ROCE_RAIL_BUSBW_Bps)
        precision = {"bf16": "bf16", "float8 tensorwise": "fp8-tensorwise", "float8 rowwise": "fp8-rowwise"}
        t = TrainingSpec(seq_len=8192, global_batch=int(r.local_batch) * int(r.fsdp),
                         precision=precision[r.quantization], **TORCHTITAN_COMPILED)
        ok = True
        for col, on in (("vanilla_tp_tps_per_gpu", False), ("async_tp_tps_per_gpu", True)):
            lay = Layout(dp=int(r.fsdp), tp=int(r.tp), sp=True, tp_overlap=on, sharding="zero3",
                         recompute=_ac("full" if r.activation_ckpt == "full" else "selective"),
                         micro_batch=int(r.local_batch))
            rows.append(_predict("torchtitan_asynctp_h100", f"{m.name} {r.quantization} {lay.describe()}",
                                 "tokens_per_s_per_gpu", getattr(r, col), m, c, t, lay, eff, in_mape=ok))
    return rows


# Megatron-LM README 2024 (H100): vocab 131,072, seq 4096, untied embeddings, GELU 4h MLP (SOURCES.md);
# distributed optimizer (ZeRO-1) with --overlap-grad-reduce --overlap-param-gather --tp-comm-overlap, TE kernels.
# Not stated [I]: without PP the whole local batch (192/48 = 4 sequences) is one micro-batch, so the overlapped
# gradient reduce-scatter and parameter all-gather hide behind a whole backward and forward; with PP micro-batch 1;
# no activation recompute (flash attention already recomputes its scores);
# interleaved 1F1B with two layers per virtual stage, as the NeMo 24.07 recipes of this era
# (nemo_24.07_H100_fp8.csv: Llama 2 13B PP4·VP10, 70B PP4·VP20, GPT3-175B PP8·VP6: 1–2 layers per virtual stage).
MEGATRON2024_VOCAB = 131072
MEGATRON2024_SEQ = 4096
LAYERS_PER_VIRTUAL_STAGE = 2


def _interleaved_vpp(layers: int, pp: int) -> int:
    return max(1, -(-layers // (pp * LAYERS_PER_VIRTUAL_STAGE))) if pp > 1 else 1


def megatron2024_h100(eff: Efficiency) -> list[dict]:
    """Megatron-Core on H100 SXM (README 2024 weak scaling): TFLOP/s per GPU from Megatron's model-FLOPs count
    (72·L·h²·(1 + s/6h + V/12hL) per token, Korthikanti 2022), predicted as tokens/s/GPU × that count."""
    rows = []
    h100 = resolve_gpu("h100-sxm-80gb")
    for r in load_table("megatron_readme_2024_weak_scaling_H100.csv").itertuples():
        m = ModelSpec(name=f"gpt-{r.model_size}", layers=int(r.num_layers), hidden=int(r.hidden_size),
                      heads=int(r.attention_heads), vocab=MEGATRON2024_VOCAB, mlp="gelu", norm="layernorm",
                      bias="all", pos_embedding="rope", tied_embeddings=False, max_seq_len=MEGATRON2024_SEQ)
        c = _cluster(r.num_gpus, h100, 360e9, ROCE_RAIL_BUSBW_Bps)
        t = TrainingSpec(seq_len=MEGATRON2024_SEQ, global_batch=int(r.global_batch_size), kernels="fused",
                         attn_impl="flash")
        pp, tp = int(r.pipeline_mp), int(r.tensor_mp)
        vpp = _interleaved_vpp(m.layers, pp)
        mb = 1 if pp > 1 else int(r.global_batch_size) // int(r.data_parallel)
        lay = Layout(dp=int(r.data_parallel), tp=tp, pp=pp, sp=tp > 1, tp_overlap=tp > 1,
                     pp_schedule="interleaved" if vpp > 1 else "1f1b", vpp=vpp, sharding="zero1",
                     recompute="none", micro_batch=mb)
        f_tok = flops.korthikanti_model_flops_per_iteration(1, t.seq_len, m.layers, m.hidden, m.vocab) / t.seq_len
        rows.append(_predict("megatron2024_h100", f"{r.model_size} {lay.describe()}", "tflops_per_gpu",
                             r.tflops_per_gpu, m, c, t, lay, eff,
                             convert=lambda tim, f=f_tok: tim["tokens_per_s_per_gpu"] * f / 1e12))
    return rows


# Llama 3 405B (Dubey 2024, Table 4, §3.3.2): 126 layers on PP16 with the first and last stage one layer lighter,
# interleaved schedule, TP8 (+SP), CP by all-gathered K/V (modelled as ring), FSDP over dp. Not stated [I]:
# two layers per virtual stage (v=4, busiest stage 8 layers); ZeRO-1-like sharding (the paper: no reshard after
# forward); no activation recompute; TP comm overlapped; micro-batch 1 sequence. TFLOP/s per GPU read as our
# model FLOPs (6·N + 12·L·h·s per token): 430/989 = 43% = the paper's BF16 MFU column.
def llama3_405b_h100(eff: Efficiency) -> list[dict]:
    """Llama 3 405B pre-training on 8,192–16,384 H100 SXM (Meta's fabric: RoCE 400G per GPU)."""
    rows = []
    h100 = resolve_gpu("h100-sxm-80gb")
    m = resolve_model("llama3.1-405b")
    for r in load_table("llama3_405b_table4_H100.csv").itertuples():
        c = _cluster(r.gpus, h100, 360e9, ROCE_RAIL_BUSBW_Bps)
        dp, pp, tp, cp = int(r.dp), int(r.pp), int(r.tp), int(r.cp)
        t = TrainingSpec(seq_len=int(r.seq_len), global_batch=int(r.batch_size_per_dp) * dp, kernels="fused",
                         attn_impl="flash")
        vpp = _interleaved_vpp(m.layers, pp)
        lay = Layout(dp=dp, tp=tp, pp=pp, cp=cp, sp=True, tp_overlap=True, pp_schedule="interleaved", vpp=vpp,
                     sharding="zero1", recompute="none", micro_batch=1)
        rows.append(_predict("llama3_405b_h100", f"{r.gpus} GPUs {lay.describe()} seq {r.seq_len}", "tflops_per_gpu",
                             r.tflops_per_gpu, m, c, t, lay, eff,
                             convert=lambda tim, c=c: tim["mfu"] * c.gpu.peak_bf16_flops / 1e12))
    return rows


def torchtitan_a100(eff: Efficiency, h100_peak_flops: float | None = None,
                    eff_h100: Efficiency | None = None) -> list[dict]:
    """torchtitan docs/performance.md: 64×A100 FSDP (incl. Llama-2-13B 2162 tok/s/GPU) and 405B on H100."""
    part = _h100_part(h100_peak_flops)
    rows = []
    names = {"Llama3-8B": "llama3-8b", "Llama3-70B": "llama3-70b", "Llama2-13B": "llama2-13b",
             "Llama2-70B": "llama2-70b", "Llama3.1-405B": "llama3.1-405b"}
    for r in load_table("torchtitan_a100_and_405b_docs_performance.csv").itertuples():
        m = resolve_model(names[r.model])
        h100 = str(r.gpu).startswith("H100")
        gpu = part if h100 else resolve_gpu("a100-80gb")
        c = _cluster(r.gpus, gpu, 360e9 if h100 else A100_INTRA_BUSBW_Bps,
                     ROCE_RAIL_BUSBW_Bps if h100 else HDR_RAIL_BUSBW_Bps)
        tp = 8 if "TP8" in r.parallelism else 1
        dp = int(r.gpus) // tp
        seq = int(r.seq_len_default_cfg)
        opt = str(r.optimizations)
        t = TrainingSpec(seq_len=seq, global_batch=int(r.local_batch) * dp,
                         precision="fp8-tensorwise" if "Float8" in opt else "bf16",
                         **(TORCHTITAN_COMPILED if "AsyncTP" in opt else TORCHTITAN_EAGER))
        lay = Layout(dp=dp, tp=tp, sp=tp > 1, sharding="zero3", recompute=_ac(r.activation_ckpt),
                     micro_batch=int(r.local_batch), tp_overlap="AsyncTP" in opt)
        ok = True
        # The 405B rows ran on the same 500 W H100s as benchmarks/llama3_h100_202412: scored with that table.
        table = "torchtitan_h100" if h100 else "torchtitan_a100"
        rows.append(_predict(table, f"docs {r.model} {r.gpus}×{r.gpu} {lay.describe()}", "tokens_per_s_per_gpu",
                             r.wps_per_gpu, m, c, t, lay, (eff_h100 or eff) if h100 else eff, in_mape=ok,
                             extra="" if opt in ("nan", "None", "") else "with " + opt))
    return rows


# NeMo 24.07 performance summary (DGX H100, FP8 with Transformer Engine: per-tensor scaling = our tensorwise recipe;
# attention and the output layer bf16). Held out of every fit: it checks the FP8 model. Not stated [I]: ZeRO-1
# (distributed optimizer), TP comm overlap with TP, no activation recompute, sequence parallelism with TP; LoRA on
# the fused QKV projection (NeMo's default target) at rank 32. Nemotron (squared-ReLU MLP) is not modelled.
NEMO_MODELS = {"LLAMA2-7B": "llama2-7b", "LLAMA2-13B": "llama2-13b", "LLAMA2-70B": "llama2-70b",
               "LLAMA3-8B": "llama3-8b", "LLAMA3-70B": "llama3-70b"}
NEMO_GPT3 = {"GPT3-5B": (24, 4096, 32), "GPT3-20B": (44, 6144, 48), "GPT3-175B": (96, 12288, 96)}
NEMO_LORA_RANK = 32


def nemo2407_h100(eff: Efficiency) -> list[dict]:
    """NeMo 24.07 FP8 pre-training, SFT and LoRA on H100 SXM: tokens/s/GPU, held out (never fitted on)."""
    rows = []
    h100 = resolve_gpu("h100-sxm-80gb")
    for r in load_table("nemo_24.07_H100_fp8.csv").itertuples():
        if r.model in NEMO_MODELS:
            m = resolve_model(NEMO_MODELS[r.model])
        elif r.model in NEMO_GPT3:
            layers, hidden, heads = NEMO_GPT3[r.model]
            m = ModelSpec(name=r.model.lower(), layers=layers, hidden=hidden, heads=heads, vocab=GPT_VOCAB, mlp="gelu",
                          norm="layernorm", bias="all", pos_embedding="learned", tied_embeddings=True,
                          max_seq_len=int(r.seq_len))
        else:
            continue  # Nemotron: squared-ReLU MLP, not modelled
        tp, pp = int(r.tp), int(r.pp)
        cp = int(r.cp) if r.cp == r.cp else 1
        vp = int(r.vp) if r.vp == r.vp else 1
        dp = int(r.num_gpus) // (tp * pp * cp)
        lora = r.task == "LoRA"
        c = _cluster(r.num_gpus, h100, 360e9, ROCE_RAIL_BUSBW_Bps)
        t = TrainingSpec(seq_len=int(r.seq_len), global_batch=int(r.gbs), kernels="fused", attn_impl="flash",
                         precision="fp8-tensorwise", finetune="lora" if lora else "full", lora_rank=NEMO_LORA_RANK,
                         lora_targets=("q", "k", "v"))
        lay = Layout(dp=dp, tp=tp, pp=pp, cp=cp, sp=tp > 1, tp_overlap=tp > 1,
                     pp_schedule="interleaved" if vp > 1 else "1f1b", vpp=vp, sharding="zero1", recompute="none",
                     micro_batch=int(r.mbs))
        rows.append(_predict("nemo2407_h100", f"{r.task} {r.model} {lay.describe()}", "tokens_per_s_per_gpu",
                             r.tokens_per_s_per_gpu, m, c, t, lay, eff))
    return rows


def _effs(eff: Efficiency | dict[str, Efficiency] | None) -> dict[str, Efficiency]:
    """Per-generation Efficiency: one object for every table, a {generation: Efficiency} dict, or the fits."""
    if isinstance(eff, Efficiency):
        return {g: eff for g in set(TABLE_GENERATION.values())}
    d = dict(eff or {})
    return {g: d.get(g) or Efficiency.for_gpu(g) for g in set(TABLE_GENERATION.values())}


def validate_all(eff: Efficiency | dict[str, Efficiency] | None = None, *, h100_peak_flops: float | None = None,
                 tables: tuple[str, ...] = TABLES) -> pd.DataFrame:
    """Every comparable published row: table, row, metric, published, predicted, err_pct, in_mape, note,
    generation, family, kernels, model, params_b, n_gpus, seq_len, pred_mfu, layout.

    ``eff``: one Efficiency for all rows, or one per GPU generation (default: the fitted generation sets,
    ``Efficiency.for_gpu``). ``h100_peak_flops`` scores torchtitan's 500 W H100 rows at that peak (default:
    the fitted clock fraction of those parts × 989 TFLOP/s; ``--h100-peak-tflops`` in the CLI).
    """
    e = _effs(eff)
    peak = _tt_peak(h100_peak_flops)
    a, h = e["a100"], e["h100"]
    fns = {"megatron2021_t1": lambda: megatron2021_t1(a), "korthikanti2022_t3_5": lambda: korthikanti2022_t3_5(a),
           "torchtitan_h100": lambda: torchtitan_h100(h, peak),
           "torchtitan_a100": lambda: torchtitan_a100(a, peak, h),
           "torchtitan_asynctp_h100": lambda: torchtitan_asynctp_h100(h, peak),
           "megatron2024_h100": lambda: megatron2024_h100(h), "llama3_405b_h100": lambda: llama3_405b_h100(h),
           "nemo2407_h100": lambda: nemo2407_h100(h)}
    rows: list[dict] = []
    for name in TABLES:
        if name in tables or (name == "torchtitan_a100" and "torchtitan_h100" in tables):
            rows += fns[name]()
    df = pd.DataFrame(rows)
    return df[df["table"].isin(tables)].reset_index(drop=True)


def mape_table(df: pd.DataFrame) -> pd.DataFrame:
    """MAPE (%) per (table, metric) over the rows the model speaks to."""
    d = df[df["in_mape"]]
    g = d.groupby(["table", "metric"], sort=False)["err_pct"]
    return pd.DataFrame({"mape_pct": g.apply(lambda e: float(np.mean(np.abs(e)))),
                         "bias_pct": g.mean(), "rows": g.size()}).reset_index()



# --- how the per-generation Efficiency sets were fitted (docs/timing-model.md §7) ---------------------------
# One fit per GPU generation, on that generation's published tables only: nothing fitted on A100 carries over to
# H100. The GEMM ceiling is grounded in the measured maximum achievable matmul (MAMF, stas00/ml-engineering,
# SOURCES.md): the fitted gemm_eff_max may not exceed it (A100 267.9/312 = 85.9%, H100 792.1/989 = 80.1%).
# Every fitted number has a physical meaning; none is per row. The H100 fit adds the sustained peak of
# torchtitan's 500 W parts (a hardware fact the source leaves open) and the async-TP overlap fraction.
MAMF_FRAC = {"a100": 267.9 / 312.0, "h100": 792.1 / 989.0}
# H100 holds three values fixed rather than fitted, because its four tables cannot identify them:
# * gemm_eff_half_dim = 256 [I] (one 128×256 wgmma tile: below it per dimension the tensor cores idle) and
#   membound_eff = the A100 fit's value, Efficiency's class default (a fraction of each GPU's own HBM bandwidth, taken
#   as generation-independent): with both free the fit runs each to a bound and the leave-one-table-out error of
#   torchtitan_h100 doubles (8.6% → 16.5%);
# * the sustained peak of torchtitan's 500 W parts = 912 TFLOP/s, the middle of the bracket the TorchTitan paper
#   states (H100 NVL 835 – SXM 989) [I]: every open PyTorch H100 row ran on those parts, so their peak and the
#   PyTorch-vs-fused GEMM factor (torch_gemm_rel, fitted) are confounded; left free, the peak runs to the 835 bound
#   and PyTorch FSDP on a 700 W H100 SXM comes out ~8% faster (docs/timing-model.md §7).
TT500_MIDPOINT = (H100_NVL_PEAK_BF16 + 989e12) / 2 / 989e12
# * attn_eff_half_work = 54,000 (keys × head_dim at which flash attention runs at half its long-sequence rate): fitted
#   (scipy, log errors) to FlashAttention-2's causal forward on H100 SXM5 in the FlashAttention-3 paper (Shah 2024,
#   Fig. 5: head dim 128, seq 512–16k: 191, 260, 298, 319, 333, 335 TFLOP/s; head dim 256: 208, 251, 278, 293, 297,
#   298), 54,000 ± 2,700, both head dims within 4%. Left free on the open tables it is not identified (41,000 ±
#   122,000: their rows are all at 4k–32k keys per call) and the leave-one-table-out fits run it to the bounds
#   (docs/timing-model.md §7.5).
FA2_H100_ATTN_HALF_WORK = 54_000.0
GEN_FIT: dict[str, dict[str, Any]] = {
    "a100": {"tables": ("megatron2021_t1", "korthikanti2022_t3_5", "torchtitan_a100"),
             "params": ("gemm_eff_max", "gemm_eff_half_dim", "attn_eff", "membound_eff"), "fixed": {}},
    "h100": {"tables": ("torchtitan_h100", "torchtitan_asynctp_h100", "megatron2024_h100", "llama3_405b_h100"),
             "params": ("gemm_eff_max", "attn_eff", "tp_async_overlap", "fp8_gemm_eff_tensorwise",
                        "fp8_gemm_eff_rowwise", "torch_gemm_rel"),
             "fixed": {"gemm_eff_half_dim": 256.0, "membound_eff": Efficiency.membound_eff,
                       "attn_eff_half_work": FA2_H100_ATTN_HALF_WORK, TT500_PARAM: TT500_MIDPOINT}},
}
FIT_TABLES = GEN_FIT["a100"]["tables"]
FIT_PARAMS = GEN_FIT["a100"]["params"]
# Physical ranges the fit may not leave: GEMM up to the MAMF ceiling of the generation; flash attention fwd+bwd
# 25% (FA2 on H100 reaches 34%, Dao 2023 §4.1) to 75% of peak (FA3 on H100, Shah 2024); elementwise kernels
# 30–95% of HBM bandwidth [I]; the 500 W parts' peak inside the stated NVL–SXM bracket (835–989).
FIT_BOUNDS = {"gemm_eff_max": (0.6, 0.9), "gemm_eff_half_dim": (1.0, 256.0), "kernel_overhead_s": (0.0, 50e-6), "attn_eff": (0.25, 0.75),
              "attn_eff_half_work": (0.0, 2.0**18),
              "membound_eff": (0.3, 0.95), "comm_bw_eff": (0.3, 1.0), "tp_async_overlap": (0.0, 1.0),
              "fp8_gemm_eff_tensorwise": (0.2, 0.9), "fp8_gemm_eff_rowwise": (0.1, 0.9),
              "torch_gemm_rel": (0.6, 1.0),
              TT500_PARAM: (H100_NVL_PEAK_BF16 / 989e12, 1.0)}


# Fitted in these units so that every parameter is O(1) for the finite-difference Jacobian.
FIT_SCALE = {"kernel_overhead_s": 1e-6, "attn_eff_half_work": 1e4}


def _bounds(gen: str, p: str) -> tuple[float, float]:
    lo, hi = FIT_BOUNDS[p]
    return (lo, min(hi, MAMF_FRAC[gen])) if p == "gemm_eff_max" else (lo, hi)


def _split(gen: str, x: dict[str, float], eff0: Efficiency) -> tuple[dict[str, Efficiency], float | None]:
    eff = eff0.replace(**{p: v for p, v in x.items() if p != TT500_PARAM})
    frac = x.get(TT500_PARAM, GEN_FIT[gen]["fixed"].get(TT500_PARAM))
    peak = frac * H100_96GB_500W.peak_bf16_flops if frac is not None else None
    return {gen: eff}, peak


def _fit_frame(gen: str, x: dict[str, float], eff0: Efficiency, tables: tuple[str, ...]) -> pd.DataFrame:
    effs, peak = _split(gen, x, eff0)
    df = validate_all(effs, h100_peak_flops=peak, tables=tables)
    return df[df["in_mape"] & (df["metric"] != "memory_gib")]


def _fit_residuals(eff: Efficiency, tables: tuple[str, ...], gen: str = "a100", extra: dict | None = None) -> np.ndarray:
    """log(predicted/published) per row, each table weighted 1/sqrt(rows) so every table counts once."""
    d = _fit_frame(gen, dict(extra or {}), eff, tables)
    w = 1.0 / np.sqrt(d.groupby("table")["table"].transform("size").to_numpy())
    return np.log(d["predicted"].to_numpy() / d["published"].to_numpy()) * w


def fit_generation(gen: str, tables: tuple[str, ...] | None = None, params: tuple[str, ...] | None = None,
                   eff0: Efficiency | None = None) -> dict[str, Any]:
    """Least squares on log errors (scipy) of ``gen``'s tables within the physical bounds.

    Returns ``{"efficiency": Efficiency, "values", "stderr", "hardware", "fitted_on", "n", "rmse_log"}``; the
    standard errors come from the Jacobian at the optimum (σ²·(JᵀJ)⁻¹, σ² = RSS/(n − p)).
    """
    from scipy.optimize import least_squares

    tables = tuple(tables or GEN_FIT[gen]["tables"])
    params = tuple(params or GEN_FIT[gen]["params"])
    eff0 = eff0 or Efficiency(**{k: v for k, v in GEN_FIT[gen]["fixed"].items() if k != TT500_PARAM})
    for p in params:
        if p not in FIT_BOUNDS:
            raise ConfigError("params", p, "fittable here: " + ", ".join(FIT_BOUNDS))
    sc = np.array([FIT_SCALE.get(p, 1.0) for p in params])
    lo, hi = (np.array(v) / sc for v in zip(*(_bounds(gen, p) for p in params), strict=True))
    start = {**{p: getattr(eff0, p) for p in params if p != TT500_PARAM}, TT500_PARAM: 0.92, "kernel_overhead_s": 3e-6}
    x0 = np.clip(np.array([start[p] for p in params]) / sc, lo, hi)

    def resid(x: np.ndarray) -> np.ndarray:
        d = _fit_frame(gen, dict(zip(params, x * sc, strict=True)), eff0, tables)
        w = 1.0 / np.sqrt(d.groupby("table")["table"].transform("size").to_numpy())
        return np.log(d["predicted"].to_numpy() / d["published"].to_numpy()) * w

    res = least_squares(resid, x0, bounds=(lo, hi), diff_step=1e-3)
    n, k = len(res.fun), len(params)
    sigma2 = float(res.fun @ res.fun) / max(1, n - k)
    try:
        cov = np.linalg.pinv(res.jac.T @ res.jac) * sigma2
        se = np.sqrt(np.clip(np.diag(cov), 0, None)) * sc
    except np.linalg.LinAlgError:  # pragma: no cover - degenerate Jacobian
        se = np.full(k, np.nan)
    x = dict(zip(params, map(float, res.x * sc), strict=True))
    eff = eff0.replace(**{p: v for p, v in x.items() if p != TT500_PARAM}, source=f"fit:{gen}")
    fixed = GEN_FIT[gen]["fixed"]
    values = {**{p: float(getattr(eff0, p)) for p in fixed if p != TT500_PARAM}, **x}
    hw = {p: float(v) for p, v in {**fixed, **x}.items() if p == TT500_PARAM}
    return {"efficiency": eff, "values": {p: v for p, v in values.items() if p != TT500_PARAM},
            "fixed": dict(fixed), "hardware": hw,
            "stderr": dict(zip(params, map(float, se), strict=True)), "fitted_on": list(tables), "n": n,
            "rmse_log": float(np.sqrt(np.mean(res.fun ** 2)))}


def fit_defaults(params: tuple[str, ...] = FIT_PARAMS, tables: tuple[str, ...] = FIT_TABLES,
                 eff0: Efficiency | None = None, gen: str = "a100") -> tuple[Efficiency, pd.DataFrame]:
    """One Efficiency for all rows of ``tables`` (one generation): the fit and the MAPE table it gives."""
    f = fit_generation(gen, tables, params, eff0)
    peak = f["hardware"].get(TT500_PARAM)
    return f["efficiency"], mape_table(validate_all({gen: f["efficiency"]},
                                                    h100_peak_flops=None if peak is None else peak * 989e12))


def write_fits(path: Any = None) -> dict[str, Any]:
    """Fit every generation and write ``trainplan/data/efficiency_fits.json`` (what ``Efficiency.for_gpu`` reads)."""
    import json
    from pathlib import Path

    out: dict[str, Any] = {}
    for gen in GEN_FIT:
        f = fit_generation(gen)
        out[gen] = {"values": {k: float(f"{v:.4g}") for k, v in f["values"].items()},
                    "hardware": {k: float(f"{v:.4g}") for k, v in f["hardware"].items()},
                    "stderr": {k: float(f"{v:.3g}") for k, v in f["stderr"].items()},
                    "bounds": {p: list(_bounds(gen, p)) for p in GEN_FIT[gen]["params"]},
                    "fixed": f["fixed"], "fitted_on": f["fitted_on"], "n_rows": f["n"],
                    "rmse_log": round(f["rmse_log"], 4),
                    "method": "scipy least_squares on log(predicted/published), each table weighted 1/sqrt(rows); "
                              "stderr from the Jacobian at the optimum"}
    held = heldout_rows()
    for gen in GEN_FIT:
        d = held[held["generation"] == gen]
        out[gen]["heldout"] = [{"table": r.table, "row": r.row, "metric": r.metric, "family": r.family,
                                "kernels": r.kernels, "model": r.model, "params_b": round(float(r.params_b), 3),
                                "n_gpus": int(r.n_gpus), "seq_len": int(r.seq_len), "layout": r.layout,
                                "pred_mfu": round(float(r.pred_mfu), 4),
                                "published": float(r.published), "predicted": round(float(r.predicted), 6),
                                "err_pct": round(float(r.err_pct), 3)} for r in d.itertuples()]
        out[gen]["coverage"] = interval_coverage(d)
    path = Path(path) if path else Path(str(resources.files("trainplan").joinpath("data", "efficiency_fits.json")))
    path.write_text(json.dumps(out, indent=1, sort_keys=True) + "\n", encoding="utf-8")
    generation_fits.cache_clear()
    return out


def heldout_rows(params: tuple[str, ...] | None = None, only: tuple[str, ...] | None = None) -> pd.DataFrame:
    """Every scored row predicted by the fit that left its table out (leave one table out): the rows of
    ``validate_all`` plus ``held_out_fit``. The errors the production interval and its coverage check use."""
    out = []
    for gen, spec in GEN_FIT.items():
        for held in spec["tables"]:
            if only is not None and held not in only:
                continue
            fit_on = tuple(t for t in spec["tables"] if t != held)
            f = fit_generation(gen, fit_on, params or spec["params"])
            peak = f["hardware"].get(TT500_PARAM)
            d = validate_all({gen: f["efficiency"]}, h100_peak_flops=None if peak is None else peak * 989e12,
                             tables=(held,))
            d = d[d["in_mape"] & (d["metric"] != "memory_gib")]
            # An FP8 recipe no remaining table measures has no fitted efficiency to predict with: such rows are
            # not held-out predictions (the fp8-rowwise rows exist only in the async-TP table).
            seen = set(validate_all({gen: f["efficiency"]}, tables=fit_on)["precision"])
            out.append(d[d["precision"].isin(seen)].assign(held_out_fit="+".join(fit_on)))
    return pd.concat(out, ignore_index=True)


def throughput_rel_errors(df: pd.DataFrame) -> np.ndarray:
    """predicted/measured − 1 of *throughput* per row (a time metric's ratio is inverted)."""
    ratio = df["predicted"].to_numpy(float) / df["published"].to_numpy(float)
    is_time = df["metric"].astype(str).str.endswith("_s").to_numpy() if "metric" in df else np.zeros(len(df), bool)
    return np.where(is_time, 1.0 / ratio, ratio) - 1.0


MIN_FAMILY_ROWS = 3  # fewer held-out rows of a family than this: its interval uses the whole generation's errors


def error_pool(errors: dict[str, list[float]], family: str) -> np.ndarray:
    """The held-out relative errors an interval for ``family`` draws on: the family's own when it has at least
    MIN_FAMILY_ROWS, else every family's of that generation."""
    own = errors.get(family) or []
    if len(own) >= MIN_FAMILY_ROWS:
        return np.asarray(own, dtype=float)
    return np.asarray([e for v in errors.values() for e in v] or [0.0], dtype=float)


def interval_bounds(predicted: float, errors: Any, quantiles: tuple[float, float] = (0.1, 0.9)) -> tuple[float, float]:
    """p_lo–p_hi of the measured value given a prediction and held-out relative errors e (predicted/measured − 1).

    A prediction interval, not the errors' own quantiles: le = log(1 + e) is taken as normal with the pool's mean
    and standard deviation, and a new row's le as Student-t with n − 1 degrees of freedom scaled by sqrt(1 + 1/n)
    (the textbook predictive interval; it widens for small pools, where raw quantiles of a dozen errors
    under-cover). measured = predicted · exp(−le)."""
    from scipy.stats import t as student_t

    le = np.log1p(np.asarray(errors, dtype=float))
    n = len(le)
    if n < 2:
        return float(predicted), float(predicted)
    m, sd = float(le.mean()), float(le.std(ddof=1))
    k = sd * np.sqrt(1.0 + 1.0 / n)
    lo_q, hi_q = quantiles
    l_hi = m + k * float(student_t.ppf(1.0 - lo_q, n - 1))  # a large le → a low measured value
    l_lo = m + k * float(student_t.ppf(1.0 - hi_q, n - 1))
    return float(predicted * np.exp(-l_hi)), float(predicted * np.exp(-l_lo))


def predictive_error_draws(errors: Any, size: int, rng: np.random.Generator) -> np.ndarray:
    """Relative errors e drawn from the predictive distribution interval_bounds uses (log(1 + e) Student-t,
    n − 1 degrees of freedom, scale sd·sqrt(1 + 1/n)); the pool itself when it has fewer than 3 errors."""
    le = np.log1p(np.asarray(errors, dtype=float))
    if len(le) < 3:
        return rng.choice(np.expm1(le) if len(le) else np.zeros(1), size=size)
    k = float(le.std(ddof=1)) * np.sqrt(1.0 + 1.0 / len(le))
    return np.expm1(float(le.mean()) + k * rng.standard_t(len(le) - 1, size=size))


def interval_coverage(held: pd.DataFrame, quantiles: tuple[float, float] = (0.1, 0.9)) -> dict[str, Any]:
    """Empirical coverage of the production interval on held-out rows: for each row, the interval_bounds of its
    prediction over the *other* rows' held-out errors (the family pool as production uses it: error_pool) — does
    the published value fall inside? Nominal 80% for p10–p90."""
    d = held.reset_index(drop=True)
    if "metric" not in d:
        d = d.assign(metric="tokens_per_s_per_gpu")
    err = throughput_rel_errors(d)
    is_time = d["metric"].astype(str).str.endswith("_s").to_numpy()
    hits = []
    for i in range(len(d)):
        others: dict[str, list[float]] = {}
        for j in range(len(d)):
            if j != i:
                others.setdefault(str(d.loc[j, "family"]), []).append(float(err[j]))
        pool = error_pool(others, str(d.loc[i, "family"]))
        pred, pub = float(d.loc[i, "predicted"]), float(d.loc[i, "published"])
        pred_tp, pub_tp = (1.0 / pred, 1.0 / pub) if is_time[i] else (pred, pub)
        lo, hi = interval_bounds(pred_tp, pool, quantiles)
        hits.append(bool(lo <= pub_tp <= hi))
    return {"nominal": round(float(quantiles[1] - quantiles[0]), 6),
            "measured": float(np.mean(hits)) if hits else float("nan"), "n": len(hits),
            "method": "leave one row out; Student-t predictive interval of log(1 + e) over the family's held-out "
                      "errors (the generation's when the family has fewer than 3)"}


def comparable_runs(model: ModelSpec, generation: str, kernels: str, family: str, *, n: int = 3,
                    rows: pd.DataFrame | None = None, peak_flops: float | None = None,
                    precision: str = "bf16") -> list[dict[str, Any]]:
    """The ``n`` open published runs closest to a planned layout: same GPU generation first, then nearest model
    size (|log size ratio|), then the same family class and kernel class (each mismatch counts as a 2× size gap).
    Each with its published MFU (our FLOP convention: predicted MFU × published/predicted throughput) next to
    what this model predicts for it, both against ``peak_flops`` (the study GPU's BF16 peak) when given, so that a
    power-capped part's run reads on the same scale as the plan."""
    d = validate_all() if rows is None else rows
    d = d[d["in_mape"] & (d["metric"] != "memory_gib") & (d["generation"] == generation)].copy()
    if "precision" in d:  # an FP8 run is no evidence for a bf16 plan (its MFU is over the BF16 peak), nor v.v.
        d = d[d["precision"] == precision]
    if not len(d):
        return []
    ratio = d["published"].to_numpy(float) / d["predicted"].to_numpy(float)
    ratio = np.where(d["metric"].astype(str).str.endswith("_s"), 1.0 / ratio, ratio)
    scale = (d["peak_tflops"].to_numpy(float) * 1e12 / peak_flops) if peak_flops and "peak_tflops" in d else 1.0
    d["pred_mfu"] = d["pred_mfu"].to_numpy(float) * scale
    d["published_mfu"] = d["pred_mfu"].to_numpy(float) * ratio
    d["distance"] = (np.abs(np.log(d["params_b"].to_numpy(float) * 1e9 / model.n_params))
                     + np.log(2.0) * ((d["family"] != family).astype(float) + (d["kernels"] != kernels).astype(float)))
    d = d.sort_values("distance").head(n)
    return [{"table": r.table, "row": r.row, "model": r.model, "params_b": float(r.params_b), "n_gpus": int(r.n_gpus),
             "seq_len": int(r.seq_len), "family": r.family, "kernels": r.kernels, "layout": r.layout,
             "precision": getattr(r, "precision", "bf16"),
             "published_mfu": float(r.published_mfu), "predicted_mfu": float(r.pred_mfu),
             "err_pct": float(r.err_pct)} for r in d.itertuples()]


def fp8_speedups(df: pd.DataFrame) -> pd.DataFrame:
    """FP8 ÷ bf16 throughput per published pair (same table, model, layout and kernels): published vs predicted
    ratio — the number an FP8 decision needs. From the torchtitan tables (NeMo publishes FP8 only)."""
    d = df[(df["metric"] != "memory_gib") & df["in_mape"]]
    if "precision" not in d:
        return pd.DataFrame()
    out = []
    for key, g in d.groupby(["table", "model", "layout", "kernels"], sort=False):
        base = g[g["precision"] == "bf16"]
        if len(base) != 1:
            continue
        for r in g[g["precision"] != "bf16"].itertuples():
            pub, pred = r.published / base["published"].iloc[0], r.predicted / base["predicted"].iloc[0]
            out.append({"table": key[0], "model": key[1], "layout": key[2], "recipe": r.precision,
                        "published_ratio": pub, "predicted_ratio": pred, "err_pct": 100.0 * (pred / pub - 1.0)})
    return pd.DataFrame(out)


def family_bias(df: pd.DataFrame) -> pd.DataFrame:
    """Bias and MAPE (%) per (generation, family class) over scored throughput rows (FSDP/ZeRO, TP, PP, CP)."""
    d = df[df["in_mape"] & (df["metric"] != "memory_gib")]
    g = d.groupby(["generation", "family"], sort=True)["err_pct"]
    return pd.DataFrame({"rows": g.size(), "bias_pct": g.mean(), "mape_pct": g.apply(lambda e: float(e.abs().mean())),
                         "worst_abs_pct": g.apply(lambda e: float(e.abs().max()))}).reset_index()


def main(argv: list[str] | None = None) -> int:
    """``python -m trainplan.published.validate --fit [--write]``: refit each generation's Efficiency, print it with its
    standard errors and the MAPE per table; ``--write`` stores the fits in trainplan/data/efficiency_fits.json."""
    import argparse

    ap = argparse.ArgumentParser(prog="python -m trainplan.published.validate",
                                 description="Fit one Efficiency per GPU generation on the open published set.",
                                 epilog="example: python -m trainplan.published.validate --fit --write")
    ap.add_argument("--fit", action="store_true", help="refit every generation (default: print the shipped fits)")
    ap.add_argument("--write", action="store_true", help="with --fit: write trainplan/data/efficiency_fits.json")
    a = ap.parse_args(argv)
    if a.fit and a.write:
        fits = write_fits()
    elif a.fit:
        fits = {g: fit_generation(g) for g in GEN_FIT}
    else:
        fits = generation_fits()
    for gen, f in fits.items():
        vals = {**f["values"], **f.get("hardware", {})}
        print(f"{gen}: fitted on {', '.join(f['fitted_on'])}")
        for p, v in vals.items():
            print(f"  {p:22s} {float(v):11.4g} ± {float(f['stderr'].get(p, float('nan'))):.3g}")
    print(mape_table(validate_all()).round(1).to_string(index=False))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
