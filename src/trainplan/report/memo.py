"""The PDF design memo: results files → jinja2 HTML (+ CSS, SVG figures) → WeasyPrint PDF.

Every number in the memo is read from a results file (docs/ARCHITECTURE.md, "Result files") and passed
through one formatting helper, :func:`fmt`; nothing is retyped. A missing optional input renders as an
explicit "not available in this run" box. The resolved config and the provenance table are attached to
the PDF, and the bytes are reproducible: dates come from ``SOURCE_DATE_EPOCH`` (fixed default), never now.
"""

from __future__ import annotations

import datetime as dt
import hashlib
import json
import math
import os
import re
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

import pandas as pd

from trainplan import pkgdata
from trainplan.cost.budget import duration_text, point_usd
from trainplan.io import read_json, write_bytes
from trainplan.launch.artifacts import DAY1_THROUGHPUT_STEPS, peak_as_launched
from trainplan.model.estimate import DEFAULT_MAX_MEM_FRAC
from trainplan.model.layout import Layout
from trainplan.model.timing import STEP_PARTS, attention_kernel_rel
from trainplan.provenance import sidecar_path
from trainplan.proxy.torchrun import ALLOC_CONF
from trainplan.published.fit import HELDOUT_TARGETS, bias_se
from trainplan.published.intervals import (
    error_pool,
    family_class,
    interval_bounds,
    memory_interval_factors,
    memory_pool_peaks,
)
from trainplan.published.tables import NEVER_FITTED
from trainplan.report.figures import parity_table, representative_layouts, short_number
from trainplan.report.labels import memo_labels as report_labels  # noqa: F401 (re-exported)
from trainplan.search.layouts import (
    LAUNCH_OOM,
    LAUNCH_TPS_RATIO,
    LAUNCH_UNTIMED,
    TIE_FRAC,
    UNTIMED_MARGIN,
    best_row,
    family_layout,
    group_infeasible,
    launched_tps,
    rank_tps,
    ranked,
    runner_up_index,
    shards_alike_mask,
    tie_gap,
    tie_pct,
    untimed,
)

# The template and stylesheet (package data; in a checkout symlinks to report/templates/, which the memo rule
# declares as inputs and passes in): render_memo reads the paths it is given, these by default.
TEMPLATE = pkgdata.MEMO_TEMPLATE
CSS_FILE = pkgdata.MEMO_CSS
DEFAULT_EPOCH = 315532800  # 1980-01-01T00:00:00Z, used when SOURCE_DATE_EPOCH is unset
FAMILIES_SHOWN = 14  # rows of the alternatives table when it is truncated (plus the chosen and every OOM family)
FAMILIES_ALL_MAX = 20  # up to this many families (the coarse sharding × TP × PP ones) the table shows them all
INLINE_MAX_LINES = 30  # launch artifacts longer than this are attached, not printed

FIGURES = ("memory", "time_breakdown", "pareto", "parity", "extrapolation", "cost", "tornado")
SOURCE_LABELS = {
    "gpu-proxies": "GPU proxy runs (efficiencies as fractions of peak; device named in the calibration notes)",
    "published-open-set": ("the Efficiency fitted on the open published runs of the study's GPU generation (H100: "
                           "torchtitan H100 and async TP, Megatron-Core 2024, Llama 3 405B; A100: Narayanan 2021 "
                           "T1 and T2, Korthikanti 2022 T3/5, torchtitan 64×A100; docs/timing-model.md §7), with "
                           "intervals from their leave-one-table-out errors; not this cluster"),
    # the same, naming only the study's generation's tables (page 1 has no room for the other's)
    "published-open-set:h100": ("the Efficiency fitted on the open published H100 runs (torchtitan H100 and async "
                                "TP, Megatron-Core 2024, Llama 3 405B; docs/timing-model.md §7), with intervals from "
                                "their leave-one-table-out errors; not this cluster"),
    "published-open-set:a100": ("the Efficiency fitted on the open published A100 runs (Narayanan 2021 T1 and T2, "
                                "Korthikanti 2022 T3/5, torchtitan 64×A100; docs/timing-model.md §7), with intervals "
                                "from their leave-one-table-out errors; not this cluster"),
    "published-h100": "published H100 measurements (bundled data/, cited), not this cluster",
    "defaults": "uncalibrated defaults (no measurements)",
}
# The proxy families of the own-GPU check table (config/gpu_proxies.yaml), as the memo names them.
PROXY_FAMILY_LABELS = {"all": "all runs", "depth": "depth slice (1–4 layers, seq 4096)", "width": "width ladder (seq 4096)",
                       "layout": "sequence ladder (1k–16k, same tokens)", "scaleout": "scale-out (1 GPU)"}


# ------------------------------------------------------------------------------------- formatting
def fmt(value: Any, kind: str = "num") -> str:
    """The one number formatter of the memo. kinds: int, num, gib, pct, tie (a gap under the tie threshold: search.layouts.tie_pct), slower (x% slower or faster), rival (slower, a tie as tie_pct prints it), pct0, spct (signed), ratio2, usd, rate (a price: cents
    unless whole dollars), h, dur (hours with the unit: minutes below one hour), frac3, sci, s, short (k/M/B/T)."""
    if value is None or (isinstance(value, float) and not math.isfinite(value)):
        return "n/a"
    if isinstance(value, bool):
        return "yes" if value else "no"
    if isinstance(value, str):
        return value
    v = float(value)
    if kind == "int":
        return f"{v:,.0f}"
    if kind == "dur":
        return duration_text(v)
    if kind in ("gib", "h"):
        return f"{v:,.1f}"
    if kind == "pct":
        return f"{100 * v:.1f}%"
    if kind == "tie":  # a gap under TIE_FRAC (0.5%): one decimal would round 0.49% up to the threshold it is under
        return tie_pct(v)
    if kind == "slower":  # a layout against the chosen one: faster within a tie reads as faster, not "-0.5% slower"
        return f"{100 * v:.1f}% slower" if v >= 0 else f"{-100 * v:.1f}% faster"
    if kind == "rival":  # "slower" for the runner-up, which page 1's tie clause may have named: a tie as it prints it
        gap = tie_gap(1.0, 1.0 - v)  # v = 1 − its speed / the chosen one's
        if gap >= TIE_FRAC:
            return fmt(v, "slower")
        return f"{tie_pct(gap)} slower" if v >= 0 else f"{tie_pct(gap)} faster"
    if kind == "pct0":  # a configured fraction: 90%
        return f"{100 * v:.0f}%"
    if kind == "ratio2":  # a factor: ×1.16
        return f"{v:.2f}"
    if kind == "spct":  # signed: a change
        return f"{100 * v:+.1f}%"
    if kind == "usd":
        return f"${v:,.0f}"
    if kind == "rate":
        return f"${v:,.0f}" if v == round(v) else f"${v:,.2f}"
    if kind == "frac3":
        return f"{v:.3f}"
    if kind == "sci":
        return f"{v:.3g}"
    if kind == "s":
        return f"{v:.3g}"
    if kind == "short":  # as the tornado's tick labels: 5B, 20B, 0.942
        return short_number(v)
    return f"{v:,.4g}" if abs(v) < 1e5 else f"{v:.3g}"


def source_date() -> dt.datetime:
    """The memo's one date: ``SOURCE_DATE_EPOCH`` (reproducible builds convention), else 1980-01-01."""
    epoch = int(os.environ.get("SOURCE_DATE_EPOCH", DEFAULT_EPOCH))
    return dt.datetime.fromtimestamp(epoch, tz=dt.UTC).replace(tzinfo=None)


# ---------------------------------------------------------------------------------------- loading
# The named inputs the memo reads (the memo rule's ``input:`` keys) and where a results tree keeps them. Besides
# these files it reads: the figure SVGs and their caption sidecars in ``figures``; the launch files that
# ``launch`` (manifest.json, the launch_artifacts rule's declared output) lists, next to it (the rest of that
# rule's output set); and the provenance sidecar (``<file>.provenance.json``) of each of them.
MEMO_INPUTS = {
    "summary": "analytic/summary.json", "candidates": "analytic/candidates.csv",
    "families": "analytic/families.csv", "techniques": "analytic/techniques.csv",
    "proxy_set": "proxies/proxy_set.json", "proxy_runs": "proxies/runs/{id}.json", "records": "proxies/records.csv",
    "calibration": "calibration/calibration.json", "heldout": "calibration/heldout.csv",
    "scaling": "calibration/scaling.json", "production": "prediction/production.json",
    "production_table": "prediction/production.csv", "cost": "cost/cost.json", "sensitivity": "cost/sensitivity.csv",
    "figures": "figures", "launch": "launch/manifest.json",
}


def memo_inputs(results_dir: str | Path) -> dict[str, Any]:
    """The input mapping of :func:`build_context` for a results tree laid out as the study writes it (for tests
    and ad-hoc use; the memo stage passes its rule's declared inputs). ``proxy_runs``: the runs proxy_set.json
    names, if it exists."""
    r = Path(results_dir)
    out: dict[str, Any] = {k: r / rel for k, rel in MEMO_INPUTS.items() if k != "proxy_runs"}
    ps = r / MEMO_INPUTS["proxy_set"]
    ids = [p["id"] for p in read_json(ps).get("proxies", [])] if ps.exists() else []
    out["proxy_runs"] = [r / MEMO_INPUTS["proxy_runs"].format(id=i) for i in ids]
    return out


def _paths(value: Any) -> list[Path]:
    if value is None or value == "":
        return []
    return [Path(v) for v in value] if isinstance(value, list | tuple) else [Path(value)]


def _results_root(inputs: Mapping[str, Any]) -> Path:
    """The results dir of the inputs (each sits at its MEMO_INPUTS place under it): the common path."""
    roots = [p.parents[len(Path(MEMO_INPUTS[k]).parts) - 1] for k, v in inputs.items() if k in MEMO_INPUTS
             for p in _paths(v)]
    return Path(os.path.commonpath([str(r) for r in roots])) if roots else Path(".")


def launch_files(manifest: str | Path | None) -> list[Path]:
    """The launch files manifest.json lists (``artifacts``), next to it: the rest of the launch_artifacts rule's
    output set (its declared output is the manifest; the sbatch file's name depends on the cluster)."""
    if manifest is None or not Path(manifest).is_file():
        return []
    m = Path(manifest)
    names = [a["filename"] for a in read_json(m).get("artifacts") or [] if a.get("filename")]
    return [m.parent / n for n in sorted(set(names))]


class Inputs:
    """Read-only view of the memo's named inputs; a missing one is ``None`` (the memo shows it as missing).

    ``root`` (the results dir) only names files (the provenance table, the figures' ``src``); nothing is found
    under it."""

    def __init__(self, inputs: Mapping[str, Any], root: str | Path | None = None):
        self.inputs = dict(inputs)
        self.root = Path(root) if root is not None else _results_root(self.inputs)

    def path(self, name: str) -> Path | None:
        v = self.inputs.get(name)
        return Path(v) if isinstance(v, str | Path) and str(v) else None

    def json(self, name: str) -> dict | None:
        p = self.path(name)
        return read_json(p) if p is not None and p.is_file() else None

    def csv(self, name: str) -> pd.DataFrame | None:
        p = self.path(name)
        return pd.read_csv(p, low_memory=False) if p is not None and p.is_file() else None

    def files(self) -> list[Path]:
        """Every results file the memo reads: the inputs, the SVGs of ``figures``, the launch files."""
        out: list[Path] = []
        for k, v in self.inputs.items():
            if k not in MEMO_INPUTS:
                continue  # template, stylesheet, benchmark TSVs: not results files
            for p in _paths(v):
                if k == "figures":
                    out += sorted(p.glob("*.svg")) if p.is_dir() else []
                elif k == "launch":
                    out += [p, *launch_files(p)]
                else:
                    out.append(p)
        return out

    def _name(self, p: Path) -> str:
        try:
            return str(p.relative_to(self.root))
        except ValueError:
            return str(p)

    def sidecars(self) -> list[tuple[str, dict]]:
        """The ``<file>.provenance.json`` of every file in :meth:`files` that has one, with
        ``git_commit``/``git_dirty`` flattened; named relative to the results dir, in path order."""
        out = []
        for sc in sorted({sidecar_path(f) for f in self.files() if sidecar_path(f).is_file()}):
            rel = self._name(sc)[: -len(".provenance.json")]
            d = read_json(sc)
            git = d.get("git") if isinstance(d.get("git"), dict) else {}
            d.setdefault("git_commit", git.get("commit"))
            d.setdefault("git_dirty", git.get("dirty"))
            out.append((rel, d))
        return out


# Display names of the presets in a memo title (any other model: its ModelSpec name, e.g. a Hugging Face repo id)
PRESET_TITLES = {"llama2-7b": "Llama-2-7B", "llama2-13b": "Llama-2-13B", "llama2-70b": "Llama-2-70B",
                 "llama3-8b": "Llama-3-8B", "llama3.1-8b": "Llama-3.1-8B", "llama3-70b": "Llama-3-70B",
                 "llama3.1-70b": "Llama-3.1-70B", "llama3.1-405b": "Llama-3.1-405B"}
FINETUNE_TITLES = {"full": "Full fine-tune", "lora": "LoRA fine-tune", "qlora": "QLoRA fine-tune"}
TITLE_FIELD = re.compile(r"\{(model|n_gpus|gpu|finetune)\}")


def gpu_label(name: Any) -> str:
    """The short name of a GPU (``h100-sxm-80gb`` → ``H100``) for running text; ``GPU`` when unknown."""
    return str(name or "").split("-")[0].upper() or "GPU"


def _title(config: dict, summary: dict | None = None) -> str:
    """The memo title: ``memo.title`` from the config, else ``study.name``. ``{model}``, ``{n_gpus}``, ``{gpu}``
    and ``{finetune}`` in it are filled from the study's results (analytic/summary.json) and config, so that an
    overlay that changes the model or the cluster cannot inherit a title naming the default's; any other brace
    is left as written."""
    title = "trainplan study"
    for section, key in (("memo", "title"), ("study", "name")):
        sec = config.get(section)
        if isinstance(sec, dict) and sec.get(key):
            title = str(sec[key])
            break
    model = (summary or {}).get("model") or {}
    name = str(model.get("name") or "the model")
    gpu = (summary or {}).get("gpu")
    fields = {"model": PRESET_TITLES.get(name, name), "n_gpus": str((summary or {}).get("n_gpus") or "?"),
              "gpu": gpu_label(gpu),
              "finetune": FINETUNE_TITLES.get(str((config.get("training") or {}).get("finetune", "full")),
                                              "Fine-tune")}
    return TITLE_FIELD.sub(lambda m: fields[m.group(1)], title)


def _records(df: pd.DataFrame | None) -> list[dict]:
    if df is None:
        return []
    return [{k: (None if isinstance(v, float) and math.isnan(v) else v) for k, v in r.items()}
            for r in df.to_dict("records")]


def _flatten(d: Any, prefix: str = "") -> list[tuple[str, str]]:
    if isinstance(d, dict):
        out: list[tuple[str, str]] = []
        for k in sorted(d, key=str):
            out += _flatten(d[k], f"{prefix}.{k}" if prefix else str(k))
        return out
    return [(prefix, json.dumps(d) if isinstance(d, list | tuple) else str(d))]


LORA_KEYS = ("training.lora_rank", "training.lora_targets")  # read only by lora/qlora fine-tunes


def _assumptions(config: dict) -> list[tuple[str, str]]:
    """The study assumptions table: the resolved model, cluster, training, cost and target keys; the LoRA keys only
    when the fine-tune uses adapters; whole-number floats with thousands separators (10,000,000,000, not 1e10's
    "10000000000.0")."""
    full = (config.get("training") or {}).get("finetune", "full") == "full"
    rows = []
    for s in ("model", "cluster", "training", "cost", "targets"):
        for k, v in _flatten(config.get(s), s):
            if full and k in LORA_KEYS:
                continue
            try:
                x = float(v)  # str(True) is not a number: booleans stay as written
            except ValueError:
                x = 0.0
            rows.append((k, f"{int(x):,}" if x.is_integer() and abs(x) >= 1e4 else v))
    return rows


# ----------------------------------------------------------------------------------- the sections
def _validation(rec: pd.DataFrame | None) -> dict | None:
    """Per metric: how many proxy runs, median and worst relative error of prediction vs measurement."""
    if rec is None:
        return None

    long = parity_table(rec)
    metrics = []
    for m, g in long.groupby("metric", sort=True):
        err = g["rel_error"].abs()
        metrics.append({"metric": m, "n": len(g), "median_abs_err": float(err.median()),
                        "max_abs_err": float(err.max())})
    status = rec["status"].value_counts().to_dict() if "status" in rec else {}
    devices = sorted(set(rec["device"].dropna().astype(str))) if "device" in rec else []
    loss = None
    if "loss_step0" in rec and rec["loss_step0"].notna().any():
        ok = rec[rec["status"] == "ok"] if "status" in rec else rec
        # Loss parity only means something between runs of the same model on the same data: take the
        # largest group of runs sharing the model (different layouts / world sizes of one proxy model).
        if "model" in ok and ok["model"].notna().any():
            ok = ok[ok["model"] == ok["model"].value_counts().index[0]]
        ls = ok["loss_step0"].dropna()
        loss = {"n": len(ls), "spread": float(ls.max() - ls.min()), "value": float(ls.median()),
                "model": str(ok["model"].iloc[0]) if "model" in ok and len(ok) else ""}
    return {"n_runs": len(rec), "status": {str(k): int(v) for k, v in sorted(status.items())},
            "devices": devices, "gpu_measured": any(d.startswith("cuda") for d in devices), "metrics": metrics,
            "runs": _records(rec[[c for c in ("id", "family", "device", "world_size", "status") if c in rec]]),
            "loss": loss}


def _families(fam: pd.DataFrame | None, top: int = FAMILIES_SHOWN) -> dict[str, Any]:
    """The family table: every family if there are at most FAMILIES_ALL_MAX, else the ``top`` first rows (the
    file is ranked), the chosen one and every OOM family."""
    if fam is None or not len(fam):
        return {"families": None, "families_total": 0, "families_launched": False}
    verdict = fam["verdict"].astype(str) if "verdict" in fam else pd.Series("", index=fam.index)
    keep = (fam.index < top) | (verdict == "chosen") | verdict.str.startswith("OOM") | (len(fam) <= FAMILIES_ALL_MAX)
    rows = _records(fam[keep])
    for r in rows:  # producer column names: best_layout/line (search.family_verdicts) or layout/reason
        r["layout_text"] = r.get("best_layout") or r.get("layout") or ""
        plan, run = r.get("tokens_per_s_per_gpu"), r.get("tokens_per_s_per_gpu_launched")
        moved = run is not None and run == run and plan is not None and abs(float(run) - float(plan)) > 1e-9 * float(plan)
        r["tps_shown"], r["tps_moved"] = (run if moved else plan), moved  # the speed the search ranked on
        v = str(r.get("verdict") or "")
        r["why"] = r.get("line") or (f"{v}: {r['reason']}" if r.get("reason") else v)
    # families ruled out for one reason are one row (24 GPUs, batch 256: five shardings all fail as dp24)
    merged, shown = group_infeasible(rows, key="why"), int(keep.sum())
    return {"families": merged, "families_total": len(fam), "families_shown": shown,
            "families_launched": any(r["tps_moved"] for r in merged)}


LAUNCH_SHOW_FRAC = 0.01  # page 1 gives the launch its own row where a modelled figure moves by at least this much


def launched_figures(chosen: dict[str, Any] | None, manifest: dict[str, Any] | None,
                     mem_errors: Sequence[float] = (), usable_hbm_gib: float | None = None) -> dict[str, Any] | None:
    """What the sbatch runs, where its trainer deviates from the plan (the manifest's ``trainer.as_launched``,
    :func:`trainplan.launch.artifacts.as_launched`): the chosen layout's p10/estimate/p90 of throughput and memory
    times the modelled ratios of what runs (None where a ratio is not modelled: the plan's figure stands), whether
    page 1 shows each (a move of LAUNCH_SHOW_FRAC or more), and the memory verdict against the search's limit:
    fail (the estimate above it), at risk (the p90), pass; with how many of the memory model's errors
    (``mem_errors``, production.json's pool) put the launch's peak over the limit and over usable HBM, as the plan's
    row counts them. None when the launch runs the plan as planned."""
    al = ((manifest or {}).get("trainer") or {}).get("as_launched")
    if not al or not chosen:
        return None
    out: dict[str, Any] = {"trainer": al.get("trainer"), "changes": list(al.get("changes") or []),
                           "unmodelled": list(al.get("unmodelled") or []), "tps": None, "mem": None,
                           "tps_ratio": al.get("throughput_ratio"), "mem_ratio": al.get("memory_ratio")}
    for key, ratio, field in (("tps", al.get("throughput_ratio"), "tokens_per_s_per_gpu"),
                              ("mem", al.get("memory_ratio"), "mem_total_gib")):
        if ratio is not None and all(chosen.get(f"{field}_{p}") is not None for p in ("p10", "p50", "p90")):
            out[key] = {p: float(chosen[f"{field}_{p}"]) * float(ratio) for p in ("p10", "p50", "p90")}
            out[f"{key}_show"] = abs(float(ratio) - 1.0) >= LAUNCH_SHOW_FRAC
    limit = chosen.get("mem_limit_gib")
    if out["mem"] is not None and limit:
        m = out["mem"]
        out["mem_verdict"] = ("fail" if m["p50"] > float(limit) else "at risk" if m["p90"] > float(limit) else "pass")
        peaks = memory_pool_peaks(m["p50"], list(mem_errors))  # what each pool error makes the launch's peak
        out["mem_errors_n"] = len(peaks)
        out["mem_over_limit_errors"] = int((peaks > float(limit)).sum())
        out["mem_over_hbm_errors"] = int((peaks > float(usable_hbm_gib)).sum()) if usable_hbm_gib else None
    return out


def runner_up(families: pd.DataFrame | None, chosen: dict[str, Any] | None) -> dict[str, Any] | None:
    """The best family after the chosen one that fits: its layout, how much slower, its memory, and whether its
    throughput lies inside the chosen layout's p10–p90 (then the model alone does not separate the two).

    Passed over, and listed as ``equivalents``: families whose best layout ties with the chosen one and only shards
    the states differently (``search.layouts.runner_up_index``, the rule the comparable-runs table applies too), on
    the layouts families.csv carries (``layout.*``) and the search's throughputs."""
    if families is None or not len(families) or not chosen or "verdict" not in families:
        return None
    verdict = families["verdict"].astype(str)
    fam = families[(verdict != "chosen") & ~verdict.str.startswith("OOM")]
    fam = fam[pd.to_numeric(fam["tokens_per_s_per_gpu"], errors="coerce").notna()]
    if not len(fam):
        return None
    # speeds of what the launch runs (families.csv's tokens_per_s_per_gpu_launched, where the table has it): the
    # search ranked on them, and an FP8 plan's torchtitan layouts train in bf16; the chosen one's p10/p50 alike
    col = "tokens_per_s_per_gpu_launched" if "tokens_per_s_per_gpu_launched" in fam else "tokens_per_s_per_gpu"
    ranked = "rank" in fam and pd.to_numeric(fam["rank"], errors="coerce").notna().all()
    fam = fam.sort_values("rank", kind="stable") if ranked else fam.sort_values(col, ascending=False, kind="stable")
    mine = families[verdict == "chosen"]
    mine_x = (float(mine[col].iloc[0]) / float(mine["tokens_per_s_per_gpu"].iloc[0])
              if len(mine) and col in mine and pd.notna(mine[col].iloc[0]) else 1.0)
    p50 = float(chosen["tokens_per_s_per_gpu_p50"]) * mine_x
    mine_lay = family_layout(mine.iloc[0]) if len(mine) else None
    lays = [family_layout(r) for _, r in fam.iterrows()]
    tps = [float(t) if pd.notna(t) else float(p) for t, p in zip(fam[col], fam["tokens_per_s_per_gpu"], strict=True)]
    if mine_lay is None or any(lay is None for lay in lays):  # no layouts to compare: the best other family
        pick, passed = 0, []
    else:
        pick, passed = runner_up_index(mine_lay, float(mine["tokens_per_s_per_gpu"].iloc[0]) * mine_x,
                                       list(zip(lays, tps, strict=True)))
    layout_of = [str(r.get("best_layout") or r.get("layout") or "") for _, r in fam.iterrows()]
    r = fam.iloc[pick]
    equivalents = [{"family": str(fam["family"].iloc[i]), "layout": layout_of[i], "slower_frac": 1.0 - tps[i] / p50}
                   for i in passed]
    mem = float(r["mem_total_gib"])
    mem_x = memory_interval_factors(chosen)  # the same factors for every layout: the chosen one's carry over
    mem_p90 = mem * mem_x[1] if mem_x is not None else None
    return {"family": str(r["family"]), "layout": layout_of[pick],
            "tokens_per_s_per_gpu": tps[pick], "tokens_per_s_per_gpu_planned": float(r["tokens_per_s_per_gpu"]),
            "rank": int(r["rank"]) if ranked else None,  # (page 1 counts the chosen family's layouts ranked above)
            "mem_total_gib": mem, "mem_total_gib_p90": mem_p90,
            "slower_frac": 1.0 - tps[pick] / p50,
            "inside_interval": tps[pick] >= float(chosen["tokens_per_s_per_gpu_p10"]) * mine_x,
            # the p10 it was held to: the chosen layout's as launched where its launch moves its speed (QLoRA as LoRA)
            "chosen_p10": float(chosen["tokens_per_s_per_gpu_p10"]) * mine_x, "p10_as_launched": mine_x != 1.0,
            "equivalents": equivalents}


def heldout_groups(rows: list[dict[str, Any]]) -> list[tuple[str, list[dict[str, Any]]]]:
    """heldout.csv rows grouped for page 1, in the order fitted / never fitted / other generation / the rest
    (label '' for rows without a role), each row with ``loto`` (its left-out-of-fit MAPE or None)."""
    order = {"fit": "fitted", "never fitted": "never fitted", "other generation": "other generation"}
    groups: dict[str, list[dict[str, Any]]] = {}
    for r in rows:
        role = r.get("role")
        lo = r.get("loto_mape")
        loto = float(lo) if role == "fit" and lo is not None and lo == lo else None
        groups.setdefault(order.get(str(role), "") if role else "", []).append(r | {"loto": loto})
    return [(g, groups[g]) for g in [*order.values(), ""] if g in groups]


def _techniques(tech: pd.DataFrame | None, cost: dict[str, Any] | None) -> list[dict] | None:
    """The "what each technique buys" table (``search.technique_verdicts`` rows), or None if not produced.
    ``fp8_priced``: an FP8 row with a measured change and a cost to price it, told in the memo's "FP8 on this
    layout" paragraph (its table cell points there)."""
    if tech is None or not len(tech):
        return None
    rows = _records(tech)
    priced = bool((cost or {}).get("dollars"))
    detail = (cost or {}).get("detail") or {}
    p50 = (detail.get("tokens_per_s_per_gpu") or {}).get("p50")
    base = point_usd(detail, p50) if p50 else None  # the point cost at the p50 throughput
    for r in rows:
        r["used_by_best"] = str(r.get("used_by_best")).lower() == "true"
        r["fp8"] = str(r.get("technique") or "").startswith("FP8")
    # the FP8 recipe the plan runs, if any: another recipe's bf16 comparison is then not a comparison with the plan
    plan_fp8 = next((r for r in rows if r["fp8"] and r["used_by_best"]), None)
    for r in rows:
        r["fp8_priced"] = r["fp8"] and r.get("delta_frac") is not None and priced
        r["fp8_saved_usd"] = r["fp8_vs_plan"] = None
        if r["fp8_priced"] and base is not None:  # the cost model at the other throughput (start-up does not scale)
            d = float(r["delta_frac"])
            ratio = 1 + d  # this recipe against bf16 on the same layout: the plan, when the plan runs bf16
            if plan_fp8 is not None and not r["used_by_best"]:
                ratio = float(r["tokens_per_s_per_gpu_with"]) / float(plan_fp8["tokens_per_s_per_gpu_with"])
                r["fp8_vs_plan"] = ratio - 1
            other = point_usd(detail, p50 / ratio if r["used_by_best"] else p50 * ratio)
            if other is not None:
                r["fp8_saved_usd"] = other - base if r["used_by_best"] else base - other
        for k in ("best_with", "best_without", "verdict", "note", "line", "compiled_note", "risk"):
            r[k] = "" if r.get(k) is None else str(r[k])
    return rows


def _launch(manifest: Path | None) -> list[dict]:
    out = []
    for p in launch_files(manifest):
        if not p.is_file():
            continue
        text = p.read_text(encoding="utf-8", errors="replace")
        n = len(text.splitlines())
        out.append({"name": p.name, "text": text, "lines": n, "inline": n <= INLINE_MAX_LINES,
                    "sha256": hashlib.sha256(p.read_bytes()).hexdigest()})
    return out


def _figures(fig_dir: Path | None, res: Inputs) -> dict[str, dict | None]:
    out: dict[str, dict | None] = {}
    for name in FIGURES:
        if fig_dir is None:
            out[name] = None
            continue
        svg, cap = fig_dir / f"{name}.svg", fig_dir / f"{name}.caption.json"
        if svg.exists() and cap.exists():
            c = read_json(cap)
            out[name] = {"src": os.path.relpath(svg.resolve(), res.root.resolve()), "caption": c["caption"], "config_hash": c["config_hash"],
                         "sources": c.get("sources", []), "calibration_source": c.get("calibration_source")}
        else:
            out[name] = None
    return out


def family_bias_rows(calib: dict | None, chosen: dict | None) -> list[dict[str, Any]] | None:
    """Held-out bias per family class of the study GPU's generation (calibration.json
    ``heldout_errors_by_family``: predicted/published − 1 of every leave-one-table-out row): rows, mean error,
    its standard error (published.fit.bias_se), whether it is inside the ±5% target and whether it is the chosen
    layout's family (its interval's pool)."""
    by = (calib or {}).get("heldout_errors_by_family") or {}
    mine = (chosen or {}).get("interval_family")
    out = [{"family": f, "n": len(e), "bias": sum(e) / len(e), "se": bias_se(e), "chosen": f == mine,
            "met": 100.0 * abs(sum(e) / len(e)) <= HELDOUT_TARGETS["family_bias_pct"]} for f, e in sorted(by.items()) if e]
    return out or None


def build_context(inputs: Mapping[str, Any], *, config: dict, study_hash: str, git_commit: str,
                  results_root: str | Path | None = None, judge: Judge | None = None) -> dict[str, Any]:
    """Everything the template shows, read from the named ``inputs`` (the memo rule's ``input``; names in
    :data:`MEMO_INPUTS`) and nothing else (no number is computed from thin air). ``results_root`` only names
    files (default: the results dir the inputs sit in). ``judge`` (the memo stage's
    :func:`~trainplan.launch.artifacts.launch_judge` for the study): page 1's day-1 switch is sized as the launch
    would run it; without it, on the plan's figures."""
    res = Inputs(inputs, results_root)
    summary = res.json("summary")
    cand = res.csv("candidates")
    calib = res.json("calibration")
    prod = res.json("production")
    cost = res.json("cost")
    heldout, manifest = _records(res.csv("heldout")), res.json("launch")
    rec = res.csv("records")
    families = res.csv("families")
    chosen_row = None
    rep = None
    fallback = tie_won = ruled = ok = None
    if cand is not None and len(cand):
        ok = cand[cand["feasible"].astype(bool)]
        chosen_row = _records(ok.sort_values("rank").head(1))[0] if len(ok) else None
        rep = _records(representative_layouts(cand))
        fallback = day1_fallback(ok, chosen_row, (prod or {}).get("chosen") or {}, judge) if chosen_row else None
        tie_won = tie_winner(ok, chosen_row) if chosen_row else None
        ruled = ruled_out_as_launched(cand, chosen_row) if chosen_row else None
    if fallback and fallback.get("at") == "p90" and cost and summary:
        fallback = fallback | {"extra_gpu_hours": switch_extra_gpu_hours(cost, fallback, summary.get("n_gpus"))}
    launched = launched_figures((prod or {}).get("chosen"), manifest,
                                ((prod or {}).get("interval") or {}).get("memory_relative_errors") or (),
                                (summary or {}).get("hbm_gib"))
    if fallback:
        fallback = fallback | {"tps_p10": switch_throughput_p10(fallback, (prod or {}).get("chosen") or {}, calib,
                                                               launched)}
    ru = runner_up(families, (prod or {}).get("chosen"))
    if fallback and ru and fallback["layout"] == ru["layout"] and chosen_row is not None:
        ru = ru | {"after_switch": switch_runner_up(ok, chosen_row, fallback, judge)}
    layout_str = None
    if summary and "layout" in summary:
        lay = {k: v for k, v in summary["layout"].items() if k in Layout.__dataclass_fields__}
        layout_str = Layout(**lay).describe()
    source = (calib or {}).get("source") or (prod or {}).get("source")
    fig_dir = res.path("figures")
    date = source_date()
    return {
        "gpu_label": gpu_label((summary or {}).get("gpu")),
        "study": {"name": _title(config, summary),
                  "hash": study_hash, "hash_short": study_hash[:12], "commit": git_commit,
                  "commit_short": git_commit[:12], "date": date.strftime("%Y-%m-%d")},
        "summary": summary, "layout_str": layout_str, "chosen_row": chosen_row, "representatives": rep,
        # the step's terms for the chosen layout's row (CPU offload only when it offloads): they add up to its step
        "step_parts": [(k, v) for k, v in STEP_PARTS.items()
                       if k != "offload_s" or float((chosen_row or {}).get("offload_s") or 0.0) > 0],
        "fallback": fallback, "tie_won": tie_won, "tie_frac": TIE_FRAC, "ruled_as_launched": ruled,
        **_families(families), "runner_up": ru,
        "techniques": _techniques(res.csv("techniques"), cost),
        "calibration": calib, "source": source, "source_label": ((calib or {}).get("source_detail") if source == "gpu-proxies" else None)
        or SOURCE_LABELS.get(f"{source}:{(calib or {}).get('generation')}") or SOURCE_LABELS.get(str(source), str(source)),
        "heldout": heldout or None, "never_fitted": list(NEVER_FITTED), "heldout_groups": heldout_groups(heldout),
        "family_bias": family_bias_rows(calib, (prod or {}).get("chosen")),
        "production": prod, "chosen": (prod or {}).get("chosen"),
        "production_rows": _records(res.csv("production_table")) or None,
        "cost": cost, "targets": (cost or {}).get("targets") or None,
        "sensitivity": _records(res.csv("sensitivity")) or None,
        "validation": _validation(rec), "launch": _launch(res.path("launch")), "figures": _figures(fig_dir, res),
        "manifest": manifest,
        "launched": launched,
        "config_rows": _flatten(config),
        # the nccl-tests day-1 check and its threshold (launch.artifacts.all_gpus_busbw), as the manifest states it
        "nccl_check": next((d for d in (manifest or {}).get("day1") or [] if "min_busbw_GBps" in d), None),
        # the FP8 study's loss check against bf16 (launch.artifacts.day1_commands), as the manifest states it
        "fp8_parity": next((d for d in (manifest or {}).get("day1") or [] if "max_loss_rel" in d), None),
        "family_bias_target_pct": HELDOUT_TARGETS["family_bias_pct"],
        "day1_steps": DAY1_THROUGHPUT_STEPS, "launched_show_frac": LAUNCH_SHOW_FRAC,
        "training_attn_kernel": (config.get("training") or {}).get("attn_kernel", "fa2") if config else None,
        "training_seq_len": (config.get("training") or {}).get("seq_len") if config else None,
        "training_finetune": (config.get("training") or {}).get("finetune", "full") if config else "full",
        "cudnn_attention_rel": attention_kernel_rel("cudnn"),
        "proxy_family_labels": PROXY_FAMILY_LABELS,
        "alloc_conf": ALLOC_CONF,  # the caching allocator the launch scripts and the preflight set
        "assumptions": _assumptions(config) if config else [],
        "provenance": [{"file": f, **sc} for f, sc in res.sidecars()],
    }


def ruled_out_as_launched(cand: pd.DataFrame, chosen: dict[str, Any]) -> dict[str, Any] | None:
    """The layouts faster than the chosen one (as launched: the speed the search ranks) that the search ruled out
    because the launch would not fit them (``search.layouts.refit_as_launched``): how many, and the fastest with its
    reason; None when none was."""
    if "reason" not in cand or "tokens_per_s" not in cand:
        return None
    speed, mine = launched_tps(cand), launched_tps(chosen)  # faster as launched, as the search ranks them
    out = cand[cand["reason"].astype(str).str.startswith(LAUNCH_OOM) & (speed > mine)]
    if not len(out):
        return None
    fast = out.loc[speed[out.index].idxmax()]
    why = str(fast["reason"])[len(LAUNCH_OOM):]
    how, need = why.split("): ", 1) if "): " in why else (why, "")
    return {"n": int(len(out)), "layout": str(fast["layout_text"]), "how": how, "need": need,
            "mem_total_gib": float(fast["mem_total_gib"]),
            "faster_frac": float(speed[fast.name]) / mine - 1.0}


def tie_winner(feasible: pd.DataFrame, chosen: dict[str, Any]) -> dict[str, Any] | None:
    """When the chosen layout (rank 1) is not the fastest that fits: the fastest, how much faster (under TIE_FRAC,
    a tie the search broke on memory headroom, then simplicity) and how much more memory it needs; else None.
    ``untimed``: where the fastest one's launch changes something with no step-time model, its words (the search
    ranks it UNTIMED_MARGIN slower: that, not a tie, is why it lost), else ""; then ``timed``: the same figures for
    the fastest layout whose launch is timed, where it too is faster than the chosen one (a tie), else None."""
    if not len(feasible) or "tokens_per_s" not in feasible:
        return None
    speed = launched_tps(feasible)  # as the search ranked them: the speed of what the launch runs
    fast = feasible.loc[speed.idxmax()]
    if float(speed.max()) <= launched_tps(chosen):
        return None
    def beat(row: Any, tps: float, tie: bool) -> dict[str, Any]:
        # a tie in the search's own measure (tie_gap); a layout that lost on its untimed launch by the usual one
        mine = launched_tps(chosen)
        return {"layout": str(row.get("layout_text", "")),
                "faster_frac": tie_gap(tps, mine) if tie else tps / mine - 1.0,
                "more_gib": float(row["mem_total_gib"]) - float(chosen["mem_total_gib"])}

    out = beat(fast, float(speed.max()), not untimed(fast)) | {"untimed": "", "untimed_margin": UNTIMED_MARGIN,
                                                               "timed": None}
    if untimed(fast):
        out["untimed"] = str(fast[LAUNCH_UNTIMED])
        timed = speed[~untimed(feasible)]
        if len(timed) and float(timed.max()) > launched_tps(chosen):
            out["timed"] = beat(feasible.loc[timed.idxmax()], float(timed.max()), True)
    return out


# launch.artifacts.launch_judge's ``judge(layout, step=True)``: :func:`~trainplan.launch.artifacts.as_launched` of a
# layout under the trainer the launch picks for it (None where it runs the plan as planned)
Judge = Callable[..., "dict[str, Any] | None"]
FALLBACK_EXTRA_HEADROOM = 0.15  # the memory fallback leaves at least this much more HBM free than the choice


def memory_fallback(feasible: pd.DataFrame, chosen: dict[str, Any], judge: Judge | None = None
                    ) -> dict[str, Any] | None:
    """The day-1 fallback if the preflight measures more memory than predicted: the fastest feasible layout
    with at least FALLBACK_EXTRA_HEADROOM more headroom than the chosen one (simplest on ties). With ``judge``
    (:func:`~trainplan.launch.artifacts.launch_judge`), both headrooms are those of what the launch runs."""
    cap = _launched_gib(judge, chosen) - FALLBACK_EXTRA_HEADROOM * _usable_hbm_gib(chosen)
    return _launched_choice(feasible, chosen, 1.0, cap, judge)


def _usable_hbm_gib(row: Mapping[str, Any]) -> float:
    """Usable HBM in GiB from a candidates.csv row: the search's headroom is 1 − memory ÷ usable HBM."""
    return float(row["mem_total_gib"]) / (1.0 - float(row["headroom_frac"]))


def _launched_gib(judge: Judge | None, row: Mapping[str, Any]) -> float:
    """The peak (GiB) of what the launch runs for the layout of ``row``
    (:func:`~trainplan.launch.artifacts.peak_as_launched`); the plan's without ``judge``, and where what runs has no
    memory model (the plan's peak stands, as on page 1)."""
    planned = float(row["mem_total_gib"])
    if judge is None:
        return planned
    peak = peak_as_launched(judge(Layout.from_row(row), step=False), planned)
    return planned if peak is None else peak


def day1_fallback(feasible: pd.DataFrame, chosen_row: dict[str, Any],
                  prod_chosen: Mapping[str, Any], judge: Judge | None = None) -> dict[str, Any] | None:
    """Page 1's day-1 switch: the preflight's rule (:func:`fit_fallback`) at the memory model's p90 error when that
    is above the limit (``at: p90``, page 1's AT RISK), else at the error where the chosen layout would run out of
    usable HBM (``at: oom``): a switch that holds over the whole band of errors that fail the preflight, not one
    that fits only just past its threshold (LoRA's ZeRO-2 once, 0.1 GiB under the ZeRO-1 then chosen: a 0.2% band); without a
    memory interval, the fixed-margin :func:`memory_fallback`. With ``judge``, the chosen layout's peak and every
    candidate's are those of what the launch runs (page 1's "as launched" row)."""
    mem_x = memory_interval_factors(prod_chosen)
    if mem_x is None or not mem_x[1] > 1.0:
        return memory_fallback(feasible, chosen_row, judge)
    frac = float(prod_chosen.get("max_hbm_frac", DEFAULT_MAX_MEM_FRAC))
    hbm = _usable_hbm_gib(chosen_row)
    mine = _launched_gib(judge, chosen_row) / float(chosen_row["mem_total_gib"])
    at_p90 = float(prod_chosen["mem_total_gib_p90"]) * mine > frac * hbm
    oom_at = hbm / (float(chosen_row["mem_total_gib"]) * mine)  # the error at which the chosen layout exhausts HBM
    fb = fit_fallback(feasible, chosen_row, mem_x[1] if at_p90 else oom_at, frac, judge)
    return fb | {"at": "p90" if at_p90 else "oom"} if fb else None


def switch_runner_up(feasible: pd.DataFrame, chosen: dict[str, Any], fallback: Mapping[str, Any],
                     judge: Judge | None = None) -> dict[str, Any] | None:
    """Check 2's second layout once check 1 has switched to the runner-up itself (the default study: FSDP mb1 is
    both): the preflight's rule (:func:`fit_fallback`) with the switch as the chosen layout, at the error the switch
    was named at, among the layouts of the other families (not the chosen one's or the switch's: a different
    strategy, as the runner-up is) that do not only shard the states differently from the switch
    (:func:`~trainplan.search.layouts.shards_alike`: HSDP against FSDP would run as slow). Its
    ``slower_frac`` is against the switch; a layout whose speed as launched has no model is passed over (``timed``:
    check 2 compares throughputs). None where the switch has no error (the fixed-margin fallback) or nothing else
    fits."""
    if fallback.get("mem_ratio") is None or "pin" not in fallback:
        return None
    sw = feasible[feasible["layout_text"] == fallback["layout"]]
    if not len(sw):
        return None
    sw_row, sw_lay = sw.iloc[0].to_dict(), Layout.from_row(sw.iloc[0])
    fams = {str(chosen["family"]), str(sw_row["family"])}  # a different strategy, as the runner-up is (and so
    other = feasible[~feasible["family"].astype(str).isin(fams)]  # neither the chosen layout nor the switch)
    keep = ~shards_alike_mask(other, sw_lay)
    return fit_fallback(other[keep], sw_row, float(fallback["mem_ratio"]), float(fallback["max_hbm_frac"]), judge,
                        timed=True)


def switch_throughput_p10(fallback: Mapping[str, Any], prod_chosen: Mapping[str, Any],
                          calib: Mapping[str, Any] | None, launched: Mapping[str, Any] | None) -> float | None:
    """Day-1 check 2's threshold once check 1 has switched: the switch's tokens/s/GPU p10, from its estimate (the
    chosen layout's, as launched where page 1 has that, × (1 − ``slower_frac``), itself as launched where judged) and
    the held-out errors of the switch's own family class, as the production interval of any layout
    (``prediction.production``: ``interval_bounds`` on ``error_pool``, its exact case); with a GPU or bootstrap
    calibration (production's Monte Carlo case), the chosen layout's p10 ÷ estimate. None without the figures."""
    judged = fallback.get("as_launched") and not fallback.get("slower_is_plan")  # slower_frac against the launch
    tps = (launched or {}).get("tps") if judged else None
    p50 = tps["p50"] if tps else prod_chosen.get("tokens_per_s_per_gpu_p50")
    if p50 is None or fallback.get("slower_frac") is None:
        return None
    est = float(p50) * (1.0 - float(fallback["slower_frac"]))
    c = calib or {}
    by_family = c.get("heldout_errors_by_family")
    exact = bool(by_family) and not c.get("gpu") and len(c.get("efficiency_samples") or []) <= 1  # as production's
    if exact and fallback.get("interval_family"):
        lo = interval_bounds(est, error_pool(by_family, str(fallback["interval_family"])))[0]
    elif prod_chosen.get("tokens_per_s_per_gpu_p10") is not None:
        lo = est * float(prod_chosen["tokens_per_s_per_gpu_p10"]) / float(prod_chosen["tokens_per_s_per_gpu_p50"])
    else:
        return None
    return float(min(lo, est))


def switch_extra_gpu_hours(cost: Mapping[str, Any], fallback: Mapping[str, Any], n_gpus: Any) -> float | None:
    """GPU-hours the day-1 switch adds to the ask: the ask's training hours (p90) run ``slower_frac`` slower, the
    overheads unchanged; None without the figures."""
    train = ((cost.get("train_hours") or {}).get("p90"))
    slower = fallback.get("slower_frac")
    if train is None or slower is None or not n_gpus or not slower < 1.0:
        return None
    return float(train) * float(n_gpus) * (1.0 / (1.0 - float(slower)) - 1.0)


def fit_fallback(feasible: pd.DataFrame, chosen: dict[str, Any], mem_ratio: float,
                 max_hbm_frac: float, judge: Judge | None = None, *, timed: bool = False) -> dict[str, Any] | None:
    """The layout to switch to when the memory model errs by ``mem_ratio`` (measured ÷ modelled peak): the fastest
    other feasible layout (the search's tie-aware rank) whose modelled peak × ``mem_ratio`` is within
    ``max_hbm_frac`` of usable HBM, ranked by the search's tie-aware rule with the headroom at that error; None if
    none fits. The memo names it at the p90 error, the preflight at the error it measured (one rule, one function).
    Without ``judge`` it is the plan-only search's choice at that error (``search(mem_scale=)``, the tornado's
    ``memory_x`` of a plan-only study); with it, it can differ from the study's ``plan_search(mem_scale=)``: that
    keeps a layout whose launch has no memory model at its planned peak.

    With ``judge`` (:func:`~trainplan.launch.artifacts.launch_judge`) each candidate's peak is that of what the
    launch runs for it (QLoRA's LoRA over a bf16 base, torchtitan's FSDP2 for ZeRO-1, its gathered K/V under CP), and
    a candidate whose launch has no memory model is passed over: a switch is only named where its peak is sized."""
    if not len(feasible):
        return None
    fb = _launched_choice(feasible, chosen, mem_ratio, max_hbm_frac * _usable_hbm_gib(chosen), judge, timed)
    return fb | {"mem_ratio": float(mem_ratio), "max_hbm_frac": float(max_hbm_frac),
                 "mem_expected_gib": fb["mem_total_gib"] * float(mem_ratio)} if fb else None


def _launched_choice(feasible: pd.DataFrame, chosen: dict[str, Any], mem_ratio: float, cap_gib: float,
                     judge: Judge | None, timed: bool = False) -> dict[str, Any] | None:
    """The search's tie-aware choice among the other feasible layouts whose peak × ``mem_ratio`` is at most
    ``cap_gib``, ranked with the headroom at that error, as :func:`fallback_entry` names it. Without ``judge``, the
    plan's peaks and throughputs (the plan-only search's choice at that error); with it, those as launched.

    Walks the layouts fastest first and judges each as launched (a few ms: not all 20,000+), keeping those that
    fit, until a layout could not reach the tie band (TIE_FRAC) of the fastest fit. With a study's candidates the
    walk is on the speed the search ranks, that of what the launch runs (``LAUNCH_TPS_RATIO``, also where a change
    has no step-time model: the ratio of those that have one), so the stop is exact. A table without that column
    is walked as planned, stopping where a layout, even at the largest throughput ratio of a launch seen so far,
    could not reach the band: neighbouring layouts share their deviations, so their ratios differ little (QLoRA as
    LoRA: 1.03-1.05). A layout whose launch has no memory model is passed over, and so is one
    the launch runs as another candidate's layout (torchtitan's ZeRO-1 is its FSDP2 ZeRO-2): the switch names the
    layout that runs. ``timed``: a layout whose launch has no step-time model (in part) is passed over (a throughput fallback must be comparable on throughput as launched)."""
    judged = judge or _runs_as_planned
    mine = judged(Layout.from_row(chosen), step=False)  # what the chosen layout runs as: no switch to that either
    same = {chosen["layout_text"], *([mine["layout"]] if mine and mine.get("layout") else [])}
    other = feasible[~feasible["layout_text"].isin(same)]
    # a study's candidates carry the speed of what the launch runs (LAUNCH_TPS_RATIO, what the search ranks on):
    # walk and rank on it; a table without it (hand-built) on the planned speed × the judge's ratio
    rowwise = judge is not None and LAUNCH_TPS_RATIO in other
    order = other.assign(_speed=rank_tps(other) if rowwise else other["tokens_per_s"].astype(float))
    order = order.sort_values("_speed", ascending=False, kind="stable")
    tps = order["_speed"].to_numpy(dtype=float)
    hbm = _usable_hbm_gib(chosen)
    planned = set(feasible["layout_text"].astype(str))
    keep: list[Any] = []
    peaks: list[float] = []
    fast: list[float] = []
    band, top_ratio = None, 1.0
    for i, (idx, r) in enumerate(order.iterrows()):
        if band is not None and tps[i] * top_ratio < band:
            break
        a = judged(Layout.from_row(r))
        peak = peak_as_launched(a, float(r["mem_total_gib"]))
        if peak is None or (a and a["layout_changes"] and a["layout"] in planned):
            continue  # unsized, or it runs another candidate's layout: that row names what runs
        if timed and a is not None and a["throughput_ratio"] is None:
            continue  # its speed as launched has no model
        speed = 1.0 if rowwise or a is None or a["throughput_ratio"] is None else float(a["throughput_ratio"])
        top_ratio = max(top_ratio, speed)
        if peak * mem_ratio <= cap_gib:
            keep.append(idx)
            peaks.append(peak)
            fast.append(tps[i] * speed)
            band = (1.0 - TIE_FRAC) * max(fast)
    if not keep:
        return None
    fits = order.loc[keep].assign(headroom_frac=[1.0 - p * mem_ratio / hbm for p in peaks], tokens_per_s=fast)
    # tokens_per_s is as launched already, and as ranked (less UNTIMED_MARGIN where not timed)
    fits = fits.drop(columns=[LAUNCH_TPS_RATIO, LAUNCH_UNTIMED, "_speed"], errors="ignore")
    best = ranked(fits).iloc[0] if "complexity" in fits else best_row(fits.drop(columns="rank", errors="ignore"))
    return fallback_entry(other.loc[best.name], chosen, judge)


def _runs_as_planned(layout: Layout, step: bool = True) -> None:
    """The judge of a plan-only study: every layout runs as planned."""
    return None


def layout_overlay(lay: Layout) -> str:
    """The config overlay that pins ``lay``: a ``layout:`` section in YAML flow style, every field written out, so
    that a study rerun with it plans, launches and preflights exactly that layout."""
    import yaml

    return "layout: " + yaml.safe_dump(lay.to_dict(), default_flow_style=True, sort_keys=False, width=10**6).strip()


def fallback_entry(r: pd.Series, chosen: dict[str, Any], judge: Judge | None = None) -> dict[str, Any]:
    """A fallback as the memo and the preflight name it: the candidates.csv row ``r`` against the chosen one;
    ``pin``: the config overlay that switches to it (:func:`layout_overlay`), where the row has the layout's fields.

    With ``judge``, its figures are those of what the launch runs (the same models, :func:`~trainplan.launch.
    artifacts.as_launched`): the peak, its headroom, and how much slower than the chosen layout as launched; where
    that differs from the plan, ``launched`` says how (its few-word changes) and ``plan`` keeps the plan's figures.
    Where either launch has no step-time model, ``slower_frac`` stays the plan's and ``slower_is_plan`` says so."""
    out = {"layout": str(r.get("layout_text", "")), "tokens_per_s_per_gpu": float(r["tokens_per_s_per_gpu"]),
           "mem_total_gib": float(r["mem_total_gib"]), "headroom_frac": float(r["headroom_frac"]),
           "slower_frac": 1.0 - float(r["tokens_per_s"]) / float(chosen["tokens_per_s"])}
    if all(k in r for k in ("dp", "tp", "pp", "cp", "sharding")):
        lay = Layout.from_row(r)
        out["pin"] = layout_overlay(lay)
        out["interval_family"] = family_class(lay)  # whose held-out errors its interval takes
    if judge is None:
        return out
    out["as_launched"] = True
    mine, run = judge(Layout.from_row(chosen)), judge(Layout.from_row(r))
    plan = {k: out[k] for k in ("mem_total_gib", "headroom_frac", "slower_frac")}
    peak = peak_as_launched(run, plan["mem_total_gib"])
    if peak is not None:
        out["mem_total_gib"] = peak
        out["headroom_frac"] = 1.0 - peak / _usable_hbm_gib(r)
    t_run = 1.0 if run is None else run["throughput_ratio"]
    t_mine = 1.0 if mine is None else mine["throughput_ratio"]
    if t_run is not None and t_mine is not None:
        out["slower_frac"] = 1.0 - float(r["tokens_per_s"]) * float(t_run) / (float(chosen["tokens_per_s"]) * float(t_mine))
    elif run is not None or mine is not None:
        out["slower_is_plan"] = True
    if run is not None and (run["unmodelled"] or run["layout_changes"] or run["training_changes"] or run["extra_gib"]):
        out["launched"] = {"trainer": run["trainer"], "changes": list(run["changes"]),
                           "unmodelled": list(run["unmodelled"])}
        out["plan"] = plan
    return out


# -------------------------------------------------------------------------------------- rendering
def render_html(context: dict[str, Any], template: str | Path | None = None) -> str:
    """The memo's HTML (StrictUndefined: a missing key is an error, not an empty string) from ``template``
    (default: the package's memo.html.j2)."""
    import jinja2

    tpl = Path(template) if template is not None else pkgdata.path(TEMPLATE)
    env = jinja2.Environment(loader=jinja2.FileSystemLoader(str(tpl.parent)), undefined=jinja2.StrictUndefined,
                             autoescape=jinja2.select_autoescape(["html", "j2"]), trim_blocks=True,
                             lstrip_blocks=True)
    env.filters["f"] = fmt
    env.filters["ticks"] = code_spans
    env.filters["cmd"] = command_html
    env.filters["brk"] = layout_breaks
    return env.get_template(tpl.name).render(**context)


def command_html(text: Any) -> Any:
    """A shell command as HTML that wraps only at spaces and after a ``/`` or ``,``: each piece in a no-wrap span. The PDF
    broke ``--ntasks-per-node`` and ``day1-throughput`` at their hyphens, so a command copied from it failed."""
    from markupsafe import Markup, escape

    def token(t: str) -> str:
        pieces = re.findall(r"[^/,]*[/,]|[^/,]+$", t)
        return "".join(f'<span class="nw">{escape(q)}</span>' for q in pieces if q)

    return Markup(" ".join(token(t) for t in str(text or "").split(" ")))


def layout_breaks(text: Any) -> str:
    """A layout string that may wrap after each "·" (a zero-width space there): the technique table's layouts
    (``dp16·tp1·pp1·cp2(ulysses) zero2 …``) otherwise widened it past the page edge."""
    return str(text if text is not None else "").replace("·", "·\u200b")


def code_spans(text: Any) -> Any:
    """Plain text with `backticked` spans (manifest.json's day-1 criteria) as HTML: escaped, the spans as <code>
    commands (:func:`command_html`)."""
    from markupsafe import Markup, escape

    parts = str(text or "").split("`")
    return Markup("".join(f"<code>{command_html(p)}</code>" if i % 2 else str(escape(p)) for i, p in enumerate(parts)))


def render_memo(inputs: Mapping[str, Any], out_pdf: str | Path, *, config: dict, study_hash: str, git_commit: str,
                results_root: str | Path | None = None, benchmarks: dict | None = None,
                template: str | Path | None = None, css: str | Path | None = None, judge: Judge | None = None) -> Path:
    """Render the design memo PDF from the named ``inputs`` (see :func:`build_context`); attach the resolved
    config and provenance table. ``results_root`` names files and is the HTML's base URL (the figures' ``src``
    are relative to it; they lie in ``inputs["figures"]``).
    ``benchmarks``: ``benchmarks_report.benchmark_summary`` of the rules' benchmark files (Appendix D).
    ``template``, ``css``: the memo rule's declared inputs; default the package's memo.html.j2 and memo.css.
    ``judge``: see :func:`build_context`."""
    from weasyprint import CSS, HTML, Attachment

    root = Path(results_root) if results_root is not None else _results_root(inputs)
    ctx = build_context(inputs, config=config, study_hash=study_hash, git_commit=git_commit, results_root=root,
                        judge=judge)
    ctx["benchmarks"] = benchmarks
    html = render_html(ctx, template)
    when = source_date()
    att = [("config.resolved.json", json.dumps(config, indent=2, sort_keys=True, default=str),
            "the resolved study config"),
           ("provenance.json", json.dumps(ctx["provenance"], indent=2, sort_keys=True, default=str),
            "provenance sidecars of every results file the memo reads")]
    att += [(a["name"], a["text"], "launch artifact") for a in ctx["launch"] if not a["inline"]]
    attachments = [Attachment(string=text.encode("utf-8"), name=name, description=desc, created=when,
                              modified=when) for name, text, desc in att]
    doc = HTML(string=html, base_url=str(root.resolve()) + "/")
    sheet = CSS(filename=str(css if css is not None else pkgdata.path(CSS_FILE)))
    pdf = doc.write_pdf(stylesheets=[sheet], attachments=attachments,
                        pdf_identifier=study_hash[:32].encode() or b"trainplan", uncompressed_pdf=False)
    return write_bytes(out_pdf, pdf)
