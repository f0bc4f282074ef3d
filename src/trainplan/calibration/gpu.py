"""Calibration on GPU proxy runs: predict every CUDA record from its full run spec, fit the Efficiency to them.

* :func:`record_specs` / :func:`analytic_record` — rebuild ModelSpec, ClusterSpec (one node of the record's
  GPU), TrainingSpec and Layout from a ``records.csv`` row (``proxy.aggregate`` carries the full model and
  layout) and run the analytic model on it (``timing.step_time``, ``memory.memory_breakdown``).
* :func:`fit_gpu_time` — the time parameters (``gemm_eff_max``, ``attn_eff``, ``membound_eff``; ``comm_bw_eff``
  only when the scale-out ladder spans more than one GPU count) fitted to the records' median step times
  (log error, scipy ``least_squares``, bounded), leave-one-out error per record, and bootstrap samples of the
  parameters from resampling each record's timed step times.
* :func:`fit_gpu_memory` — allocator fragmentation from ``cuda_max_reserved_bytes`` against the predicted
  state and dynamic bytes; the runtime overhead outside the caching allocator from ``nvidia-smi`` samples
  when the device script recorded them.
* :func:`calibrate_gpu` — both, with notes on what each number rests on (the ``gpu-proxies`` source).

CPU records never enter here: their step times say nothing about a GPU (DESIGN §2).
"""

from __future__ import annotations

import json
import math
from collections.abc import Sequence
from dataclasses import replace
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from trainplan.calibration.fitting import FitResult, fit_curve, fit_efficiency
from trainplan.model.arch import ModelSpec
from trainplan.model.base import ConfigError
from trainplan.model.efficiency import Efficiency
from trainplan.model.hardware import GPUS, ClusterSpec
from trainplan.model.layout import Layout
from trainplan.model.memory import (
    activation_kwargs,
    memory_breakdown,
    reserved_bytes,
    residual_bytes,
    rope_table_bytes,
    saved_activation_bytes_per_layer,
)
from trainplan.model.timing import step_time
from trainplan.model.training import TrainingSpec
from trainplan.proxy.aggregate import aggregate
from trainplan.proxy.schema import RUN_DEFAULTS, uses_autocast

TIME_PARAMS = ("gemm_eff_max", "attn_eff", "membound_eff")  # identified by 1-GPU depth/width runs
COMM_PARAM = "comm_bw_eff"  # needs a scale-out ladder over more than one GPU count
BOUNDS = {"gemm_eff_max": (0.05, 1.0), "attn_eff": (0.05, 1.0), "membound_eff": (0.05, 1.0),
          "comm_bw_eff": (0.05, 1.0)}
FALLBACK_GPU = "h100-sxm-80gb"
# What torch.cuda.max_memory_allocated sees: the memory terms without the runtime overhead and fragmentation.
ALLOCATED_TERMS = ("weights", "gradients", "optimizer", "activations", "logits", "buffers")


# ------------------------------------------------------------------------------------------ specs
def gpu_for_device(device_name: Any) -> tuple[str, str]:
    """The ``specs.GPUS`` key for a CUDA device name (``torch.cuda.get_device_name``), and a note if guessed."""
    n = str(device_name or "").upper()
    if "H200" in n:
        return "h200-141gb", ""
    if "H100" in n:
        if "PCIE" in n:
            return "h100-pcie-80gb", ""
        if "NVL" in n:
            return "h100-pcie-80gb", f"{device_name!r} (H100 NVL) predicted as h100-pcie-80gb"
        return "h100-sxm-80gb", ""
    if "A100" in n:
        return "a100-80gb", "" if "80GB" in n else f"{device_name!r} predicted as a100-80gb (HBM size may differ)"
    return FALLBACK_GPU, (f"unknown GPU {device_name!r}: predicted as {FALLBACK_GPU}; its peak FLOP/s and HBM "
                          "bandwidth may be wrong, so the fitted fractions are too")


def _get(row: Any, key: str, default: Any = None) -> Any:
    v = row.get(key, default) if hasattr(row, "get") else default
    if v is None or (isinstance(v, float) and math.isnan(v)):
        return default
    return v.item() if hasattr(v, "item") else v


def _model(row: Any) -> ModelSpec:
    mj = _get(row, "model_json")
    if isinstance(mj, str) and mj:
        return ModelSpec.from_dict(json.loads(mj))
    need = ("layers", "hidden", "heads", "vocab")
    missing = [k for k in need if _get(row, k) is None]
    if missing:
        raise ConfigError(f"records.{missing[0]}", None, "a GPU record needs the full model spec (model_json, or "
                          "layers/hidden/heads/kv_heads/ffn_hidden/vocab columns from proxy.aggregate)")
    return ModelSpec(name=str(_get(row, "model", "proxy")), layers=int(_get(row, "layers")),
                     hidden=int(_get(row, "hidden")), heads=int(_get(row, "heads")),
                     kv_heads=None if _get(row, "kv_heads") is None else int(_get(row, "kv_heads")),
                     ffn_hidden=None if _get(row, "ffn_hidden") is None else int(_get(row, "ffn_hidden")),
                     vocab=int(_get(row, "vocab")), mlp=str(_get(row, "mlp", "swiglu")),
                     tied_embeddings=bool(_get(row, "tied_embeddings", False)),
                     max_seq_len=max(int(_get(row, "seq_len", 4096)), 4096))


def _layout(row: Any) -> Layout:
    lj = _get(row, "layout_json")
    if isinstance(lj, str) and lj:
        return Layout.from_dict(json.loads(lj))
    return Layout.from_row({k: v for k, v in dict(row).items() if v is not None and v == v})


def record_specs(row: Any) -> tuple[ModelSpec, ClusterSpec, TrainingSpec, Layout, list[str]]:
    """ModelSpec, ClusterSpec (nnodes × the record's GPUs), TrainingSpec, Layout of one record, and notes.

    The TrainingSpec says what the harness runs: eager kernels (``compiled`` with ``compile``), SDPA flash
    attention (the kernel the record's FLOP counter saw: :func:`record_attn_kernel`), its save-every-matmul SAC
    policy (``sac_policy='matmul'``), DTensor SP (``sp_impl='pytorch'``) and how bf16 reaches the weights
    (``bf16_via``: autocast over fp32 parameters on one rank or dp = 1, :func:`precision_regime`).
    """
    model, layout = _model(row), harness_layout(_layout(row))
    key, note = gpu_for_device(_get(row, "gpu_name"))
    world = int(_get(row, "world_size", layout.world_size) or layout.world_size)
    nnodes = max(1, int(_get(row, "nnodes", 1)))
    cluster = ClusterSpec(nodes=nnodes, gpus_per_node=max(1, world // nnodes), gpu=GPUS[key])
    targets = str(_get(row, "lora_targets", "") or "")
    training = harness_training(
        seq_len=int(_get(row, "seq_len")), global_batch=int(_get(row, "global_batch")),
        dtype=str(_get(row, "dtype", "bf16")), layout=_layout(row), cluster=cluster,
        compile=str(_get(row, "compile", False)).lower() in ("true", "1"), attn_kernel=_get(row, "attn_kernel", ""),
        # an ingested production log ran the production stack's code, not the harness's block
        model_impl="production" if _get(row, "family") == "production" else str(_get(row, "model_impl") or "trainplan"),
        optimizer_impl=str(_get(row, "optimizer_impl") or "foreach"),
        # a row without adapters' settings ran the harness's defaults (proxy.schema.RUN_DEFAULTS)
        finetune=str(_get(row, "finetune", "full")),
        lora_rank=int(_get(row, "lora_rank") or RUN_DEFAULTS["lora_rank"]),
        lora_targets=tuple(t for t in targets.split(",") if t) or tuple(RUN_DEFAULTS["lora_targets"]))
    return model, cluster, training, layout, [note] if note else []


def harness_layout(layout: Layout) -> Layout:
    """The layout as the harness ran it: ``proxy.parallelize`` applies FSDP2 or DDP only with dp > 1, so a dp = 1
    record ran unsharded (no gathered units, no copy-out, no reduce-scatter) whatever sharding its spec names."""
    if layout.dp == 1 and layout.sharding != "none" and layout.offload == "none":
        return replace(layout, sharding="none", shard_group=None)
    return layout


def harness_training(*, seq_len: int, global_batch: int, dtype: str, layout: Layout, cluster: ClusterSpec,
                     compile: bool = False, attn_kernel: Any = "", model_impl: str = "trainplan",
                     optimizer_impl: str = "foreach", **finetune: Any) -> TrainingSpec:
    """The TrainingSpec of a proxy-harness run (the GPU check's and the preflight's one convention): eager kernels
    (``compiled`` with ``compile``), SDPA flash attention with the kernel the run dispatched
    (:func:`record_attn_kernel`), the save-every-matmul SAC policy, DTensor SP, autocast over fp32 weights where
    no FSDP runs (``proxy.schema.uses_autocast``), and the harness's own block code (``block_impl='harness'``;
    ``model_impl='hf'``: transformers' Llama, and ``'production'``: an ingested production log, the kernel class's),
    and PyTorch's default AdamW on CUDA (``optimizer_impl='foreach'``; an ingested log says which it ran).
    ``finetune``: finetune, lora_rank, lora_targets."""
    return TrainingSpec(seq_len=seq_len, global_batch=global_batch, precision="bf16" if dtype == "bf16" else "fp32",
                        kernels="compiled" if compile else "eager", attn_impl="flash", sac_policy="matmul",
                        sp_impl="pytorch", attn_kernel=record_attn_kernel({"attn_kernel": attn_kernel}, cluster),
                        bf16_via="autocast" if uses_autocast(layout, dtype) else "bf16_params",
                        block_impl="harness" if model_impl == "trainplan" else "auto",
                        optimizer_impl=optimizer_impl, **finetune)


def record_attn_kernel(row: Any, cluster: ClusterSpec) -> str:
    """The flash kernel a record ran (``attn_kernel`` from proxy.aggregate: cuDNN's or FlashAttention-2), as a
    ``training.attn_kernel``; ``fa2`` when unrecorded or off Hopper (cuDNN's rate was measured on Hopper only)."""
    k = str(_get(row, "attn_kernel", "") or "")
    return "cudnn" if k == "cudnn" and cluster.gpu.generation == "h100" else "fa2"


def _step_time_s(specs: tuple[ModelSpec, ClusterSpec, TrainingSpec, Layout], eff: Any) -> float:

    return float(step_time(*specs, eff)["step_time_s"])


def analytic_record(row: Any, eff: Any) -> tuple[float, float]:
    """(step_time_s, peak_bytes) the analytic model predicts for one proxy record (timing.step_time, memory)."""

    m, c, t, lay, _ = record_specs(row)
    return _step_time_s((m, c, t, lay), eff), float(memory_breakdown(m, c, t, lay, eff)["total"])


# ---------------------------------------------------------------------------------------- records
def gpu_records(records: pd.DataFrame | None) -> pd.DataFrame:
    """The ok CUDA rows with a positive median step time (what the time fit may use)."""
    if records is None or not len(records) or "device" not in records.columns:
        return pd.DataFrame()
    ok = records["device"].astype(str).str.startswith("cuda")
    if "status" in records.columns:
        ok &= records["status"].astype(str) == "ok"
    if "step_time_median_s" not in records.columns:
        return records[ok].iloc[0:0]
    ok &= pd.to_numeric(records["step_time_median_s"], errors="coerce").fillna(0) > 0
    return records[ok].reset_index(drop=True)


def load_gpu_records(directory: str | Path | None) -> tuple[pd.DataFrame, list[str]]:
    """Committed GPU RECORDs (``<dir>/*.json``, not ``environment.json``) flattened like records.csv.

    ``<id>.nvsmi.csv`` beside a record (``nvidia-smi`` memory.used samples in MiB, written by
    ``scripts/device_proxies.sh``) adds ``device_used_peak_bytes``.
    """
    if not directory or not Path(directory).is_dir():
        return pd.DataFrame(), []

    files = sorted(str(p) for p in Path(directory).glob("*.json")
                   if p.name != "environment.json" and not p.name.endswith((".provenance.json", ".spec.json")))
    if not files:
        return pd.DataFrame(), []
    df = aggregate(files)
    peaks = []
    for f in files:
        smi = Path(f).with_suffix(".nvsmi.csv")
        peaks.append(_nvsmi_peak_bytes(smi) if smi.exists() else None)
    df["device_used_peak_bytes"] = peaks
    df["records_from"] = str(directory)
    return df, files


def _nvsmi_peak_bytes(path: Path) -> float | None:
    """Largest ``memory.used`` (MiB, first GPU column) in an nvidia-smi CSV sample file, in bytes."""
    vals = []
    for line in path.read_text(encoding="utf-8", errors="replace").splitlines():
        tok = line.split(",")[0].strip().split(" ")[0]
        try:
            vals.append(float(tok))
        except ValueError:
            continue
    return max(vals) * 1024**2 if vals else None


def _timed_steps(row: Any) -> np.ndarray:
    sj = _get(row, "step_times_json")
    if isinstance(sj, str) and sj:
        return np.asarray(json.loads(sj), dtype=float)
    return np.empty(0)


# ------------------------------------------------------------------------------------------- time
def time_params(records: pd.DataFrame) -> list[str]:
    """The fitted subset: TIME_PARAMS, plus comm_bw_eff when the scale-out ladder has >1 GPU counts."""
    params = list(TIME_PARAMS)
    if "family" in records.columns and "world_size" in records.columns:
        ladder = records[records["family"] == "scaleout"]["world_size"]
        if ladder.nunique() > 1 and ladder.max() > 1:
            params.append(COMM_PARAM)
    return params


def _log_pred(specs: Sequence[Any], eff0: Any, names: Sequence[str], p: np.ndarray) -> np.ndarray:
    e = eff0.replace(**dict(zip(names, map(float, p), strict=True)))
    return np.log([_step_time_s(s, e) for s in specs])


def _jacobian(specs: Sequence[Any], eff0: Any, names: Sequence[str], p: np.ndarray, lo: np.ndarray) -> np.ndarray:
    """d log(step time) / d parameter at ``p`` (forward differences, stepping away from the lower bound)."""
    base = _log_pred(specs, eff0, names, p)
    J = np.empty((len(specs), len(p)))
    for j in range(len(p)):
        h = 1e-4 * max(abs(p[j]), 1e-3)
        q = p.copy()
        q[j] = p[j] - h if p[j] - h > lo[j] else p[j] + h
        J[:, j] = (_log_pred(specs, eff0, names, q) - base) / (q[j] - p[j])
    return J


def bootstrap_step_times(fit: FitResult, specs: Sequence[Any], steps: Sequence[np.ndarray], eff0: Any,
                         *, bounds: tuple[np.ndarray, np.ndarray], n_boot: int, seed: int) -> tuple[np.ndarray, str]:
    """Parameter samples: resample each record's timed step times (or, lacking them, the records), take the
    medians, and refit by one Gauss–Newton step from the fit (Efron & Tibshirani 1993 §6; linearised refit)."""
    rng = np.random.default_rng(seed)
    lo, hi = np.asarray(bounds[0], float), np.asarray(bounds[1], float)
    J = _jacobian(specs, eff0, fit.param_names, fit.params, lo)
    resid = fit.y - _log_pred(specs, eff0, fit.param_names, fit.params)
    out = np.empty((n_boot, len(fit.params)))
    by_steps = all(len(s) >= 3 for s in steps)
    for b in range(n_boot):
        if by_steps:
            yb = np.log([np.median(s[rng.integers(0, len(s), len(s))]) for s in steps])
            Jb, rb = J, resid + (yb - fit.y)
        else:
            idx = rng.integers(0, len(fit.y), len(fit.y))
            Jb, rb = J[idx], resid[idx]
        out[b] = np.clip(fit.params + np.linalg.lstsq(Jb, rb, rcond=None)[0], lo, hi)
    return out, "per-record timed step times" if by_steps else "records (pairs; no step times in records.csv)"


def fit_gpu_time(records: pd.DataFrame, eff0: Any, params: Sequence[str], *, n_boot: int = 200,
                 seed: int = 0) -> dict[str, Any]:
    """Fit ``params`` to the records' median step times; LOO error per record; bootstrap samples."""
    rows = [r for _, r in records.iterrows()]
    specs = [record_specs(r)[:4] for r in rows]
    measured = records["step_time_median_s"].to_numpy(float)
    bnd = {k: BOUNDS.get(k, (1e-3, 1.0)) for k in params}
    eff, fit = fit_efficiency(specs, measured, _step_time_s, eff0, params, bounds=bnd, name="efficiency[gpu-proxies]")
    lo, hi = np.array([bnd[k][0] for k in params]), np.array([bnd[k][1] for k in params])
    samples, how = bootstrap_step_times(fit, specs, [_timed_steps(r) for r in rows], eff0, bounds=(lo, hi),
                                        n_boot=n_boot, seed=seed)
    pred = np.exp(_log_pred(specs, eff0, params, fit.params))
    # loo residual = log(measured/predicted) of a fit without that record → throughput error = exp(r) − 1
    tput_err = np.exp(fit.loo_residuals) - 1.0 if len(fit.loo_residuals) else np.empty(0)
    per_record = [{"id": str(_get(r, "id", i)), "family": str(_get(r, "family", "")), "gpu": str(_get(r, "gpu_name", "")),
                   "step_time_measured_s": float(measured[i]), "step_time_predicted_s": float(pred[i]),
                   "rel_err": float(pred[i] / measured[i] - 1.0),
                   "loo_throughput_rel_err": float(tput_err[i]) if len(tput_err) else None}
                  for i, r in enumerate(rows)]
    return {"efficiency": eff, "fit": fit, "throughput_rel_errors": tput_err, "per_record": per_record,
            "samples": [dict(zip(params, map(float, s), strict=True)) for s in samples], "bootstrap": how}


# ----------------------------------------------------------------------------------------- memory
def _reserved_model(dynamic: Any, intercept_bytes: float, alloc_frag_frac: float) -> Any:
    """Reserved − model states = c + (1 + frag)·dynamic peak (memory.reserved_bytes, with an intercept c)."""
    return intercept_bytes + (1.0 + alloc_frag_frac) * dynamic


# two parameters (intercept, alloc_frag_frac); leave-one-out needs n > p + 1 (calibrate.fit_curve), so with
# fewer records the fit would carry no held-out error and calibration.json no memory interval evidence
MIN_MEMORY_RECORDS = 4


def _reserved_records(records: pd.DataFrame) -> pd.DataFrame:
    if "cuda_max_reserved_bytes" not in records.columns:
        return records.iloc[0:0]
    return records[pd.to_numeric(records["cuda_max_reserved_bytes"], errors="coerce").fillna(0) > 0]


def memory_skip_reason(records: pd.DataFrame) -> str:
    """Why :func:`fit_gpu_memory` returns None for these records ('' when it fits)."""
    n = len(_reserved_records(records))
    if n < MIN_MEMORY_RECORDS:
        return (f"memory overhead not fitted: {n} CUDA records with max reserved bytes (need {MIN_MEMORY_RECORDS} "
                "or more: 2 parameters and a leave-one-out error)")
    return ("memory overhead not fitted: the records' predicted dynamic bytes are all equal, so fragmentation "
            "cannot be told from the intercept")


def fit_gpu_memory(records: pd.DataFrame, eff: Any) -> dict[str, Any] | None:
    """alloc_frag_frac (and the allocator-visible intercept) from max reserved vs predicted bytes; the
    runtime overhead outside the allocator from nvidia-smi's peak minus reserved, when sampled.

    None (reason: :func:`memory_skip_reason`) with fewer than ``MIN_MEMORY_RECORDS`` records with max
    reserved bytes, or when their predicted dynamic bytes do not vary."""

    rec = _reserved_records(records)
    if len(rec) < MIN_MEMORY_RECORDS:
        return None
    states, dyn = [], []
    for _, r in rec.iterrows():
        bd = memory_breakdown(*record_specs(r)[:4], eff)
        states.append(sum(float(bd[k]) for k in ("weights", "gradients", "optimizer")))
        dyn.append(sum(float(bd[k]) for k in ("activations", "logits", "buffers")))
    reserved = rec["cuda_max_reserved_bytes"].to_numpy(float)
    x, y = np.asarray(dyn), reserved - np.asarray(states)
    if np.ptp(x) <= 0:
        return None
    fit = fit_curve(_reserved_model, x, y, [float(np.median(y - x)), 0.05],
                    names=("intercept_bytes", "alloc_frag_frac"), name="reserved_vs_predicted",
                    bounds=([-np.inf, 0.0], [np.inf, 1.0]))
    out: dict[str, Any] = {"fit": fit.to_dict(), "alloc_frag_frac": float(fit.params[1]),
                           "intercept_bytes": float(fit.params[0]),
                           "reserved_rel_errors": (-fit.loo_residuals / reserved).tolist()
                           if len(fit.loo_residuals) == len(reserved) else []}
    if "device_used_peak_bytes" in rec.columns:
        used = pd.to_numeric(rec["device_used_peak_bytes"], errors="coerce").to_numpy(float)
        ws = pd.to_numeric(rec.get("world_size", pd.Series(1, index=rec.index)), errors="coerce").to_numpy(float)
        ok = np.isfinite(used) & (ws == 1)  # one process on the GPU: nvidia-smi sees only this run
        if ok.any():
            outside = float(np.median(used[ok] - reserved[ok]))
            out["outside_allocator_bytes"] = outside
            out["runtime_overhead_bytes"] = max(0.0, outside + max(float(fit.params[0]), 0.0))
            out["runtime_overhead_n"] = int(ok.sum())
    return out


# ------------------------------------------------------------------------------------------ stage
def source_label(records: pd.DataFrame) -> str:
    """``gpu-proxies (device: NVIDIA H200; 8 runs[, from data/calibration/gpu])``."""
    names = sorted({str(n) for n in records.get("gpu_name", pd.Series(dtype=str)).dropna()}) or ["unknown GPU"]
    where = sorted({str(d) for d in records.get("records_from", pd.Series(dtype=str)).dropna()})
    tail = f", from {', '.join(where)}" if where else ""
    return f"gpu-proxies (device: {', '.join(names)}; {len(records)} runs{tail})"


def calibrate_gpu(records: pd.DataFrame, eff0: Any, cfg: dict[str, Any]) -> tuple[dict[str, Any] | None, str]:
    """The gpu-proxies calibration, or (None, why not). ``cfg``: the calibration section."""
    gpu = gpu_records(records)
    if len(gpu) < 2:
        return None, f"{len(gpu)} ok CUDA records with a step time (need 2 or more)"
    notes: list[str] = []
    try:
        for _, r in gpu.iterrows():
            notes += record_specs(r)[4]
    except ConfigError as e:
        return None, f"a record cannot be rebuilt into specs ({e})"
    params = time_params(gpu)
    while len(gpu) <= len(params) and len(params) > 1:
        notes.append(f"{params[-1]} not fitted: {len(gpu)} records cannot identify {len(params)} parameters")
        params.pop()
    if len(gpu) <= len(params):
        return None, f"{len(gpu)} CUDA records cannot identify {params}"
    if COMM_PARAM not in params:
        notes.append(f"{COMM_PARAM} not fitted (no scale-out ladder over more than one GPU count): stays at the prior")
    t = fit_gpu_time(gpu, eff0, params, n_boot=int(cfg.get("bootstrap", 200)), seed=int(cfg.get("seed", 0)))
    eff = t["efficiency"]
    mem = fit_gpu_memory(gpu, eff)
    mem_fields: list[str] = []
    if mem is not None:
        eff = eff.replace(alloc_frag_frac=mem["alloc_frag_frac"])
        mem_fields.append("alloc_frag_frac")
        if "runtime_overhead_bytes" in mem:
            eff = eff.replace(runtime_overhead_bytes=mem["runtime_overhead_bytes"])
            mem_fields.append("runtime_overhead_bytes")
        else:
            notes.append("runtime_overhead_bytes not fitted: CUDA context and NCCL buffers sit outside the caching "
                         "allocator (not in max_reserved); needs nvidia-smi samples of 1-GPU runs")
    else:
        notes.append(memory_skip_reason(gpu))
    label = source_label(gpu)
    gpus = {gpu_for_device(n)[0] for n in gpu.get("gpu_name", pd.Series(dtype=str)).dropna()}
    if gpus - {"h100-sxm-80gb"}:
        notes.append(f"records ran on {', '.join(sorted(gpus))}: the fitted efficiencies are fractions of that "
                     "GPU's peak FLOP/s and HBM bandwidth, carried over to the production GPU as fractions")
    f = t["fit"]
    return {"label": label, "efficiency": eff, "params": list(params), "memory_params": mem_fields,
            "fit": {**f.to_dict(), "fitted_on": label}, "per_record": t["per_record"],
            "throughput_rel_errors": [float(v) for v in t["throughput_rel_errors"]],
            "samples": t["samples"], "bootstrap": t["bootstrap"], "memory": mem, "notes": notes,
            "n": int(len(gpu))}, ""


# ------------------------------------------------------------------------------------------ check
def precision_regime(row: Any) -> str:
    """How the harness ran bf16, as ``proxy.run`` decides it: ``autocast`` over fp32 parameters when nothing is
    sharded or there is one data-parallel rank (no FSDP is applied then: a bf16 copy of each weight is made, and
    saved for backward, per micro-batch), else FSDP2's ``MixedPrecisionPolicy`` (bf16 parameters all-gathered,
    fp32 reduction); ``fp32`` without bf16."""
    dtype = str(_get(row, "dtype", "bf16"))
    if dtype != "bf16":
        return "fp32"
    return "autocast" if uses_autocast(_layout(row), dtype) else "fsdp2-mp"


def check_gpu_records(records: pd.DataFrame) -> pd.DataFrame:
    """Each ok CUDA record predicted by the *shipped* fit of its GPU's generation (nothing fitted on the records).

    One row per record: the step time, ``torch.cuda.max_memory_allocated`` (the model's bytes: states, saved
    activations, logits, buffers), ``max_memory_reserved`` (those plus the caching allocator's fragmentation,
    ``alloc_frag_frac``) and the saved activations of one block (``saved_tensors_hooks``, exact) measured and
    predicted; the throughput error (measured/predicted step time − 1, i.e. predicted/measured tokens/s − 1: + means
    the model is optimistic), the memory errors (predicted/measured − 1), and the precision regime the harness ran
    (:func:`precision_regime`).
    The committed H200 records (``data/calibration/h200-2026-12-04``) are checked this way by
    ``trainplan validate --gpu-records``; docs/timing-model.md §7.9–7.10 read the result.
    """
    gpu = gpu_records(records)
    rows = []
    for _, r in gpu.iterrows():
        model, cluster, training, layout, _ = record_specs(r)
        eff = Efficiency.for_gpu(cluster.gpu)
        t_pred = float(step_time(model, cluster, training, layout, eff)["step_time_s"])
        t_meas = float(r["step_time_median_s"])
        res_meas = float(pd.to_numeric(_get(r, "cuda_max_reserved_bytes", math.nan), errors="coerce") or math.nan)
        bd = memory_breakdown(model, cluster, training, layout, eff)
        res_pred = float(reserved_bytes(bd, eff))
        alloc_meas = float(pd.to_numeric(_get(r, "cuda_max_allocated_bytes", math.nan), errors="coerce") or math.nan)
        alloc_pred = float(sum(np.asarray(bd[k], dtype=float) for k in ALLOCATED_TERMS))
        layer_meas = float(pd.to_numeric(_get(r, "saved_act_bytes_meas", math.nan), errors="coerce") or math.nan)
        layer_pred = float(saved_activation_bytes_per_layer(model, training.seq_len, layout.micro_batch,
                                                            recompute=layout.recompute,
                                                            **activation_kwargs(training, layout)))
        if model.layers == 1:  # the tracker books a storage one module alone uses to it: the RoPE tables too
            layer_pred += rope_table_bytes(model, training.seq_len, residual_bytes(training))
        rows.append({"id": str(_get(r, "id")), "family": str(_get(r, "family", "")), "gpu": cluster.gpu.name,
                     "generation": cluster.gpu.generation, "regime": precision_regime(r),
                     "attn_kernel": training.attn_kernel,
                     "layers": model.layers, "hidden": model.hidden, "seq_len": training.seq_len,
                     "global_batch": training.global_batch, "step_time_measured_s": t_meas,
                     "step_time_predicted_s": t_pred, "throughput_err": t_meas / t_pred - 1.0,
                     "reserved_measured_bytes": res_meas, "reserved_predicted_bytes": res_pred,
                     "reserved_err": res_pred / res_meas - 1.0 if res_meas > 0 else math.nan,
                     "allocated_measured_bytes": alloc_meas, "allocated_predicted_bytes": alloc_pred,
                     "allocated_err": alloc_pred / alloc_meas - 1.0 if alloc_meas > 0 else math.nan,
                     "saved_layer_measured_bytes": layer_meas, "saved_layer_predicted_bytes": layer_pred})
    return pd.DataFrame(rows)


def summarize_gpu_check(check: pd.DataFrame) -> pd.DataFrame:
    """MAPE, bias and worst error (fractions) of throughput, and MAPE and bias of max allocated and max reserved
    memory, for all records and per family; the largest |predicted − measured| saved bytes of one block."""
    out = []
    groups = [("all", check)] + [(f, g) for f, g in check.groupby("family", sort=True)]
    for name, g in groups:
        t = g["throughput_err"].to_numpy(float)
        row = {"family": name, "n": len(g), "throughput_mape": float(np.mean(np.abs(t))),
               "throughput_bias": float(np.mean(t)), "throughput_worst": float(t[np.argmax(np.abs(t))])}
        for k in ("reserved", "allocated"):
            m = g[f"{k}_err"].dropna().to_numpy(float) if f"{k}_err" in g else np.empty(0)
            row[f"{k}_mape"] = float(np.mean(np.abs(m))) if len(m) else math.nan
            row[f"{k}_bias"] = float(np.mean(m)) if len(m) else math.nan
        d = (g["saved_layer_predicted_bytes"] - g["saved_layer_measured_bytes"]).dropna().abs() \
            if "saved_layer_measured_bytes" in g else pd.Series(dtype=float)
        row["saved_layer_max_abs_err_bytes"] = float(d.max()) if len(d) else math.nan
        out.append(row)
    return pd.DataFrame(out)


# ------------------------------------------------------------------ the production precision regime on one GPU
BF16_STEP_FILE = "microbench/bf16_step.json"  # benchmarks/bench_bf16_step.py, in a GPU session's directory


def check_bf16_steps(path: str | Path) -> pd.DataFrame:
    """``benchmarks/bench_bf16_step.py``'s timings predicted by the shipped fit: the forward and backward of one
    micro-batch of the harness's model with bf16 parameters (no autocast, no optimizer, no accumulation), i.e.
    ``step_time``'s ``compute_s`` at dp = 1 with one micro-batch, in the precision regime of every production plan,
    eager kernels and the attention kernel the profiler saw. One row per (sequence, depth); ``throughput_err`` as in
    :func:`check_gpu_records` (+ = the model is optimistic). ``layer_err``: the same for the per-layer slope, from the
    shallowest to the deepest run at that sequence length (what the blocks alone cost)."""
    doc = json.loads(Path(path).read_text())
    key, _ = gpu_for_device(doc["environment"]["device_name"])
    cluster = ClusterSpec(nodes=1, gpus_per_node=1, gpu=GPUS[key])
    eff = Efficiency.for_gpu(cluster.gpu)
    layout = Layout(dp=1, sharding="none")
    rows = []
    for r in doc["results"]:
        model = ModelSpec.from_dict(r["model"])
        kernel = "cudnn" if "cudnn" in r["attention_kernels"] else "flash"
        training = replace(harness_training(seq_len=int(r["seq_len"]), global_batch=1, dtype="bf16", layout=layout,
                                            cluster=cluster, attn_kernel=kernel), bf16_via="bf16_params")
        pred = float(step_time(model, cluster, training, layout, eff)["compute_s"])
        rows.append({"gpu": key, "seq_len": int(r["seq_len"]), "layers": int(r["layers"]), "hidden": model.hidden,
                     "attn_kernel": training.attn_kernel, "measured_s": float(r["median_s"]), "predicted_s": pred,
                     "throughput_err": float(r["median_s"]) / pred - 1.0})
    df = pd.DataFrame(rows)
    df["layer_err"] = math.nan
    for _, g in df.groupby("seq_len"):
        lo, hi = g.loc[g["layers"].idxmin()], g.loc[g["layers"].idxmax()]
        if hi["layers"] > lo["layers"]:
            df.loc[g.index, "layer_err"] = ((hi["measured_s"] - lo["measured_s"])
                                            / (hi["predicted_s"] - lo["predicted_s"]) - 1.0)
    return df


def summarize_bf16_steps(check: pd.DataFrame) -> dict[str, Any]:
    """MAPE, bias and range of the throughput errors, and the range of the per-layer slope errors."""
    t = check["throughput_err"].to_numpy(float)
    lay = check.drop_duplicates("seq_len")["layer_err"].dropna().to_numpy(float)
    return {"n": len(t), "throughput_mape": float(np.mean(np.abs(t))), "throughput_bias": float(np.mean(t)),
            "throughput_min": float(t.min()), "throughput_max": float(t.max()),
            "layer_err_min": float(lay.min()) if len(lay) else math.nan,
            "layer_err_max": float(lay.max()) if len(lay) else math.nan,
            "seq_lens": sorted(int(s) for s in set(check["seq_len"])),
            "layers": sorted(int(n) for n in set(check["layers"])),
            "attn_kernels": sorted(set(check["attn_kernel"]))}
