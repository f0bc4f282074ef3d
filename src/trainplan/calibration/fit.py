"""Scaling fits with goodness of fit, leave-one-out error and bootstrap prediction intervals.

Everything here is generic: a fit takes arrays (or a DataFrame) and a model callable, so each one is
tested on synthetic data with known parameters, without the analytic model or the proxy harness.

Fits (DESIGN §3):

* :func:`fit_width_ladder` — GEMM/attention efficiency vs width, ``eff(d) = emax·d/(d + d_half)``.
* :func:`fit_depth_slice` — per-layer time or memory: ``y = intercept + slope·layers`` → full depth.
* :func:`fit_alpha_beta` — collective time per link class: ``t = α + bytes/β``; and
  :func:`parallel_efficiency` from a scale-out ladder.
* :func:`fit_memory_overhead` — runtime memory overhead: ``measured = predicted + overhead``.
* :func:`fit_efficiency` — the analytic model's free parameters (an ``Efficiency``) fitted to published
  or GPU-proxy measurements through a prediction callable.

Prediction intervals (:func:`predict_interval`): resample the measurements (repeated step times within
each point when given, otherwise pairs), refit, predict, and add a leave-one-out residual drawn at
random, so the interval covers a new measurement rather than only the fitted mean.

Calibration sources (:func:`choose_source`): ``gpu-proxies`` (device=cuda records from the user's
cluster) beat ``published-h100`` (bundled torchtitan H100 table) beat ``defaults``. CPU proxy records
calibrate only device-independent terms (bytes, FLOPs, communication volume), never H100 time.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

import numpy as np
import pandas as pd
from scipy.optimize import least_squares

from trainplan.model.efficiency import generation_fits
from trainplan.model.specs import ConfigError

Model = Callable[..., Any]  # fn(x, *params) -> y (numpy broadcasting)


# ------------------------------------------------------------------------------------ fit results
@dataclass(frozen=True)
class FitResult:
    """One fitted curve: parameters, their standard errors, R², and leave-one-out error."""

    name: str
    fn: Model = field(repr=False)
    param_names: tuple[str, ...]
    params: np.ndarray
    stderr: np.ndarray
    r2: float
    loo_residuals: np.ndarray  # measured − predicted by the fit that left that point out
    x: np.ndarray = field(repr=False)
    y: np.ndarray = field(repr=False)
    groups: tuple[np.ndarray, ...] | None = field(default=None, repr=False)  # repeats per point
    bounds: tuple[Any, Any] = field(default=(-np.inf, np.inf), repr=False)
    log_space: bool = False  # y is log(measurement): errors are reported as ratios

    @property
    def n(self) -> int:
        return len(self.y)

    @property
    def loo_rmse(self) -> float:
        return float(np.sqrt(np.mean(self.loo_residuals**2))) if len(self.loo_residuals) else float("nan")

    @property
    def loo_mape(self) -> float:
        """Mean absolute leave-one-out error relative to the measurement."""
        if not len(self.loo_residuals):
            return float("nan")
        if self.log_space:
            return float(np.mean(np.abs(np.exp(-self.loo_residuals) - 1.0)))
        return float(np.mean(np.abs(self.loo_residuals / self.y)))

    def predict(self, x: Any) -> np.ndarray:
        return np.asarray(self.fn(np.asarray(x, dtype=float), *self.params), dtype=float)

    def to_dict(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "params": dict(zip(self.param_names, map(float, self.params), strict=True)),
            "stderr": dict(zip(self.param_names, map(float, self.stderr), strict=True)),
            "r2": float(self.r2),
            "n": self.n,
            "loo_rmse": self.loo_rmse,
            "loo_mape": self.loo_mape,
        }


def _lsq(fn: Model, x: np.ndarray, y: np.ndarray, p0: Sequence[float], bounds: tuple[Any, Any]) -> Any:
    return least_squares(lambda p: fn(x, *p) - y, np.asarray(p0, dtype=float), bounds=bounds,
                         x_scale="jac", method="trf")


def fit_curve(fn: Model, x: Any, y: Any, p0: Sequence[float], *, names: Sequence[str], name: str = "fit",
              bounds: tuple[Any, Any] = (-np.inf, np.inf), groups: Sequence[Any] | None = None,
              loo: bool = True) -> FitResult:
    """Least-squares fit of ``y ≈ fn(x, *p)`` (scipy ``least_squares``, trust-region reflective).

    ``groups`` optionally holds the repeated measurements behind each ``y`` (e.g. the step times of one
    proxy run); when given and ``y`` is None, ``y`` is their median. Standard errors come from the
    Jacobian, ``cov = s²·(JᵀJ)⁻¹`` with ``s² = SSR/(n − p)``.
    """
    g = None if groups is None else tuple(np.asarray(v, dtype=float) for v in groups)
    if y is None:
        if g is None:
            raise ConfigError("y", None, "give y or groups of repeated measurements")
        y = [np.median(v) for v in g]
    x = np.asarray(x, dtype=float)
    y = np.asarray(y, dtype=float)
    p = len(names)
    if len(p0) != p:
        raise ConfigError("p0", list(p0), f"needs {p} values, one per parameter {list(names)}")
    if len(y) != len(x) or len(y) < p + 1:
        raise ConfigError(f"{name}.points", len(y), f"need at least {p + 1} points (x and y of equal length)")
    res = _lsq(fn, x, y, p0, bounds)
    resid = res.fun
    ssr = float(resid @ resid)
    dof = max(len(y) - p, 1)
    try:
        cov = np.linalg.pinv(res.jac.T @ res.jac) * ssr / dof
        stderr = np.sqrt(np.clip(np.diag(cov), 0, None))
    except np.linalg.LinAlgError:  # pragma: no cover - pinv does not raise on finite input
        stderr = np.full(p, np.nan)
    sst = float(((y - y.mean()) ** 2).sum())
    r2 = 1.0 - ssr / sst if sst > 0 else float("nan")
    loo_res = np.empty(0)
    if loo and len(y) > p + 1:
        loo_res = np.empty(len(y))
        for i in range(len(y)):
            keep = np.arange(len(y)) != i
            r_i = _lsq(fn, x[keep], y[keep], res.x, bounds)
            loo_res[i] = y[i] - float(fn(x[i:i + 1], *r_i.x)[0])
    return FitResult(name=name, fn=fn, param_names=tuple(names), params=res.x, stderr=stderr, r2=r2,
                     loo_residuals=loo_res, x=x, y=y, groups=g, bounds=bounds)


# ----------------------------------------------------------------------------- the scaling models
def saturating_eff(d: Any, emax: float, d_half: float) -> Any:
    """GEMM efficiency vs width, Michaelis–Menten form ``emax·d/(d + d_half)`` (DESIGN §2, width ladder)."""
    return emax * d / (d + d_half)


def linear(x: Any, intercept: float, slope: float) -> Any:
    """Per-layer cost linear in depth: ``intercept + slope·layers`` (DESIGN §2, depth slice)."""
    return intercept + slope * x


def alpha_beta(nbytes: Any, alpha_s: float, inv_beta_s_per_B: float) -> Any:
    """Collective time ``α + n/β`` (Hockney 1994; NCCL busbw convention, nccl-tests PERFORMANCE.md)."""
    return alpha_s + nbytes * inv_beta_s_per_B


def fit_width_ladder(width: Any, eff: Any = None, *, groups: Sequence[Any] | None = None,
                     loo: bool = True) -> FitResult:
    """Fit ``emax`` and ``d_half`` of :func:`saturating_eff` to achieved efficiency per width."""
    w = np.asarray(width, dtype=float)
    e = None if eff is None else np.asarray(eff, dtype=float)
    e0 = float(np.max(e)) if e is not None else float(np.max([np.median(g) for g in groups or [[0.5]]]))
    return fit_curve(saturating_eff, w, e, [min(max(e0 * 1.2, 1e-3), 1.0), float(np.median(w))],
                     names=("emax", "d_half"), name="gemm_eff_vs_width", bounds=([0.0, 0.0], [1.0, np.inf]),
                     groups=groups, loo=loo)


def fit_depth_slice(layers: Any, y: Any = None, *, groups: Sequence[Any] | None = None, name: str = "depth",
                    loo: bool = True) -> FitResult:
    """Fit intercept and per-layer slope of time or memory against the number of layers."""
    L = np.asarray(layers, dtype=float)
    yy = None if y is None else np.asarray(y, dtype=float)
    ref = yy if yy is not None else np.array([np.median(g) for g in groups or []])
    slope0 = float(np.polyfit(L, ref, 1)[0]) if len(ref) >= 2 else 1.0
    return fit_curve(linear, L, yy, [float(ref.min() - slope0 * L.min()), slope0],
                     names=("intercept", "slope"), name=name, groups=groups, loo=loo)


def fit_alpha_beta(df: pd.DataFrame, *, bytes_col: str = "bytes", time_col: str = "time_s",
                   link_col: str = "link_class") -> dict[str, dict[str, Any]]:
    """α (s) and β (bytes/s) per link class from (message size, time) pairs; with R² and LOO error."""
    for c in (bytes_col, time_col, link_col):
        if c not in df.columns:
            raise ConfigError(c, None, f"missing column; have {list(df.columns)}")
    out: dict[str, dict[str, Any]] = {}
    for link, g in df.groupby(link_col, sort=True):
        x, t = g[bytes_col].to_numpy(float), g[time_col].to_numpy(float)
        slope0 = max(float(np.polyfit(x, t, 1)[0]), 1e-15) if len(x) >= 2 else 1e-10
        f = fit_curve(alpha_beta, x, t, [max(float(t.min()) * 0.5, 0.0), slope0],
                      names=("alpha_s", "inv_beta_s_per_B"), name=f"alpha_beta[{link}]",
                      bounds=([0.0, 0.0], [np.inf, np.inf]))
        d = f.to_dict()
        inv = f.params[1]
        d["alpha_s"] = float(f.params[0])
        d["beta_Bps"] = float(1.0 / inv) if inv > 0 else float("inf")
        out[str(link)] = d
    return out


def parallel_efficiency(n_gpus: Any, tokens_per_s: Any) -> pd.DataFrame:
    """Scale-out ladder: ``eff(n) = tps(n) / (n/n₀ · tps(n₀))`` against the smallest world size n₀."""
    n = np.asarray(n_gpus, dtype=float)
    t = np.asarray(tokens_per_s, dtype=float)
    order = np.argsort(n)
    n, t = n[order], t[order]
    base = t[0] / n[0]
    return pd.DataFrame({"n_gpus": n.astype(int), "tokens_per_s": t, "tokens_per_s_per_gpu": t / n,
                         "parallel_efficiency": (t / n) / base})


def fit_memory_overhead(predicted_bytes: Any, measured_bytes: Any, *, name: str = "memory_overhead") -> FitResult:
    """Runtime overhead as the intercept of ``measured = overhead + 1·predicted`` (slope fixed at 1)."""
    pred = np.asarray(predicted_bytes, dtype=float)

    def fn(x: Any, overhead_bytes: float) -> Any:
        return x + overhead_bytes

    meas = np.asarray(measured_bytes, dtype=float)
    return fit_curve(fn, pred, meas, [float(np.median(meas - pred))], names=("overhead_bytes",), name=name)


# ------------------------------------------------------------------------------ prediction interval
def _resample_all(fit: FitResult, rng: np.random.Generator, n_boot: int) -> tuple[np.ndarray, np.ndarray]:
    """All bootstrap resamples at once: repeats within points if ``fit.groups``, else pairs."""
    n = fit.n
    if fit.groups is not None:
        ys = np.stack([np.median(g[rng.integers(0, len(g), size=(n_boot, len(g)))], axis=1) for g in fit.groups],
                      axis=1)
        return np.broadcast_to(fit.x, ys.shape).copy(), ys
    idx = rng.integers(0, n, size=(n_boot, n))
    bad = np.array([len(np.unique(fit.x[i])) < 2 for i in idx])
    while bad.any():  # a resample with one distinct x cannot determine a line
        idx[bad] = rng.integers(0, n, size=(int(bad.sum()), n))
        bad = np.array([len(np.unique(fit.x[i])) < 2 for i in idx])
    return fit.x[idx], fit.y[idx]


def bootstrap_params(fit: FitResult, *, n_boot: int = 200, seed: int = 0) -> np.ndarray:
    """Refit on resampled data: within-point resampling of repeats if ``fit.groups``, else pairs."""
    rng = np.random.default_rng(seed)
    out = np.empty((n_boot, len(fit.params)))
    n = fit.n
    if fit.fn is linear:  # closed form, all resamples at once (same estimator as least squares)
        xs, ys = _resample_all(fit, rng, n_boot)
        X = np.stack([np.ones_like(xs), xs], axis=-1)  # (B, n, 2)
        XtX = np.einsum("bni,bnj->bij", X, X)
        Xty = np.einsum("bni,bn->bi", X, ys)
        return np.linalg.solve(XtX, Xty[..., None])[..., 0]
    for b in range(n_boot):
        if fit.groups is not None:
            x = fit.x
            y = np.array([np.median(rng.choice(g, size=len(g), replace=True)) for g in fit.groups])
        else:
            idx = rng.integers(0, n, size=n)
            while len(np.unique(fit.x[idx])) < len(fit.params):  # a degenerate resample cannot be fitted
                idx = rng.integers(0, n, size=n)
            x, y = fit.x[idx], fit.y[idx]
        out[b] = _lsq(fit.fn, x, y, fit.params, fit.bounds).x
    return out


def predict_interval(fit: FitResult, x_new: Any, *, n_boot: int = 200, seed: int = 0,
                     quantiles: Sequence[float] = (0.1, 0.5, 0.9), relative_noise: bool = False) -> np.ndarray:
    """Prediction interval at ``x_new``: bootstrap refits plus a resampled leave-one-out residual.

    Returns an array of shape ``(len(x_new), len(quantiles))``. With ``relative_noise`` the LOO residuals
    are applied as ratios (for quantities whose scatter grows with their size, e.g. step times).
    """
    rng = np.random.default_rng(seed + 1)
    xs = np.atleast_1d(np.asarray(x_new, dtype=float))
    boot = bootstrap_params(fit, n_boot=n_boot, seed=seed)
    preds = np.stack([np.asarray(fit.fn(xs, *p), dtype=float) for p in boot])  # (n_boot, len(xs))
    loo = fit.loo_residuals if len(fit.loo_residuals) else fit.y - fit.predict(fit.x)
    draws = rng.choice(loo / fit.predict(fit.x) if relative_noise else loo, size=preds.shape, replace=True)
    samples = preds * (1.0 + draws) if relative_noise else preds + draws
    return np.quantile(samples, list(quantiles), axis=0).T


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


def cpu_only(records_df: pd.DataFrame) -> pd.DataFrame:
    """The records usable for device-independent terms (bytes, FLOPs, comm volume): ok CPU runs."""
    if records_df is None or not len(records_df) or "device" not in records_df.columns:
        return records_df.iloc[0:0] if records_df is not None else pd.DataFrame()
    ok = records_df["device"].astype(str) == "cpu"
    if "status" in records_df.columns:
        ok &= records_df["status"].astype(str) == "ok"
    return records_df[ok]


# --------------------------------------------------------------------- the analytic model's Efficiency
def fit_efficiency(cases: Sequence[Any], measured: Any, predict: Callable[[Any, Any], float], eff0: Any,
                   params: Sequence[str], *, bounds: dict[str, tuple[float, float]] | None = None,
                   name: str = "efficiency", loo: bool = True) -> tuple[Any, FitResult]:
    """Fit a few fields of an ``Efficiency`` so that ``predict(case, eff)`` matches ``measured``.

    Residuals are in log space (relative error), so large and small runs weigh alike. ``eff0`` needs
    ``.replace(**kw)`` and the named attributes; returns the calibrated object and the fit (its
    ``loo_residuals`` are log errors of each case predicted by a fit that left it out).
    """
    names = tuple(params)
    if not names:
        raise ConfigError("calibration.params", [], "name at least one Efficiency field to fit")
    for k in names:
        if not hasattr(eff0, k):
            raise ConfigError("calibration.params", k, f"not a field of {type(eff0).__name__}")
    y = np.log(np.asarray(measured, dtype=float))
    cases = list(cases)
    if len(cases) != len(y):
        raise ConfigError("measured", len(y), f"one value per case ({len(cases)} cases)")
    b = bounds or {}
    fractions = getattr(eff0, "_FRACTIONS", ())
    default = {k: (1e-3, 1.0) if k in fractions else (0.0, np.inf) for k in names}
    lo = [b.get(k, default[k])[0] for k in names]
    hi = [b.get(k, default[k])[1] for k in names]
    p0 = [float(np.clip(getattr(eff0, k), lo[i] + 1e-9, hi[i] - 1e-9)) for i, k in enumerate(names)]

    def fn(idx: Any, *p: float) -> Any:
        e = eff0.replace(**dict(zip(names, map(float, p), strict=True)))
        return np.log([predict(cases[int(j)], e) for j in np.atleast_1d(idx)])

    fit = fit_curve(fn, np.arange(len(cases)), y, p0, names=names, name=name, bounds=(lo, hi), loo=loo)
    fit = replace(fit, log_space=True)
    return eff0.replace(**dict(zip(names, map(float, fit.params), strict=True))), fit


def relative_errors(fit: FitResult) -> np.ndarray:
    """Leave-one-out relative errors (predicted/measured − 1) of a log-space fit."""
    return np.exp(-fit.loo_residuals) - 1.0


# ------------------------------------------------------------------------------------ orchestration
RECORD_COLUMNS = {  # flattened proxy record columns (proxy.aggregate); one place to adjust
    "family": "family", "device": "device", "status": "status", "layers": "layers", "hidden": "hidden",
    "world_size": "world_size", "step_time_s": "step_time_s", "tokens_per_s": "tokens_per_s",
    "tokens_per_s_per_gpu": "tokens_per_s_per_gpu", "mfu": "mfu", "peak_mem_bytes": "peak_mem_bytes",
    "predicted_mem_bytes": "predicted_mem_bytes",
}


def _family_fits(rec: pd.DataFrame, cols: dict[str, str]) -> dict[str, Any]:
    """Depth, width, scale-out and memory fits on whatever families the records hold."""
    fits: dict[str, Any] = {}

    def fam(name: str) -> pd.DataFrame:
        return rec[rec[cols["family"]] == name] if cols["family"] in rec.columns else rec.iloc[0:0]

    depth = fam("depth")
    if depth[cols["layers"]].nunique() >= 3 if len(depth) else False:
        for key in ("step_time_s", "peak_mem_bytes"):
            if cols[key] in depth.columns:
                fits[f"depth_{key}"] = fit_depth_slice(depth[cols["layers"]], depth[cols[key]],
                                                       name=f"depth_{key}").to_dict()
    width = fam("width")
    if len(width) and width[cols["hidden"]].nunique() >= 3 and cols["mfu"] in width.columns:
        fits["gemm_eff_vs_width"] = fit_width_ladder(width[cols["hidden"]], width[cols["mfu"]]).to_dict()
    scale = fam("scaleout")
    if len(scale) and scale[cols["world_size"]].nunique() >= 2 and cols["tokens_per_s"] in scale.columns:
        fits["parallel_efficiency"] = parallel_efficiency(scale[cols["world_size"]],
                                                          scale[cols["tokens_per_s"]]).to_dict("records")
    if {cols["peak_mem_bytes"], cols["predicted_mem_bytes"]} <= set(rec.columns) and len(rec) >= 3:
        fits["memory_overhead"] = fit_memory_overhead(rec[cols["predicted_mem_bytes"]],
                                                      rec[cols["peak_mem_bytes"]]).to_dict()
    return fits


def calibrate(records_df: pd.DataFrame | None, published_df: pd.DataFrame | None, *, eff0: Any,
              params: Sequence[str], predict_published: Callable[[Any, Any], float] | None = None,
              predict_record: Callable[[Any, Any], float] | None = None,
              bounds: dict[str, tuple[float, float]] | None = None,
              published_target: str = "tps_per_gpu", n_boot: int = 50, seed: int = 0,
              columns: dict[str, str] | None = None) -> dict[str, Any]:
    """The calibration.json content: source, fitted Efficiency, fits with GOF and LOO, bootstrap samples.

    Time parameters are fitted to GPU proxy records when there are any, else to the published H100
    rows, else left at their defaults. CPU records feed only the device-independent fits (memory bytes).
    """
    cols = {**RECORD_COLUMNS, **(columns or {})}
    source = choose_source(records_df, published_df)
    out: dict[str, Any] = {"source": source, "params": list(params), "seed": seed, "n_boot": n_boot,
                           "fits": {}, "efficiency": eff0.to_dict() if hasattr(eff0, "to_dict") else None,
                           "efficiency_samples": [], "loo_relative_errors": []}
    cases: list[Any] = []
    measured: Any = []
    predict: Callable[[Any, Any], float] | None = None
    if source == "gpu-proxies" and records_df is not None:
        gpu = records_df[records_df[cols["device"]].astype(str).str.startswith("cuda")]
        if cols["status"] in gpu.columns:
            gpu = gpu[gpu[cols["status"]].astype(str) == "ok"]
        out["fits"].update({f"gpu:{k}": v for k, v in _family_fits(gpu, cols).items()})
        cases, measured = [r for _, r in gpu.iterrows()], gpu[cols["tokens_per_s_per_gpu"]].to_numpy(float)
        predict = predict_record
    elif source == "published-h100" and published_df is not None:
        cases, measured = [r for _, r in published_df.iterrows()], published_df[published_target].to_numpy(float)
        predict = predict_published
    if records_df is not None and len(records_df):
        out["fits"].update({f"cpu:{k}": v for k, v in _family_fits(cpu_only(records_df), cols).items()
                            if not k.startswith(("depth_step", "gemm", "parallel"))})  # CPU time ≠ H100 time
    if predict is not None and len(cases) > len(params):
        eff, fit = fit_efficiency(cases, measured, predict, eff0, params, bounds=bounds)
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
    from trainplan.published.validate import throughput_rel_errors

    return throughput_rel_errors(df[df["in_mape"] & (df["metric"] != "memory_gib")])


def heldout_errors_by_family(generation: str | None) -> dict[str, list[float]]:
    """Leave-one-table-out throughput errors (predicted/measured − 1) of ``generation``'s published rows, per
    family class (FSDP/ZeRO, TP, PP, CP), as shipped in trainplan/data/efficiency_fits.json."""
    out: dict[str, list[float]] = {}
    for r in (generation_fits().get(str(generation)) or {}).get("heldout", []):
        ratio = float(r["predicted"]) / float(r["published"])
        out.setdefault(r["family"], []).append((1.0 / ratio if str(r.get("metric", "")).endswith("_s") else ratio) - 1.0)
    return out


def open_set_report(eff: Any, generation: str | None = None) -> tuple[dict[str, Any], pd.DataFrame, np.ndarray, np.ndarray]:
    """Fits (per fitted Efficiency field: value, stderr, R² of log throughput, MAPE, n), MAPE per table, errors.

    ``heldout``: one row per published table and metric, ``role`` = fit (``generation``'s parameters were fitted
    on it), ``other generation`` or held out; ``mape`` and ``bias`` are fractions; ``loto_mape`` the error when
    that table is left out of its generation's fit (shipped in efficiency_fits.json; ``trainplan validate --heldout``
    recomputes it). The errors (predicted/measured − 1) are those of every scored throughput row, and of the
    published peak memory rows.
    """
    from trainplan.published.validate import GEN_FIT, TABLE_GENERATION, mape_table, validate_all

    gen = generation if generation in GEN_FIT else "a100"
    rows = validate_all({gen: eff})
    m = mape_table(rows)
    fit_tables = GEN_FIT[gen]["tables"]
    heldout = pd.DataFrame({"table": m["table"], "metric": m["metric"], "n": m["rows"],
                            "mape": m["mape_pct"] / 100.0, "bias": m["bias_pct"] / 100.0,
                            "role": np.where(m["table"].isin(fit_tables), "fit",
                                             np.where(m["table"].map(TABLE_GENERATION) == gen, "held out",
                                                      "other generation"))})
    loto: dict[str, list[float]] = {}
    for f in generation_fits().values():
        for r in f.get("heldout", []):
            loto.setdefault(r["table"], []).append(abs(float(r["err_pct"])) / 100.0)
    heldout["loto_mape"] = [float(np.mean(loto[t])) if t in loto and mt != "memory_gib" else np.nan
                            for t, mt in zip(heldout["table"], heldout["metric"], strict=True)]
    fit_rows = rows[rows["in_mape"] & rows["table"].isin(fit_tables) & (rows["metric"] != "memory_gib")]
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
    from trainplan.calibration.gpu import calibrate_gpu, load_gpu_records
    from trainplan.published.validate import GEN_FIT

    if generation is None and str(getattr(eff0, "source", "")).startswith("fit:"):
        generation = str(eff0.source).split(":", 1)[1]
    # What "not overridden" means: the generation's shipped fit (the class defaults without a generation).
    baseline = type(eff0).for_gpu(generation) if generation in GEN_FIT else type(eff0)()
    FIT_PARAMS = tuple(GEN_FIT.get(str(generation), GEN_FIT["a100"])["params"])  # noqa: N806
    FIT_PARAMS = tuple(p for p in FIT_PARAMS if hasattr(eff0, p))  # noqa: N806

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
        if any(getattr(eff0, p) != getattr(baseline, p) for p in FIT_PARAMS):
            notes.append("config overrides of fitted Efficiency fields were refitted to the GPU records")
    elif requested == "published-h100":
        from trainplan.prediction.production import DEFAULT_PARAMS, predict_tps_per_gpu, published_frame

        pub = published_frame()
        pub = pub[pub["in_scope"] & pub["group"].str.startswith("h100")].reset_index(drop=True)
        extra = calibrate(None, pub, eff0=eff0, params=DEFAULT_PARAMS, predict_published=predict_tps_per_gpu,
                          n_boot=int(cfg.get("bootstrap", 50)), seed=int(cfg.get("seed", 0)))
        from trainplan.model.efficiency import Efficiency

        eff = Efficiency.from_dict(extra["efficiency"])
        source = "published-h100"
        notes.append("fitted on torchtitan's H100 rows, which ran on 500 W power-capped parts")
    elif requested == "defaults" or any(getattr(eff0, p) != getattr(baseline, p) for p in FIT_PARAMS):
        source = "defaults"
        notes.append("Efficiency from the config (overrides of fitted fields) or the uncalibrated defaults")
    fits, heldout, rel, mem_rel = open_set_report(eff, generation)
    by_family = heldout_errors_by_family(generation)
    if by_family and gpu is None and not extra:
        # The interval rests on leave-one-table-out errors of this GPU generation (per family class where a
        # family has enough rows: validate.error_pool), not on the in-sample errors of every table.
        rel = np.asarray([e for v in by_family.values() for e in v], dtype=float)
    doc: dict[str, Any] = {
        "source": source, "requested": requested, "notes": notes, "efficiency": eff.to_dict(),
        "fits": fits, "loo_relative_errors": rel.tolist(), "efficiency_samples": [],
        "memory_relative_errors": _memory_rel_errors(records) + mem_rel.tolist(),
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
    doc["efficiency_sources"] = _efficiency_sources(eff, eff0, source, doc.get("source_detail"), gpu, baseline,
                                                    FIT_PARAMS)
    return doc, heldout


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
    from trainplan.published.validate import FIT_PARAMS

    fitted = set(gpu["params"]) | set(gpu["memory_params"]) if gpu else set()
    default = default if default is not None else type(eff0)()
    FIT_PARAMS = fit_params or FIT_PARAMS  # noqa: N806
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
        elif k in FIT_PARAMS:
            out[k] = OPEN_SET
        else:
            out[k] = "prior (efficiency.py default, [I])"
    return out


# Scaling fits on CPU proxy records: device-independent quantities only (bytes, FLOPs, comm volume).
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
    from trainplan.proxy.select import cpu_model

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
            d["analytic_target"] = float(cpu_model(model, hidden, layers, 128).n_params)
            d["rel_err_vs_analytic"] = d["y_target"] / d["analytic_target"] - 1.0
        fits[name] = {**d, "family": fam, "quantity": yc}
        curves += [{**r, "x_label": xl, "y_label": yl} for r in c]
    return {"evidence": "CPU proxy records: bytes, FLOPs and communication volume (device-independent); "
                        "no timing is fitted (a CPU step time is not H100 evidence)",
            "targets": targets, "fits": fits, "skipped": skipped, "curves": curves}
