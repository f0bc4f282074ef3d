"""The calibrate rule: which source sets the analytic model's Efficiency, and the held-out report.

Calibration sources (:func:`choose_source`): ``gpu-proxies`` (device=cuda records from the user's cluster) beat
``published-h100`` (bundled torchtitan H100 table) beat the shipped per-generation fit of the published open set
(``published-open-set``) and ``defaults``. CPU proxy records calibrate only device-independent terms (bytes,
FLOPs, communication volume), never H100 time.
"""

from __future__ import annotations

import json
import math
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from trainplan.calibration.fitting import (
    bootstrap_params,
    cpu_only,
    fit_efficiency,
    relative_errors,
)
from trainplan.calibration.gpu import (
    BF16_STEP_FILE,
    calibrate_gpu,
    check_bf16_steps,
    check_gpu_records,
    load_gpu_records,
    summarize_bf16_steps,
    summarize_gpu_check,
)
from trainplan.model.efficiency import Efficiency, generation_fits
from trainplan.published.fit import FIT_PARAMS, GEN_FIT, scored_rows, throughput_rel_errors
from trainplan.published.intervals import heldout_errors_by_family  # noqa: F401  (re-exported)
from trainplan.published.tables import NEVER_FITTED, TABLE_GENERATION, mape_table, validate_all


# ----------------------------------------------------------------------------------------- sources
def choose_source(records_df: pd.DataFrame | None, published_df: pd.DataFrame | None) -> str:
    """Which measurements calibrate H100 *time*: GPU proxies, else published H100 rows, else defaults.

    CPU proxy records never count here: their timings say nothing about an H100 (DESIGN §2).
    """
    if records_df is not None and len(records_df) and "device" in records_df.columns:
        ok = records_df["device"].astype(str).str.startswith("cuda")
        if "status" in records_df.columns:
            ok &= records_df["status"].astype(str) == "ok"
        if int(ok.sum()) >= 2:
            return "gpu-proxies"
    if published_df is not None and len(published_df):
        return "published-h100"
    return "defaults"



# ------------------------------------------------------------------------------------ orchestration
# ``published-h100``: gemm_eff_max alone, refitted on the bf16 rows of torchtitan's H100 table (the rows and
# their specs are published.tables': one loader, one mapping). More parameters are not identified by that table.
H100_SOURCE_TABLE = "torchtitan_h100"
H100_SOURCE_PARAMS = ("gemm_eff_max",)


def published_h100_cases(eff0: Any) -> tuple[pd.DataFrame, Callable[[Any, Any], float]]:
    """The scored bf16 throughput rows of torchtitan's H100 table (``row``, ``tps_per_gpu``) and a predictor
    ``(row, Efficiency) -> tokens/s/GPU`` through ``published.tables`` (one table evaluation per Efficiency)."""

    def evaluate(eff: Any) -> pd.DataFrame:
        df = validate_all({"h100": eff, "a100": eff}, tables=(H100_SOURCE_TABLE,))
        return df[df["metric"] == "tokens_per_s_per_gpu"].reset_index(drop=True)

    rows = evaluate(eff0)
    cache: dict[Any, np.ndarray] = {eff0: rows["predicted"].to_numpy(float)}  # eff0's table is evaluated once

    def table(eff: Any) -> np.ndarray:  # predicted tokens/s/GPU, in the table's row order
        if eff not in cache:
            if len(cache) >= 64:
                cache.pop(next(iter(cache)))
            cache[eff] = evaluate(eff)["predicted"].to_numpy(float)
        return cache[eff]

    rows = rows[rows["in_mape"] & (rows["precision"] == "bf16")]
    pub = pd.DataFrame({"pos": rows.index.to_numpy(), "row": rows["row"].to_numpy(),
                        "tps_per_gpu": rows["published"].to_numpy(float)})
    return pub, lambda r, eff: float(table(eff)[int(r["pos"])])


def calibrate(published_df: pd.DataFrame, *, eff0: Any, params: Sequence[str],
              predict_published: Callable[[Any, Any], float],
              bounds: dict[str, tuple[float, float]] | None = None,
              published_target: str = "tps_per_gpu", n_boot: int = 50, seed: int = 0) -> dict[str, Any]:
    """The ``published-h100`` fit: Efficiency ``params`` fitted to published rows through ``predict_published``,
    with goodness of fit, leave-one-out errors and bootstrap samples (GPU proxy records: ``calibration.gpu``)."""
    out: dict[str, Any] = {"source": "published-h100", "params": list(params), "seed": seed, "n_boot": n_boot,
                           "fits": {}, "efficiency": eff0.to_dict() if hasattr(eff0, "to_dict") else None,
                           "efficiency_samples": [], "loo_relative_errors": []}
    cases = [r for _, r in published_df.iterrows()]
    if len(cases) > len(params):
        measured = published_df[published_target].to_numpy(float)
        eff, fit = fit_efficiency(cases, measured, predict_published, eff0, params, bounds=bounds)
        out["efficiency"] = eff.to_dict() if hasattr(eff, "to_dict") else dict(zip(params, fit.params, strict=True))
        out["fits"]["efficiency"] = fit.to_dict()
        out["loo_relative_errors"] = relative_errors(fit).tolist()
        samples = bootstrap_params(fit, n_boot=n_boot, seed=seed)
        out["efficiency_samples"] = [dict(zip(params, map(float, s), strict=True)) for s in samples]
    return out


# ---------------------------------------------------------------------------- Snakemake stage glue
# ``open-set``: the Efficiency defaults, fitted on the published A100 open set (validate.fit_defaults,
# docs/timing-model.md §7), checked on the held-out torchtitan H100 rows. What ``auto`` resolves to when no
# GPU proxy ran: CPU records never calibrate time.
OPEN_SET = "published-open-set"


def _throughput_rel_errors(df: pd.DataFrame) -> np.ndarray:
    """predicted/measured − 1 of *throughput* per published row (time metrics inverted)."""
    return throughput_rel_errors(scored_rows(df))


def open_set_report(eff: Any, generation: str | None = None) -> tuple[dict[str, Any], pd.DataFrame, np.ndarray, np.ndarray]:
    """Fits (per fitted Efficiency field: value, stderr, R² of log throughput, MAPE, n), MAPE per table, errors.

    ``heldout``: one row per published table and metric, ``role`` = fit (``generation``'s parameters were fitted
    on it), ``other generation`` or held out; ``mape`` and ``bias`` are fractions; ``loto_mape`` the error when
    that table is left out of its generation's fit (shipped in efficiency_fits.json; ``trainplan validate --heldout``
    recomputes it). The errors (predicted/measured − 1) are those of every scored throughput row, and of the
    published peak memory rows.
    """
    gen = generation if generation in GEN_FIT else "a100"
    rows = validate_all({gen: eff})
    m = mape_table(rows)
    fit_tables = GEN_FIT[gen]["tables"]
    heldout = pd.DataFrame({"table": m["table"], "metric": m["metric"], "n": m["rows"],
                            "mape": m["mape_pct"] / 100.0, "bias": m["bias_pct"] / 100.0,
                            # NeMo's TE FP8 tables: no fit ever sees them (validate's role column says the same)
                            "role": np.where(m["table"].isin(fit_tables), "fit",
                                             np.where(m["table"].isin(NEVER_FITTED), "never fitted",
                                                      np.where(m["table"].map(TABLE_GENERATION) == gen, "held out",
                                                               "other generation")))})
    loto: dict[str, list[float]] = {}
    for f in generation_fits().values():
        for r in f.get("heldout", []):
            loto.setdefault(r["table"], []).append(abs(float(r["err_pct"])) / 100.0)
    heldout["loto_mape"] = [float(np.mean(loto[t])) if t in loto and mt != "memory_gib" else np.nan
                            for t, mt in zip(heldout["table"], heldout["metric"], strict=True)]
    fit_rows = scored_rows(rows)
    fit_rows = fit_rows[fit_rows["table"].isin(fit_tables)]
    lp, lm = np.log(fit_rows["predicted"].to_numpy(float)), np.log(fit_rows["published"].to_numpy(float))
    r2 = 1.0 - float(((lm - lp) ** 2).sum()) / float(((lm - lm.mean()) ** 2).sum())
    mape = float(np.mean(np.abs(_throughput_rel_errors(fit_rows))))
    loo = float(np.mean([v for t in fit_tables for v in loto.get(t, [])] or [np.nan]))
    shipped = generation_fits().get(gen) or {}
    fits = {p: {"value": float(getattr(eff, p)), "stderr": shipped.get("stderr", {}).get(p), "r2": r2,
                "loo_mape": loo, "mape": mape, "n": len(fit_rows), "fitted_on": "+".join(fit_tables),
                "loo": "leave one published table out"} for p in GEN_FIT[gen]["params"] if hasattr(eff, p)}
    mem = rows[rows["in_mape"] & (rows["metric"] == "memory_gib")]
    mem_rel = mem["predicted"].to_numpy(float) / mem["published"].to_numpy(float) - 1.0
    return fits, heldout, _throughput_rel_errors(rows), mem_rel


def _memory_rel_errors(records: pd.DataFrame) -> list[float]:
    """predicted/measured − 1 of saved activation bytes per layer on ok CPU runs (device-independent).

    Per-rank state bytes are left out: the proxies run fp32 without a master copy and FSDP2's ZeRO-2 keeps
    parameters sharded at rest, so they measure a different quantity than the bf16 production peak.
    """
    ok = cpu_only(records) if len(records) else records
    out: list[float] = []
    for p, m in (("saved_act_bytes_pred", "saved_act_bytes_meas"),):
        if {p, m} <= set(ok.columns):
            d = ok[[p, m]].dropna()
            d = d[d[m] > 0]
            out += (d[p] / d[m] - 1.0).tolist()
    return out


def stage_calibrate(records: pd.DataFrame, eff0: Any, cfg: dict[str, Any],
                    generation: str | None = None) -> tuple[dict[str, Any], pd.DataFrame]:
    """calibration.json content and heldout.csv for the ``calibrate`` rule (``cfg``: the calibration section).

    Sources: ``gpu-proxies`` fits the time parameters to ok CUDA records (records.csv plus the committed
    ``calibration.gpu_records_dir``; ``trainplan.calibration.gpu``), falling back with a note when they cannot
    be used; ``published-h100`` refits ``gemm_eff_max`` on torchtitan's (500 W-capped) H100 rows; ``auto`` and
    ``published-open-set`` keep the Efficiency defaults fitted on the A100 open set (docs/timing-model.md §7);
    with config overrides of fitted fields the source is ``defaults``. Without GPU records the prediction
    interval uses the throughput errors of every in-scope published row (fitted A100 and held-out H100 alike).
    """
    if generation is None and str(getattr(eff0, "source", "")).startswith("fit:"):
        generation = str(eff0.source).split(":", 1)[1]
    # What "not overridden" means: the generation's shipped fit (the class defaults without a generation).
    baseline = type(eff0).for_gpu(generation) if generation in GEN_FIT else type(eff0)()
    fit_params = tuple(p for p in GEN_FIT.get(str(generation), GEN_FIT["a100"])["params"] if hasattr(eff0, p))

    requested = str(cfg.get("source", "auto"))
    notes: list[str] = []
    source = OPEN_SET
    eff = eff0
    extra: dict[str, Any] = {}
    gpu: dict[str, Any] | None = None
    committed, committed_files = load_gpu_records(cfg.get("gpu_records_dir"))
    pool = pd.concat([d for d in (records, committed) if len(d)], ignore_index=True) if len(committed) else records
    if requested in ("auto", "gpu-proxies"):
        if choose_source(pool, None) == "gpu-proxies":
            gpu, why = calibrate_gpu(pool, eff0, cfg)
            if gpu is None:
                notes.append(f"GPU proxy records present but not usable for the time fit ({why}); the open-set fit "
                             "is used")
        elif requested == "gpu-proxies":
            notes.append("source gpu-proxies requested, but fewer than 2 ok CUDA records exist (records.csv, "
                         f"{cfg.get('gpu_records_dir')}); the open-set fit is used")
    if gpu is not None:
        eff, source = gpu["efficiency"], "gpu-proxies"
        notes += gpu["notes"]
        if any(getattr(eff0, p) != getattr(baseline, p) for p in fit_params):
            notes.append("config overrides of fitted Efficiency fields were refitted to the GPU records")
    elif requested == "published-h100":
        pub, predict = published_h100_cases(eff0)
        extra = calibrate(pub, eff0=eff0, params=H100_SOURCE_PARAMS, predict_published=predict,
                          n_boot=int(cfg.get("bootstrap", 50)), seed=int(cfg.get("seed", 0)))
        eff = Efficiency.from_dict(extra["efficiency"])
        source = "published-h100"
        notes.append("fitted on torchtitan's H100 rows, which ran on 500 W power-capped parts")
    elif requested == "defaults" or any(getattr(eff0, p) != getattr(baseline, p) for p in fit_params):
        source = "defaults"
        notes.append("Efficiency from the config (overrides of fitted fields) or the uncalibrated defaults")
    fits, heldout, rel, mem_rel = open_set_report(eff, generation)
    proxy_mem_rel = _memory_rel_errors(records)
    by_family = heldout_errors_by_family(generation)
    if by_family and gpu is None and not extra:
        # The interval rests on leave-one-table-out errors of this GPU generation (per family class where a
        # family has enough rows: validate.error_pool), not on the in-sample errors of every table.
        rel = np.asarray([e for v in by_family.values() for e in v], dtype=float)
    doc: dict[str, Any] = {
        "source": source, "requested": requested, "notes": notes, "efficiency": eff.to_dict(),
        "fits": fits, "loo_relative_errors": rel.tolist(), "efficiency_samples": [],
        "memory_relative_errors": proxy_mem_rel + mem_rel.tolist(),
        "memory_error_sources": {CPU_MEMORY_SOURCE: len(proxy_mem_rel),
                                 "published memory readings": len(mem_rel)},
        "generation": generation, "heldout_errors_by_family": by_family,
        "heldout_coverage": (generation_fits().get(str(generation)) or {}).get("coverage"),
        "cpu_records": {"n": int(len(cpu_only(records))) if len(records) else 0,
                        "use": "bytes, FLOPs, communication volume and loss parity only; never H100 time"},
    }
    if extra:
        doc["fits"]["efficiency_h100"] = {"value": extra["efficiency"].get("gemm_eff_max"),
                                          **{k: extra["fits"]["efficiency"].get(k) for k in ("r2", "loo_mape", "n")}}
        doc["loo_relative_errors"] = extra["loo_relative_errors"] or doc["loo_relative_errors"]
        doc["efficiency_samples"] = extra["efficiency_samples"]
    if gpu is not None:
        _apply_gpu(doc, heldout, gpu, committed_files)
    check = gpu_check(cfg.get("gpu_check_dir"), fitted_dirs=[cfg.get("gpu_records_dir")] if gpu is not None else [])
    if check is not None:
        doc["gpu_check"] = check
        # Not fitted, but what the memory interval must cover: the model's error on our own GPU's peak reserved
        # memory (allocator fragmentation and kernel workspaces the terms do not count; what the preflight reads)
        own = [float(r["reserved_err"]) for r in check["records"]
               if r.get("reserved_err") is not None and math.isfinite(float(r["reserved_err"]))]
        if own:
            doc["memory_relative_errors"] = doc["memory_relative_errors"] + own
            names = check["environment"].get("device_names") or check["devices"]
            doc["memory_error_sources"][f"own {', '.join(names)} runs {GPU_PEAK_READING}"] = len(own)
    _peak_memory_pool(doc)
    doc["efficiency_sources"] = _efficiency_sources(eff, eff0, source, doc.get("source_detail"), gpu, baseline,
                                                    fit_params)
    return doc, heldout


CPU_MEMORY_SOURCE = "CPU proxy runs (saved activation bytes)"
# What a GPU source of peak-memory errors reads; every such source's name in ``memory_error_sources`` ends in it.
GPU_PEAK_READING = "(max reserved memory)"


def _peak_memory_pool(doc: dict[str, Any]) -> None:
    """Once GPU peak-memory readings (max reserved) are in the memory error pool, the CPU proxies' saved-activation
    checks leave it: they test one term, which they find exact, not the peak, and as exact zeros they pulled the
    interval's lower half onto the model's own figure. They stay reported (``memory_term_checks``). Without GPU
    readings they remain the pool's stand-in beside the published ones."""
    src = doc["memory_error_sources"]
    n_cpu = int(src.get(CPU_MEMORY_SOURCE, 0))
    if not n_cpu or not any(k.endswith(GPU_PEAK_READING) for k in src):
        return
    start = 0
    for k, n in src.items():  # the list holds each source's errors in the dict's order
        if k == CPU_MEMORY_SOURCE:
            break
        start += int(n)
    errs = doc["memory_relative_errors"]
    cpu = errs[start:start + n_cpu]
    doc["memory_relative_errors"] = errs[:start] + errs[start + n_cpu:]
    doc["memory_error_sources"] = {k: n for k, n in src.items() if k != CPU_MEMORY_SOURCE}
    doc["memory_term_checks"] = {CPU_MEMORY_SOURCE: {"n": n_cpu, "max_abs_err": max(abs(float(e)) for e in cpu)}}


def gpu_check(directory: Any, fitted_dirs: Sequence[Any] = ()) -> dict[str, Any] | None:
    """The memo's own-GPU check: the ok CUDA RECORDs in ``directory`` predicted by the shipped fit of their GPU's
    generation (``calibration.gpu.check_gpu_records``), or None without a directory, without ok records, or when
    the same directory was just fitted (``fitted_dirs``: then the check would not be one)."""
    if not directory or not Path(str(directory)).is_dir():
        return None
    if any(d and Path(str(d)).resolve() == Path(str(directory)).resolve() for d in fitted_dirs):
        return None
    records, _ = load_gpu_records(directory)
    check = check_gpu_records(records) if len(records) else pd.DataFrame()
    if not len(check):
        return None
    env_file = Path(str(directory)) / "environment.json"
    env = {}
    if env_file.is_file():
        e = json.loads(env_file.read_text())
        env = {k: e.get(k) for k in ("torch_version", "cuda_version", "nccl_version", "device_names", "git_commit",
                                     "alloc_conf")}
    out = {"dir": str(directory), "n": int(len(check)), "environment": env,
           "devices": sorted(set(check["gpu"])), "regimes": sorted(set(check["regime"])),
           "records": check.to_dict(orient="records"), "summary": summarize_gpu_check(check).to_dict(orient="records")}
    bf16 = Path(str(directory)) / BF16_STEP_FILE
    if bf16.is_file():  # the same session's production-regime timings (benchmarks/bench_bf16_step.py)
        steps = check_bf16_steps(bf16)
        out["bf16_steps"] = {"file": str(bf16), "records": steps.to_dict(orient="records"),
                             "summary": summarize_bf16_steps(steps)}
    return out


def _apply_gpu(doc: dict[str, Any], heldout: pd.DataFrame, gpu: dict[str, Any], files: list[str]) -> None:
    """Fold the gpu-proxies fit into calibration.json: fits, LOO errors, bootstrap samples, memory errors."""
    f = gpu["fit"]
    for p in gpu["params"]:
        doc["fits"][p] = {"value": float(doc["efficiency"][p]), "r2": f["r2"], "loo_mape": f["loo_mape"],
                          "stderr": f["stderr"][p], "n": f["n"], "fitted_on": gpu["label"]}
    mem = gpu["memory"]
    if mem is not None:
        for p in gpu["memory_params"]:
            doc["fits"][p] = {"value": float(doc["efficiency"][p]), "r2": mem["fit"]["r2"],
                              "loo_mape": mem["fit"]["loo_mape"], "n": mem["fit"]["n"], "fitted_on": gpu["label"]}
        doc["memory_relative_errors"] = mem["reserved_rel_errors"] + doc["memory_relative_errors"]
        doc["memory_error_sources"] = {f"fitted GPU runs, leave-one-out {GPU_PEAK_READING}":
                                       len(mem["reserved_rel_errors"]), **doc["memory_error_sources"]}
    doc["source_detail"] = gpu["label"]
    doc["loo_relative_errors"] = gpu["throughput_rel_errors"]
    doc["efficiency_samples"] = gpu["samples"]
    doc["gpu"] = {"n": gpu["n"], "params": gpu["params"], "bootstrap": gpu["bootstrap"],
                  "per_record": gpu["per_record"], "memory": mem, "records_files": files}
    heldout["role"] = "held out"  # the published tables check the GPU-calibrated model; none was fitted on


def _efficiency_sources(eff: Any, eff0: Any, source: str, detail: str | None,
                        gpu: dict[str, Any] | None, default: Any = None,
                        fit_params: tuple[str, ...] | None = None) -> dict[str, str]:
    """Where each Efficiency number came from: the GPU fit, the open-set fit of the generation, the config, or a
    prior (``default``: the generation's shipped fit; ``fit_params``: the fields that fit sets)."""
    fitted = set(gpu["params"]) | set(gpu["memory_params"]) if gpu else set()
    default = default if default is not None else type(eff0)()
    params = fit_params or FIT_PARAMS
    out = {}
    for k in eff.to_dict():
        if k == "source":
            continue
        if k in fitted:
            out[k] = detail or source
        elif getattr(eff0, k) != getattr(default, k):
            out[k] = "config (efficiency override)"
        elif source == "published-h100" and k == "gemm_eff_max":
            out[k] = "published-h100"
        elif k in params:
            out[k] = OPEN_SET
        else:
            out[k] = "prior (efficiency.py default, [I])"
    return out


# Scaling fits on CPU proxy records: device-independent quantities only (bytes, FLOPs, comm volume).
