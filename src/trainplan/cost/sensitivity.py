"""Sensitivity: move one assumption at a time across its range; rank by effect on cost and on the layout.

Generic: :func:`tornado` takes the base assumptions, their ranges and an ``evaluate(assumptions) ->
(cost_usd, layout_id)`` callable — the lead wires one that re-runs the layout search (so a flip of the
recommended layout is seen) and the cost model. :func:`cost_evaluator` builds such a callable from a
``rank(assumptions) -> (layout_id, tokens_per_s_per_gpu)`` search callable and :mod:`trainplan.cost.budget`.

Assumption names understood by :func:`cost_evaluator`: ``efficiency_x`` (throughput multiplier, e.g. the
calibration's p10/p50 and p90/p50 ratios), ``inter_busbw_GBps``, ``memory_x`` and any other search input (passed
to ``rank``), ``price_per_gpu_hour_usd``, ``failure_rate_x``, ``dataset_tokens``, ``checkpoint_write_GBps``.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import replace
from typing import Any

import pandas as pd

from trainplan.cost import budget as C
from trainplan.model.base import ConfigError
from trainplan.model.efficiency import generation_fits
from trainplan.model.timing import attention_kernel_rel
from trainplan.published.intervals import memory_interval_factors
from trainplan.search.layouts import search

TORNADO_COLUMNS = ("assumption", "base", "low", "high", "cost_base", "cost_low", "cost_high", "swing_usd",
                   "layout_base", "layout_low", "layout_high", "flips")
Evaluate = Callable[[dict[str, Any]], tuple[float, str]]
# The schedule's assumptions (cost config key or name, CostInputs field, SI per config unit), each varied across
# its range as the cost table's draws vary it: checkpoint bandwidth, evaluation share, start-up, restart, size.
SCHEDULE_ASSUMPTIONS = (("checkpoint_write_GBps", "checkpoint_write_Bps", 1e9),
                        ("eval_overhead_frac", "eval_frac", 1.0), ("startup_h", "startup_s", C.HOUR),
                        ("restart_h", "restart_s", C.HOUR), ("checkpoint_bytes_per_param", "bytes_per_param", 1.0))


def tornado(base: Mapping[str, Any], ranges: Mapping[str, tuple[Any, Any]], evaluate: Evaluate) -> pd.DataFrame:
    """One row per assumption, sorted: layout flips first, then by cost swing |cost_high − cost_low|."""
    for k in ranges:
        if k not in base:
            raise ConfigError(f"sensitivity.{k}", ranges[k], "an assumption to vary must have a base value; "
                              "known: " + ", ".join(sorted(base)))
    cost0, layout0 = evaluate(dict(base))
    rows = []
    for k, (lo, hi) in ranges.items():
        c_lo, l_lo = evaluate({**base, k: lo})
        c_hi, l_hi = evaluate({**base, k: hi})
        rows.append({"assumption": k, "base": base[k], "low": lo, "high": hi, "cost_base": cost0,
                     "cost_low": c_lo, "cost_high": c_hi, "swing_usd": abs(c_hi - c_lo), "layout_base": layout0,
                     "layout_low": l_lo, "layout_high": l_hi, "flips": l_lo != layout0 or l_hi != layout0})
    df = pd.DataFrame(rows, columns=list(TORNADO_COLUMNS))
    return df.sort_values(["flips", "swing_usd"], ascending=[False, False], kind="stable").reset_index(drop=True)


def cost_evaluator(rank: Callable[[dict[str, Any]], tuple[str, float]], *, n_gpus: int, n_params: float,
                   d2h_Bps: float, inputs: C.CostInputs) -> Evaluate:
    """``evaluate(a)``: re-rank layouts under ``a``, scale the winner's throughput, cost it (point values)."""

    def evaluate(a: dict[str, Any]) -> tuple[float, str]:
        layout, tps = rank(a)
        if layout == NO_LAYOUT:  # nothing fits under these assumptions: no run, so no cost (NaN, not $10¹⁵)
            return float("nan"), layout
        tps *= float(a.get("efficiency_x", 1.0))
        i = inputs
        for key, field, scale in SCHEDULE_ASSUMPTIONS:
            if key in a:
                i = replace(i, **{field: float(a[key]) * scale})
        s = C.schedule(tps, n_gpus=n_gpus, n_params=n_params, total_tokens=float(a["dataset_tokens"]),
                       d2h_Bps=d2h_Bps, inputs=i, failure_x=float(a.get("failure_rate_x", 1.0)))
        return float(C.dollars(s["gpu_hours"], float(a.get("price_per_gpu_hour_usd", i.price_per_gpu_hour_usd)))), layout

    return evaluate


def default_ranges(inputs: C.CostInputs, *, dataset_tokens: float, efficiency_x: tuple[float, float],
                   inter_busbw_GBps: tuple[float, float, float] | None = None,
                   dataset_x: tuple[float, float] = (0.5, 2.0)) -> tuple[dict[str, Any], dict[str, tuple[Any, Any]]]:
    """Base values and ranges from the cost inputs, the calibration interval and the cluster's bandwidth."""
    base: dict[str, Any] = {"efficiency_x": 1.0, "price_per_gpu_hour_usd": inputs.price_per_gpu_hour_usd,
                            "failure_rate_x": 1.0, "dataset_tokens": dataset_tokens}
    ranges: dict[str, tuple[Any, Any]] = {
        "efficiency_x": efficiency_x, "price_per_gpu_hour_usd": inputs.price_range_usd,
        "failure_rate_x": inputs.failure_rate_x_range,
        "dataset_tokens": (dataset_tokens * dataset_x[0], dataset_tokens * dataset_x[1]),
    }
    for key, field, scale in SCHEDULE_ASSUMPTIONS:  # every assumption the cost table's draws vary
        base[key] = getattr(inputs, field) / scale
        ranges[key] = tuple(x / scale for x in getattr(inputs, field + "_range"))
    if inter_busbw_GBps is not None:
        base["inter_busbw_GBps"], lo, hi = inter_busbw_GBps  # (base, low, high), GB/s
        ranges["inter_busbw_GBps"] = (lo, hi)
    return base, ranges


# ---------------------------------------------------------------------------- Snakemake stage glue
# Assumptions the search itself depends on (so moving them can flip the layout): name → (unit, range source).
SEARCH_ASSUMPTIONS = {
    "inter_busbw_GBps": "GB/s",  # config cluster value, × (0.5, 1.2): 200G … 480G-class rails [assumption]
    "comm_bw_eff": "fraction",  # validate.FIT_BOUNDS physical range of the NCCL efficiency
    "runtime_overhead_GiB": "GiB",  # CUDA context + NCCL + allocator slack [assumption: 1–8 GiB]
    "fp8_gemm_eff": "fraction of FP8 peak",  # only with training.precision fp8-*: fitted value ± 2 s.e.
    # Hopper with flash attention: the other measured kernel (FA2 ↔ cuDNN, timing.attention_kernel_rel)
    "attention_rate_x": "× the attention kernel's rate",
    # the memory model's error: the production memory interval's p10/p50 and p90/p50 (its error pool: CPU
    # proxies, published readings, our own GPU runs' reserved memory), as a factor on every modelled peak
    "memory_x": "× modelled peak memory",
}
NO_LAYOUT = "no feasible layout"
UNITS = {"efficiency_x": "× throughput", "price_per_gpu_hour_usd": "$/GPU-h", "failure_rate_x": "× failure rate",
         "dataset_tokens": "tokens", "checkpoint_write_GBps": "GB/s", "eval_overhead_frac": "× training time",
         "startup_h": "h", "restart_h": "h", "checkpoint_bytes_per_param": "B/param", **SEARCH_ASSUMPTIONS}


def search_ranker(model: Any, cluster: Any, training: Any, eff: Any, options: dict[str, Any],
                  searcher: Callable[..., pd.DataFrame] | None = None) -> Callable[[dict[str, Any]], tuple[str, float]]:
    """``rank(a)``: re-run the layout search under assumptions ``a``; (best layout, its tokens/s/GPU). Cached.
    ``searcher``: the study's search, ``searcher(model, cluster, training, eff, options, mem_scale=)`` (the
    cost_and_risk stage passes ``launch.artifacts.plan_search``, which rules out what the launch could not run or
    fit, as the analytic stage did); default the plan's own :func:`~trainplan.search.layouts.search`."""
    searcher = searcher or search

    cache: dict[tuple[float, ...], tuple[str, float]] = {}
    fp8_field = f"fp8_gemm_eff_{training.fp8}" if getattr(training, "fp8", None) else None

    def rank(a: dict[str, Any]) -> tuple[str, float]:
        key = (float(a["inter_busbw_GBps"]), float(a["comm_bw_eff"]), float(a["runtime_overhead_GiB"]),
               float(a.get("fp8_gemm_eff", 0.0)), float(a.get("attention_rate_x", 1.0)), float(a.get("memory_x", 1.0)))
        if key not in cache:
            c = replace(cluster, inter_busbw_Bps=key[0] * 1e9)
            e = eff.replace(comm_bw_eff=key[1], runtime_overhead_bytes=key[2] * 2**30, attn_eff=eff.attn_eff * key[4])
            if fp8_field and "fp8_gemm_eff" in a:
                e = e.replace(**{fp8_field: key[3]})
            df = searcher(model, c, training, e, options, mem_scale=key[5])
            best = df[df["rank"] == 1]
            cache[key] = ((NO_LAYOUT, float("nan")) if not len(best) else
                          (str(best["layout_text"].iloc[0]), float(best["tokens_per_s_per_gpu"].iloc[0])))
        return cache[key]

    return rank


def stage_sensitivity(chosen: dict[str, Any], *, model: Any, cluster: Any, training: Any, eff: Any,
                      options: dict[str, Any], inputs: C.CostInputs, inter_busbw_GBps: float,
                      searcher: Callable[..., pd.DataFrame] | None = None) -> pd.DataFrame:
    """sensitivity.csv: tornado over cost and search assumptions; ``changes_recommendation`` re-ranks layouts
    (with ``searcher``, :func:`search_ranker`'s)."""
    rank = search_ranker(model, cluster, training, eff, options, searcher)
    base, ranges = default_ranges(
        inputs, dataset_tokens=float(training.total_tokens),
        efficiency_x=(chosen["tokens_per_s_per_gpu_p10"] / chosen["tokens_per_s_per_gpu_p50"],
                      chosen["tokens_per_s_per_gpu_p90"] / chosen["tokens_per_s_per_gpu_p50"]),
        inter_busbw_GBps=(inter_busbw_GBps, 0.5 * inter_busbw_GBps, 1.2 * inter_busbw_GBps))
    base |= {"comm_bw_eff": eff.comm_bw_eff, "runtime_overhead_GiB": eff.runtime_overhead_bytes / 2**30}
    ranges |= {"comm_bw_eff": (0.3, 1.0), "runtime_overhead_GiB": (1.0, 8.0)}
    if getattr(training, "fp8", None):  # the FP8 speed-up's uncertainty: its GEMM efficiency ± 2 standard errors

        field = f"fp8_gemm_eff_{training.fp8}"
        v = float(getattr(eff, field))
        se = (generation_fits().get(cluster.gpu.generation) or {}).get("stderr", {}).get(field) or 0.1 * v
        base["fp8_gemm_eff"] = v
        ranges["fp8_gemm_eff"] = (max(0.05, v - 2 * se), min(0.95, v + 2 * se))
    if cluster.gpu.generation == "h100" and training.attn_impl == "flash":
        # the kernel not chosen, at its measured rate relative to the chosen one (FA2 ↔ cuDNN on our H200)
        rel = attention_kernel_rel("cudnn")
        base["attention_rate_x"] = 1.0
        ranges["attention_rate_x"] = (1.0, rel) if training.attn_kernel == "fa2" else (1.0 / rel, 1.0)
    mem_x = memory_interval_factors(chosen)
    if mem_x is not None:  # does the layout still fit if the memory model errs as its error pool has?
        base["memory_x"] = 1.0
        ranges["memory_x"] = mem_x
    evaluate = cost_evaluator(rank, n_gpus=cluster.n_gpus, n_params=float(model.n_params),
                              d2h_Bps=cluster.host_to_device_Bps, inputs=inputs)
    t = tornado(base, ranges, evaluate)
    return pd.DataFrame({
        "parameter": t["assumption"], "unit": t["assumption"].map(UNITS).fillna(""), "base_value": t["base"],
        "low_value": t["low"], "high_value": t["high"], "metric": "cost at p50 throughput ($)",
        "metric_base": t["cost_base"], "metric_low": t["cost_low"], "metric_high": t["cost_high"],
        "changes_recommendation": t["flips"], "layout_base": t["layout_base"], "layout_low": t["layout_low"],
        "layout_high": t["layout_high"]})
