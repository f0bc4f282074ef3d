"""Prediction intervals from held-out errors, without pandas (``trainplan estimate`` imports this).

The errors are the leave-one-table-out throughput errors of a GPU generation's open published rows, per family
class (FSDP/ZeRO, TP, PP, CP), as shipped in ``trainplan/data/efficiency_fits.json`` (``published.fit`` writes them;
``trainplan validate --heldout`` recomputes them and measures how often the interval holds a held-out row).
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

import numpy as np

from trainplan.model.efficiency import generation_fits

__all__ = ["MIN_FAMILY_ROWS", "error_pool", "family_class", "memory_pool_peaks", "heldout_errors_by_family", "interval_bounds",
           "memory_interval_factors", "predictive_error_draws", "throughput_interval"]

MIN_FAMILY_ROWS = 3  # fewer held-out rows of a family than this: its interval uses the whole generation's errors


def family_class(layout: Any) -> Any:
    """The bias class of a layout: CP if it uses CP, else PP, else TP, else FSDP/ZeRO (data parallel only).
    A str for one layout; an array of them for a table (a DataFrame or LayoutTable with cp, pp, tp columns)."""
    cp, pp, tp = np.asarray(layout.cp), np.asarray(layout.pp), np.asarray(layout.tp)
    out = np.where(cp > 1, "CP", np.where(pp > 1, "PP", np.where(tp > 1, "TP", "FSDP/ZeRO")))
    return str(out) if out.ndim == 0 else out


def heldout_errors_by_family(generation: str | None) -> dict[str, list[float]]:
    """Leave-one-table-out throughput errors (predicted/measured − 1; a time metric's ratio inverted) of
    ``generation``'s published rows, per family class, as shipped in trainplan/data/efficiency_fits.json."""
    out: dict[str, list[float]] = {}
    for r in (generation_fits().get(str(generation)) or {}).get("heldout", []):
        ratio = float(r["predicted"]) / float(r["published"])
        out.setdefault(r["family"], []).append((1.0 / ratio if str(r.get("metric", "")).endswith("_s") else ratio) - 1.0)
    return out


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
    from scipy.special import stdtrit  # Student-t quantile (= scipy.stats.t.ppf; a third of the import time)

    le = np.log1p(np.asarray(errors, dtype=float))
    n = len(le)
    if n < 2:
        return float(predicted), float(predicted)
    m, sd = float(le.mean()), float(le.std(ddof=1))
    k = sd * np.sqrt(1.0 + 1.0 / n)
    lo_q, hi_q = quantiles
    l_hi = m + k * float(stdtrit(n - 1, 1.0 - lo_q))  # a large le → a low measured value
    l_lo = m + k * float(stdtrit(n - 1, 1.0 - hi_q))
    return float(predicted * np.exp(-l_hi)), float(predicted * np.exp(-l_lo))


def predictive_error_draws(errors: Any, size: int, rng: np.random.Generator) -> np.ndarray:
    """Relative errors e drawn from the predictive distribution interval_bounds uses (log(1 + e) Student-t,
    n − 1 degrees of freedom, scale sd·sqrt(1 + 1/n)); the pool itself when it has fewer than 3 errors."""
    le = np.log1p(np.asarray(errors, dtype=float))
    if len(le) < 3:
        return rng.choice(np.expm1(le) if len(le) else np.zeros(1), size=size)
    k = float(le.std(ddof=1)) * np.sqrt(1.0 + 1.0 / len(le))
    return np.expm1(float(le.mean()) + k * rng.standard_t(len(le) - 1, size=size))


def throughput_interval(js: dict[str, Any], generation: str, family: str) -> dict[str, Any]:
    """p10–p90 of tokens/s/GPU and MFU around an estimate (``Estimate.to_json()``: its ``tokens_per_s_per_gpu`` and
    ``mfu``): the predictive interval over the leave-one-table-out errors of the generation's open published rows of
    the layout's family class, the interval whose coverage ``trainplan validate --heldout`` measures, and that pool's
    mean error (``errors_mean``; the interval is centred on it). What ``trainplan estimate`` prints. None where the
    generation has no shipped errors."""
    errors = heldout_errors_by_family(generation)
    tps, mfu = js.get("tokens_per_s_per_gpu"), js.get("mfu")
    out: dict[str, Any] = {"generation": generation, "family": family, "errors_n": 0, "source": "",
                           "errors_mean": None, "tokens_per_s_per_gpu_p10": None, "tokens_per_s_per_gpu_p90": None,
                           "mfu_p10": None, "mfu_p90": None}
    if not errors or tps is None:
        return out
    pool = error_pool(errors, family)
    lo, hi = interval_bounds(tps, pool)
    own = len(errors.get(family) or []) >= MIN_FAMILY_ROWS  # error_pool's rule: the family's own rows, else all
    bias = float(np.mean(pool))  # predicted/published − 1 on average: < 0, the model errs slow for these rows
    out |= {"errors_n": len(pool), "errors_mean": bias, "tokens_per_s_per_gpu_p10": lo,
            "tokens_per_s_per_gpu_p90": hi, "mfu_p10": mfu * lo / tps, "mfu_p90": mfu * hi / tps,
            "source": f"held-out errors of {len(pool)} published {generation.upper()} rows"
                      + (f" of the {family} family" if own else f" (every family: {family} has too few)")
                      + f", mean {bias:+.1%} (the model predicts {'slower' if bias < 0 else 'faster'} than published)"}
    return out


def memory_pool_peaks(peak: float, rel_errors: Any) -> np.ndarray:
    """What each memory-model error (measured = modelled ÷ (1 + error)) makes a modelled ``peak``: the pool the
    production memory interval is an order statistic of, and that page 1 counts against the search's limit and
    usable HBM (prediction.production for the plan, report.memo for what the launch runs)."""
    return float(peak) / (1.0 + np.asarray(rel_errors, dtype=float))


def memory_interval_factors(chosen: Mapping[str, Any]) -> tuple[float, float] | None:
    """The production memory interval as factors of its p50, (p10/p50, p90/p50), from the chosen layout's
    ``mem_total_gib_p10/p50/p90``; None unless all three are positive and finite with p10 < p90. The interval is
    the memory model's error pool applied to the modelled peak (prediction.production), the same factors for every
    layout: the sensitivity's ``memory_x`` range and the runner-up's memory p90 (report.memo) both read them here."""
    q = [chosen.get(f"mem_total_gib_{k}") for k in ("p10", "p50", "p90")]
    if not all(isinstance(x, int | float) and math.isfinite(float(x)) and float(x) > 0 for x in q):
        return None
    lo, mid, hi = (float(x) for x in q)
    return (lo / mid, hi / mid) if lo < hi else None
