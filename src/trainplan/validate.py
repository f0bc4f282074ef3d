"""Predicted vs published: the analytic model against Megatron, Korthikanti and torchtitan tables.

One :class:`Efficiency` for every row (no per-row tuning). Each published table is read from the package
data (``trainplan/data/``, citations in its SOURCES.md) and turned into (model, cluster, training, layout)
with the facts the source states; what a source does not state is a named assumption below.
Rows the model cannot speak to (torch.compile, float8, async TP) are shown but left out of the MAPE.
"""

from __future__ import annotations

from importlib import resources
from typing import Any

import numpy as np
import pandas as pd

from trainplan import flops, memory, timing
from trainplan.efficiency import Efficiency
from trainplan.specs import (
    ClusterSpec,
    GiB,
    GPUSpec,
    Layout,
    ModelSpec,
    TrainingSpec,
    layout_problems,
    resolve_gpu,
)

__all__ = ["validate_all", "mape_table", "load_table", "TABLES"]

TABLES = ("megatron2021_t1", "korthikanti2022_t3_5", "torchtitan_h100", "torchtitan_a100")

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
ROCE_RAIL_BUSBW_Bps = 46e9  # 400 Gb/s per GPU rail (SOURCES: nccl-tests #290, #309); Meta's RoCE fabric [I]
# Micro-batch for Narayanan 2021 Table 1 is not published: 1 sequence (the paper's §5.x default for PP) [I].
MEGATRON_T1_MICRO_BATCH = 1
# torchtitan splits each rank's local batch into micro-batches of 1 under PP (pipeline_parallel_microbatch_size).
TORCHTITAN_PP_MICRO_BATCH = 1
GPT_VOCAB = 51200  # both Megatron papers: V = 51,200 (SOURCES.md)
GPT_SEQ = 2048


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


def _row(table: str, label: str, metric: str, published: float, predicted: float, in_mape: bool, note: str) -> dict:
    return {"table": table, "row": label, "metric": metric, "published": float(published),
            "predicted": float(predicted), "err_pct": 100.0 * (predicted - published) / published,
            "in_mape": bool(in_mape), "note": note}


def _note(model: ModelSpec, cluster: ClusterSpec, training: TrainingSpec, layout: Layout, extra: str = "") -> str:
    why = layout_problems(model, cluster, training, layout)
    return "; ".join([x for x in [extra, *(["planner would reject: " + why[0]] if why else [])] if x])


def megatron2021_t1(eff: Efficiency) -> list[dict]:
    """Narayanan 2021 Table 1: TFLOP/s per GPU with the paper's F = 96·B·s·l·h²·(1 + s/6h + V/16lh)."""
    rows = []
    a100 = resolve_gpu("a100-80gb")
    for r in load_table("megatron_narayanan2021_table1_weak_scaling_A100.csv").itertuples():
        m = _gpt(r.num_layers, r.hidden_size, r.attention_heads, f"gpt-{r.params_billion}B")
        c = _cluster(r.num_gpus, a100, A100_INTRA_BUSBW_Bps, HDR_RAIL_BUSBW_Bps)
        t = TrainingSpec(seq_len=GPT_SEQ, global_batch=int(r.global_batch_size))
        dp = int(r.num_gpus) // (r.tensor_mp * r.pipeline_mp)
        lay = Layout(dp=dp, tp=int(r.tensor_mp), pp=int(r.pipeline_mp), sharding="none", recompute="full",
                     micro_batch=MEGATRON_T1_MICRO_BATCH)
        st = timing.step_time(m, c, t, lay, eff)["step_time_s"]
        f = flops.narayanan_flops_per_iteration(t.global_batch, GPT_SEQ, m.layers, m.hidden, GPT_VOCAB)
        rows.append(_row("megatron2021_t1", f"{r.params_billion}B {lay.describe()}", "tflops_per_gpu",
                         r.tflops_per_gpu, f / (st * c.n_gpus) / 1e12, True, _note(m, c, t, lay)))
    return rows


def korthikanti2022_t3_5(eff: Efficiency) -> list[dict]:
    """Korthikanti 2022 Tables 3/5: iteration time with full recompute, and with TP+SP+selective recompute."""
    rows = []
    a100 = resolve_gpu("a100-80gb")
    for r in load_table("korthikanti2022_tables3_5_A100.csv").itertuples():
        m = _gpt(r.num_layers, r.hidden_size, r.attention_heads, f"gpt-{r.model}")
        c = _cluster(r.num_gpus, a100, A100_INTRA_BUSBW_Bps, HDR_RAIL_BUSBW_Bps)
        t = TrainingSpec(seq_len=int(r.seq_len), global_batch=int(r.global_batch_size))
        dp = int(r.num_gpus) // (r.tp * r.pp)
        for col, sp, rc in (("iter_time_full_recompute_s", False, "full"),
                            ("iter_time_sp_plus_selective_s", True, "selective")):
            lay = Layout(dp=dp, tp=int(r.tp), pp=int(r.pp), sp=sp, sharding="none", recompute=rc,
                         micro_batch=int(r.micro_batch_size))
            st = timing.step_time(m, c, t, lay, eff)["step_time_s"]
            rows.append(_row("korthikanti2022_t3_5", f"{r.model} {lay.describe()}", "iter_time_s",
                             getattr(r, col), st, True, _note(m, c, t, lay)))
    return rows


def _ac(name: Any) -> str:
    """torchtitan activation_ckpt → our recompute (selective layer/op both → 'selective', a simplification)."""
    s = str(name)
    return "full" if s == "full" else ("none" if s in ("no", "none", "nan") else "selective")


def torchtitan_h100(eff: Efficiency) -> list[dict]:
    """torchtitan H100 (2024-12): tokens/s/GPU and peak reserved GiB; float8 / compile rows not modelled."""
    from trainplan.specs import resolve_model

    rows = []
    for r in load_table("torchtitan_h100_202412.csv").itertuples():
        m = resolve_model(r.model.lower().replace("llama", "llama"))
        seq = int(str(r.seq_len).rstrip("*"))
        c = _cluster(r.num_gpus, H100_96GB_500W, 360e9, ROCE_RAIL_BUSBW_Bps)
        gb = int(r.local_batch) * int(r.fsdp)
        t = TrainingSpec(seq_len=seq, global_batch=gb)
        lay = Layout(dp=int(r.fsdp), tp=int(r.tp), pp=int(r.pp), cp=int(r.cp), sp=int(r.tp) > 1,
                     pp_schedule="interleaved" if str(r.pp_schedule).startswith("Interleaved") else "1f1b",
                     vpp=2 if str(r.pp_schedule).startswith("Interleaved") else 1, sharding="zero3",
                     recompute=_ac(r.activation_ckpt),
                     micro_batch=TORCHTITAN_PP_MICRO_BATCH if int(r.pp) > 1 else int(r.local_batch))
        unmodelled = [x for x, on in (("compile", r.compile == "yes"), ("float8", r.float8 == "yes"),
                                      ("async TP", r.async_tp == "yes")) if on]
        ok = not unmodelled
        note = _note(m, c, t, lay, ("not modelled: " + ", ".join(unmodelled)) if unmodelled else "")
        tim = timing.step_time(m, c, t, lay, eff)
        mem = memory.memory_breakdown(m, c, t, lay, eff)["total"]
        label = f"T{r.table} {m.name} {lay.describe()}"
        rows.append(_row("torchtitan_h100", label, "tokens_per_s_per_gpu", r.tps_per_gpu, tim["tokens_per_s_per_gpu"],
                         ok, note))
        rows.append(_row("torchtitan_h100", label, "memory_gib", r.memory_gib, mem / GiB, ok, note))
    return rows


def torchtitan_a100(eff: Efficiency) -> list[dict]:
    """torchtitan docs/performance.md: 64×A100 FSDP (incl. Llama-2-13B 2162 tok/s/GPU) and 405B on H100."""
    from trainplan.specs import resolve_model

    rows = []
    names = {"Llama3-8B": "llama3-8b", "Llama3-70B": "llama3-70b", "Llama2-13B": "llama2-13b",
             "Llama2-70B": "llama2-70b", "Llama3.1-405B": "llama3.1-405b"}
    for r in load_table("torchtitan_a100_and_405b_docs_performance.csv").itertuples():
        m = resolve_model(names[r.model])
        h100 = str(r.gpu).startswith("H100")
        gpu = H100_96GB_500W if h100 else resolve_gpu("a100-80gb")
        c = _cluster(r.gpus, gpu, 360e9 if h100 else A100_INTRA_BUSBW_Bps,
                     ROCE_RAIL_BUSBW_Bps if h100 else HDR_RAIL_BUSBW_Bps)
        tp = 8 if "TP8" in r.parallelism else 1
        dp = int(r.gpus) // tp
        seq = int(r.seq_len_default_cfg)
        t = TrainingSpec(seq_len=seq, global_batch=int(r.local_batch) * dp)
        lay = Layout(dp=dp, tp=tp, sp=tp > 1, sharding="zero3", recompute=_ac(r.activation_ckpt),
                     micro_batch=int(r.local_batch))
        opt = str(r.optimizations)
        ok = opt in ("nan", "None", "")
        tim = timing.step_time(m, c, t, lay, eff)
        rows.append(_row("torchtitan_a100", f"{r.model} {r.gpus}×{r.gpu} {lay.describe()}", "tokens_per_s_per_gpu",
                         r.wps_per_gpu, tim["tokens_per_s_per_gpu"], ok,
                         _note(m, c, t, lay, "" if ok else "not modelled: " + opt)))
    return rows


def validate_all(eff: Efficiency | None = None) -> pd.DataFrame:
    """Every comparable published row: table, row, metric, published, predicted, err_pct, in_mape, note."""
    eff = eff or Efficiency()
    rows = megatron2021_t1(eff) + korthikanti2022_t3_5(eff) + torchtitan_h100(eff) + torchtitan_a100(eff)
    return pd.DataFrame(rows)


def mape_table(df: pd.DataFrame) -> pd.DataFrame:
    """MAPE (%) per (table, metric) over the rows the model speaks to."""
    d = df[df["in_mape"]]
    g = d.groupby(["table", "metric"], sort=False)["err_pct"]
    return pd.DataFrame({"mape_pct": g.apply(lambda e: float(np.mean(np.abs(e)))),
                         "bias_pct": g.mean(), "rows": g.size()}).reset_index()

