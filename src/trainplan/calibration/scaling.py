"""The fit_scaling rule: depth-slice, width-ladder and scale-out fits of the CPU proxy records (bytes, FLOPs,
communication volume; never time), each with a prediction interval at the production depth/width/world size."""

from __future__ import annotations

from typing import Any

import numpy as np
import pandas as pd

from trainplan.calibration.fitting import Model, cpu_only, fit_curve, linear, predict_interval
from trainplan.proxy.select import cpu_model


def _quad0(h: Any, a: float, b: float) -> Any:
    """Parameters of a fixed-depth model vs width: a·h² + b·h (blocks ∝ h², embeddings and norms ∝ h)."""
    return a * h * h + b * h


def _inverse(n: Any, a: float) -> Any:
    """Per-rank sharded state vs world size: a/n (ZeRO-3/FSDP full shard, Rajbhandari et al. 2019 §5)."""
    return a / n


SCALING_FITS = (  # name, family, x column, y column, model, param names, x label, y label
    ("depth: params", "depth", "layers", "params_meas", linear, ("intercept", "slope"), "layers", "parameters"),
    ("depth: state bytes/rank", "depth", "layers", "state_bytes_meas", linear, ("intercept", "slope"), "layers",
     "bytes per rank"),
    ("depth: FLOPs/rank/step", "depth", "layers", "flops_per_step_meas", linear, ("intercept", "slope"), "layers",
     "FLOPs per rank per step"),
    ("depth: comm bytes/rank/step", "depth", "layers", "comm_bytes_meas", linear, ("intercept", "slope"),
     "layers", "bytes per rank per step"),
    ("width: params", "width", "hidden", "params_meas", _quad0, ("a", "b"), "hidden size", "parameters"),
    ("scale-out: state bytes/rank", "scaleout", "world_size", "state_bytes_meas", _inverse, ("a",),
     "world size (ranks)", "bytes per rank"),
)


def _fit_one(name: str, x: np.ndarray, y: np.ndarray, fn: Model, names: tuple[str, ...], x_target: float,
             n_boot: int, seed: int, q: tuple[float, float]) -> tuple[dict[str, Any], list[dict[str, Any]]]:
    if fn is linear:
        p0 = [float(y.min()), float(np.ptp(y) / max(float(np.ptp(x)), 1e-9))]
    elif fn is _quad0:
        p0 = [float(y.max() / x.max() ** 2), 0.0]
    else:
        p0 = [float(np.max(y * x))]
    fit = fit_curve(fn, x, y, p0, names=names, name=name)
    grid = np.unique(np.concatenate([np.linspace(x.min(), x_target, 40), x, [x_target]]))
    band = predict_interval(fit, grid, n_boot=n_boot, seed=seed, quantiles=(q[0], 0.5, q[1]))
    mid = fit.predict(grid)
    d = fit.to_dict()
    t = predict_interval(fit, [x_target], n_boot=n_boot, seed=seed, quantiles=(q[0], 0.5, q[1]))[0]
    d.update(x_target=float(x_target), y_target=float(fit.predict([x_target])[0]), y_target_lo=float(t[0]),
             y_target_hi=float(t[2]), x=x.tolist(), y=y.tolist())
    curve = [{"fit": name, "kind": "measured", "x": float(a), "y": float(b)} for a, b in zip(x, y, strict=True)]
    curve += [{"fit": name, "kind": "fit", "x": float(g), "y": float(m), "y_lo": float(min(lo, m)),
               "y_hi": float(max(hi, m))} for g, m, (lo, _, hi) in zip(grid, mid, band, strict=True)]
    return d, curve


def stage_fit_scaling(records: pd.DataFrame, model: Any, n_gpus: int, cfg: dict[str, Any]) -> dict[str, Any]:
    """scaling.json: depth-slice, width-ladder and scale-out fits of what CPU records measure exactly.

    Each fit: parameters, R², LOO error, and the prediction (bootstrap + LOO interval) at the production
    depth, width or world size — for the *proxy's* model family (CPU debug widths), with the analytic value
    at that point beside it. Step times are never fitted here: a CPU timing is not H100 evidence.
    """
    rec = cpu_only(records) if len(records) else records
    q = tuple(cfg.get("interval", (0.1, 0.9)))
    n_boot, seed = int(cfg.get("bootstrap", 200)), int(cfg.get("seed", 0))
    targets = {"layers": model.layers, "hidden": model.hidden, "world_size": n_gpus}
    fits: dict[str, Any] = {}
    curves: list[dict[str, Any]] = []
    skipped: dict[str, str] = {}
    for name, fam, xc, yc, fn, names, xl, yl in SCALING_FITS:
        g = rec[rec["family"] == fam] if "family" in rec.columns else rec.iloc[0:0]
        if xc not in g.columns or yc not in g.columns:
            skipped[name] = f"records have no {xc}/{yc} columns"
            continue
        g = g[[xc, yc]].dropna().groupby(xc, as_index=False)[yc].median()
        if len(g) < len(names) + 1:
            skipped[name] = f"{len(g)} distinct {xc} values, need {len(names) + 1}"
            continue
        d, c = _fit_one(name, g[xc].to_numpy(float), g[yc].to_numpy(float), fn, names, float(targets[xc]),
                        n_boot, seed, (float(q[0]), float(q[1])))
        if yc == "params_meas":  # exact analytic value at the extrapolation point, same model family
            first = rec[rec["family"] == fam].iloc[0]
            hidden = int(d["x_target"]) if xc == "hidden" else int(first["hidden"])
            layers = int(d["x_target"]) if xc == "layers" else int(first["layers"])
            tp = int(first["tp"]) if "tp" in first and pd.notna(first["tp"]) else 1  # the slice's KV heads fit it
            d["analytic_target"] = float(cpu_model(model, hidden, layers, 128, tp).n_params)
            d["rel_err_vs_analytic"] = d["y_target"] / d["analytic_target"] - 1.0
        fits[name] = {**d, "family": fam, "quantity": yc}
        curves += [{**r, "x_label": xl, "y_label": yl} for r in c]
    return {"evidence": "CPU proxy records: bytes, FLOPs and communication volume (device-independent); "
                        "no timing is fitted (a CPU step time is not H100 evidence)",
            "targets": targets, "fits": fits, "skipped": skipped, "curves": curves}
