"""The memo's figures: one ``plot_x(df, *, ax=None) -> Figure`` per picture, one style, one saver.

Every figure is drawn from a results table (never from typed-in numbers) with the package style
(``trainplan.mplstyle``) and saved by :func:`save_figure` as a deterministic SVG (no date, fixed hash salt)
whose metadata and caption sidecar (``<name>.caption.json``) carry the config hash, the source files and
the calibration source. :func:`make_figures` draws every figure it is given the inputs for (the figures rule's
declared inputs, by name; it reads no other file).
"""

from __future__ import annotations

import json
import os
from collections.abc import Mapping, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import matplotlib

matplotlib.use("Agg")

import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402
import pandas as pd  # noqa: E402
from matplotlib.axes import Axes  # noqa: E402
from matplotlib.figure import Figure  # noqa: E402

from trainplan import pkgdata  # noqa: E402
from trainplan.io import read_json, write_bytes, write_json  # noqa: E402
from trainplan.model.layout import Layout  # noqa: E402
from trainplan.model.timing import STEP_PARTS  # noqa: E402
from trainplan.report.labels import caption_path  # noqa: E402, F401 (re-exported)
from trainplan.report.labels import figure_labels as report_labels  # noqa: E402, F401
from trainplan.search.layouts import LAUNCH_TPS_RATIO, launched_tps  # noqa: E402

STYLE = pkgdata.path(pkgdata.MPL_STYLE)

MEM_TERMS = ("weights", "gradients", "optimizer", "activations", "logits", "buffers", "overhead")


@contextmanager
def _style():
    with plt.style.context(str(STYLE)):
        yield


def _axes(ax: Axes | None, figsize: tuple[float, float] | None = None) -> tuple[Figure, Axes]:
    if ax is not None:
        return ax.figure, ax  # type: ignore[return-value]
    fig = plt.figure(figsize=figsize) if figsize else plt.figure()
    return fig, fig.add_subplot()


def layout_label(row: pd.Series | dict, *, two_lines: bool = False) -> str:
    """A short layout name for axes: the family, then ``Layout.describe(compact=True)`` (the degrees above 1 with
    what describe marks on them: two layouts the memo tells apart must not share a label). ``two_lines``: the
    family on a line of its own (axis labels: the full layout on one line left the bars a third of the figure)."""
    family, rest = str(row.get("family", "")), Layout.from_row(row).describe(compact=True)
    return f"{family}\n{rest}" if two_lines and family else " ".join(p for p in (family, rest) if p)


# ------------------------------------------------------------------------------------------ plots
def plot_memory(df: pd.DataFrame, *, hbm_gib: float | None = None, limit_gib: float | None = None,
                p90: tuple[str, float] | None = None, ax: Axes | None = None) -> Figure:
    """Stacked bars of per-GPU memory terms (``mem_<term>_gib``) per layout, against usable HBM and the search's
    limit (``limit_gib``, ``search.max_hbm_frac`` of it); ``p90``: (layout text, GiB), the chosen layout's memory
    p90, drawn as a whisker on its bar (the estimate alone hid that the p90 is over the limit).

    Bars longer than 1.6× HBM are cut at the axis edge and labelled with their total.
    """
    with _style():
        fig, ax = _axes(ax, (7.0, 0.42 * len(df) + 1.4))
        labels = [layout_label(r, two_lines=True) for _, r in df.iterrows()]
        y = np.arange(len(df))
        left = np.zeros(len(df))
        for term in MEM_TERMS:
            col = f"mem_{term}_gib"
            if col not in df:
                continue
            v = df[col].fillna(0).to_numpy(float)
            ax.barh(y, v, left=left, label=term, height=0.65)
            left += v
        xmax = 1.6 * hbm_gib if hbm_gib else float(left.max()) * 1.05
        for yi, tot in zip(y, left, strict=True):
            if tot > xmax:
                ax.text(xmax * 0.99, yi, f"{tot:.0f} GiB ▸", ha="right", va="center", fontsize=7, color="white",
                        fontweight="bold")
        ax.set_xlim(0, xmax)
        if hbm_gib:
            ax.axvline(hbm_gib, color="black", ls="--", lw=1.0)
            ax.text(hbm_gib, -0.75, f"usable HBM {hbm_gib:.1f} GiB", fontsize=7, ha="left", va="bottom")
        if limit_gib:
            ax.axvline(limit_gib, color="#b22222", ls=":", lw=1.2)
            ax.text(limit_gib, -0.75, f"limit {limit_gib:.1f} ", fontsize=7, ha="right", va="bottom", color="#b22222")
        if p90 is not None and "layout_text" in df:
            rows = np.flatnonzero(df["layout_text"].astype(str).to_numpy() == p90[0])
            if len(rows):
                yi, est = int(rows[0]), float(left[rows[0]])
                ax.plot([est, p90[1]], [yi, yi], color="black", lw=1.2)
                ax.plot([p90[1]], [yi], marker="|", color="black", ms=9)
                ax.text(p90[1] + 0.01 * xmax, yi, f" p90 {p90[1]:.1f}", fontsize=7, ha="left", va="center")
        ax.set_yticks(y, labels)
        ax.set_ylim(len(df) - 0.5, -1.0)
        ax.set_xlabel("memory per GPU (GiB)")
        ax.grid(axis="y", visible=False)
        ax.legend(ncols=7, loc="upper center", bbox_to_anchor=(0.5, -0.1 - 0.5 / max(len(df), 1)))
    return fig


def plot_time_breakdown(df: pd.DataFrame, *, ax: Axes | None = None) -> Figure:
    """Stacked bars of the step time, one segment per term of ``timing.STEP_PARTS`` (compute, exposed
    communication, pipeline bubble, optimizer step, CPU offload; a term zero on every bar is left out): each bar
    ends at the layout's step time."""
    with _style():
        fig, ax = _axes(ax, (7.0, 0.42 * len(df) + 1.4))
        labels = [layout_label(r, two_lines=True) for _, r in df.iterrows()]
        y = np.arange(len(df))
        left = np.zeros(len(df))
        for col, name in STEP_PARTS.items():
            v = df[col].fillna(0).to_numpy(float) if col in df else np.zeros(len(df))
            if not v.any():
                continue
            ax.barh(y, v, left=left, label=name, height=0.65)
            left += v
        ax.set_yticks(y, labels)
        ax.invert_yaxis()
        ax.set_xlabel("time per optimizer step (s)")
        ax.grid(axis="y", visible=False)
        ax.legend(ncols=4, loc="upper center", bbox_to_anchor=(0.5, -0.1 - 0.5 / max(len(df), 1)))
    return fig


def parity_pairs(df: pd.DataFrame) -> list[str]:
    """Metrics that a records table has both ``<m>_pred`` and ``<m>_meas`` columns for."""
    return [c[: -len("_pred")] for c in df.columns if c.endswith("_pred") and f"{c[:-5]}_meas" in df]


def parity_table(df: pd.DataFrame) -> pd.DataFrame:
    """Long table (id, family, metric, predicted, measured, rel_error) from a records table; ``rel_error`` =
    predicted/measured − 1 (the sign of records.csv's ``<m>_rel_err``, ``proxy.aggregate.rel_err``)."""
    rows = []
    ok = df[df["status"] == "ok"] if "status" in df else df
    for m in parity_pairs(ok):
        for _, r in ok.iterrows():
            p, q = r[f"{m}_pred"], r[f"{m}_meas"]
            if pd.notna(p) and pd.notna(q):
                rows.append({"id": r.get("id", ""), "family": r.get("family", ""), "metric": m,
                             "predicted": float(p), "measured": float(q),
                             "rel_error": float(p) / float(q) - 1.0 if float(q) else np.nan})
    return pd.DataFrame(rows, columns=["id", "family", "metric", "predicted", "measured", "rel_error"])


def plot_parity(df: pd.DataFrame, *, ax: Sequence[Axes] | None = None) -> Figure:
    """Left: predicted vs measured per proxy run and metric (log-log, y = x, ±10 %); right: relative errors."""
    long = parity_table(df)
    metrics = sorted(set(long["metric"]))
    with _style():
        if ax is None:
            fig, (a, b) = plt.subplots(1, 2, figsize=(7.0, 3.4), width_ratios=(1.1, 1))
        else:
            a, b = ax
            fig = a.figure  # type: ignore[assignment]
        for i, metric in enumerate(metrics):
            g = long[long["metric"] == metric]
            a.scatter(g["measured"], g["predicted"], s=16, label=metric, alpha=0.85, color=f"C{i}")
            b.scatter(100 * g["rel_error"], np.full(len(g), i) + np.linspace(-0.2, 0.2, len(g)), s=16,
                      color=f"C{i}", alpha=0.85)
        pos = long[["measured", "predicted"]].to_numpy(float)
        pos = pos[pos > 0]
        lo, hi = (pos.min() / 2, pos.max() * 2) if pos.size else (1, 10)
        xs = np.geomspace(lo, hi, 50)
        a.plot(xs, xs, color="black", lw=0.8)
        a.fill_between(xs, xs * 0.9, xs * 1.1, color="grey", alpha=0.2, lw=0, label="±10 %")
        a.set_xscale("log")
        a.set_yscale("log")
        a.set_xlim(lo, hi)
        a.set_ylim(lo, hi)
        a.set_xlabel("measured (proxy run)")
        a.set_ylabel("predicted (analytic model)")
        a.legend(loc="upper left", fontsize=6.5)
        b.axvline(0, color="black", lw=0.8)
        b.axvspan(-10, 10, color="grey", alpha=0.12, lw=0)
        b.set_yticks(range(len(metrics)), metrics)
        b.set_ylim(len(metrics) - 0.5, -0.5)
        b.set_xlabel("(predicted − measured) / measured (%)")
        b.grid(axis="y", visible=False)
    return fig


def plot_extrapolation(df: pd.DataFrame, *, ax: Axes | Sequence[Axes] | None = None) -> Figure:
    """One panel per fit: measured points, fitted line and its interval band, out to the production point.

    ``df`` is long: ``fit, kind ('measured'|'fit'), x, y, y_lo, y_hi`` (+ optional ``x_label, y_label``).
    """
    fits = list(dict.fromkeys(df["fit"]))
    with _style():
        if ax is None:
            # two columns at the printed width (~6.8 in): the labels print at their own size, not scaled to 64%
            ncols = min(2, len(fits))
            nrows = -(-len(fits) // ncols)
            fig, axs = plt.subplots(nrows, ncols, figsize=(3.4 * ncols, 2.5 * nrows), squeeze=False)
            axes = list(axs.ravel())
            for extra in axes[len(fits):]:
                extra.set_visible(False)
        else:
            axes = list(ax) if isinstance(ax, Sequence) else [ax]
            fig = axes[0].figure  # type: ignore[assignment]
        for a, name in zip(axes, fits, strict=False):
            g = df[df["fit"] == name]
            m, f = g[g["kind"] == "measured"], g[g["kind"] == "fit"].sort_values("x")
            if len(f):
                a.fill_between(f["x"], f["y_lo"], f["y_hi"], alpha=0.25, lw=0, label="interval")
                a.plot(f["x"], f["y"], lw=1.2, label="fit")
            a.scatter(m["x"], m["y"], s=20, color="black", zorder=3, label="measured")
            a.set_title(str(name), fontsize=8.5)
            if "x_label" in g and g["x_label"].notna().any():
                a.set_xlabel(str(g["x_label"].dropna().iloc[0]))
            if "y_label" in g and g["y_label"].notna().any():
                a.set_ylabel(str(g["y_label"].dropna().iloc[0]))
            a.legend(loc="best")  # "upper left" covered the scale-out panel's world-size-1 point
    return fig


def plot_cost(df: pd.DataFrame, *, ax: Axes | Sequence[Axes] | None = None) -> Figure:
    """One row per target: the p10–p90 interval, the p50 and the target line, coloured and titled by the row's
    verdict (green pass, amber at risk: the p50 meets the target, the p10/p90 does not; red fail)."""
    with _style():
        if ax is None:
            fig, axs = plt.subplots(len(df), 1, figsize=(6.5, 0.75 * len(df) + 0.5), squeeze=False)
            axes = list(axs[:, 0])
        else:
            axes = list(ax) if isinstance(ax, Sequence) else [ax]
            fig = axes[0].figure  # type: ignore[assignment]
        for a, (_, r) in zip(axes, df.iterrows(), strict=False):
            verdict = str(r["verdict"]) if "verdict" in r and isinstance(r["verdict"], str) else (
                "pass" if bool(r["pass"]) else "fail")
            color = {"pass": "#2e7d32", "at risk": "#ef6c00"}.get(verdict, "#c62828")
            a.hlines(0, r["p10"], r["p90"], lw=6, color=color, alpha=0.45)
            a.plot([r["p50"]], [0], "o", color=color)
            a.axvline(r["target"], color="black", ls="--", lw=1)
            lo = min(r["p10"], r["target"])
            hi = max(r["p90"], r["target"])
            pad = 0.15 * (hi - lo or abs(hi) or 1)
            a.set_xlim(lo - pad, hi + pad)
            a.set_yticks([])
            a.grid(axis="y", visible=False)
            a.spines["left"].set_visible(False)
            a.set_title(f"{r['name']} ({r['unit']}): {verdict if verdict == 'pass' else verdict.upper()}", fontsize=8,
                        loc="left")
    return fig


def plot_tornado(df: pd.DataFrame, *, ax: Axes | None = None) -> Figure:
    """Tornado chart: each assumption moved across its range, the change of the metric from its base."""
    d = df.assign(span=(df["metric_high"] - df["metric_low"]).abs()).sort_values("span", ascending=True)
    with _style():
        fig, ax = _axes(ax, (6.5, 0.3 * len(d) + 1.1))
        base = float(d["metric_base"].iloc[0])
        y = np.arange(len(d))
        ax.barh(y, d["metric_low"] - base, left=base, color="#1f4e79", label="assumption at low end")
        ax.barh(y, d["metric_high"] - base, left=base, color="#e07b39", label="assumption at high end")
        ax.axvline(base, color="black", lw=0.8)
        units = d["unit"].fillna("").astype(str) if "unit" in d else pd.Series("", index=d.index)
        labels = [f"{r.parameter} ({short_number(r.low_value)}–{short_number(r.high_value)} {u})".replace(" )", ")")
                  for r, u in zip(d.itertuples(), units, strict=True)]
        ax.set_yticks(y, labels)
        ax.grid(axis="y", visible=False)
        metric = str(d["metric"].iloc[0]) if "metric" in d else "metric"
        ax.set_xlabel(metric)
        ax.legend(loc="lower right")
    return fig


def short_number(v: float) -> str:
    """A tick-label number: three significant digits, thousands as k/M/B/T (5e9 → 5B, 0.942048 → 0.942)."""
    v = float(v)
    for scale, suffix in ((1e12, "T"), (1e9, "B"), (1e6, "M"), (1e3, "k")):
        if abs(v) >= scale:
            return f"{v / scale:.3g}{suffix}"
    return f"{v:.3g}"


def plot_pareto(df: pd.DataFrame, *, ax: Axes | None = None) -> Figure:
    """Feasible layouts: throughput per GPU (of what the launch runs, as the search ranks them) vs memory headroom;
    the Pareto front and the chosen layout."""
    f = df[df["feasible"].astype(bool)]
    f = f.assign(_tps=launched_tps(f, "tokens_per_s_per_gpu"))
    with _style():
        fig, ax = _axes(ax, (6.0, 3.6))
        ax.scatter(f["headroom_frac"] * 100, f["_tps"], s=6 if len(f) > 500 else 10,
                   color="#bbbbbb", label=f"feasible ({len(f):,})", rasterized=len(f) > 500, lw=0)
        p = f[f["pareto"].astype(bool)].sort_values("headroom_frac")
        ax.plot(p["headroom_frac"] * 100, p["_tps"], "o-", ms=4, label="Pareto front")
        best = f[f["rank"] == f["rank"].min()]
        ax.scatter(best["headroom_frac"] * 100, best["_tps"], marker="*", s=160, color="#b83b5e",
                   zorder=4, label="recommended (rank 1)")
        ax.set_xlabel("memory headroom (% of usable HBM)")
        moved = LAUNCH_TPS_RATIO in f and bool((f[LAUNCH_TPS_RATIO].fillna(1.0) != 1.0).any())
        ax.set_ylabel("tokens/s per GPU (analytic" + (", as launched)" if moved else ")"))
        # below the axes: with thousands of layouts every corner of the plot holds points
        ax.legend(loc="upper center", bbox_to_anchor=(0.5, -0.16), ncol=3)
    return fig


# ------------------------------------------------------------------------------------------ saving
def save_figure(fig: Figure, path: str | Path, *, caption: str, config_hash: str, sources: Sequence[str],
                calibration_source: str | None = None) -> Path:
    """Write ``fig`` as a deterministic SVG with metadata, plus ``<stem>.caption.json``; close the figure."""
    import io

    p = Path(path)
    src = list(sources)
    meta = {"Date": None, "Title": p.stem, "Description": caption, "Identifier": f"config_hash={config_hash}",
            "Source": "; ".join(src), "Creator": "trainplan figures.py",
            "Coverage": f"calibration_source={calibration_source or 'n/a'}"}
    buf = io.BytesIO()
    with _style():
        fig.savefig(buf, format="svg", metadata=meta, dpi=200)
    plt.close(fig)
    write_bytes(p, buf.getvalue())
    write_json(caption_path(p), {"figure": p.name, "caption": caption, "config_hash": config_hash,
                                 "sources": src, "calibration_source": calibration_source})
    return p


# ------------------------------------------------------------------------------------- all figures
def _sidecar(path: Path) -> dict:
    """The provenance sidecar of a results file (``<file>.provenance.json``), or {} if it has none."""
    sc = path.with_name(path.name + ".provenance.json")
    return read_json(sc) if sc.exists() else {}


def _hash(paths: Sequence[Path]) -> str:
    hashes = sorted({_sidecar(p).get("config_hash") or "no-sidecar" for p in paths})
    return "+".join(hashes)


def representative_layouts(cand: pd.DataFrame, n: int = 10, n_infeasible: int = 3) -> pd.DataFrame:
    """Best feasible layout of the top families (by rank), then up to ``n_infeasible`` infeasible families
    (each by its smallest-memory layout, smallest first), so the figure shows both winners and why others fail.
    """
    good, bad = [], []
    for _fam, g in cand.groupby("family", sort=False):
        ok = g[g["feasible"].astype(bool)]
        if len(ok):
            good.append(ok.sort_values("rank").iloc[0])
        else:
            bad.append(g.sort_values("mem_total_gib").iloc[0])
    good_df = pd.DataFrame(good).sort_values("rank") if good else cand.iloc[:0]
    bad_df = pd.DataFrame(bad).sort_values("mem_total_gib") if bad else cand.iloc[:0]
    k = min(n_infeasible, len(bad_df))
    return pd.concat([good_df.head(n - k), bad_df.head(k)]).reset_index(drop=True)


# The named inputs make_figures reads (the figures rule's ``input:`` keys) and where a results tree keeps them.
FIGURE_INPUTS = {"candidates": "analytic/candidates.csv", "summary": "analytic/summary.json",
                 "records": "proxies/records.csv", "calibration": "calibration/calibration.json",
                 "production": "prediction/production.json", "cost": "cost/cost.json",
                 "sensitivity": "cost/sensitivity.csv"}


def figure_inputs(results_dir: str | Path) -> dict[str, Path]:
    """The input mapping of :func:`make_figures` for a results tree laid out as the study writes it (for tests and
    ad-hoc use; the figures stage passes its rule's declared inputs)."""
    r = Path(results_dir)
    return {k: r / rel for k, rel in FIGURE_INPUTS.items()}


def _results_root(paths: Sequence[Path]) -> Path:
    """The results dir of ``paths`` (each ``<results>/<stage>/<file>``): the common path of their grandparents."""
    return Path(os.path.commonpath([str(p.parent.parent) for p in paths])) if paths else Path(".")


def make_figures(inputs: Mapping[str, str | Path], out_dir: str | Path, *, hbm_gib: float | None = None,
                 results_root: str | Path | None = None) -> dict[str, Path]:
    """Draw every figure whose inputs are given and exist; return ``{name: svg path}``.

    ``inputs`` maps the names of :data:`FIGURE_INPUTS` to paths (the figures rule's ``input``); only those paths
    (and their provenance sidecars, for the config hash) are read. ``results_root`` only names the sources in the
    caption sidecars (``cost/cost.json``: relative to it); default the common results dir of the inputs.
    """
    given = {k: Path(v) for k, v in inputs.items() if k in FIGURE_INPUTS and v}
    out = Path(out_dir)
    root = Path(results_root) if results_root is not None else _results_root(list(given.values()))

    def path(name: str) -> Path | None:
        p = given.get(name)
        return p if p is not None and p.exists() else None

    calib = path("calibration")
    cal_src = read_json(calib).get("source") if calib else None
    made: dict[str, Path] = {}

    def rel(p: Path) -> str:
        try:
            return str(p.relative_to(root))
        except ValueError:
            return str(p)

    def emit(name: str, fig: Figure, caption: str, inputs: Sequence[Path]) -> None:
        made[name] = save_figure(fig, out / f"{name}.svg", caption=caption, config_hash=_hash(inputs),
                                 sources=[rel(p) for p in inputs], calibration_source=cal_src)

    prod_p = path("production")
    prod = read_json(prod_p) if prod_p else {}  # the chosen layout's memory (memory figure), the extrapolation
    cand_p = path("candidates")
    if cand_p:
        cand = pd.read_csv(cand_p, low_memory=False)
        rep = representative_layouts(cand)
        hbm = hbm_gib
        if hbm is None:
            s = path("summary")
            hbm = read_json(s).get("hbm_gib") if s else None
        n_fam, n_ok = cand["family"].nunique(), int(rep["feasible"].astype(bool).sum())
        shown = (f"the best layout of each of the {n_ok} fastest of {n_fam} families"
                 + (f" and the leanest layout of {len(rep) - n_ok} where none fits" if len(rep) > n_ok else ""))
        ch = prod.get("chosen") or {}
        limit = ch.get("mem_limit_gib")
        p90 = (str(ch["layout"]), float(ch["mem_total_gib_p90"])) if ch.get("layout") and \
            ch.get("mem_total_gib_p90") is not None else None
        emit("memory", plot_memory(rep, hbm_gib=hbm, limit_gib=limit, p90=p90),
             f"Predicted peak memory per GPU by term, for {shown}, against usable HBM"
             + (f" and the search's limit ({limit:.1f} GiB, dotted); the chosen layout's memory p90 as a whisker"
                if limit else "") + ".", [cand_p] + ([prod_p] if prod_p else []))
        emit("time_breakdown", plot_time_breakdown(rep[rep["feasible"].astype(bool)]),
             f"Predicted time per optimizer step by term, for the best layout of each of the {n_ok} fastest of "
             f"{n_fam} families (all in Alternatives considered).", [cand_p])
        if cand["feasible"].astype(bool).any():
            emit("pareto", plot_pareto(cand),
                 "Every feasible layout: predicted tokens/s per GPU against memory headroom; Pareto front.",
                 [cand_p])
    rec_p = path("records")
    if rec_p:
        rec = pd.read_csv(rec_p)
        if len(parity_table(rec)):
            emit("parity", plot_parity(rec),
                 "Analytic prediction against proxy measurement for every proxy run and metric.", [rec_p])
    if prod_p:
        ext = prod.get("extrapolation") or []
        if ext:
            emit("extrapolation", plot_extrapolation(pd.DataFrame(ext)),
                 "Scaling fits of the proxies' device-independent quantities, each along one axis (depth, width, "
                 "world size) out to the production model's value on that axis, with prediction intervals.", [prod_p])
    cost_p = path("cost")
    if cost_p:
        targets = pd.DataFrame(read_json(cost_p).get("targets") or [])
        if len(targets):
            emit("cost", plot_cost(targets),
                 "Wall-clock, cost and throughput intervals (p10–p90, dot = p50) against the study's targets.",
                 [cost_p])
    sens_p = path("sensitivity")
    if sens_p:
        sens = pd.read_csv(sens_p)
        if len(sens):
            metric = str(sens["metric"].iloc[0]) if "metric" in sens else "the headline metric"
            emit("tornado", plot_tornado(sens),
                 f"Sensitivity: each assumption moved across its range, one at a time; the change in {metric}.",
                 [sens_p])
    return made


def read_caption(svg: str | Path) -> dict[str, Any]:
    """The caption sidecar of a saved figure."""
    return json.loads(caption_path(svg).read_text(encoding="utf-8"))


