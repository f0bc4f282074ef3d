"""Scaling fits with goodness of fit, leave-one-out error and bootstrap prediction intervals.

Everything here is generic: a fit takes arrays (or a DataFrame) and a model callable, so each one is
tested on synthetic data with known parameters, without the analytic model or the proxy harness.

Fits (DESIGN §3):

* :func:`fit_depth_slice` — per-layer time or memory: ``y = intercept + slope·layers`` → full depth.
* :func:`fit_efficiency` — the analytic model's free parameters (an ``Efficiency``) fitted to published
  or GPU-proxy measurements through a prediction callable.

Prediction intervals (:func:`predict_interval`): resample the measurements (repeated step times within
each point when given, otherwise pairs), refit, predict, and add a leave-one-out residual drawn at
random, so the interval covers a new measurement rather than only the fitted mean.

A leaf of the package: numpy/scipy/pandas and the Efficiency type only. Where the fits are used:
``calibration.sources`` (the calibrate rule), ``calibration.gpu`` (GPU proxy records), ``calibration.scaling``
(the fit_scaling rule).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

import numpy as np
import pandas as pd
from scipy.optimize import least_squares

from trainplan.model.base import ConfigError

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
def linear(x: Any, intercept: float, slope: float) -> Any:
    """Per-layer cost linear in depth: ``intercept + slope·layers`` (DESIGN §2, depth slice)."""
    return intercept + slope * x


def fit_depth_slice(layers: Any, y: Any = None, *, groups: Sequence[Any] | None = None, name: str = "depth",
                    loo: bool = True) -> FitResult:
    """Fit intercept and per-layer slope of time or memory against the number of layers."""
    L = np.asarray(layers, dtype=float)
    yy = None if y is None else np.asarray(y, dtype=float)
    ref = yy if yy is not None else np.array([np.median(g) for g in groups or []])
    slope0 = float(np.polyfit(L, ref, 1)[0]) if len(ref) >= 2 else 1.0
    return fit_curve(linear, L, yy, [float(ref.min() - slope0 * L.min()), slope0],
                     names=("intercept", "slope"), name=name, groups=groups, loo=loo)


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


def cpu_only(records_df: pd.DataFrame) -> pd.DataFrame:
    """The records usable for device-independent terms (bytes, FLOPs, comm volume): ok CPU runs."""
    if records_df is None or not len(records_df) or "device" not in records_df.columns:
        return records_df.iloc[0:0] if records_df is not None else pd.DataFrame()
    ok = records_df["device"].astype(str) == "cpu"
    if "status" in records_df.columns:
        ok &= records_df["status"].astype(str) == "ok"
    return records_df[ok]
