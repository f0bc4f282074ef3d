"""The open published tables (package data ``trainplan/data/``, citations in its SOURCES.md), each row turned into
(model, cluster, training, layout) with the facts the source states and predicted with one Efficiency per GPU
generation (no per-row tuning). What a source does not state is a named assumption below. Rows the model
cannot speak to are shown but left out of the MAPE; torch.compile rows are modelled with ``kernels="compiled"``
(docs/timing-model.md). The fit on these rows is ``published.fit``.
"""

from __future__ import annotations

from dataclasses import replace
from functools import cache
from importlib import resources
from typing import Any

import numpy as np
import pandas as pd

from trainplan.model import flops, memory, timing
from trainplan.model.arch import ModelSpec, resolve_model
from trainplan.model.base import ConfigError, GiB
from trainplan.model.efficiency import Efficiency, generation_fits
from trainplan.model.hardware import (
    ClusterSpec,
    DGX_INTER_BUSBW_GBps,
    DGX_INTRA_BUSBW_GBps,
    GPUSpec,
    resolve_gpu,
)
from trainplan.model.layout import Layout, layout_problems
from trainplan.model.training import TrainingSpec
from trainplan.published.intervals import family_class  # noqa: F401  (re-exported)

TABLES = ("megatron2021_t1", "narayanan2021_t2", "korthikanti2022_t3_5", "torchtitan_a100", "torchtitan_h100",
          "torchtitan_asynctp_h100", "megatron2024_h100", "llama3_405b_h100", "nemo2407_h100", "nemo_longseq_h100")
# The GPU generation each table ran on: its rows are predicted with (and fit) that generation's Efficiency.
TABLE_GENERATION = {"megatron2021_t1": "a100", "narayanan2021_t2": "a100", "korthikanti2022_t3_5": "a100",
                    "torchtitan_a100": "a100",
                    "torchtitan_h100": "h100", "torchtitan_asynctp_h100": "h100", "megatron2024_h100": "h100",
                    "llama3_405b_h100": "h100", "nemo2407_h100": "h100", "nemo_longseq_h100": "h100"}
# Tables no fit ever sees: NeMo's Transformer Engine FP8 runs (a recipe the torchao-fitted FP8 efficiency does not
# describe). ``trainplan validate --heldout`` scores them apart, per table and family class.
NEVER_FITTED = ("nemo2407_h100", "nemo_longseq_h100")

# --- clusters the sources ran on --------------------------------------------------------------------------
# Selene (Narayanan 2021 §5.1): DGX A100 nodes, NVLink3/NVSwitch, 8 × 200 Gb/s HDR InfiniBand per node.
# Bus bandwidths [I]: 8×A100 NVLink3 ring ≈ 230 GB/s (300 GB/s each way × 0.77, a round ratio a little below the
# 0.80 the default H100 figure is of its 450, 360/450: no A100 nccl-tests reading is in the open set; the A100 fit's
# comm_bw_eff, at its bound 1.0 ± 0.17, says the rows need no less); per-rail HDR ≈ 23 GB/s (200 Gb/s line rate ×
# 0.92, the ratio 46/50 seen on 400G, SOURCES).
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
ROCE_RAIL_BUSBW_Bps = DGX_INTER_BUSBW_GBps * 1e9  # 400 Gb/s per GPU rail (SOURCES: nccl-tests #290, #309); Meta's RoCE [I]
H100_INTRA_BUSBW_Bps = DGX_INTRA_BUSBW_GBps * 1e9  # 8×H100 NVLink4 ring (the planner's default, hardware.py)
# Micro-batch for Narayanan 2021 Table 1 is not published: 1 sequence (the paper's §5.x default for PP) [I].
MEGATRON_T1_MICRO_BATCH = 1
# torchtitan at 9dec370 (the benchmark's commit) splits each rank's local batch into
# ``pipeline_parallel_microbatches or pp`` micro-batches (torchtitan/parallelisms/pipelining_utils.py
# build_pipeline_schedule; the benchmark sets none), so a micro-batch holds local_batch/pp sequences (405B T5:
# 32/8 = 4, 8 micro-batches; T6: 8/8 = 1). Later torchtitan (2025: ``pipeline_parallel_microbatch_size``, default 1)
# splits into micro-batches of one sequence; that is not the code these rows ran.
GPT_VOCAB = 51200  # both Megatron papers: V = 51,200 (SOURCES.md)
GPT_SEQ = 2048
# Kernels per framework (TrainingSpec.kernels / attn_impl; docs/timing-model.md): Megatron-LM 2021/2022
# ran hand-fused kernels (fused LayerNorm, bias-GeLU, bias-dropout-add, scale-mask-softmax) and
# materialised attention (flash attention postdates both papers); torchtitan without compile runs PyTorch
# eager ops with SDPA flash attention; torchtitan with compile is Inductor-fused.
MEGATRON_KERNELS = {"kernels": "fused", "attn_impl": "math"}
# torchtitan's own blocks: nn.RMSNorm (one fused kernel on CUDA), not Hugging Face's fp32-upcast RMSNorm
TORCHTITAN_EAGER = {"kernels": "eager", "attn_impl": "flash", "logits_at_backward": "freed",  # train.py: del pred
                    "norm_impl": "fused"}
TORCHTITAN_COMPILED = {"kernels": "compiled", "attn_impl": "flash", "logits_at_backward": "freed"}
# The fitted hardware parameter of torchtitan's 500 W parts: their sustained peak as a fraction of 989 TFLOP/s,
# bounded by the bracket the TorchTitan paper states (H100 NVL 835 – SXM 989).
TT500_PARAM = "h100_500w_peak_frac"


def load_table(name: str) -> pd.DataFrame:
    """A CSV from the package data folder (trainplan/data): a fresh copy of the table parsed once per process (a
    refit evaluates every table thousands of times; parsing was a ninth of ``validate --heldout``)."""
    return _parsed_table(name).copy()


@cache
def _parsed_table(name: str) -> pd.DataFrame:
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


# Narayanan 2021 Table 2 (§5.2): PTD-P against DeepSpeed's ZeRO-3 without model parallelism, same global batch,
# GPT-3 175B (Brown 2020, Table 2.1: 96 layers, d_model 12,288, 96 heads; our count 174.6B = the table's) and the
# 530B model of Table 1 (read from that table). Not stated [I]: PTD-P's model-parallel size is TP8 (one node, as every
# Table 1 row with ≥ 8-way model parallelism) × the rest in PP, 1F1B, micro-batch 1 (Table 1's); full recompute for
# both schemes (the paper's TFLOP/s formula counts it). The ZeRO-3 rows are shown and left out of the MAPE: their step
# time stays constant as the GPU count doubles at a fixed batch (144 → 88 → 44 TFLOP/s per GPU), i.e. DeepSpeed
# 2021's ZeRO-3 collectives reached ~16 GB/s per GPU, a tenth of NCCL's multi-rail bus bandwidth that the FSDP term
# models (docs/timing-model.md §7.8); that framework's communication is not modelled.
T2_GPT3_175B = (96, 12288, 96)


def narayanan2021_t2(eff: Efficiency) -> list[dict]:
    """Narayanan 2021 Table 2: PTD-P (scored) vs DeepSpeed ZeRO-3 (shown, out of scope), TFLOP/s per GPU."""
    rows = []
    a100 = resolve_gpu("a100-80gb")
    t1 = load_table("megatron_narayanan2021_table1_weak_scaling_A100.csv").set_index("params_billion")
    for r in load_table("megatron_narayanan2021_table2_zero3_vs_ptd_A100.csv").itertuples():
        if r.params_billion in t1.index:
            s = t1.loc[r.params_billion]
            layers, hidden, heads = int(s.num_layers), int(s.hidden_size), int(s.attention_heads)
        else:
            layers, hidden, heads = T2_GPT3_175B
        m = _gpt(layers, hidden, heads, f"gpt-{r.params_billion}B")
        c = _cluster(r.num_gpus, a100, A100_INTRA_BUSBW_Bps, HDR_RAIL_BUSBW_Bps)
        t = TrainingSpec(seq_len=GPT_SEQ, global_batch=int(r.global_batch_size), **MEGATRON_KERNELS)
        zero3 = r.scheme == "ZeRO-3"
        if zero3:
            lay = Layout(dp=int(r.num_gpus), sharding="zero3", recompute="full", micro_batch=int(r.microbatch_size))
        else:
            tp = 8
            lay = Layout(dp=int(r.num_gpus) // int(r.model_parallel_size), tp=tp, pp=int(r.model_parallel_size) // tp,
                         sharding="none", recompute="full", micro_batch=int(r.microbatch_size))
        f = flops.narayanan_flops_per_iteration(t.global_batch, GPT_SEQ, m.layers, m.hidden, GPT_VOCAB)
        rows.append(_predict("narayanan2021_t2", f"{r.scheme} {r.params_billion}B {lay.describe()}", "tflops_per_gpu",
                             r.tflops_per_gpu, m, c, t, lay, eff, in_mape=not zero3,
                             extra="DeepSpeed 2021 ZeRO-3 communication: not modelled" if zero3 else "",
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


def torchtitan_h100(eff: Efficiency, h100_peak_flops: float | None = None, memory_rows: bool = True) -> list[dict]:
    """torchtitan H100 (2024-12): tokens/s/GPU and (``memory_rows``) peak reserved GiB; float8 / async-TP rows not
    modelled here (async TP is scored on its own table; float8 is issue FP8)."""
    part = _h100_part(h100_peak_flops)
    rows = []
    for r in load_table("torchtitan_h100_202412.csv").itertuples():
        m = resolve_model(r.model.lower())
        seq = int(str(r.seq_len).rstrip("*"))
        c = _cluster(r.num_gpus, part, H100_INTRA_BUSBW_Bps, ROCE_RAIL_BUSBW_Bps)
        gb = int(r.local_batch) * int(r.fsdp)
        compiled = r.compile == "yes"
        t = TrainingSpec(seq_len=seq, global_batch=gb, precision="fp8-tensorwise" if r.float8 == "yes" else "bf16",
                         **(TORCHTITAN_COMPILED if compiled else TORCHTITAN_EAGER))
        interleaved = str(r.pp_schedule).startswith("Interleaved")
        lay = Layout(dp=int(r.fsdp), tp=int(r.tp), pp=int(r.pp), cp=int(r.cp), sp=int(r.tp) > 1,
                     pp_schedule="interleaved" if interleaved else "1f1b", vpp=2 if interleaved else 1,
                     tp_overlap=r.async_tp == "yes" and int(r.tp) > 1, sharding="zero3",
                     recompute=_ac(r.activation_ckpt),
                     micro_batch=int(r.local_batch) // int(r.pp))
        unmodelled: list[str] = []
        ok = not unmodelled
        extra = ("not modelled: " + ", ".join(unmodelled)) if unmodelled else ""
        # compile's saves are modelled (memory.saved_activation_bytes_per_layer(compiled=...)); float8's are not
        # (torchao's casts and amax buffers): the float8 rows' memory is shown only
        mem_ok = ok and r.float8 != "yes"
        label = f"T{r.table} {m.name} {lay.describe()}"
        rows.append(_predict("torchtitan_h100", label, "tokens_per_s_per_gpu", r.tps_per_gpu, m, c, t, lay, eff,
                             in_mape=ok, extra=extra))
        if not memory_rows:
            continue
        # torchtitan logs torch.cuda max reserved: the caching allocator only (no CUDA context / NCCL).
        mem = memory.reserved_bytes(memory.memory_breakdown(m, c, t, lay, eff), eff)
        mem_note = _note(m, c, t, lay, extra if not ok else ("float8 memory not modelled" if r.float8 == "yes" else ""))
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
        c = _cluster(r.gpus, part, H100_INTRA_BUSBW_Bps, ROCE_RAIL_BUSBW_Bps)
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
        c = _cluster(r.num_gpus, h100, H100_INTRA_BUSBW_Bps, ROCE_RAIL_BUSBW_Bps)
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
        c = _cluster(r.gpus, h100, H100_INTRA_BUSBW_Bps, ROCE_RAIL_BUSBW_Bps)
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
        c = _cluster(r.gpus, gpu, H100_INTRA_BUSBW_Bps if h100 else A100_INTRA_BUSBW_Bps,
                     ROCE_RAIL_BUSBW_Bps if h100 else HDR_RAIL_BUSBW_Bps)
        tp = 8 if "TP8" in r.parallelism else 1
        dp = int(r.gpus) // tp
        seq = int(r.seq_len_default_cfg)
        opt = str(r.optimizations)
        # Async TP needs torch.compile. Not stated for the Float8 row [I: compiled]: torchao's casts unfused in eager
        # (timing.FP8_CAST_BYTES_EAGER) would leave ~1.2x over the bf16 row, not the published 1.62x, and adding
        # compile + async TP to an eager run would gain more than the 4.5% the third row shows.
        t = TrainingSpec(seq_len=seq, global_batch=int(r.local_batch) * dp,
                         precision="fp8-tensorwise" if "Float8" in opt else "bf16",
                         **(TORCHTITAN_COMPILED if "Float8" in opt else TORCHTITAN_EAGER))
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
        c = _cluster(r.num_gpus, h100, H100_INTRA_BUSBW_Bps, ROCE_RAIL_BUSBW_Bps)
        t = TrainingSpec(seq_len=int(r.seq_len), global_batch=int(r.gbs), kernels="fused", attn_impl="flash",
                         precision="fp8-tensorwise", finetune="lora" if lora else "full", lora_rank=NEMO_LORA_RANK,
                         lora_targets=("q", "k", "v"))
        lay = Layout(dp=dp, tp=tp, pp=pp, cp=cp, sp=tp > 1, tp_overlap=tp > 1,
                     pp_schedule="interleaved" if vp > 1 else "1f1b", vpp=vp, sharding="zero1", recompute="none",
                     micro_batch=int(r.mbs))
        rows.append(_predict("nemo2407_h100", f"{r.task} {r.model} {lay.describe()}", "tokens_per_s_per_gpu",
                             r.tokens_per_s_per_gpu, m, c, t, lay, eff))
    return rows


# NeMo 24.03.01 long-sequence performance (performance_long_sequence.md; Llama 2 7B, DGX H100, FP8 with Transformer
# Engine): the with-CP configuration of each sequence length (4K–1M tokens on as many GPUs as K tokens), TFLOP/s per
# GPU in NeMo's model-FLOPs count (flops.nemo_llama_model_flops_per_token: the formula reproduces NeMo 24.07's
# columns to 0.1%). Held out of every fit, like nemo2407_h100. The "without CP" column is not scored: its
# configurations are not published ("best achievable within the memory capacity"). Not stated [I]: micro-batch 1,
# global batch 128 sequences (NeMo 24.07's Llama 2 7B pre-training recipe), ZeRO-1 (distributed optimizer), no
# activation recompute, SP and TP comm overlap with TP, 1F1B at PP2, bf16 attention, TE's CP as a ring (p2p).
NEMO_LONGSEQ_GLOBAL_BATCH = 128


def nemo_longseq_h100(eff: Efficiency) -> list[dict]:
    """NeMo long-sequence Llama 2 7B FP8 (4K–1M tokens, CP up to 32) on H100 SXM: TFLOP/s per GPU, held out."""
    rows = []
    h100 = resolve_gpu("h100-sxm-80gb")
    m = resolve_model("llama2-7b")
    for r in load_table("nemo_long_sequence_llama2_7b_H100_fp8.csv").itertuples():
        seq = int(r.seq_len_k) * 1024
        tp, pp, dp, cp = int(r.cp_tp), int(r.cp_pp), int(r.cp_dp), int(r.cp_cp)
        c = _cluster(r.num_gpus, h100, H100_INTRA_BUSBW_Bps, ROCE_RAIL_BUSBW_Bps)
        t = TrainingSpec(seq_len=seq, global_batch=NEMO_LONGSEQ_GLOBAL_BATCH, kernels="fused", attn_impl="flash",
                         precision="fp8-tensorwise")
        lay = Layout(dp=dp, tp=tp, pp=pp, cp=cp, sp=tp > 1, tp_overlap=tp > 1, sharding="zero1", recompute="none",
                     micro_batch=1)
        f_tok = flops.nemo_llama_model_flops_per_token(m, seq)
        rows.append(_predict("nemo_longseq_h100", f"{r.seq_len_k}K {lay.describe()}", "tflops_per_gpu",
                             r.tflops_per_gpu_with_cp, m, c, t, lay, eff,
                             convert=lambda tim, f=f_tok: tim["tokens_per_s_per_gpu"] * f / 1e12))
    return rows


def _effs(eff: Efficiency | dict[str, Efficiency] | None) -> dict[str, Efficiency]:
    """Per-generation Efficiency: one object for every table, a {generation: Efficiency} dict, or the fits."""
    if isinstance(eff, Efficiency):
        return {g: eff for g in set(TABLE_GENERATION.values())}
    d = dict(eff or {})
    return {g: d.get(g) or Efficiency.for_gpu(g) for g in set(TABLE_GENERATION.values())}


def validate_all(eff: Efficiency | dict[str, Efficiency] | None = None, *, h100_peak_flops: float | None = None,
                 tables: tuple[str, ...] = TABLES, memory_rows: bool = True) -> pd.DataFrame:
    """Every comparable published row: table, row, metric, published, predicted, err_pct, in_mape, note,
    generation, family, kernels, model, params_b, n_gpus, seq_len, pred_mfu, layout.

    ``eff``: one Efficiency for all rows, or one per GPU generation (default: the fitted generation sets,
    ``Efficiency.for_gpu``). ``h100_peak_flops`` scores torchtitan's 500 W H100 rows at that peak (default:
    the fitted clock fraction of those parts × 989 TFLOP/s; ``--h100-peak-tflops`` in the CLI). ``memory_rows=False``
    leaves out the rows whose metric is memory (a throughput fit never reads them; they were a third of its time).
    """
    e = _effs(eff)
    peak = _tt_peak(h100_peak_flops)
    a, h = e["a100"], e["h100"]
    fns = {"megatron2021_t1": lambda: megatron2021_t1(a), "narayanan2021_t2": lambda: narayanan2021_t2(a),
           "korthikanti2022_t3_5": lambda: korthikanti2022_t3_5(a),
           "torchtitan_h100": lambda: torchtitan_h100(h, peak, memory_rows),
           "torchtitan_a100": lambda: torchtitan_a100(a, peak, h),
           "torchtitan_asynctp_h100": lambda: torchtitan_asynctp_h100(h, peak),
           "megatron2024_h100": lambda: megatron2024_h100(h), "llama3_405b_h100": lambda: llama3_405b_h100(h),
           "nemo2407_h100": lambda: nemo2407_h100(h), "nemo_longseq_h100": lambda: nemo_longseq_h100(h)}
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
