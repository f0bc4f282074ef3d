"""From calibration to the production run: predictions with intervals (the held-out checks of the published
tables are ``published.fit``: ``trainplan validate --heldout``).

* :func:`predict_production` — the top layouts of ``candidates.csv``: tokens/s, tokens/s/GPU, MFU and
  peak memory per GPU with p10/p50/p90 and the calibration source. The interval combines the bootstrap
  samples of the fitted Efficiency with the leave-one-out relative errors of the calibration; without samples
  (the shipped published fit) it is the predictive interval of the family's held-out errors, exactly.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np
import pandas as pd

from trainplan.model.arch import ModelSpec
from trainplan.model.efficiency import Efficiency
from trainplan.model.estimate import DEFAULT_MAX_MEM_FRAC
from trainplan.model.hardware import ClusterSpec
from trainplan.model.layout import Layout
from trainplan.model.memory import memory_breakdown
from trainplan.model.timing import step_time
from trainplan.model.training import TrainingSpec
from trainplan.published.fit import comparable_runs, error_pool, interval_bounds, predictive_error_draws
from trainplan.published.intervals import memory_pool_peaks
from trainplan.published.tables import family_class, validate_all
from trainplan.search.layouts import runner_up_row


# ------------------------------------------------------------------------------------ production
def predict_production(candidates: pd.DataFrame, model: ModelSpec, cluster: ClusterSpec, training: TrainingSpec,
                       calibration: dict[str, Any], *, top: int = 5, seed: int = 0,
                       quantiles: tuple[float, float] = (0.1, 0.9),
                       step_time_fn: Callable[..., dict[str, Any]] | None = None,
                       memory_fn: Callable[..., dict[str, Any]] | None = None,
                       max_hbm_frac: float = DEFAULT_MAX_MEM_FRAC) -> pd.DataFrame:
    """Top feasible layouts with p10/p50/p90 of tokens/s, tokens/s/GPU, MFU and peak memory per GPU; with how
    many of the memory model's errors would put each above usable HBM and above the search's limit
    (``max_hbm_frac`` of it)."""
    step_time_fn = step_time_fn or step_time
    memory_fn = memory_fn or memory_breakdown
    base = {k: v for k, v in (calibration.get("efficiency") or {}).items() if v is not None}
    eff = Efficiency.from_dict(base)
    samples = [eff.replace(**s) for s in calibration.get("efficiency_samples") or []] or [eff]
    rel_all = np.asarray(calibration.get("loo_relative_errors") or [0.0], dtype=float)
    by_family = calibration.get("heldout_errors_by_family") or {}
    mem_rel = np.asarray(calibration.get("memory_relative_errors") or [0.0], dtype=float)
    rng = np.random.default_rng(seed)  # the Monte Carlo throughput interval's draws (bootstrap samples only)
    exact = bool(by_family) and not calibration.get("gpu") and len(samples) == 1
    ql, qh = quantiles
    feas = candidates[candidates["feasible"].astype(bool)] if "feasible" in candidates.columns else candidates
    feas = feas.sort_values("rank") if "rank" in feas.columns else feas
    rows = []
    for _, r in feas.head(top).iterrows():
        layout = Layout.from_row(r)
        # Held-out errors of this layout's family class on the same GPU generation when calibration has them
        # (validate.error_pool); GPU-proxy calibration and the A100 set give one pool for every layout.
        rel = error_pool(by_family, family_class(layout)) if by_family and not calibration.get("gpu") else rel_all
        p50 = step_time_fn(model, cluster, training, layout, eff)
        tp_point, mfu_point = float(p50["tokens_per_s_per_gpu"]), float(p50["mfu"])
        if exact:
            # One Efficiency (no bootstrap samples) and a family pool: the throughput quantiles are the predictive
            # interval's own, exactly (interval_bounds: the interval `trainplan estimate` and `plan` print and whose
            # coverage `validate --heldout` measures), not a 2,000-draw estimate of it (~0.3% of Monte Carlo noise).
            lo, hi = interval_bounds(tp_point, rel, (ql, qh))
            ratio_q = np.array([lo, hi]) / tp_point
            tp_q, mfu_q = tp_point * ratio_q, mfu_point * ratio_q
        else:
            st = [step_time_fn(model, cluster, training, layout, e) for e in samples]
            tps = np.array([float(s["tokens_per_s_per_gpu"]) for s in st])
            mfu = np.array([float(s["mfu"]) for s in st])
            k = rng.integers(0, len(tps), size=2000)
            # measured = predicted / (1 + relative error); e from the small-sample predictive distribution of the
            # family pool, or resampled from the calibration's leave-one-out errors
            err = (predictive_error_draws(rel, 2000, rng) if by_family and not calibration.get("gpu")
                   else rng.choice(rel, size=2000))
            tp_q = np.quantile(tps[k] / (1.0 + err), [ql, qh])
            mfu_q = np.quantile(mfu[k] / (1.0 + err), [ql, qh])
        if memory_fn is not None:
            mem = float(memory_fn(model, cluster, training, layout, eff)["total"])
        else:
            mem = float(r["mem_total_gib"]) * 1024**3
        # Memory: the distribution-free predictive interval of the proxy runs' memory errors, no draws: a new
        # run falls below the k-th of n pool values with probability k/(n + 1) (numpy's "weibull" quantile). The
        # default study's pool is 15 exact zeros and four errors (two near −6%): 2,000 draws from it put p90 on
        # either side of that step, 66.9 or 70.1 GiB for two layouts of the same memory.
        mem_pool = memory_pool_peaks(mem, mem_rel)  # what each pool error would make the measured peak
        mem_q = np.quantile(mem_pool, [ql, qh], method="weibull")
        # how many of those errors would put the run above usable HBM (an OOM at the preflight): the count behind
        # a p90 above HBM, which the memo states instead of a negative headroom alone
        over = int(np.sum(mem_pool > cluster.gpu.hbm_bytes))
        over_limit = int(np.sum(mem_pool > max_hbm_frac * cluster.gpu.hbm_bytes))
        row = {"rank": r.get("rank", len(rows) + 1), "layout": layout.describe(), "family": layout.family,
               "interval_family": family_class(layout), "interval_errors_n": len(rel),
               "calibration_source": calibration.get("source", "defaults"),
               "mem_over_hbm_errors": over, "mem_over_limit_errors": over_limit, "mem_errors_n": int(len(mem_rel))}
        for name, (lo, hi), point in (("tokens_per_s_per_gpu", tp_q, tp_point),
                                      ("tokens_per_s", tp_q * cluster.n_gpus, tp_point * cluster.n_gpus),
                                      ("mfu", mfu_q, mfu_point)):
            row |= {f"{name}_p10": float(min(lo, point)), f"{name}_p50": point, f"{name}_p90": float(max(hi, point))}
        # memory keeps the pool's own order statistics: when every measured peak was above the model's (the H200
        # runs), the whole interval lies above the estimate, and widening it down to the estimate would state a
        # p10 no reading supports
        row |= {"mem_peak_bytes_p10": float(mem_q[0]), "mem_peak_bytes_p50": mem, "mem_peak_bytes_p90": float(mem_q[1])}
        row["mem_peak_gib_p50"] = row["mem_peak_bytes_p50"] / 1024**3
        rows.append(row)
    return pd.DataFrame(rows)


# ---------------------------------------------------------------------------- Snakemake stage glue
def _memo_row(r: dict[str, Any], hbm_bytes: float, max_hbm_frac: float = DEFAULT_MAX_MEM_FRAC) -> dict[str, Any]:
    """A production row in the memo's shape: GiB quantiles, ``source``, headroom at the p90 memory, and the
    search's memory limit (``max_hbm_frac`` of usable HBM) that page 1, the preflight and its fallback hold."""
    out = dict(r)
    for q in ("p10", "p50", "p90"):
        out[f"mem_total_gib_{q}"] = r[f"mem_peak_bytes_{q}"] / 1024**3
    out["source"] = r.get("calibration_source", "defaults")
    out["headroom_frac"] = 1.0 - r["mem_peak_bytes_p90"] / hbm_bytes
    out["max_hbm_frac"] = float(max_hbm_frac)
    out["mem_limit_gib"] = max_hbm_frac * hbm_bytes / 1024**3
    return out


def _comparable(rows: list[dict[str, Any]], candidates: pd.DataFrame, model: ModelSpec, cluster: ClusterSpec,
                training: TrainingSpec) -> list[dict[str, Any]]:
    """Closest open published runs (validate.comparable_runs) for the chosen layout and the best feasible layout
    of another family class: the public evidence next to each prediction."""

    if not rows:
        return []
    pub = validate_all()
    out = []
    picks = [("chosen", rows[0]["layout"], rows[0]["interval_family"], rows[0]["mfu_p50"])]
    feas = candidates[candidates["feasible"].astype(bool)] if "feasible" in candidates.columns else candidates.iloc[:0]
    r = runner_up_row(feas)  # (ranks them itself)
    if r is not None:  # the runner-up family as page 1 names it (report.memo.runner_up: the same rule)
        lay = Layout.from_row(r)
        picks.append(("runner-up family", lay.describe(), family_class(lay), float(r["mfu"])))
    for role, layout, fam, mfu in picks:
        out.append({"role": role, "layout": layout, "family": fam, "predicted_mfu": float(mfu),
                    "runs": comparable_runs(model, cluster.gpu.generation, training.kernels, fam, rows=pub,
                                            peak_flops=cluster.gpu.peak_bf16_flops,
                                            precision=training.precision)})
    return out


def stage_predict_production(candidates: pd.DataFrame, calibration: dict[str, Any], scaling: dict[str, Any],
                             model: ModelSpec, cluster: ClusterSpec, training: TrainingSpec,
                             cfg: dict[str, Any]) -> tuple[pd.DataFrame, dict[str, Any]]:
    """production.csv rows and production.json (``chosen``, ``extrapolation`` curves) for the rule."""
    calib = cfg.get("calibration") or {}
    frac = float(cfg["search"].get("max_hbm_frac", DEFAULT_MAX_MEM_FRAC))
    df = predict_production(candidates, model, cluster, training, calibration, top=int(cfg["search"]["top_k"]),
                            seed=int(calib.get("seed", 0)), quantiles=tuple(calib.get("interval", (0.1, 0.9))),
                            max_hbm_frac=frac)
    rows = [_memo_row(r, cluster.gpu.hbm_bytes, frac) for r in df.to_dict("records")]
    out = pd.DataFrame(rows)
    doc: dict[str, Any] = {
        "source": calibration.get("source", "defaults"), "source_detail": calibration.get("source_detail"),
        "efficiency": calibration.get("efficiency"), "efficiency_sources": calibration.get("efficiency_sources"),
        "chosen": rows[0] if rows else None, "n_layouts": len(rows),
        "interval": {"quantiles": list(calib.get("interval", (0.1, 0.9))),
                     "throughput_errors_n": len(calibration.get("loo_relative_errors") or []),
                     "memory_errors_n": len(calibration.get("memory_relative_errors") or []),
                     # the pool itself: the memo counts the errors that put the launch's own peak over the limit
                     "memory_relative_errors": [float(x) for x in calibration.get("memory_relative_errors") or []],
                     "memory_error_sources": calibration.get("memory_error_sources") or {}},
        "comparable_runs": _comparable(rows, candidates, model, cluster, training),
        "heldout_coverage": calibration.get("heldout_coverage"),
        "extrapolation": list(scaling.get("curves") or []),
        "scaling_evidence": scaling.get("evidence"),
    }
    return out, doc
