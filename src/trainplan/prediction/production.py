"""From calibration to the production run: held-out checks and predictions with intervals.

* :func:`published_frame` — the bundled torchtitan H100 and A100 measurements as one table of cases
  (rows using Float8 or async TP are kept but marked out of scope: the analytic model is bf16).
* :func:`heldout_report` — fit the Efficiency on some tables, predict the others (leave one table out,
  and H100 → A100), error per held-out table. ``main_heldout(argv)`` prints it (``trainplan validate
  --heldout``).
* :func:`predict_production` — the top layouts of ``candidates.csv``: tokens/s, tokens/s/GPU, MFU and
  peak memory per GPU with p10/p50/p90 and the calibration source. The interval combines the bootstrap
  samples of the fitted Efficiency with the leave-one-out relative errors of the calibration.
"""

from __future__ import annotations

import argparse
import re
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from trainplan import pkgdata
from trainplan.calibration.fitting import fit_efficiency
from trainplan.io import write_csv
from trainplan.model.arch import ModelSpec, resolve_model
from trainplan.model.base import ConfigError
from trainplan.model.efficiency import Efficiency
from trainplan.model.hardware import ClusterSpec, resolve_gpu
from trainplan.model.layout import Layout
from trainplan.model.memory import memory_breakdown
from trainplan.model.timing import step_time
from trainplan.model.training import TrainingSpec
from trainplan.published.validate import (
    comparable_runs,
    error_pool,
    family_class,
    predictive_error_draws,
    validate_all,
)

DATA_DIRS = (pkgdata.path(pkgdata.DATA),)
H100_FILE = "torchtitan_h100_202412.csv"  # pytorch/torchtitan benchmarks/llama3_h100_202412_torchtitan.md
A100_FILE = "torchtitan_a100_and_405b_docs_performance.csv"  # pytorch/torchtitan docs/performance.md @3faaa1a0de
# One free parameter by default: the in-scope published H100 rows (5 runs, 2 models) do not identify
# comm_bw_eff (its standard error exceeds its range); pass params=(..., "comm_bw_eff") with richer data.
DEFAULT_PARAMS = ("gemm_eff_max",)
_MODEL_NAMES = {"llama3.1-8b": "llama3.1-8b", "llama3.1-70b": "llama3.1-70b", "llama3.1-405b": "llama3.1-405b",
                "llama3-8b": "llama3-8b", "llama3-70b": "llama3-70b", "llama2-13b": "llama2-13b",
                "llama2-70b": "llama2-70b"}


def _find(name: str, data_dir: str | Path | None) -> Path:
    for d in ([Path(data_dir)] if data_dir else []) + list(DATA_DIRS):
        if (d / name).exists():
            return d / name
    raise ConfigError("data", name, f"published table not found in {[str(d) for d in DATA_DIRS]}")


def _recompute(s: str) -> str:
    s = str(s).lower()
    return "full" if "full" in s else ("selective" if "selective" in s else "none")


def published_frame(data_dir: str | Path | None = None) -> pd.DataFrame:
    """One row per published run: group, specs fields, measured tokens/s/GPU and memory, in_scope."""
    h = pd.read_csv(_find(H100_FILE, data_dir), dtype=str).fillna("")
    rows = []
    for _, r in h.iterrows():
        dp, tp, pp, cp, lb = (int(r[k]) for k in ("fsdp", "tp", "pp", "cp", "local_batch"))
        rows.append({"group": f"h100-t{r['table']}", "model": r["model"].lower(), "gpu": "h100-sxm-80gb",
                     "num_gpus": int(r["num_gpus"]), "dp": dp, "tp": tp, "pp": pp, "cp": cp,
                     "seq_len": int(r["seq_len"].rstrip("*")), "local_batch": lb,
                     "global_batch": int(r["global_batch"] or lb * dp), "recompute": _recompute(r["activation_ckpt"]),
                     "pp_schedule": "interleaved" if "nterleaved" in r["pp_schedule"] else "1f1b",
                     "tps_per_gpu": float(r["tps_per_gpu"]), "memory_gib": float(r["memory_gib"]),
                     "in_scope": r["float8"] == "no" and r["async_tp"] == "no",
                     "note": f"torchtitan H100 table {r['table']}; compile={r['compile']}"})
    a = pd.read_csv(_find(A100_FILE, data_dir), dtype=str).fillna("")
    for _, r in a.iterrows():
        par = dict(re.findall(r"(FSDP|TP|PP|CP)(\d+)", r["parallelism"]))
        dp, tp = int(par.get("FSDP", 1)), int(par.get("TP", 1))
        gpu = "a100-80gb" if r["gpu"].startswith("A100") else "h100-sxm-80gb"
        lb = int(r["local_batch"])
        rows.append({"group": "a100-docs" if gpu == "a100-80gb" else "h100-405b-docs", "model": r["model"].lower(),
                     "gpu": gpu, "num_gpus": int(r["gpus"]), "dp": dp, "tp": tp, "pp": 1, "cp": 1,
                     "seq_len": int(r["seq_len_default_cfg"]), "local_batch": lb, "global_batch": lb * dp,
                     "recompute": _recompute(r["activation_ckpt"]), "pp_schedule": "1f1b",
                     "tps_per_gpu": float(r["wps_per_gpu"]), "memory_gib": np.nan,
                     "in_scope": r["optimizations"] in ("", "None"), "note": "torchtitan docs/performance.md"})
    df = pd.DataFrame(rows)
    df["in_scope"] &= df["model"].isin(list(_MODEL_NAMES))
    return df


def case_specs(row: Any) -> tuple[ModelSpec, ClusterSpec, TrainingSpec, Layout]:
    """The specs of one published row (torchtitan defaults: FSDP2 full shard, SP with TP, 8 GPUs/node)."""
    model = resolve_model(_MODEL_NAMES[str(row["model"])])
    n = int(row["num_gpus"])
    cluster = ClusterSpec(nodes=max(n // 8, 1), gpus_per_node=min(n, 8), gpu=resolve_gpu(str(row["gpu"])))
    training = TrainingSpec(seq_len=int(row["seq_len"]), global_batch=int(row["global_batch"]))
    pp = int(row["pp"])
    layout = Layout(dp=int(row["dp"]), tp=int(row["tp"]), pp=pp, cp=int(row["cp"]), sp=int(row["tp"]) > 1,
                    sharding="zero3" if int(row["dp"]) * int(row["cp"]) > 1 else "none",
                    recompute=str(row["recompute"]), micro_batch=1 if pp > 1 else int(row["local_batch"]),
                    pp_schedule=str(row["pp_schedule"]), vpp=2 if row["pp_schedule"] == "interleaved" else 1)
    return model, cluster, training, layout


def predict_tps_per_gpu(row: Any, eff: Any) -> float:
    """The analytic model's tokens/s/GPU for a published row (trainplan.model.timing.step_time)."""

    return float(step_time(*case_specs(row), eff)["tokens_per_s_per_gpu"])


# --------------------------------------------------------------------------------------- held out
def heldout_report(eff0: Any = None, *, params: Sequence[str] = DEFAULT_PARAMS, frame: pd.DataFrame | None = None,
                   predict: Callable[[Any, Any], float] = predict_tps_per_gpu) -> pd.DataFrame:
    """Error per held-out table: leave-one-table-out, plus fit on H100 → predict A100.

    Columns: scheme, fit_on, heldout, n, mape, max_abs_err, median_err (signed, predicted/measured − 1),
    and the fitted parameters.
    """
    if eff0 is None:

        eff0 = Efficiency()
    df = published_frame() if frame is None else frame
    df = df[df["in_scope"]].reset_index(drop=True)
    groups = sorted(df["group"].unique())
    schemes: list[tuple[str, list[str], list[str]]] = [
        ("leave-one-table-out", [g for g in groups if g != h], [h]) for h in groups]
    h100 = [g for g in groups if g.startswith("h100")]
    if h100 and len(h100) < len(groups):
        schemes.append(("h100->a100", h100, [g for g in groups if g not in h100]))
    out = []
    for scheme, fit_on, held in schemes:
        tr, te = df[df["group"].isin(fit_on)], df[df["group"].isin(held)]
        if len(tr) <= len(params) or not len(te):
            continue
        eff, _ = fit_efficiency([r for _, r in tr.iterrows()], tr["tps_per_gpu"], predict, eff0, params,
                                bounds={k: (0.05, 1.0) for k in params}, loo=False)
        for h in held:
            t = te[te["group"] == h]
            err = np.array([predict(r, eff) for _, r in t.iterrows()]) / t["tps_per_gpu"].to_numpy() - 1.0
            out.append({"scheme": scheme, "fit_on": "+".join(fit_on), "heldout": h, "n": len(t),
                        "mape": float(np.mean(np.abs(err))), "max_abs_err": float(np.max(np.abs(err))),
                        "median_err": float(np.median(err)), **{k: float(getattr(eff, k)) for k in params}})
    return pd.DataFrame(out)


def main_heldout(argv: Sequence[str] | None = None) -> int:
    """``trainplan validate --heldout``: print the held-out error per published table (optionally write CSV)."""
    ap = argparse.ArgumentParser(prog="trainplan validate --heldout",
                                 description="Fit the analytic model on some published tables, predict the others.",
                                 epilog="example: trainplan validate --heldout --params gemm_eff_max comm_bw_eff")
    ap.add_argument("--params", nargs="+", default=list(DEFAULT_PARAMS), help="Efficiency fields to fit")
    ap.add_argument("--csv", default=None, help="also write the table to this CSV")
    a = ap.parse_args(list(argv or []))
    rep = heldout_report(params=a.params)
    with pd.option_context("display.float_format", "{:.3f}".format, "display.width", 160):
        print(rep.drop(columns="fit_on").to_string(index=False))
    if a.csv:

        write_csv(rep, a.csv)
    return 0


# ------------------------------------------------------------------------------------ production
def predict_production(candidates: pd.DataFrame, model: ModelSpec, cluster: ClusterSpec, training: TrainingSpec,
                       calibration: dict[str, Any], *, top: int = 5, seed: int = 0,
                       quantiles: tuple[float, float] = (0.1, 0.9),
                       step_time_fn: Callable[..., dict[str, Any]] | None = None,
                       memory_fn: Callable[..., dict[str, Any]] | None = None) -> pd.DataFrame:
    """Top feasible layouts with p10/p50/p90 of tokens/s, tokens/s/GPU, MFU and peak memory per GPU."""
    step_time_fn = step_time_fn or step_time
    memory_fn = memory_fn or memory_breakdown
    base = {k: v for k, v in (calibration.get("efficiency") or {}).items() if v is not None}
    eff = Efficiency.from_dict(base)
    samples = [eff.replace(**s) for s in calibration.get("efficiency_samples") or []] or [eff]
    rel_all = np.asarray(calibration.get("loo_relative_errors") or [0.0], dtype=float)
    by_family = calibration.get("heldout_errors_by_family") or {}
    mem_rel = np.asarray(calibration.get("memory_relative_errors") or [0.0], dtype=float)
    rng = np.random.default_rng(seed)
    ql, qh = quantiles
    feas = candidates[candidates["feasible"].astype(bool)] if "feasible" in candidates.columns else candidates
    feas = feas.sort_values("rank") if "rank" in feas.columns else feas
    rows = []
    for _, r in feas.head(top).iterrows():
        layout = Layout.from_row(r)
        st = [step_time_fn(model, cluster, training, layout, e) for e in samples]
        tps = np.array([float(s["tokens_per_s_per_gpu"]) for s in st])
        mfu = np.array([float(s["mfu"]) for s in st])
        k = rng.integers(0, len(tps), size=2000)
        # Held-out errors of this layout's family class on the same GPU generation when calibration has them
        # (validate.error_pool); GPU-proxy calibration and the A100 set give one pool for every layout.
        rel = error_pool(by_family, family_class(layout)) if by_family and not calibration.get("gpu") else rel_all
        # measured = predicted / (1 + relative error); e from the small-sample predictive distribution of the pool
        err = predictive_error_draws(rel, 2000, rng) if by_family and not calibration.get("gpu") else rng.choice(rel, size=2000)
        t_s, m_s = tps[k] / (1.0 + err), mfu[k] / (1.0 + err)
        p50 = step_time_fn(model, cluster, training, layout, eff)
        if memory_fn is not None:
            mem = float(memory_fn(model, cluster, training, layout, eff)["total"])
        else:
            mem = float(r["mem_total_gib"]) * 1024**3
        mem_s = mem / (1.0 + rng.choice(mem_rel, size=2000))
        row = {"rank": r.get("rank", len(rows) + 1), "layout": layout.describe(), "family": layout.family,
               "interval_family": family_class(layout), "interval_errors_n": len(rel),
               "calibration_source": calibration.get("source", "defaults")}
        for name, s, point in (("tokens_per_s_per_gpu", t_s, float(p50["tokens_per_s_per_gpu"])),
                               ("tokens_per_s", t_s * cluster.n_gpus, float(p50["tokens_per_s_per_gpu"]) * cluster.n_gpus),
                               ("mfu", m_s, float(p50["mfu"])), ("mem_peak_bytes", mem_s, mem)):
            lo, hi = np.quantile(s, [ql, qh])
            row |= {f"{name}_p10": float(min(lo, point)), f"{name}_p50": point, f"{name}_p90": float(max(hi, point))}
        row["mem_peak_gib_p50"] = row["mem_peak_bytes_p50"] / 1024**3
        rows.append(row)
    return pd.DataFrame(rows)


# ---------------------------------------------------------------------------- Snakemake stage glue
def _memo_row(r: dict[str, Any], hbm_bytes: float) -> dict[str, Any]:
    """A production row in the memo's shape: GiB quantiles, ``source``, headroom at the p90 memory."""
    out = dict(r)
    for q in ("p10", "p50", "p90"):
        out[f"mem_total_gib_{q}"] = r[f"mem_peak_bytes_{q}"] / 1024**3
    out["source"] = r.get("calibration_source", "defaults")
    out["headroom_frac"] = 1.0 - r["mem_peak_bytes_p90"] / hbm_bytes
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
    feas = feas.sort_values("rank") if "rank" in feas.columns else feas
    if len(feas):
        chosen_lay = Layout.from_row(feas.iloc[0])
        for _, r in feas.iterrows():  # the runner-up family as the memo names it: another sharding × TP × PP
            lay = Layout.from_row(r)
            if lay.family != chosen_lay.family:
                picks.append(("runner-up family", lay.describe(), family_class(lay), float(r["mfu"])))
                break
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
    df = predict_production(candidates, model, cluster, training, calibration, top=int(cfg["search"]["top_k"]),
                            seed=int(calib.get("seed", 0)), quantiles=tuple(calib.get("interval", (0.1, 0.9))))
    rows = [_memo_row(r, cluster.gpu.hbm_bytes) for r in df.to_dict("records")]
    out = pd.DataFrame(rows)
    doc: dict[str, Any] = {
        "source": calibration.get("source", "defaults"), "source_detail": calibration.get("source_detail"),
        "efficiency": calibration.get("efficiency"), "efficiency_sources": calibration.get("efficiency_sources"),
        "chosen": rows[0] if rows else None, "n_layouts": len(rows),
        "interval": {"quantiles": list(calib.get("interval", (0.1, 0.9))),
                     "throughput_errors_n": len(calibration.get("loo_relative_errors") or []),
                     "memory_errors_n": len(calibration.get("memory_relative_errors") or [])},
        "comparable_runs": _comparable(rows, candidates, model, cluster, training),
        "heldout_coverage": calibration.get("heldout_coverage"),
        "extrapolation": list(scaling.get("curves") or []),
        "scaling_evidence": scaling.get("evidence"),
    }
    return out, doc
